"""What Pulumi's engine reports about AWS resources, read for the ledger and for errors: the ledger
kind of each EC2/IAM type token, the cost detail of a requested instance, and capacity failures
(which zone ran out, which zones to try next). Imports nothing heavy (boto3 inside a function)."""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping

# Pulumi type token -> ledger resource kind. Only resources that exist in the cloud (and may bill
# or block a later delete) are recorded; components, providers, rules and local keys are not.
PULUMI_KINDS = {
    "aws:ec2/instance:Instance": "instance",
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


def resource_detail(kind: str, inputs: Mapping[str, Any], spec: Any) -> dict[str, Any]:
    """What the cost code needs about a requested instance: from its inputs, else from the spec."""
    if kind != "instance":
        return {}
    inputs = inputs or {}
    root = inputs.get("rootBlockDevice") or {}
    return {
        "instance_type": inputs.get("instanceType") or getattr(spec, "instance_type", None),
        "spot": bool(inputs.get("instanceMarketOptions")) or bool(getattr(spec, "spot", False)),
        "disk_gb": root.get("volumeSize") or getattr(spec, "disk_gb", None),
        "disk_type": root.get("volumeType") or getattr(spec, "disk_type", None) or "gp3",
        "availability_zone": inputs.get("availabilityZone") or getattr(spec, "zone", None),
        # every node gets one public IPv4 at launch (subnet or EFA interface), billed per address-hour
        "public_ipv4": 1,
    }


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


def capacity_zones(spec: Any, text: str, zone_lister: Callable[[str, str | None], list[str]] | None = None
                   ) -> tuple[str | None, list[str], str]:
    """(the zone that ran out, the zones to try next, the instance type) from an EC2 capacity error:
    the zones AWS's message suggests, else the region's zones offering the type."""
    itype = getattr(spec, "instance_type", None)
    m = re.search(r"Availability Zone you requested \((" + AZ + r")\)", text)
    zone = m.group(1) if m else None
    if zone is None:
        any_zone = re.search(r"\b(" + AZ + r")\b", text)
        zone = any_zone.group(1) if any_zone else getattr(spec, "zone", None)
    suggested: list[str] = []
    m = re.search(r"choosing ((?:" + AZ + r"(?:, |,| or | and )?)+)", text)
    if m:
        suggested = re.findall(AZ, m.group(1))
    if not suggested or zone is None:
        region = getattr(spec, "region", None) or region_of_zone(zone)
        offering = (zone_lister or zones_offering)(region, itype) if region else []
        if zone is None and offering:
            # the message names no zone and the spec set none: the program launched in the first
            # zone (by name) offering the type (component._first_zone_offering), so that one failed
            zone = sorted(offering)[0]
        suggested = suggested or sorted(offering)
    return zone, [z for z in suggested if z != zone], itype or "the instance type"
