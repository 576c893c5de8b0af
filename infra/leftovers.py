"""Find and delete what gpucluster created, by tag/label, independently of any local state.

Every resource gpucluster creates carries `managed-by=gpucluster` and `gpucluster-cluster=<name>`
(and `gpucluster-run=<run id>` when made by a run): AWS tags, GCP labels. The sweep asks the
cloud for exactly those, so it finds resources a crashed process never recorded, and it leaves
anything without the tag alone (someone else's instances in the same account are never touched).

- AWS (boto3, per region): instances not terminated or shutting down, volumes, security groups,
  key pairs, placement groups, network interfaces, Elastic IPs, subnets, route tables, internet
  gateways, VPCs; IAM roles and instance profiles (global).
- GCP (google-cloud-container): GKE clusters whose `resource_labels` carry the tag (node pools
  go with their cluster).

`find_leftovers(...) -> Check` is the teardown check: what is left and, never dropped, what could not
be checked (no credentials, a denied call, no project); `scan(...)` returns the same with the cluster
and run of each find; `delete_leftovers(list)` deletes in
dependency order and returns the errors. boto3 and google-cloud are imported inside functions.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Iterable

from gpucluster.errors import GpuclusterError, UsageError, not_allowed, require

from gpucluster.domain import Check, Leftover

MANAGED_BY = ("managed-by", "gpucluster")
CLUSTER_TAG = "gpucluster-cluster"
RUN_TAG = "gpucluster-run"
SWEEP_CLOUDS = ("aws", "gcp")

# deletion order: what holds others first
AWS_ORDER = ("instance", "elastic-ip", "network-interface", "volume", "placement-group", "key-pair",
             "security-group", "subnet", "route-table", "internet-gateway", "vpc", "instance-profile", "iam-role")
LIVE_INSTANCE_STATES = ("pending", "running", "stopping", "stopped")


@dataclass(frozen=True)
class Found:
    leftover: Leftover
    cluster: str | None
    run_id: str | None


@dataclass
class SweepReport:
    found: list[Found] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # what could not be checked, and why

    @property
    def leftovers(self) -> list[Leftover]:
        return [f.leftover for f in self.found]

    @property
    def check(self) -> Check:
        """Three-state verdict: a skipped check is never counted as clean."""
        return Check(tuple(self.leftovers), tuple(self.skipped))


def _tag_dict(tags: Iterable[dict[str, str]] | None) -> dict[str, str]:
    return {t.get("Key"): t.get("Value") for t in (tags or [])}


def _wanted(tags: dict[str, str], name: str | None, run_id: str | None) -> bool:
    if tags.get(MANAGED_BY[0]) != MANAGED_BY[1]:
        return False
    if name and tags.get(CLUSTER_TAG) != name:
        return False
    if run_id and not name and tags.get(RUN_TAG) != run_id:
        return False
    return True


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


def default_aws_regions(session: Any = None) -> list[str]:
    region = _session(session).region_name or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    return [region or "us-east-1"]


# -- AWS ------------------------------------------------------------------------------------------
def scan_aws(regions: Iterable[str], name: str | None = None, run_id: str | None = None, *,
             session: Any = None, include_iam: bool = True) -> SweepReport:
    from botocore.exceptions import BotoCoreError, ClientError

    session = _session(session)
    report = SweepReport()
    filters = _aws_filters(name, run_id)

    def add(kind: str, rid: str, region: str | None, tags: dict[str, str], detail: str = "") -> None:
        label = tags.get("Name") or ""
        text = " ".join(x for x in (label, detail, f"cluster={tags.get(CLUSTER_TAG, '?')}") if x)
        report.found.append(Found(Leftover(kind, rid, region, text), tags.get(CLUSTER_TAG), tags.get(RUN_TAG)))

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
                        f"{inst.get('InstanceType', '')} {state}")
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
        _scan_iam(session, name, run_id, report, add)
    report.found = [f for f in report.found if _wanted_found(f, name, run_id)]
    return report


def _wanted_found(f: Found, name: str | None, run_id: str | None) -> bool:
    if name and f.cluster != name:
        return False
    if run_id and not name and f.run_id != run_id:
        return False
    return True


def _scan_iam(session: Any, name: str | None, run_id: str | None, report: SweepReport, add) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    iam = session.client("iam")
    try:
        for page in iam.get_paginator("list_roles").paginate(PathPrefix="/"):
            for role in page.get("Roles", []):
                tags = _tag_dict(iam.list_role_tags(RoleName=role["RoleName"]).get("Tags"))
                if _wanted(tags, name, run_id):
                    add("iam-role", role["RoleName"], None, tags)
        for page in iam.get_paginator("list_instance_profiles").paginate(PathPrefix="/"):
            for prof in page.get("InstanceProfiles", []):
                # ListInstanceProfiles may leave tags out; GetInstanceProfile carries them
                tags = _tag_dict(prof.get("Tags") or iam.get_instance_profile(
                    InstanceProfileName=prof["InstanceProfileName"])["InstanceProfile"].get("Tags"))
                if _wanted(tags, name, run_id):
                    add("instance-profile", prof["InstanceProfileName"], None, tags)
    except (ClientError, BotoCoreError, NotImplementedError) as exc:
        report.skipped.append(f"IAM roles and instance profiles: not checked ({_why(exc)})")


def _why(exc: BaseException) -> str:
    code = getattr(exc, "response", {}).get("Error", {}).get("Code") if hasattr(exc, "response") else None
    if isinstance(exc, NotImplementedError) or code in ("NotImplemented", "InternalFailure"):
        return "the endpoint does not implement it"
    return f"{code}: {exc}" if code else str(exc)


def delete_aws(leftovers: list[Leftover], *, session: Any = None, wait_seconds: int = 600) -> list[str]:
    from botocore.exceptions import BotoCoreError, ClientError, WaiterError

    session = _session(session)
    errors: list[str] = []
    order = {k: i for i, k in enumerate(AWS_ORDER)}
    ordered = sorted((lo for lo in leftovers if lo.kind in order), key=lambda lo: order[lo.kind])
    terminated: dict[str, list[str]] = {}
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
        if lo.kind == "instance":
            continue
        try:
            _delete_one(session, lo)
        except (ClientError, BotoCoreError, NotImplementedError) as exc:
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", "") if hasattr(exc, "response") else ""
            if "NotFound" in code:
                continue  # already gone: that is the goal
            errors.append(f"{lo.kind} {lo.id}{' in ' + lo.region if lo.region else ''}: {_why(exc)}")
    return errors


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
    elif lo.kind == "security-group":
        ec2.delete_security_group(GroupId=lo.id)
    elif lo.kind == "key-pair":
        ec2.delete_key_pair(KeyName=lo.id)  # names are unique per region
    elif lo.kind == "placement-group":
        ec2.delete_placement_group(GroupName=lo.id)
    elif lo.kind == "network-interface":
        ec2.delete_network_interface(NetworkInterfaceId=lo.id)
    elif lo.kind == "elastic-ip":
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


# -- GCP ------------------------------------------------------------------------------------------
def gcp_project(flag: str | None = None) -> str | None:
    """The project by the one resolution order (`gcp_access.resolve_project`), or None."""
    from gpucluster.infra.gcp.access import resolve_project

    return resolve_project(flag, None, required=False)[0]


def _gke_client(client: Any = None) -> Any:
    if client is not None:
        return client
    require("google.cloud.container_v1", "gcp")
    from google.cloud import container_v1

    return container_v1.ClusterManagerClient()


def scan_gcp(name: str | None = None, run_id: str | None = None, *, project: str | None = None,
             client: Any = None) -> SweepReport:
    report = SweepReport()
    try:
        project = gcp_project(project)
    except GpuclusterError as exc:  # a malformed project name
        report.skipped.append(f"GKE clusters: not checked ({exc.message})")
        return report
    if not project:
        report.skipped.append("GKE clusters: not checked (no Google Cloud project: pass --project, or set "
                              "GOOGLE_CLOUD_PROJECT, or `gcloud config set project`)")
        return report
    try:
        resp = _gke_client(client).list_clusters(parent=f"projects/{project}/locations/-")
    except GpuclusterError:
        raise
    except Exception as exc:  # noqa: BLE001 - google.api_core errors vary
        report.skipped.append(f"GKE clusters in {project}: not checked ({exc})")
        return report
    for cl in resp.clusters:
        labels = dict(cl.resource_labels)
        if not _wanted(labels, name, run_id):
            continue
        status = getattr(cl.status, "name", str(cl.status))
        path = f"projects/{project}/locations/{cl.location}/clusters/{cl.name}"
        # STOPPING: GKE is deleting it (a long-running operation, minutes); it still exists and may bill
        deleting = status == "STOPPING"
        detail = f"{status}{' (being deleted)' if deleting else ''} cluster={labels.get(CLUSTER_TAG, '?')}"
        report.found.append(Found(Leftover("gke-cluster", path, cl.location, detail, deleting=deleting),
                                  labels.get(CLUSTER_TAG), labels.get(RUN_TAG)))
    return report


def delete_gcp(leftovers: list[Leftover], *, client: Any = None, wait_seconds: float = 1800,
               poll_seconds: float = 10.0, clock: Any = None, sleep: Any = None) -> list[str]:
    """Delete GKE clusters (node pools go with them) and poll each long-running delete operation
    (`get_operation` until status DONE, as the GKE API reference describes `projects.locations.operations`)
    within `wait_seconds`; an operation still running past it is an error naming it. A cluster the API
    is already deleting (STOPPING) is not deleted again."""
    import time as _time

    clock, sleep = clock or _time.monotonic, sleep or _time.sleep
    errors = []
    ops: list[tuple[Leftover, str]] = []
    gke = _gke_client(client) if any(lo.kind == "gke-cluster" for lo in leftovers) else None
    for lo in leftovers:
        if lo.kind != "gke-cluster" or lo.deleting:
            continue
        try:
            op = gke.delete_cluster(name=lo.id)
        except Exception as exc:  # noqa: BLE001
            if "NotFound" in type(exc).__name__ or "404" in str(exc):
                continue
            errors.append(f"GKE cluster {lo.id}: {exc}")
            continue
        op_name = getattr(op, "name", None)
        if op_name:
            ops.append((lo, lo.id.split("/clusters/")[0] + f"/operations/{op_name.rsplit('/', 1)[-1]}"))
    end = clock() + wait_seconds
    for lo, op_path in ops:
        while True:
            try:
                op = gke.get_operation(name=op_path)
            except Exception as exc:  # noqa: BLE001 - the scan after this still checks
                errors.append(f"GKE cluster {lo.id}: cannot read its delete operation ({exc})")
                break
            status = getattr(getattr(op, "status", None), "name", str(getattr(op, "status", "")))
            if status == "DONE":
                err = getattr(op, "error", None)
                if err is not None and getattr(err, "message", ""):
                    errors.append(f"GKE cluster {lo.id}: delete failed ({err.message})")
                break
            if clock() >= end:
                errors.append(f"GKE cluster {lo.id}: still deleting after {wait_seconds:.0f} s (operation "
                              f"{op_path} is {status})")
                break
            sleep(poll_seconds)
    return errors


# -- the entry points -------------------------------------------------------------------------------
def scan(cloud: str, name: str | None = None, run_id: str | None = None, live_clusters: Iterable[str] = (), *,
         regions: Iterable[str] | None = None, session: Any = None, project: str | None = None,
         gke_client: Any = None) -> SweepReport:
    """What is still tagged as ours (minus resources of `live_clusters`), and what was not checked."""
    if cloud not in SWEEP_CLOUDS:
        raise UsageError(not_allowed("cloud", cloud, SWEEP_CLOUDS))
    if cloud == "aws":
        report = scan_aws(list(regions or default_aws_regions(session)), name, run_id, session=session)
    else:
        report = scan_gcp(name, run_id, project=project, client=gke_client)
    live = set(live_clusters)
    report.found = [f for f in report.found if f.cluster not in live]
    return report


def find_leftovers(cloud: str, name: str | None = None, run_id: str | None = None, live_clusters: Iterable[str] = (),
                   **kw: Any) -> Check:
    """The teardown check: what is left *and* what could not be checked (never dropped)."""
    return scan(cloud, name, run_id, live_clusters, **kw).check


def delete_leftovers(leftovers: Check | list[Leftover], *, session: Any = None, gke_client: Any = None,
                     wait_seconds: int = 600) -> list[str]:
    """Delete what `find_leftovers` found (a Check or a list), in dependency order; the errors
    (empty when all went)."""
    leftovers = list(leftovers.leftovers) if isinstance(leftovers, Check) else list(leftovers)
    aws = [lo for lo in leftovers if lo.kind != "gke-cluster"]
    gke = [lo for lo in leftovers if lo.kind == "gke-cluster"]
    errors: list[str] = []
    if aws:
        errors += delete_aws(aws, session=session, wait_seconds=wait_seconds)
    if gke:
        errors += delete_gcp(gke, client=gke_client, wait_seconds=wait_seconds)
    return errors
