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
) -> list[str]:
    """torchrun for one node: c10d rendezvous on the head, a unique id per run, no restarts."""
    argv = [
        python, "-m", "torch.distributed.run",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={job.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv_host}:{job.rdzv_port}",
        f"--rdzv-id={job.run_id}",
        # The head hosts the rendezvous store; the others only connect (no guessing by hostname).
        f"--rdzv-conf=is_host={'true' if node_rank == 0 else 'false'},join_timeout=300",
        f"--max-restarts={job.max_restarts}",
        "--monitor-interval=0.5",
    ]
    if local_addr:
        argv.append(f"--local-addr={local_addr}")
    return argv + list(program)


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
class NodeSupervisor:
    """Watches one local process per node: pumps its output, fails fast, enforces the deadline.

    `stop(procs)` is the launcher's way of making everything it started go away (process groups,
    remote process groups); it is called on failure, timeout, interrupt and exception alike.
    """

    def __init__(self, job: JobSpec, events: LaunchEvents, log_dir: Path, hosts: Sequence[str]):
        self.job = job
        self.events = events
        self.log_dir = log_dir
        self.hosts = list(hosts)
        self.metrics = MetricsState()
        self._queue: queue.Queue[tuple[int, str | None]] = queue.Queue()
        self._tails = {i: collections.deque(maxlen=TAIL_LINES) for i in range(len(hosts))}
        self._threads: list[threading.Thread] = []
        self._open_streams = 0
        self.train_started_at: float | None = None
        self.rendezvous_started_at: float | None = None
        log_dir.mkdir(parents=True, exist_ok=True)

    def attach(self, node_rank: int, stream: Iterable[bytes]) -> None:
        log_path = self.log_dir / f"node-{node_rank}.log"

        def pump() -> None:
            with open(log_path, "ab") as log:
                try:
                    for raw in stream:
                        log.write(raw)
                        log.flush()
                        self._queue.put((node_rank, raw.decode("utf-8", "replace").rstrip("\r\n")))
                except (OSError, ValueError):
                    pass
                finally:
                    self._queue.put((node_rank, None))

        t = threading.Thread(target=pump, name=f"log-node-{node_rank}", daemon=True)
        self._open_streams += 1
        self._threads.append(t)
        t.start()

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
        self._tails[node_rank].append(line)
        record = parse_line(line)
        if record is not None:
            record.setdefault("node_rank", node_rank)
            if record.get("kind") == "start" and self.train_started_at is None:
                self.train_started_at = time.time()
                self.events.on_phase("train")
            self.metrics.update(record, node_rank)
            self.events.on_metric(node_rank, record)
        self.events.on_line(node_rank, line)

    def tail(self, node_rank: int) -> list[str]:
        return list(self._tails.get(node_rank, ()))

    def run(self, procs: dict[int, subprocess.Popen], stop: Callable[[], None]) -> JobResult:
        """Watch until every node exits 0, one fails, or the deadline passes; always calls stop()."""
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
