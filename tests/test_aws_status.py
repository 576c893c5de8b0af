"""`gpucluster status` asks EC2 about a kept cluster's instances and closes the ledger rows of those
that no longer bill, at the end EC2 reports, so the accrued cost stops there (infra/aws/liveness.py).

EC2's answers, and where moto 5.2.5 is kinder:
- a terminated instance stays visible with state `terminated` and a StateTransitionReason such as
  "User initiated (2026-11-22 07:00:00 GMT)" (EC2 API reference, DescribeInstances / Instance);
  moto writes "... UTC)".
- a node the dead-man switch powered off (`shutdown -P` inside the instance, shutdown behaviour
  terminate) ends with StateReason Client.InstanceInitiatedShutdown, and StateTransitionReason "might
  be an empty string" (EC2 API reference, StateReason and Instance): no time given. moto never says
  that, so a rule answers it.
- about an hour after termination the instance is gone: DescribeInstances answers
  InvalidInstanceID.NotFound (EC2 User Guide, "Terminate Amazon EC2 instances"), as moto does for an
  id it never had.
- not billed while shutting-down or terminated (EC2 User Guide, "Amazon EC2 instance state changes").
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

sys.path.insert(0, str(Path(__file__).parent))
boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")

from aws_strict import StrictSession  # noqa: E402

from gpucluster.costing.cost import run_cost  # noqa: E402
from gpucluster.infra.registry import plugin  # noqa: E402
from gpucluster.ledger.store import Ledger  # noqa: E402

REGION = "us-east-1"
HOUR = 3600.0


@pytest.fixture
def ec2_session(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with moto.mock_aws():
        strict = StrictSession(REGION)
        monkeypatch.setattr(boto3.session, "Session", lambda *a, **k: strict)
        yield strict


def _kept_cluster(ledger, ids, started):
    ledger.create_run("r-kept", cloud="aws", cluster="kept", nodes=len(ids), gpus_per_node=1, command=["up"],
                      spec={"cloud": "aws", "region": REGION, "nodes": len(ids), "instance_type": "g5.xlarge",
                            "max_lifetime_minutes": 60, "name": "kept"}, now=started)
    for rank, iid in enumerate(ids):
        name = f"kept-node-{rank}"
        ledger.resource_requested("r-kept", "instance", name, region=REGION, now=started,
                                  detail={"instance_type": "g5.xlarge", "spot": False, "disk_gb": 100,
                                          "disk_type": "gp3"})
        ledger.resource_created("r-kept", "instance", name, iid, now=started + 30)
    ledger.resource_requested("r-kept", "vpc", "kept-vpc", region=REGION, now=started)
    ledger.finish_run("r-kept", status="succeeded", exit_code=0, teardown="kept")


def test_status_closes_the_rows_of_nodes_that_powered_off_and_stops_their_cost(home, ec2_session):
    from gpucluster.cli.status import cluster_rows

    ec2 = ec2_session.real.client("ec2", region_name=REGION)
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ids = [i["InstanceId"] for i in ec2.run_instances(ImageId=ami, InstanceType="g5.xlarge", MinCount=3,
                                                      MaxCount=3)["Instances"]]
    ec2.terminate_instances(InstanceIds=[ids[1]])  # by hand, just now
    gone = "i-0123456789abcdef0"  # terminated long ago: EC2 no longer knows it
    deadman = ids[2]

    def describe(params):  # the dead-man switch's power-off: terminated, no time given
        if params.get("InstanceIds") == [deadman]:
            real = ec2.describe_instances(InstanceIds=[deadman])
            inst = real["Reservations"][0]["Instances"][0]
            inst.update(State={"Code": 48, "Name": "terminated"}, StateTransitionReason="",
                        StateReason={"Code": "Client.InstanceInitiatedShutdown",
                                     "Message": "Client.InstanceInitiatedShutdown: Instance initiated shutdown"})
            return {"Reservations": real["Reservations"]}
        return None

    ec2_session.on("ec2", "DescribeInstances", describe)
    now = time.time()
    started = now - 3 * HOUR
    ledger = Ledger.open_default()
    _kept_cluster(ledger, [ids[0], ids[1], deadman, gone], started)
    before = float(run_cost(ledger.get_run("r-kept"), backend=plugin("aws"), now=now)["total"])

    (row,) = cluster_rows(ledger, now=now)
    closed = {r.name: r for r in ledger.get_run("r-kept").resources if r.confirmed_gone}
    assert set(closed) == {"kept-node-1", "kept-node-2", "kept-node-3"}
    assert now - 120 < closed["kept-node-1"].deleted_at <= now  # moto's termination time, seconds ago
    # no time from EC2: the dead-man deadline at the latest (created + 60 min lifetime + 15 min boot)
    assert closed["kept-node-2"].deleted_at == pytest.approx(started + 30 + 75 * 60)
    assert closed["kept-node-3"].deleted_at == pytest.approx(started + 30 + 75 * 60)
    assert row["state"] == "kept, 3 of 4 node(s) gone" and row["resources"] == 2  # node 0 and the VPC
    assert any("Instance initiated shutdown" in n for n in row["observed"])
    assert any(n.startswith(f"instance {gone}: no longer known to EC2") for n in row["observed"])
    after = float(run_cost(ledger.get_run("r-kept"), backend=plugin("aws"), now=now)["total"])
    # nodes 0 and 1 billed 3 h, nodes 2 and 3 only until their end 75.5 min after the request
    assert after == pytest.approx(before * (2 * 3 + 2 * (75.5 / 60)) / 12, rel=0.01), (before, after)
    assert float(row["hourly_usd"]) == pytest.approx(1.017, abs=0.01)  # one g5.xlarge + its disk still billing
    # asked again: nothing more to close, node 0 still running
    (again,) = cluster_rows(ledger, now=now + 60)
    assert again["observed"] == [] and again["resources"] == 2


def test_a_cluster_that_cannot_be_asked_keeps_accruing_and_says_why(home, monkeypatch):
    from gpucluster.cli import status

    def no_credentials(cloud, rows, lifetime):
        raise RuntimeError("Unable to locate credentials")

    monkeypatch.setattr(status, "ended_resources", no_credentials)
    ledger = Ledger.open_default()
    _kept_cluster(ledger, ["i-0aaaaaaaaaaaaaaaa"], time.time() - HOUR)
    (row,) = status.cluster_rows(ledger)
    assert row["observed"] == ["not checked with aws (RuntimeError: Unable to locate credentials): cost accrues up "
                               "to now"]
    assert row["resources"] == 2 and row["state"] == "kept"


def test_a_kept_fleet_row_closes_once_all_its_instances_are_gone(home, ec2_session):
    """Issue 25: the nodes are one instant EC2 Fleet, one ledger row. An instant fleet lists its
    instances in DescribeFleets (DescribeFleetInstances "does not support fleets of type instant", EC2
    API reference); the row stops billing when the last of them is gone, not before."""
    from gpucluster.cli.status import cluster_rows

    ec2 = ec2_session.real.client("ec2", region_name=REGION)
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    lt = ec2.create_launch_template(LaunchTemplateName="kept-nodes", LaunchTemplateData={
        "ImageId": ami, "InstanceType": "g5.xlarge"})["LaunchTemplate"]["LaunchTemplateId"]
    fleet = ec2.create_fleet(Type="instant", LaunchTemplateConfigs=[{"LaunchTemplateSpecification": {
        "LaunchTemplateId": lt, "Version": "$Latest"}}], TargetCapacitySpecification={
        "TotalTargetCapacity": 2, "DefaultTargetCapacityType": "on-demand", "OnDemandTargetCapacity": 2})
    ids = [i for s in fleet["Instances"] for i in s["InstanceIds"]]
    assert len(ids) == 2
    now = time.time()
    started = now - 3 * HOUR
    ledger = Ledger.open_default()
    ledger.create_run("r-kept", cloud="aws", cluster="kept", nodes=2, gpus_per_node=1, command=["up"],
                      spec={"cloud": "aws", "region": REGION, "nodes": 2, "instance_type": "g5.xlarge",
                            "max_lifetime_minutes": 60, "name": "kept"}, now=started)
    ledger.resource_requested("r-kept", "fleet", "kept-fleet", region=REGION, now=started,
                              detail={"instance_type": "g5.xlarge", "node_count": 2, "spot": False})
    ledger.resource_created("r-kept", "fleet", "kept-fleet", fleet["FleetId"], now=started + 30)
    ledger.resource_requested("r-kept", "vpc", "kept-vpc", region=REGION, now=started)
    ledger.finish_run("r-kept", status="succeeded", exit_code=0, teardown="kept")

    ec2.terminate_instances(InstanceIds=[ids[0]])  # one node gone: the fleet still bills for the other
    (row,) = cluster_rows(ledger, now=now)
    assert not [r for r in ledger.get_run("r-kept").resources if r.confirmed_gone] and row["observed"] == []
    ec2.terminate_instances(InstanceIds=[ids[1]])  # the last one: the row closes
    (row,) = cluster_rows(ledger, now=now + 60)
    (closed,) = [r for r in ledger.get_run("r-kept").resources if r.confirmed_gone]
    assert closed.name == "kept-fleet"
    # moto drops terminated instances from the fleet's list, so no end time is known: the dead-man
    # deadline at the latest (created + 60 min lifetime + 15 min boot); AWS keeps them listed ("the
    # instances that were launched by the fleet"), and then each one's end is read as for instance rows
    assert closed.deleted_at == pytest.approx(started + 30 + 75 * 60)
    assert any("the fleet lists no instance any more" in n for n in row["observed"]), row["observed"]
