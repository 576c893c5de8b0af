"""A kept cluster of machines that exist (issue 46 item 8 and done-means 2), end to end through the real
CLI on two real sshd hosts on loopback (tests/sshd.py; every "host" is this machine, so /proc here sees
every remote process and ~/.gpucluster/runs is the hosts' run folder):

`up --cloud ssh --hosts ... --name` (each host checked ready once, recorded) -> `exec` stopped by Ctrl-C
(its processes and run folder gone, the cluster still kept) -> `exec` again (its files home) -> `ssh lab 1
-- CMD` -> `status` (kept, $0) -> `down` (verified; nothing of any of its runs on the hosts, the hosts
untouched otherwise). One test, two jobs: each job on a loopback pair takes about 12 s on an idle machine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import gpucluster_argv, run_cli  # noqa: E402
from sshd import hosts, leaked_ssh_masters, run_processes, skip_unless_usable  # noqa: E402,F401

skip_unless_usable()
pytestmark = [pytest.mark.sshd, pytest.mark.slow]

from gpucluster.ledger.store import Ledger  # noqa: E402

JOB = """import os, sys, time
rank = os.environ["RANK"]
os.makedirs("outputs", exist_ok=True)
open(f"outputs/rank{rank}.txt", "w").write(rank)
print("started rank", rank, flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
print("loss 0.5", flush=True)
"""


def remote_run_dir(run_id: str) -> Path:
    return Path.home() / ".gpucluster" / "runs" / run_id


def kept_lab(hosts, tmp_path) -> tuple[Path, dict, Path]:
    """`up --cloud ssh` of the first two hosts as cluster `lab`: (its home, the env, a project holding JOB)."""
    home = tmp_path / "home"
    env = {"GPUCLUSTER_HOME": str(home)}
    project = tmp_path / "project"
    project.mkdir()
    (project / "job.py").write_text(JOB)
    up = run_cli("up", "--cloud", "ssh", "--hosts", ",".join(hosts.hosts[:2]), "--identity", str(hosts.identity),
                 "--known-hosts", str(hosts.known_hosts), "--remote-python", sys.executable, "--name", "lab", env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    return home, env, project


def test_up_exec_ctrl_c_exec_status_down_on_machines_that_exist(hosts, tmp_path):  # noqa: F811 - the fixture
    home, env, project = kept_lab(hosts, tmp_path)
    ledger = Ledger(home / "ledger.sqlite3")
    rows = [r for r in ledger.open_resources("lab") if r["kind"] == "host"]
    assert [r["detail"]["home"] for r in rows] == [str(Path.home())] * 2  # found by the ready check, once
    assert all(r["detail"]["known_hosts"] == str(hosts.known_hosts) for r in rows)
    assert (home / "held" / "lab.ready.json").is_file()  # the hosts' answers, for an exec within the minute

    # Ctrl-C while the job runs: the job's processes and run folder go, the cluster stays kept
    proc = subprocess.Popen(gpucluster_argv("exec", "lab", "--", "python", "job.py", "60"), cwd=project,
                            env=dict(os.environ, **env, COLUMNS="200"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen = []
    deadline = time.monotonic() + 90
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if "started rank" in line or time.monotonic() > deadline:
            break
    os.killpg(proc.pid, signal.SIGINT)  # as the terminal delivers it: to the foreground group
    rest, _ = proc.communicate(timeout=90)
    assert proc.returncode == 130, "".join(seen) + rest
    stopped = ledger.list_runs()[0]
    assert stopped.status == "interrupted" and stopped.teardown == "kept", (stopped.status, stopped.teardown)
    assert run_processes(stopped.id) == {} and not remote_run_dir(stopped.id).exists()

    again = run_cli("exec", "lab", "--", "python", "job.py", env=env, cwd=project)  # still usable
    assert again.returncode == 0, again.stdout + again.stderr
    run2 = ledger.list_runs()[0]
    assert run2.status == "succeeded" and run2.teardown == "kept"
    outputs = home / "runs" / run2.id / "outputs"
    assert sorted(p.name for p in outputs.rglob("rank*.txt")) == ["rank0.txt", "rank1.txt"]  # the job's files came home

    shell = run_cli("ssh", "lab", "1", "--", "echo", "on-node-one", env=env)  # the key and known hosts `up` was given
    assert shell.returncode == 0 and "on-node-one" in shell.stdout, shell.stdout + shell.stderr

    status = run_cli("status", "--json", env=env)
    listed = {c["cluster"]: c for c in json.loads(status.stdout)}
    assert listed["lab"]["state"] == "kept" and listed["lab"]["cloud"] == "ssh", listed
    assert listed["lab"]["accrued_usd"] in (None, "0", "0.00")

    down = run_cli("down", "lab", "--yes", env=env)
    assert down.returncode == 0 and "verified" in down.stdout, down.stdout + down.stderr
    assert ledger.open_resources("lab") == [] and not (home / "held" / "lab.ready.json").exists()
    for run in ledger.list_runs():  # nothing of any of its runs on the hosts, and no connection left here
        assert run_processes(run.id) == {} and not remote_run_dir(run.id).exists(), run.id
    assert leaked_ssh_masters() == []
    gone = run_cli("exec", "lab", "--", "python", "job.py", env=env, cwd=project)
    assert gone.returncode == 2 and "is not up" in gone.stderr


def test_exec_after_a_job_whose_gpucluster_was_killed_reclaims_it(hosts, tmp_path):  # noqa: F811 - the fixture
    """The gpucluster process of an `exec` SIGKILLed mid-job (an OOM kill, a closed laptop): its run
    row stays `running` and its processes and run folder stay on the hosts. The next `exec` kills
    them by run id and owner, removes the folder, reads both back, closes the dead run as failed and
    runs its own job. Before, every later `exec` was refused until `down` (the ssh launcher had no
    `reclaim`)."""
    home, env, project = kept_lab(hosts, tmp_path)
    proc = subprocess.Popen(gpucluster_argv("exec", "lab", "--", "python", "job.py", "120"), cwd=project,
                            env=dict(os.environ, **env, COLUMNS="200"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 90
    assert proc.stdout is not None
    for line in proc.stdout:
        if "started rank" in line or time.monotonic() > deadline:
            break
    ledger = Ledger(home / "ledger.sqlite3")
    dead = ledger.list_runs()[0]
    assert run_processes(dead.id), "the job should be running on the hosts"
    os.kill(proc.pid, signal.SIGKILL)  # gpucluster only: its ssh clients and the hosts' processes are left
    proc.communicate(timeout=30)
    try:
        again = run_cli("exec", "lab", "--", "python", "job.py", env=env, cwd=project)
        assert again.returncode == 0, again.stdout + again.stderr
        assert f"run {dead.id} had ended without cleanup" in again.stdout + again.stderr
        assert run_processes(dead.id) == {} and not remote_run_dir(dead.id).exists()
        closed = ledger.get_run(dead.id).run
        assert closed.status == "failed" and closed.teardown == "kept", (closed.status, closed.teardown)
        assert ledger.list_runs()[0].status == "succeeded"
    finally:
        down = run_cli("down", "lab", "--yes", env=env)
    assert down.returncode == 0 and "verified" in down.stdout, down.stdout + down.stderr
    for run in ledger.list_runs():
        assert run_processes(run.id) == {} and not remote_run_dir(run.id).exists(), run.id
