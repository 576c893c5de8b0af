"""The ssh launcher's side of the health check and of lost nodes (the `aws` backend uses it too).

- `check_nodes`: the `check` phase: `node_check.py` (shipped in the job bundle) on every node at
  once over the run's ssh connections, its process group's store on the head (a free port near the
  rendezvous port, found by node_port.py), each node bound to its private address; judged by
  gpucluster/watch/health.py.
- `ssh_lost`: why a node's ssh session that ended is a lost node: 255 (the session was cut: the
  host stopped answering within the keep-alive, ServerAliveInterval=5 x ServerAliveCountMax=3, or
  its sshd went away) or the shell's 137 (its agent killed by SIGKILL).
- `report_unreachable`: after a phase failed (ready, stage, setup, the outputs copy), each named
  node that no longer answers ssh gets a `node_lost` record, so the recovery loop knows the
  failure was the node's and not the job's.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from gpucluster.errors import LaunchError
from gpucluster.events import Phase, RunEvents
from gpucluster.watch.launch import JobSpec
from gpucluster.watch.nodeloss import killed_why, lost_record

from gpucluster.states import JsonObject

from .remote import PORT_PY
from .session import Session, SshSettings, node_label, sh

if TYPE_CHECKING:
    from gpucluster.domain import Cluster, Node

CHECK_PROGRAM = "node_check.py"  # its name in the job bundle (ship.py)
PROBE_TIMEOUT_S = 10


class PhaseNoted:
    """The run's events, noting the last phase reported (for the `node_lost` records)."""

    def __init__(self, inner: RunEvents):
        self.inner = inner
        self.phase: Phase | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def on_phase(self, phase: Phase) -> None:
        self.phase = phase
        self.inner.on_phase(phase)


def ssh_lost(rank: int, code: int | None) -> str | None:
    if code == 255:
        return "its ssh session was cut (the host stopped answering, or its sshd went away)"
    return killed_why(code) if code is not None and code > 0 else None


def stop_local(procs: dict[int, subprocess.Popen]) -> None:
    """The local ssh clients: SIGTERM, then SIGKILL after 3 s; reaped."""
    for proc in procs.values():
        if proc.poll() is None:
            proc.terminate()
    end = time.monotonic() + 3
    for proc in procs.values():
        try:
            proc.wait(timeout=max(0.05, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def watched(python: str, node_dir: str, watcher: Sequence[str], cmd: str, key_var: str | None = None) -> str:
    """`cmd` (a node's job, as sh text) with the launcher's watcher beside it: a node program shipped
    in the job bundle (e.g. infra/aws/node_notice.py, which reports an interruption notice on the
    node's output), started first, stopped once the job has ended; the job's exit status is kept.
    `key_var`: the shell variable holding the watcher's key (gpucluster/watch/control.py), given to it as
    one line on its stdin (never on its command line)."""
    if not watcher:
        return cmd
    prog = shlex.join([python, f"{node_dir}/{os.path.basename(watcher[0])}", *watcher[1:]])
    if key_var:
        prog = f"printf '%s\\n' \"${key_var}\" | {prog}"
    return f"{{ {prog} & w=$!; {cmd}; rc=$?; kill $w 2>/dev/null; wait $w 2>/dev/null; (exit $rc); }}"


def free_port(launcher: SshSettings, session: Session, node: Node, port: int,
              what: str = "port") -> tuple[int, JsonObject]:
    """(a port that is free on `node`: `port` or the nearest free one above it, what node_port.py said);
    none free, or no answer: LaunchError naming the port (`what`) and its holder."""
    cp = session.run(node, f"{shlex.quote(launcher.python)} -c {shlex.quote(PORT_PY)} {int(port)}", timeout=30)
    try:
        got = json.loads(cp.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise LaunchError(f"node {node.rank} ({node_label(node)}): the check of {what} {port} did not answer: "
                          f"{cp.stderr.decode('utf-8', 'replace').strip()[-300:]}") from None
    if got.get("free"):
        return port, got
    if not isinstance(got.get("alternative"), int):
        who = got.get("holder") or "a process that is not listening (yet) or has just closed it"
        raise LaunchError(f"{what} {port} on node {node.rank} ({node_label(node)}) is in use by {who}, and no port "
                          "near it is free; stop that process or free a port")
    return int(got["alternative"]), got


def check_nodes(launcher: SshSettings, session: Session, cluster: Cluster, job: JobSpec, events: RunEvents,
                dirs: dict[int, str], log_dir: Path) -> None:
    from gpucluster.watch import health

    check = job.check
    if check is None:
        raise ValueError("check_nodes: the job asks for no health check")
    head = cluster.head
    port, _ = free_port(launcher, session, head, job.rdzv_port + 1)
    store = f"{head.private_ip}:{port}"
    procs: dict[int, subprocess.Popen[bytes]] = {}

    def stop() -> None:
        stop_local(procs)
        # what is left on the nodes, by the run's id and node rank (no `cancelled` mark: the job starts later)
        session.each(lambda n: session.procs(n, "kill", job.run_id, str(n.rank), "", launcher.grace))

    try:
        for node in cluster.nodes:
            d = dirs[node.rank]
            args = health.program_args(check, rank=node.rank, world=len(cluster.nodes), store=store,
                                       addr=node.private_ip, disk=d)
            env = {"GPUCLUSTER_RUN_ID": job.run_id, "GPUCLUSTER_NODE_RANK": str(node.rank), "PYTHONUNBUFFERED": "1"}
            if job.owner:  # `down` after a kill finds the check program by run id AND owner (node_procs.py)
                env["GPUCLUSTER_OWNER"] = job.owner
            script = ("exec env " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()) + " "
                      + shlex.join([launcher.python, f"{d}/{CHECK_PROGRAM}", *args]))
            procs[node.rank] = subprocess.Popen(session.argv(node, sh(script), "-o", "ControlMaster=no", "-T"),
                                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT, start_new_session=True)
    except BaseException:  # Ctrl-C included: what was started is stopped before it propagates
        stop()
        raise
    health.run(procs, {n.rank: node_label(n) for n in cluster.nodes}, check, events, stop, log_dir=log_dir,
               lost_why=ssh_lost)


def report_unreachable(session: Session, events: RunEvents, ranks: Iterable[int] | None = None,
                       phase: Phase | None = None) -> list[int]:
    """Probe the nodes (all, or `ranks`) with a fresh ssh connection; each that does not answer
    gets a `node_lost` record (cause "unreachable"). The ranks reported."""
    want = None if ranks is None else set(ranks)
    nodes = [n for n in session.nodes if want is None or n.rank in want]
    if not nodes:
        return []

    def probe(node: Node) -> tuple[None, str | None]:
        argv = session.argv(node, "true", "-o", "ControlMaster=no", "-o", "ControlPath=none",
                            "-o", f"ConnectTimeout={PROBE_TIMEOUT_S}", "-T")
        try:
            cp = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=PROBE_TIMEOUT_S + 5,
                                start_new_session=True)
        except subprocess.TimeoutExpired:
            return None, f"no answer over ssh within {PROBE_TIMEOUT_S + 5} s"
        if cp.returncode == 255:
            return None, session.explain(node, cp.stderr.decode("utf-8", "replace")).split(": ", 1)[-1]
        return None, None

    with ThreadPoolExecutor(max_workers=min(16, len(nodes))) as pool:
        results = list(pool.map(probe, nodes))
    lost = []
    for node, (_, why) in zip(nodes, results):
        if why:
            events.on_metric(node.rank, lost_record(node.rank, node_label(node), "unreachable", why,
                                                    phase.value if phase is not None else None))
            lost.append(node.rank)
    return lost
