"""Finding the processes of a run on this machine, by the GPUCLUSTER_RUN_ID in their environment.

torchrun starts its workers in new sessions, so killing an agent's process group does not reach
them; and an agent that dies leaves its workers re-parented. The run id that every process of a
run inherits finds them all, whatever their parent or group.
"""

from __future__ import annotations

import os
import signal
import time

import psutil


def run_processes(run_id: str) -> list[psutil.Process]:
    """Live (non-zombie) processes on this machine whose environment has GPUCLUSTER_RUN_ID=run_id."""
    me = os.getpid()
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get("GPUCLUSTER_RUN_ID") == run_id:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def kill_run_processes(run_id: str, grace: float = 3.0) -> int:
    """SIGTERM every process of the run (and its group), SIGKILL after `grace`; returns how many."""
    procs = run_processes(run_id)
    if not procs:
        return 0
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
        if sig == signal.SIGKILL:
            break
        _gone, procs = psutil.wait_procs(procs, timeout=grace)
        if not procs:
            break
    psutil.wait_procs(procs, timeout=grace)
    return len(procs)


def wait_gone(run_id: str, timeout: float = 5.0) -> list[psutil.Process]:
    end = time.monotonic() + timeout
    left = run_processes(run_id)
    while left and time.monotonic() < end:
        time.sleep(0.1)
        left = run_processes(run_id)
    return left
