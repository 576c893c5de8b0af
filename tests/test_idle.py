"""Idle stop (`up --idle-minutes N`): the real node-side watcher, as the user data installs it, run in
a sandbox with its minute scaled down (GPUCLUSTER_IDLE_SCALE seconds per minute) and `shutdown`
stubbed to record its arguments. Processes of a "job" are real processes carrying GPUCLUSTER_RUN_ID in
their environment, as every launcher gives each process of a job (gpucluster.watch.launch.node_env).

The watcher reads /proc of this machine: it would also count a job of another test running at the
same moment (that only delays the stop; these tests run under the heavy-test lock)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gpucluster.errors import SpecError
from gpucluster.infra.aws import user_data as boot
from gpucluster.spec import ClusterSpec

# the watcher counts every process of any gpucluster job on the machine (as on a node): other tests'
# jobs would hold it off, so these run alone (`make test`'s second step)
pytestmark = [pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc"),
              pytest.mark.alone]
SCALE = 2.0  # seconds per "minute"


class Node:
    """A sandbox root with what the user data writes, `shutdown` and `systemctl` stubbed."""

    def __init__(self, root: Path, minutes: int):
        self.root = root
        doc = yaml.safe_load(boot.render_user_data(cluster="demo", expected_gpus=1, max_lifetime_minutes=240,
                                                   idle_minutes=minutes))
        self.runcmd = doc["runcmd"]
        for f in doc["write_files"]:
            target = root / f["path"].lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(f["content"])
        self.unit = (root / "etc/systemd/system" / boot.IDLE_UNIT).read_text()
        stubs = root / "stubs"
        stubs.mkdir()
        (stubs / "shutdown").write_text(f'#!/bin/sh\necho "$(date +%s.%N) $*" >> {root}/shutdown.log\n')
        (stubs / "shutdown").chmod(0o755)
        self.env = dict(os.environ, PATH=f"{stubs}:/usr/bin:/bin", GPUCLUSTER_STATE_DIR=str(root / "state"),
                        GPUCLUSTER_IDLE_SCALE=str(SCALE))
        self.proc: subprocess.Popen | None = None

    def start(self, poll: float = 0.1) -> float:
        """The unit's own ExecStart (the program's path inside the sandbox), polling faster."""
        line = next(ln for ln in self.unit.splitlines() if ln.startswith("ExecStart="))
        argv = shlex.split(line[len("ExecStart="):])
        argv[1] = str(self.root / argv[1].lstrip("/"))
        self.proc = subprocess.Popen([sys.executable if argv[0] == "/usr/bin/python3" and not Path(argv[0]).exists()
                                      else argv[0], *argv[1:], "--poll", str(poll)], env=self.env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return time.time()

    def stopped_at(self, timeout: float) -> float | None:
        log = self.root / "shutdown.log"
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if log.exists() and log.read_text().strip():
                return float(log.read_text().split()[0])
            time.sleep(0.05)
        return None

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def state(self) -> dict:
        return json.loads((self.root / "state" / "idle.json").read_text())


@pytest.fixture
def node(tmp_path):
    made: list[Node] = []

    def make(minutes: int = 2) -> Node:
        n = Node(tmp_path / f"node{len(made)}", minutes)
        made.append(n)
        return n

    yield make
    for n in made:
        n.kill()


def _job(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"],
                            env=dict(os.environ, GPUCLUSTER_RUN_ID="r20261126-000000-1d1e00"))


def test_the_user_data_installs_and_starts_the_watcher_only_when_asked(node):
    n = node(30)
    assert ["systemctl", "enable", "--now", "--no-block", boot.IDLE_UNIT] in n.runcmd
    assert "--minutes 30 --ssh-sessions" in n.unit and "Restart=always" in n.unit
    assert (n.root / boot.IDLE_SCRIPT_PATH.lstrip("/")).read_text() == boot.IDLE_SCRIPT
    plain = boot.render_user_data(cluster="demo", expected_gpus=1, max_lifetime_minutes=240)
    assert boot.IDLE_UNIT not in plain and "gpucluster-idle" not in plain


def test_no_job_powers_the_node_off_after_the_idle_time(node):
    n = node(2)
    t0 = n.start()
    at = n.stopped_at(timeout=30)
    assert at is not None, n.proc.stdout.read() if n.proc else ""
    assert 2 * SCALE - 0.2 <= at - t0 <= 2 * SCALE + 10.0, at - t0  # late only by the poll and the load
    log = (n.root / "shutdown.log").read_text()
    assert "-P now gpucluster idle stop: no job for 2 minutes" in log
    n.proc.wait(10)
    assert n.proc.returncode == 0


def test_a_running_job_holds_it_off_and_its_end_starts_the_count_again(node):
    n = node(2)
    job = _job(6.0)
    t0 = n.start()
    job.wait()
    ended = time.time()
    at = n.stopped_at(timeout=40)
    assert at is not None
    assert at - t0 > 6.0  # not while the job ran (the idle time alone was 4 s)
    assert 2 * SCALE - 0.3 <= at - ended <= 2 * SCALE + 10.0, at - ended
    state = n.state()
    assert state["minutes"] == 2 and abs(state["deadline"] - state["last_job"] - 2 * SCALE) < 1e-6


def test_a_restarted_watcher_keeps_the_time_of_the_last_job(node):
    """systemd restarts the unit (Restart=always) or the node reboots: the count goes on from idle.json."""
    n = node(3)
    first = n.start()
    time.sleep(2.5)
    n.kill()
    assert n.stopped_at(timeout=0.1) is None
    n.start()
    at = n.stopped_at(timeout=30)
    assert at is not None and 3 * SCALE - 0.3 <= at - first <= 3 * SCALE + 10.0, at - first


def test_idle_minutes_are_checked_by_the_cloud_s_rules():
    from gpucluster.infra.aws import catalog as aws
    from gpucluster.infra.gcp import catalog as gcp

    spec = ClusterSpec(cloud="aws", nodes=2, instance_type="g5.xlarge", region="us-east-1", max_lifetime_minutes=240)
    assert aws.idle_minutes(spec.replace(options=(("idleMinutes", "30"),))) == 30
    for bad in ("0", "241", "ten", "-5"):
        with pytest.raises(SpecError, match=f"idle minutes '{bad}' is not allowed: a whole number of minutes from 1"):
            aws.validate_spec(spec.replace(options=(("idleMinutes", bad),)))
    assert gcp.idle_minutes(ClusterSpec(cloud="gcp", nodes=1, options=(("idleMinutes", "30"),))) == 30  # tests/test_gcp_idle.py


def test_status_says_when_the_idle_stop_is_due(home, capsys, monkeypatch):
    from gpucluster.cli import status
    from gpucluster.ledger.store import Ledger

    monkeypatch.setattr(status, "ended_resources", lambda cloud, rows, lifetime: {})
    led = Ledger.open_default()
    spec = ClusterSpec(cloud="aws", nodes=1, name="idle", instance_type="g5.xlarge", region="us-east-1",
                       options=(("idleMinutes", "30"),))
    now = time.time()
    led.create_run("r20261126-000000-aaaaaa", cloud="aws", cluster="idle", nodes=1, gpus_per_node=1,
                   command=["gpucluster", "up"], spec=spec.to_dict(), now=now - 600)
    led.resource_requested("r20261126-000000-aaaaaa", "instance", "idle-0", now=now - 600)
    led.finish_run("r20261126-000000-aaaaaa", status="succeeded", exit_code=0, teardown="kept", now=now - 540)
    rows = status.cluster_rows(led, now=now)
    assert rows[0]["idle_minutes"] == 30 and abs(rows[0]["idle_stop_in_s"] - 21 * 60) < 1
    assert rows[0]["state"] == "kept, idle stop in 21 min" and "idle_stop_keeps" not in rows[0]  # nothing bills on
    # a job on it (exec) that ended 2 minutes ago starts the count again
    led.create_run("r20261126-000100-bbbbbb", cloud="aws", cluster="idle", nodes=1, gpus_per_node=1,
                   command=["python", "x.py"], spec=spec.to_dict(), now=now - 300)
    led.finish_run("r20261126-000100-bbbbbb", status="succeeded", exit_code=0, teardown="kept", now=now - 120)
    rows = status.cluster_rows(led, now=now)
    assert abs(rows[0]["idle_stop_in_s"] - 28 * 60) < 1 and rows[0]["state"] == "kept, idle stop in 28 min"
