"""Issue 42: a p5 node gets an EFA interface on every network card and, since EC2 then gives it no
public IPv4, an Elastic IP on its primary interface (docs/aws.md, "EFA: every network card").

EC2 gives a public IPv4 at launch only to an instance with one network interface: an instant fleet whose
template asks for one with several interfaces launches nothing and lists "InvalidParameterCombination:
The associatePublicIPAddress parameter cannot be specified when launching with multiple network
interfaces." (EC2 API Reference, InstanceNetworkInterfaceSpecification.AssociatePublicIpAddress;
aws/karpenter-provider-aws#5666), and an instance launched with several gets none at all
(aws/aws-parallelcluster#7457). tests/ec2_timed.py and tests/ec2_addresses.py hold EC2 to that, to the
Elastic IP quota (AddressLimitExceeded) and to ReleaseAddress refusing an associated address
(InvalidIPAddress.InUse), each with its source there. The real provider's 2 x p5.48xlarge with EFA then
launches with 32 interfaces per node, reachable at their Elastic IPs, and every address it allocates is
released: by `down`, by the destroy of an `up` that failed after allocating one, and by the tag scan's
delete for an address an interrupted `up` left outside the stack.
"""

from __future__ import annotations

import pytest

pytest.importorskip("moto")
pytest.importorskip("pulumi_aws")

from aws_account import REGION, _Quiet, accounts  # noqa: E402

from gpucluster.errors import ProvisionError  # noqa: E402

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


def _p5_spec(name="efa42"):
    from specs import validate

    from gpucluster.ownership import installation_id, owner_marks
    from gpucluster.spec import ClusterSpec, new_run_id

    spec = ClusterSpec(cloud="aws", nodes=2, name=name, region=REGION, instance_type="p5.48xlarge",
                       gpus_per_node=8, ssh_cidr="203.0.113.7/32", run_id=new_run_id(),
                       marks=owner_marks(installation_id()))
    validate(spec)
    return spec


def _addresses(account):
    ec2 = account.session.client("ec2", region_name=REGION)
    return ec2, ec2.describe_addresses()["Addresses"]


def test_p5_with_efa_gets_every_card_and_an_elastic_ip_each_released_by_down(account):
    provider = account.provider()
    result = provider.up(_p5_spec(), _Quiet())
    ec2, addresses = _addresses(account)
    (template,) = [t for t in ec2.describe_launch_templates()["LaunchTemplates"] if t["LaunchTemplateName"].startswith("efa42")]
    data = ec2.describe_launch_template_versions(LaunchTemplateId=template["LaunchTemplateId"])[
        "LaunchTemplateVersions"][0]["LaunchTemplateData"]
    nics = data["NetworkInterfaces"]
    assert len(nics) == 32 and not any(n.get("AssociatePublicIpAddress") for n in nics)
    assert (nics[0]["DeviceIndex"], nics[0].get("NetworkCardIndex", 0), nics[0]["InterfaceType"]) == (0, 0, "efa")
    assert [(n["NetworkCardIndex"], n["DeviceIndex"], n["InterfaceType"]) for n in nics[1:]] == [
        (c, 0, "efa-only") for c in range(1, 32)]
    # the nodes are reached at their Elastic IPs, one each, on the primary interface, tagged as the cluster's
    assert sorted(n.host for n in result.nodes) == sorted(a["PublicIp"] for a in addresses) and len(addresses) == 2
    primaries = {i["NetworkInterfaces"][0]["NetworkInterfaceId"] for r in ec2.describe_instances(
        InstanceIds=[n.instance_id for n in result.nodes])["Reservations"] for i in r["Instances"]}
    assert {a["NetworkInterfaceId"] for a in addresses} == primaries and all(a["AssociationId"] for a in addresses)
    assert all({"Key": "gpucluster-cluster", "Value": "efa42"} in a["Tags"] for a in addresses)
    assert not [r for r in account.timed.refused if r[2] == "InvalidParameterCombination"]
    provider.down("efa42", _Quiet())
    assert _addresses(account)[1] == []  # disassociated, then released (ReleaseAddress refuses it associated)
    assert provider.leftovers("efa42").verified


def test_an_up_that_fails_after_allocating_an_address_releases_it(account):
    # the region's quota is taken between the preflight and the second AllocateAddress (another cluster):
    # the up fails naming EC2's code, and its attempt's destroy releases the address it did allocate
    ec2, _ = _addresses(account)
    account.timed.eip_quota = 3
    theirs = [ec2.allocate_address(Domain="vpc")["AllocationId"] for _ in range(2)]
    with pytest.raises(ProvisionError, match="AddressLimitExceeded"):
        account.provider().up(_p5_spec("efa43"), _Quiet())
    assert sorted(a["AllocationId"] for a in _addresses(account)[1]) == sorted(theirs)
    assert ("AllocateAddress", "", "AddressLimitExceeded") in account.timed.refused


def test_an_address_an_interrupted_up_left_outside_the_stack_is_found_and_released(account):
    # `up` killed between AllocateAddress(+tags) and the state write: the stack does not hold it, its tags do
    provider = account.provider()
    spec = _p5_spec("efa44")
    provider.up(spec, _Quiet())
    ec2, _ = _addresses(account)
    node = account.made["efa44"]
    iid = next(rid for kind, rid in node if kind == "instance")
    nic = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["NetworkInterfaces"][0]
    tags = [{"Key": k, "Value": v} for k, v in {**spec.managed_tags(), "Name": "efa44-ip-9"}.items()]
    lost = ec2.allocate_address(Domain="vpc", TagSpecifications=[{"ResourceType": "elastic-ip", "Tags": tags}])
    ec2.associate_address(AllocationId=lost["AllocationId"], NetworkInterfaceId=nic["NetworkInterfaceId"])
    with pytest.raises(Exception) as refused:  # what a plain release of it meets (ec2_addresses.py)
        ec2.release_address(AllocationId=lost["AllocationId"])
    assert "InvalidIPAddress.InUse" in str(refused.value)
    assert any(lo.kind == "elastic-ip" and lo.id == lost["AllocationId"] for lo in provider.leftovers("efa44").leftovers)
    provider.down("efa44", _Quiet())
    assert _addresses(account)[1] == []
    assert provider.leftovers("efa44").verified


def test_without_its_elastic_ips_a_node_with_every_card_is_unreachable(account, monkeypatch):
    # what the Elastic IPs are for: the same 32 interfaces and no address, and EC2 gives the nodes no public IPv4
    from gpucluster.infra.aws import component, outputs

    monkeypatch.setattr(outputs, "RUNNING_WAIT_S", 3.0)  # real seconds here: the nodes run after 0.4 s
    monkeypatch.setattr(component, "node_addresses", lambda name, cluster, hosts, tags, opts: [h.public_ip for h in hosts])
    with pytest.raises(ProvisionError, match="not running with a public IP"):
        account.provider().up(_p5_spec("efa45"), _Quiet())
    assert _addresses(account)[1] == []
