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

from .errors import UsageError
from .metrics import MetricsState, parse_line

DEFAULT_RDZV_PORT = 29400
TAIL_LINES = 80
TAIL_BYTES = 64 * 1024  # the most of a node's last lines kept (and stored in the ledger)
LINE_CAP = 4096  # bytes of one line kept for the tail and the console; the log file keeps it whole
CONSOLE_BACKLOG = 2000  # lines waiting for the console; beyond that lines are counted, not queued
_READ_SIZE = 1 << 16
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
    if total <= LINE_CAP:
        return line
    return line[:LINE_CAP] + f" ... [line cut: {total} bytes in all, whole in the node log]".encode()


def cap_last_lines(lines: Sequence[str], limit: int = TAIL_BYTES) -> list[str]:
    """The last of `lines` that fit in `limit` bytes (UTF-8, one newline each); a line longer
    than LINE_CAP is cut and marked. What the ledger stores per node."""
    out: list[str] = []
    size = 0
    for line in reversed(lines):
        raw = line.encode("utf-8", "replace")
        if len(raw) > LINE_CAP:
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
    """Bytes chunks -> complete lines, holding at most LINE_CAP bytes of an unfinished line."""

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

    def feed(self, chunk: bytes) -> tuple[list[bytes], bool]:
        """(complete lines, whether the first one began in an earlier chunk)."""
        last = chunk.rfind(b"\n")
        if last < 0:
            self._hold(chunk)
            return [], False
        carried = self.length > 0
        if carried:
            first = chunk.find(b"\n")
            lines = [self._finish(chunk[:first])]
            if first < last:
                lines.extend(chunk[first + 1:last].split(b"\n"))
        else:
            lines = chunk[:last].split(b"\n")
        if last + 1 < len(chunk):
            self._hold(chunk[last + 1:])
        return lines, carried

    def close(self) -> list[bytes]:
        return [self._finish(b"")] if self.length else []


class _ConsoleFeed:
    """Lines on their way to `events.on_line`, printed by a thread of their own.

    The console must never slow the training: producers never wait for it. While it is behind by
    more than `backlog` lines, further lines are only counted, and when it catches up it shows
    "... N lines not shown; full log: <node log>" where they were left out. The node log files
    get every line regardless (they are written before anything is offered here).
    """

    def __init__(self, events: LaunchEvents, log_dir: Path, backlog: int = CONSOLE_BACKLOG):
        self.events = events
        self.log_dir = log_dir
        self.backlog = backlog
        self._cond = threading.Condition()
        self._items: collections.deque[tuple[int, list[bytes] | int]] = collections.deque()
        self._queued = 0
        self._hidden: dict[int, int] = {}
        self.hidden_total = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="console-feed", daemon=True)
        self._started = False

    def _start(self) -> None:  # caller holds the lock
        if not self._started and not self._closed:
            self._started = True
            self._thread.start()

    def offer(self, node_rank: int, lines: list[bytes]) -> None:
        with self._cond:
            if self._closed:  # the run is over: the log file has the line, the console is done
                return
            room = self.backlog - self._queued
            take = lines if len(lines) <= room else lines[:max(room, 0)]
            if len(take) < len(lines):
                self._hidden[node_rank] = self._hidden.get(node_rank, 0) + len(lines) - len(take)
                self.hidden_total += len(lines) - len(take)
            self._start()
            if take:
                self._items.append((node_rank, take))
                self._queued += len(take)
                self._cond.notify()

    def _summaries(self) -> None:  # caller holds the lock
        for rank, n in sorted(self._hidden.items()):
            self._items.append((rank, n))
        self._hidden.clear()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._hidden and not self._closed:
                    self._cond.wait(0.5)
                if not self._items:
                    if self._hidden:  # caught up: say what was left out
                        self._summaries()
                    else:
                        return  # closed and nothing left
                rank, payload = self._items.popleft()
                if isinstance(payload, list):
                    self._queued -= len(payload)
            try:
                if isinstance(payload, int):
                    self.events.on_line(rank, f"... {payload} lines not shown; full log: "
                                              f"{self.log_dir / f'node-{rank}.log'}")
                    continue
                text = b"\n".join(cut_line(ln) if len(ln) > LINE_CAP else ln for ln in payload)
                for line in text.decode("utf-8", "replace").split("\n"):
                    self.events.on_line(rank, line.rstrip("\r"))
            except Exception:  # noqa: BLE001 - a broken console must not stop the run
                pass

    def close(self, timeout: float = 2.0) -> None:
        """Show what is queued (at most `timeout` seconds more), then the summaries."""
        with self._cond:
            if not self._started:
                self._closed = True
                return
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():  # the console is slow: count the rest instead of showing it
            with self._cond:
                kept = collections.deque()
                for rank, payload in self._items:
                    if isinstance(payload, list):
                        self._hidden[rank] = self._hidden.get(rank, 0) + len(payload)
                        self.hidden_total += len(payload)
                    else:
                        kept.append((rank, payload))
                self._items = kept
                self._queued = 0
                self._cond.notify()
            self._thread.join(timeout)


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
                 console_backlog: int = CONSOLE_BACKLOG):
        self.job = job
        self.events = events
        self.log_dir = log_dir
        self.hosts = list(hosts)
        self.metrics = MetricsState()
        self._queue: queue.Queue[tuple[int, str | None]] = queue.Queue()
        self._tails: dict[int, collections.deque[bytes]] = {
            i: collections.deque(maxlen=TAIL_LINES) for i in range(len(hosts))}
        self._threads: list[threading.Thread] = []
        self._open_streams = 0
        self.train_started_at: float | None = None
        self.rendezvous_started_at: float | None = None
        log_dir.mkdir(parents=True, exist_ok=True)
        self.console = _ConsoleFeed(events, log_dir, console_backlog)

    def attach(self, node_rank: int, stream: Iterable[bytes]) -> None:
        log_path = self.log_dir / f"node-{node_rank}.log"
        read1 = getattr(stream, "read1", None)
        if read1 is not None:
            _grow_pipe(stream)
        tail = self._tails.setdefault(node_rank, collections.deque(maxlen=TAIL_LINES))

        def pump() -> None:
            splitter = _LineSplitter()
            chunks = iter(lambda: read1(_READ_SIZE), b"") if read1 is not None else iter(stream)
            with open(log_path, "ab") as log:
                try:
                    for chunk in chunks:
                        if not chunk:
                            continue
                        log.write(chunk)
                        log.flush()
                        lines, carried = splitter.feed(chunk)
                        if lines:
                            self._take(node_rank, tail, lines, _METRIC_PREFIX in chunk or carried)
                except (OSError, ValueError):
                    pass
                finally:
                    rest = splitter.close()
                    if rest:
                        self._take(node_rank, tail, rest, True)
                    self._queue.put((node_rank, None))

        t = threading.Thread(target=pump, name=f"log-node-{node_rank}", daemon=True)
        self._open_streams += 1
        self._threads.append(t)
        t.start()

    def _take(self, node_rank: int, tail: collections.deque, lines: list[bytes], maybe_metric: bool) -> None:
        tail.extend(lines[-TAIL_LINES:])
        if maybe_metric:
            for ln in lines:
                if _METRIC_PREFIX in ln:
                    self._queue.put((node_rank, ln.decode("utf-8", "replace").rstrip("\r")))
        self.console.offer(node_rank, lines)

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
        lines = [ln.decode("utf-8", "replace").rstrip("\r") for ln in list(self._tails.get(node_rank, ()))]
        return cap_last_lines(lines)

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
