"""An EC2 that keeps time: moto's EC2 with the instance lifecycle and the in-use refusals of the real
service, on a scaled clock (test-only).

THIS IS A TEST DOUBLE. moto answers every EC2 call at once and in its end state: an instance is
`running` the moment RunInstances/CreateFleet returns (with a public IP), `terminated` the moment
TerminateInstances/DeleteFleets returns, and nothing it held is ever "in use". `TimedEc2.install`
wraps botocore's `BaseClient._make_api_call` for the `ec2` service (every client of the process,
those gpucluster makes itself included) and puts the real service's timing and refusals in front of
moto. Each behaviour and its public source:

- Instances move `pending -> running -> shutting-down -> terminated` (EC2 User Guide, "Amazon EC2
  instance state changes", https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-lifecycle.html).
  `pending_s` after launch an instance is `running`; after TerminateInstances (or DeleteFleets with
  TerminateInstances) it is `shutting-down` for `terminate_s` seconds, each instance its own draw
  from the range (GPU instances take 60-120 s and more: scylladb/scylla-cluster-tests#6742 waits
  minutes for them). The answer of TerminateInstances itself says `shutting-down` (API reference,
  TerminateInstances: CurrentState).
- A public IPv4 only once `running`: while `pending` DescribeInstances carries no `PublicIpAddress`
  ("When you launch an instance ... we assign a public IPv4 address ... when the instance is
  launched"; the instance is `pending` until it is ready, and until then it has no address: EC2
  User Guide, "Instance lifecycle": "pending ... preparing to enter the running state").
- While an instance that is not `terminated` holds them, EC2 refuses to delete:
  - its placement group: `InvalidPlacementGroup.InUse` (API reference, DeletePlacementGroup: "You
    must terminate all instances in the placement group before you can delete the placement group";
    hashicorp/terraform-provider-aws#21460);
  - its security groups and subnet: `DependencyViolation` (API reference, DeleteSecurityGroup: "If
    you attempt to delete a security group that is associated with an instance ... the operation
    fails with DependencyViolation"; DeleteSubnet: "You must terminate all running instances in the
    subnet before you can delete the subnet"), and so its VPC;
  - its volumes: `VolumeInUse` (API reference, DeleteVolume: "The volume must be in the available
    state (not attached to an instance)");
  - its network interfaces: `InvalidNetworkInterface.InUse` (API reference, DeleteNetworkInterface:
    "You must detach the network interface before you can delete it");
  - the internet gateway of a VPC with public addresses mapped: `DependencyViolation` "Network
    vpc-... has some mapped public address(es)" (DetachInternetGateway: "The VPC must not contain any
    running instances with Elastic IP addresses or public IPv4 addresses").
- An instant fleet's DeleteFleets returns at once; its instances terminate afterwards
  (terraform-provider-aws internal/service/ec2/ec2_fleet.go, resourceFleetDelete: "Limiting waiter
  to non-instant fleet types. `instant` fleet state is eventually consistent and can take 48 hours
  to update").
- Placement groups themselves (Create/Describe/DeletePlacementGroup), which moto 5.2 does not
  implement ("has not been implemented"), are kept here.
- A new instance profile is not usable by EC2 for `profile_s` seconds after CreateInstanceProfile:
  an instant fleet whose template names it launches nothing and lists the error EC2 gives,
  `InvalidParameterValue` "Invalid IAM Instance Profile name", in its `Errors` (IAM is eventually
  consistent: AWS IAM User Guide, "Troubleshooting IAM roles" / "Changes that I make are not always
  immediately visible"; EC2 User Guide, "IAM roles for Amazon EC2": "it can take a few seconds for
  the instance profile to propagate"; terraform-provider-aws ec2_instance.go resourceInstanceCreate
  retries RunInstances on exactly this message for iamPropagationTimeout, 2 minutes).
- A root volume smaller than the image's root snapshot is refused: RunInstances answers
  `InvalidBlockDeviceMapping` "Volume of size 50GB is smaller than snapshot 'snap-...', expect size >=
  75GB", and an instant fleet launches nothing and lists that error (EBS User Guide, "Create a volume
  from a snapshot": the new volume must be at least the snapshot's size; the message as launches report
  it, e.g. "Volume of size 20GB is smaller than snapshot, expect size >= 30GB" for an Amazon Linux 2023
  AMI and "expect >= 75GB" for a GPU DLAMI in public projects' terraform/launch logs). The image's
  snapshot size is what DescribeImages says of it, or `images[ami] = (snapshot id, GB)` for an image
  moto does not ship (the DLAMIs: moto 5.2 has none).
- A launch with more than one network interface that asks for a public IPv4 is refused: an instant
  fleet launches nothing and lists `InvalidParameterCombination` "The associatePublicIPAddress parameter
  cannot be specified when launching with multiple network interfaces." (EC2 API Reference,
  InstanceNetworkInterfaceSpecification.AssociatePublicIpAddress: "You cannot specify more than one
  network interface in the request"; the fleet error as aws/karpenter-provider-aws#5666 quotes it).
- Elastic IPs and multi-interface instances (tests/ec2_addresses.py, mixed in): no public IPv4 for an
  instance with several interfaces unless an Elastic IP is associated, the region's Elastic IP quota
  (AddressLimitExceeded), no release of an associated address (InvalidIPAddress.InUse).
- ModifyFleet of an `instant` fleet is refused, `FleetNotInModifiableState` (API reference,
  ModifyFleet: "This action is only supported for the maintain type"; the answer EC2 gives for a
  fleet of another type: jenkinsci/ec2-fleet-plugin#131, "... is not a modifiable fleet request
  type"); moto would modify it.

The clock is scaled: `scale` simulated seconds pass per real second, so a 90 s termination takes
4.5 s at scale 20; `clock.sleep(s)`, given to the code under test as its sleep, lets `s` simulated
seconds pass at once.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from botocore.client import BaseClient
from botocore.exceptions import ClientError

from ec2_addresses import Addresses


ACTIVE: list["TimedEc2"] = []  # the model installed for the running test (tests/aws_apply.py asks)


class ScaledClock:
    """Simulated seconds: `scale` of them per real second, plus every `sleep` of the code under test
    that is given this clock, which passes at once (so a poll loop's progress does not hang on how
    fast a loaded test machine is)."""

    def __init__(self, scale: float = 20.0):
        self.scale, self.t0, self.offset = float(scale), time.monotonic(), 0.0
        self._lock = threading.Lock()

    def now(self) -> float:
        return (time.monotonic() - self.t0) * self.scale + self.offset

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.offset += max(0.0, seconds)
        time.sleep(0.001)


@dataclass
class Inst:
    id: str
    launched: float
    running_after: float
    shutdown_for: float
    terminate_at: float | None = None  # simulated time TerminateInstances was asked
    groups: set[str] = field(default_factory=set)
    subnet: str | None = None
    vpc: str | None = None
    placement: str | None = None
    volumes: set[str] = field(default_factory=set)
    enis: set[str] = field(default_factory=set)
    multi: bool = False  # launched with several network interfaces: no public IPv4 at launch

    def state(self, now: float) -> str:
        if self.terminate_at is not None:
            return "terminated" if now >= self.terminate_at + self.shutdown_for else "shutting-down"
        return "running" if now >= self.launched + self.running_after else "pending"


_CODES = {"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48}


def _error(op: str, code: str, message: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": 400}}, op)


class TimedEc2(Addresses):
    """`install(monkeypatch)` puts this model in front of moto's EC2 for the test's life."""

    def __init__(self, clock: ScaledClock | None = None, *, pending_s: tuple[float, float] = (20.0, 40.0),
                 terminate_s: tuple[float, float] = (60.0, 120.0), seed: int = 7, profile_s: float = 10.0):
        self.clock = clock or ScaledClock()
        self.profile_s = profile_s  # seconds a new instance profile stays unusable to EC2 launches
        self.profiles: dict[str, float] = {}  # instance profile name -> simulated time it was created
        self.fleet_errors: dict[str, list[dict[str, Any]]] = {}  # fleet id -> its launch errors
        self.fleet_types: dict[str, str] = {}  # fleet id -> instant / maintain / request
        self.pending_s, self.terminate_s = pending_s, terminate_s
        self.rng = random.Random(seed)
        self.instances: dict[str, Inst] = {}
        self.fleets: dict[str, list[str]] = {}
        # launch template id -> what its instances get: placement group, subnet, security groups (moto's
        # CreateFleet ignores a template's network interfaces; EC2 launches them there)
        self.templates: dict[str, dict[str, Any]] = {}
        self.groups: dict[str, dict[str, Any]] = {}  # placement groups, by name
        self.images: dict[str, tuple[str, int]] = {}  # image id -> (root snapshot id, its size in GB), beside moto's
        self.refused: list[tuple[str, str, str]] = []  # (operation, resource, code) of every refusal
        self.lock = threading.RLock()
        self._orig: Any = None
        self._addresses_init()

    # -- wiring ---------------------------------------------------------------------------------
    def install(self, monkeypatch: Any) -> "TimedEc2":
        orig = BaseClient._make_api_call
        self._orig = orig
        model = self

        def call(client: Any, operation: str, params: dict[str, Any]) -> Any:
            service = client.meta.service_model.service_name
            if service == "iam" and operation == "CreateInstanceProfile":
                resp = orig(client, operation, params)
                with model.lock:
                    model.profiles[params["InstanceProfileName"]] = model.clock.now()
                return resp
            if service != "ec2":
                return orig(client, operation, params)
            handler = getattr(model, f"_{operation}", None)
            if handler is None:
                return orig(client, operation, params)
            with model.lock:
                return handler(client, params, lambda p=params: orig(client, operation, p))

        monkeypatch.setattr(BaseClient, "_make_api_call", call)
        monkeypatch.setattr(sys.modules[__name__], "ACTIVE", [self])
        return self

    def _raw(self, client: Any, operation: str, params: dict[str, Any]) -> Any:
        return self._orig(client, operation, params)

    def _refuse(self, op: str, rid: str, code: str, message: str) -> ClientError:
        self.refused.append((op, rid, code))
        return _error(op, code, message)

    def state_of(self, iid: str) -> str:
        return self.instances[iid].state(self.clock.now())

    def _holders(self, now: float, test: Any) -> list[Inst]:
        return [i for i in self.instances.values() if i.state(now) != "terminated" and test(i)]

    # -- launches -------------------------------------------------------------------------------
    def _track(self, client: Any, ids: list[str], placement: str | None, where: dict[str, Any] | None = None) -> None:
        if not ids:
            return
        now = self.clock.now()
        described = self._raw(client, "DescribeInstances", {"InstanceIds": ids})
        for res in described.get("Reservations", []):
            for raw in res.get("Instances", []):
                inst = Inst(raw["InstanceId"], now, self.rng.uniform(*self.pending_s),
                            self.rng.uniform(*self.terminate_s), placement=placement)
                inst.groups = {g["GroupId"] for g in raw.get("SecurityGroups", [])}
                inst.multi = bool((where or {}).get("multi"))
                inst.subnet, inst.vpc = raw.get("SubnetId"), raw.get("VpcId")
                for eni in raw.get("NetworkInterfaces", []):
                    inst.enis.add(eni["NetworkInterfaceId"])
                    inst.groups |= {g["GroupId"] for g in eni.get("Groups", [])}
                    inst.subnet = inst.subnet or eni.get("SubnetId")
                    inst.vpc = inst.vpc or eni.get("VpcId")
                if where and where.get("subnet"):
                    inst.subnet, inst.groups = where["subnet"], set(where.get("groups") or inst.groups)
                    subnets = self._raw(client, "DescribeSubnets", {"SubnetIds": [inst.subnet]})["Subnets"]
                    inst.vpc = subnets[0]["VpcId"] if subnets else inst.vpc
                for bdm in raw.get("BlockDeviceMappings", []):
                    if (bdm.get("Ebs") or {}).get("VolumeId"):
                        inst.volumes.add(bdm["Ebs"]["VolumeId"])
                self.instances[inst.id] = inst

    def _root_snapshot(self, client: Any, image_id: str | None) -> tuple[str, int] | None:
        if not image_id:
            return None
        if image_id in self.images:
            return self.images[image_id]
        images = self._raw(client, "DescribeImages", {"ImageIds": [image_id]}).get("Images") or [{}]
        root = images[0].get("RootDeviceName")
        for m in images[0].get("BlockDeviceMappings") or []:
            ebs = m.get("Ebs") or {}
            if m.get("DeviceName") == root and ebs.get("VolumeSize"):
                return str(ebs.get("SnapshotId") or ""), int(ebs["VolumeSize"])
        return None

    def _too_small(self, client: Any, image_id: str | None, mappings: list[dict[str, Any]]) -> str | None:
        """EC2's message when the launch's root volume is smaller than the image's snapshot, else None."""
        snap = self._root_snapshot(client, image_id)
        sizes = [int((m.get("Ebs") or {}).get("VolumeSize") or 0) for m in mappings or []
                 if (m.get("Ebs") or {}).get("VolumeSize")]
        if snap is None or not sizes or sizes[0] >= snap[1]:
            return None
        return f"Volume of size {sizes[0]}GB is smaller than snapshot '{snap[0]}', expect size >= {snap[1]}GB"

    def _RunInstances(self, client: Any, params: dict[str, Any], real: Any) -> Any:
        small = self._too_small(client, params.get("ImageId"), params.get("BlockDeviceMappings") or [])
        if small:
            raise self._refuse("RunInstances", params.get("ImageId", ""), "InvalidBlockDeviceMapping", small)
        resp = real()
        ids = [i["InstanceId"] for i in resp.get("Instances", [])]
        self._track(client, ids, (params.get("Placement") or {}).get("GroupName"))
        for raw in resp.get("Instances", []):
            self._rewrite(raw)
        return resp

    def _CreateLaunchTemplate(self, client: Any, params: dict[str, Any], real: Any) -> Any:
        resp = real()
        data = params.get("LaunchTemplateData") or {}
        nic = (data.get("NetworkInterfaces") or [{}])[0]
        self.templates[resp["LaunchTemplate"]["LaunchTemplateId"]] = {
            "placement": (data.get("Placement") or {}).get("GroupName"), "subnet": nic.get("SubnetId"),
            "groups": nic.get("Groups") or data.get("SecurityGroupIds") or [],
            "profile": (data.get("IamInstanceProfile") or {}).get("Name"),
            "too_small": self._too_small(client, data.get("ImageId"), data.get("BlockDeviceMappings") or []),
            "multi": len(data.get("NetworkInterfaces") or []) > 1,
            "public_multi": len(data.get("NetworkInterfaces") or []) > 1 and any(
                n.get("AssociatePublicIpAddress") for n in data.get("NetworkInterfaces") or [])}
        return resp

    def _young_profile(self, name: str | None) -> bool:
        made = self.profiles.get(name or "")
        return made is not None and self.clock.now() - made < self.profile_s

    def _CreateFleet(self, client: Any, params: dict[str, Any], real: Any) -> Any:
        configs = params.get("LaunchTemplateConfigs") or [{}]
        template = (configs[0].get("LaunchTemplateSpecification") or {}).get("LaunchTemplateId")
        where = self.templates.get(template or "") or {}
        errors: list[dict[str, Any]] = []
        if params.get("Type") == "instant" and self._young_profile(where.get("profile")):
            # EC2 does not see the profile yet: the instant fleet is made, launches nothing, lists why
            errors = [{"ErrorCode": "InvalidParameterValue", "ErrorMessage": (
                f"Value ({where['profile']}) for parameter iamInstanceProfile.name is invalid. Invalid IAM "
                "Instance Profile name"), "Lifecycle": "on-demand"}]
        elif params.get("Type") == "instant" and where.get("too_small"):  # every launch of it is refused
            self.refused.append(("CreateFleet", template or "", "InvalidBlockDeviceMapping"))
            errors = [{"ErrorCode": "InvalidBlockDeviceMapping", "ErrorMessage": where["too_small"],
                       "Lifecycle": "spot" if params.get("SpotOptions") else "on-demand"}]
        elif params.get("Type") == "instant" and where.get("public_multi"):
            self.refused.append(("CreateFleet", template or "", "InvalidParameterCombination"))
            errors = [{"ErrorCode": "InvalidParameterCombination", "ErrorMessage": (
                "The associatePublicIPAddress parameter cannot be specified when launching with multiple "
                "network interfaces."), "Lifecycle": "spot" if params.get("SpotOptions") else "on-demand"}]
        if errors:
            options = "SpotOptions" if params.get("SpotOptions") else "OnDemandOptions"
            resp = real({**params, "TargetCapacitySpecification": {
                **params["TargetCapacitySpecification"], "TotalTargetCapacity": 0},
                options: {**(params.get(options) or {}), "MinTargetCapacity": 0}})
            resp["Errors"] = errors
        else:
            resp = real()
        ids = [i for s in resp.get("Instances") or [] for i in s.get("InstanceIds") or []]
        self._track(client, ids, where.get("placement"), where)
        self.fleets[resp["FleetId"]] = ids
        self.fleet_errors[resp["FleetId"]] = errors
        self.fleet_types[resp["FleetId"]] = params.get("Type") or "maintain"
        return resp

    def _DescribeFleets(self, client: Any, params: dict[str, Any], real: Any) -> Any:
        resp = real()
        for fleet in resp.get("Fleets", []):
            if self.fleet_errors.get(fleet.get("FleetId", "")):
                fleet["Errors"] = list(self.fleet_errors[fleet["FleetId"]])
        return resp

    def _ModifyFleet(self, client: Any, params: dict[str, Any], real: Any) -> Any:
        fid = params.get("FleetId", "")
        if self.fleet_types.get(fid, "maintain") != "maintain":
            raise self._refuse("ModifyFleet", fid, "FleetNotInModifiableState",
                               f"Fleet Request: {fid} is not a modifiable fleet request type.")
        return real()

    # -- reads ----------------------------------------------------------------------------------
    def _rewrite(self, raw: dict[str, Any]) -> str | None:
        inst = self.instances.get(raw.get("InstanceId", ""))
        if inst is None:
            return None
        state = inst.state(self.clock.now())
        raw["State"] = {"Code": _CODES[state], "Name": state}
        if state != "running" or (inst.multi and not self.has_address(inst.id)):
            # no public IPv4 while pending, released when it stops running; none at all for an instance
            # with several interfaces, but the Elastic IP associated with it (ec2_addresses.py)
            raw.pop("PublicIpAddress", None)
            raw.pop("PublicDnsName", None)
            for eni in raw.get("NetworkInterfaces", []):
                eni.pop("Association", None)
        if inst.placement:
            raw.setdefault("Placement", {})["GroupName"] = inst.placement
        if inst.subnet:
            raw["SubnetId"], raw["VpcId"] = inst.subnet, inst.vpc
            raw["SecurityGroups"] = [{"GroupId": g} for g in sorted(inst.groups)]
        return state

    def _DescribeInstances(self, client: Any, params: dict[str, Any], real: Any) -> Any:
        filters = list(params.get("Filters") or [])
        wanted = [f for f in filters if f.get("Name") == "instance-state-name"]
        if wanted:  # moto's states are not the real ones: the state filter is applied here
            params = {**params, "Filters": [f for f in filters if f.get("Name") != "instance-state-name"]}
        resp = real(params)
        keep = {v for f in wanted for v in f.get("Values", [])}
        for res in resp.get("Reservations", []):
            res["Instances"] = [raw for raw in res.get("Instances", [])
                                if (self._rewrite(raw) or raw["State"]["Name"]) in keep or not keep]
        resp["Reservations"] = [r for r in resp.get("Reservations", []) if r["Instances"]]
        return resp

    # -- termination ----------------------------------------------------------------------------
    def _terminate(self, ids: list[str]) -> None:
        now = self.clock.now()
        for iid in ids:
            inst = self.instances.get(iid)
            if inst is not None and inst.terminate_at is None:
                inst.terminate_at = now

    def _TerminateInstances(self, client: Any, params: dict[str, Any], real: Any) -> Any:
        before = {i: self.instances[i].state(self.clock.now()) for i in params.get("InstanceIds", [])
                  if i in self.instances}
        resp = real()
        self._terminate(list(params.get("InstanceIds", [])))
        for change in resp.get("TerminatingInstances", []):
            iid = change.get("InstanceId")
            if iid in self.instances:
                prev, cur = before[iid], self.state_of(iid)
                change["PreviousState"] = {"Code": _CODES[prev], "Name": prev}
                change["CurrentState"] = {"Code": _CODES[cur], "Name": cur}
        return resp

    def _DeleteFleets(self, client: Any, params: dict[str, Any], real: Any) -> Any:
        try:
            resp = real()  # returns at once: an instant fleet's instances terminate after it
        except ClientError as exc:
            # moto 5.2 fails DeleteFleets(TerminateInstances) of a fleet whose instances are all
            # terminated already ("No instances specified"); EC2 deletes the fleet
            if "No instances specified" not in str(exc):
                raise
            resp = real({**params, "TerminateInstances": False})
        if params.get("TerminateInstances"):
            for ok in resp.get("SuccessfulFleetDeletions", []):
                self._terminate(self.fleets.get(ok.get("FleetId", ""), []))
        return resp

    # -- placement groups (moto 5.2 has none) -----------------------------------------------------
    def _CreatePlacementGroup(self, client: Any, params: dict[str, Any], real: Any) -> Any:
        name = params["GroupName"]
        if name in self.groups:
            raise _error("CreatePlacementGroup", "InvalidPlacementGroup.Duplicate",
                         f"The placement group '{name}' already exists.")
        tags = [t for s in params.get("TagSpecifications") or [] for t in s.get("Tags", [])]
        group = {"GroupName": name, "GroupId": f"pg-{len(self.groups) + 1:017x}", "State": "available",
                 "Strategy": params.get("Strategy", "cluster"), "Tags": tags}
        self.groups[name] = group
        return {"PlacementGroup": dict(group), "ResponseMetadata": {"HTTPStatusCode": 200}}

    def _DescribePlacementGroups(self, client: Any, params: dict[str, Any], real: Any) -> Any:
        out = []
        for g in self.groups.values():
            if params.get("GroupNames") and g["GroupName"] not in params["GroupNames"]:
                continue
            tags = {t["Key"]: t["Value"] for t in g["Tags"]}
            ok = True
            for f in params.get("Filters") or []:
                if f["Name"].startswith("tag:"):
                    ok = ok and tags.get(f["Name"][4:]) in f["Values"]
                elif f["Name"] == "group-name":
                    ok = ok and g["GroupName"] in f["Values"]
            if ok:
                out.append(dict(g))
        return {"PlacementGroups": out, "ResponseMetadata": {"HTTPStatusCode": 200}}

    def _DeletePlacementGroup(self, client: Any, params: dict[str, Any], real: Any) -> Any:
        name = params["GroupName"]
        if name not in self.groups:
            raise _error("DeletePlacementGroup", "InvalidPlacementGroup.Unknown",
                         f"The Placement Group '{name}' is unknown.")
        if self._holders(self.clock.now(), lambda i: i.placement == name):
            raise self._refuse("DeletePlacementGroup", name, "InvalidPlacementGroup.InUse",
                               f"There are instances in placement group {name}")
        del self.groups[name]
        return {"ResponseMetadata": {"HTTPStatusCode": 200}}

    # -- deletes refused while an instance holds the resource ------------------------------------
    def _DeleteSecurityGroup(self, client: Any, params: dict[str, Any], real: Any) -> Any:
        gid = params.get("GroupId", "")
        if self._holders(self.clock.now(), lambda i: gid in i.groups):
            raise self._refuse("DeleteSecurityGroup", gid, "DependencyViolation",
                               f"resource {gid} has a dependent object")
        return real()

    def _DeleteSubnet(self, client: Any, params: dict[str, Any], real: Any) -> Any:
        sid = params["SubnetId"]
        if self._holders(self.clock.now(), lambda i: i.subnet == sid):
            raise self._refuse("DeleteSubnet", sid, "DependencyViolation",
                               f"The subnet '{sid}' has dependencies and cannot be deleted.")
        return real()

    def _DeleteVpc(self, client: Any, params: dict[str, Any], real: Any) -> Any:
        vid = params["VpcId"]
        if self._holders(self.clock.now(), lambda i: i.vpc == vid):
            raise self._refuse("DeleteVpc", vid, "DependencyViolation",
                               f"The vpc '{vid}' has dependencies and cannot be deleted.")
        return real()

    def _DetachInternetGateway(self, client: Any, params: dict[str, Any], real: Any) -> Any:
        vid = params["VpcId"]
        # a public IPv4 stays mapped until the instance is terminated (it is released then)
        if self._holders(self.clock.now(), lambda i: i.vpc == vid and i.state(self.clock.now()) != "pending"):
            raise self._refuse("DetachInternetGateway", vid, "DependencyViolation",
                               f"Network {vid} has some mapped public address(es). Please unmap those public "
                               "address(es) before detaching the gateway.")
        return real()

    def _DeleteVolume(self, client: Any, params: dict[str, Any], real: Any) -> Any:
        vid = params["VolumeId"]
        held = self._holders(self.clock.now(), lambda i: vid in i.volumes)
        if held:
            raise self._refuse("DeleteVolume", vid, "VolumeInUse", f"Volume {vid} is currently attached to {held[0].id}")
        return real()

    def _DeleteNetworkInterface(self, client: Any, params: dict[str, Any], real: Any) -> Any:
        eid = params["NetworkInterfaceId"]
        if self._holders(self.clock.now(), lambda i: eid in i.enis):
            raise self._refuse("DeleteNetworkInterface", eid, "InvalidNetworkInterface.InUse",
                               f"Interface: [{eid}] in use.")
        return real()
