"""The AWS tag scan: what gpucluster created in EC2 and IAM, found by tag, and its deletion.

Per region (boto3): instances not terminated or shutting down, launch templates (EFA), volumes, security groups, key pairs,
placement groups, network interfaces, Elastic IPs, subnets, route tables, internet gateways, VPCs;
IAM roles and instance profiles (global, but never swept account-wide: they are made under the IAM
path `/gpucluster/<owner>/<region>/<cluster>/` (`iam_path`) and listed by that path prefix, for the
scanned regions and the owner asked for). Only resources tagged `managed-by=gpucluster` (and the
cluster / run asked for) are reported, each with who made it (owner, user@host, run, since; an
instance with its hourly price); `delete` goes in dependency order and waits for instances to
terminate. boto3 is imported inside functions. The shared part (tags, report, dispatch) is
`gpucluster.infra.leftovers`."""

from __future__ import annotations

import os
from typing import Any, Iterable, Sequence

from gpucluster.domain import Leftover
from gpucluster.errors import require
from gpucluster.infra.contract import ScanScope
from gpucluster.infra.leftovers import (CLUSTER_TAG, MANAGED_BY, RUN_TAG, Found, ScanReport, wanted, wanted_found,
                                        with_marks)

IAM_ROOT = "/gpucluster/"


def iam_path(owner: str | None, region: str, cluster: str) -> str:
    """Where a cluster's IAM role and instance profile live: found by owner, region and cluster."""
    return f"{IAM_ROOT}{owner or 'unowned'}/{region}/{cluster}/"


def _iam_prefixes(regions: Iterable[str], name: str | None, owner: str | None) -> list[str]:
    """The IAM path prefixes a scan lists: one per region for one owner; every owner's otherwise
    (then filtered by region and cluster, `_iam_in_scope`)."""
    if owner is None:
        return [IAM_ROOT]
    return [f"{IAM_ROOT}{owner}/{r}/" + (f"{name}/" if name else "") for r in dict.fromkeys(regions)]


def _iam_in_scope(path: str, regions: Iterable[str], name: str | None, owner: str | None) -> bool:
    """The path checked here too: a listing need not honour PathPrefix (moto 5.2's
    ListInstanceProfiles returns every profile), and one owner's listing must hold only its own."""
    parts = path.strip("/").split("/")  # gpucluster, owner, region, cluster
    return (len(parts) >= 4 and parts[0] == IAM_ROOT.strip("/") and (owner is None or parts[1] == owner)
            and parts[2] in set(regions) and (name is None or parts[3] == name))


# what the tag scan reports and `delete` handles, in deletion order: what holds others first
DELETE_ORDER = ("fleet", "instance", "launch-template", "elastic-ip", "network-interface", "volume", "placement-group", "key-pair",
                "security-group", "subnet", "route-table", "internet-gateway", "vpc", "instance-profile", "iam-role")
# `shutting-down` still holds its placement group, security groups, subnet, volumes and interfaces:
# EC2 refuses to delete those until it is `terminated` (EC2 User Guide, "Instance state changes";
# DeletePlacementGroup: "You must terminate all instances in the placement group"). Reported as a
# leftover the cloud is already deleting (`Leftover.deleting`): waited for, not deleted again.
LIVE_INSTANCE_STATES = ("pending", "running", "stopping", "stopped", "shutting-down")


def _tag_dict(tags: Iterable[dict[str, str]] | None) -> dict[str, str]:
    return {t["Key"]: t.get("Value", "") for t in (tags or []) if "Key" in t}  # EC2 tags have both


def _aws_filters(name: str | None, run_id: str | None) -> list[dict[str, Any]]:
    filters = [{"Name": f"tag:{MANAGED_BY[0]}", "Values": [MANAGED_BY[1]]}]
    if name:
        filters.append({"Name": f"tag:{CLUSTER_TAG}", "Values": [name]})
    elif run_id:
        filters.append({"Name": f"tag:{RUN_TAG}", "Values": [run_id]})
    return filters


def _session(session: Any = None) -> Any:
    if session is not None:
        return session
    require("boto3", "aws")
    import boto3

    return boto3.session.Session()


def default_regions(session: Any = None) -> list[str]:
    region = _session(session).region_name or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    return [region or "us-east-1"]


def scan(regions: Iterable[str], name: str | None = None, run_id: str | None = None, *,
             session: Any = None, include_iam: bool = True, owner: str | None = None) -> ScanReport:
    """`owner`: whose IAM roles and instance profiles are listed (None: every owner's, in these
    regions). EC2 resources are listed in each region whoever made them: the caller sorts them by
    their marks (`gpucluster.ownership.Ownership`)."""
    from botocore.exceptions import BotoCoreError, ClientError

    session = _session(session)
    report = ScanReport()
    filters = _aws_filters(name, run_id)
    regions = list(dict.fromkeys(regions))

    def add(kind: str, rid: str, region: str | None, tags: dict[str, str], detail: str = "",
            created: Any = None, hourly: str | None = None, deleting: bool = False) -> None:
        label = tags.get("Name") or ""
        text = " ".join(x for x in (label, detail, f"cluster={tags.get(CLUSTER_TAG, '?')}") if x)
        since = created.timestamp() if hasattr(created, "timestamp") else None
        lo = with_marks(Leftover(kind, rid, region, text, deleting=deleting), tags, since, hourly)
        report.found.append(Found(lo, tags.get(CLUSTER_TAG), tags.get(RUN_TAG)))

    for region in dict.fromkeys(regions):
        ec2 = session.client("ec2", region_name=region)

        def each(method: str, key: str, kind: str, **kw: Any):
            try:
                if ec2.can_paginate(method):
                    pages = ec2.get_paginator(method).paginate(Filters=filters, **kw)
                    for page in pages:
                        yield from page.get(key, [])
                else:
                    yield from getattr(ec2, method)(Filters=filters, **kw).get(key, [])
            except (ClientError, BotoCoreError, NotImplementedError) as exc:
                report.skipped.append(f"{kind}s in {region}: not checked ({_why(exc)})")

        for page in each("describe_instances", "Reservations", "instance"):
            for inst in page.get("Instances", []):
                state = inst.get("State", {}).get("Name")
                if state in LIVE_INSTANCE_STATES:
                    add("instance", inst["InstanceId"], region, _tag_dict(inst.get("Tags")),
                        f"{inst.get('InstanceType', '')} {state}", inst.get("LaunchTime"),
                        _hourly(region, inst.get("InstanceType"), inst.get("InstanceLifecycle") == "spot"),
                        deleting=state == "shutting-down")
        _scan_fleets(ec2, region, name, run_id, add, report)
        for lt in each("describe_launch_templates", "LaunchTemplates", "launch template"):
            add("launch-template", lt["LaunchTemplateId"], region, _tag_dict(lt.get("Tags")),
                lt.get("LaunchTemplateName", ""))
        for vol in each("describe_volumes", "Volumes", "volume"):
            if vol.get("State") not in ("deleting", "deleted"):
                add("volume", vol["VolumeId"], region, _tag_dict(vol.get("Tags")), f"{vol.get('Size')} GB {vol.get('State')}")
        for sg in each("describe_security_groups", "SecurityGroups", "security group"):
            add("security-group", sg["GroupId"], region, _tag_dict(sg.get("Tags")), sg.get("GroupName", ""))
        for kp in each("describe_key_pairs", "KeyPairs", "key pair"):
            add("key-pair", kp["KeyName"], region, _tag_dict(kp.get("Tags")), kp.get("KeyPairId", ""))
        for pg in each("describe_placement_groups", "PlacementGroups", "placement group"):
            if pg.get("State") not in ("deleting", "deleted"):
                add("placement-group", pg["GroupName"], region, _tag_dict(pg.get("Tags")), pg.get("Strategy", ""))
        for eni in each("describe_network_interfaces", "NetworkInterfaces", "network interface"):
            add("network-interface", eni["NetworkInterfaceId"], region, _tag_dict(eni.get("TagSet")), eni.get("Status", ""))
        for addr in each("describe_addresses", "Addresses", "elastic IP"):
            add("elastic-ip", addr.get("AllocationId") or addr.get("PublicIp"), region, _tag_dict(addr.get("Tags")),
                addr.get("PublicIp", ""))
        for sn in each("describe_subnets", "Subnets", "subnet"):
            add("subnet", sn["SubnetId"], region, _tag_dict(sn.get("Tags")), sn.get("CidrBlock", ""))
        for rt in each("describe_route_tables", "RouteTables", "route table"):
            if not any(a.get("Main") for a in rt.get("Associations", [])):
                add("route-table", rt["RouteTableId"], region, _tag_dict(rt.get("Tags")))
        for igw in each("describe_internet_gateways", "InternetGateways", "internet gateway"):
            add("internet-gateway", igw["InternetGatewayId"], region, _tag_dict(igw.get("Tags")))
        for vpc in each("describe_vpcs", "Vpcs", "VPC"):
            add("vpc", vpc["VpcId"], region, _tag_dict(vpc.get("Tags")), vpc.get("CidrBlock", ""))
    if include_iam:
        _scan_iam(session, name, run_id, report, add, regions, owner)
    report.found = [f for f in report.found if wanted_found(f, name, run_id)]
    return report


def _hourly(region: str, itype: str | None, spot: bool) -> str | None:
    """The instance's USD/hour from the price catalog (a foreign one is listed with it), or None."""
    if not itype:
        return None
    from gpucluster.catalog.prices import load_catalog

    row = load_catalog().find("aws", region, "instance", itype, "spot" if spot else "on-demand")
    return None if row is None else str(row.price)


def _scan_iam(session: Any, name: str | None, run_id: str | None, report: ScanReport, add,
              regions: list[str], owner: str | None) -> None:
    """IAM roles and instance profiles under the gpucluster path of `owner` (every owner's when
    None) in `regions`, never a listing of the whole account."""
    from botocore.exceptions import BotoCoreError, ClientError

    iam = session.client("iam")

    def tags_of(kind: str, rid: str, read) -> dict[str, str] | None:
        """One resource's tags; None when it vanished after the list (IAM is eventually consistent:
        NoSuchEntity) or could not be read (then only it is unchecked, not the whole scan)."""
        try:
            return _tag_dict(read())
        except (ClientError, BotoCoreError) as exc:
            if not gone(exc):
                report.skipped.append(f"{kind} {rid}: not checked ({_why(exc)})")
            return None

    prefixes = _iam_prefixes(regions, name, owner)
    try:
        for prefix in prefixes:
            for page in iam.get_paginator("list_roles").paginate(PathPrefix=prefix):
                for role in page.get("Roles", []):
                    rn = role["RoleName"]
                    if not _iam_in_scope(role.get("Path", ""), regions, name, owner):
                        continue
                    tags = tags_of("IAM role", rn, lambda rn=rn: iam.list_role_tags(RoleName=rn).get("Tags"))
                    if tags is not None and wanted(tags, name, run_id):
                        add("iam-role", rn, None, tags, created=role.get("CreateDate"))
        for prefix in prefixes:
            for page in iam.get_paginator("list_instance_profiles").paginate(PathPrefix=prefix):
                for prof in page.get("InstanceProfiles", []):
                    pn = prof["InstanceProfileName"]
                    if not _iam_in_scope(prof.get("Path", ""), regions, name, owner):
                        continue
                    # ListInstanceProfiles may leave tags out; GetInstanceProfile carries them
                    tags = tags_of("instance profile", pn, lambda prof=prof, pn=pn: prof.get("Tags") or
                                   iam.get_instance_profile(InstanceProfileName=pn)["InstanceProfile"].get("Tags"))
                    if tags is not None and wanted(tags, name, run_id):
                        add("instance-profile", pn, None, tags, created=prof.get("CreateDate"))
    except (ClientError, BotoCoreError, NotImplementedError) as exc:
        report.skipped.append(f"IAM roles and instance profiles: not checked ({_why(exc)})")


def _why(exc: BaseException) -> str:
    code = getattr(exc, "response", {}).get("Error", {}).get("Code") if hasattr(exc, "response") else None
    if isinstance(exc, NotImplementedError) or code in ("NotImplemented", "InternalFailure"):
        return "the endpoint does not implement it"
    return f"{code}: {exc}" if code else str(exc)


# Error codes that mean "already gone" (the goal of a delete, and a resource that vanished between
# a list and a describe): EC2's *.NotFound codes, IAM's NoSuchEntity, and EC2's
# InvalidPlacementGroup.Unknown (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html,
# https://docs.aws.amazon.com/IAM/latest/APIReference/CommonErrors.html and each IAM action's errors).
GONE_CODES = ("NoSuchEntity", "InvalidPlacementGroup.Unknown", "fleetIdDoesNotExist")  # DeleteFleetErrorCode
# Codes that mean "something still holds it": retried with backoff, up to `retry_seconds`. EC2
# releases a terminated instance's network interfaces some time after the instance is terminated,
# so security group, subnet and VPC deletes meet DependencyViolation for a while; IAM answers
# DeleteConflict while a role is still in an instance profile.
# An instance that is still shutting down holds its placement group (InvalidPlacementGroup.InUse,
# DeletePlacementGroup), its volumes (VolumeInUse, DeleteVolume) and its network interfaces
# (InvalidNetworkInterface.InUse, DeleteNetworkInterface): EC2 API reference, each action's page and
# "Error codes for the Amazon EC2 API".
RETRY_CODES = ("DependencyViolation", "DeleteConflict", "InvalidIPAddress.InUse", "InvalidPlacementGroup.InUse",
               "VolumeInUse", "InvalidNetworkInterface.InUse")


def _error_code(exc: BaseException) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", "") if hasattr(exc, "response") else "")


def gone(exc: BaseException) -> bool:
    code = _error_code(exc)
    return "NotFound" in code or code in GONE_CODES


def delete(leftovers: list[Leftover], *, session: Any = None, wait_seconds: int = 600, retry_seconds: float = 180,
           sleep: Any = None, clock: Any = None) -> list[str]:
    """Delete in dependency order. A resource already gone counts as deleted; one that something
    still holds (DependencyViolation, ...) is retried with exponential backoff (2 s doubling to
    30 s) for up to `retry_seconds`; each failure is one line in the returned list."""
    import time

    from botocore.exceptions import BotoCoreError, ClientError, WaiterError

    sleep, clock = sleep or time.sleep, clock or time.monotonic
    session = _session(session)
    errors: list[str] = []
    order = {k: i for i, k in enumerate(DELETE_ORDER)}
    ordered = sorted((lo for lo in leftovers if lo.kind in order), key=lambda lo: order[lo.kind])
    # fleets first: deleting one terminates its instances (and an instant fleet cannot be deleted
    # without), so none is left running while its fleet is deleted after them
    for lo in [lo for lo in ordered if lo.kind == "fleet"]:
        try:
            _delete_one(session, lo)
        except (ClientError, BotoCoreError, NotImplementedError) as exc:
            if not gone(exc):
                errors.append(f"fleet {lo.id}{' in ' + lo.region if lo.region else ''}: {_why(exc)}")
    terminated: dict[str | None, list[str]] = {}
    for lo in ordered:
        if lo.kind == "instance":
            terminated.setdefault(lo.region, []).append(lo.id)
    for region, ids in terminated.items():
        ec2 = session.client("ec2", region_name=region)
        try:
            ec2.terminate_instances(InstanceIds=ids)
            ec2.get_waiter("instance_terminated").wait(
                InstanceIds=ids, WaiterConfig={"Delay": 5, "MaxAttempts": max(1, wait_seconds // 5)})
        except (ClientError, BotoCoreError, WaiterError) as exc:
            errors.append(f"instances {', '.join(ids)} in {region}: {_why(exc)}")
    for lo in ordered:
        if lo.kind in ("instance", "fleet"):
            continue
        start, delay = clock(), 2.0
        while True:
            try:
                _delete_one(session, lo)
                break
            except (ClientError, BotoCoreError, NotImplementedError) as exc:
                if gone(exc):
                    break  # already gone: that is the goal
                if _error_code(exc) in RETRY_CODES and clock() - start + delay <= retry_seconds:
                    sleep(delay)
                    delay = min(delay * 2, 30.0)
                    continue
                waited = f" (retried for {clock() - start:.0f} s)" if _error_code(exc) in RETRY_CODES else ""
                errors.append(f"{lo.kind} {lo.id}{' in ' + lo.region if lo.region else ''}: {_why(exc)}{waited}")
                break
    return errors


def _scan_fleets(ec2: Any, region: str, name: str | None, run_id: str | None, add: Any, report: Any) -> None:
    """EC2 Fleets carrying our tags. DescribeFleets filters on no tag (its filters are activity-status,
    excess-capacity-termination-policy, fleet-state, replace-unhealthy-instances and type: EC2 API
    reference), so the tags are matched here. A deleted fleet stays listed for a while in a `deleted*`
    state (EC2 User Guide, "Delete an EC2 Fleet"): that one is gone."""
    from botocore.exceptions import BotoCoreError, ClientError

    # only fleets not deleted: a deleted one stays listed for about two days (EC2 User Guide, "Delete an
    # EC2 Fleet"), and every run leaves one; the fleet-state filter (DescribeFleets) keeps them out
    live = [{"Name": "fleet-state", "Values": ["submitted", "active", "modifying", "failed"]}]
    try:
        pages = (ec2.get_paginator("describe_fleets").paginate(Filters=live) if ec2.can_paginate("describe_fleets")
                 else [ec2.describe_fleets(Filters=live)])
        for page in pages:
            for fleet in page.get("Fleets", []):
                tags = _tag_dict(fleet.get("Tags"))
                if tags.get(MANAGED_BY[0]) != MANAGED_BY[1] or str(fleet.get("FleetState", "")).startswith("deleted"):
                    continue
                if (name and tags.get(CLUSTER_TAG) != name) or (not name and run_id and tags.get(RUN_TAG) != run_id):
                    continue
                add("fleet", fleet["FleetId"], region, tags, f"{fleet.get('Type', '')} {fleet.get('FleetState', '')}",
                    fleet.get("CreateTime"))
    except (ClientError, BotoCoreError, NotImplementedError) as exc:
        report.skipped.append(f"fleets in {region}: not checked ({_why(exc)})")


def _delete_fleet(ec2: Any, fleet_id: str) -> None:
    """DeleteFleets with TerminateInstances (an instant fleet cannot be deleted without: EC2 API
    reference, DeleteFleets). A failed deletion comes back in the answer, not as an error: raised here."""
    from botocore.exceptions import ClientError

    listed = ec2.describe_fleets(FleetIds=[fleet_id]).get("Fleets", [])
    if not listed or all(str(f.get("FleetState", "")).startswith("deleted") for f in listed):
        return  # already deleted (a deleted fleet stays listed for a while): done
    resp = ec2.delete_fleets(FleetIds=[fleet_id], TerminateInstances=True)
    for bad in resp.get("UnsuccessfulFleetDeletions", []):
        err = bad.get("Error") or {}
        raise ClientError({"Error": {"Code": err.get("Code") or "UnsuccessfulFleetDeletion",
                                     "Message": err.get("Message") or f"fleet {fleet_id} not deleted"}},
                          "DeleteFleets")


def _delete_one(session: Any, lo: Leftover) -> None:
    if lo.kind in ("iam-role", "instance-profile"):
        iam = session.client("iam")
        if lo.kind == "instance-profile":
            prof = iam.get_instance_profile(InstanceProfileName=lo.id)["InstanceProfile"]
            for role in prof.get("Roles", []):
                iam.remove_role_from_instance_profile(InstanceProfileName=lo.id, RoleName=role["RoleName"])
            iam.delete_instance_profile(InstanceProfileName=lo.id)
        else:
            for prof in iam.list_instance_profiles_for_role(RoleName=lo.id).get("InstanceProfiles", []):
                iam.remove_role_from_instance_profile(InstanceProfileName=prof["InstanceProfileName"], RoleName=lo.id)
            for pol in iam.list_attached_role_policies(RoleName=lo.id).get("AttachedPolicies", []):
                iam.detach_role_policy(RoleName=lo.id, PolicyArn=pol["PolicyArn"])
            for pol in iam.list_role_policies(RoleName=lo.id).get("PolicyNames", []):
                iam.delete_role_policy(RoleName=lo.id, PolicyName=pol)
            iam.delete_role(RoleName=lo.id)
        return
    ec2 = session.client("ec2", region_name=lo.region)
    if lo.kind == "volume":
        ec2.delete_volume(VolumeId=lo.id)
    elif lo.kind == "fleet":
        _delete_fleet(ec2, lo.id)
    elif lo.kind == "launch-template":
        ec2.delete_launch_template(LaunchTemplateId=lo.id)
    elif lo.kind == "security-group":
        ec2.delete_security_group(GroupId=lo.id)
    elif lo.kind == "key-pair":
        ec2.delete_key_pair(KeyName=lo.id)  # names are unique per region
    elif lo.kind == "placement-group":
        ec2.delete_placement_group(GroupName=lo.id)
    elif lo.kind == "network-interface":
        ec2.delete_network_interface(NetworkInterfaceId=lo.id)
    elif lo.kind == "elastic-ip":
        # an associated address in a non-default VPC cannot be released (InvalidIPAddress.InUse):
        # disassociate first (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_ReleaseAddress.html)
        for addr in ec2.describe_addresses(AllocationIds=[lo.id]).get("Addresses", []):
            if addr.get("AssociationId"):
                try:
                    ec2.disassociate_address(AssociationId=addr["AssociationId"])
                except Exception as exc:  # noqa: BLE001 - an association already gone is fine
                    if not gone(exc):
                        raise
        ec2.release_address(AllocationId=lo.id)
    elif lo.kind == "subnet":
        ec2.delete_subnet(SubnetId=lo.id)
    elif lo.kind == "route-table":
        rt = ec2.describe_route_tables(RouteTableIds=[lo.id])["RouteTables"][0]
        for assoc in rt.get("Associations", []):
            if not assoc.get("Main") and assoc.get("RouteTableAssociationId"):
                ec2.disassociate_route_table(AssociationId=assoc["RouteTableAssociationId"])
        ec2.delete_route_table(RouteTableId=lo.id)
    elif lo.kind == "internet-gateway":
        igw = ec2.describe_internet_gateways(InternetGatewayIds=[lo.id])["InternetGateways"][0]
        for att in igw.get("Attachments", []):
            ec2.detach_internet_gateway(InternetGatewayId=lo.id, VpcId=att["VpcId"])
        ec2.delete_internet_gateway(InternetGatewayId=lo.id)
    elif lo.kind == "vpc":
        ec2.delete_vpc(VpcId=lo.id)


# -- the provisioner's scan and delete (infra.contract.Provisioner), from a typed scope -----------
def scan_scope(name: str | None, run_id: str | None, scope: ScanScope) -> ScanReport:
    """The tag scan in the scope's regions (default: the configured and the catalog's ones)."""
    session = scope.clients.get("session")
    regions = scope.regions or tuple(default_regions(session))
    return scan(list(regions), name, run_id, session=session, owner=scope.owner)


def terminate_in(leftovers: Sequence[Leftover], scope: ScanScope) -> list[str]:
    """TerminateInstances for the instances among `leftovers`, per region, without waiting (the
    caller polls the tag scan, with progress); one line per region that refused. An instance already
    gone counts as terminated."""
    from botocore.exceptions import BotoCoreError, ClientError

    session = _session(scope.clients.get("session"))
    by_region: dict[str | None, list[str]] = {}
    for lo in leftovers:
        if lo.kind == "instance" and not lo.deleting:
            by_region.setdefault(lo.region, []).append(lo.id)
    errors = []
    for region, ids in by_region.items():
        try:
            session.client("ec2", region_name=region).terminate_instances(InstanceIds=ids)
        except (ClientError, BotoCoreError) as exc:
            if not gone(exc):
                errors.append(f"instances {', '.join(ids)} in {region}: {_why(exc)}")
    return errors


def delete_in(leftovers: Sequence[Leftover], scope: ScanScope, wait_seconds: float | None) -> list[str]:
    return delete(list(leftovers), session=scope.clients.get("session"),
                  wait_seconds=600 if wait_seconds is None else int(wait_seconds))
