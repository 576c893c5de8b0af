"""Issue 42: the real EC2 Pulumi program (infra/aws/component.py) under Pulumi's mock runtime
(infra/aws/mock_runtime.build) for one shape of each GPU family: the fleet launches the type `--gpu`
picked, in the cluster placement group; a multi-node cluster of a P shape made for EFA (p4d, p4de,
p5, p5en, p6-b200) gets an EFA interface by default, with the security group's self rules, a
single-node one or a g* one does not; `efa=false` turns it off. The mock runtime answers as the AWS
provider would for what it is asked (the mock's own docstring names its sources)."""

from __future__ import annotations

import pytest

pytest.importorskip("pulumi_aws")

from gpucluster.infra.aws import catalog  # noqa: E402
from gpucluster.infra.aws.mock_runtime import build  # noqa: E402
from gpucluster.spec import ClusterSpec  # noqa: E402

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"


def gpu_spec(gpu: str, count: int, nodes: int = 2, **kw) -> ClusterSpec:
    base = dict(cloud="aws", nodes=nodes, name="gpus", region="us-east-1", accelerator=gpu, gpus_per_node=count,
                ssh_cidr="203.0.113.7/32", run_id="r20261128-080000-abc123")
    spec = ClusterSpec(**{**base, **kw})
    return catalog.prepare(spec, detect=None)[0]  # what `run` does before the plan: the type written in


FAMILIES = [  # (gpu, count, type picked, EFA by default on 2 nodes, its network cards: one EFA interface each)
    ("A10G", 1, "g5.xlarge", False, 1),
    ("L4", 8, "g6.48xlarge", False, 1),
    ("L40S", 4, "g6e.12xlarge", False, 1),
    ("A100", 8, "p4d.24xlarge", True, 4),
    ("A100-80GB", 8, "p4de.24xlarge", True, 4),
    ("H100", 8, "p5.48xlarge", True, 32),
    ("H200", 8, "p5en.48xlarge", True, 16),
    ("B200", 8, "p6-b200.48xlarge", True, 8),
]


@pytest.mark.parametrize("gpu,count,itype,efa,cards", FAMILIES)
def test_the_fleet_launches_the_picked_type_with_efa_where_the_shape_is_made_for_it(gpu, count, itype, efa, cards):
    spec = gpu_spec(gpu, count)
    assert spec.instance_type == itype and spec.gpus_per_node == count
    built = build(spec)
    assert built.error is None, built.error
    rec = built.recorder
    fleet, lt = rec.fleet(), rec.node_template()
    (override,) = fleet.inputs["launchTemplateConfigs"][0]["overrides"]
    assert override["instanceType"] == itype
    (pg,) = rec.of_type("aws:ec2/placementGroup:PlacementGroup")
    assert pg.inputs["strategy"] == "cluster" and lt.inputs["placement"] == {"groupName": pg.name}
    nic, *more = lt.inputs["networkInterfaces"]
    assert (nic.get("interfaceType") == "efa") is efa and nic["deviceIndex"] == 0 and "networkCardIndex" not in nic
    # issue 42: an EFA interface on every network card, efa-only beyond card 0 (EC2 User Guide, "Maximize
    # network bandwidth on Amazon EC2 instances with multiple network cards"); several interfaces get no
    # public IPv4 at launch, so none is asked for and each node gets an Elastic IP on its primary interface
    assert [(m["networkCardIndex"], m["deviceIndex"], m["interfaceType"]) for m in more] == [
        (c, 0, "efa-only") for c in range(1, cards)]
    eips = rec.of_type("aws:ec2/eip:Eip")
    if cards > 1:
        assert "associatePublicIpAddress" not in nic
        assert sorted(e.inputs["networkInterface"] for e in eips) == ["eni-mock0", "eni-mock1"]  # each node's primary
        assert all(e.inputs["domain"] == "vpc" and e.inputs["tags"]["gpucluster-cluster"] == "gpus" for e in eips)
        assert built.outputs["public_ips"] == sorted(e.name and f"203.0.113.{10 + int(e.name.rsplit('-', 1)[1])}"
                                                     for e in eips)
    else:
        assert nic["associatePublicIpAddress"] == "true" and eips == []
    # EFA needs the members' traffic allowed both ways explicitly (the self rules are always declared)
    assert any(r.inputs.get("referencedSecurityGroupId") for r in rec.of_type(INGRESS))
    assert any(r.inputs.get("referencedSecurityGroupId") for r in rec.of_type(EGRESS))
    assert built.outputs["instance_type"] == itype and built.outputs["gpus_per_node"] == count


def test_efa_default_is_off_for_one_node_and_when_the_stack_says_so():
    one = build(gpu_spec("H100", 8, nodes=1))
    assert one.error is None and one.recorder.node_template().inputs["networkInterfaces"][0].get("interfaceType") is None
    off = build(gpu_spec("H100", 8, options=(("efa", "false"),)))
    assert off.error is None and off.recorder.node_template().inputs["networkInterfaces"][0].get("interfaceType") is None


def test_capacity_failover_stays_in_the_catalogs_zones_when_ec2_cannot_say():
    from gpucluster.infra.aws.engine import capacity_zones

    spec = gpu_spec("A100-80GB", 8)  # p4de.24xlarge: us-east-1b and us-east-1c only (shapes.ZONES)
    text = ("InsufficientInstanceCapacity: We currently do not have sufficient p4de.24xlarge capacity in the "
            "Availability Zone you requested (us-east-1b).")
    zone, others, itype = capacity_zones(spec, text, zone_lister=lambda region, t: [])
    assert (zone, others, itype) == ("us-east-1b", ["us-east-1c"], "p4de.24xlarge")


def test_elastic_ips_are_asked_leave_for_and_counted_once_in_the_cost():
    # the Elastic IP actions pulumi-aws's aws_eip calls (ec2_eip.go) are simulated only when the nodes get one;
    # the ledger bills each address as its own `elastic-ip` resource, so the fleet then counts no launch address
    from gpucluster.infra.aws.engine import resource_detail
    from gpucluster.infra.aws.permissions import EC2_ADDRESSES, needed

    p5, off = gpu_spec("H100", 8), gpu_spec("H100", 8, options=(("efa", "false"),))
    assert set(EC2_ADDRESSES) <= set(needed(p5)["EC2"]) and not set(EC2_ADDRESSES) & set(needed(off)["EC2"])
    assert resource_detail("fleet", {}, p5)["public_ipv4"] == 0 and resource_detail("fleet", {}, off)["public_ipv4"] == 1
