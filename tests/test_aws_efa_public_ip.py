"""Issue 42: why a p5 node gets one EFA interface, held by the EC2 stand-in (docs/aws.md, "EFA: one interface
per node").

EC2 gives a public IPv4 at launch only to an instance with one network interface: an instant fleet whose
template asks for one with several interfaces launches nothing and lists "InvalidParameterCombination:
The associatePublicIPAddress parameter cannot be specified when launching with multiple network
interfaces." (EC2 API Reference, InstanceNetworkInterfaceSpecification.AssociatePublicIpAddress;
aws/karpenter-provider-aws#5666). tests/ec2_timed.py now refuses so (before, it launched any template),
and the real provider's 2 x p5.48xlarge with EFA launches under it with the one EFA interface and
the public IPs ssh needs; a template with the full 32 cards and a public IPv4 is refused.
"""

from __future__ import annotations

import pytest

pytest.importorskip("moto")
pytest.importorskip("pulumi_aws")

from aws_account import REGION, _Quiet, accounts  # noqa: E402

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)


@pytest.fixture
def account(home, monkeypatch):
    yield from accounts(monkeypatch, 100.0)


def test_a_template_with_several_interfaces_and_a_public_ipv4_launches_nothing(account):
    ec2 = account.session.client("ec2", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    sub = ec2.create_subnet(VpcId=vpc, CidrBlock="10.42.1.0/24", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    sg = ec2.create_security_group(GroupName="efa42", Description="efa", VpcId=vpc)["GroupId"]
    # the layout of the EC2 User Guide's multi-card EFA page: ENA primary, efa-only on the other cards
    nics = [{"NetworkCardIndex": 0, "DeviceIndex": 0, "SubnetId": sub, "Groups": [sg], "AssociatePublicIpAddress": True}]
    nics += [{"NetworkCardIndex": c, "DeviceIndex": 0, "SubnetId": sub, "Groups": [sg], "InterfaceType": "efa-only"}
             for c in range(1, 32)]
    lt = ec2.create_launch_template(LaunchTemplateName="p5-full", LaunchTemplateData={
        "ImageId": "ami-12c6146b", "InstanceType": "p5.48xlarge", "NetworkInterfaces": nics})["LaunchTemplate"]
    resp = ec2.create_fleet(Type="instant", LaunchTemplateConfigs=[{"LaunchTemplateSpecification": {
        "LaunchTemplateId": lt["LaunchTemplateId"], "Version": "$Latest"}}],
        TargetCapacitySpecification={"TotalTargetCapacity": 2, "DefaultTargetCapacityType": "on-demand"},
        OnDemandOptions={"MinTargetCapacity": 2, "SingleAvailabilityZone": True})
    assert not [i for s in resp.get("Instances") or [] for i in s.get("InstanceIds") or []]
    assert [e["ErrorCode"] for e in resp["Errors"]] == ["InvalidParameterCombination"]
    assert "cannot be specified when launching with multiple network interfaces" in resp["Errors"][0]["ErrorMessage"]


def _p5_spec():
    from specs import validate

    from gpucluster.lifecycle.ownership import installation_id, owner_marks
    from gpucluster.spec import ClusterSpec, new_run_id

    spec = ClusterSpec(cloud="aws", nodes=2, name="efa42", region=REGION, instance_type="p5.48xlarge",
                       gpus_per_node=8, ssh_cidr="203.0.113.7/32", run_id=new_run_id(),
                       marks=owner_marks(installation_id()))
    validate(spec)
    return spec


def test_p5_with_efa_launches_with_one_efa_interface_and_public_ips(account):
    result = account.provider().up(_p5_spec(), _Quiet())
    assert len(result.nodes) == 2 and all(n.host for n in result.nodes)
    assert not [r for r in account.timed.refused if r[2] == "InvalidParameterCombination"]
    ec2 = account.session.client("ec2", region_name=REGION)
    (template,) = [t for t in ec2.describe_launch_templates()["LaunchTemplates"] if t["LaunchTemplateName"].startswith("efa42")]
    data = ec2.describe_launch_template_versions(LaunchTemplateId=template["LaunchTemplateId"])[
        "LaunchTemplateVersions"][0]["LaunchTemplateData"]
    (nic,) = data["NetworkInterfaces"]
    assert nic.get("InterfaceType") == "efa" and nic["AssociatePublicIpAddress"] is True
