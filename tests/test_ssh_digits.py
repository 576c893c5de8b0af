"""The built-in `digits` workload on 3 ssh hosts, and on 2 through the whole run lifecycle
(real sshd servers on loopback).

Kept apart from test_ssh_sshd.py so that each file stays short: these are the slowest runs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from sshd import (  # noqa: E402
    Recorder, assert_nothing_left, cluster_of, free_port, hosts, make_launcher, remote_dir, skip_unless_usable,  # noqa: F401
)

skip_unless_usable()
pytestmark = [pytest.mark.sshd, pytest.mark.slow]

from gpucluster.launch import JobSpec  # noqa: E402


def test_digits_on_three_hosts(hosts, remote_dir, tmp_path):
    n = 3  # two hosts: the lifecycle test below
    cluster = cluster_of(hosts, n)
    run_id = f"rd-{n}-{os.getpid()}"
    job = JobSpec(run_id, workload="digits", workload_args=("--epochs", "1", "--batch-size", "128"),
                  rdzv_port=free_port(), max_seconds=180, threads_per_proc=1)
    events = Recorder()
    result = make_launcher(hosts, remote_dir).launch(cluster, job, events, tmp_path / "logs")
    assert result.ok, (result.failure, events.lines[-20:])
    assert sorted(result.metrics.finals) == list(range(n))
    assert result.metrics.world_size == n
    # every node contributed one rank (c10d orders the global ranks by address, not node rank)
    assert sorted(rec["node_rank"] for rec in result.metrics.finals.values()) == list(range(n))
    assert result.metrics.accuracy is not None and result.metrics.epochs
    assert_nothing_left(hosts, cluster, run_id, remote_dir)


def test_digits_through_the_run_lifecycle_records_a_verified_teardown(hosts, remote_dir, tmp_path, monkeypatch):
    """The whole `run` cycle with the ssh provider and launcher: ledger row, phases, node
    results, the run's processes recorded as resources and confirmed gone by the leftover check."""
    from gpucluster.infra.ssh.provider import SshProvider
    from gpucluster.ledger import Ledger
    from gpucluster.lifecycle import execute
    from gpucluster.spec import ClusterSpec, validate

    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path / "home"))
    spec = ClusterSpec(cloud="ssh", nodes=2, name="loopback", hosts=tuple(hosts.hosts[:2]))
    validate(spec)
    job = JobSpec(f"rl-{os.getpid()}", workload="digits", workload_args=("--epochs", "1", "--batch-size", "128"),
                  rdzv_port=free_port(), max_seconds=180, threads_per_proc=1)
    ledger = Ledger(tmp_path / "ledger.db")
    launcher = make_launcher(hosts, remote_dir)
    provider = SshProvider(launcher=launcher)  # how the backend registry pairs them
    outcome = execute(spec, job, ledger=ledger, provider=provider, launcher=launcher, log_dir=tmp_path / "logs")
    assert launcher.started_ranks(job.run_id) == {0, 1}

    assert outcome.status == "succeeded", outcome.failure
    assert outcome.teardown == "verified" and outcome.leftovers == []
    run = ledger.get_run(job.run_id)
    assert [p["name"] for p in run["phases"]] == ["prepare", "provision", "ready", "rendezvous", "train", "outputs",
                                                 "teardown"]
    assert [(n["node_rank"], n["host"], n["exit_code"]) for n in run["node_results"]] == [
        (0, hosts.hosts[0], 0), (1, hosts.hosts[1], 0)]
    assert [(r["kind"], r["confirmed_gone"]) for r in run["resources"] if r["kind"] == "process"] == [
        ("process", True), ("process", True)]
    # where the run reached each host (for `down` after a crash), closed once the host was cleaned
    assert [(r["kind"], r["confirmed_gone"]) for r in run["resources"] if r["kind"] != "process"] == [
        ("ssh-run", True), ("ssh-run", True)]
    assert ledger.open_resources("loopback") == []
    assert_nothing_left(hosts, cluster_of(hosts, 2), job.run_id, remote_dir)
