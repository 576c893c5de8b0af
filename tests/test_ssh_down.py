"""ssh runs: no descendant escapes (issue 10, item 9) and `down` cleans the hosts after the
`gpucluster run` process was SIGKILLed (item 6). Real OpenSSH servers on loopback (tests/sshd.py);
every "host" is this machine, so /proc and psutil here see every remote process.

What a killed run leaves, and what `down` must remove: on each host the node's reaper, torchrun
agent, workers and the script's detached daemon, plus the run folder under ~/.gpucluster/runs;
here, the ssh clients of the run and its ControlMaster processes (`ControlPath=<tmp>/%C`,
ControlPersist) with their socket folder. OpenSSH's `ssh -O exit` asks a master to exit
(https://man.openbsd.org/ssh#O).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import FIXTURES, ROOT, gpucluster_argv, run_cli  # noqa: E402
from sshd import SSHD, SshdHosts, hosts, run_processes, skip_unless_usable  # noqa: E402,F401
from test_reaper import daemons, marked, new_marker  # noqa: E402

skip_unless_usable()
pytestmark = [pytest.mark.sshd, pytest.mark.slow]

from gpucluster.ledger.store import Ledger  # noqa: E402


@pytest.fixture
def marker():
    m = new_marker()
    yield m
    for p in marked(m):
        p.kill()


def project(tmp_path) -> Path:
    d = tmp_path / "project"
    d.mkdir()
    shutil.copy(FIXTURES / "daemon_script.py", d / "daemon_script.py")
    return d


def ssh_args(h: SshdHosts, n: int) -> list[str]:
    return ["--cloud", "ssh", "--hosts", ",".join(h.hosts[:n]), "--identity", str(h.identity),
            "--known-hosts", str(h.known_hosts), "--remote-python", sys.executable]


def remote_run_dir(run_id: str) -> Path:
    return Path.home() / ".gpucluster" / "runs" / run_id


def ssh_clients_of(control_dirs: set[str], run_id: str) -> list[str]:
    """ssh processes on this machine that use one of the run's control folders or carry its id."""
    out = []
    for p in psutil.process_iter(["name", "cmdline", "status"]):
        try:
            cmd = " ".join(p.info["cmdline"] or ())
            if p.info["name"] == "ssh" and p.info["status"] != psutil.STATUS_ZOMBIE and (
                    run_id in cmd or any(f"ControlPath={d}/" in cmd for d in control_dirs)):
                out.append(cmd)
        except psutil.Error:
            continue
    return out


def only_run(home) -> dict:
    ledger = Ledger(home / "ledger.sqlite3")
    runs = ledger.list_runs()
    assert len(runs) == 1
    return ledger.get_run(runs[0].id).to_dict()


def test_ssh_run_leaves_no_detached_daemon(hosts, home, tmp_path, marker):
    cwd = project(tmp_path)
    r = run_cli("run", *ssh_args(hosts, 2), "--", "python", "daemon_script.py", marker, cwd=cwd)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert marked(marker) == [], [p.cmdline() for p in marked(marker)]
    run = only_run(home)
    assert run["status"] == "succeeded" and run["teardown"] == "verified" and run["leftovers"] == []
    logs = "".join(open(os.path.join(run["log_dir"], f"node-{i}.log")).read() for i in range(2))
    assert logs.count("gpucluster-reaper: stopped 1 process(es)") == 2, logs[-3000:]
    assert run_processes(run["id"]) == {}
    assert not remote_run_dir(run["id"]).exists()
    # the ledger's per-node connection records are closed: the hosts were cleaned by the run itself
    rows = [x for x in run["resources"] if x["kind"] == "ssh-run"]
    assert len(rows) == 2 and all(x["confirmed_gone"] for x in rows)
    assert ssh_clients_of({x["detail"]["control_dir"] for x in rows}, run["id"]) == []


def start_and_kill(h: SshdHosts, n: int, home, cwd: Path, marker: str) -> tuple[str, set[str]]:
    """`gpucluster run --cloud ssh` of a script that starts a daemon and sleeps; SIGKILL it once
    every node's daemon is up. Returns (run id, the run's recorded control folders)."""
    env = dict(os.environ, COLUMNS="200")
    proc = subprocess.Popen(gpucluster_argv("run", *ssh_args(h, n), "--", "python", "daemon_script.py",
                                            marker, "300"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=cwd,
                            start_new_session=True)
    try:
        end = time.monotonic() + 120
        while len(daemons(marker)) < n:
            assert proc.poll() is None, f"run ended early with {proc.returncode}"
            assert time.monotonic() < end, "the daemons never started"
            time.sleep(0.2)
    finally:
        proc.kill()  # SIGKILL: no teardown at all
        proc.wait()
    run = only_run(home)
    assert run["status"] == "running"  # the killed process never finished its row
    rows = [x for x in run["resources"] if x["kind"] == "ssh-run"]
    assert len(rows) == n and not any(x["confirmed_gone"] for x in rows)
    control_dirs = {x["detail"]["control_dir"] for x in rows}
    # what a SIGKILL leaves: processes on the hosts, folders there, ssh clients and masters here
    assert len(run_processes(run["id"])) >= 3 * n  # reaper, agent, worker per node (+ sh)
    assert remote_run_dir(run["id"]).is_dir()
    assert ssh_clients_of(control_dirs, run["id"])
    assert any(os.listdir(d) for d in control_dirs)  # master sockets
    return run["id"], control_dirs


def test_down_after_sigkill_cleans_every_host(hosts, home, tmp_path, marker):
    cwd = project(tmp_path)
    run_id, control_dirs = start_and_kill(hosts, 2, home, cwd, marker)
    r = run_cli("down", only_run(home)["cluster"], "--yes", "--json")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    verdict = json.loads(r.stdout)
    assert verdict[0]["verdict"] == "verified" and not verdict[0]["leftovers"] and not verdict[0]["unchecked"]
    assert marked(marker) == [], [p.cmdline() for p in marked(marker)]
    assert run_processes(run_id) == {}
    assert not remote_run_dir(run_id).exists()
    assert ssh_clients_of(control_dirs, run_id) == []
    assert not any(os.path.exists(d) for d in control_dirs)
    run = Ledger(home / "ledger.sqlite3").get_run(run_id).to_dict()
    assert run["status"] == "failed" and run["teardown"] == "verified"
    assert all(x["confirmed_gone"] for x in run["resources"])


def test_down_with_an_unreachable_host_is_not_verified_and_names_it(home, tmp_path, tmp_path_factory, marker):
    h = SshdHosts.start(tmp_path_factory.mktemp("sshd-down"), 2)
    run_id = None
    try:
        cwd = project(tmp_path)
        run_id, control_dirs = start_and_kill(h, 2, home, cwd, marker)
        h.procs[1].kill()  # host 1's sshd goes away; its sessions (and the run there) live on
        h.procs[1].wait()
        r = run_cli("down", only_run(home)["cluster"], "--yes", "--json")
        assert r.returncode == 3, r.stdout[-3000:] + r.stderr[-3000:]
        verdict = json.loads(r.stdout)[0]
        assert verdict["verdict"] == "not verified"
        (unchecked,) = verdict["unchecked"]
        assert unchecked.startswith(h.hosts[1] + ":"), verdict
        assert "cannot connect" in unchecked or "Connection refused" in unchecked
        assert h.hosts[1] in r.stderr  # the console names the host too
        # host 0 was cleaned all the same. (Host 1's processes may end on their own here: `down`
        # stops this machine's ssh clients of the run, and sshd hangs up their sessions; the
        # verdict cannot know that, so it stays "not verified".)
        assert run_processes(run_id, node_rank=0) == {}
        run = Ledger(home / "ledger.sqlite3").get_run(run_id).to_dict()
        assert run["teardown"] == "not verified"
        # the host comes back: a second `down` finishes the job and says so
        config = h.root / "host1" / "sshd_config"
        h.procs[1] = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        h._wait(1, h.ports[1])
        r = run_cli("down", only_run(home)["cluster"], "--yes", "--json")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert marked(marker) == [] and run_processes(run_id) == {}
        assert not remote_run_dir(run_id).exists()
        assert ssh_clients_of(control_dirs, run_id) == []
    finally:
        if run_id:
            for pid in run_processes(run_id):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            shutil.rmtree(remote_run_dir(run_id), ignore_errors=True)
        h.stop()
