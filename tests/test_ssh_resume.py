"""`--resume` over the ssh launcher (the one aws uses), against real sshd servers on loopback
(tests/sshd.py): the resumed run's outputs folder is staged to every node through the data cache as
GPUCLUSTER_RESUME_DIR (`resume/` in the job's folder), every rank of the digits workload loads the
checkpoint from it and training goes on after the epoch saved; the new checkpoint comes back."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import needs_torch  # noqa: E402
from sshd import assert_nothing_left, free_port, hosts, make_launcher, remote_dir, skip_unless_usable  # noqa: E402,F401

skip_unless_usable()
pytestmark = [pytest.mark.sshd, pytest.mark.slow]

from gpucluster.infra.registry import plugin as backend_of  # noqa: E402
from gpucluster.domain import NullEvents  # noqa: E402
from gpucluster.infra.ssh.provider import SshProvider  # noqa: E402
from gpucluster.watch.launch import JobSpec  # noqa: E402
from gpucluster.ledger.store import Ledger  # noqa: E402
from gpucluster.lifecycle.steps import execute  # noqa: E402
from gpucluster.spec import ClusterSpec  # noqa: E402
from specs import validate  # noqa: E402
from gpucluster.watch.staging import RESUME_DEST, DataMount  # noqa: E402


@needs_torch
def test_resume_folder_is_staged_to_every_node_and_training_goes_on(hosts, remote_dir, tmp_path, monkeypatch):
    import torch

    from gpucluster.workloads import digits

    prev = tmp_path / "prev-outputs"  # what an earlier run's outputs phase brought back
    monkeypatch.setenv("GPUCLUSTER_OUTPUT_DIR", str(prev / "node-0"))
    digits.main(["--epochs", "2"])
    monkeypatch.delenv("GPUCLUSTER_OUTPUT_DIR")
    (prev / "node-1").mkdir()
    (prev / "node-1" / "notes.txt").write_text("node 1 saved this")
    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path / "home"))

    spec = ClusterSpec(cloud="ssh", nodes=2, name="loopback", hosts=tuple(hosts.hosts[:2]))
    validate(spec)
    job = JobSpec(f"rs-{os.getpid()}", workload="digits", workload_args=("--epochs", "3"), rdzv_port=free_port(),
                  max_seconds=180, threads_per_proc=1, resume=DataMount(str(prev), RESUME_DEST))
    ledger = Ledger(tmp_path / "ledger.db")
    launcher = make_launcher(hosts, remote_dir, data_cache=str(tmp_path / "cache"))
    outcome = execute(spec, job, backend=backend_of(spec.cloud),
                      ledger=ledger, provider=SshProvider(launcher=launcher), launcher=launcher,
                      log_dir=tmp_path / "logs", resumed_from="r-earlier")
    run = ledger.get_run(job.run_id).to_dict()
    assert outcome.status == "succeeded", (outcome.failure, run["node_results"])
    assert "stage" in [p["name"] for p in run["phases"]]
    staged = {r["node_rank"]: r for r in run["staging"]}
    files = sum(1 for f in prev.rglob("*") if f.is_file())  # the checkpoint (and where it is), node 1's note
    assert sorted(staged) == [0, 1] and all(r["files"] == files for r in staged.values()), staged  # the whole folder, each node
    assert [r["epoch"] for r in ledger.metrics(job.run_id, "epoch")] == [3]  # epochs 1-2 not trained again
    start = ledger.metrics(job.run_id, "start")[0]
    assert start["resumed_from_epoch"] == 2
    assert start["resumed_from"].startswith(str(remote_dir)) and start["resumed_from"].endswith(
        f"/{RESUME_DEST}/node-0/checkpoint.pt")  # the staged copy on the node, not this machine's folder
    back = tmp_path / "home" / "runs" / job.run_id / "outputs" / "node-0" / "checkpoint.pt"
    assert torch.load(back, map_location="cpu", weights_only=True)["epoch"] == 3
    assert run["resumed_from"] == "r-earlier"
    assert_nothing_left(hosts, SshProvider().up(spec, NullEvents()), job.run_id, remote_dir)
