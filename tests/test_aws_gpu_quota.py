"""Issue 42: the AWS preflight asks the quota of the type's class: a p5 cluster the P-instance quotas
(L-417A185B on demand, L-7212CCBC spot), a g6 cluster the G and VT ones, each counting only the
running instances of its own class.

EC2's quota classes: "Running On-Demand P instances" L-417A185B and "All P Spot Instance Requests"
L-7212CCBC count p* instances, "Running On-Demand G and VT instances" L-DB2E81BA and "All G and VT
Spot Instance Requests" L-3819A6DF count g*/vt* instances, all in vCPUs (EC2 User Guide, "Amazon EC2
instance type quotas", https://docs.aws.amazon.com/ec2/latest/instancetypes/ec2-instance-quotas.html).
moto 5.2.5 answers no EC2 quota, so `aws_strict.quota_rule` answers as Service Quotas would.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

sys.path.insert(0, str(Path(__file__).parent))

boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")

from aws_strict import StrictSession, quota_rule  # noqa: E402
from test_aws_preflight import dlami_rule  # noqa: E402

from gpucluster.infra.aws.preflight import (GVT_ON_DEMAND, P_ON_DEMAND, P_SPOT, PreflightError,  # noqa: E402
                                            checks, preflight)
from gpucluster.spec import ClusterSpec  # noqa: E402


@pytest.fixture
def aws(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with moto.mock_aws():
        yield StrictSession("us-east-1")


def spec(**kw):
    base = dict(cloud="aws", nodes=2, name="pf", region="us-east-1", instance_type="p5.48xlarge")
    base.update(kw)
    return ClusterSpec(**base)


def test_p5_asks_the_p_instance_quota_not_the_g_one(aws):
    # plenty of G/VT quota, none of P: a p5 cluster must be refused by the P quota
    aws.on("service-quotas", "GetServiceQuota", quota_rule({GVT_ON_DEMAND: 1000.0, P_ON_DEMAND: 0.0}))
    aws.on("ec2", "DescribeImages", dlami_rule())
    with pytest.raises(PreflightError) as err:
        preflight(spec(), session=aws)
    msg = err.value.message
    assert "Running On-Demand P instances in us-east-1" in msg
    assert "needs 2 × p5.48xlarge = 384 vCPUs, 0 available (quota 0, 0 in use)" in msg
    assert "--quota-code L-417A185B --desired-value 384 --region us-east-1" in msg
    # and, for the Elastic IP each node gets with EFA on its 32 cards (efa.py), the address quota
    assert aws.seen("service-quotas", "GetServiceQuota") == [{"ServiceCode": "ec2", "QuotaCode": "L-417A185B"},
                                                             {"ServiceCode": "ec2", "QuotaCode": "L-0263D0A3"}]


def test_p_quota_counts_running_p_instances_and_not_g_ones(aws):
    ec2 = aws.real.client("ec2", region_name="us-east-1")
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ec2.run_instances(ImageId=ami, InstanceType="p4d.24xlarge", MinCount=1, MaxCount=1)  # 96 P vCPUs
    ec2.run_instances(ImageId=ami, InstanceType="g5.48xlarge", MinCount=1, MaxCount=1)  # 192 G vCPUs: not P
    aws.on("service-quotas", "GetServiceQuota", quota_rule({P_ON_DEMAND: 450.0, P_SPOT: 0.0}))
    aws.on("ec2", "DescribeImages", dlami_rule())
    found = {c["check"]: c for c in checks(spec(nodes=2), session=aws)}
    q = found["EC2 quota L-417A185B (us-east-1)"]
    # the p4d counts, the g5 does not: 450 - 96 = 354 free, short of 384
    assert q["ok"] is False and "needs 2 × p5.48xlarge = 384 vCPUs, 354 available (quota 450, 96 in use)" in q["detail"]
    found = {c["check"]: c for c in checks(spec(nodes=1), session=aws)}
    assert found["EC2 quota L-417A185B (us-east-1)"]["ok"] is True
    with pytest.raises(PreflightError, match=r"All P Spot Instance Requests in us-east-1.*--quota-code L-7212CCBC"):
        preflight(spec(nodes=1, spot=True), session=aws)


def test_a_gpu_spec_without_a_type_asks_the_quota_of_the_picked_type(aws):
    # --gpu H100:8 picks p5.48xlarge (issue 42): the P quota, before any type was written in the spec
    aws.on("service-quotas", "GetServiceQuota", quota_rule({GVT_ON_DEMAND: 1000.0, P_ON_DEMAND: 0.0}))
    aws.on("ec2", "DescribeImages", dlami_rule())
    with pytest.raises(PreflightError, match=r"2 × p5.48xlarge = 384 vCPUs.*L-417A185B"):
        preflight(spec(instance_type=None, accelerator="H100", gpus_per_node=8), session=aws)
    # and a g6 (L4) cluster the G and VT one
    with pytest.raises(PreflightError, match=r"Running On-Demand G and VT instances") as err:
        aws.on("service-quotas", "GetServiceQuota", quota_rule({GVT_ON_DEMAND: 0.0, P_ON_DEMAND: 1000.0}))
        preflight(spec(instance_type=None, accelerator="L4", gpus_per_node=4), session=aws)
    assert "2 × g6.12xlarge = 96 vCPUs" in err.value.message


def test_the_elastic_ips_of_a_p5_cluster_must_fit_the_address_quota_left(aws):
    # EFA on every card: no public IPv4 at launch, an Elastic IP per node (efa.py). "EC2-VPC Elastic IPs"
    # L-0263D0A3 is 5 per region by default (VPC User Guide, "Amazon VPC quotas") and counts every address
    # allocated in the region, associated or not; past it AllocateAddress fails AddressLimitExceeded
    aws.on("ec2", "DescribeImages", dlami_rule())
    ec2 = aws.real.client("ec2", region_name="us-east-1")
    for _ in range(4):
        ec2.allocate_address(Domain="vpc")
    aws.on("service-quotas", "GetServiceQuota", quota_rule({P_ON_DEMAND: 1000.0, "L-0263D0A3": 5.0}))
    with pytest.raises(PreflightError) as err:
        preflight(spec(), session=aws)
    msg = err.value.message
    assert "\n" not in msg and ("EC2-VPC Elastic IPs in us-east-1: the cluster needs 2 Elastic IPs (one per p5.48xlarge "
                                "node: 32 EFA network cards, no public IPv4 at launch), 1 available (quota 5, 4 "
                                "allocated)") in msg, msg
    assert "--quota-code L-0263D0A3 --desired-value 6 --region us-east-1" in msg and "efa=false" in msg
    assert len(ec2.describe_addresses()["Addresses"]) == 4 and not ec2.describe_instances()["Reservations"]
    aws.on("service-quotas", "GetServiceQuota", quota_rule({P_ON_DEMAND: 1000.0, "L-0263D0A3": 6.0}))
    (row,) = [c for c in checks(spec(), session=aws) if "L-0263D0A3" in c["check"]]
    assert row["ok"] and "2 of 6 free (4 allocated), the cluster needs 2" in row["detail"]
    # one interface (efa=false, or one node: EFA off by default) needs no address and asks no quota for it
    assert not [c for c in checks(spec(options=(("efa", "false"),)), session=aws) if "L-0263D0A3" in c["check"]]
    assert not [c for c in checks(spec(nodes=1), session=aws) if "L-0263D0A3" in c["check"]]
