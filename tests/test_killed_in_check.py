"""Issue 45 item 7: `gpucluster run` SIGKILLed in its `check` phase, on the local backend, for real.

At that moment the run has its ledger row (`running`) and no resource row yet: the local backend
records a node's process only when its torchrun agent starts, and the check programs
(gpucluster/node/node_check.py) come before. A SIGKILL runs no handler, so nothing ends the row, and the
kernel releases the run's owner lock (flock(2): "the lock is released ... when all file
descriptors referring to the open file are closed", which process exit does; gpucluster/lifecycle/owner.py).
The check programs are stopped (SIGSTOP) before the kill, as a check program hung on a store that
never answers would be: they live on after gpucluster, which is the case `down` must finish.

Before the fix `status` said "no clusters", `down --all` "nothing to do" and `runs` listed the run
`running` for ever, while the check programs lived on. Now the run is "orphaned" for all three, and
`down --all` stops the check programs (by run id and owner) and closes the row, verified.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import FIXTURES, ROOT, gpucluster_argv, needs_torch, run_cli
from gpucluster.ledger.store import Ledger
from gpucluster.watch.procs import run_processes

pytestmark = [needs_torch, pytest.mark.slow]


def _check_programs(timeout: float = 90.0) -> tuple[str, list]:
    """(run id, the node_check.py processes of the run) once both nodes' programs are up."""
    import psutil

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        by_run: dict[str, list] = {}
        for p in psutil.process_iter(["pid"]):
            try:
                if any(a.endswith("node_check.py") for a in p.cmdline()[:3]):
                    rid = p.environ().get("GPUCLUSTER_RUN_ID")
                    if rid:
                        by_run.setdefault(rid, []).append(p)
            except (psutil.Error, OSError):
                continue
        for rid, procs in by_run.items():
            if len(procs) == 2:
                return rid, procs
        time.sleep(0.05)
    raise AssertionError("the check programs never started")


def test_a_run_killed_in_its_check_is_orphaned_and_down_ends_it(home):
    env = dict(os.environ, GPUCLUSTER_HOME=str(home), COLUMNS="200")
    proc = subprocess.Popen(gpucluster_argv("run", "--cloud", "local", "--nodes", "2", "--check", "--yes", "--",
                                            "python", str(FIXTURES / "plain_job.py")),
                            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    run_id = None
    try:
        run_id, checks = _check_programs()
        for p in checks:
            p.send_signal(signal.SIGSTOP)  # hung, as on a store that never answers: they outlive gpucluster
        proc.send_signal(signal.SIGKILL)  # no handler runs, no teardown
        proc.wait(timeout=30)
        ledger = Ledger(home / "ledger.sqlite3")
        row = ledger.get_run(run_id)
        assert row.run.status == "running" and not row.resources, (row.run.status, row.resources)
        cluster = row.run.cluster

        st = run_cli("status", "--json")
        assert st.returncode == 0, st.stderr
        rows = [c for c in json.loads(st.stdout) if c["cluster"] == cluster]
        assert rows and rows[0]["state"].startswith("orphaned") and rows[0]["runs"] == [run_id], st.stdout
        listed = run_cli("runs")
        line = next(ln for ln in listed.stdout.splitlines() if run_id in ln)
        assert "orphaned" in line and "running" not in line, listed.stdout

        down = run_cli("down", "--all", "--yes", "--json")
        assert down.returncode == 0, down.stdout + down.stderr
        (verdict,) = json.loads(down.stdout)
        assert verdict["cluster"] == cluster and verdict["verdict"] == "verified", verdict
        assert run_processes(run_id) == [], [p.cmdline() for p in run_processes(run_id)]
        after = Ledger(home / "ledger.sqlite3").get_run(run_id).run
        assert after.status == "failed" and after.teardown == "verified", (after.status, after.teardown)
        again = run_cli("status", "--json")
        assert [c for c in json.loads(again.stdout) if c["cluster"] == cluster] == [], again.stdout
    finally:
        if proc.poll() is None:
            proc.kill()
        if run_id:
            for p in run_processes(run_id):
                try:
                    p.kill()
                except Exception:  # noqa: BLE001 - gone already
                    pass
