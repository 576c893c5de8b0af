"""Real multi-node runs on the local backend: torchrun agents, gloo, the real digits data."""

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
    return Ledger(home / "ledger.sqlite3").get_run(runs[0].id, with_metrics=True).to_dict()


def assert_nothing_left(run_id):
    left = run_processes(run_id)
    assert left == [], [p.cmdline() for p in left]


def test_unmodified_script_gets_environment(home):
    r = run_cli("run", "--nodes", "2", "--", "python", str(FIXTURES / "print_env.py"))
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
    run = only_run(home)
    envs = []
    for i in range(2):
        text = open(os.path.join(run["log_dir"], f"node-{i}.log")).read()
        envs += [json.loads(line.split("ENV ", 1)[1]) for line in text.splitlines() if line.startswith("ENV ")]
    assert len(envs) == 2
    assert sorted(e["GPUCLUSTER_NODE_RANK"] for e in envs) == ["0", "1"]
    assert sorted(e["RANK"] for e in envs) == ["0", "1"]
    for e in envs:
        assert e["GPUCLUSTER_RUN_ID"] == run["id"]
        assert e["GPUCLUSTER_NUM_NODES"] == "2"
        assert e["GPUCLUSTER_NODE_IPS"] == "127.0.0.1,127.0.0.1"
        assert e["WORLD_SIZE"] == "2" and e["LOCAL_RANK"] == "0"
        assert e["TORCHELASTIC_RUN_ID"] == run["id"]
        assert e["allreduce"] == 2.0
    assert run["status"] == "succeeded" and run["teardown"] == "verified"
    # a utilisation sampler ran beside the script on every node, and is gone with the run
    util = Ledger(home / "ledger.sqlite3").metrics(run["id"], kind="util")
    assert {u["node_rank"] for u in util} <= {0, 1}
    assert all(u.get("source") == "sampler" and "cpu_percent" in u for u in util)


def test_crashing_rank_fails_fast(home):
    start = time.monotonic()
    r = run_cli("run", "--nodes", "3", "--", "python", str(FIXTURES / "crashy_train.py"),
                env={"CRASH_RANK": "1", "CRASH_STEP": "15"})
    elapsed = time.monotonic() - start
    assert r.returncode == 1, r.stdout[-2000:]
    assert elapsed < 60  # not a gloo/NCCL timeout (30 min by default)
    run = only_run(home)
    assert run["status"] == "failed"
    crashed = [n for n in run["node_results"] if n["exit_code"] not in (0, None)]
    assert crashed, run["node_results"]
    # the crashing worker's node, and perhaps a peer whose gloo collective broke at the same time
    # (whichever torchrun agent exits first under load is the one the failure names)
    assert any(f"node {n['node_rank']}" in run["failure"] for n in crashed), run["failure"]
    assert any("crashing on purpose" in ln for n in crashed for ln in n["last_lines"])
    assert "crashing on purpose" in r.stdout  # the report shows the failed node's last lines
    assert run["teardown"] == "verified"
    assert_nothing_left(run["id"])


def test_max_minutes_stops_everything(home):
    r = run_cli("run", "--nodes", "2", "--max-minutes", "0.15", "--", "python", str(FIXTURES / "crashy_train.py"))
    assert r.returncode == 1
    run = only_run(home)
    assert run["status"] == "failed" and "time limit" in run["failure"]
    assert_nothing_left(run["id"])
    # the sampler beside the user's script recorded both nodes' utilisation while it ran
    util = Ledger(home / "ledger.sqlite3").metrics(run["id"], kind="util")
    assert {u["node_rank"] for u in util} == {0, 1}
    assert all(u["source"] == "sampler" and 0 <= u["cpu_percent"] <= 100 for u in util)


def _start_and_wait_for_training(home, extra_env=None):
    env = dict(os.environ, COLUMNS="200", **(extra_env or {}))
    proc = subprocess.Popen(gpucluster_argv("run", "--nodes", "2", "--", "python", str(FIXTURES / "crashy_train.py")),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    seen = []
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        seen.append(line)
        # rank 0 prints the epochs; torchrun's c10d rendezvous may put it on either node
        if "epoch" in line and "[node " in line:
            break
        assert time.monotonic() < deadline, "".join(seen)
    ledger = Ledger(home / "ledger.sqlite3")
    run_id = ledger.list_runs()[0].id
    assert len(run_processes(run_id)) >= 4  # 2 agents + 2 workers are up
    return proc, run_id, seen


@pytest.mark.parametrize("sig,status", [(signal.SIGINT, "interrupted"), (signal.SIGTERM, "interrupted"),
                                        (signal.SIGHUP, "interrupted")])
def test_signal_mid_training_leaves_nothing(home, sig, status):
    proc, run_id, _ = _start_and_wait_for_training(home)
    # Ctrl-C in a terminal signals the whole foreground process group; SIGTERM comes from a supervisor.
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out[-2000:]
    assert_nothing_left(run_id)
    run = Ledger(home / "ledger.sqlite3").get_run(run_id).to_dict()
    assert run["status"] == status
    assert run["failure"] == {signal.SIGINT: "stopped by Ctrl-C", signal.SIGTERM: "stopped by SIGTERM",
                              signal.SIGHUP: "stopped by SIGHUP"}[sig]
    assert run["teardown"] == "verified"
    assert {p["name"]: p["status"] for p in run["phases"]}["teardown"] == "ok"


def test_second_ctrl_c_does_not_cut_teardown_short(home):
    # issue 10 item 8: two Ctrl-C 0.3 s apart while every rank ignores SIGTERM and SIGINT. The
    # launcher's grace period ends in SIGKILL; the second Ctrl-C is noted, not obeyed.
    proc, run_id, _ = _start_and_wait_for_training(home, {"IGNORE_STOP": "1"})
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 130, out[-2000:]
    assert_nothing_left(run_id)
    run = Ledger(home / "ledger.sqlite3").get_run(run_id).to_dict()
    assert run["status"] == "interrupted" and run["teardown"] == "verified"


def test_live_local_run_is_owned_and_down_refuses_it(home):
    # issue 10 item 5: a live local run holds the owner lock. status names it, a plain down refuses
    # (exit 2, nothing stopped), down --force stops the owner, which tears down and verifies.
    proc, run_id, _ = _start_and_wait_for_training(home)
    try:
        st = run_cli("status", "--json")
        assert st.returncode == 0, st.stderr
        name = Ledger(home / "ledger.sqlite3").get_run(run_id).to_dict()["cluster"]  # gpucluster-local-<owner id>
        assert name.startswith("gpucluster-local-")
        (row,) = [c for c in json.loads(st.stdout) if c["cluster"] == name]
        assert row["state"].startswith("in use") and str(proc.pid) in row["state"], row
        refused = run_cli("down", name, "--yes")
        assert refused.returncode == 2 and str(proc.pid) in refused.stderr, refused.stderr
        assert len(run_processes(run_id)) >= 4  # nothing was stopped
        forced = run_cli("down", name, "--yes", "--force", "--json")
        assert forced.returncode == 0, forced.stdout + forced.stderr
        (verdict,) = json.loads(forced.stdout)
        assert verdict["verdict"] == "verified" and verdict["stopped_owner"], verdict
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130
    assert_nothing_left(run_id)
    run = Ledger(home / "ledger.sqlite3").get_run(run_id).to_dict()
    assert run["status"] == "interrupted" and run["teardown"] == "verified"


def test_a_ledger_deleted_mid_run_is_said_last_with_exit_3(home, tmp_path):
    """Issue 45 item 11: the ledger deleted while the run wrote to it went unnoticed: SQLite keeps
    writing to the unlinked file, the run "succeeded", exit 0, verified, and its record was gone.
    The job waits until the test has deleted the ledger, so the deletion is mid-run every time."""
    go = tmp_path / "go"
    script = tmp_path / "wait.py"
    script.write_text(f"import os, time\nend = time.time() + 60\nwhile not os.path.exists({str(go)!r}) and "
                      "time.time() < end:\n    time.sleep(0.1)\n")
    proc = subprocess.Popen(gpucluster_argv("run", "--cloud", "local", "--nodes", "1", "--yes", "--", "python",
                                            str(script)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, COLUMNS="200"), cwd=tmp_path)
    deadline = time.monotonic() + 60
    while not list(home.glob("runs/*/node-0.log")) and time.monotonic() < deadline:
        time.sleep(0.2)
    for f in home.glob("ledger.sqlite3*"):
        f.unlink()
    go.touch()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, (out, err)
    last = err.strip().splitlines()[-1]
    assert last == (f"gpucluster: error: the ledger {str(home / 'ledger.sqlite3')!r} was deleted during the run: this "
                    "run's record went with the old file (what it created was still torn down and checked; see the "
                    "report above)")
    assert "teardown: verified" in out + err
