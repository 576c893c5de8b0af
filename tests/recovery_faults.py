"""Interruptions for the recovery tests (tests/test_recovery*.py): a node is lost, for real, at the
moment the run reaches a phase, through what production code really does at that moment:

- `Interrupting(launcher, phase, kill)`: the real launcher, handed an events wrapper; `kill()` runs
  once when the launcher reports the phase (check, stage, setup, ready) or the first epoch record
  (train), or as the outputs copy starts (outputs). Once fired, `revive()` (when given) runs as soon
  as a `node_lost` record is reported: the node "reboots" and is back for the teardown and the next
  attempt (as a host that restarts does).
- the kills: local node processes found by their run id and node rank (`kill_node_procs`), or a
  whole sshd "host" with everything under it (`kill_host`)."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Callable

import psutil

from gpucluster.watch.launch import Launcher


class Fault:
    def __init__(self, kill: Callable[[], None], revive: Callable[[], None] | None = None):
        self.kill, self.revive = kill, revive
        self.fired_at: float | None = None
        self.revived = False
        self.lock = threading.Lock()

    def fire(self) -> None:
        with self.lock:
            if self.fired_at is not None:
                return
            self.fired_at = time.time()
        self.kill()

    def lost(self) -> None:
        with self.lock:
            if self.fired_at is None or self.revived or self.revive is None:
                return
            self.revived = True
        self.revive()


class _Events:
    def __init__(self, inner: Any, phase: str, fault: Fault):
        self.inner, self.phase, self.fault = inner, phase, fault

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def on_phase(self, phase: Any) -> None:
        self.inner.on_phase(phase)
        if str(phase) == self.phase and self.phase not in ("train", "outputs"):
            self.fault.fire()

    def on_metric(self, node_rank: int, record: dict) -> None:
        self.inner.on_metric(node_rank, record)
        if self.phase == "train" and record.get("kind") == "epoch":
            self.fault.fire()
        if record.get("kind") == "node_lost":
            self.fault.lost()


class Interrupting(Launcher):
    def __init__(self, inner: Launcher, phase: str, fault: Fault):
        self.inner, self.phase, self.fault = inner, phase, fault
        self.collects_outputs = inner.collects_outputs
        self.ports: list[int] = []  # each launch's rendezvous port, as the chain gave it

    @property
    def cleanup_errors(self) -> Any:  # type: ignore[override]
        return self.inner.cleanup_errors

    def launch(self, cluster: Any, job: Any, events: Any, log_dir: Any) -> Any:
        self.ports.append(job.rdzv_port)
        return self.inner.launch(cluster, job, _Events(events, self.phase, self.fault), log_dir)

    def collect_outputs(self, job: Any, events: Any) -> Any:
        if self.phase == "outputs":
            self.fault.fire()
        return self.inner.collect_outputs(job, _Events(events, self.phase, self.fault))

    def describe(self, spec: Any, job: Any) -> Any:
        return self.inner.describe(spec, job)


def runs_program(arg: str, marker: str) -> bool:
    """`arg` (one of a command line's first words) names the program `marker`: it is it, a path
    ending with it, or the local launcher's `python -c BOOT` code that runs it as a module
    (gpucluster.watch.launch.agent_boot)."""
    return arg == marker or arg.endswith("/" + marker) or f"run_module({marker!r}" in arg


def node_procs(run_id: str, rank: int, marker: str | None = None) -> list[psutil.Process]:
    """This machine's processes of the run's node `rank` (by the environment every node process
    inherits), optionally only the program `marker` (one of its first three arguments is it or
    ends with it: `python -m torch.distributed.run`, `python .../reaper.py`, see `runs_program`; not a shell whose
    script merely mentions it)."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            env = p.environ()
            if env.get("GPUCLUSTER_RUN_ID") == run_id and env.get("GPUCLUSTER_NODE_RANK") == str(rank):
                if marker is None or any(runs_program(a, marker) for a in p.cmdline()[:3]):
                    found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def kill_node_procs(run_ids: Callable[[], list[str]], rank: int, marker: str, *, wait_s: float = 60,
                    sig: int = signal.SIGKILL, once_parent: bool = False) -> Callable[[], None]:
    """A kill that waits (in a thread) for the node's process whose command line has `marker`
    (e.g. the torchrun agent, node_check.py, the reaper) and sends it `sig`; with `once_parent`,
    only once that process has started a child (for the reaper: after its `reaper_start` record,
    which it writes, flushed, before it forks its command: a fixed point instead of a race)."""
    def kill() -> None:
        def hunt() -> None:
            end = time.monotonic() + wait_s
            while time.monotonic() < end:
                for rid in run_ids():
                    procs = node_procs(rid, rank, marker)
                    if once_parent:
                        procs = [p for p in procs if _has_children(p)]
                    if procs:
                        for p in procs:
                            try:
                                p.send_signal(sig)
                            except psutil.Error:
                                pass
                        return
                time.sleep(0.05)

        threading.Thread(target=hunt, daemon=True).start()
    return kill


def _has_children(p: psutil.Process) -> bool:
    try:
        return bool(p.children())
    except psutil.Error:
        return False


def kill_host(hosts: Any, i: int) -> None:
    """sshd "host" i is gone at once: its listener and every session and process under it, SIGKILL."""
    top = hosts.procs[i]
    try:
        tree = psutil.Process(top.pid).children(recursive=True)
    except psutil.Error:
        tree = []
    for p in [*tree]:
        try:
            p.kill()
        except psutil.Error:
            pass
    top.kill()
    top.wait()


def freeze_host(hosts: Any, i: int) -> list[int]:
    """sshd "host" i stops answering (SIGSTOP to its listener and everything under it: a frozen
    machine, its TCP connections open and silent). The pids stopped."""
    top = psutil.Process(hosts.procs[i].pid)
    pids = [top.pid] + [c.pid for c in top.children(recursive=True)]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            pass
    return pids


def reboot_host(hosts: Any, i: int, stopped: list[int] | None = None) -> None:
    """Host i "reboots": whatever ran on it is gone (SIGKILL, frozen or not), its sshd starts again."""
    for pid in stopped or []:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        kill_host(hosts, i)
    except (psutil.Error, OSError):
        pass
    hosts.launch(i)
