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
import datetime
import functools
from typing import Callable, Iterable, Iterator, Sequence

from gpucluster.domain import Leftover
from gpucluster.errors import require
from gpucluster.infra.contract import ScanScope
from gpucluster.infra.leftovers import (CLUSTER_TAG, MANAGED_BY, RUN_TAG, Found, ScanReport, wanted, wanted_found,
                                        with_marks)
from gpucluster.states import JsonObject

from .sdk import AwsSession, Ec2Client, IamClient

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


def _aws_filters(name: str | None, run_id: str | None) -> list[JsonObject]:
    filters = [{"Name": f"tag:{MANAGED_BY[0]}", "Values": [MANAGED_BY[1]]}]
    if name:
        filters.append({"Name": f"tag:{CLUSTER_TAG}", "Values": [name]})
    elif run_id:
        filters.append({"Name": f"tag:{RUN_TAG}", "Values": [run_id]})
    return filters


def _session(session: AwsSession = None) -> AwsSession:
    if session is not None:
        return session
    require("boto3", "aws")
    import boto3

    return boto3.session.Session()


def default_regions(session: AwsSession = None) -> list[str]:
    region = _session(session).region_name or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    return [region or "us-east-1"]


class _Collector:
    """The scan's report, and how a found resource goes into it (marks, cluster, run)."""

    def __init__(self, report: ScanReport, filters: list[JsonObject]) -> None:
        self.report = report
        self.filters = filters

    def add(self, kind: str, rid: str, region: str | None, tags: dict[str, str], detail: str = "",
            created: object = None, hourly: str | None = None, deleting: bool = False) -> None:
        label = tags.get("Name") or ""
        text = " ".join(x for x in (label, detail, f"cluster={tags.get(CLUSTER_TAG, '?')}") if x)
        since = created.timestamp() if isinstance(created, datetime.datetime) else None
        lo = with_marks(Leftover(kind, rid, region, text, deleting=deleting), tags, since, hourly)
        self.report.found.append(Found(lo, tags.get(CLUSTER_TAG), tags.get(RUN_TAG)))


class _Lister:
    """One region's tag-filtered listings, into the scan's collector."""

    def __init__(self, ec2: Ec2Client, region: str, collect: _Collector) -> None:
        self.ec2, self.region, self.collect = ec2, region, collect

    def each(self, method: str, key: str, kind: str, **kw: object) -> Iterator[JsonObject]:
        """The records of one tag-filtered Describe call, every page; a call that fails is a skipped line."""
        from botocore.exceptions import BotoCoreError, ClientError

        ec2, filters = self.ec2, self.collect.filters
        try:
            if ec2.can_paginate(method):
                pages = ec2.get_paginator(method).paginate(Filters=filters, **kw)
                for page in pages:
                    yield from page.get(key, [])
            else:
                yield from getattr(ec2, method)(Filters=filters, **kw).get(key, [])
        except (ClientError, BotoCoreError, NotImplementedError) as exc:
            self.collect.report.skipped.append(f"{kind}s in {self.region}: not checked ({_why(exc)})")


def _scan_instances(r: _Lister) -> None:
    region, c = r.region, r.collect
    for page in r.each("describe_instances", "Reservations", "instance"):
        for inst in page.get("Instances", []):
            state = inst.get("State", {}).get("Name")
            if state in LIVE_INSTANCE_STATES:
                c.add("instance", inst["InstanceId"], region, _tag_dict(inst.get("Tags")),
                      f"{inst.get('InstanceType', '')} {state}", inst.get("LaunchTime"),
                      _hourly(region, inst.get("InstanceType"), inst.get("InstanceLifecycle") == "spot"),
                      deleting=state == "shutting-down")


def _scan_compute(r: _Lister) -> None:
    """Launch templates, volumes, security groups, key pairs and placement groups."""
    region, c = r.region, r.collect
    for lt in r.each("describe_launch_templates", "LaunchTemplates", "launch template"):
        c.add("launch-template", lt["LaunchTemplateId"], region, _tag_dict(lt.get("Tags")),
              lt.get("LaunchTemplateName", ""))
    for vol in r.each("describe_volumes", "Volumes", "volume"):
        if vol.get("State") not in ("deleting", "deleted"):
            c.add("volume", vol["VolumeId"], region, _tag_dict(vol.get("Tags")), f"{vol.get('Size')} GB {vol.get('State')}")
    for sg in r.each("describe_security_groups", "SecurityGroups", "security group"):
        c.add("security-group", sg["GroupId"], region, _tag_dict(sg.get("Tags")), sg.get("GroupName", ""))
    for kp in r.each("describe_key_pairs", "KeyPairs", "key pair"):
        c.add("key-pair", kp["KeyName"], region, _tag_dict(kp.get("Tags")), kp.get("KeyPairId", ""))
    for pg in r.each("describe_placement_groups", "PlacementGroups", "placement group"):
        if pg.get("State") not in ("deleting", "deleted"):
            c.add("placement-group", pg["GroupName"], region, _tag_dict(pg.get("Tags")), pg.get("Strategy", ""))


def _scan_network(r: _Lister) -> None:
    """Network interfaces, Elastic IPs, subnets, route tables, internet gateways and VPCs."""
    region, c = r.region, r.collect
    for eni in r.each("describe_network_interfaces", "NetworkInterfaces", "network interface"):
        c.add("network-interface", eni["NetworkInterfaceId"], region, _tag_dict(eni.get("TagSet")), eni.get("Status", ""))
    for addr in r.each("describe_addresses", "Addresses", "elastic IP"):
        # DescribeAddresses always gives PublicIp (EC2 API reference, Address); AllocationId is the id to release
        c.add("elastic-ip", addr.get("AllocationId") or addr["PublicIp"], region, _tag_dict(addr.get("Tags")),
              addr.get("PublicIp", ""))
    for sn in r.each("describe_subnets", "Subnets", "subnet"):
        c.add("subnet", sn["SubnetId"], region, _tag_dict(sn.get("Tags")), sn.get("CidrBlock", ""))
    for rt in r.each("describe_route_tables", "RouteTables", "route table"):
        if not any(a.get("Main") for a in rt.get("Associations", [])):
            c.add("route-table", rt["RouteTableId"], region, _tag_dict(rt.get("Tags")))
    for igw in r.each("describe_internet_gateways", "InternetGateways", "internet gateway"):
        c.add("internet-gateway", igw["InternetGatewayId"], region, _tag_dict(igw.get("Tags")))
    for vpc in r.each("describe_vpcs", "Vpcs", "VPC"):
        c.add("vpc", vpc["VpcId"], region, _tag_dict(vpc.get("Tags")), vpc.get("CidrBlock", ""))


def scan(regions: Iterable[str], name: str | None = None, run_id: str | None = None, *,
             session: AwsSession = None, include_iam: bool = True, owner: str | None = None) -> ScanReport:
    """`owner`: whose IAM roles and instance profiles are listed (None: every owner's, in these
    regions). EC2 resources are listed in each region whoever made them: the caller sorts them by
    their marks (`gpucluster.ownership.Ownership`)."""
    session = _session(session)
    report = ScanReport()
    collect = _Collector(report, _aws_filters(name, run_id))
    regions = list(dict.fromkeys(regions))
    for region in dict.fromkeys(regions):
        ec2 = session.client("ec2", region_name=region)
        lister = _Lister(ec2, region, collect)
        _scan_instances(lister)
        _scan_fleets(ec2, region, name, run_id, collect)
        _scan_compute(lister)
        _scan_network(lister)
    if include_iam:
        _scan_iam(session, name, run_id, collect, regions, owner)
    report.found = [f for f in report.found if wanted_found(f, name, run_id)]
    return report


def _hourly(region: str, itype: str | None, spot: bool) -> str | None:
    """The instance's USD/hour from the price catalog (a foreign one is listed with it), or None."""
    if not itype:
        return None
    from gpucluster.catalog.prices import load_catalog

    row = load_catalog().find("aws", region, "instance", itype, "spot" if spot else "on-demand")
    return None if row is None else str(row.price)


def _role_tags(iam: IamClient, name: str) -> list[dict[str, str]] | None:
    tags: list[dict[str, str]] | None = iam.list_role_tags(RoleName=name).get("Tags")
    return tags


def _profile_tags(iam: IamClient, prof: JsonObject) -> list[dict[str, str]] | None:
    """ListInstanceProfiles may leave tags out; GetInstanceProfile carries them."""
    tags: list[dict[str, str]] | None = (prof.get("Tags") or iam.get_instance_profile(
        InstanceProfileName=prof["InstanceProfileName"])["InstanceProfile"].get("Tags"))
    return tags


def _scan_iam(session: AwsSession, name: str | None, run_id: str | None, collect: _Collector,
              regions: list[str], owner: str | None) -> None:
    """IAM roles and instance profiles under the gpucluster path of `owner` (every owner's when
    None) in `regions`, never a listing of the whole account."""
    from botocore.exceptions import BotoCoreError, ClientError

    iam = session.client("iam")
    report, add = collect.report, collect.add

    def tags_of(kind: str, rid: str, read: Callable[[], list[dict[str, str]] | None]) -> dict[str, str] | None:
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
                    tags = tags_of("IAM role", rn, functools.partial(_role_tags, iam, rn))
                    if tags is not None and wanted(tags, name, run_id):
                        add("iam-role", rn, None, tags, created=role.get("CreateDate"))
        for prefix in prefixes:
            for page in iam.get_paginator("list_instance_profiles").paginate(PathPrefix=prefix):
                for prof in page.get("InstanceProfiles", []):
                    pn = prof["InstanceProfileName"]
                    if not _iam_in_scope(prof.get("Path", ""), regions, name, owner):
                        continue
                    # ListInstanceProfiles may leave tags out; GetInstanceProfile carries them
                    tags = tags_of("instance profile", pn, functools.partial(_profile_tags, iam, prof))
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


def _where(lo: Leftover) -> str:
    return f"{lo.kind} {lo.id}{' in ' + lo.region if lo.region else ''}"


def _delete_fleets(session: AwsSession, ordered: list[Leftover], errors: list[str]) -> None:
    """Fleets first: deleting one terminates its instances (and an instant fleet cannot be deleted
    without), so none is left running while its fleet is deleted after them."""
    from botocore.exceptions import BotoCoreError, ClientError

    for lo in [lo for lo in ordered if lo.kind == "fleet"]:
        try:
            _delete_one(session, lo)
        except (ClientError, BotoCoreError, NotImplementedError) as exc:
            if not gone(exc):
                errors.append(f"{_where(lo)}: {_why(exc)}")


def _terminate_and_wait(session: AwsSession, ordered: list[Leftover], wait_seconds: int, errors: list[str]) -> None:
    """TerminateInstances per region, then EC2's waiter until they are terminated."""
    from botocore.exceptions import BotoCoreError, ClientError, WaiterError

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


def _delete_retrying(session: AwsSession, lo: Leftover, retry_seconds: float, sleep: Callable[[float], None],
                     clock: Callable[[], float]) -> str | None:
    """Delete one resource, retried with backoff while something still holds it; the error line, or None."""
    from botocore.exceptions import BotoCoreError, ClientError

    start, delay = clock(), 2.0
    while True:
        try:
            _delete_one(session, lo)
            return None
        except (ClientError, BotoCoreError, NotImplementedError) as exc:
            if gone(exc):
                return None  # already gone: that is the goal
            if _error_code(exc) in RETRY_CODES and clock() - start + delay <= retry_seconds:
                sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            waited = f" (retried for {clock() - start:.0f} s)" if _error_code(exc) in RETRY_CODES else ""
            return f"{_where(lo)}: {_why(exc)}{waited}"


def delete(leftovers: list[Leftover], *, session: AwsSession = None, wait_seconds: int = 600,
           retry_seconds: float = 180, sleep: Callable[[float], None] | None = None,
           clock: Callable[[], float] | None = None) -> list[str]:
    """Delete in dependency order. A resource already gone counts as deleted; one that something
    still holds (DependencyViolation, ...) is retried with exponential backoff (2 s doubling to
    30 s) for up to `retry_seconds`; each failure is one line in the returned list."""
    import time

    sleep, clock = sleep or time.sleep, clock or time.monotonic
    session = _session(session)
    errors: list[str] = []
    order = {k: i for i, k in enumerate(DELETE_ORDER)}
    ordered = sorted((lo for lo in leftovers if lo.kind in order), key=lambda lo: order[lo.kind])
    _delete_fleets(session, ordered, errors)
    _terminate_and_wait(session, ordered, wait_seconds, errors)
    for lo in ordered:
        if lo.kind in ("instance", "fleet"):
            continue
        error = _delete_retrying(session, lo, retry_seconds, sleep, clock)
        if error is not None:
            errors.append(error)
    return errors


def _scan_fleets(ec2: Ec2Client, region: str, name: str | None, run_id: str | None, collect: _Collector) -> None:
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
                collect.add("fleet", fleet["FleetId"], region, tags, f"{fleet.get('Type', '')} {fleet.get('FleetState', '')}",
                    fleet.get("CreateTime"))
    except (ClientError, BotoCoreError, NotImplementedError) as exc:
        collect.report.skipped.append(f"fleets in {region}: not checked ({_why(exc)})")


def _delete_fleet(ec2: Ec2Client, fleet_id: str) -> None:
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


def _delete_instance_profile(iam: IamClient, name: str) -> None:
    prof = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
    for role in prof.get("Roles", []):
        iam.remove_role_from_instance_profile(InstanceProfileName=name, RoleName=role["RoleName"])
    iam.delete_instance_profile(InstanceProfileName=name)


def _delete_role(iam: IamClient, name: str) -> None:
    for prof in iam.list_instance_profiles_for_role(RoleName=name).get("InstanceProfiles", []):
        iam.remove_role_from_instance_profile(InstanceProfileName=prof["InstanceProfileName"], RoleName=name)
    for pol in iam.list_attached_role_policies(RoleName=name).get("AttachedPolicies", []):
        iam.detach_role_policy(RoleName=name, PolicyArn=pol["PolicyArn"])
    for pol in iam.list_role_policies(RoleName=name).get("PolicyNames", []):
        iam.delete_role_policy(RoleName=name, PolicyName=pol)
    iam.delete_role(RoleName=name)


def _release_address(ec2: Ec2Client, allocation_id: str) -> None:
    """An associated address in a non-default VPC cannot be released (InvalidIPAddress.InUse):
    disassociate first (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_ReleaseAddress.html)."""
    for addr in ec2.describe_addresses(AllocationIds=[allocation_id]).get("Addresses", []):
        if addr.get("AssociationId"):
            try:
                ec2.disassociate_address(AssociationId=addr["AssociationId"])
            except Exception as exc:  # noqa: BLE001 - an association already gone is fine
                if not gone(exc):
                    raise
    ec2.release_address(AllocationId=allocation_id)


def _delete_route_table(ec2: Ec2Client, table_id: str) -> None:
    rt = ec2.describe_route_tables(RouteTableIds=[table_id])["RouteTables"][0]
    for assoc in rt.get("Associations", []):
        if not assoc.get("Main") and assoc.get("RouteTableAssociationId"):
            ec2.disassociate_route_table(AssociationId=assoc["RouteTableAssociationId"])
    ec2.delete_route_table(RouteTableId=table_id)


def _delete_internet_gateway(ec2: Ec2Client, gateway_id: str) -> None:
    igw = ec2.describe_internet_gateways(InternetGatewayIds=[gateway_id])["InternetGateways"][0]
    for att in igw.get("Attachments", []):
        ec2.detach_internet_gateway(InternetGatewayId=gateway_id, VpcId=att["VpcId"])
    ec2.delete_internet_gateway(InternetGatewayId=gateway_id)


# kind -> how one resource of it is deleted, given the client and its id
_IAM_DELETES: dict[str, Callable[[IamClient, str], None]] = {
    "instance-profile": _delete_instance_profile,
    "iam-role": _delete_role,
}
_EC2_DELETES: dict[str, Callable[[Ec2Client, str], None]] = {
    "volume": lambda ec2, rid: ec2.delete_volume(VolumeId=rid),
    "fleet": _delete_fleet,
    "launch-template": lambda ec2, rid: ec2.delete_launch_template(LaunchTemplateId=rid),
    "security-group": lambda ec2, rid: ec2.delete_security_group(GroupId=rid),
    "key-pair": lambda ec2, rid: ec2.delete_key_pair(KeyName=rid),  # names are unique per region
    "placement-group": lambda ec2, rid: ec2.delete_placement_group(GroupName=rid),
    "network-interface": lambda ec2, rid: ec2.delete_network_interface(NetworkInterfaceId=rid),
    "elastic-ip": _release_address,
    "subnet": lambda ec2, rid: ec2.delete_subnet(SubnetId=rid),
    "route-table": _delete_route_table,
    "internet-gateway": _delete_internet_gateway,
    "vpc": lambda ec2, rid: ec2.delete_vpc(VpcId=rid),
}


def _delete_one(session: AwsSession, lo: Leftover) -> None:
    if lo.kind in _IAM_DELETES:
        _IAM_DELETES[lo.kind](session.client("iam"), lo.id)
        return
    ec2 = session.client("ec2", region_name=lo.region)
    how = _EC2_DELETES.get(lo.kind)
    if how is not None:
        how(ec2, lo.id)


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
