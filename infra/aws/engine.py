"""What Pulumi's engine reports about AWS resources, read for the ledger and for errors: the ledger
kind of each EC2/IAM type token, the cost detail of a requested instance, and capacity failures
(which zone ran out, which zones to try next). Imports nothing heavy (boto3 inside a function)."""

from __future__ import annotations

import re
from typing import Callable, Iterable, Mapping

from gpucluster.spec import ClusterSpec
from gpucluster.states import JsonMapping, JsonObject

from .efa import needs_addresses
from .rootdisk import ROOT_GB_TAG
from .sdk import Ec2Client

# Pulumi type token -> ledger resource kind. Only resources that exist in the cloud (and may bill
# or block a later delete) are recorded; components, providers, rules and local keys are not.
PULUMI_KINDS = {
    "aws:ec2/instance:Instance": "instance",
    "aws:ec2/fleet:Fleet": "fleet",  # one row for the N instances an instant fleet launched
    "aws:ec2/securityGroup:SecurityGroup": "security-group",
    "aws:ec2/keyPair:KeyPair": "key-pair",
    "aws:ec2/placementGroup:PlacementGroup": "placement-group",
    "aws:ec2/vpc:Vpc": "vpc",
    "aws:ec2/subnet:Subnet": "subnet",
    "aws:ec2/internetGateway:InternetGateway": "internet-gateway",
    "aws:ec2/routeTable:RouteTable": "route-table",
    "aws:ec2/networkInterface:NetworkInterface": "network-interface",
    "aws:ec2/eip:Eip": "elastic-ip",
    "aws:ec2/launchTemplate:LaunchTemplate": "launch-template",
    "aws:ec2/volume:Volume": "volume",
    "aws:iam/role:Role": "iam-role",
    "aws:iam/instanceProfile:InstanceProfile": "instance-profile",
}

CAPACITY_MARKERS = (
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "Insufficient capacity",
    "is not supported in your requested Availability Zone",
)
AZ = r"[a-z]{2}(?:-gov)?-[a-z]+-\d[a-z]"
# The AWS provider's `max_retries` (terraform-provider-aws, bridged by pulumi-aws; default 25).
# Its EC2 client treats InsufficientInstanceCapacity as retryable for RunInstances
# (internal/service/ec2/service_package.go; hashicorp/terraform-provider-aws#43193, #49863).
# max_retries is the SDK's MaxAttempts, with backoff capped at 300 s (hashicorp/aws-sdk-go-base
# aws_config.go); after failed attempt n the SDK sleeps less than 2^n + 1 s (aws-sdk-go-v2
# aws/retry: middleware.go numbers the first attempt 1, jitter_backoff.go). So with the default a
# capacity error reaches us after up to ~89 minutes, while the nodes already made bill. With 4
# attempts it reaches us within (2+1) + (4+1) + (8+1) = 17 s of backoff, and the next zone is
# tried. The same bound applies to throttling of the stack's other calls, which 3 retries absorb.
PROVIDER_MAX_RETRIES = 4


def region_of_zone(zone: str | None) -> str | None:
    """us-east-1a -> us-east-1 (an availability zone is its region plus one letter); None for none."""
    return zone[:-1] if zone else None


def _fleet_detail(inputs: JsonMapping, spec: ClusterSpec) -> JsonObject:
    target = inputs.get("targetCapacitySpecification") or {}
    config = (inputs.get("launchTemplateConfigs") or [{}])[0]
    override = (config.get("overrides") or [{}])[0]
    return {
        "instance_type": override.get("instanceType") or spec.instance_type,
        "node_count": int(target.get("totalTargetCapacity") or spec.nodes or 1),
        "spot": target.get("defaultTargetCapacityType") == "spot" if target else bool(spec.spot),
        # the launch template's root volume, one per node: as the program sized it (fleet tag), else the spec's
        "disk_gb": int((inputs.get("tags") or {}).get(ROOT_GB_TAG) or spec.disk_size),
        "disk_type": spec.disk_type or "gp3",
        "availability_zone": override.get("availabilityZone") or spec.zone,
        # per node: interface 0 gets a public IPv4 at launch; with EFA on every card none, an Elastic IP
        # each instead, recorded (and billed) as its own `elastic-ip` resource (efa.py)
        "public_ipv4": 0 if needs_addresses(spec) else 1,
    }


def _instance_detail(inputs: JsonMapping, spec: ClusterSpec) -> JsonObject:
    root = inputs.get("rootBlockDevice") or {}
    return {
        "instance_type": inputs.get("instanceType") or spec.instance_type,
        "spot": bool(inputs.get("instanceMarketOptions")) or bool(spec.spot),
        "disk_gb": root.get("volumeSize") or spec.disk_size,
        "disk_type": root.get("volumeType") or spec.disk_type or "gp3",
        "availability_zone": inputs.get("availabilityZone") or spec.zone,
        # every node gets one public IPv4 at launch (subnet or EFA interface), billed per address-hour
        "public_ipv4": 1,
    }


def resource_detail(kind: str, inputs: JsonMapping, spec: ClusterSpec) -> JsonObject:
    """What the cost code needs about a requested instance or fleet: from its inputs, else from the spec."""
    inputs = inputs or {}
    if kind == "fleet":
        return _fleet_detail(inputs, spec)
    if kind != "instance":
        return {}
    return _instance_detail(inputs, spec)


def zones_offering(region: str, instance_type: str | None) -> list[str]:
    """AZs of `region` offering the type (DescribeInstanceTypeOfferings), [] when unknown."""
    try:
        import boto3
        from botocore.config import Config

        ec2 = boto3.client("ec2", region_name=region,
                           config=Config(connect_timeout=5, read_timeout=10, retries={"max_attempts": 1}))
        if instance_type:
            resp = ec2.describe_instance_type_offerings(
                LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [instance_type]}])
            return sorted({o["Location"] for o in resp.get("InstanceTypeOfferings", [])})
        resp = ec2.describe_availability_zones()
        return sorted(z["ZoneName"] for z in resp.get("AvailabilityZones", []))
    except Exception:  # noqa: BLE001 - a suggestion is best effort
        return []


def capacity_zones(spec: ClusterSpec, text: str, zone_lister: Callable[[str, str | None], list[str]] | None = None
                   ) -> tuple[str | None, list[str], str]:
    """(the zone that ran out, the zones to try next, the instance type) from an EC2 capacity error:
    the zones AWS's message suggests, else the region's zones offering the type (EC2's answer, else the
    shipped catalog's zones for the type: the failover stays inside the zones that have it)."""
    itype = spec.instance_type
    m = re.search(r"Availability Zone you requested \((" + AZ + r")\)", text)
    zone = m.group(1) if m else None
    if zone is None:
        any_zone = re.search(r"\b(" + AZ + r")\b", text)
        zone = any_zone.group(1) if any_zone else spec.zone
    suggested: list[str] = []
    m = re.search(r"choosing ((?:" + AZ + r"(?:, |,| or | and )?)+)", text)
    if m:
        suggested = re.findall(AZ, m.group(1))
    if not suggested or zone is None:
        region = spec.region or region_of_zone(zone)
        offering = (zone_lister or zones_offering)(region, itype) if region else []
        if not offering and region and itype:  # EC2 not asked or not answering: the shipped offerings' zones
            from .shapes import INSTANCE_TYPES

            known = INSTANCE_TYPES.get(itype)
            offering = list(known.zones_in(region)) if known else []
        if zone is None and offering:
            # the message names no zone and the spec set none: the program launched in the first
            # zone (by name) offering the type (component._first_zone_offering), so that one failed
            zone = sorted(offering)[0]
        suggested = suggested or sorted(offering)
    return zone, [z for z in suggested if z != zone], itype or "the instance type"


def _ids_of(instance_set: object) -> list[str]:
    """The instance ids of one `fleet_instance_sets` entry (an output object, or a plain dict)."""
    ids = instance_set.get("instance_ids") if isinstance(instance_set, Mapping) else getattr(
        instance_set, "instance_ids", None)
    if ids is None and isinstance(instance_set, Mapping):
        ids = instance_set.get("instanceIds")
    return [str(i) for i in ids or []]


def fleet_instance_ids(instance_sets: Iterable[object] | None, wanted: int, *, fleet_id: str | None = None,
                       region: str | None = None, errors_of: Callable[..., str] | None = None) -> list[str]:
    """The instances an instant EC2 Fleet launched, in rank order (sorted by id: stable across
    refreshes, whatever order EC2 lists them in). Fewer than `wanted` is a failure: CreateFleet
    answers a capacity shortage with no error of its own, only no instances and an `Errors` list
    (aws/aws-parallelcluster-node#533: "In case of ICE create-fleet doesn't raise an exception"),
    and the AWS provider stores the fleet as created (terraform-provider-aws ec2_fleet.go,
    resourceFleetCreate, reads no `Errors`). So the program fails here, naming EC2's own cause
    (`fleet_errors`, DescribeFleets), and `up`'s capacity failover sees InsufficientInstanceCapacity."""
    from gpucluster.errors import ProvisionError

    ids = sorted({i for s in instance_sets or [] for i in _ids_of(s)})
    if len(ids) == wanted:
        return ids
    cause = ""
    if fleet_id:
        try:
            cause = (errors_of or FLEET_ERRORS[0])(region, fleet_id)
        except Exception as exc:  # noqa: BLE001 - the count alone is still the failure
            cause = f"its errors could not be read ({type(exc).__name__}: {exc})"
    raise ProvisionError(
        f"EC2 Fleet {fleet_id or '?'} launched {len(ids)} of {wanted} instances (all or none)"
        + (f": {cause}" if cause else ""))


def fleet_errors(region: str | None, fleet_id: str, *, client: Ec2Client = None) -> str:
    """An instant fleet's launch errors, "CODE: MESSAGE; ..." (DescribeFleets: `Errors`, "valid
    only when Type is set to instant"), '' when it lists none."""
    if client is None:
        import boto3

        client = boto3.client("ec2", region_name=region)
    fleets = client.describe_fleets(FleetIds=[fleet_id]).get("Fleets") or []
    seen: list[str] = []
    for fleet in fleets:
        for err in fleet.get("Errors") or []:
            text = f"{err.get('ErrorCode')}: {err.get('ErrorMessage')}"
            if text not in seen:
                seen.append(text)
    return "; ".join(seen)


# who reads a short fleet's errors: EC2 (DescribeFleets); the mock runtime puts its own answer here
# for the length of a build, so a program run under mocks never calls AWS
FLEET_ERRORS: list[Callable[..., str]] = [fleet_errors]


# A new instance profile is not at once usable by EC2: the instant fleet launches nothing and lists
# `InvalidParameterValue` "Invalid IAM Instance Profile name" (or "... has no associated IAM Roles")
# in its errors (AWS IAM User Guide, "Troubleshooting IAM roles": changes are eventually consistent;
# EC2 User Guide, "IAM roles for Amazon EC2"). terraform-provider-aws retries RunInstances on exactly
# these messages for iamPropagationTimeout, 2 minutes (internal/service/ec2/ec2_instance.go,
# resourceInstanceCreate); its instant fleet does not. `up` launches the fleet again (the profile
# kept: a new one would wait again) after each of these delays, 120 s in all.
PROFILE_NOT_READY = ("Invalid IAM Instance Profile", "has no associated IAM Roles")
RELAUNCH_DELAYS = (5.0, 10.0, 20.0, 40.0, 45.0)
FLEET_TYPE = "aws:ec2/fleet:Fleet"


def relaunch(spec: ClusterSpec, text: str) -> tuple[str, str] | None:
    """(the fleet's type token, why) when a failed `up` is the instance profile's propagation, else None."""
    if any(marker in text for marker in PROFILE_NOT_READY):
        return FLEET_TYPE, ("EC2 does not see the nodes' new IAM instance profile yet (IAM propagates within "
                            "seconds to a minute or two; the fleet launched nothing)")
    return None
