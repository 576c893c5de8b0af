"""The AWS component and the shared program under Pulumi's mock runtime (no CLI, no cloud)."""

from __future__ import annotations

import base64
import inspect
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("pulumi_aws")
pytest.importorskip("pulumi_tls")
import pulumi  # noqa: E402
import pulumi_aws as aws  # noqa: E402
import yaml  # noqa: E402

from gpucluster.errors import ConfigError, SpecError  # noqa: E402
from gpucluster.infra.aws import component  # noqa: E402
from gpucluster.infra.aws import user_data as boot  # noqa: E402
from gpucluster.infra import program  # noqa: E402
from gpucluster.infra.aws.mock_runtime import (  # noqa: E402
    MOCK_AMI_ID,
    MOCK_EXISTING_SUBNET,
    build,
    is_secret_input,
    private_ip,
    public_ip,
    unwrap,
)
from gpucluster.spec import ClusterSpec  # noqa: E402
from conftest import needs_torch  # noqa: E402
from specs import validate  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
STACK_FILE = ROOT / "stacks" / "Pulumi.aws-g5.yaml"

INSTANCE = "aws:ec2/instance:Instance"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
# Resource types that take no tags in AWS (checked against the classes below).
UNTAGGABLE = {
    "gpucluster:aws:GpuCluster": None,
    "pulumi:providers:aws": None,
    "tls:index/privateKey:PrivateKey": None,
    "aws:ec2/routeTableAssociation:RouteTableAssociation": aws.ec2.RouteTableAssociation,
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment": aws.iam.RolePolicyAttachment,
}


def spec(**kw) -> ClusterSpec:
    base = dict(
        cloud="aws",
        nodes=2,
        name="demo",
        region="us-east-1",
        instance_type="g5.xlarge",
        ssh_cidr="203.0.113.7/32",
        run_id="r20261122-031500-abc123",
        tags=(("team", "ml"),),
    )
    base.update(kw)
    if isinstance(base.get("options"), dict):
        base["options"] = tuple(sorted(base["options"].items()))
    return ClusterSpec(**base)


@pytest.fixture(scope="module")
def default():
    """One build of the default 2-node spec, shared by the read-only assertions."""
    built = build(spec())
    assert built.error is None
    return built


def user_data(template) -> dict:
    """The shared user data of the nodes' launch template (a template takes it base64-encoded)."""
    text = base64.b64decode(unwrap(template.inputs["userData"])).decode()
    assert text.startswith("#cloud-config\n")
    return yaml.safe_load(text)


def nodes_of(rec):
    """(the fleet, the launch template it launches every node from)."""
    fleet, template = rec.fleet(), rec.node_template()
    assert fleet is not None and template is not None
    (config,) = fleet.inputs["launchTemplateConfigs"]
    assert config["launchTemplateSpecification"]["launchTemplateId"] == template.name + "-id"
    return fleet, template


# -- structure --------------------------------------------------------------------------------


@pytest.mark.parametrize("nodes", [1, 3])
def test_all_nodes_in_one_instant_fleet_all_or_none_in_one_subnet_zone_and_placement_group(nodes):
    # issue 25: one RunInstances per node let node 0 bill while its peers failed on capacity. One
    # instant EC2 Fleet with min_target_capacity = the target launches all or none (EC2 API
    # reference, OnDemandOptionsRequest: MinTargetCapacity needs SingleInstanceType and
    # SingleAvailabilityZone; "If the minimum target capacity is not reached, the fleet launches no
    # instances"), and AWS recommends one request for a cluster placement group (EC2 User Guide).
    built = build(spec(nodes=nodes))
    rec = built.recorder
    assert rec.instances() == []  # no aws.ec2.Instance at all
    fleet, lt = nodes_of(rec)
    assert len(rec.of_type("aws:ec2/fleet:Fleet")) == 1
    i = fleet.inputs
    assert i["type"] == "instant" and i["terminateInstances"] is True
    assert i["targetCapacitySpecification"] == {"defaultTargetCapacityType": "on-demand",
                                                "totalTargetCapacity": nodes, "onDemandTargetCapacity": nodes}
    assert i["onDemandOptions"] == {"minTargetCapacity": nodes, "singleInstanceType": True,
                                    "singleAvailabilityZone": True}
    assert "spotOptions" not in i
    (subnet,) = rec.of_type("aws:ec2/subnet:Subnet")
    (pg,) = rec.of_type("aws:ec2/placementGroup:PlacementGroup")
    assert pg.inputs["strategy"] == "cluster"
    # the first zone (by name) where the mock says the type is offered
    assert subnet.inputs["availabilityZone"] == "us-east-1a" == built.outputs["availability_zone"]
    (override,) = i["launchTemplateConfigs"][0]["overrides"]
    assert override == {"instanceType": "g5.xlarge", "availabilityZone": "us-east-1a"}
    (nic,) = lt.inputs["networkInterfaces"]
    assert nic["subnetId"] == f"{subnet.name}-id" and nic["associatePublicIpAddress"] == "true"
    assert lt.inputs["placement"] == {"groupName": pg.name}
    assert len(built.outputs["instance_ids"]) == nodes
    # no host key is generated for the nodes any more: each makes its own (read from the console)
    assert [r.name for r in rec.of_type("tls:index/privateKey:PrivateKey")] == ["demo-login-key"]


def test_a_fleet_short_of_its_target_fails_the_program_with_ec2s_cause():
    # CreateFleet (type instant) answers a capacity shortage with no API error, only no instances and
    # an Errors list (aws/aws-parallelcluster-node#533: "In case of ICE create-fleet doesn't raise an
    # exception"), and terraform-provider-aws's resourceFleetCreate stores such a fleet as created
    # (it reads no Errors). The program must fail, naming EC2's cause, so `up` fails over.
    cause = ("InsufficientInstanceCapacity: We currently do not have sufficient g5.xlarge capacity in the "
             "Availability Zone you requested (us-east-1a).")
    built = build(spec(nodes=3), fleet_launches=0, fleet_error=cause)
    assert built.error is not None
    assert str(built.error).startswith("EC2 Fleet demo-fleet-id launched 0 of 3 instances (all or none): ")
    assert cause in str(built.error)
    from gpucluster.infra.aws.engine import CAPACITY_MARKERS, capacity_zones

    assert any(m in str(built.error) for m in CAPACITY_MARKERS)
    assert capacity_zones(spec(), str(built.error), zone_lister=lambda r, t: ["us-east-1a", "us-east-1b"])[:2] == (
        "us-east-1a", ["us-east-1b"])


def test_zone_from_the_spec_skips_the_offerings_lookup():
    rec = build(spec(zone="us-east-1f")).recorder
    assert rec.of_type("aws:ec2/subnet:Subnet")[0].inputs["availabilityZone"] == "us-east-1f"
    assert rec.calls_to("aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings") == []


def test_offerings_lookup_filters_on_the_instance_type(default):
    (call,) = default.recorder.calls_to("aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings")
    assert call.args["locationType"] == "availability-zone"
    assert call.args["filters"] == [{"name": "instance-type", "values": ["g5.xlarge"]}]


def test_existing_subnet_from_options_creates_no_network():
    built = build(spec(options={"vpcId": "vpc-0existing", "subnetId": "subnet-0existing"}))
    rec = built.recorder
    for typ in ("aws:ec2/vpc:Vpc", "aws:ec2/subnet:Subnet", "aws:ec2/internetGateway:InternetGateway"):
        assert rec.of_type(typ) == []
    (call,) = rec.calls_to("aws:ec2/getSubnet:getSubnet")
    assert call.args["id"] == "subnet-0existing"
    assert rec.of_type("aws:ec2/securityGroup:SecurityGroup")[0].inputs["vpcId"] == "vpc-0existing"
    assert nodes_of(rec)[1].inputs["networkInterfaces"][0]["subnetId"] == "subnet-0existing"
    assert built.outputs["availability_zone"] == MOCK_EXISTING_SUBNET["availabilityZone"]


def test_ami_lookup_filters_and_override(default):
    (call,) = default.recorder.calls_to("aws:ec2/getAmi:getAmi")
    assert call.args["owners"] == ["amazon"]
    assert call.args["mostRecent"] is True
    filters = {f["name"]: f["values"] for f in call.args["filters"]}
    # the PyTorch DLAMI (torch at /opt/pytorch/bin/python, G5 supported), AWS DLAMI release notes
    # the Ubuntu releases checked, pinned (issue 40 item 11): not "Ubuntu 2?.04", which takes 26.04 too
    assert filters["name"] == ["Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.* (Ubuntu 22.04) *",
                               "Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.* (Ubuntu 24.04) *"]
    assert filters["architecture"] == ["x86_64"]
    lt = nodes_of(default.recorder)[1]
    assert lt.inputs["imageId"] == MOCK_AMI_ID
    assert lt.inputs["blockDeviceMappings"][0]["deviceName"] == "/dev/sda1"  # the AMI's root device
    assert default.outputs["node_python"] == "/opt/pytorch/bin/python"
    assert boot.SETUP_TORCH_PATH not in json.dumps(user_data(lt))

    base = build(spec(options={"image": "base"})).recorder
    (call,) = base.calls_to("aws:ec2/getAmi:getAmi")
    assert {f["name"]: f["values"] for f in call.args["filters"]}["name"] == [
        "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)*"]
    doc = user_data(nodes_of(base)[1])
    # the Base DLAMI has no torch: a setup step installs it at the same path, before the ready check
    assert doc["runcmd"][2:] == [[boot.SETUP_TORCH_PATH], [boot.READY_SCRIPT_PATH]]
    setup = _written(doc, boot.SETUP_TORCH_PATH)
    assert "/opt/pytorch/bin/python" in setup and "apt-get -o DPkg::Lock::Timeout=600 -o Acquire::Retries=3 update" in setup
    # what it does is run in a sandbox by tests/test_aws_node_setup.py

    rec = build(spec(options={"ami": "ami-0pinned"}, disk_gb=120)).recorder
    assert rec.calls_to("aws:ec2/getAmi:getAmi") == []
    assert nodes_of(rec)[1].inputs["imageId"] == "ami-0pinned"
    # without --disk-gb the pinned image is read by its id, only to size the root for it (issue 42, rootdisk.py)
    rec = build(spec(options={"ami": "ami-0pinned"})).recorder
    (call,) = rec.calls_to("aws:ec2/getAmi:getAmi")
    assert call.args["filters"] == [{"name": "image-id", "values": ["ami-0pinned"]}]
    assert nodes_of(rec)[1].inputs["imageId"] == "ami-0pinned"


def test_instances_require_imdsv2_encrypted_gp3_root_and_terminate_on_shutdown():
    rec = build(spec(disk_gb=250)).recorder
    fleet, lt = nodes_of(rec)
    assert lt.inputs["metadataOptions"]["httpTokens"] == "required"
    (root,) = lt.inputs["blockDeviceMappings"]
    assert root["ebs"] == {"volumeType": "gp3", "encrypted": "true", "volumeSize": 250, "deleteOnTermination": "true"}
    assert lt.inputs["instanceInitiatedShutdownBehavior"] == "terminate"
    assert "instanceMarketOptions" not in lt.inputs  # the market is the fleet's
    assert fleet.inputs["targetCapacitySpecification"]["defaultTargetCapacityType"] == "on-demand"


def test_spot_is_one_time_and_terminates_on_interruption():
    # an instant fleet's spot requests are one-time by nature (EC2 Fleet: "instant" places a
    # synchronous one-time request); all or none as on-demand, terminated on interruption
    rec = build(spec(spot=True, nodes=2)).recorder
    fleet, lt = nodes_of(rec)
    assert fleet.inputs["targetCapacitySpecification"] == {"defaultTargetCapacityType": "spot",
                                                           "totalTargetCapacity": 2, "spotTargetCapacity": 2}
    assert fleet.inputs["spotOptions"] == {"instanceInterruptionBehavior": "terminate", "minTargetCapacity": 2,
                                           "singleInstanceType": True, "singleAvailabilityZone": True}
    assert "onDemandOptions" not in fleet.inputs and "instanceMarketOptions" not in lt.inputs


# -- security group ---------------------------------------------------------------------------


def _ssh_rules(rec):
    return [r for r in rec.of_type(INGRESS) if r.inputs.get("fromPort") == 22]


def test_ssh_only_from_the_callers_cidr_and_members_talk_freely(default):
    rec = default.recorder
    (sg,) = rec.of_type("aws:ec2/securityGroup:SecurityGroup")
    sg_id = f"{sg.name}-id"
    assert "ingress" not in sg.inputs and "egress" not in sg.inputs  # rules are separate resources
    (ssh,) = _ssh_rules(rec)
    assert ssh.inputs["cidrIpv4"] == "203.0.113.7/32"
    assert (ssh.inputs["ipProtocol"], ssh.inputs["toPort"]) == ("tcp", 22)
    for rule in rec.of_type(INGRESS):
        assert rule.inputs.get("cidrIpv4") not in ("0.0.0.0/0",) and rule.inputs.get("cidrIpv6") != "::/0"
    members = [
        r
        for r in rec.of_type(INGRESS)
        if r.inputs.get("referencedSecurityGroupId") == sg_id and r.inputs["ipProtocol"] == "-1"
    ]
    assert len(members) == 1 and members[0].inputs["securityGroupId"] == sg_id
    egress = rec.of_type("aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule")
    assert any(r.inputs.get("referencedSecurityGroupId") == sg_id for r in egress)
    assert nodes_of(rec)[1].inputs["networkInterfaces"][0]["securityGroups"] == [sg_id]


def test_no_ssh_cidr_means_no_ssh_rule_and_open_ssh_only_when_asked():
    assert _ssh_rules(build(spec(ssh_cidr=None)).recorder) == []
    refused = build(spec(ssh_cidr="0.0.0.0/0"))
    assert isinstance(refused.error, SpecError) and refused.recorder.resources == []
    opened = build(spec(ssh_cidr="0.0.0.0/0", options={"allowOpenSsh": "true"})).recorder
    assert [r.inputs["cidrIpv4"] for r in _ssh_rules(opened)] == ["0.0.0.0/0"]
    # issue 25: the VPC is IPv4 only, so an IPv6 CIDR is refused before anything is declared
    v6 = build(spec(ssh_cidr="2001:db8::/64"))
    assert isinstance(v6.error, SpecError) and "IPv4 only" in str(v6.error) and v6.recorder.resources == []


def test_no_iam_unless_the_nodes_need_a_role(default):
    # issue 25: PowerUser-style credentials (no iam:*) failed every run at iam:CreateRole, although a
    # default run's nodes use no AWS API. Now the role, its policies and the profile exist only for a
    # reason (s3 URLs, option ssm), so a default run needs no IAM writes and no iam:PassRole.
    rec = default.recorder
    assert [r for r in rec.resources if r.typ.startswith("aws:iam/")] == []
    assert nodes_of(rec)[1].inputs.get("iamInstanceProfile") is None

    rec = build(spec(options={"ssm": "true"})).recorder
    (role,) = rec.of_type("aws:iam/role:Role")
    policy = json.loads(role.inputs["assumeRolePolicy"])
    assert policy["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}
    attachments = rec.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    assert [a.inputs["policyArn"] for a in attachments] == [component.SSM_POLICY_ARN]
    assert rec.of_type("aws:iam/rolePolicy:RolePolicy") == []
    (profile,) = rec.of_type("aws:iam/instanceProfile:InstanceProfile")
    assert nodes_of(rec)[1].inputs["iamInstanceProfile"] == {"name": profile.name}
    # s3 without ssm: the scoped inline policy and no SSM attachment
    rec = build(spec(reads=("s3://bkt/data",))).recorder
    assert len(rec.of_type("aws:iam/rolePolicy:RolePolicy")) == 1
    assert rec.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment") == []
    assert len(rec.of_type("aws:iam/instanceProfile:InstanceProfile")) == 1
    bad = build(spec(options={"ssm": "maybe"}))
    assert isinstance(bad.error, SpecError) and "ssm" in str(bad.error) and bad.recorder.resources == []


def test_efa_interfaces_without_elastic_ips_when_asked():
    # issue 25: one Elastic IP per EFA node hit the default quota of 5 EIPs per region at 6 nodes.
    # A single EFA interface takes a public IPv4 assigned at launch (EC2 assigns none to an instance
    # launched with several interfaces: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/using-instance-addressing.html),
    # set in the launch template's interface 0 (as SkyPilot launches EFA nodes).
    built = build(spec(instance_type="g5.8xlarge", options={"efa": "true"}, nodes=8))
    rec = built.recorder
    assert rec.of_type("aws:ec2/eip:Eip") == []
    assert rec.of_type("aws:ec2/networkInterface:NetworkInterface") == []
    (lt,) = rec.of_type("aws:ec2/launchTemplate:LaunchTemplate")  # the one template of the fleet
    fleet, _ = nodes_of(rec)
    (nic,) = lt.inputs["networkInterfaces"]
    assert nic["interfaceType"] == "efa" and nic["associatePublicIpAddress"] == "true"
    assert nic["deviceIndex"] == 0 and nic["subnetId"] and nic["securityGroups"]
    assert fleet.inputs["targetCapacitySpecification"]["totalTargetCapacity"] == 8
    assert built.outputs["public_ips"] == [f"198.51.100.{10 + i}" for i in range(8)]  # the instances' own
    # and no EFA interface without the option
    plain = build(spec(instance_type="g5.8xlarge")).recorder
    assert "interfaceType" not in nodes_of(plain)[1].inputs["networkInterfaces"][0]


# -- tags -------------------------------------------------------------------------------------


def test_untaggable_list_is_honest():
    for typ, cls in UNTAGGABLE.items():
        if cls is not None:
            assert "tags" not in inspect.signature(cls._internal_init).parameters, typ


@pytest.mark.parametrize("efa", [False, True])
def test_every_taggable_resource_carries_the_cluster_tags(efa):
    # with a node role (option ssm), so the role and its profile are checked too
    s = spec(instance_type="g5.12xlarge", options={"efa": "true", "ssm": "true"} if efa else {"ssm": "true"})
    rec = build(s).recorder
    want = {
        "managed-by": "gpucluster",
        "gpucluster-cluster": "demo",
        "gpucluster-run": "r20261122-031500-abc123",
        "team": "ml",
    }
    checked = 0
    for r in rec.resources:
        if r.typ in UNTAGGABLE:
            continue
        tags = r.inputs.get("tags")
        assert tags is not None, f"{r.typ} {r.name} has no tags"
        assert want.items() <= tags.items(), (r.typ, tags)
        checked += 1
    assert checked >= 15
    # what the fleet launches is tagged by the template: instances, their root volumes, interfaces
    specs = {t["resourceType"]: t["tags"] for t in nodes_of(rec)[1].inputs["tagSpecifications"]}
    assert set(specs) == {"instance", "volume", "network-interface"}
    for tags in specs.values():
        assert want.items() <= tags.items()


# -- outputs and secrets ----------------------------------------------------------------------


def test_outputs_are_head_first_and_complete():
    built = build(spec(nodes=5))
    out = built.outputs
    # ranks are the fleet's instances sorted by id; each one's addresses from ec2.getInstance
    assert out["instance_ids"] == [f"i-0mock{i:012d}" for i in range(5)]
    assert out["fleet_id"] == "demo-fleet-id"
    calls = built.recorder.calls_to("aws:ec2/getInstance:getInstance")
    assert sorted(c.args["instanceId"] for c in calls) == out["instance_ids"]
    assert out["private_ips"] == [private_ip(i) for i in range(5)]
    assert out["public_ips"] == [public_ip(i) for i in range(5)]
    assert "host_public_keys" not in out  # read from each node's console, not made by the program
    assert (out["ssh_user"], out["region"], out["instance_type"], out["gpus_per_node"]) == (
        "ubuntu",
        "us-east-1",
        "g5.xlarge",
        1,
    )
    assert out["cluster_name"] == "demo"
    assert out["ssh_private_key"].startswith("-----BEGIN OPENSSH PRIVATE KEY-----")


def test_secrets_are_marked_secret(default):
    assert default.secret["ssh_private_key"] is True
    for key in ("instance_ids", "private_ips", "public_ips", "fleet_id", "ssh_user"):
        assert default.secret[key] is False, key
    # the shared user data holds no private key any more (nodes make their own host keys)
    doc = user_data(nodes_of(default.recorder)[1])
    assert "PRIVATE KEY" not in json.dumps(doc) and "ssh_keys" not in doc


def test_users_public_key_replaces_the_generated_one():
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIuser me@laptop"
    built = build(spec(options={"sshPublicKey": key}))
    rec = built.recorder
    assert rec.of_type("aws:ec2/keyPair:KeyPair")[0].inputs["publicKey"] == key
    names = [r.name for r in rec.of_type("tls:index/privateKey:PrivateKey")]
    assert names == []  # no login key generated, and no host keys (the nodes make their own)
    assert built.outputs["ssh_private_key"] is None and built.secret["ssh_private_key"] is True


# -- user data: host keys, dead-man switch, readiness -----------------------------------------


def test_user_data_makes_a_new_host_key_and_prints_it_to_the_console_first(default, tmp_path):
    doc = user_data(nodes_of(default.recorder)[1])
    # the image's keys go (a snapshot's keys are shared by every copy); one ed25519 key per node
    assert doc["ssh_deletekeys"] is True and doc["ssh_genkeytypes"] == ["ed25519"]
    assert doc["ssh"] == {"emit_keys_to_console": True} and doc["ssh_key_console_blacklist"] == []
    # first in runcmd (cloud-init's own keys_to_console only runs after runcmd, i.e. after the GPU wait)
    assert doc["runcmd"][0] == ["sh", "-c", boot.PRINT_HOST_KEY]
    # what it prints is what the launcher parses
    from gpucluster.infra.aws.hostkeys import key_from_console

    pub = tmp_path / "ssh_host_ed25519_key.pub"
    pub.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOnode root@ip-10-42-0-10\n")
    out = subprocess.run(["sh", "-c", boot.PRINT_HOST_KEY.replace("/etc/ssh/ssh_host_ed25519_key.pub", str(pub))
                          .replace("> /dev/console", "")], capture_output=True, text=True, check=True).stdout
    assert key_from_console(out) == "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOnode"


def _fake_bin(tmp_path, name: str, body: str) -> pathlib.Path:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    path = bindir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return bindir


def _env(tmp_path, bindir, **extra):
    # the node's PyTorch Python is this test's interpreter (torch installed) unless a test says otherwise
    return {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "GPUCLUSTER_STATE_DIR": str(tmp_path / "state"),
            "GPUCLUSTER_NODE_PYTHON": sys.executable, **extra}


def _written(doc: dict, path: str) -> str:
    (entry,) = [f for f in doc["write_files"] if f["path"] == path]
    return entry["content"]


def _script(tmp_path, doc: dict, path: str) -> pathlib.Path:
    script = tmp_path / pathlib.Path(path).name
    script.write_text(_written(doc, path))
    script.chmod(0o755)
    return script


def test_dead_man_switch_carries_the_lifetime_and_survives_reboots(tmp_path):
    rec = build(spec(max_lifetime_minutes=90)).recorder
    doc = user_data(nodes_of(rec)[1])
    # armed right after the host key is printed (before the GPU check), by a unit that runs on every boot
    assert doc["runcmd"][1] == ["systemctl", "enable", "--now", "--no-block", boot.DEADMAN_UNIT]
    unit = _written(doc, f"/etc/systemd/system/{boot.DEADMAN_UNIT}")
    assert f"ExecStart={boot.DEADMAN_SCRIPT_PATH}" in unit and "WantedBy=multi-user.target" in unit
    script = _script(tmp_path, doc, boot.DEADMAN_SCRIPT_PATH)
    assert "60 * 90" in script.read_text()

    log = tmp_path / "shutdown.log"
    bindir = _fake_bin(tmp_path, "shutdown", f'echo "$@" >> {log}\n')
    env = _env(tmp_path, bindir)
    before = int(time.time())
    subprocess.run([str(script)], env=env, check=True, timeout=10)
    deadline = int((tmp_path / "state" / "deadline").read_text())
    assert before + 90 * 60 <= deadline <= int(time.time()) + 90 * 60
    assert log.read_text().splitlines()[0].startswith("-P +90 ")

    # a "reboot" 80 minutes later re-arms for the 10 minutes left, not for another 90
    (tmp_path / "state" / "deadline").write_text(str(int(time.time()) + 10 * 60 - 5))
    subprocess.run([str(script)], env=env, check=True, timeout=10)
    assert log.read_text().splitlines()[1].startswith("-P +10 ")
    # past the deadline: power off now
    (tmp_path / "state" / "deadline").write_text(str(int(time.time()) - 1))
    subprocess.run([str(script)], env=env, check=True, timeout=10)
    assert log.read_text().splitlines()[2].startswith("-P now")


def _ready_script(tmp_path, s: ClusterSpec) -> pathlib.Path:
    doc = user_data(nodes_of(build(s).recorder)[1])
    assert doc["runcmd"][2] == [boot.READY_SCRIPT_PATH]
    return _script(tmp_path, doc, boot.READY_SCRIPT_PATH)


@pytest.mark.integration  # a real process or server: not in `make test-fast`
@needs_torch  # the node's check imports torch with the Python it is given (here this one)
def test_readiness_marker_reports_the_gpu_check(tmp_path):
    script = _ready_script(tmp_path, spec(instance_type="g5.12xlarge"))
    marker = tmp_path / "state" / "ready"

    bindir = _fake_bin(tmp_path, "nvidia-smi", "for i in 1 2 3 4; do echo 550.127.05; done\n")
    subprocess.run([str(script), "3"], env=_env(tmp_path, bindir, GPUCLUSTER_READY_TRIES="1"), check=True, timeout=20)
    result = json.loads(marker.read_text())
    assert result["ok"] is True and result["gpus"] == 4 and result["expected_gpus"] == 4
    assert result["driver"] == "550.127.05" and result["cluster"] == "demo" and "rank" not in result  # one user data for all nodes

    _fake_bin(tmp_path, "nvidia-smi", "echo 550.127.05\n")  # one GPU missing
    subprocess.run([str(script)], env=_env(tmp_path, bindir, GPUCLUSTER_READY_TRIES="1"), check=True, timeout=20)
    result = json.loads(marker.read_text())
    assert (result["ok"], result["gpus"], result["expected_gpus"]) == (False, 1, 4)

    _fake_bin(tmp_path, "nvidia-smi", 'echo "NVIDIA-SMI has failed because it couldn\'t communicate"; exit 9\n')
    subprocess.run([str(script)], env=_env(tmp_path, bindir, GPUCLUSTER_READY_TRIES="1"), check=True, timeout=20)
    result = json.loads(marker.read_text())
    assert result["ok"] is False and result["gpus"] == 0 and "NVIDIA-SMI has failed" in result["error"]

    # GPUs fine but no torch at the node's Python: not ready, and the marker says why
    _fake_bin(tmp_path, "nvidia-smi", "for i in 1 2 3 4; do echo 550.127.05; done\n")
    no_torch = _fake_bin(tmp_path, "bare-python", "exit 1\n") / "bare-python"
    subprocess.run([str(script)], env=_env(tmp_path, bindir, GPUCLUSTER_READY_TRIES="1",
                                           GPUCLUSTER_NODE_PYTHON=str(no_torch)), check=True, timeout=20)
    result = json.loads(marker.read_text())
    assert result["ok"] is False and result["gpus"] == 4 and "torch is not importable" in result["error"]


# -- the program: stack config -> spec -> refused or declared ---------------------------------


def _stack_config() -> dict:
    doc = yaml.safe_load(STACK_FILE.read_text())
    return {k.split(":", 1)[1]: v for k, v in doc["config"].items() if k.startswith("gpucluster:")}


def test_stack_example_parses_into_a_valid_spec():
    s = program.spec_from_config(_stack_config(), "aws-g5")
    # sshCidr is not in the example: `pulumi up` fills in the caller's address (tests/test_stacks.py)
    assert s.ssh_cidr is None
    from gpucluster.infra.aws.catalog import prepare as resolve_spec

    s, _ = resolve_spec(s, detect=lambda: "198.51.100.23")
    assert (s.cloud, s.nodes, s.instance_type, s.region) == ("aws", 2, "g5.xlarge", "us-east-1")
    assert s.tag_dict == {"team": "ml", "purpose": "example"}
    assert s.option("efa") == "false"
    assert validate(s) == []
    # the same values as Pulumi hands them to the program (strings, objects as JSON)
    as_strings = {k: json.dumps(v) if isinstance(v, dict) else str(v).lower() if isinstance(v, bool) else str(v)
                  for k, v in _stack_config().items()}
    assert resolve_spec(program.spec_from_config(lambda: as_strings, "aws-g5"),
                        detect=lambda: "198.51.100.23")[0] == s
    built = build(s)
    assert built.error is None and len(built.outputs["instance_ids"]) == 2


def test_spec_from_config_defaults_name_and_options():
    s = program.spec_from_config({"cloud": "aws", "efa": True, "allowOpenSsh": "true"}, "My_Stack.Dev")
    assert s.name == "my-stack-dev" and s.nodes == 1
    assert s.option_dict == {"allowOpenSsh": "true", "efa": "true"}
    assert program.sanitize_name("9lives") == "gc-9lives"
    with pytest.raises(ConfigError, match="gpucluster:cloud"):
        program.spec_from_config({"nodes": 2}, "x")
    with pytest.raises(SpecError, match="gpucluster:nodes"):
        program.spec_from_config({"cloud": "aws", "nodes": "two"}, "x")
    with pytest.raises(SpecError, match="gpucluster:spot 'sometimes'"):
        program.spec_from_config({"cloud": "aws", "spot": "sometimes"}, "x")
    with pytest.raises(ConfigError, match='did you mean "gpucluster:instanceType"'):
        program.spec_from_config({"cloud": "aws", "instance_type": "g5.xlarge"}, "x")
    with pytest.raises(ConfigError, match="gpucluster:tags"):
        program.spec_from_config({"cloud": "aws", "tags": "[1"}, "x")


BAD = {
    "unknown type": dict(instance_type="g5.xlarg"),
    "region not offered": dict(region="us-west-1"),
    "too many nodes": dict(nodes=65),
    "no nodes": dict(nodes=0),
    "gpus mismatch": dict(gpus_per_node=8),
    "spot stop": dict(spot=True, options={"spotInterruptionBehavior": "stop"}),
    "efa unsupported": dict(options={"efa": "true"}),
    "open ssh": dict(ssh_cidr="0.0.0.0/0"),
    "bad cidr": dict(ssh_cidr="my laptop"),
    "unknown option": dict(options={"vpcid": "vpc-1"}),
    "bad name": dict(name="Demo_1"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_every_bad_spec_is_refused_before_any_resource_is_declared(case):
    built = build(spec(**BAD[case]))
    assert isinstance(built.error, SpecError), case
    assert built.recorder.resources == [] and built.recorder.calls == []
    assert built.outputs == {}


def test_main_reads_the_stack_namespace_and_exports():
    config = {f"gpucluster:{k}": v for k, v in {
        "cloud": "aws", "nodes": "3", "region": "eu-west-1", "sshCidr": "198.51.100.0/24",
        "maxLifetimeMinutes": "30", "efa": "false",
    }.items()}
    config["other:ignored"] = "x"
    config["aws:profile"] = "research"
    pulumi.runtime.config.set_all_config(config)
    try:
        built = build(program=lambda: program.main() or {}, stack="Team.Run-1")
    finally:
        pulumi.runtime.config.set_all_config({})
    assert built.error is None
    rec = built.recorder
    fleet, lt = nodes_of(rec)
    assert fleet.inputs["targetCapacitySpecification"]["totalTargetCapacity"] == 3
    (provider,) = rec.of_type("pulumi:providers:aws")
    assert (provider.inputs["region"], provider.inputs["profile"]) == ("eu-west-1", "research")
    assert lt.inputs["tagSpecifications"][0]["tags"]["gpucluster-cluster"] == "team-run-1"
    assert "60 * 30" in _written(user_data(lt), boot.DEADMAN_SCRIPT_PATH)


def test_outputs_become_a_head_first_cluster_without_the_secret_in_plain_outputs():
    from gpucluster.errors import ProvisionError
    from gpucluster.infra.aws.outputs import cluster_from_outputs

    built = build(spec(nodes=3, instance_type="g5.12xlarge"))
    cluster = cluster_from_outputs(built.outputs)
    assert [n.rank for n in cluster.nodes] == [0, 1, 2]
    assert cluster.head.private_ip == private_ip(0) and cluster.head.host == public_ip(0)
    assert cluster.node_ips == [private_ip(i) for i in range(3)]
    assert [n.instance_id for n in cluster.nodes] == built.outputs["instance_ids"]
    assert [n.host_keys for n in cluster.nodes] == [(), (), ()]  # pinned from the console next (hostkeys.pin)
    # a stack made before the fleet still carries its host keys, and they are used
    old = cluster_from_outputs(dict(built.outputs, host_public_keys=["ssh-ed25519 AAAA0", "ssh-ed25519 AAAA1",
                                                                     "ssh-ed25519 AAAA2"]))
    assert [n.host_keys for n in old.nodes] == [("ssh-ed25519 AAAA0",), ("ssh-ed25519 AAAA1",), ("ssh-ed25519 AAAA2",)]
    assert {(n.user, n.gpus) for n in cluster.nodes} == {("ubuntu", 4)}
    assert (cluster.region, cluster.zone, cluster.instance_type) == ("us-east-1", "us-east-1a", "g5.12xlarge")
    assert cluster.ssh_private_key.startswith("-----BEGIN OPENSSH")
    assert "ssh_private_key" not in cluster.outputs

    broken = dict(built.outputs, public_ips=built.outputs["public_ips"][:2])
    with pytest.raises(ProvisionError, match="disagree on the node count"):
        cluster_from_outputs(broken)
    with pytest.raises(ProvisionError, match="lack public_ips"):
        cluster_from_outputs({k: v for k, v in built.outputs.items() if k != "public_ips"})


def test_the_template_and_the_fleet_wait_for_every_security_group_rule(monkeypatch):
    """Issue 40 item 12: the rules are resources of their own (aws.vpc.SecurityGroupIngressRule /
    EgressRule); without a dependency the engine may create the fleet first, and a node's first
    seconds of boot lack egress (package mirrors) or the members' rule EFA needs."""
    from gpucluster.infra.aws import component, mock_runtime
    from gpucluster.spec import ClusterSpec

    seen: list[tuple[str, list[str]]] = []
    real = component.GpuCluster._opts

    def opts(self, **kw):
        if kw.get("depends_on") is not None:
            seen.append(("deps", [r._name for r in kw["depends_on"]]))
        return real(self, **kw)

    monkeypatch.setattr(component.GpuCluster, "_opts", opts)
    spec = ClusterSpec(cloud="aws", nodes=2, name="deps40", region="us-east-1", instance_type="g5.xlarge",
                       ssh_cidr="203.0.113.7/32", gpus_per_node=1, run_id="r20261128-000000-aaaaaa")
    built = mock_runtime.build(spec)
    assert built.error is None, built.error
    rules = {r.name for r in built.recorder.resources if r.typ.startswith("aws:vpc/securityGroup")}
    assert rules == {"deps40-in-members", "deps40-out-members", "deps40-out-all", "deps40-in-ssh"}
    waits = [set(names) for _, names in seen]
    assert len([w for w in waits if rules <= w]) == 2, waits  # the launch template and the fleet
