"""All nodes in one request (issue 25 item 2): the instant EC2 Fleet's host keys from the serial
console, its capacity failure, its ledger row and price, and its leftover scan and delete.

The stand-ins, each as AWS behaves at its worst, with its public source:

- the console (`LateConsole`): GetConsoleOutput answers base64 text (EC2 API reference,
  GetConsoleOutput) with boot noise and carriage returns, and shows the host key block only once the
  node has booted and cloud-init's init stage made the key; before that, no block, or a block cut
  off mid-write; for some nodes never (canonical/cloud-init#3822: keys missing from the console);
  and the call itself may be throttled (EC2 API reference, "Request throttling": RequestLimitExceeded).
  The old, kinder stand-in was the stack output that carried each node's key at once.
- CreateFleet of type instant short of capacity creates the fleet and launches nothing, with no API
  error, only `Errors` (aws/aws-parallelcluster-node#533: "In case of ICE create-fleet doesn't raise
  an exception"; terraform-provider-aws ec2_fleet.go resourceFleetCreate reads no `Errors`).
- DescribeFleets keeps a deleted fleet listed in a `deleted*` state (EC2 API reference, FleetStateCode:
  deleted, deleted_running, deleted_terminating); moto 5.2.5 keeps it listed for ever, which is worse.
"""

from __future__ import annotations

import base64
import sys
from decimal import Decimal
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

sys.path.insert(0, str(Path(__file__).parent))

from gpucluster.domain import Cluster, Node  # noqa: E402
from gpucluster.errors import ProvisionError  # noqa: E402
from gpucluster.infra.aws import hostkeys  # noqa: E402

KEY0 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFnode0key0000000000000000000000000000000000"
KEY1 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFnode1key1111111111111111111111111111111111"
NOISE = ("[    0.000000] Linux version 6.8.0-1019-aws (buildd@lcy02-amd64-012)\r\n"
         "[    4.211007] cloud-init[512]: Cloud-init v. 24.4 running 'init-local'\r\n")


def block(key: str, host: str = "ip-10-42-0-10") -> str:
    # cloud-init's keys_to_console format (canonical/cloud-init#2224), other key types included
    return ("-----BEGIN SSH HOST KEY KEYS-----\r\n"
            f"ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTY root@{host}\r\n"
            f"{key} root@{host}\r\n"
            "-----END SSH HOST KEY KEYS-----\r\n")


class Clock:
    def __init__(self):
        self.t = 0.0

    def now(self):
        return self.t

    def sleep(self, s):
        self.t += s


class LateConsole:
    """GetConsoleOutput of instances whose key block appears at `at[id]` seconds (None: never)."""

    def __init__(self, clock: Clock, keys: dict[str, str], at: dict[str, float | None], throttle_first: int = 0):
        self.clock, self.keys, self.at = clock, keys, at
        self.calls: list[tuple[str, bool]] = []
        self.throttle = throttle_first

    def get_console_output(self, InstanceId: str, Latest: bool = False):  # noqa: N803 - boto3's names
        from botocore.exceptions import ClientError

        self.calls.append((InstanceId, Latest))
        if self.throttle:
            self.throttle -= 1
            raise ClientError({"Error": {"Code": "RequestLimitExceeded", "Message": "Request limit exceeded."}},
                              "GetConsoleOutput")
        at = self.at.get(InstanceId)
        text = NOISE
        if at is not None and self.clock.now() >= at:
            text += block(self.keys[InstanceId])
        elif at is not None and self.clock.now() >= at - 5:
            text += block(self.keys[InstanceId])[:60]  # the block being written: cut off
        return {"InstanceId": InstanceId, "Output": base64.b64encode(text.encode()).decode()}


def cluster(ids=("i-0aaa", "i-0bbb")) -> Cluster:
    return Cluster(name="demo", cloud="aws", region="us-east-1",
                   nodes=tuple(Node(rank=r, host=f"198.51.100.{10 + r}", private_ip=f"10.42.0.{10 + r}",
                                    user="ubuntu", instance_id=i) for r, i in enumerate(ids)))


# -- parsing ------------------------------------------------------------------------------------


def test_the_key_is_read_only_from_a_complete_block():
    assert hostkeys.key_from_console(NOISE) is None
    assert hostkeys.key_from_console(NOISE + block(KEY0)) == KEY0
    assert hostkeys.key_from_console(NOISE + block(KEY0)[:80]) is None  # cut off
    only_ecdsa = block(KEY0).replace(KEY0 + " root@ip-10-42-0-10\r\n", "")
    assert hostkeys.key_from_console(only_ecdsa) is None
    # a reboot prints the block again; the last complete one counts
    assert hostkeys.key_from_console(block(KEY0) + "[  600.1] reboot\r\n" + block(KEY1)) == KEY1
    # the user data's own print (no carriage returns) reads the same
    assert hostkeys.key_from_console(block(KEY0).replace("\r", "")) == KEY0


# -- pinning ------------------------------------------------------------------------------------


def test_keys_printed_late_are_waited_for_pinned_and_cached(tmp_path):
    clock = Clock()
    console = LateConsole(clock, {"i-0aaa": KEY0, "i-0bbb": KEY1}, {"i-0aaa": 40.0, "i-0bbb": 95.0},
                          throttle_first=2)
    pinned = hostkeys.pin(cluster(), client=console, timeout=600, poll=5, sleep=clock.sleep, clock=clock.now,
                          cache=tmp_path)
    assert [n.host_keys for n in pinned.nodes] == [(KEY0,), (KEY1,)]
    assert all(latest for _, latest in console.calls)  # Latest=True: the live console, not the boot buffer
    assert 95 <= clock.t <= 100  # it waited for the later node, and no longer
    assert (tmp_path / "i-0aaa").read_text().strip() == KEY0
    # reaching the kept cluster later: from the cache, even once the console has scrolled on
    console.calls.clear()
    console.at = {"i-0aaa": None, "i-0bbb": None}
    again = hostkeys.pin(cluster(), client=console, timeout=0, cache=tmp_path)
    assert [n.host_keys for n in again.nodes] == [(KEY0,), (KEY1,)] and console.calls == []


def test_a_node_whose_console_never_shows_a_key_is_not_reached_and_named(tmp_path):
    clock = Clock()
    console = LateConsole(clock, {"i-0aaa": KEY0, "i-0bbb": KEY1}, {"i-0aaa": 10.0, "i-0bbb": None})
    with pytest.raises(ProvisionError) as err:
        hostkeys.pin(cluster(), client=console, timeout=120, poll=5, sleep=clock.sleep, clock=clock.now,
                     cache=tmp_path)
    msg = str(err.value)
    assert msg.startswith("1 of 2 node(s) showed no ssh host key on the serial console within 120 s")
    assert "node 1 (i-0bbb): no host key block on the console yet" in msg and "i-0aaa" not in msg
    assert "no trust on first use" in msg
    assert 120 <= clock.t <= 125
    assert not (tmp_path / "i-0bbb").exists()


def test_stacks_made_before_the_fleet_keep_their_exported_keys():
    pinned_already = Cluster(name="old", cloud="aws", nodes=(Node(0, "h", "p", instance_id="i-1", host_keys=(KEY0,)),))

    class NoConsole:
        def get_console_output(self, **kw):
            raise AssertionError("not asked")

    assert hostkeys.pin(pinned_already, client=NoConsole(), cache=False) is pinned_already


def test_up_pins_the_keys_before_it_returns_the_cluster(home, monkeypatch):
    """The plugin's cluster_from_outputs is what `up` and `attach` use: the keys come from the console."""
    pytest.importorskip("pulumi.automation")
    from pulumi_fake import AWS_FLEET_RESOURCES, FakePulumiCommand, aws_outputs
    from test_automation import Recorder, provider, spec

    outputs = aws_outputs()
    del outputs["host_public_keys"]
    ids = outputs["instance_ids"]
    clock = Clock()
    console = LateConsole(clock, dict(zip(ids, (KEY0, KEY1))), {ids[0]: 0.0, ids[1]: 0.0})
    monkeypatch.setattr(hostkeys, "client_for", lambda region: console)
    fake = FakePulumiCommand(resources=AWS_FLEET_RESOURCES, outputs=outputs)
    got = provider(fake).up(spec(), Recorder())
    assert [n.host_keys for n in got.nodes] == [(KEY0,), (KEY1,)]
    assert [c[0] for c in console.calls] == ids


# -- capacity: nothing billing after a failed attempt --------------------------------------------


FLEET_SHORT = ("EC2 Fleet fleet-0e5f6a7b8-1234-4c5d-9e0f-0123456789ab launched 0 of 2 instances (all or none): "
               "InsufficientInstanceCapacity: We currently do not have sufficient g5.xlarge capacity in the "
               "Availability Zone you requested (us-east-1a). Our system will be working on provisioning "
               "additional capacity. You can currently get g5.xlarge capacity by not specifying an "
               "Availability Zone in your request or choosing us-east-1b, us-east-1c, us-east-1d.")


def test_a_short_fleet_fails_over_to_the_next_zone_and_its_row_is_closed(home, monkeypatch):
    pytest.importorskip("pulumi.automation")
    from pulumi_fake import AWS_FLEET_RESOURCES, FakePulumiCommand, aws_outputs

    from gpucluster.infra.registry import plugin
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.steps import QuietUI, _Recorder
    from test_automation import provider, spec

    # the fleet is created (6 resources, the rule unrecorded), then the program fails on its count
    from gpucluster.infra.aws.engine import PROVIDER_MAX_RETRIES

    # the provider's retry model is on (tests/test_aws_failures.py), but CreateFleet answers a shortage
    # with a 200 and `Errors`, which the SDK does not retry: the next zone is tried at once
    fake = FakePulumiCommand(resources=AWS_FLEET_RESOURCES, fail_up_after=6, fail_text=FLEET_SHORT, fail_up_times=1,
                             fail_in_program=True, provider_max_retries=PROVIDER_MAX_RETRIES,
                             outputs=aws_outputs())
    prov = provider(fake, capacity_attempts=plugin("aws").provisioner.capacity_attempts)
    zones = []
    real_up = prov.driver.up
    prov.driver.up = lambda s, ev=None: zones.append(s.zone) or real_up(s, ev)
    ledger = Ledger(home / "ledger.sqlite3")
    s = spec()
    ledger.create_run(s.run_id, cloud="aws", cluster="demo", nodes=2, gpus_per_node=1, command=["x"], spec=s.to_dict())
    rec = _Recorder(ledger, s.run_id, QuietUI(), "us-east-1")
    cluster = prov.up(s, rec)
    assert zones == ["us-east-1a", "us-east-1b"] and len(cluster.nodes) == 2
    gap = fake.up_started[1] - fake.up_started[0]  # from the first attempt's start to the next zone's
    print(f"capacity error to the next zone's attempt: {gap:.1f} s (fake clock)")
    assert gap < 60 and fake.capacity_errors_at == []  # no provider retry delay on this path
    rows = ledger.get_run(s.run_id).to_dict()["resources"]
    assert not [r for r in rows if r["kind"] == "instance"]  # never one row per node
    fleets = [r for r in rows if r["kind"] == "fleet"]
    assert [(r["detail"]["attempt"], r["detail"]["node_count"]) for r in fleets] == [(1, 2), (2, 2)]
    assert fleets[0]["confirmed_gone"] and not fleets[1]["confirmed_gone"]  # the failed attempt: destroyed


# -- the ledger row and its price ----------------------------------------------------------------


def test_one_fleet_row_costs_what_its_instances_would(home):
    from gpucluster.costing.cost import run_cost
    from gpucluster.infra.registry import plugin
    from gpucluster.ledger.store import Ledger

    ledger = Ledger(home / "ledger.sqlite3")
    detail = {"instance_type": "g5.xlarge", "spot": False, "disk_gb": 100, "disk_type": "gp3", "public_ipv4": 1}
    for run_id, rows in (("r-fleet", [("fleet", "demo-fleet", {**detail, "node_count": 3})]),
                         ("r-nodes", [("instance", f"demo-node-{i}", detail) for i in range(3)])):
        ledger.create_run(run_id, cloud="aws", cluster="demo", nodes=3, gpus_per_node=1, command=["x"],
                          spec={"cloud": "aws", "region": "us-east-1", "nodes": 3, "instance_type": "g5.xlarge"},
                          now=1000.0)
        for kind, name, d in rows:
            ledger.resource_requested(run_id, kind, name, region="us-east-1", detail=d, now=1000.0)
            ledger.resource_created(run_id, kind, name, "x", now=1030.0)
            ledger.resource_deleted(run_id, kind, name, now=1000.0 + 3600)
    fleet = run_cost(ledger.get_run("r-fleet"), backend=plugin("aws"), now=9999.0)
    nodes = run_cost(ledger.get_run("r-nodes"), backend=plugin("aws"), now=9999.0)
    assert Decimal(fleet["total"]) == Decimal(nodes["total"]) > 3  # 3 x $1.006/h + disks + IPv4
    line = next(ln for ln in fleet["lines"] if ln["category"] == "instances")
    assert line["description"] == "3 x g5.xlarge (on-demand)" and line["quantity"] == "3"


def test_the_fleet_input_becomes_the_ledger_detail():
    from gpucluster.infra.aws.engine import PULUMI_KINDS, resource_detail

    assert PULUMI_KINDS["aws:ec2/fleet:Fleet"] == "fleet"
    inputs = {"targetCapacitySpecification": {"defaultTargetCapacityType": "spot", "totalTargetCapacity": 4},
              "launchTemplateConfigs": [{"overrides": [{"instanceType": "g5.12xlarge",
                                                        "availabilityZone": "us-east-1c"}]}]}

    from gpucluster.spec import ClusterSpec

    given = ClusterSpec(cloud="aws", nodes=4, disk_gb=200, disk_type="gp3")
    d = resource_detail("fleet", inputs, given)
    assert d == {"instance_type": "g5.12xlarge", "node_count": 4, "spot": True, "disk_gb": 200, "disk_type": "gp3",
                 "availability_zone": "us-east-1c", "public_ipv4": 1}
    # no --disk-gb: the size the program gave the nodes for their image, as the fleet's tag says it (issue 42)
    sized = {**inputs, "tags": {"gpucluster-root-gb": "115"}}
    assert resource_detail("fleet", sized, given.replace(disk_gb=None))["disk_gb"] == 115
    assert resource_detail("fleet", inputs, given.replace(disk_gb=None))["disk_gb"] == 100  # the default


# -- leftovers: scan and delete ------------------------------------------------------------------


@pytest.fixture
def moto_ec2(monkeypatch):
    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with moto.mock_aws():
        yield boto3.session.Session(region_name="us-east-1")


def _tags(name):
    return [{"Key": "managed-by", "Value": "gpucluster"}, {"Key": "gpucluster-cluster", "Value": "demo"},
            {"Key": "Name", "Value": name}]


def test_the_scan_finds_the_fleet_and_its_instances_and_delete_leaves_nothing_billing(moto_ec2):
    from gpucluster.infra.aws import leftovers

    ec2 = moto_ec2.client("ec2", region_name="us-east-1")
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.42.0.0/24", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    lt = ec2.create_launch_template(
        LaunchTemplateName="demo-nodes", TagSpecifications=[{"ResourceType": "launch-template", "Tags": _tags("demo-nodes")}],
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge",
                            "TagSpecifications": [{"ResourceType": "instance", "Tags": _tags("demo-node")}]},
    )["LaunchTemplate"]["LaunchTemplateId"]
    made = ec2.create_fleet(
        Type="instant", TagSpecifications=[{"ResourceType": "fleet", "Tags": _tags("demo-fleet")}],
        LaunchTemplateConfigs=[{"LaunchTemplateSpecification": {"LaunchTemplateId": lt, "Version": "$Latest"},
                                "Overrides": [{"InstanceType": "g5.xlarge", "SubnetId": subnet}]}],
        TargetCapacitySpecification={"TotalTargetCapacity": 2, "DefaultTargetCapacityType": "on-demand",
                                     "OnDemandTargetCapacity": 2},
        OnDemandOptions={"MinTargetCapacity": 2, "SingleInstanceType": True, "SingleAvailabilityZone": True})
    fleet_id = made["FleetId"]
    # someone else's fleet in the account: not ours, never touched
    theirs = ec2.create_launch_template(LaunchTemplateName="theirs", LaunchTemplateData={
        "ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge"})["LaunchTemplate"]["LaunchTemplateId"]
    other = ec2.create_fleet(
        Type="instant", TagSpecifications=[{"ResourceType": "fleet", "Tags": [{"Key": "team", "Value": "x"}]}],
        LaunchTemplateConfigs=[{"LaunchTemplateSpecification": {"LaunchTemplateId": theirs, "Version": "$Latest"}}],
        TargetCapacitySpecification={"TotalTargetCapacity": 1, "DefaultTargetCapacityType": "on-demand"})["FleetId"]

    report = leftovers.scan(["us-east-1"], "demo", session=moto_ec2, include_iam=False)
    found = {(f.leftover.kind, f.leftover.id) for f in report.found}
    assert ("fleet", fleet_id) in found and ("fleet", other) not in found
    ours = [f.leftover for f in report.found if f.leftover.kind in ("fleet", "instance", "launch-template")]
    assert len([lo for lo in ours if lo.kind == "instance"]) == 2
    assert leftovers.delete(ours, session=moto_ec2, wait_seconds=30) == []
    again = leftovers.scan(["us-east-1"], "demo", session=moto_ec2, include_iam=False)
    # the deleted fleet is still listed by DescribeFleets, as `deleted_terminating`: gone for us
    states = {f["FleetId"]: f["FleetState"] for f in ec2.describe_fleets()["Fleets"]}
    assert states[fleet_id].startswith("deleted")
    assert not [f for f in again.found if f.leftover.kind in ("fleet", "instance", "launch-template")]
    # deleting it again (a second `gc`) counts as done
    assert leftovers.delete([lo for lo in ours if lo.kind == "fleet"], session=moto_ec2) == []
    assert {f["FleetId"]: f["FleetState"] for f in ec2.describe_fleets()["Fleets"]}[other] == "active"


def test_the_key_cache_lives_with_the_clusters_ssh_files_and_goes_with_a_verified_down(home):
    from gpucluster.lifecycle.kept import access_dir, forget_access

    clock = Clock()
    console = LateConsole(clock, {"i-0aaa": KEY0, "i-0bbb": KEY1}, {"i-0aaa": 0.0, "i-0bbb": 0.0})
    hostkeys.pin(cluster(), client=console, sleep=clock.sleep, clock=clock.now)
    folder = access_dir("demo") / "hostkeys"
    assert sorted(p.name for p in folder.iterdir()) == ["i-0aaa", "i-0bbb"]
    # a new incarnation of the cluster (new instances): the old keys are dropped, never trusted
    console.keys["i-0ccc"], console.at["i-0ccc"] = KEY1, 0.0
    hostkeys.pin(cluster(ids=("i-0aaa", "i-0ccc")), client=console, sleep=clock.sleep, clock=clock.now)
    assert sorted(p.name for p in folder.iterdir()) == ["i-0aaa", "i-0ccc"]
    forget_access("demo")  # what a verified `down` does (gpucluster.lifecycle.teardown.take_down)
    assert not folder.exists()


def test_a_capacity_error_with_option_subnet_id_tries_no_other_zone_and_says_why(home):
    """Issue 40 item 5: with option subnetId the nodes launch in that subnet, which is in one zone
    (EC2 User Guide, "Subnets for your VPC"); a failover to "the next zone" kept the subnet and so
    retried the same zone while saying it tried another. Now one attempt, and the error says what
    would move the run (a subnet of another zone)."""
    pytest.importorskip("pulumi.automation")
    from pulumi_fake import AWS_FLEET_RESOURCES, FakePulumiCommand, aws_outputs

    from gpucluster.infra.pulumi.events import CapacityError
    from gpucluster.infra.registry import plugin
    from test_automation import Recorder, provider, spec

    fake = FakePulumiCommand(resources=AWS_FLEET_RESOURCES, fail_up_after=6, fail_text=FLEET_SHORT, fail_up_times=1,
                             fail_in_program=True, outputs=aws_outputs())
    prov = provider(fake, capacity_attempts=plugin("aws").provisioner.capacity_attempts)
    zones = []
    real_up = prov.driver.up
    prov.driver.up = lambda s, ev=None: zones.append(s.zone) or real_up(s, ev)
    rec = Recorder()
    with pytest.raises(CapacityError) as err:
        prov.up(spec(options=(("subnetId", "subnet-0abc"), ("vpcId", "vpc-0abc"))), rec)
    assert zones == ["us-east-1a"]  # one attempt: no "retry" in the same subnet's zone
    assert "no other zone was tried: option subnetId=subnet-0abc fixes the zone" in err.value.message
    assert "subnetId of a subnet in another zone" in err.value.hint
    assert not [e for e in rec.log if e[0] == "message" and "retrying in" in e[1]]


def test_the_fleet_scan_asks_ec2_for_fleets_not_deleted(monkeypatch):
    """Issue 40 item 12: a deleted instant fleet stays listed for about two days (EC2 User Guide,
    "Delete an EC2 Fleet") and every run leaves one, so the scan asks DescribeFleets for the fleets
    that are not deleted (its fleet-state filter) instead of paging them all."""
    pytest.importorskip("moto")
    from aws_strict import StrictSession

    from gpucluster.infra.aws import leftovers

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    import moto

    with moto.mock_aws():
        session = StrictSession()
        leftovers.scan(["us-east-1"], "demo", session=session, include_iam=False)
        (params,) = session.seen("ec2", "DescribeFleets")
        states = {v for f in params.get("Filters", []) if f["Name"] == "fleet-state" for v in f["Values"]}
        assert states and not [s for s in states if s.startswith("deleted")]
