"""The built-in `digits` workload on 2 and 3 ssh hosts (real sshd servers on loopback).

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


@pytest.mark.parametrize("n", [2, 3])
def test_digits_workload_across_hosts(hosts, remote_dir, tmp_path, n):
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
