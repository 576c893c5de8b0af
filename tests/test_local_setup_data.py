"""`--setup` and `--data` on the local backend, through the real CLI: the data folder checked by
checksum on every rank, setup output before the first training line, a failing setup naming the
node, a Ctrl-C during setup and a time limit reached in setup leaving nothing behind."""

import hashlib
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


def only_run(home):
    runs = Ledger(home / "ledger.sqlite3").list_runs()
    assert len(runs) == 1
    return Ledger(home / "ledger.sqlite3").get_run(runs[0].id).to_dict()


def test_data_checked_on_every_rank_and_setup_runs_first(home, tmp_path):
    ds = tmp_path / "ds"
    (ds / "sub").mkdir(parents=True)
    for i in range(5):
        (ds / "sub" / f"f{i}.bin").write_bytes(os.urandom(50_000))
    (ds / "labels.txt").write_text("a b\n")
    want = json.dumps({str(p.relative_to(ds)): hashlib.sha256(p.read_bytes()).hexdigest()
                       for p in ds.rglob("*") if p.is_file()})
    r = run_cli("run", "--nodes", "2", "--data", str(ds), "--setup", "echo SETUP-ONE $GPUCLUSTER_NODE_RANK",
                "--setup", "echo SETUP-TWO $GPUCLUSTER_DATA", "--json", "--", "python", str(FIXTURES / "check_data.py"),
                env={"CHECK_MANIFEST": want})
    assert r.returncode == 0, r.stderr[-3000:]
    run = json.loads(r.stdout)
    assert [p["name"] for p in run["phases"]] == ["prepare", "provision", "ready", "setup", "rendezvous", "train",
                                                  "outputs", "teardown"]
    assert sorted(s["node_rank"] for s in run["setup"] if s["rc"] == 0) == [0, 1]
    for rank in (0, 1):
        log = (home / "runs" / run["id"] / f"node-{rank}.log").read_text()
        # the job's own sha256 check passed on this node; setup ran before it, in order
        assert log.index(f"SETUP-ONE {rank}") < log.index(f"SETUP-TWO {ds}") < log.index("data ok: 6 files"), log
        assert log.index("[gpucluster setup 2/2] $ echo SETUP-TWO") < log.index("worker_start")
    shown = run_cli("show", run["id"]).stdout
    assert "setup: 2 of 2 node(s) succeeded" in shown and "setup " in shown
    assert run_processes(run["id"]) == []


def test_failing_setup_fails_the_run_naming_the_node(home):
    r = run_cli("run", "--nodes", "2", "--setup",
                'if [ "$GPUCLUSTER_NODE_RANK" = 1 ]; then echo no-such-package >&2; exit 5; fi',
                "--", "python", str(FIXTURES / "print_env.py"))
    assert r.returncode == 1, r.stdout[-2000:]
    run = only_run(home)
    assert run["status"] == "failed"
    assert run["failure"].startswith("setup failed on node 1 (local:1): exit code 5; last lines:"), run["failure"]
    assert "no-such-package" in run["failure"]
    phases = {p["name"]: p["status"] for p in run["phases"]}
    assert phases["setup"] == "failed" and "train" not in phases and phases["teardown"] == "ok"
    assert run["teardown"] == "verified"
    assert "node 1 failed with exit code 5" in r.stdout  # the report
    assert run_processes(run["id"]) == []


def test_max_minutes_counts_the_setup(home):
    start = time.monotonic()
    r = run_cli("run", "--nodes", "2", "--max-minutes", "0.1", "--setup", "sleep 300", "--",
                "python", str(FIXTURES / "print_env.py"))
    assert r.returncode == 1 and time.monotonic() - start < 60, r.stdout[-2000:]
    run = only_run(home)
    assert "time limit" in run["failure"] and run["teardown"] == "verified"
    assert run_processes(run["id"]) == []


def test_ctrl_c_during_setup_leaves_nothing(home):
    proc = subprocess.Popen(gpucluster_argv("run", "--nodes", "2", "--setup", "echo SETUP-SLEEPING; sleep 300",
                                            "--", "python", str(FIXTURES / "print_env.py")),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, COLUMNS="200"), cwd=ROOT, start_new_session=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "SETUP-SLEEPING" in line and "[node 1]" in line:
            break
    run_id = Ledger(home / "ledger.sqlite3").list_runs()[0].id
    assert any("sleep 300" in " ".join(p.cmdline()) for p in run_processes(run_id)), "".join(seen)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out[-2000:]
    assert run_processes(run_id) == []
    run = Ledger(home / "ledger.sqlite3").get_run(run_id).to_dict()
    assert run["status"] == "interrupted" and run["teardown"] == "verified"
    assert {p["name"]: p["status"] for p in run["phases"]}["setup"] == "interrupted"


def test_a_setup_writing_beside_the_node_folders_leaves_nothing(home, tmp_path):
    """A --setup that writes outside the node folder (Lightning's `<script dir>/../../Datasets`)
    left it after "teardown: verified" (issue 46 item 7): the node folders' folder goes as a whole,
    and the teardown check looks there."""
    from gpucluster.infra.local.provider import LocalProvider

    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('trained')\n")
    r = run_cli("run", "--nodes", "2", "--setup", "mkdir -p ../../Datasets && echo x > ../../Datasets/n$GPUCLUSTER_NODE_RANK",
                "--json", "--", "python", "train.py", cwd=project)
    assert r.returncode == 0, r.stderr[-3000:]
    run = json.loads(r.stdout)
    assert run["teardown"] == "verified", run
    assert not (home / "runs" / run["id"] / "nodes").exists()
    (home / "runs" / run["id"] / "nodes" / "Datasets").mkdir(parents=True)
    left = LocalProvider().leftovers("c", run["id"]).leftovers
    assert [(f.kind, f.detail) for f in left] == [("folder", "holds Datasets")], left
    # `down` after a crash removes them, then finds nothing
    from gpucluster.infra.local.plugin import check_down

    assert check_down(LocalProvider(), "c", {run["id"]: {}}).verdict == "verified"
    assert not (home / "runs" / run["id"] / "nodes").exists()
