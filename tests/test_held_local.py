"""A kept local cluster (issue 46 item 8): `gpucluster.up(cloud="local")` -> `Cluster.exec(...)` twice ->
`Cluster.down()` through the Python API, with real torchrun agents. Each job's processes are checked
after it (the local launcher's `leftovers`) and their ledger rows closed; the cluster stays kept
between jobs, and `down` is verified with nothing of any run left. One small job (a print) each."""

from __future__ import annotations

import sys

import pytest

from conftest import needs_torch

pytestmark = [needs_torch, pytest.mark.slow]

SAY = [sys.executable, "-c", "print('hello from', __import__('os').environ['RANK'])"]


def test_exec_twice_on_a_kept_local_cluster_then_down(home):
    import gpucluster
    from gpucluster.ledger.store import Ledger

    cluster = gpucluster.up(cloud="local", nodes=2, name="bench", python=sys.executable)
    records = [cluster.exec(SAY), cluster.exec(SAY)]
    ledger = Ledger.open_default()
    for rec in records:
        run = ledger.get_run(rec.id)
        assert run.run.status == "succeeded" and run.run.teardown == "kept", run.run.failure
        assert run.resources and all(r.confirmed_gone for r in run.resources if r.kind == "process")
        assert not (home / "runs" / rec.id / "nodes").exists()  # the node folders went with the job
    assert cluster.status()["up"] is True
    result = cluster.down()
    assert result.verdict["verdict"] == "verified" and result.exit_code == 0, result.verdict
    assert ledger.open_resources() == []
