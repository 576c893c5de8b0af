"""What `pulumi up` of the REAL aws program would make in an AWS account, made in moto's account
(a stand-in for the AWS provider applying a plan; test-only).

`apply(recorder, session)` takes what the program declared under Pulumi's mock runtime
(`infra.aws.mock_runtime.build`) and creates each resource in the account through boto3, with the
inputs the program gave it: the tags (Name, managed-by, gpucluster-cluster/-run and the owner
marks), the IAM path of the role and instance profile, the nodes' launch template (its instance,
volume and interface tags) and the instant EC2 Fleet that launches them all (its instances are
listed after it, as the fleet reports them). References between resources (the mock runtime's
ids, "<resource name>-id") become the real ids. It returns what it made, in creation order, so
that `destroy(made, session)` deletes exactly those, the way `pulumi destroy` deletes what its
state holds (never by tag). Resources that carry no AWS object of their own (rules, associations,
the provider, TLS keys) are skipped: they hold no tag and bill nothing. The placement group is made
where the account can make one (the EC2 that keeps time, tests/ec2_timed.py); plain moto 5.2 cannot
(CreatePlacementGroup "has not been implemented"), and there it is skipped, as it always was.

`destroy_as_provider(made, session)` deletes as `pulumi destroy` does through pulumi-aws (the
terraform-provider-aws resource deletes it bridges), in reverse creation order, each delete with that
provider's own retries and waits, and never the waits it does not have (see its docstring).
"""

from __future__ import annotations

import itertools
from typing import Any

_seq = itertools.count(1)
# resource id -> the ids of the resources its inputs refer to (the engine's dependency graph, which
# `destroy_as_provider` deletes by: dependents first, independent resources at once)
DEPENDS_ON: dict[str, set[str]] = {}
FLEET_MEMBERS: list[str] = []  # the instances of the fleet applied last (an Elastic IP names one by rank)


def _refs(value: Any, ids: dict[str, str]) -> set[str]:
    if isinstance(value, str):
        return {ids[value]} if value in ids else set()
    if isinstance(value, dict):  # tags name things, they do not refer to them
        return set().union(*(_refs(v, ids) for k, v in value.items() if k != "tags")) if value else set()
    if isinstance(value, (list, tuple)):
        return set().union(*(_refs(v, ids) for v in value)) if value else set()
    return set()


def client(session: Any, service: str, region: str | None = None) -> Any:
    """One boto3 client per session, service and region (making one reads the service's model: ~0.4 s for EC2)."""
    cache = session.__dict__.setdefault("_aws_apply_clients", {})
    key = (service, region)
    if key not in cache:
        cache[key] = session.client(service, region_name=region) if region else session.client(service)
    return cache[key]


def _tags(inputs: dict[str, Any]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": str(v)} for k, v in (inputs.get("tags") or {}).items()]


def _timed_ec2() -> bool:
    """Whether the EC2 that keeps time (tests/ec2_timed.py) is in front of moto in this test."""
    import sys

    timed = sys.modules.get("ec2_timed")
    return bool(timed is not None and getattr(timed, "ACTIVE", None))


def _spec(kind: str, inputs: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"ResourceType": kind, "Tags": _tags(inputs)}]


# what the provider replaces whatever the program says (ForceNew in terraform-provider-aws's schema,
# internal/service/ec2/ec2_fleet.go ResourceFleet: type, on_demand_options, spot_options,
# replace_unhealthy_instances, terminate_instances_with_expiration, valid_from/until; launch_template_config
# and target_capacity_specification's totals are updated in place with ModifyFleet, which EC2 allows only
# for `maintain` fleets)
FORCE_NEW = {
    "aws:ec2/fleet:Fleet": {"type", "onDemandOptions", "spotOptions", "replaceUnhealthyInstances",
                            "terminateInstancesWithExpiration", "validFrom", "validUntil"},
    "aws:ec2/launchTemplate:LaunchTemplate": {"name", "namePrefix"},
}


class Partial(Exception):
    """A create that made its resource and then failed (an Elastic IP whose association was refused): the
    engine keeps it in the state (the provider returned its id), so the attempt's destroy deletes it."""

    def __init__(self, kind: str, rid: str, cause: Exception):
        super().__init__(str(cause))
        self.kind, self.rid, self.cause = kind, rid, cause


class UpdateFailed(Exception):
    """`pulumi up` of a changed program failed: the provider's diagnostic of the resource it could not update."""


def _resolve(value: Any, ids: dict[str, str]) -> Any:
    """Inputs with the mock runtime's references replaced by the account's ids (tags left as they are)."""
    if isinstance(value, str):
        return ids.get(value, value)
    if isinstance(value, dict):
        return {k: (v if k == "tags" else _resolve(v, ids)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_resolve(v, ids) for v in value]
    return value


def _provider_delete(session: Any, region: str, kind: str, rid: str) -> None:
    from gpucluster.domain import Leftover
    from gpucluster.infra.aws.leftovers import _delete_one

    if kind == "fleet":  # an instant fleet's delete does not wait for its instances (destroy_as_provider)
        client(session, "ec2", region).delete_fleets(FleetIds=[rid], TerminateInstances=True)
    else:
        _delete_one(session, Leftover(kind, rid, None if kind in ("iam-role", "instance-profile") else region))


def apply(recorder: Any, session: Any, region: str = "us-east-1", state: dict[str, Any] | None = None,
          replace: tuple[str, ...] = (), made: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
    """Create in the account what the recorded program declared; [(kind, id)] in creation order.

    `state`: the stack's state, name -> {"kind", "id", "inputs", "members"}, read and rewritten. Given
    one from an earlier apply, this is an update as the engine and pulumi-aws make it (Pulumi docs,
    "How Pulumi works": each resource's new inputs are diffed against its state): the same inputs
    keep the resource; changed ones update it in place unless a changed input is one of its
    `replaceOnChanges` (the program's options, `Recorder.options`) or one the provider cannot update
    (FORCE_NEW), or it is named in `replace` (`pulumi up --replace`); a replacement is created
    before the old one is deleted, at the end of the update, or after it with `deleteBeforeReplace`.
    In place, a launch template gets a new version (CreateLaunchTemplateVersion), which changes what
    its fleet launches, and a fleet whose inputs other than its tags changed is modified
    (ModifyFleet: the EC2 stand-in refuses it for an instant fleet); any other resource's change is
    its tags, updated in place and not modelled. A failed update raises UpdateFailed. `made`: a list
    filled as resources are made, so that a create that fails midway leaves what was made before it
    in the stack (as the engine's state keeps it) for the destroy of that attempt."""
    ec2, iam = client(session, "ec2", region), client(session, "iam")
    ids: dict[str, str] = {}  # mock id ("<name>-id") -> the account's id
    made = [] if made is None else made
    previous = dict(state or {})
    bumped: set[str] = set()  # ids of templates given a new version in place by this update
    delete_after: list[tuple[str, str]] = []
    for r in recorder.resources:
        i, typ = r.inputs, r.typ
        prev = previous.pop(r.name, None)
        if prev is not None:
            resolved = _resolve(i, ids)
            changed = {k for k in set(resolved) | set(prev["inputs"]) if resolved.get(k) != prev["inputs"].get(k)}
            changed |= {k for k, v in i.items() if k != "tags" and _refs(v, ids) & bumped}
            opts = recorder.options.get(r.name) or {}
            roc = set(opts.get("replaceOnChanges") or ())
            if not changed and r.name not in replace:
                _keep(r, prev, ids, made, state)
                continue
            if r.name not in replace and not ("*" in roc or changed & roc or changed & FORCE_NEW.get(typ, set())):
                _update_in_place(ec2, r, prev, changed, resolved, bumped)
                _keep(r, prev, ids, made, state, resolved)
                continue
            if opts.get("deleteBeforeReplace"):
                _provider_delete(session, region, prev["kind"], prev["id"])
            else:
                delete_after.append((prev["kind"], prev["id"]))
        try:
            created = _create(r, ec2, iam, ids, region)
        except Partial as part:
            made.append((part.kind, part.rid))
            DEPENDS_ON[part.rid] = {m for k, m in made if k in ("fleet", "internet-gateway")}
            raise part.cause from None
        if created is None:
            continue
        kind, rid, members = created
        made.append((kind, rid))
        made.extend(("instance", iid) for iid in members)
        DEPENDS_ON[rid] = _refs(i, ids) - {rid}
        if kind == "elastic-ip":  # the program's depends_on: after the fleet and the internet gateway
            DEPENDS_ON[rid] |= {m for k, m in made if k in ("fleet", "internet-gateway")}
        ids[f"{r.name}-id"] = rid
        if typ in ("aws:iam/role:Role", "aws:iam/instanceProfile:InstanceProfile", "aws:ec2/placementGroup:PlacementGroup"):
            ids[r.name] = rid  # referred to by name: the profile names its role, the template its profile and group
        if state is not None:
            state[r.name] = {"kind": kind, "id": rid, "inputs": _resolve(i, ids), "members": members}
    for kind, rid in delete_after:  # the replaced, once their replacements exist ("delete-replaced")
        _provider_delete(session, region, kind, rid)
    for name, gone in previous.items():  # declared no more: deleted
        _provider_delete(session, region, gone["kind"], gone["id"])
        if state is not None:
            state.pop(name, None)
    return made


def _keep(r: Any, prev: dict[str, Any], ids: dict[str, str], made: list[tuple[str, str]],
          state: dict[str, Any] | None, resolved: Any = None) -> None:
    ids[f"{r.name}-id"] = prev["id"]
    if r.typ in ("aws:iam/role:Role", "aws:iam/instanceProfile:InstanceProfile", "aws:ec2/placementGroup:PlacementGroup"):
        ids[r.name] = prev["id"]
    made.append((prev["kind"], prev["id"]))
    made.extend(("instance", iid) for iid in prev.get("members") or [])
    if prev["kind"] == "fleet":
        FLEET_MEMBERS[:] = sorted(prev.get("members") or [])
    if state is not None and resolved is not None:
        state[r.name] = {**prev, "inputs": resolved}


def _update_in_place(ec2: Any, r: Any, prev: dict[str, Any], changed: set[str], resolved: dict[str, Any],
                     bumped: set[str]) -> None:
    from botocore.exceptions import ClientError

    try:
        if r.typ == "aws:ec2/launchTemplate:LaunchTemplate" and changed - {"tags", "description"}:
            ec2.create_launch_template_version(LaunchTemplateId=prev["id"], LaunchTemplateData={"ImageId": "ami-12c6146b"})
            bumped.add(prev["id"])
        elif r.typ == "aws:ec2/fleet:Fleet" and changed - {"tags"}:
            # terraform-provider-aws ec2_fleet.go resourceFleetUpdate: ModifyFleet with the new template
            # configs and target (tags alone go through UpdateTags)
            config = (resolved.get("launchTemplateConfigs") or [{}])[0]
            spec = config.get("launchTemplateSpecification") or {}
            ec2.modify_fleet(FleetId=prev["id"], LaunchTemplateConfigs=[{"LaunchTemplateSpecification": {
                "LaunchTemplateId": spec.get("launchTemplateId"), "Version": str(spec.get("version") or "$Latest")}}])
    except ClientError as exc:
        err = exc.response.get("Error", {})
        name = PROVIDER_NAMES.get(prev["kind"], prev["kind"])
        raise UpdateFailed(f"updating {name} ({prev['id']}): operation error EC2: {exc.operation_name}, https response "
                           "error StatusCode: 400, RequestID: 00000000-0000-0000-0000-000000000000, api error "
                           f"{err.get('Code')}: {err.get('Message')}") from None


def _create(r: Any, ec2: Any, iam: Any, ids: dict[str, str], region: str) -> tuple[str, str, list[str]] | None:
    """Create one declared resource: (kind, id, the fleet's instances), or None for what is skipped."""
    i, typ, n = r.inputs, r.typ, next(_seq)

    def ref(value: Any) -> Any:
        return ids.get(value, value)

    members: list[str] = []
    if typ == "aws:ec2/vpc:Vpc":
        rid = ec2.create_vpc(CidrBlock=i["cidrBlock"], TagSpecifications=_spec("vpc", i))["Vpc"]["VpcId"]
        kind = "vpc"
    elif typ == "aws:ec2/internetGateway:InternetGateway":
        rid = ec2.create_internet_gateway(TagSpecifications=_spec("internet-gateway", i))["InternetGateway"][
            "InternetGatewayId"]
        ec2.attach_internet_gateway(InternetGatewayId=rid, VpcId=ref(i["vpcId"]))
        kind = "internet-gateway"
    elif typ == "aws:ec2/subnet:Subnet":
        rid = ec2.create_subnet(VpcId=ref(i["vpcId"]), CidrBlock=i["cidrBlock"],
                                AvailabilityZone=i.get("availabilityZone") or f"{region}a",
                                TagSpecifications=_spec("subnet", i))["Subnet"]["SubnetId"]
        kind = "subnet"
    elif typ == "aws:ec2/routeTable:RouteTable":
        rid = ec2.create_route_table(VpcId=ref(i["vpcId"]), TagSpecifications=_spec("route-table", i))[
            "RouteTable"]["RouteTableId"]
        kind = "route-table"
    elif typ == "aws:ec2/securityGroup:SecurityGroup":
        rid = ec2.create_security_group(GroupName=f"{r.name}-{n}", Description=i.get("description") or "sg",
                                        VpcId=ref(i["vpcId"]), TagSpecifications=_spec("security-group", i))["GroupId"]
        kind = "security-group"
    elif typ == "aws:ec2/placementGroup:PlacementGroup":
        if not _timed_ec2():
            return None  # plain moto cannot make one: skipped, as before
        rid = f"{r.name}-{n}"  # Pulumi auto-names it: name + random suffix
        ec2.create_placement_group(GroupName=rid, Strategy=i.get("strategy") or "cluster",
                                   TagSpecifications=_spec("placement-group", i))
        kind = "placement-group"
    elif typ == "aws:ec2/keyPair:KeyPair":
        rid = f"{r.name}-{n}"
        ec2.create_key_pair(KeyName=rid, TagSpecifications=_spec("key-pair", i))
        kind = "key-pair"
    elif typ == "aws:iam/role:Role":
        rid = f"{r.name}-{n}"  # Pulumi auto-names roles: name + random suffix
        iam.create_role(RoleName=rid, Path=i.get("path", "/"), AssumeRolePolicyDocument=i["assumeRolePolicy"],
                        Tags=_tags(i))
        kind = "iam-role"
    elif typ == "aws:iam/instanceProfile:InstanceProfile":
        rid = f"{r.name}-{n}"
        iam.create_instance_profile(InstanceProfileName=rid, Path=i.get("path", "/"), Tags=_tags(i))
        iam.add_role_to_instance_profile(InstanceProfileName=rid, RoleName=ref(i["role"]))
        kind = "instance-profile"
    elif typ == "aws:ec2/launchTemplate:LaunchTemplate":
        # the nodes' template: its instance/volume/interface tags are what the fleet's instances get
        nic = dict((i.get("networkInterfaces") or [{}])[0])
        data: dict[str, Any] = {"ImageId": "ami-12c6146b", "TagSpecifications": [
            {"ResourceType": t["resourceType"], "Tags": _tags(t)} for t in i.get("tagSpecifications") or []]}
        group = ids.get((i.get("placement") or {}).get("groupName") or "")
        if group:
            data["Placement"] = {"GroupName": group}
        # the root volume the program asks for (EC2 refuses one smaller than the image's snapshot: ec2_timed.py)
        data["BlockDeviceMappings"] = [{"DeviceName": str(m.get("deviceName") or "/dev/sda1"), "Ebs": {
            "VolumeSize": int((m.get("ebs") or {}).get("volumeSize") or 0),
            "VolumeType": (m.get("ebs") or {}).get("volumeType") or "gp3"}}
            for m in i.get("blockDeviceMappings") or [] if (m.get("ebs") or {}).get("volumeSize")]
        profile = (i.get("iamInstanceProfile") or {}).get("name")
        if profile:
            data["IamInstanceProfile"] = {"Name": ref(profile)}
        if nic:  # every interface the template declares (EC2 refuses a public IPv4 with more than one)
            data["NetworkInterfaces"] = [{
                "DeviceIndex": int(n.get("deviceIndex") or 0), "NetworkCardIndex": int(n.get("networkCardIndex") or 0),
                "SubnetId": ref(n.get("subnetId")), "Groups": [ref(g) for g in n.get("securityGroups") or []],
                "AssociatePublicIpAddress": n.get("associatePublicIpAddress") == "true",
                **({"InterfaceType": n["interfaceType"]} if n.get("interfaceType") else {})}
                for n in i.get("networkInterfaces") or []]
        rid = ec2.create_launch_template(LaunchTemplateName=f"{r.name}-{n}", LaunchTemplateData=data,
                                         TagSpecifications=_spec("launch-template", i))["LaunchTemplate"][
            "LaunchTemplateId"]
        kind = "launch-template"
    elif typ == "aws:ec2/fleet:Fleet":
        # one instant fleet for all nodes (CreateFleet: all or none with MinTargetCapacity)
        config = (i.get("launchTemplateConfigs") or [{}])[0]
        target = i.get("targetCapacitySpecification") or {}
        options = i.get("onDemandOptions") or i.get("spotOptions") or {}
        opts_key = "OnDemandOptions" if i.get("onDemandOptions") else "SpotOptions"
        resp = ec2.create_fleet(
            Type=i.get("type", "instant"), TagSpecifications=_spec("fleet", i),
            LaunchTemplateConfigs=[{
                "LaunchTemplateSpecification": {"LaunchTemplateId": ref(config["launchTemplateSpecification"][
                    "launchTemplateId"]), "Version": "$Latest"},
                "Overrides": [{"InstanceType": o.get("instanceType")} for o in config.get("overrides") or []]}],
            TargetCapacitySpecification={"TotalTargetCapacity": int(target["totalTargetCapacity"]),
                                         "DefaultTargetCapacityType": target["defaultTargetCapacityType"]},
            **{opts_key: {"MinTargetCapacity": int(options.get("minTargetCapacity") or 0),
                          "SingleInstanceType": bool(options.get("singleInstanceType")),
                          "SingleAvailabilityZone": bool(options.get("singleAvailabilityZone"))}})
        rid, kind = resp["FleetId"], "fleet"
        members = [iid for s in resp.get("Instances") or [] for iid in s.get("InstanceIds") or []]
        FLEET_MEMBERS[:] = sorted(members)  # rank order (engine.fleet_instance_ids)
    elif typ == "aws:ec2/eip:Eip":
        # AllocateAddress tagged at creation, then (pulumi-aws: ec2_eip.go resourceEIPCreate) AssociateAddress
        # with the node's primary interface; the program names it by the mocks' id, "eni-mock<rank>"
        rid = ec2.allocate_address(Domain="vpc", TagSpecifications=_spec("elastic-ip", i))["AllocationId"]
        kind = "elastic-ip"
        if i.get("networkInterface"):
            node = FLEET_MEMBERS[int(str(i["networkInterface"]).rsplit("mock", 1)[1])]
            nics = ec2.describe_instances(InstanceIds=[node])["Reservations"][0]["Instances"][0]["NetworkInterfaces"]
            primary = next(n for n in nics if (n.get("Attachment") or {}).get("DeviceIndex", 0) == 0)
            try:
                ec2.associate_address(AllocationId=rid, NetworkInterfaceId=primary["NetworkInterfaceId"])
            except Exception as exc:  # noqa: BLE001 - the provider's create failed after AllocateAddress
                raise Partial("elastic-ip", rid, exc) from None
    elif typ == "aws:ec2/instance:Instance":
        root = i.get("rootBlockDevice") or {}
        specs = [{"ResourceType": "instance", "Tags": _tags(i)}]
        if root.get("tags"):
            specs.append({"ResourceType": "volume", "Tags": _tags(root)})
        inst = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType=i["instanceType"],
                                 SubnetId=ref(i["subnetId"]),
                                 SecurityGroupIds=[ref(x) for x in i.get("vpcSecurityGroupIds") or []],
                                 TagSpecifications=specs)["Instances"][0]
        rid, kind = inst["InstanceId"], "instance"
    else:
        return None
    return kind, rid, members


def destroy(made: list[tuple[str, str]], session: Any, region: str = "us-east-1") -> None:
    """Delete exactly what `apply` made (as `pulumi destroy` deletes what its state holds)."""
    from gpucluster.domain import Leftover
    from gpucluster.infra.aws.leftovers import delete

    ec2 = client(session, "ec2", region)
    for kind, rid in made:
        if kind == "fleet":
            try:
                ec2.delete_fleets(FleetIds=[rid], TerminateInstances=True)
            except Exception as exc:  # noqa: BLE001 - moto's quirk, below
                # moto 5.2 refuses DeleteFleets(TerminateInstances) of a fleet whose instances are all
                # terminated already ("No instances specified"), as they are once `down` terminated them
                # first; EC2 deletes it (tests/ec2_timed.py answers so in-process; this is server mode)
                if "No instances specified" not in str(exc):
                    raise
                ec2.delete_fleets(FleetIds=[rid], TerminateInstances=False)
    errors = delete([Leftover(kind, rid, None if kind in ("iam-role", "instance-profile") else region)
                     for kind, rid in made], session=session, wait_seconds=30)
    assert errors == [], errors


def exists(made: list[tuple[str, str]], session: Any, region: str = "us-east-1") -> list[tuple[str, str]]:
    """Which of `made` the account still has (instances: not terminated)."""
    ec2, iam = client(session, "ec2", region), client(session, "iam")
    live = []
    for kind, rid in made:
        if kind == "instance":
            state = ec2.describe_instances(InstanceIds=[rid])["Reservations"][0]["Instances"][0]["State"]["Name"]
            ok = state not in ("terminated", "shutting-down")
        elif kind == "vpc":
            ok = bool(ec2.describe_vpcs(Filters=[{"Name": "vpc-id", "Values": [rid]}])["Vpcs"])
        elif kind == "security-group":
            ok = bool(ec2.describe_security_groups(Filters=[{"Name": "group-id", "Values": [rid]}])["SecurityGroups"])
        elif kind == "subnet":
            ok = bool(ec2.describe_subnets(Filters=[{"Name": "subnet-id", "Values": [rid]}])["Subnets"])
        elif kind == "internet-gateway":
            ok = bool(ec2.describe_internet_gateways(Filters=[{"Name": "internet-gateway-id", "Values": [rid]}])[
                "InternetGateways"])
        elif kind == "route-table":
            ok = bool(ec2.describe_route_tables(Filters=[{"Name": "route-table-id", "Values": [rid]}])["RouteTables"])
        elif kind == "fleet":
            ok = any(not str(f.get("FleetState", "")).startswith("deleted")
                     for f in ec2.describe_fleets(FleetIds=[rid]).get("Fleets", []))
        elif kind == "placement-group":
            ok = bool(ec2.describe_placement_groups(GroupNames=[rid])["PlacementGroups"])
        elif kind == "launch-template":
            ok = rid in {t["LaunchTemplateId"] for t in ec2.describe_launch_templates()["LaunchTemplates"]}
        elif kind == "key-pair":
            ok = rid in {k["KeyName"] for k in ec2.describe_key_pairs()["KeyPairs"]}
        elif kind == "elastic-ip":
            ok = rid in {a.get("AllocationId") for a in ec2.describe_addresses()["Addresses"]}
        elif kind == "iam-role":
            ok = rid in {r["RoleName"] for p in iam.get_paginator("list_roles").paginate() for r in p["Roles"]}
        elif kind == "instance-profile":
            ok = rid in {r["InstanceProfileName"] for p in iam.get_paginator("list_instance_profiles").paginate()
                         for r in p["InstanceProfiles"]}
        else:
            raise AssertionError(f"exists() does not know {kind}")
        if ok:
            live.append((kind, rid))
    return live


class DestroyFailed(Exception):
    """`pulumi destroy` ended with errors: one diagnostic line per resource whose delete failed."""


# what the provider's delete of each kind retries, for how long (simulated seconds), and on which codes:
# terraform-provider-aws, the resources pulumi-aws bridges (internal/service/ec2/...):
#   vpc_security_group.go resourceSecurityGroupDelete: RetryWhenAWSErrCodeEquals(d.Timeout(Delete) = 15 min,
#     DependencyViolation, InvalidGroup.InUse)
#   vpc_subnet.go resourceSubnetDelete: RetryWhenAWSErrCodeEquals(d.Timeout(Delete) = 20 min, DependencyViolation)
#   vpc_internet_gateway.go detachInternetGateway: retries DependencyViolation ("mapped public address") 20 min
#   vpc_.go resourceVPCDelete: RetryWhenAWSErrCodeEquals(5 min, DependencyViolation)
# and no retry for the placement group (ec2_placement_group.go resourcePlacementGroupDelete: only
# InvalidPlacementGroup.Unknown is "already gone"; InvalidPlacementGroup.InUse fails the delete:
# hashicorp/terraform-provider-aws#21460, scylladb/scylla-cluster-tests#6742).
PROVIDER_RETRIES = {
    "security-group": (900.0, ("DependencyViolation", "InvalidGroup.InUse")),
    "subnet": (1200.0, ("DependencyViolation",)),
    "internet-gateway": (1200.0, ("DependencyViolation",)),
    "vpc": (300.0, ("DependencyViolation",)),
}
PROVIDER_NAMES = {"fleet": "EC2 Fleet", "launch-template": "EC2 Launch Template", "placement-group":
                  "EC2 Placement Group", "key-pair": "EC2 Key Pair", "security-group": "Security Group",
                  "subnet": "EC2 Subnet", "route-table": "Route Table", "internet-gateway": "EC2 Internet Gateway",
                  "vpc": "EC2 VPC", "iam-role": "IAM Role", "instance-profile": "IAM Instance Profile",
                  "instance": "EC2 Instance", "elastic-ip": "EC2 EIP"}


def destroy_as_provider(made: list[tuple[str, str]], session: Any, region: str = "us-east-1", *,
                        sleep: Any = None, now: Any = None) -> None:
    """`pulumi destroy` of what `apply` made, as pulumi-aws deletes it. The engine deletes a resource
    once nothing that refers to it is left, and independent resources at the same time (Pulumi docs,
    "pulumi destroy": `--parallel`, default unbounded); each delete is terraform-provider-aws's:

    - the instant fleet: DeleteFleets(TerminateInstances) and nothing more: "Limiting waiter to
      non-instant fleet types" (ec2_fleet.go, resourceFleetDelete); its instances are not in the
      stack (the fleet reports them) and keep shutting down after it is "deleted";
    - a standalone instance (no fleet): TerminateInstances and a wait for `terminated`
      (ec2_instance.go, resourceInstanceDelete);
    - the deletes of PROVIDER_RETRIES with their retries; any other failure fails that resource at once.

    With `--continue-on-error` (which the driver passes) the engine goes on with what does not
    depend on a failed resource and reports each failure; a failed resource, and what it refers to,
    stay in the state (`made` keeps them; the deleted go). Raises DestroyFailed with each failed
    resource's diagnostic. `sleep`/`now`: the scaled clock."""
    import time

    from botocore.exceptions import ClientError

    from gpucluster.domain import Leftover
    from gpucluster.infra.aws.leftovers import _delete_one

    sleep, now = sleep or time.sleep, now or time.monotonic
    ec2 = client(session, "ec2", region)
    if any(k == "fleet" for k, _ in made):
        made[:] = [(k, i) for k, i in made if k != "instance"]  # the fleet's: not resources of the stack
    errors: list[str] = []

    def attempt(kind: str, rid: str) -> str | None:
        """None: deleted (or already gone); "retry"; else the diagnostic of a failed delete."""
        try:
            if kind == "fleet":
                ec2.delete_fleets(FleetIds=[rid], TerminateInstances=True)
            elif kind == "instance":
                ec2.terminate_instances(InstanceIds=[rid])
                state = ec2.describe_instances(InstanceIds=[rid])["Reservations"][0]["Instances"][0]["State"]["Name"]
                return None if state == "terminated" else "retry"
            else:
                _delete_one(session, Leftover(kind, rid, None if kind in ("iam-role", "instance-profile") else region))
            return None
        except ClientError as exc:
            err = exc.response.get("Error", {})
            code = err.get("Code", "")
            if "NotFound" in code or code in ("InvalidPlacementGroup.Unknown", "NoSuchEntity"):
                return None
            if code in PROVIDER_RETRIES.get(kind, (0.0, ()))[1]:
                return "retry"
            return (f"deleting {PROVIDER_NAMES.get(kind, kind)} ({rid}): operation error {exc.operation_name}, https "
                    "response error StatusCode: 400, RequestID: 00000000-0000-0000-0000-000000000000, "
                    f"api error {code}: {err.get('Message', '')}")

    pending = list(reversed(made))  # not started yet
    active: dict[tuple[str, str], float] = {}  # being deleted (retrying) -> since when
    keep: set[str] = set()  # what a failed resource refers to: the engine does not delete it
    while pending or active:
        left = {rid for _, rid in pending} | {rid for _, rid in active} | {rid for _, rid in made if rid in keep}
        for entry in list(pending):
            if entry[1] in keep:
                pending.remove(entry)
            elif not any(entry[1] in DEPENDS_ON.get(other, set()) for other in left - {entry[1]}):
                pending.remove(entry)  # nothing that refers to it is left: its delete starts now
                active[entry] = now()
        if not active:
            break
        for (kind, rid), start in list(active.items()):
            outcome = attempt(kind, rid)
            if outcome is None:
                made.remove((kind, rid))
                del active[(kind, rid)]
            elif outcome != "retry" or now() - start >= PROVIDER_RETRIES.get(kind, (600.0,))[0]:
                errors.append(outcome if outcome != "retry" else f"deleting {PROVIDER_NAMES.get(kind, kind)} "
                              f"({rid}): timeout while waiting for it to be deleted")
                del active[(kind, rid)]
                todo = [rid]
                while todo:
                    for dep in DEPENDS_ON.get(todo.pop(), set()):
                        if dep not in keep:
                            keep.add(dep)
                            todo.append(dep)
        if active:
            sleep(5.0)
    if errors:
        raise DestroyFailed("\n".join(errors))
