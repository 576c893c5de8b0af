"""Preflight for `run`/`up --cloud aws`: what would make `RunInstances` fail, asked of AWS before
anything is created (after the plan, before `pulumi up`), and the same checks for `doctor`.

- credentials: STS `GetCallerIdentity`, and temporary ones that cannot be refreshed must outlast the
  run and its teardown (credentials.py);
- the vCPU quota of the run's market and the type's quota class in the run's region, against what
  the cluster needs plus the vCPUs of that class already running there: for g* types "Running
  On-Demand G and VT instances" (L-DB2E81BA) or "All G and VT Spot Instance Requests" (L-3819A6DF),
  for p* types "Running On-Demand P instances" (L-417A185B) or "All P Spot Instance Requests"
  (L-7212CCBC). EC2 counts these quotas in vCPUs
  (https://docs.aws.amazon.com/ec2/latest/instancetypes/ec2-instance-quotas.html);
- with EFA on every network card (efa.py: several interfaces, so an Elastic IP per node), "EC2-VPC
  Elastic IPs" (L-0263D0A3, default 5 per region) minus the addresses already allocated in the region,
  against the nodes;
- the AMI the program would pick (the same name filter, owner `amazon`, newest) and its root
  snapshot size, against `--disk-gb` (RunInstances refuses a root volume smaller than the
  snapshot: "Volume of size N is smaller than snapshot", InvalidBlockDeviceMapping);
- an existing `subnetId`: its route table must send 0.0.0.0/0 to an internet gateway, else the
  nodes get no public route and ssh never answers;
- `CreateLaunchTemplate` with `DryRun=True` for the nodes' template, `RunInstances` with `DryRun=True`
  for the exact instances (AMI, type, zone, count, disk, market) that the instant fleet launches with
  the caller's permissions, and the service-linked role a spot launch needs (launch_checks.py, which
  also says why `CreateFleet` itself is checked with IAM's simulator and not with a dry run).
  EC2 answers `DryRunOperation` when the request would have succeeded and the real error code
  otherwise (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/CommonParameters.html,
  "DryRun"); the codes we explain are in
  https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html.

Each check is a dict shaped like `doctor`'s ({check, ok, detail, fix}); `preflight(spec)` raises a
one-line `PreflightError` (exit 2) for the first failure, naming the quota code or permission, the
region, needed vs available, and the exact request to make.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gpucluster.errors import SpecError
from gpucluster.spec import ClusterSpec
from gpucluster.states import JsonObject

from . import catalog
from .catalog import OPT_IN_REGIONS
from .credentials import lifetime_check
from .efa import EIP_QUOTA, address_check, needs_addresses
from .launch_checks import service_linked_roles, template_dry_run
from .permissions import check as permissions_check
from .rootdisk import root_disk_gb, snapshot_gb, why as rootdisk_why
from .sdk import AwsSession, ClientFor, Ec2Client, QuotasClient

GVT_ON_DEMAND = "L-DB2E81BA"  # Running On-Demand G and VT instances (vCPUs)
GVT_SPOT = "L-3819A6DF"  # All G and VT Spot Instance Requests (vCPUs)
P_ON_DEMAND = "L-417A185B"  # Running On-Demand P instances (vCPUs)
P_SPOT = "L-7212CCBC"  # All P Spot Instance Requests (vCPUs)
QUOTA_NAMES = {GVT_ON_DEMAND: "Running On-Demand G and VT instances", GVT_SPOT: "All G and VT Spot Instance Requests",
               P_ON_DEMAND: "Running On-Demand P instances", P_SPOT: "All P Spot Instance Requests"}
# quota class (shapes.InstanceType.quota_class) -> (on-demand code, spot code); the same source as above
QUOTA_CODES = {"G": (GVT_ON_DEMAND, GVT_SPOT), "P": (P_ON_DEMAND, P_SPOT)}
AMI_OWNERS = ("amazon",)
NO_DEFAULT_VPC = ("VPCIdNotSpecified", "MissingInput")
GVT_FAMILY = re.compile(r"(g|gr|vt)\d")  # g4dn, g5, g5g, g6e, gr6, vt1: the families these quotas count
P_FAMILY = re.compile(r"p\d")  # p3, p4d, p4de, p5, p5e, p5en, p6-b200: the families the P quotas count
FAMILIES = {"G": GVT_FAMILY, "P": P_FAMILY}


class PreflightError(SpecError):
    """The launch would fail in the cloud: said before anything is created (exit 2)."""


def _check(name: str, ok: bool | None, detail: str, fix: str = "") -> JsonObject:
    return {"check": name, "ok": ok, "detail": detail, "fix": fix if ok is False else ""}


def _code(exc: Exception) -> tuple[str, str]:
    err = getattr(exc, "response", {}).get("Error", {}) if hasattr(exc, "response") else {}
    return str(err.get("Code") or type(exc).__name__), str(err.get("Message") or exc).split("\n")[0][:300]


def quota_class(spec: ClusterSpec) -> str:
    """'G' or 'P': which EC2 vCPU quotas the spec's instance type counts against."""
    return catalog.instance_type_of(spec).quota_class


def quota_code(spec: ClusterSpec) -> str:
    on_demand, spot = QUOTA_CODES[quota_class(spec)]
    return spot if spec.spot else on_demand


def _clients(session: AwsSession, region: str) -> ClientFor:
    from botocore.config import Config

    cfg = Config(connect_timeout=5, read_timeout=15, retries={"max_attempts": 3, "mode": "standard"})
    return lambda name: session.client(name, region_name=region, config=cfg)


def quota_value(sq: QuotasClient, code: str) -> float:
    """The applied value of an EC2 quota; the AWS default when none was ever applied
    (GetServiceQuota answers NoSuchResourceException then)."""
    from botocore.exceptions import ClientError

    try:
        return float(sq.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
    except ClientError as exc:
        if _code(exc)[0] != "NoSuchResourceException":
            raise
    return float(sq.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])


def running_vcpus(ec2: Ec2Client, spot: bool, klass: str = "G") -> int:
    """vCPUs of the instances of one quota class (G and VT, or P) pending or running in the region, of
    one market (the quotas count those: G on-demand against L-DB2E81BA, spot against L-3819A6DF; P
    on-demand against L-417A185B, spot against L-7212CCBC)."""
    family = FAMILIES[klass]
    found: list[JsonObject] = []
    pages = ec2.get_paginator("describe_instances").paginate(Filters=[
        {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    for page in pages:
        for res in page.get("Reservations", []):
            found += [i for i in res.get("Instances", []) if family.match(i.get("InstanceType", ""))
                      and (i.get("InstanceLifecycle") == "spot") == spot]
    known = {name: t.vcpus for name, t in catalog.INSTANCE_TYPES.items()}
    unknown = sorted({i["InstanceType"] for i in found if i["InstanceType"] not in known and not i.get("CpuOptions")})
    if unknown:
        for t in ec2.describe_instance_types(InstanceTypes=unknown).get("InstanceTypes", []):
            known[t["InstanceType"]] = int(t["VCpuInfo"]["DefaultVCpus"])
    total = 0
    for i in found:
        cpu = i.get("CpuOptions") or {}
        total += (int(cpu["CoreCount"]) * int(cpu.get("ThreadsPerCore", 1)) if cpu.get("CoreCount")
                  else known.get(i["InstanceType"], 0))
    return total


def newest_ami(ec2: Ec2Client, spec: ClusterSpec) -> JsonObject | None:
    """The image the program would launch: option `ami`, else the newest matching DLAMI."""
    pinned = catalog.option(spec, "ami")
    if pinned:
        images = ec2.describe_images(ImageIds=[str(pinned)]).get("Images", [])
    else:
        images = ec2.describe_images(Owners=list(AMI_OWNERS), Filters=[
            {"Name": "name", "Values": catalog.ami_name_patterns(spec)},
            {"Name": "architecture", "Values": ["x86_64"]},
            {"Name": "state", "Values": ["available"]}]).get("Images", [])
    return max(images, key=lambda i: i.get("CreationDate") or "", default=None)


def root_snapshot_gb(image: JsonObject) -> int | None:
    return snapshot_gb(image.get("RootDeviceName"), image.get("BlockDeviceMappings", []))


def disk_for(spec: ClusterSpec, image: JsonObject) -> int:
    """The root volume the program gives each node: `--disk-gb`, else sized for `image` (rootdisk.py)."""
    return root_disk_gb(spec.disk_gb, root_snapshot_gb(image))


def subnet_route(ec2: Ec2Client, subnet_id: str) -> tuple[str | None, bool, str | None]:
    """(the subnet's AZ, whether its route table sends 0.0.0.0/0 to an internet gateway, its VPC). A subnet
    without an explicit association uses its VPC's main route table
    (https://docs.aws.amazon.com/vpc/latest/userguide/VPC_Route_Tables.html)."""
    sub = ec2.describe_subnets(SubnetIds=[subnet_id])["Subnets"][0]
    tables = ec2.describe_route_tables(Filters=[{"Name": "association.subnet-id", "Values": [subnet_id]}])["RouteTables"]
    if not tables:
        tables = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [sub["VpcId"]]},
                                                    {"Name": "association.main", "Values": ["true"]}])["RouteTables"]
    public = any(r.get("DestinationCidrBlock") == "0.0.0.0/0" and str(r.get("GatewayId", "")).startswith("igw-")
                 and r.get("State", "active") == "active" for t in tables for r in t.get("Routes", []))
    return sub.get("AvailabilityZone"), public, sub.get("VpcId")


def first_zone(ec2: Ec2Client, itype: str) -> str | None:
    resp = ec2.describe_instance_type_offerings(LocationType="availability-zone",
                                                Filters=[{"Name": "instance-type", "Values": [itype]}])
    return min((o["Location"] for o in resp.get("InstanceTypeOfferings", [])), default=None)


def launch_request(spec: ClusterSpec, image: JsonObject, zone: str | None) -> JsonObject:
    """The RunInstances request of the whole cluster (every node in one call, MinCount=MaxCount)."""
    req: JsonObject = {
        "DryRun": True, "ImageId": image["ImageId"], "InstanceType": catalog.instance_type_of(spec).name,
        "MinCount": spec.nodes, "MaxCount": spec.nodes,
        "BlockDeviceMappings": [{"DeviceName": image.get("RootDeviceName") or "/dev/sda1", "Ebs": {
            "VolumeSize": disk_for(spec, image), "VolumeType": "gp3", "Encrypted": True,
            "DeleteOnTermination": True}}],
        "MetadataOptions": {"HttpTokens": "required"},
        "InstanceInitiatedShutdownBehavior": "terminate",
    }
    subnet = catalog.option(spec, "subnetId")
    if subnet:
        req["SubnetId"] = str(subnet)
    elif zone:
        req["Placement"] = {"AvailabilityZone": zone}
    if spec.spot:
        req["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
            "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
    return req


def _dry_run_verdict(code: str, msg: str, region: str, spec: ClusterSpec, what: str) -> JsonObject:
    name = f"EC2 RunInstances dry run ({region})"
    if code == "DryRunOperation":
        return _check(name, True, f"{what} would be accepted")
    if code in NO_DEFAULT_VPC:
        return _check(name, None, f"not checked ({code}: the account has no default VPC; the cluster makes its own)")
    if code == "UnauthorizedOperation":
        return _check(name, False, f"permission ec2:RunInstances is denied in {region} for {what}: the instant "
                                   f"fleet launches the nodes with these credentials' ec2:RunInstances ({msg})",
                      "grant ec2:RunInstances (with ec2:CreateTags) to these credentials; read the reason with "
                      "`aws sts decode-authorization-message --encoded-message MESSAGE`")
    if code == "OptInRequired":
        fix = (f"enable the region: aws account enable-region --region-name {region}" if region in OPT_IN_REGIONS
               else "accept the AMI's terms or enable the region in the console, then retry")
        return _check(name, False, f"OptInRequired in {region}: {msg}", fix)
    if code == "PendingVerification":
        return _check(name, False, f"PendingVerification in {region}: the account is still being verified ({msg})",
                      "wait until AWS finishes verifying the account (usually minutes, up to 4 hours) or contact "
                      "AWS Support")
    if code in ("VcpuLimitExceeded", "MaxSpotInstanceCountExceeded"):
        q = quota_code(spec)
        return _check(name, False, f"{code} in {region}: {msg}",
                      f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {q} "
                      f"--desired-value {spec.nodes * _vcpus(spec)} --region {region}")
    return _check(name, False, f"{code} in {region} for {what}: {msg}",
                  "choose another --instance-type, --zone or --region" if code == "Unsupported" else
                  "fix the request and retry (`gpucluster doctor --cloud aws` repeats this check)")


def _address_row(client: ClientFor, ec2: Ec2Client, spec: ClusterSpec, region: str) -> JsonObject:
    """The Elastic IP quota (L-0263D0A3) against the nodes, the addresses allocated in the region counted."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        quota: float | None = quota_value(client("service-quotas"), EIP_QUOTA)
    except Exception:  # noqa: BLE001 - unread: a note, as the vCPU quota's (needs servicequotas:GetServiceQuota)
        quota = None
    try:
        return address_check(ec2, quota, spec, region)
    except (BotoCoreError, ClientError) as exc:
        return _check(f"EC2 quota {EIP_QUOTA} ({region})", None, f"allocated Elastic IPs not visible ({_code(exc)[0]}: "
                                                               f"needs ec2:DescribeAddresses); the cluster needs "
                                                               f"{spec.nodes}")


def _vcpus(spec: ClusterSpec) -> int:
    return catalog.instance_type_of(spec).vcpus


def _identity(client: ClientFor, region: str) -> tuple[JsonObject | None, JsonObject]:
    """(STS GetCallerIdentity's answer or None, the credentials row), asked in `region`."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        ident = client("sts").get_caller_identity()
    except (BotoCoreError, ClientError) as exc:
        return None, _check("aws credentials", False, f"STS GetCallerIdentity failed in {region}: {exc}",
                            "configure credentials: `aws configure` (or `aws sso login --profile P` and "
                            "export AWS_PROFILE=P)")
    return ident, _check("aws credentials", True, f"account {ident.get('Account')} as {ident.get('Arn')} "
                                                  f"(asked in {region})")


def credentials_check(region: str | None = None, session: AwsSession = None) -> list[JsonObject]:
    """`Operations.credentials`: STS GetCallerIdentity in `region` (default: the catalog's), alone."""
    try:
        import boto3
    except ImportError:
        return [_check("aws credentials", False, "boto3 is not installed", "pip install 'gpucluster[aws]'")]
    region = region or catalog.DEFAULT_REGION
    return [_identity(_clients(session or boto3.session.Session(), region), region)[1]]


def credentials_found() -> str | None:
    """`Operations.credentials_found`: boto3's own credential chain, asking no API (botocore's providers:
    the environment, the shared credentials and config files, SSO, the container and instance roles)."""
    try:
        import boto3
    except ImportError:
        return "boto3 is not installed (pip install 'gpucluster[aws]')"
    if boto3.session.Session().get_credentials() is None:
        return ("no AWS credentials (looked in AWS_ACCESS_KEY_ID/AWS_PROFILE, ~/.aws/credentials and ~/.aws/config, "
                "SSO, the container and instance roles); run `aws configure`")
    return None


class _Stop(Exception):
    """A check failed that makes the later ones meaningless: its row is already in `out`."""


@dataclass(frozen=True)
class _Asking:
    """What every step of `checks` asks with: the spec, its region and type, the clients, the caller."""

    spec: ClusterSpec
    region: str
    itype: str
    client: ClientFor
    ec2: Ec2Client
    arn: str
    account: str


def _quota_rows(a: _Asking) -> list[JsonObject]:
    """The vCPU quota of the run's market and type class against the cluster plus what already runs."""
    from botocore.exceptions import BotoCoreError, ClientError

    from gpucluster.plan.shared_answers import shared

    spec, region = a.spec, a.region
    need = spec.nodes * _vcpus(spec)
    code = quota_code(spec)
    qname = f"EC2 quota {code} ({region})"
    try:
        quota = shared(("aws", region, "quota", code), lambda: quota_value(a.client("service-quotas"), code))
    except Exception as exc:  # noqa: BLE001 - informational: the dry run still checks the launch
        return [_check(qname, None, f"could not read {QUOTA_NAMES[code]} ({_code(exc)[0]}: needs "
                                    "servicequotas:GetServiceQuota); the dry run below still checks the launch")]
    try:
        used, seen = shared(("aws", region, "running", bool(spec.spot), quota_class(spec)),
                            lambda: running_vcpus(a.ec2, bool(spec.spot), quota_class(spec))), ""
    except (BotoCoreError, ClientError) as exc:
        used, seen = 0, f" (running instances not visible: {_code(exc)[0]})"
    free = int(quota) - used
    shape = f"{spec.nodes} × {a.itype} = {need} vCPUs"
    if need > free:
        return [_check(qname, False,
                       f"{QUOTA_NAMES[code]} in {region}: the cluster needs {shape}, {max(free, 0)} available "
                       f"(quota {int(quota)}, {used} in use{seen})",
                       f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code "
                       f"{code} --desired-value {math.ceil(used + need)} --region {region}")]
    return [_check(qname, True, f"{QUOTA_NAMES[code]}: {free} of {int(quota)} vCPUs free "
                                f"({used} in use{seen}), the cluster needs {shape}")]


def _image_step(a: _Asking, out: list[JsonObject]) -> JsonObject:
    """The image the launch would use and its root snapshot against the disk; `_Stop` when it fails."""
    from botocore.exceptions import BotoCoreError, ClientError

    from gpucluster.plan.shared_answers import shared

    spec, region = a.spec, a.region
    try:
        image = shared(("aws", region, "ami", tuple(catalog.ami_name_patterns(spec)), catalog.option(spec, "ami")),
                       lambda: newest_ami(a.ec2, spec))
    except (BotoCoreError, ClientError) as exc:
        c, msg = _code(exc)
        out.append(_check(f"AMI ({region})", False, f"{c} in {region}: DescribeImages failed ({msg})",
                          "grant ec2:DescribeImages, or check option ami" if c == "UnauthorizedOperation"
                          else "check option ami / image"))
        raise _Stop from None
    if image is None:
        ami = catalog.option(spec, "ami")
        what = repr(ami) if ami else catalog.ami_name_pattern(spec)
        out.append(_check(f"AMI ({region})", False, f"no available x86_64 image {what} in {region}",
                          "choose another region, or pass option ami=ami-..."))
        raise _Stop
    snap = root_snapshot_gb(image)
    disk = disk_for(spec, image)
    if snap is not None and disk < snap:  # only a size the user gave can be below it (rootdisk.py)
        out.append(_check(f"AMI ({region})", False, f"disk gb {disk} is below the root snapshot of {image['ImageId']} "
                                                   f"({snap} GB); allowed: {snap} or more",
                          f"pass --disk-gb {snap} or more"))
        raise _Stop
    out.append(_check(f"AMI ({region})", True, f"{image['ImageId']} ({image.get('Name', '')}), root snapshot "
                                               f"{snap if snap is not None else '?'} GB, disk {disk} GB "
                                               f"({rootdisk_why(spec.disk_gb, snap)})"))
    return image


def _subnet_zone(a: _Asking, subnet: str, out: list[JsonObject]) -> str | None:
    """An existing subnet's zone, once its VPC matches option vpcId and it routes to the internet."""
    zone, public, in_vpc = subnet_route(a.ec2, subnet)
    vpc_opt = catalog.option(a.spec, "vpcId")
    if vpc_opt and in_vpc and str(vpc_opt) != in_vpc:
        out.append(_check(f"subnet {subnet}", False, f"option vpcId {vpc_opt!r} is not the VPC of subnet "
                                                     f"{subnet} ({in_vpc}); allowed: {in_vpc}",
                          f"pass --option vpcId={in_vpc}, or leave vpcId out (the subnet decides)"))
        raise _Stop
    if not public:
        out.append(_check(f"subnet {subnet}", False,
                          f"option subnetId {subnet!r} has no route 0.0.0.0/0 to an internet gateway, so the "
                          "nodes could not be reached; allowed: a public subnet",
                          "add that route to its route table, or leave subnetId out (a new VPC is made)"))
        raise _Stop
    out.append(_check(f"subnet {subnet}", True, f"public (0.0.0.0/0 -> internet gateway), in {zone}"))
    return zone


def _offered_zone(a: _Asking, out: list[JsonObject]) -> str:
    """The first zone of the region offering the type (none given and no subnet)."""
    from gpucluster.plan.shared_answers import shared

    zone = shared(("aws", a.region, "zone", a.itype), lambda: first_zone(a.ec2, a.itype))
    if zone is None:
        out.append(_check(f"EC2 offerings ({a.region})", False, f"{a.itype} is not offered in any availability "
                                                                f"zone of {a.region} for this account",
                          "choose another --region or --instance-type"))
        raise _Stop
    return zone


def _zone_step(a: _Asking, out: list[JsonObject]) -> str | None:
    """The zone the launch goes to: the subnet's, the one given, else the first offering the type."""
    from botocore.exceptions import BotoCoreError, ClientError

    zone = a.spec.zone
    subnet = catalog.option(a.spec, "subnetId")
    try:
        if subnet:
            return _subnet_zone(a, str(subnet), out)
        if zone is None:
            return _offered_zone(a, out)
    except (BotoCoreError, ClientError) as exc:
        c, msg = _code(exc)
        out.append(_check(f"EC2 describe ({a.region})", False, f"{c} in {a.region}: {msg}",
                          "grant ec2:Describe* to these credentials"))
        raise _Stop from None
    return zone


def _launch_rows(a: _Asking, image: JsonObject, zone: str | None) -> list[JsonObject]:
    """The launch as the program makes it: a launch template, then one instant fleet that launches
    the instances with these credentials' ec2:RunInstances (launch_checks.py says what is checked how)."""
    from botocore.exceptions import BotoCoreError, ClientError

    from gpucluster.plan.shared_answers import shared

    spec, region = a.spec, a.region
    out = [template_dry_run(a.ec2, spec, image, region)]
    req = launch_request(spec, image, zone)
    what = f"{spec.nodes} × {a.itype} in {zone or region}" + (" (spot)" if spec.spot else "")
    try:
        a.ec2.run_instances(**req)
        out.append(_check(f"EC2 RunInstances dry run ({region})", False,
                          "EC2 did not answer DryRunOperation to a DryRun request", "report this as a bug"))
    except (BotoCoreError, ClientError) as exc:
        c, msg = _code(exc)
        out.append(_dry_run_verdict(c, msg, region, spec, what))
    out.append(shared(("aws", region, "service-linked roles", a.arn, bool(spec.spot)),
                      lambda: service_linked_roles(a.client("iam"), spec, a.arn, a.account, region)))
    return out


def checks(spec: ClusterSpec, session: AwsSession = None) -> list[JsonObject]:
    """Every preflight check for `spec` (resolved: region set), in order, every call in the spec's
    region; stops after a failure that makes the later checks meaningless (no credentials, no image)."""
    try:
        import boto3
    except ImportError:
        return [_check("aws credentials", False, "boto3 is not installed", "pip install 'gpucluster[aws]'")]
    from gpucluster.plan.shared_answers import shared

    region = spec.region or catalog.DEFAULT_REGION
    session = session or boto3.session.Session()
    client = _clients(session, region)
    out: list[JsonObject] = []
    # what every candidate of this region asks alike is asked once per placement (gpucluster.plan.shared_answers)
    ident, row = shared(("aws", region, "identity"), lambda: _identity(client, region))
    if ident is None:
        return [row]
    out.append(row)
    lasting = lifetime_check(session.get_credentials(), spec)  # they must outlast the run (issue 40 item 8)
    if lasting is not None:
        out.append(lasting)
    itype = catalog.instance_type_of(spec).name
    arn, account = str(ident.get("Arn") or ""), str(ident.get("Account") or "")
    out.append(shared(("aws", region, "permissions", arn, itype, bool(spec.spot), repr(sorted(spec.option_dict.items()))),
                      lambda: permissions_check(client("iam"), spec, arn, account)))
    asking = _Asking(spec, region, itype, client, client("ec2"), arn, account)
    out += _quota_rows(asking)
    if needs_addresses(spec):  # an Elastic IP per node (efa.py): the region's quota must hold them
        out.append(_address_row(client, asking.ec2, spec, region))
    try:
        image = _image_step(asking, out)
        zone = _zone_step(asking, out)
    except _Stop:
        return out
    return out + _launch_rows(asking, image, zone)


def preflight(spec: ClusterSpec, session: AwsSession = None) -> None:
    """Raise a one-line `PreflightError` (exit 2) for the first failing check; nothing is created."""
    failed = [c for c in checks(spec, session) if c["ok"] is False]
    if failed:
        c = failed[0]
        if c["check"] == "aws credentials":  # as the provider's own credential check says it
            raise PreflightError(f"aws credentials: {c['detail']}; nothing was started: {c['fix']}")
        more = f" (and {len(failed) - 1} more: `gpucluster doctor --cloud aws` lists them)" if len(failed) > 1 else ""
        raise PreflightError(f"aws preflight: {c['detail']}; fix: {c['fix']}{more}")
