"""The Launcher contract and what every launcher shares.

`Launcher.launch(cluster, job, events) -> JobResult` starts torchrun on every node of a cluster,
streams the nodes' logs (prefixed with the node rank) through the one metrics parser, fails fast
when any node fails, enforces the job's wall-clock limit, and before returning (also on Ctrl-C or
an exception) makes sure none of the processes it started is left running.

Shared here: the torchrun command line (argv lists, never shell strings), the per-node
environment contract, and `NodeSupervisor`, which runs one local process per node (a torchrun
agent for `local`, an `ssh` client for `ssh`) and watches them.
"""

from __future__ import annotations

import collections
import os
import queue
import re
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, Sequence

from gpucluster.errors import UsageError
from gpucluster.metrics import MetricsState, parse_line

DEFAULT_RDZV_PORT = 29400
TAIL_LINES = 80
TAIL_BYTES = 64 * 1024  # the most of a node's last lines kept (and stored in the ledger)
LINE_CAP = 4096  # bytes of one line kept for the tail and the console; the log file keeps it whole
_LONG = LINE_CAP + 96  # longer than this gets cut (a line already cut and marked is not)
CONSOLE_BACKLOG = 1000  # lines waiting for the console; beyond that lines are counted, not queued
CONSOLE_RATE = 2000.0  # lines a second the console shows at most (the rest: a summary line)
_READ_SIZE = 1 << 16
LOG_HOLD = 16 << 20  # bytes of an unfinished line held back so the node log gets it whole
_PIPE_SIZE = 1 << 20
_METRIC_PREFIX = b"@gpucluster-metric "
# What a user's command is started through on every rank: it announces the worker's start (the
# observable start of the train phase) as a metric record, then exec()s the command unchanged, in
# the same process (same pid, environment, argv). Not shipped as a file: it works on any node.
WORKER_START_KIND = "worker_start"
_ANNOUNCE = (
    "import json,os,sys\n"
    "e=os.environ\n"
    "print('@gpucluster-metric '+json.dumps({'kind':'worker_start','rank':int(e.get('RANK','0')),"
    "'local_rank':int(e.get('LOCAL_RANK','0')),'pid':os.getpid()}),flush=True)\n"
    "a=sys.argv[1:]\n"
    "c=a[1:] if a[0]=='--no-python' else [sys.executable,'-u',*a]\n"
    "try:\n"
    " os.execvp(c[0],c)\n"
    "except OSError as x:\n"
    " sys.stderr.write('gpucluster: cannot start %r: %s\\n'%(c[0],x));sys.exit(127)\n"
)


@dataclass(frozen=True)
class JobSpec:
    run_id: str
    command: tuple[str, ...] = ()  # user argv after `--` (e.g. python train.py --epochs 3)
    workload: str | None = None  # built-in workload name, used when command is empty
    workload_args: tuple[str, ...] = ()
    nproc_per_node: int = 1
    rdzv_port: int = DEFAULT_RDZV_PORT
    max_restarts: int = 0
    max_seconds: float | None = None
    env: tuple[tuple[str, str], ...] = ()
    threads_per_proc: int | None = None  # OMP/MKL threads per worker; None = torchrun's default

    @property
    def display(self) -> str:
        if self.command:
            return shlex.join(self.command)
        return shlex.join(["workload:" + str(self.workload), *self.workload_args])


@dataclass
class NodeResult:
    node_rank: int
    host: str
    exit_code: int | None  # None: killed by us or never finished
    last_lines: list[str] = field(default_factory=list)


@dataclass
class JobResult:
    ok: bool
    nodes: list[NodeResult]
    metrics: MetricsState
    failure: str | None = None
    failed_node: int | None = None
    timed_out: bool = False
    train_started_at: float | None = None
    rendezvous_started_at: float | None = None
    log_dir: str | None = None


class LaunchEvents(Protocol):
    def on_line(self, node_rank: int, line: str) -> None: ...

    def on_metric(self, node_rank: int, record: dict[str, Any]) -> None: ...

    def on_phase(self, phase: str) -> None: ...


class Launcher(Protocol):
    def launch(self, cluster: Any, job: JobSpec, events: LaunchEvents, log_dir: Path) -> JobResult: ...


# -- torchrun command line ------------------------------------------------------------------
_PYTHON_RE = re.compile(r"^python(\d+(\.\d+)?)?$")


def program_args(job: JobSpec, *, workload_dir: str | None = None) -> list[str]:
    """What follows torchrun's own options: a module, a script, or --no-python + a command.

    With `workload_dir` the built-in workloads run as scripts from that folder (shipped alone to a
    node); otherwise as modules of the installed package.
    """
    if not job.command:
        if not job.workload:
            raise UsageError("a job needs a workload or a command")
        if workload_dir:
            return [f"{workload_dir.rstrip('/')}/{job.workload}.py", *job.workload_args]
        return ["-m", f"gpucluster.workloads.{job.workload}", *job.workload_args]
    cmd = list(job.command)
    if _PYTHON_RE.match(os.path.basename(cmd[0])) and len(cmd) > 1:
        rest = cmd[1:]
        if rest[0] == "-m" and len(rest) > 1:
            return ["-m", *rest[1:]]
        if not rest[0].startswith("-"):
            return rest
    return ["--no-python", *cmd]


def torchrun_argv(
    job: JobSpec,
    *,
    python: str,
    nnodes: int,
    node_rank: int,
    rdzv_host: str,
    local_addr: str | None,
    program: Sequence[str],
    store_on_head: bool = True,
) -> list[str]:
    """torchrun for one node: c10d rendezvous on the head, a unique id per run, no restarts.

    With `store_on_head=False` no agent hosts the rendezvous store (every agent has
    is_host=false): the launcher runs the store itself at `rdzv_host:rdzv_port` (see
    gpucluster.rdzv_store), so that it outlives every agent. A user's command (not a built-in
    workload) is started through a one-line announcer (see `announced_program`).
    """
    is_host = node_rank == 0 and store_on_head
    if job.command:
        program = announced_program(python, program)
    argv = [
        python, "-m", "torch.distributed.run",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={job.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv_host}:{job.rdzv_port}",
        f"--rdzv-id={job.run_id}",
        # The head hosts the rendezvous store; the others only connect (no guessing by hostname).
        f"--rdzv-conf=is_host={'true' if is_host else 'false'},join_timeout=300",
        f"--max-restarts={job.max_restarts}",
        "--monitor-interval=0.5",
    ]
    if local_addr:
        argv.append(f"--local-addr={local_addr}")
    return argv + list(program)


def announced_program(python: str, program: Sequence[str]) -> list[str]:
    """torchrun's program part, run through the announcer: each worker prints a `worker_start`
    metric record and then exec()s exactly what torchrun would have run (`python -u script`,
    `python -u -m module`, or the command given with --no-python)."""
    return ["--no-python", python, "-c", _ANNOUNCE, *program]


def node_env(job: JobSpec, *, node_rank: int, node_ips: Sequence[str], gpus_per_node: int) -> dict[str, str]:
    """The GPUCLUSTER_* contract every rank sees, beside torchrun's own variables."""
    env = {
        "GPUCLUSTER_RUN_ID": job.run_id,
        "GPUCLUSTER_NODE_RANK": str(node_rank),
        "GPUCLUSTER_NUM_NODES": str(len(node_ips)),
        "GPUCLUSTER_NODE_IPS": ",".join(node_ips),
        "GPUCLUSTER_GPUS_PER_NODE": str(gpus_per_node),
        "PYTHONUNBUFFERED": "1",
    }
    if job.threads_per_proc:
        env["OMP_NUM_THREADS"] = str(job.threads_per_proc)
        env["MKL_NUM_THREADS"] = str(job.threads_per_proc)
    env.update(dict(job.env))
    return env


# -- supervising one process per node -------------------------------------------------------
def cut_line(line: bytes, total: int | None = None) -> bytes:
    """A line of at most LINE_CAP bytes (+ a marker saying it was cut and how long it was)."""
    total = len(line) if total is None else total
    if total <= _LONG:
        return line
    return line[:LINE_CAP] + f" ... [line cut: {total} bytes in all, whole in the node log]".encode()


def cap_last_lines(lines: Sequence[str], limit: int = TAIL_BYTES) -> list[str]:
    """The last of `lines` that fit in `limit` bytes (UTF-8, one newline each); a line longer
    than LINE_CAP is cut and marked. What the ledger stores per node."""
    out: list[str] = []
    size = 0
    for line in reversed(lines):
        raw = line.encode("utf-8", "replace")
        if len(raw) > _LONG:
            raw = cut_line(raw)
            line = raw.decode("utf-8", "replace")
        size += len(raw) + 1
        if size > limit:
            break
        out.append(line)
    out.reverse()
    return out


def _grow_pipe(stream: Any) -> None:
    """A 1 MiB pipe (Linux) between a node's process and us, so that a moment in which our
    reader thread is not scheduled does not stall the training's writes. Best effort."""
    try:
        import fcntl

        fcntl.fcntl(stream.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), _PIPE_SIZE)
    except (OSError, ValueError, AttributeError, ImportError):
        pass


class _LineSplitter:
    """Bytes chunks -> runs of complete lines, holding at most LINE_CAP bytes of an unfinished
    line. Works per chunk, not per line: a run is one bytes object, lines joined by b"\\n"."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.length = 0  # the unfinished line's full length so far

    def _hold(self, data: bytes) -> None:
        room = LINE_CAP - len(self.head)
        if room > 0:
            self.head += data[:room]
        self.length += len(data)

    def _finish(self, data: bytes) -> bytes:
        self._hold(data)
        line = cut_line(bytes(self.head), self.length)
        self.head = bytearray()
        self.length = 0
        return line

    def feed(self, chunk: bytes) -> tuple[bytes | None, bool]:
        """(the complete lines this chunk ends, or None; whether the first began earlier)."""
        last = chunk.rfind(b"\n")
        if last < 0:
            self._hold(chunk)
            return None, False
        carried = self.length > 0
        if carried:
            first = chunk.find(b"\n")
            run = self._finish(chunk[:first])
            if first < last:
                run += b"\n" + chunk[first + 1:last]
        else:
            run = chunk[:last]
        if last + 1 < len(chunk):
            self._hold(chunk[last + 1:])
        return run, carried

    def close(self) -> bytes | None:
        return self._finish(b"") if self.length else None


def _count_lines(run: bytes) -> int:
    return run.count(b"\n") + 1


def _metric_lines(run: bytes) -> list[bytes]:
    """The lines of a run that carry a metric record (found without splitting the whole run)."""
    found = []
    i = run.find(_METRIC_PREFIX)
    while i >= 0:
        start = run.rfind(b"\n", 0, i) + 1
        end = run.find(b"\n", i)
        end = len(run) if end < 0 else end
        found.append(run[start:end])
        i = run.find(_METRIC_PREFIX, end)
    return found


class _ConsoleFeed:
    """Lines on their way to `events.on_line`, delivered by a thread of their own.

    The console must never slow the training: producers never wait for it, and it shows at most
    `rate` lines a second (a person reads far fewer; more would only burn a CPU core that the
    training needs). While it is behind by more than `backlog` lines, further lines are only
    counted, and "... N lines not shown; full log: <node log>" is shown where they were left
    out. The node log files get every line regardless (they are written before anything is
    offered here).
    """

    def __init__(self, events: LaunchEvents, log_dir: Path, backlog: int = CONSOLE_BACKLOG,
                 rate: float = CONSOLE_RATE):
        self.events = events
        self.log_dir = log_dir
        self.backlog = backlog
        self.rate = rate
        self._cond = threading.Condition()
        self._items: collections.deque[tuple[int, bytes | int, int]] = collections.deque()
        self._queued = 0
        self._hidden: dict[int, int] = {}
        self.hidden_total = 0
        self.shown_total = 0
        self._closed = False
        self._cutoff: float | None = None
        self._thread = threading.Thread(target=self._run, name="console-feed", daemon=True)
        self._started = False

    def _start(self) -> None:  # caller holds the lock
        if not self._started and not self._closed:
            self._started = True
            self._thread.start()

    def offer(self, node_rank: int, run: bytes, nlines: int) -> None:
        with self._cond:
            if self._closed:  # the run is over: the log file has the lines, the console is done
                return
            room = self.backlog - self._queued
            taken = nlines if nlines <= room else max(room, 0)
            self._start()
            if taken:
                if taken < nlines:
                    run = b"\n".join(run.split(b"\n", taken)[:taken])
                gap = self._hidden.pop(node_rank, 0)
                if gap:  # the summary goes where the lines were left out
                    self._items.append((node_rank, gap, 0))
                self._items.append((node_rank, run, taken))
                self._queued += taken
                self._cond.notify()
            self._hide(node_rank, nlines - taken)

    def _summaries(self) -> None:  # caller holds the lock
        for rank, n in sorted(self._hidden.items()):
            self._items.append((rank, n, 0))
        self._hidden.clear()

    def _hide(self, rank: int, n: int) -> None:  # caller holds the lock
        if n > 0:
            self._hidden[rank] = self._hidden.get(rank, 0) + n
            self.hidden_total += n

    def _late(self) -> bool:
        return self._cutoff is not None and time.monotonic() > self._cutoff

    def _run(self) -> None:
        t0 = time.monotonic()
        while True:
            with self._cond:
                while not self._items and not self._hidden and not self._closed:
                    self._cond.wait(0.5)
                if not self._items:
                    if self._hidden:  # caught up: say what was left out
                        self._summaries()
                    else:
                        return  # closed and nothing left
                rank, payload, n = self._items.popleft()
                if not isinstance(payload, int) and self._late():  # out of time: count, don't show
                    self._queued -= n
                    self._hide(rank, n)
                    continue
            shown = 0
            try:
                if isinstance(payload, int):
                    self.events.on_line(rank, f"... {payload} lines not shown; full log: "
                                              f"{self.log_dir / f'node-{rank}.log'}")
                    continue
                for line in payload.split(b"\n"):
                    if shown and self._late():
                        break
                    if len(line) > _LONG:
                        line = cut_line(line)
                    self.events.on_line(rank, line.decode("utf-8", "replace").rstrip("\r"))
                    shown += 1
            except Exception:  # noqa: BLE001 - a broken console must not stop the run
                pass
            finally:
                if not isinstance(payload, int):
                    with self._cond:
                        self._queued -= n
                        self.shown_total += shown
                        self._hide(rank, n - shown)
            # Pace: at most `rate` lines a second on average, so the backlog fills (and lines are
            # summarised) instead of this thread taking a core from the training.
            if not self._closed:
                ahead = self.shown_total / self.rate - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(min(ahead, 1.0))

    def close(self, timeout: float = 2.0) -> None:
        """Show what is queued for at most `timeout` seconds more, count the rest, show the
        summaries, and let the thread end (not waiting on a console that is stuck for good)."""
        with self._cond:
            self._closed = True
            if not self._started:
                return
            self._cutoff = time.monotonic() + timeout
            self._cond.notify()
        self._thread.join(timeout + 2.0)


class _Tail:
    """A node's last lines (at most TAIL_LINES, TAIL_BYTES), kept as the runs they came in."""

    def __init__(self) -> None:
        self._runs: collections.deque[tuple[bytes, int]] = collections.deque()
        self._lines = 0
        self._lock = threading.Lock()

    def add(self, run: bytes, nlines: int) -> None:
        with self._lock:
            self._runs.append((run, nlines))
            self._lines += nlines
            while len(self._runs) > 1 and self._lines - self._runs[0][1] >= TAIL_LINES:
                self._lines -= self._runs.popleft()[1]

    def lines(self) -> list[str]:
        with self._lock:
            runs = [r for r, _ in self._runs]
        lines = b"\n".join(runs).split(b"\n")[-TAIL_LINES:] if runs else []
        return cap_last_lines([ln.decode("utf-8", "replace").rstrip("\r") for ln in lines])


class NodeSupervisor:
    """Watches one local process per node: pumps its output, fails fast, enforces the deadline.

    Output is read in chunks and written to node-N.log as it comes (every byte, nothing
    dropped). Metric records go to the main loop (ledger, phases); log lines go to the console
    through `_ConsoleFeed`, which shows a summary instead of lines when it falls behind; the
    last lines (at most TAIL_BYTES, long lines cut) are kept for the report and the ledger.

    `stop(procs)` is the launcher's way of making everything it started go away (process groups,
    remote process groups); it is called on failure, timeout, interrupt and exception alike.
    """

    def __init__(self, job: JobSpec, events: LaunchEvents, log_dir: Path, hosts: Sequence[str],
                 console_backlog: int = CONSOLE_BACKLOG, console_rate: float = CONSOLE_RATE):
        self.job = job
        self.events = events
        self.log_dir = log_dir
        self.hosts = list(hosts)
        self.metrics = MetricsState()
        self._queue: queue.Queue[tuple[int, str | None]] = queue.Queue()
        self._tails: dict[int, _Tail] = {i: _Tail() for i in range(len(hosts))}
        self._log_locks: dict[int, threading.Lock] = {}
        self._threads: list[threading.Thread] = []
        self._open_streams = 0
        self.train_started_at: float | None = None
        self.rendezvous_started_at: float | None = None
        log_dir.mkdir(parents=True, exist_ok=True)
        self.console = _ConsoleFeed(events, log_dir, console_backlog, console_rate)

    def attach(self, node_rank: int, stream: Iterable[bytes]) -> None:
        log_path = self.log_dir / f"node-{node_rank}.log"
        read1 = getattr(stream, "read1", None)
        if read1 is not None:
            _grow_pipe(stream)
        tail = self._tails.setdefault(node_rank, _Tail())
        # A node's streams (the job, and the utilisation sampler beside a user's script) share one
        # log file: only whole lines go in, under the node's lock, so a line is never split by
        # another stream's (an unfinished line longer than LOG_HOLD is written as it comes).
        lock = self._log_locks.setdefault(node_rank, threading.Lock())

        def pump() -> None:
            splitter = _LineSplitter()
            chunks = iter(lambda: read1(_READ_SIZE), b"") if read1 is not None else iter(stream)
            pending = bytearray()

            def write(data: bytes) -> None:
                with lock:
                    log.write(data)
                    log.flush()

            with open(log_path, "ab") as log:
                try:
                    for chunk in chunks:
                        if not chunk:
                            continue
                        end = chunk.rfind(b"\n") + 1
                        if end:
                            write(bytes(pending) + chunk[:end] if pending else chunk[:end])
                            pending = bytearray(chunk[end:])
                        else:
                            pending += chunk
                            if len(pending) > LOG_HOLD:
                                write(bytes(pending))
                                pending = bytearray()
                        run, carried = splitter.feed(chunk)
                        if run is not None:
                            self._take(node_rank, tail, run, _METRIC_PREFIX in chunk or carried)
                except (OSError, ValueError):
                    pass
                finally:
                    if pending:
                        try:
                            write(bytes(pending))
                        except (OSError, ValueError):
                            pass
                    rest = splitter.close()
                    if rest is not None:
                        self._take(node_rank, tail, rest, True)
                    self._queue.put((node_rank, None))

        t = threading.Thread(target=pump, name=f"log-node-{node_rank}", daemon=True)
        self._open_streams += 1
        self._threads.append(t)
        t.start()

    def _take(self, node_rank: int, tail: _Tail, run: bytes, maybe_metric: bool) -> None:
        nlines = _count_lines(run)
        tail.add(run, nlines)
        if maybe_metric:
            for ln in _metric_lines(run):
                self._queue.put((node_rank, ln.decode("utf-8", "replace").rstrip("\r")))
        self.console.offer(node_rank, run, nlines)

    def _drain(self, timeout: float) -> None:
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            node_rank, line = item
            if line is None:
                self._open_streams -= 1
            else:
                self._handle(node_rank, line)
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return

    def _handle(self, node_rank: int, line: str) -> None:
        record = parse_line(line)
        if record is not None:
            record.setdefault("node_rank", node_rank)
            # A built-in workload says "start" once its process group is up; a user's command
            # is started through the announcer, whose record says the worker process exists.
            if record.get("kind") in ("start", WORKER_START_KIND) and self.train_started_at is None:
                self.train_started_at = time.time()
                self.events.on_phase("train")
            self.metrics.update(record, node_rank)
            self.events.on_metric(node_rank, record)

    def tail(self, node_rank: int) -> list[str]:
        tail = self._tails.get(node_rank)
        return tail.lines() if tail else []

    def close(self) -> None:
        """Let the console show what it still can (bounded), then stop its thread."""
        self.console.close()

    def run(self, procs: dict[int, subprocess.Popen], stop: Callable[[], None],
            watch: Callable[[], str | None] | None = None) -> JobResult:
        """Watch until every node exits 0, one fails, or the deadline passes; always calls stop().

        `watch`, when given, is asked every loop for a failure of something beside the nodes
        (e.g. the launcher's rendezvous store); a string ends the run as that failure."""
        self.rendezvous_started_at = time.time()
        deadline = time.monotonic() + self.job.max_seconds if self.job.max_seconds else None
        exit_codes: dict[int, int | None] = {}
        failure: str | None = None
        failed_node: int | None = None
        timed_out = False
        try:
            self.events.on_phase("rendezvous")
            while True:
                self._drain(0.2)
                for rank, proc in procs.items():
                    if rank not in exit_codes and proc.poll() is not None:
                        exit_codes[rank] = proc.returncode
                        if proc.returncode != 0 and failure is None:
                            failed_node = rank
                            failure = f"node {rank} ({self.hosts[rank]}) exited with code {proc.returncode}"
                            cause = root_cause(self.tail(rank))
                            if cause:
                                failure += f" ({cause})"
                if failure is None and watch is not None:
                    failure = watch()
                if failure is not None:
                    break
                if len(exit_codes) == len(procs):
                    break
                if deadline is not None and time.monotonic() > deadline:
                    timed_out = True
                    failure = f"the run exceeded its time limit of {self.job.max_seconds / 60:g} minutes"
                    break
        finally:
            stop()
            # Collect what the processes printed before they went, so the report shows it.
            end = time.monotonic() + 5
            while self._open_streams > 0 and time.monotonic() < end:
                self._drain(0.1)
            self._drain(0)
            self.close()
        for rank, proc in procs.items():
            if rank not in exit_codes and proc.poll() is not None and failure is None:
                exit_codes[rank] = proc.returncode
        nodes = [NodeResult(r, self.hosts[r], exit_codes.get(r), self.tail(r)) for r in sorted(procs)]
        ok = failure is None and all(n.exit_code == 0 for n in nodes)
        # Built-in workloads, and any script that speaks the metrics protocol, must show a final
        # record from every rank: a rank can exit 0 without finishing its work. A script that
        # reports nothing is judged by its exit codes alone (it runs unmodified).
        speaks_protocol = self.job.workload is not None or bool(
            self.metrics.start or self.metrics.epochs or self.metrics.finals)
        if ok and speaks_protocol:
            world = self.metrics.world_size or self.job.nproc_per_node * len(procs)
            missing = sorted(set(range(world)) - set(self.metrics.finals))
            if missing:
                ok = False
                failure = (f"every node exited 0 but rank(s) {', '.join(map(str, missing[:8]))} wrote no final "
                           "record (a worker died after its work, or the script does not report)")
        return JobResult(
            ok=ok, nodes=nodes, metrics=self.metrics, failure=failure, failed_node=failed_node,
            timed_out=timed_out, train_started_at=self.train_started_at,
            rendezvous_started_at=self.rendezvous_started_at, log_dir=str(self.log_dir),
        )


_AGENT_ERROR = re.compile(r"^E\d{4} .*elastic/multiprocessing/api\.py.*failed \(exitcode")
_ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_ROOT_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")


def worker_lines(lines: Sequence[str]) -> list[str]:
    """A node's log lines up to torchrun's own failure report (the worker's last words)."""
    for i, line in enumerate(lines):
        if _AGENT_ERROR.match(line):
            return list(lines[:i])
    return list(lines)


def root_cause(lines: Sequence[str]) -> str | None:
    """'worker rank R exit code C' from torchrun's root-cause summary, when it printed one."""
    rank = code = None
    for line in lines:
        if (m := _ROOT_RANK.match(line)) and rank is None:
            rank = m.group(1)
        elif (m := _ROOT_EXIT.match(line)) and code is None:
            code = m.group(1)
    if rank is None or code is None:
        return None
    return f"worker rank {rank} exit code {code}"


def terminate_groups(pgids: Iterable[int], grace: float = 3.0, reap: Callable[[], None] | None = None) -> None:
    """SIGTERM whole process groups, then SIGKILL what is left after `grace` seconds.

    torchrun agents have been seen ignoring SIGTERM for minutes after a worker crashed, hence the
    escalation.
    """
    pgids = [p for p in set(pgids) if p and p > 1]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pgid in pgids:
            try:
                os.killpg(pgid, sig)
                alive.append(pgid)
            except (ProcessLookupError, PermissionError):
                pass
        if not alive or sig == signal.SIGKILL:
            return
        end = time.monotonic() + grace
        while time.monotonic() < end:
            if reap:
                reap()  # our own children stay zombies (and their group "alive") until reaped
            if not any(_group_alive(p) for p in alive):
                return
            time.sleep(0.05)
        pgids = [p for p in alive if _group_alive(p)]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False
