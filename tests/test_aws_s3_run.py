"""`run --cloud aws` with `--data s3://...` and `--output s3://...`, end to end on the EC2-like nodes
of tests/test_cloud_run.py (loopback sshd "instances" booted from what the real program declared,
the real Automation API driver on the fake Pulumi CLI) and a real S3 API: moto's server mode on
loopback (tests/moto_s3.py). The nodes reach it as EC2 nodes reach S3: their sessions carry the
standard endpoint variable AWS_ENDPOINT_URL_S3 and credentials in the environment, standing in
for the instance role's credentials (which the SDKs read from IMDS on EC2; moto enforces no IAM,
so the scoping is asserted on the declared policy here and in tests/test_aws_s3.py).

The tool on the node: the launcher is given `NodeTransfer(tool="boto3")`, so the node program
runs boto3 under the DLAMI Python (/opt/pytorch/bin/python = this test's interpreter, which has
boto3): the boto3 path is the one exercised here, asserted from the `tool` of the stage records.
It is forced because the nodes' ssh sessions run root's ~/.bashrc on this machine, which puts
pyenv's shims, a real AWS CLI v1 among them, on their PATH; with the default "auto" the same run
went through `aws s3 sync`/`aws s3 cp` (seen once by hand, 2026-11-23). The AWS CLI path is tested
against the same server in tests/test_aws_s3.py where this machine has an `aws`.
"""

from __future__ import annotations

from gpucluster.infra.registry import plugin as backend_of
from gpucluster.infra.registry import plugin as _plugin

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import sshd  # noqa: E402
from moto_s3 import s3_server  # noqa: E402,F401
from test_cloud_run import _launcher, _provider_and_fake, checkip, dlami_python, ec2  # noqa: E402,F401

pytestmark = [pytest.mark.slow, pytest.mark.sshd]

# Checks the staged folder on every rank against CHECK_MANIFEST (relative path -> sha256), then
# writes rank-R.txt on every rank and, on rank 0, model.pt: 128 KiB derived from the manifest; then, in
# its working folder, ckpt/rank-R.bin on every rank and snapshot.pt on rank 0.
SCRIPT = r'''
import hashlib, json, os, sys
data, want, rank = os.environ["GPUCLUSTER_DATA"], json.loads(os.environ["CHECK_MANIFEST"]), os.environ["RANK"]
found = {}
for root, _dirs, files in os.walk(data):
    for name in files:
        full = os.path.join(root, name)
        found[os.path.relpath(full, data)] = hashlib.sha256(open(full, "rb").read()).hexdigest()
if found != want:
    sys.exit("rank %s: data mismatch: %r" % (rank, sorted(set(found.items()) ^ set(want.items()))[:3]))
print("rank %s: data ok: %d files" % (rank, len(found)), flush=True)
out = os.environ["GPUCLUSTER_OUTPUT_DIR"]
open(os.path.join(out, "rank-%s.txt" % rank), "w").write("rank %s done\n" % rank)
if rank == "0":
    open(os.path.join(out, "model.pt"), "wb").write(hashlib.sha256(json.dumps(want, sort_keys=True).encode()).digest() * 4096)
# and, as most scripts do, files saved relative to its working folder (issue 28 item 1)
os.makedirs("ckpt", exist_ok=True)
open(os.path.join("ckpt", "rank-%s.bin" % rank), "wb").write(hashlib.sha256(rank.encode()).digest() * 300)
if rank == "0":
    open("snapshot.pt", "wb").write(b"epoch 1\n" * 1000)
'''


def _model_sha(want: dict[str, str]) -> str:
    return hashlib.sha256(hashlib.sha256(json.dumps(want, sort_keys=True).encode()).digest() * 4096).hexdigest()


def _dataset(root: Path) -> Path:
    ds = root / "dataset"
    (ds / "shards").mkdir(parents=True)
    for i in range(6):
        (ds / "shards" / f"part-{i:02d}.bin").write_bytes(os.urandom(100_000))
    (ds / "labels.txt").write_text("0 1 2\n")
    return ds


def _run(home, tmp_path, ec2, s3_server, monkeypatch, output_url: str):
    from gpucluster.infra.aws.s3 import NodeTransfer
    from gpucluster.infra.registry import plugin
    from gpucluster.watch.launch import JobSpec
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.steps import execute
    from gpucluster.watch.outputs import check_output_dest
    from gpucluster.spec import ClusterSpec, new_run_id
    from specs import validate
    from gpucluster.watch.staging import parse_data

    c = s3_server.client()
    c.create_bucket(Bucket="data-bkt")
    want = s3_server.put_tree("data-bkt", "train/v1", _dataset(tmp_path))
    project = tmp_path / "project"
    project.mkdir()
    (project / "check_s3.py").write_text(SCRIPT)
    monkeypatch.chdir(project)
    ec2.node_env = s3_server.env

    aws = plugin("aws")
    mounts = parse_data(["s3://data-bkt/train/v1:inputs"], aws)  # as `run --data` parses it
    output = check_output_dest(output_url, aws)
    provider, fake, found = _provider_and_fake(ec2)
    launcher = _launcher(tmp_path, ready_timeout=90)
    launcher.objects = NodeTransfer(tool="boto3")  # see the module docstring
    run_id = new_run_id()
    spec = ClusterSpec(cloud="aws", nodes=2, name="e2e", region="us-east-1", instance_type="g5.xlarge", run_id=run_id)
    spec = aws.with_object_access(spec, [m.src for m in mounts], [output])
    validate(spec)
    spec, _ = provider.plugin.spec.prepare(spec)
    job = JobSpec(run_id=run_id, command=("python", "check_s3.py"), nproc_per_node=1, threads_per_proc=1,
                  env=(("CHECK_MANIFEST", json.dumps(want)),), data=mounts, output_dir=str(output), max_seconds=240,
                  rdzv_port=sshd.free_port())
    ledger = Ledger(home / "ledger.sqlite3")
    outcome = execute(spec, job, backend=backend_of(spec.cloud), ledger=ledger, provider=provider, launcher=launcher)
    return outcome, ledger.get_run(run_id).to_dict(), want, found


def test_s3_data_on_every_rank_and_outputs_uploaded_by_each_node(home, tmp_path, ec2, checkip, dlami_python,
                                                                  s3_server, monkeypatch):
    s3_server.client().create_bucket(Bucket="out-bkt")
    outcome, run, want, found = _run(home, tmp_path, ec2, s3_server, monkeypatch, "s3://out-bkt/runs")
    lines = [ln for n in run["node_results"] for ln in n["last_lines"]]
    assert ec2.errors == []
    assert outcome.status == "succeeded", (run["failure"], lines[-10:])
    assert sum("data ok: 7 files" in ln for ln in lines) == 2, lines  # the sha256 check on every rank
    phases = [p["name"] for p in run["phases"]]
    assert phases.index("ready") < phases.index("stage") < phases.index("train") < phases.index("outputs") \
        < phases.index("teardown")
    staged = run["staging"]
    total = 6 * 100_000 + len("0 1 2\n")
    assert len(staged) == 2 and all(r["files"] == 7 and r["bytes"] == total and r["fetched_bytes"] == total
                                    and r["tool"] == "boto3" and r["sent_bytes"] == 0 for r in staged), staged
    rid = run["id"]
    assert s3_server.keys("out-bkt") == [f"runs/{rid}/node-0/model.pt", f"runs/{rid}/node-0/rank-0.txt",
                                         f"runs/{rid}/node-1/rank-1.txt",
                                         # what the script saved in its working folder (issue 28 item 1)
                                         f"runs/{rid}/workdir/node-0/ckpt/rank-0.bin",
                                         f"runs/{rid}/workdir/node-0/snapshot.pt",
                                         f"runs/{rid}/workdir/node-1/ckpt/rank-1.bin"]
    assert s3_server.sha256("out-bkt", f"runs/{rid}/node-0/model.pt") == _model_sha(want)
    for r in ("0", "1"):
        assert s3_server.sha256("out-bkt", f"runs/{rid}/workdir/node-{r}/ckpt/rank-{r}.bin") == hashlib.sha256(
            hashlib.sha256(r.encode()).digest() * 300).hexdigest()
    assert s3_server.sha256("out-bkt", f"runs/{rid}/workdir/node-0/snapshot.pt") == hashlib.sha256(
        b"epoch 1\n" * 1000).hexdigest()
    outs = {o["node_rank"]: o for o in run["outputs"]}
    assert [outs[r]["verdict"] for r in (0, 1)] == ["complete", "complete"], run["failure"]
    assert [outs[r]["workdir_files"] for r in (0, 1)] == [2, 1]
    assert outs[0]["workdir_bytes"] == 32 * 300 + 8000 and outs[1]["workdir_bytes"] == 32 * 300
    assert outs[0]["path"] == f"s3://out-bkt/runs/{rid}/node-0" and outs[0]["files"] == 2
    assert outs[0]["bytes"] == 32 * 4096 + len("rank 0 done\n") and outs[1]["files"] == 1
    # what the component was asked to grant for this run (recorded in the ledger's spec)
    assert run["spec"]["reads"] == ["s3://data-bkt/train/v1"] and run["spec"]["writes"] == ["s3://out-bkt/runs"]
    assert run["teardown"] == "verified" and set(found) == {"e2e"}
    assert sshd.run_processes(rid) == {} and sshd.leaked_ssh_masters() == []


def test_a_failed_upload_is_reported_by_node_fails_the_run_and_teardown_still_runs(
        home, tmp_path, ec2, checkip, dlami_python, s3_server, monkeypatch):
    # the output bucket does not exist: every PutObject answers NoSuchBucket
    outcome, run, _want, found = _run(home, tmp_path, ec2, s3_server, monkeypatch, "s3://missing-out-bkt/runs")
    assert outcome.status == "failed", run["failure"]
    assert [n["exit_code"] for n in run["node_results"]] == [0, 0]  # training itself succeeded
    outs = {o["node_rank"]: o for o in run["outputs"]}
    assert [outs[r]["verdict"] for r in (0, 1)] == ["failed", "failed"]
    for rank in (0, 1):
        assert outs[rank]["detail"].startswith(f"node {rank} (") and "NoSuchBucket" in outs[rank]["detail"]
        # the working folder's upload failed too, and says so (nothing is counted as uploaded)
        assert "working folder: node" in outs[rank]["detail"] and outs[rank]["workdir_files"] == 0
    assert run["failure"].startswith("outputs of node 0 failed: node 0 ("), run["failure"]
    assert [p["status"] for p in run["phases"] if p["name"] == "outputs"] == ["failed"]
    assert run["teardown"] == "verified" and set(found) == {"e2e"}
    assert sshd.run_processes(run["id"]) == {}
    assert "missing-out-bkt" not in str(s3_server.client().list_buckets()["Buckets"])

