"""No descendant escapes a local run (issue 10, item 9).

A user script starts `setsid -f env -i sleep 778 MARKER`: re-parented (its parent exits at once),
in a session of its own, with an empty environment, so neither the run id nor a process group
finds it. Each node's torchrun runs under gpucluster/node/reaper.py, a child subreaper
(prctl(PR_SET_CHILD_SUBREAPER), https://man7.org/linux/man-pages/man2/prctl.2.html): the orphan
is adopted by it instead of init, found as its descendant and stopped. The tests scan every
process's command line for the marker, independently of the code under test.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from conftest import FIXTURES, ROOT, gpucluster_argv, needs_torch, run_cli
from gpucluster.domain import UNWITNESSED
from gpucluster.ledger.store import Ledger
from gpucluster.node import reaper

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreapers are Linux-only")
DAEMON = FIXTURES / "daemon_script.py"


def new_marker() -> str:
    return f"0.000{random.randrange(10**8, 10**9)}"  # `sleep 778 MARKER`: a number, unique per test


def marked(marker: str) -> list[psutil.Process]:
    """Every live process on this machine whose command line carries the marker."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(p.info["cmdline"] or ()):
                found.append(p)
        except psutil.Error:
            continue
    return found


def daemons(marker: str) -> list[psutil.Process]:
    """The detached daemon itself: `sleep 778 MARKER` (the command that started it carries the
    marker too, and shows up in `marked` while it runs)."""
    out = []
    for p in marked(marker):
        try:
            if p.cmdline()[:1] == ["sleep"]:
                out.append(p)
        except psutil.Error:
            continue
    return out


@pytest.fixture
def marker():
    m = new_marker()
    yield m
    for p in marked(m):  # whatever the outcome, leave nothing behind for the next test
        p.kill()


@linux_only
def test_reaper_stops_a_detached_daemon_when_its_command_ends(marker):
    assert reaper.become_subreaper() is None or not sys.platform.startswith("linux")
    r = subprocess.run([sys.executable, reaper.__file__, "--grace", "1", "--", "sh", "-c",
                        f"setsid -f env -i sleep 778 {marker}; sleep 0.3; exit 5"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 5  # the command's own exit code passes through
    assert "gpucluster-reaper: stopped 1 process(es)" in r.stderr and f"sleep 778 {marker}" in r.stderr
    assert marked(marker) == []


@linux_only
def test_reaper_on_sigterm_kills_a_command_that_ignores_it_after_the_grace(marker):
    p = subprocess.Popen([sys.executable, reaper.__file__, "--grace", "1", "--", "sh", "-c",
                          f"trap '' TERM; setsid -f env -i sleep 778 {marker}; sleep 60"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 10
    while not daemons(marker):
        assert time.monotonic() < end, "the daemon never started"
        time.sleep(0.05)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=20)
    took = time.monotonic() - t0
    assert p.returncode == 128 + signal.SIGKILL  # sh ignored SIGTERM and was killed after the grace
    assert 0.9 <= took < 5, took
    assert marked(marker) == []


@linux_only
@pytest.mark.parametrize("longer", [None, "4"])
def test_a_grace_file_written_before_the_stop_gives_the_command_that_long(tmp_path, longer):
    """A command whose SIGTERM save takes 2 s, under a reaper with a 0.5 s grace: with a longer
    grace in its --grace-file (what the ssh launcher writes after an interruption notice) the save
    finishes and the reaper ends as soon as it has; without the file it is cut at 0.5 s."""
    grace_file, saved = tmp_path / "stop-grace", tmp_path / "saved"
    if longer:
        grace_file.write_text(longer + "\n")
    script = (f"trap 'sleep 2; touch {saved}; exit 0' TERM; echo up; while :; do sleep 0.1; done")
    p = subprocess.Popen([sys.executable, reaper.__file__, "--grace", "0.5", "--grace-file", str(grace_file), "--",
                          "sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "up"
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=20)
    took = time.monotonic() - t0
    if longer:
        assert saved.exists() and p.returncode == 0 and 1.9 <= took < 3.5, (p.returncode, took)
    else:
        assert not saved.exists() and p.returncode == 128 + signal.SIGKILL and took < 1.9, (p.returncode, took)


@linux_only
def test_leftover_check_finds_an_env_cleared_descendant_of_the_run(marker):
    """While the reaper lives, the daemon (no run id in its environment) is found as its
    descendant, reported as a leftover process, and killed."""
    from gpucluster.infra.local.provider import LocalProvider
    from gpucluster.watch.procs import kill_run_processes, run_processes

    run_id = f"reap-{os.getpid()}-{marker[-6:]}"
    p = subprocess.Popen([sys.executable, reaper.__file__, "--grace", "1", "--", "sh", "-c",
                          f"setsid -f env -i sleep 778 {marker}; sleep 60"],
                         env=dict(os.environ, GPUCLUSTER_RUN_ID=run_id), start_new_session=True)
    try:
        end = time.monotonic() + 10
        while not daemons(marker):
            assert time.monotonic() < end
            time.sleep(0.05)
        daemon = daemons(marker)[0]
        assert "GPUCLUSTER_RUN_ID" not in daemon.environ()  # escapes a search by environment
        assert daemon.ppid() == p.pid  # adopted by the subreaper, not by init
        left = LocalProvider().leftovers("c", run_id).leftovers
        assert str(daemon.pid) in {lo.id for lo in left} and all(lo.kind == "process" for lo in left)
        assert daemon.pid in {q.pid for q in run_processes(run_id)}
        kill_run_processes(run_id, grace=2)
        p.wait(timeout=10)
        assert marked(marker) == [] and run_processes(run_id) == []
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def _only_run(home):
    ledger = Ledger(home / "ledger.sqlite3")
    runs = ledger.list_runs()
    assert len(runs) == 1
    return ledger.get_run(runs[0].id).to_dict()


@needs_torch
@linux_only
@pytest.mark.slow
def test_local_run_leaves_no_detached_daemon(home, marker):
    r = run_cli("run", "--nodes", "2", "--", "python", str(DAEMON), marker)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert marked(marker) == [], [p.cmdline() for p in marked(marker)]
    run = _only_run(home)
    assert run["status"] == "succeeded" and run["teardown"] == "verified" and run["leftovers"] == []
    logs = "".join(open(os.path.join(run["log_dir"], f"node-{i}.log")).read() for i in range(2))
    # each node's reaper found its daemon (the two nodes started one each) and stopped it
    assert logs.count("gpucluster-reaper: stopped 1 process(es)") == 2, logs[-3000:]
    from gpucluster.watch.procs import run_processes

    assert run_processes(run["id"]) == []


@needs_torch
@linux_only
@pytest.mark.slow
def test_sigterm_mid_run_leaves_no_detached_daemon(home, marker):
    env = dict(os.environ, COLUMNS="200")
    proc = subprocess.Popen(gpucluster_argv("run", "--nodes", "2", "--", "python", str(DAEMON), marker, "120"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    try:
        end = time.monotonic() + 120
        while len(daemons(marker)) < 2:
            assert proc.poll() is None and time.monotonic() < end
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out[-2000:]
    assert marked(marker) == []
    run = _only_run(home)
    assert run["status"] == "interrupted" and run["teardown"] == "verified"


@needs_torch
@linux_only
@pytest.mark.slow
def test_a_killed_reaper_makes_the_verdict_not_verified(home, marker):
    """Issue 32 item 2: the job kills its node's reaper after starting a detached daemon with an
    empty environment. No search by run id, group or ancestry can find the daemon now, so the
    run must not say "verified": the node's reaper never said its final pass was over."""
    r = run_cli("run", "--nodes", "1", "--", "python", str(FIXTURES / "reaper_killer.py"), marker)
    assert r.returncode == 3, (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    run = _only_run(home)
    assert run["teardown"] == "not verified", run["teardown"]
    assert any("its reaper ended without finishing its final pass" in u for u in run["unchecked"]), run["unchecked"]
    assert len(daemons(marker)) == 1  # the verdict was right: the daemon did survive (the fixture removes it)
    # `down` cannot find the daemon either (it carries nothing of the run): it must not say verified,
    # and it keeps the reason; it says how to acknowledge a node checked by hand
    d = run_cli("down", run["cluster"], "--yes")  # the default name carries the owner id
    assert d.returncode == 3, (d.returncode, d.stdout[-2000:], d.stderr[-2000:])
    assert "NOT VERIFIED" in d.stdout and "its reaper ended without finishing" in d.stdout, d.stdout
    assert "--ack-unwitnessed" in d.stdout, d.stdout
    after = _only_run(home)
    assert after["teardown"] == "not verified" and any(u.startswith(UNWITNESSED) for u in after["unchecked"])
    assert len(daemons(marker)) == 1
    # the way out: the person checked the node (here: the daemon is stopped by hand), and says so
    for p in daemons(marker):
        p.kill()
    d = run_cli("down", run["cluster"], "--yes", "--ack-unwitnessed", "--json")
    assert d.returncode == 0, (d.stdout[-2000:], d.stderr[-2000:])
    import json

    shown = json.loads(d.stdout)[0]
    assert shown["verdict"] == "verified" and any("its reaper ended" in a for a in shown["acknowledged"]), shown
    after = _only_run(home)
    assert after["teardown"] == "verified", after["teardown"]
    acks = Ledger(home / "ledger.sqlite3").metrics(after["id"], "teardown_acknowledged")
    assert len(acks) == 1 and acks[0]["by"] == "gpucluster down --ack-unwitnessed", acks
    assert any("its reaper ended" in u for u in acks[0]["unwitnessed"]), acks


@needs_torch
@linux_only
@pytest.mark.slow
def test_forged_control_lines_from_a_local_job_change_nothing(home, marker):
    """Issue 32: the job's own output cannot stand for gpucluster's node programs. A --setup command
    and then the job print every control record (plain, with a made-up key, and copies of the keyed
    lines in their own node log, rewritten to every kind), then the job trains 12 s and kills its
    reaper after starting a detached daemon. The forged setup_end must not release the rendezvous
    (the setup takes 5 s more), the forged node_exit must not cut the job short (10 s after it,
    the node would be taken for ended), and the forged reaper_done must not stand for the witness."""
    forger = str(FIXTURES / "forger.py")
    r = run_cli("run", "--nodes", "2", "--setup", f"python {forger} && sleep 5",
                "--", "python", forger, "--seconds", "12", "--kill-reaper", marker)
    assert r.returncode == 3, (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    run = _only_run(home)
    assert run["teardown"] == "not verified", run["teardown"]
    assert sum(u.startswith(UNWITNESSED) and "its reaper ended" in u for u in run["unchecked"]) == 2, run["unchecked"]
    phases = {p["name"]: p for p in run["phases"]}
    assert phases["setup"]["ended_at"] - phases["setup"]["started_at"] >= 5, phases["setup"]
    assert phases["train"]["ended_at"] - phases["train"]["started_at"] >= 12, phases["train"]
    logs = "".join(open(os.path.join(run["log_dir"], f"node-{i}.log")).read() for i in range(2))
    # each node: the setup's forger ended; the job's trained 12 s, then killed its reaper (which ends the node)
    assert logs.count("forger: done") >= 2 and logs.count("still training") >= 2 * 11, logs[-3000:]
    assert logs.count("forger: killed the reaper") == 2, logs[-3000:]
    assert re.search(r"forged every control record \([1-9]\d* copies", logs), logs[-3000:]  # keys seen, copied
    kinds = [m["kind"] for m in Ledger(home / "ledger.sqlite3").metrics(run["id"])]
    for kind in ("node_exit", "rdzv_port", "stage", "resume_files"):
        assert kind not in kinds, kind
    assert kinds.count("setup_end") == 2 and kinds.count("reaper_start") == 2 and "reaper_done" not in kinds
    assert run["metrics"]["refused_metric_lines"] > 100, run["metrics"]
    assert len(daemons(marker)) == 2  # the verdict was right: both daemons survived (the fixture removes them)


@needs_torch
@linux_only
@pytest.mark.slow
def test_a_stopped_reaper_is_killed_after_its_grace_and_the_node_has_no_witness(home):
    """Issue 45 item 5: the job SIGSTOPs its node's reaper and ends with exit code 0. The reaper's
    watch process says the agent ended (reading the zombie's status in /proc); once the reaper's
    grace for its final pass is over without `reaper_done`, the run stops waiting: the stopped
    reaper is killed, the run is not held to its time limit, and the node has no witness (exit 3).
    Before this, the run waited for the reaper until --max-minutes and failed as over its limit."""
    started = time.monotonic()
    r = run_cli("run", "--nodes", "1", "--max-minutes", "1", "--", "python", str(FIXTURES / "reaper_stopper.py"),
                timeout=200)
    took = time.monotonic() - started
    assert r.returncode == 3, (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    run = _only_run(home)
    assert run["status"] == "succeeded" and "time limit" not in (run["failure"] or ""), (run["status"], run["failure"])
    assert run["teardown"] == "not verified", run["teardown"]
    assert any(u.startswith(UNWITNESSED) and "said nothing within its grace" in u for u in run["unchecked"]), run["unchecked"]
    assert took < 50, took  # the grace (2 x 3 s + 5 s) and the teardown, never the 60 s limit
    from gpucluster.watch.procs import run_processes

    assert run_processes(run["id"]) == []  # the stopped reaper was killed, its watch process ended
