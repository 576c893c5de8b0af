"""`gpucluster up/down/status/logs/gc/doctor`, driven in-process with the FAKE Pulumi CLI
(tests/pulumi_fake.py), moto for boto3, and stubs where moto lacks an API (labelled)."""

from __future__ import annotations

import json
import sys
import time
from types import SimpleNamespace

import click
import pytest

from gpucluster.cli import common, doctor, down, gc, logs, status, up
from gpucluster.infra.aws import doctor as aws_doctor
from gpucluster.errors import UsageError
from gpucluster.ledger.store import Ledger
from conftest import run_cli

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

COMMANDS = {"up": up.up, "down": down.down, "status": status.status, "logs": logs.logs, "gc": gc.gc,
            "doctor": doctor.doctor}


def invoke(cmd, *args):
    return cmd.main(list(args), prog_name=f"gpucluster {cmd.name}", standalone_mode=False)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help(name, capsys):
    with pytest.raises(SystemExit) as done:
        COMMANDS[name].main(["--help"], prog_name=f"gpucluster {name}")
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "Usage:" in out and ("Example" in out or name == "status")


@pytest.fixture
def fake_cloud(home, monkeypatch):
    pytest.importorskip("pulumi.automation")
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from pulumi_fake import FakePulumiCommand
    from test_automation import provider

    fake = FakePulumiCommand()
    monkeypatch.setattr(common, "provider_for", lambda cloud, **scope: provider(fake).scoped(**scope))
    # the fake cloud has no EC2 to ask whether its instances still run (tests/test_aws_status.py does)
    monkeypatch.setattr(status, "ended_resources", lambda cloud, rows, lifetime: {})
    return fake


def test_up_status_down_cycle(fake_cloud, capsys, monkeypatch):
    assert invoke(up.up, "--cloud", "aws", "--name", "demo", "--nodes", "2", "--instance-type", "g5.xlarge",
                  "--region", "us-east-1", "--ssh-cidr", "203.0.113.7/32", "--yes") == 0
    out = capsys.readouterr().out
    assert "203.0.113.10" in out and "10.42.0.11" in out and "/hour" in out and "gpucluster down demo" in out
    assert "PRIVATE KEY" not in out

    ledger = Ledger.open_default()
    run = ledger.list_runs()[0].to_dict()
    assert run["status"] == "succeeded" and run["teardown"] == "kept"  # kept on purpose
    assert gc.live_clusters(ledger) == {"demo"}

    assert invoke(status.status, "--json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["cluster"] for r in rows] == ["demo"] and rows[0]["state"] == "kept" and rows[0]["nodes"] == 2
    if rows[0]["hourly_usd"] is not None:  # priced by gpucluster.costing.cost when present: 2 x g5.xlarge
        assert float(rows[0]["hourly_usd"]) > 2.0

    assert invoke(down.down, "--all", "--yes", "--json") == 0
    verdicts = json.loads(capsys.readouterr().out)
    assert verdicts == [{"cluster": "demo", "cloud": "aws", "verdict": "verified", "leftovers": [], "unchecked": [],
                         "runs_closed": 1}]
    assert ledger.open_resources() == [] and ledger.get_run(run["id"]).to_dict()["teardown"] == "verified"
    assert invoke(status.status, "--json") == 0 and json.loads(capsys.readouterr().out) == []


def test_up_json_leaves_secrets_out(fake_cloud, capsys):
    assert invoke(up.up, "--cloud", "aws", "--name", "demo", "--nodes", "2", "--ssh-cidr", "203.0.113.7/32",
                  "--yes", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert [n["host"] for n in data["nodes"]] == ["203.0.113.10", "203.0.113.11"]
    assert "ssh_private_key" not in json.dumps(data)


def test_up_failure_is_recorded(home, monkeypatch):
    pytest.importorskip("pulumi.automation")
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from pulumi_fake import FakePulumiCommand
    from test_automation import CAPACITY, provider

    fake = FakePulumiCommand(fail_up_after=4, fail_text=CAPACITY)
    monkeypatch.setattr(common, "provider_for", lambda cloud, **scope: provider(fake).scoped(**scope))
    from gpucluster.errors import ProvisionError

    with pytest.raises(ProvisionError, match="us-east-1a"):
        invoke(up.up, "--cloud", "aws", "--name", "demo", "--ssh-cidr", "203.0.113.7/32", "--yes")
    run = Ledger.open_default().list_runs()[0].to_dict()
    assert run["status"] == "failed" and "us-east-1a" in run["failure"]
    assert Ledger.open_default().open_resources() == []  # what was made was destroyed and recorded so
    # the same teardown and independent check as `run` (lifecycle.provision_only)
    run = Ledger.open_default().get_run(run["id"]).to_dict()
    assert run["teardown"] == "verified" and [p["name"] for p in run["phases"]] == ["provision", "teardown"]


def test_bad_input(home, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(home / "no-such-kubeconfig"))  # a kept namespace (issue 44) needs one
    with pytest.raises(UsageError, match="no kubeconfig at .*no-such-kubeconfig"):
        invoke(up.up, "--cloud", "kubernetes", "--yes")
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    monkeypatch.setattr(common, "provider_for", lambda cloud, **_: SimpleNamespace(preflight=lambda spec=None: None))  # no --yes
    with pytest.raises(UsageError, match="--yes"):
        invoke(up.up, "--cloud", "aws", "--ssh-cidr", "203.0.113.7/32")
    assert Ledger.open_default().list_runs() == []
    with pytest.raises(UsageError, match="name a cluster or pass --all"):
        invoke(down.down)
    ledger = Ledger.open_default()
    ledger.create_run("r1", cloud="aws", cluster="demo-one", nodes=1, gpus_per_node=1, command=["x"], spec={})
    with pytest.raises(UsageError, match='not in the ledger \\(did you mean "demo-one"\\?\\)'):
        invoke(down.down, "demo-onee", "--yes")
    with pytest.raises(click.exceptions.BadParameter):
        invoke(gc.gc, "--cloud", "azure")


def test_up_without_pulumi_fails_before_recording_anything(home, monkeypatch):
    pytest.importorskip("pulumi.automation")
    import shutil

    from gpucluster.errors import MissingDependency

    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(MissingDependency, match="get.pulumi.com"):
        invoke(up.up, "--cloud", "aws", "--ssh-cidr", "203.0.113.7/32", "--yes")
    assert Ledger.open_default().list_runs() == []


def test_down_all_with_nothing_open(home, capsys):
    assert invoke(down.down, "--all", "--yes") == 0
    assert "nothing to do" in capsys.readouterr().out


# -- logs -----------------------------------------------------------------------------------------
def make_run_with_logs(tmp_path, status="succeeded"):
    ledger = Ledger.open_default()
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    (log_dir / "node-0.log").write_text("hello from head\nepoch 1\n")
    (log_dir / "node-1.log").write_text("hello from worker\n")
    ledger.create_run("r20261122-000000-aaaaaa", cloud="local", cluster="c", nodes=2, gpus_per_node=0,
                      command=["x"], spec={}, log_dir=str(log_dir))
    if status != "running":
        ledger.finish_run("r20261122-000000-aaaaaa", status=status, exit_code=0)
    return ledger, log_dir


def test_logs(home, tmp_path, capsys):
    make_run_with_logs(tmp_path)
    assert invoke(logs.logs, "r20261122-000000-aaaaaa") == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["[node 0] hello from head", "[node 0] epoch 1", "[node 1] hello from worker"]
    assert invoke(logs.logs, "r20261122", "--node", "1") == 0  # unique prefix, one node: no prefix
    assert capsys.readouterr().out.splitlines() == ["hello from worker"]
    with pytest.raises(UsageError, match="node 5 is not allowed.*node-0, node-1"):
        invoke(logs.logs, "r20261122-000000-aaaaaa", "--node", "5")
    with pytest.raises(UsageError, match="not in the ledger"):
        invoke(logs.logs, "nope")


def test_logs_follow_prints_new_lines_until_the_run_ends(home, tmp_path, capsys):
    import threading

    ledger, log_dir = make_run_with_logs(tmp_path, status="running")

    def writer():
        time.sleep(0.6)
        with open(log_dir / "node-1.log", "a") as fh:
            fh.write("late line\n")
        time.sleep(0.6)
        Ledger.open_default().finish_run("r20261122-000000-aaaaaa", status="succeeded", exit_code=0)

    t = threading.Thread(target=writer)
    t.start()
    start = time.monotonic()
    from gpucluster.lifecycle.owner import owner_lock

    with owner_lock("c", "run", run_id="r20261122-000000-aaaaaa"):  # the run's live owner, as `run` holds it
        assert invoke(logs.logs, "r20261122-000000-aaaaaa", "--follow") == 0
    t.join()
    assert time.monotonic() - start < 10
    assert "[node 1] late line" in capsys.readouterr().out


# -- gc with moto ---------------------------------------------------------------------------------
def test_gc_deletes_orphans_and_keeps_kept_clusters(home, monkeypatch, capsys):
    pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    from test_leftovers import REGION, make_cluster

    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    ledger = Ledger.open_default()
    ledger.create_run("r-kept", cloud="aws", cluster="kept", nodes=1, gpus_per_node=1, command=["gpucluster", "up"],
                      spec={"region": REGION})
    ledger.finish_run("r-kept", status="succeeded", exit_code=0, teardown="kept")
    ledger.create_run("r-crash", cloud="aws", cluster="crashed", nodes=1, gpus_per_node=1, command=["x"],
                      spec={"region": REGION})  # still "running": its process died
    with moto.mock_aws():
        import boto3

        session = boto3.session.Session(region_name=REGION)
        # resources made before owner marks: ours by the run ids this ledger holds
        kept = make_cluster(session, "kept", run="r-kept")
        crashed = make_cluster(session, "crashed", run="r-crash")
        theirs = make_cluster(session, None)

        monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
        with pytest.raises(UsageError, match="--yes"):
            invoke(gc.gc, "--cloud", "aws", "--region", REGION)
        capsys.readouterr()

        assert invoke(gc.gc, "--cloud", "aws", "--region", REGION, "--yes", "--json") == 0
        report = json.loads(capsys.readouterr().out)
        assert report["verdict"] == "verified" and report["found"] == [] and report["unchecked"] == []
        assert report["errors"] == [] and report["live_clusters"] == ["kept"]
        ids = {f["id"] for f in report["deleted"]}
        assert set(crashed["instances"]) <= ids and crashed["sg"] in ids
        assert not ids & {kept["sg"], theirs["sg"], *kept["instances"], *theirs["instances"]}

        ec2 = session.client("ec2", region_name=REGION)
        state = {i["InstanceId"]: i["State"]["Name"] for r in ec2.describe_instances()["Reservations"]
                 for i in r["Instances"]}
        assert {state[i] for i in crashed["instances"]} == {"terminated"}
        assert {state[i] for i in kept["instances"] + theirs["instances"]} == {"running"}

        assert invoke(gc.gc, "--cloud", "aws", "--region", REGION, "--yes") == 0
        assert "gc: verified (aws us-east-1): every check ran and nothing tagged" in capsys.readouterr().out


def test_gc_without_credentials_is_not_verified_and_exits_3(home, monkeypatch, tmp_path):
    """Bug 1: 12 "not checked" lines, then "nothing ... is left" and exit 0. Now: NOT VERIFIED, exit 3."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    res = run_cli("gc", "--cloud", "aws", "--yes", env={"GPUCLUSTER_HOME": str(home)})
    assert res.returncode == 3, res.stdout + res.stderr
    out = res.stdout + res.stderr
    assert "NOT VERIFIED" in out and "nothing tagged managed-by=gpucluster is left" not in out
    assert out.count("not checked") >= 12 and "Traceback" not in out
    res = run_cli("gc", "--cloud", "aws", "--yes", "--json", env={"GPUCLUSTER_HOME": str(home)})
    report = json.loads(res.stdout)
    assert res.returncode == 3 and report["verdict"] == "not verified" and len(report["unchecked"]) >= 12
    # without --region the sweep looks where a cluster made without --region is created (the catalog default)
    assert any("us-east-1" in line for line in report["unchecked"])


# -- doctor ---------------------------------------------------------------------------------------
class QuotaStub:
    """STUB for the Service Quotas client (moto does not know quota L-DB2E81BA)."""

    def __init__(self, value):
        self.value = value
        self.asked = []

    def get_service_quota(self, ServiceCode, QuotaCode):
        self.asked.append((ServiceCode, QuotaCode))
        return {"Quota": {"QuotaCode": QuotaCode, "Value": self.value}}


def test_doctor_aws_checks(monkeypatch):
    pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with moto.mock_aws():
        import boto3

        real = boto3.session.Session(region_name="us-east-1")
        for value, ok in ((192.0, True), (0.0, False)):
            quota = QuotaStub(value)
            session = SimpleNamespace(client=lambda name, region_name=None, config=None, q=quota: q
                                      if name == "service-quotas" else real.client(name, region_name=region_name),
                                      get_credentials=real.get_credentials)  # their lifetime (issue 40 item 8)
            # issue 25: doctor runs the run's preflight for a shape (default: 2 x g5.xlarge), so the
            # quota line compares the quota with what that run needs (no more "room for N" line)
            found = aws_doctor.check_aws("us-east-1", session=session)
            region, creds = found[:2]
            q = next(c for c in found if c["check"].startswith("EC2 quota"))
            assert region["detail"].startswith("us-east-1, for 2 x g5.xlarge")
            assert creds["ok"] is True and "123456789012" in creds["detail"]
            assert quota.asked == [("ec2", "L-DB2E81BA")]
            assert q["ok"] is ok
            if ok:
                assert "192 of 192 vCPUs" in q["detail"] and "needs 2 × g5.xlarge = 8 vCPUs" in q["detail"]
            else:
                assert "request-service-quota-increase" in q["fix"] and "L-DB2E81BA" in q["fix"]


def test_doctor_reports_each_failure_with_a_fix(home, monkeypatch, capsys):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: None)  # no ssh, no pulumi
    from gpucluster.infra.gcp import doctor as gcp_doctor_

    monkeypatch.setattr(aws_doctor, "doctor", lambda region=None, session=None, **shape: [
        doctor._check("aws credentials", False, "no credentials", "aws configure")])
    monkeypatch.setattr(gcp_doctor_, "doctor_checks", lambda project=None, region=None, **kw: [
        doctor._check("gcp credentials", True, "project p")])
    rc = invoke(doctor.doctor)
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAIL  ssh client" in out and "openssh" in out.lower()
    assert "FAIL  pulumi CLI" in out and "get.pulumi.com" in out
    assert "ok    state directory" in out and "ok    gcp credentials" in out
    assert invoke(doctor.doctor, "--json", "--cloud", "gcp") == 1
    checks = json.loads(capsys.readouterr().out)
    assert {c["check"] for c in checks} == {"state directory", "ssh client", "pulumi CLI", "gcp credentials"}
    assert all(c["fix"] for c in checks if c["ok"] is False)


def test_doctor_with_a_working_pulumi(home):
    pytest.importorskip("pulumi.automation")
    from pulumi_fake import FakePulumiCommand

    cli_check, plugins = doctor.check_pulumi(FakePulumiCommand(version="3.200.0"))
    assert cli_check["ok"] is True and "3.200.0" in cli_check["detail"]
    assert "aws" in plugins["detail"] and "gcp" in plugins["detail"]  # gcp, tls not yet installed: noted
    old = doctor.check_pulumi(FakePulumiCommand(version="3.100.0"))[0]
    assert old["ok"] is False and "get.pulumi.com" in old["fix"]


def test_down_finishes_a_crashed_local_run(home, capsys):
    """A local run whose gpucluster process died: its stray node process is killed by `down`."""
    import os
    import subprocess

    ledger = Ledger.open_default()
    rid = "r20261122-010101-cccccc"
    ledger.create_run(rid, cloud="local", cluster="gpucluster-local", nodes=1, gpus_per_node=0, command=["x"], spec={})
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={**os.environ, "GPUCLUSTER_RUN_ID": rid})
    try:
        ledger.resource_requested(rid, "process", "node-0", detail={"pid": stray.pid})
        ledger.resource_created(rid, "process", "node-0", str(stray.pid))
        assert invoke(down.down, "gpucluster-local", "--yes") == 0
        assert stray.wait(timeout=10) is not None  # killed
    finally:
        if stray.poll() is None:
            stray.kill()
    assert ledger.open_resources() == []
    run = ledger.get_run(rid).to_dict()
    assert run["status"] == "failed" and run["teardown"] == "verified"


def test_status_gpus_asks_every_node_over_ssh(home, monkeypatch, capsys):
    """`status --gpus` builds the cluster from the stack outputs (pinned host keys, the cluster's
    key) and prints each node's GPU state; the ssh probe itself is STUBBED here (the real one is
    tested against sshd in test_ssh_sshd.py)."""
    from gpucluster.infra.ssh import launch as sshlaunch

    outputs = {"instance_ids": ["i-1", "i-2"], "private_ips": ["10.0.0.1", "10.0.0.2"],
               "public_ips": ["198.51.100.1", "198.51.100.2"], "host_public_keys": ["ssh-ed25519 AAAA1", "ssh-ed25519 AAAA2"],
               "cluster_name": "c1", "ssh_user": "ubuntu", "ssh_private_key": "KEY", "region": "us-east-1",
               "availability_zone": "us-east-1a", "instance_type": "g5.xlarge", "gpus_per_node": 1}
    monkeypatch.setattr(status, "cluster_rows", lambda ledger: [{"cluster": "c1", "cloud": "aws", "state": "up",
                                                               "nodes": 2, "age_s": 60, "hourly_usd": "2.012",
                                                               "accrued_usd": "0.03", "resources": 9}])
    monkeypatch.setattr(common, "provider_for", lambda cloud, **_: SimpleNamespace(driver=SimpleNamespace(outputs=lambda n: outputs)))
    seen = {}

    def probe(self, cluster):
        seen["hosts"] = [n.host for n in cluster.nodes]
        seen["keys"] = [n.host_keys for n in cluster.nodes]
        return [sshlaunch.NodeReadiness(0, "ubuntu@198.51.100.1", True,
                                        gpu_state=[{"name": "NVIDIA A10G", "util": 97, "mem_used_mib": 20000,
                                                    "mem_total_mib": 22888}]),
                sshlaunch.NodeReadiness(1, "ubuntu@198.51.100.2", False, problems=["ssh: connection timed out"])]

    monkeypatch.setattr(sshlaunch.SshLauncher, "probe", probe)
    assert invoke(status.status, "--gpus") == 0
    out = capsys.readouterr().out
    assert seen["hosts"] == ["198.51.100.1", "198.51.100.2"]
    assert seen["keys"] == [("ssh-ed25519 AAAA1",), ("ssh-ed25519 AAAA2",)]
    assert "c1 node 0 ubuntu@198.51.100.1: NVIDIA A10G 97% 20000/22888 MiB" in out
    assert "c1 node 1 ubuntu@198.51.100.2: no GPU visible  (ssh: connection timed out)" in out
    assert invoke(status.status, "--gpus", "--json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["node_gpus"][1]["reachable"] is False
