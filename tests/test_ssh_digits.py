"""The built-in `digits` workload on 3 ssh hosts through the whole run lifecycle (real sshd
servers on loopback).

Kept apart from test_ssh_sshd.py so that each file stays short: these are the slowest runs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from sshd import (  # noqa: E402
    assert_nothing_left, cluster_of, free_port, hosts, make_launcher, remote_dir, skip_unless_usable,  # noqa: F401
)

skip_unless_usable()
pytestmark = [pytest.mark.sshd, pytest.mark.slow]

from gpucluster.infra.registry import plugin as backend_of  # noqa: E402
from gpucluster.watch.launch import JobSpec  # noqa: E402


def test_digits_on_three_hosts_through_the_run_lifecycle_records_a_verified_teardown(hosts, remote_dir, tmp_path,
                                                                                     monkeypatch):
    """The whole `run` cycle with the ssh provider and launcher on 3 hosts: every node contributes
    one rank, the ledger row, phases and node results, the run's processes recorded as resources
    and confirmed gone by the leftover check."""
    from gpucluster.infra.ssh.provider import SshProvider
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.steps import execute
    from gpucluster.spec import ClusterSpec
    from specs import validate

    n = 3
    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path / "home"))
    spec = ClusterSpec(cloud="ssh", nodes=n, name="loopback", hosts=tuple(hosts.hosts[:n]))
    validate(spec)
    job = JobSpec(f"rl-{os.getpid()}", workload="digits", workload_args=("--epochs", "1", "--batch-size", "128"),
                  rdzv_port=free_port(), max_seconds=180, threads_per_proc=1)
    ledger = Ledger(tmp_path / "ledger.db")
    launcher = make_launcher(hosts, remote_dir)
    provider = SshProvider(launcher=launcher)  # how the backend registry pairs them
    outcome = execute(spec, job, backend=backend_of(spec.cloud),
                      ledger=ledger, provider=provider, launcher=launcher, log_dir=tmp_path / "logs")
    assert launcher.started_ranks(job.run_id) == set(range(n))

    assert outcome.status == "succeeded", outcome.failure
    assert outcome.teardown == "verified" and outcome.leftovers == []
    run = ledger.get_run(job.run_id, with_metrics=True).to_dict()
    finals = [m for m in run["metric_records"] if m["kind"] == "final"]
    assert sorted(m["rank"] for m in finals) == list(range(n))
    # every node contributed one rank (c10d orders the global ranks by address, not node rank)
    assert sorted(m["node_rank"] for m in finals) == list(range(n))
    assert run["metrics"]["world_size"] == n and run["metrics"]["accuracy"] is not None
    assert [p["name"] for p in run["phases"]] == ["prepare", "provision", "ready", "rendezvous", "train", "outputs",
                                                 "teardown"]
    assert [(r["node_rank"], r["host"], r["exit_code"]) for r in run["node_results"]] == [
        (i, hosts.hosts[i], 0) for i in range(n)]
    assert [(r["kind"], r["confirmed_gone"]) for r in run["resources"] if r["kind"] == "process"] == [
        ("process", True)] * n
    # where the run reached each host (for `down` after a crash), closed once the host was cleaned
    assert [(r["kind"], r["confirmed_gone"]) for r in run["resources"] if r["kind"] != "process"] == [
        ("ssh-run", True)] * n
    assert ledger.open_resources("loopback") == []
    assert_nothing_left(hosts, cluster_of(hosts, n), job.run_id, remote_dir)
