"""Outputs come back over ssh (issue 14 item 1), against real sshd servers on loopback: every
node's `outputs/` folder (GPUCLUSTER_OUTPUT_DIR, in the job's working folder on the node) is
streamed back over the run's own ControlMaster connection before the run folder is removed,
whatever ended the run; a copy that is not complete is named by node and fails the run; nothing is
left on the nodes either way."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from sshd import (  # noqa: E402
    assert_nothing_left, free_port, hosts, make_launcher, remote_dir, skip_unless_usable,  # noqa: F401
)

skip_unless_usable()
pytestmark = [pytest.mark.sshd, pytest.mark.slow]

from gpucluster.infra.registry import plugin as backend_of  # noqa: E402
from gpucluster.infra.ssh.provider import SshProvider  # noqa: E402
from gpucluster.watch.launch import JobSpec, Launcher  # noqa: E402
from gpucluster.ledger.store import Ledger  # noqa: E402
from gpucluster.lifecycle.steps import execute  # noqa: E402
from gpucluster.spec import ClusterSpec  # noqa: E402
from specs import validate  # noqa: E402
from outputs_check import saved, sha, writer  # noqa: E402

_COUNT = itertools.count()
SCRIPT = Path(__file__).parent / "fixtures" / "output_train.py"


class SignalAt(Launcher):
    """The real launcher; SIGINT to this process once a node prints a line containing `marker`."""

    collects_outputs = True

    def __init__(self, inner, marker):
        self.inner, self.marker, self.sent = inner, marker, False

    def launch(self, cluster, job, events, log_dir):
        outer = self

        class Events:
            def __getattr__(self, name):
                return getattr(events, name)

            def on_line(self, node_rank, line):
                events.on_line(node_rank, line)
                if outer.marker in line and not outer.sent:
                    outer.sent = True
                    outer.strike()

        return self.inner.launch(cluster, job, Events(), log_dir)

    def strike(self):
        os.kill(os.getpid(), signal.SIGINT)

    def collect_outputs(self, job, events):
        return self.inner.collect_outputs(job, events)


def run_script(hosts, remote_dir, tmp_path, monkeypatch, *, env=(), launcher=None, n=2, output_dir=None):
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(SCRIPT, project / "train.py")
    monkeypatch.chdir(project)
    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path / "home"))
    spec = ClusterSpec(cloud="ssh", nodes=n, name="loopback", hosts=tuple(hosts.hosts[:n]))
    validate(spec)
    job = JobSpec(f"ro-{os.getpid()}-{next(_COUNT)}", command=("python", "train.py"),
                  rdzv_port=free_port(), max_seconds=180, threads_per_proc=1, env=tuple(env), output_dir=output_dir)
    ledger = Ledger(tmp_path / "ledger.db")
    inner = make_launcher(hosts, remote_dir)
    launcher = launcher(inner) if launcher else inner
    provider = SshProvider(launcher=inner)
    outcome = execute(spec, job, backend=backend_of(spec.cloud),
                      ledger=ledger, provider=provider, launcher=launcher, log_dir=tmp_path / "logs")
    return outcome, ledger.get_run(job.run_id).to_dict(), job


def nothing_left(hosts, remote_dir, run_id, n=2):
    from gpucluster.domain import NullEvents

    spec = ClusterSpec(cloud="ssh", nodes=n, name="loopback", hosts=tuple(hosts.hosts[:n]))
    assert_nothing_left(hosts, SshProvider().up(spec, NullEvents()), run_id, remote_dir)


def test_model_and_every_nodes_files_come_back(hosts, remote_dir, tmp_path, monkeypatch):
    outcome, run, job = run_script(hosts, remote_dir, tmp_path, monkeypatch, env=[("STEPS", "20")])
    assert outcome.status == "succeeded", outcome.failure
    dest = tmp_path / "home" / "runs" / job.run_id / "outputs"
    w, log = writer(tmp_path / "logs")
    assert sha(dest / f"node-{w}" / "model.pt") == saved(log, "model.pt")[-1]
    assert sha(dest / f"node-{w}" / "checkpoint.pt") == saved(log, "checkpoint.pt")[-1]
    assert sorted(p.parent.parent.name for p in dest.glob("node-*/logs/rank-*.txt")) == ["node-0", "node-1"]
    assert [(o["node_rank"], o["verdict"]) for o in run["outputs"]] == [(0, "complete"), (1, "complete")]
    assert run["outputs"][w]["files"] == 3 and run["outputs"][w]["bytes"] == sum(
        p.stat().st_size for p in (dest / f"node-{w}").rglob("*") if p.is_file())
    phases = [p["name"] for p in run["phases"]]
    assert phases[-2:] == ["outputs", "teardown"]
    # the run folder (and with it the node's outputs/) is gone once copied; so are the connections
    nothing_left(hosts, remote_dir, job.run_id)


def test_ctrl_c_mid_training_brings_the_last_checkpoint_back(hosts, remote_dir, tmp_path, monkeypatch):
    out = tmp_path / "results"
    outcome, run, job = run_script(hosts, remote_dir, tmp_path, monkeypatch, env=[("STEPS", "100000")],
                                      launcher=lambda inner: SignalAt(inner, "SAVED checkpoint.pt"),
                                      output_dir=str(out))
    assert outcome.status == "interrupted" and outcome.teardown == "verified", outcome.failure
    w, log = writer(tmp_path / "logs")
    assert sha(out / f"node-{w}" / "checkpoint.pt") == saved(log, "checkpoint.pt")[-1]
    assert not (out / f"node-{w}" / "model.pt").exists()  # training never finished
    assert [o["verdict"] for o in run["outputs"]] == ["complete", "complete"]
    nothing_left(hosts, remote_dir, job.run_id)


def test_crashed_rank_outputs_still_come_back(hosts, remote_dir, tmp_path, monkeypatch):
    outcome, run, job = run_script(hosts, remote_dir, tmp_path, monkeypatch,
                                      env=[("CRASH_RANK", "1"), ("CRASH_STEP", "15")])
    assert outcome.status == "failed" and "outputs" not in outcome.failure, outcome.failure
    dest = tmp_path / "home" / "runs" / job.run_id / "outputs"
    w, log = writer(tmp_path / "logs")
    assert sha(dest / f"node-{w}" / "checkpoint.pt") == saved(log, "checkpoint.pt")[-1]
    assert [o["verdict"] for o in run["outputs"]] == ["complete", "complete"]
    nothing_left(hosts, remote_dir, job.run_id)


def test_refused_link_makes_a_partial_copy_and_a_failed_run(hosts, remote_dir, tmp_path, monkeypatch):
    outcome, run, job = run_script(hosts, remote_dir, tmp_path, monkeypatch,
                                      env=[("STEPS", "10"), ("OUTPUT_TRICK", "symlink")])
    assert outcome.status == "failed" and outcome.teardown == "verified"
    w, _ = writer(tmp_path / "logs")
    assert outcome.failure.startswith(f"outputs of node {w} partial: "), outcome.failure
    assert "passwd-link" in outcome.failure and "links and devices are not copied" in outcome.failure
    dest = tmp_path / "home" / "runs" / job.run_id / "outputs" / f"node-{w}"
    assert (dest / "model.pt").is_file() and not os.path.lexists(dest / "passwd-link")
    assert [o["verdict"] for o in run["outputs"]][w] == "partial"
    assert [o["verdict"] for o in run["outputs"]][1 - w] == "complete"
    nothing_left(hosts, remote_dir, job.run_id)


def test_broken_stream_is_partial_or_failed_by_node(hosts, remote_dir, tmp_path, monkeypatch):
    """The copy of one node stops mid-stream (a `tar` on the node whose archive is cut short and
    that exits 2, as when the connection drops): named by node, the run fails, teardown runs."""
    fake = hosts.bin_dir / "tar"
    real = shutil.which("tar")
    # only the writer's copy (its output folder holds model.pt) is cut; shipping the job is untouched
    fake.write_text(f'#!/bin/sh\nif [ "$1" = "-cf" ] && [ -e model.pt ]; then\n'
                    f'  {real} "$@" | head -c 30000; exit 2\nfi\nexec {real} "$@"\n')
    fake.chmod(0o755)
    try:
        outcome, run, job = run_script(hosts, remote_dir, tmp_path, monkeypatch, env=[("STEPS", "10")])
    finally:
        fake.unlink()
    assert outcome.status == "failed" and outcome.teardown == "verified"
    w, _ = writer(tmp_path / "logs")
    assert re.match(rf"outputs of node {w} (partial|failed): ", outcome.failure), outcome.failure
    assert "tar on the node exited with code 2" in outcome.failure and "the copy stopped after" in outcome.failure
    assert run["outputs"][w]["verdict"] in ("partial", "failed") and run["outputs"][1 - w]["verdict"] == "complete"
    nothing_left(hosts, remote_dir, job.run_id)


class RefuseLoginsAt(SignalAt):
    """The real launcher; once a node prints `marker`, every node stops taking new ssh connections
    (its sshd listener exits; the sessions already open live on, as sshd's per-connection processes
    are in sessions of their own). Stricter than what a scheduled `shutdown` does in its last 5
    minutes: it writes /run/nologin, and sshd then refuses every non-root login (shutdown(8);
    sshd(8), "If /etc/nologin exists..."; on systemd, /run/nologin is what pam_nologin reads)."""

    def __init__(self, inner, marker, servers):
        super().__init__(inner, marker)
        self.servers = servers

    def strike(self):
        for proc in self.servers.procs:
            proc.terminate()
            proc.wait(timeout=10)


def test_outputs_come_back_when_the_nodes_take_no_new_logins(remote_dir, tmp_path, monkeypatch):
    """issue 25: the dead-man switch's `shutdown` refuses new logins in its last 5 minutes. The outputs
    copy (and the cleanup after it) must not need one: they run over the connection opened when the
    nodes became ready (ControlMaster), so they come back complete although no node answers a new
    connection any more."""
    import socket
    import subprocess

    from sshd import SshdHosts

    servers = SshdHosts.start(tmp_path / "sshd-nologin", 2)
    try:
        outcome, run, job = run_script(servers, remote_dir, tmp_path, monkeypatch, env=[("STEPS", "40")],
                                       launcher=lambda inner: RefuseLoginsAt(inner, "SAVED checkpoint.pt", servers))
        # the nodes really took no new connection after the marker
        for address, port in zip(servers.addresses, servers.ports):
            with pytest.raises(OSError):
                socket.create_connection((address, port), timeout=2).close()
        fresh = subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", "ControlMaster=no", "-o", "ControlPath=none",
                                "-o", f"UserKnownHostsFile={servers.known_hosts}", "-i", str(servers.identity),
                                "-p", str(servers.ports[0]), f"{servers.user}@{servers.addresses[0]}", "true"],
                               capture_output=True, text=True, timeout=30)
        assert fresh.returncode == 255, fresh
        assert outcome.status == "succeeded", outcome.failure
        dest = tmp_path / "home" / "runs" / job.run_id / "outputs"
        w, log = writer(tmp_path / "logs")
        assert sha(dest / f"node-{w}" / "model.pt") == saved(log, "model.pt")[-1]
        assert [(o["node_rank"], o["verdict"]) for o in run["outputs"]] == [(0, "complete"), (1, "complete")]
        assert not list(remote_dir.glob(f"*{job.run_id}*"))  # the cleanup reached the nodes too
    finally:
        servers.stop()
