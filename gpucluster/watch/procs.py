"""Finding the processes of a run on this machine: by the GPUCLUSTER_RUN_ID in their environment,
and as descendants of those.

torchrun starts its workers in new sessions, so killing an agent's process group does not reach
them; and an agent that dies leaves its workers re-parented. The run id that every process of a
run inherits finds them all, whatever their parent or group. A process that clears its
environment and leaves its session (`setsid -f env -i ...`) carries no run id: each node's
torchrun runs under `gpucluster/node/reaper.py`, a child subreaper that adopts such orphans, so they
stay descendants of a process that carries the run id and are found as such.

Every process of a run also carries GPUCLUSTER_OWNER (the installation id of the home that
started it, `gpucluster.ownership`): given an owner, a process is the run's only when its run id
matches AND its owner does (or it carries none: started before owner marks), so two homes on one
machine never stop each other's processes, even with a run id in common.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Callable, Iterable, TypeVar

import psutil


OWNER_ENV = "GPUCLUSTER_OWNER"
_Stream = TypeVar("_Stream")


# Open files a run may need here: per node, the ssh launcher holds about 4 at its peak (the staging
# pipes of each node's copy, its agent's pipes, its log file) and the Kubernetes launcher 2 (the log
# stream's socket, the log file): 280 for 64 ssh nodes (benchmarks/scale_ssh.py: 135 at 32). macOS
# starts processes with a soft limit of 256 open files (Linux: 1024); the hard limit is higher.
OPEN_FILES_WANTED = 8192


def raise_open_files(wanted: int = OPEN_FILES_WANTED) -> tuple[int, int]:
    """Raise this process's soft limit on open files to `wanted` (at most the hard limit; never
    lowered), as a run starts. (soft limit before, after). The processes it starts inherit it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):  # a platform that refuses (macOS caps it at OPEN_MAX): keep what there is
            return soft, soft
        return soft, target
    return soft, soft


def piped(stream: _Stream | None) -> _Stream:
    """A `Popen`'s stdin, stdout or stderr that was opened with `subprocess.PIPE` (each is typed
    Optional: None only for a stream that was not piped)."""
    if stream is None:
        raise ValueError("the process was not started with a pipe for this stream")
    return stream


def is_run_env(env: dict[str, str], run_id: str, owner: str | None) -> bool:
    """The environment of a process of run `run_id` made by `owner` (None: any owner)."""
    if env.get("GPUCLUSTER_RUN_ID") != run_id:
        return False
    return owner is None or env.get(OWNER_ENV) in (None, owner)


def run_processes(run_id: str, owner: str | None = None) -> list[psutil.Process]:
    """Live (non-zombie) processes on this machine whose environment has GPUCLUSTER_RUN_ID=run_id
    (and GPUCLUSTER_OWNER=owner, when given: see the module docstring), and every live descendant of
    those (whatever its environment)."""
    me = os.getpid()
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if is_run_env(proc.environ(), run_id, owner):
                found[proc.pid] = proc
        except (psutil.Error, OSError):
            continue
    for proc in list(found.values()):
        try:
            kids = proc.children(recursive=True)
        except (psutil.Error, OSError):
            continue
        for kid in kids:
            try:
                if kid.pid != me and kid.pid not in found and kid.status() != psutil.STATUS_ZOMBIE:
                    found[kid.pid] = kid
            except (psutil.Error, OSError):
                continue
    return list(found.values())


def kill_processes(procs: list[psutil.Process], grace: float = 3.0) -> list[psutil.Process]:
    """SIGTERM `procs`, SIGKILL what is left after `grace`; returns those still alive after that."""
    if not procs:
        return []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            try:
                p.send_signal(sig)  # psutil checks the pid was not reused since the snapshot
            except psutil.Error:
                pass
        _gone, procs = psutil.wait_procs(procs, timeout=grace if sig == signal.SIGTERM else 2.0)
        if not procs:
            return []
    return [p for p in procs if _alive(p)]


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_run_processes(run_id: str, grace: float = 3.0, also: list[psutil.Process] | None = None,
                       owner: str | None = None) -> int:
    """SIGTERM every process of the run (see `run_processes`, plus `also`, e.g. a snapshot taken
    before their parents were stopped), SIGKILL after `grace`; returns how many were found."""
    procs = {p.pid: p for p in (also or []) if _alive(p)}
    # The whole tree is listed before anything is signalled: once a parent dies, its orphans
    # are adopted elsewhere and no longer found under it.
    procs.update((p.pid, p) for p in run_processes(run_id, owner))
    kill_processes(list(procs.values()), grace)
    return len(procs)


def terminate_groups(pgids: Iterable[int], grace: float = 3.0, reap: Callable[[], object] | None = None) -> None:
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
