"""Shell completion (Click's, as bash asks for it): command names, run ids and cluster names from the
ledger, read-only (no ledger: nothing offered, nothing created)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpucluster.ledger.store import Ledger

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def complete(home, words: str) -> list[str]:
    parts = words.split(" ")
    env = dict(os.environ, GPUCLUSTER_HOME=str(home), _GPUCLUSTER_COMPLETE="bash_complete",
               COMP_WORDS=words, COMP_CWORD=str(len(parts) - 1))
    out = subprocess.run([sys.executable, "-m", "gpucluster.cli.main", *parts[1:]], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    return [line.split(",", 1)[1] for line in out.stdout.splitlines() if "," in line]


def test_run_ids_and_cluster_names_are_completed_from_the_ledger(home):
    led = Ledger.open_default()
    for rid, cluster in (("r20261126-000001-aaaaaa", "vision"), ("r20261126-000002-bbbbbb", "nlp"),
                         ("r20261125-000003-cccccc", "vision")):
        led.create_run(rid, cloud="local", cluster=cluster, nodes=1, gpus_per_node=0, command=["x"], spec={})
    led.resource_requested("r20261126-000002-bbbbbb", "instance", "nlp-0")  # nlp may still exist
    assert sorted(complete(home, "gpucluster logs r20261126")) == ["r20261126-000001-aaaaaa", "r20261126-000002-bbbbbb"]
    assert complete(home, "gpucluster show r20261125") == ["r20261125-000003-cccccc"]
    assert complete(home, "gpucluster down ") == ["nlp", "vision"]  # what may still exist first
    assert complete(home, "gpucluster exec vi") == ["vision"]
    assert complete(home, "gpucluster ssh n") == ["nlp"]
    assert "exec" in complete(home, "gpucluster ex")


def test_no_ledger_offers_nothing_and_creates_nothing(tmp_path):
    home = tmp_path / "fresh"
    assert complete(home, "gpucluster logs r") == []
    assert not home.exists()
