"""`--data s3://...` and `--output s3://...` on aws, piece by piece: URL checks (S3 bucket naming
rules), the IAM policy the component declares (under Pulumi's mock runtime), the node program
against a real S3 API (moto's server mode on loopback, tests/moto_s3.py) through both of its tools,
and `--dry-run` showing the grants. The whole run on EC2-like nodes: tests/test_aws_s3_run.py."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

sys.path.insert(0, str(Path(__file__).parent))
from conftest import run_cli  # noqa: E402
from moto_s3 import s3_server  # noqa: E402,F401

from gpucluster.errors import SpecError, UsageError  # noqa: E402
from gpucluster.infra.aws import s3  # noqa: E402
from gpucluster.infra.aws.s3_node import cli_argv  # noqa: E402
from gpucluster.infra.registry import plugin, readers  # noqa: E402
from gpucluster.spec import ClusterSpec  # noqa: E402
from gpucluster.watch.staging import DataMount, parse_data  # noqa: E402

NODE_PY = Path(s3.__file__).parent / "s3_node.py"


# -- URLs ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("value,mount", [
    ("s3://my-bucket/train/shards", DataMount("s3://my-bucket/train/shards", "data/shards")),
    ("s3://my-bucket/train/shards/", DataMount("s3://my-bucket/train/shards", "data/shards")),
    ("s3://my-bucket", DataMount("s3://my-bucket", "data/my-bucket")),
    ("s3://my-bucket:inputs", DataMount("s3://my-bucket", "inputs")),
    ("s3://my.bucket-1/a/b:in/x", DataMount("s3://my.bucket-1/a/b", "in/x")),
])
def test_s3_sources_parse_with_dest_after_the_last_colon(value, mount):
    got = parse_data([value], plugin("aws"))
    assert got == (mount,) and got[0].remote


@pytest.mark.parametrize("url,needle", [
    ("s3://ab", "3-63"), ("s3://" + "a" * 64, "3-63"), ("s3://My-Bucket", "lowercase"),
    ("s3://under_score", "lowercase"), ("s3://-start", "begin and end"), ("s3://end-", "begin and end"),
    ("s3://a..b", "two adjacent dots"), ("s3://192.168.5.4", "IP address"), ("s3://xn--bucket", "reserved prefix"),
    ("s3://bucket-s3alias", "reserved suffix"), ("s3://", "no bucket name"), ("s3://bucket/a*b", "'*'"),
    ("s3://bucket/${aws:username}", "'$'"), ("s3://bucket/a//b", "empty"), ("s3://bucket/a/../b", "'..'"),
    ("S3://bucket", "s3://BUCKET"),
])
def test_malformed_s3_urls_are_refused_naming_the_rule(url, needle):
    with pytest.raises(UsageError) as exc:
        s3.parse_url(url, f"--output {url!r}")
    assert exc.value.message.startswith(f"--output {url!r} is not allowed") and needle in exc.value.message


@pytest.mark.parametrize("cloud", ["local", "ssh", "gcp"])
def test_s3_is_refused_where_the_backend_declares_no_object_store(cloud):
    with pytest.raises(UsageError) as exc:
        parse_data(["s3://bucket/p"], plugin(cloud), readers())
    assert f"not supported yet with --cloud {cloud}" in exc.value.message and "--cloud aws" in exc.value.message


def test_gs_is_refused_where_gcs_is_not_read_and_dest_overlap_counts_urls():
    for cloud in ("aws", "local"):
        with pytest.raises(UsageError) as exc:
            parse_data(["gs://bucket/p"], plugin(cloud), readers())
        assert "not supported yet" in exc.value.message and "gs:// works with --cloud gcp" in exc.value.message
    with pytest.raises(UsageError) as exc:
        parse_data(["s3://bucket/x:inputs", "s3://other-bucket/y:inputs/z"], plugin("aws"))
    assert "overlaps" in exc.value.message


def test_spec_options_are_checked_for_stack_files_too():
    from specs import normalize

    spec = ClusterSpec(cloud="aws", nodes=1, name="d", region="us-east-1", options=(("s3Read", '["s3://UPPER"]'),))
    with pytest.raises(SpecError, match="lowercase"):
        normalize(spec)
    spec = normalize(spec.replace(options=(("s3_write", "s3://ok-bucket/out"),)))  # one URL, snake_case (CLI)
    assert spec.options == () and spec.writes == ("s3://ok-bucket/out",)
    assert s3.scopes(spec) == ([], ["s3://ok-bucket/out"])
    with pytest.raises(SpecError, match="lowercase"):  # a field set by hand is checked too
        s3.scopes(spec.replace(reads=("s3://UPPER",)))


# -- the policy document -------------------------------------------------------------------------
def _actions(doc):
    return [a for st in doc["Statement"] for a in st["Action"]]


def test_policy_grants_exactly_the_prefixes_and_nothing_wide():
    doc = s3.policy_document(["s3://data-bkt/train", "s3://whole-bkt"], ["s3://out-bkt/runs/exp1"])
    by_sid = {st["Sid"]: st for st in doc["Statement"]}
    assert by_sid["ReadData0"]["Resource"] == ["arn:aws:s3:::data-bkt/train/*"]
    assert by_sid["ListData0"] == {"Sid": "ListData0", "Effect": "Allow", "Action": ["s3:ListBucket"],
                                   "Resource": ["arn:aws:s3:::data-bkt"],
                                   "Condition": {"StringLike": {"s3:prefix": ["train/*"]}}}
    assert by_sid["ReadData1"]["Resource"] == ["arn:aws:s3:::whole-bkt/*"]  # the bucket was asked for
    assert by_sid["WriteOutputs0"]["Action"] == ["s3:PutObject", "s3:AbortMultipartUpload"]
    assert by_sid["WriteOutputs0"]["Resource"] == ["arn:aws:s3:::out-bkt/runs/exp1/*"]
    assert set(_actions(doc)) == {"s3:GetObject", "s3:ListBucket", "s3:PutObject", "s3:AbortMultipartUpload"}
    for st in doc["Statement"]:
        assert st["Effect"] == "Allow" and not any("*" in a for a in st["Action"])
        assert all(r.startswith("arn:aws:s3:::") and r not in ("*", "arn:aws:s3:::*") for r in st["Resource"])
    # read-only sources get no write action, and the output bucket no read or list
    assert not any(st["Resource"][0].startswith("arn:aws:s3:::data-bkt") for st in doc["Statement"]
                   if "s3:PutObject" in st["Action"])
    assert not any("out-bkt" in st["Resource"][0] for st in doc["Statement"] if "s3:PutObject" not in st["Action"])
    assert s3.policy_document([], ["s3://b-cn/x"], s3.partition_of("cn-north-1"))["Statement"][0]["Resource"] == \
        ["arn:aws-cn:s3:::b-cn/x/*"]


def _built(**options):
    pytest.importorskip("pulumi_aws")
    from gpucluster.infra.aws.mock_runtime import build

    spec = ClusterSpec(cloud="aws", nodes=2, name="demo", region="us-east-1", instance_type="g5.xlarge",
                       ssh_cidr="203.0.113.7/32", run_id="r20261122-031500-abc123")
    spec = spec.replace(reads=tuple(options.get("reads", ())), writes=tuple(options.get("writes", ())))
    built = build(spec)
    assert built.error is None, built.error
    return built.recorder


def test_component_attaches_the_scoped_policy_to_the_nodes_role_only_when_asked():
    import pulumi_aws as aws

    from gpucluster.infra.aws.mock_runtime import unwrap

    rec = _built(reads=["s3://data-bkt/train"], writes=["s3://out-bkt/runs"])
    [pol] = rec.of_type("aws:iam/rolePolicy:RolePolicy")
    [role] = rec.of_type("aws:iam/role:Role")
    doc = json.loads(unwrap(pol.inputs["policy"]))
    assert doc == s3.policy_document(["s3://data-bkt/train"], ["s3://out-bkt/runs"])
    assert pol.inputs["role"] == f"{role.name}-id"  # the nodes' role (the mocks' id), not a new one
    assert json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}
    [profile] = rec.of_type("aws:iam/instanceProfile:InstanceProfile")
    assert profile.inputs["role"] == role.name  # the mocks' name output
    assert rec.node_template().inputs["iamInstanceProfile"] == {"name": profile.name}  # every node's template
    # no keys anywhere: no access key resource, and no credential in the nodes' user data
    assert not rec.of_type("aws:iam/accessKey:AccessKey") and not rec.of_type("aws:iam/user:User")
    import base64

    assert "AWS_SECRET_ACCESS_KEY" not in base64.b64decode(unwrap(rec.node_template().inputs["userData"])).decode()
    # an inline policy takes no tags in AWS (the class has no tags argument): it lives in its role
    import inspect

    assert "tags" not in inspect.signature(aws.iam.RolePolicy._internal_init).parameters
    assert not _built().of_type("aws:iam/rolePolicy:RolePolicy")


def test_dry_run_shows_the_grants(home):
    r = run_cli("run", "--cloud", "aws", "--ssh-cidr", "198.51.100.7/32", "--dry-run",
                "--data", "s3://data-bkt/train:inputs", "--output", "s3://out-bkt/runs")
    assert r.returncode == 0, r.stderr
    assert "aws:iam/rolePolicy:RolePolicy" in r.stdout
    assert "node role grants: s3:GetObject on arn:aws:s3:::data-bkt/train/*" in r.stdout
    assert 'node role grants: s3:ListBucket on arn:aws:s3:::data-bkt if {"StringLike": {"s3:prefix": ["train/*"]}}' \
        in r.stdout
    assert "node role grants: s3:PutObject, s3:AbortMultipartUpload on arn:aws:s3:::out-bkt/runs/*" in r.stdout
    assert "GPUCLUSTER_DATA=~/.gpucluster/runs/" in r.stdout and "/inputs" in r.stdout


# -- the node program ----------------------------------------------------------------------------
def test_aws_cli_commands():
    assert cli_argv("pull", "s3://b/p", "/d") == ["aws", "s3", "sync", "s3://b/p/", "/d", "--only-show-errors",
                                                  "--no-progress"]
    assert cli_argv("push", "/o", "s3://b/p/r/node-0") == ["aws", "s3", "cp", "/o", "s3://b/p/r/node-0/", "--recursive",
                                                            "--only-show-errors", "--no-progress"]


def _node(s3srv, mode, a, b, *, path="/usr/bin:/bin", python=sys.executable):
    """The script the launcher runs on a node, run here by sh with the node's PATH."""
    script = s3.NodeTransfer().script(python, mode, a, b)
    env = {**s3srv.env, "PATH": path, "HOME": os.environ.get("HOME", "/root")}
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env, timeout=120)


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*") if p.is_file()}


def _dataset(tmp_path: Path) -> Path:
    ds = tmp_path / "ds"
    (ds / "shards").mkdir(parents=True)
    for i in range(3):
        (ds / "shards" / f"part-{i}.bin").write_bytes(os.urandom(50_000 + i))
    (ds / "labels.txt").write_text("0 1\n")
    return ds


def test_boto3_path_pulls_and_pushes_against_s3(s3_server, tmp_path):
    """No `aws` on this PATH (/usr/bin:/bin): the node program uses boto3 of the given Python."""
    c = s3_server.client()
    c.create_bucket(Bucket="data-bkt")
    c.create_bucket(Bucket="out-bkt")
    want = s3_server.put_tree("data-bkt", "train", _dataset(tmp_path))
    c.put_object(Bucket="data-bkt", Key="trainer/other.bin", Body=b"not under train/")
    dest = tmp_path / "node" / "data"
    r = _node(s3_server, "pull", "s3://data-bkt/train", str(dest))
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.splitlines()[-1])
    assert got["tool"] == "boto3" and got["files"] == 4 and _tree(dest) == want

    out = tmp_path / "node" / "outputs"
    (out / "ckpt").mkdir(parents=True)
    (out / "ckpt" / "model.pt").write_bytes(os.urandom(70_000))
    r = _node(s3_server, "push", str(out), "s3://out-bkt/runs/r1/node-0")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1]) == {"tool": "boto3", "files": 1, "bytes": 70_000, "total_files": 1,
                                                      "failed": []}
    assert s3_server.keys("out-bkt") == ["runs/r1/node-0/ckpt/model.pt"]
    assert s3_server.sha256("out-bkt", "runs/r1/node-0/ckpt/model.pt") == _tree(out)["ckpt/model.pt"]


def test_node_failures_name_the_cause(s3_server, tmp_path):
    s3_server.client().create_bucket(Bucket="data-bkt")
    r = _node(s3_server, "pull", "s3://data-bkt/nothing-here", str(tmp_path / "d"))
    assert r.returncode == 4 and "s3://data-bkt/nothing-here holds no objects" in r.stderr
    r = _node(s3_server, "pull", "s3://no-such-bkt/x", str(tmp_path / "d"))
    assert r.returncode == 4 and "NoSuchBucket" in r.stderr
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "m.pt").write_bytes(b"x" * 10)
    r = _node(s3_server, "push", str(tmp_path / "o"), "s3://no-such-bkt/runs")
    assert r.returncode == 4
    assert json.loads(r.stdout.splitlines()[-1])["failed"][0].startswith("m.pt: ") and "NoSuchBucket" in r.stdout
    # no aws CLI and no boto3 (the system Python has none here): the node says what is missing
    if subprocess.run(["/usr/bin/python3", "-c", "import boto3"], capture_output=True).returncode == 0:
        pytest.skip("/usr/bin/python3 has boto3 here")
    r = _node(s3_server, "pull", "s3://data-bkt/x", str(tmp_path / "d"), python="/usr/bin/python3")
    assert r.returncode == 4 and "neither the AWS CLI (aws on PATH) nor boto3" in r.stderr


def test_aws_cli_path_against_s3(s3_server, tmp_path):
    """The same through the AWS CLI (as on a DLAMI), when this machine has a working one."""
    aws = shutil.which("aws")
    if not aws or subprocess.run([aws, "--version"], capture_output=True).returncode != 0:
        pytest.skip("no working AWS CLI here")
    c = s3_server.client()
    c.create_bucket(Bucket="data-bkt")
    c.create_bucket(Bucket="out-bkt")
    want = s3_server.put_tree("data-bkt", "train", _dataset(tmp_path))
    path = f"{Path(aws).parent}:/usr/bin:/bin"
    dest = tmp_path / "d"
    r = _node(s3_server, "pull", "s3://data-bkt/train", str(dest), path=path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["tool"] == "aws-cli" and _tree(dest) == want
    r = _node(s3_server, "push", str(dest), "s3://out-bkt/r/node-1", path=path)
    assert r.returncode == 0, r.stderr
    assert s3_server.keys("out-bkt") == sorted(f"r/node-1/{k}" for k in want)
    r = _node(s3_server, "push", str(dest), "s3://no-such-bkt/r", path=path)
    assert r.returncode == 4 and "aws s3 cp exited with code" in r.stdout
