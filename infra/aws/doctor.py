"""What `gpucluster doctor` and `gpucluster gc` ask of AWS: credentials (STS), the EC2 G/VT vCPU
quota of a region, and the regions a sweep of every cluster looks in."""

from __future__ import annotations

import os
from typing import Any

EC2_GVT_QUOTA = "L-DB2E81BA"  # "Running On-Demand G and VT instances" (vCPUs)


def _check(name: str, ok: bool | None, detail: str, fix: str = "") -> dict[str, Any]:
    """ok: True passed, False failed (with a fix), None skipped/informational."""
    return {"check": name, "ok": ok, "detail": detail, "fix": fix if ok is False else ""}


def doctor(region: str | None = None, session: Any = None) -> list[dict[str, Any]]:
    """`doctor --cloud aws`: region default: $AWS_REGION, $AWS_DEFAULT_REGION, then the catalog's."""
    if region is None:
        from .catalog import DEFAULT_REGION

        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION
    return check_aws(region, session=session)


def check_aws(region: str, session: Any = None) -> list[dict[str, Any]]:
    try:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        return [_check("aws credentials", False, "boto3 is not installed", "pip install 'gpucluster[aws]'")]
    session = session or boto3.session.Session()
    try:
        ident = session.client("sts", region_name=region).get_caller_identity()
    except (BotoCoreError, ClientError) as exc:
        return [_check("aws credentials", False, f"STS get_caller_identity failed: {exc}",
                       "configure credentials: `aws configure` (or `aws sso login --profile P` and "
                       "export AWS_PROFILE=P)")]
    checks = [_check("aws credentials", True, f"account {ident.get('Account')} as {ident.get('Arn')}")]
    try:
        q = session.client("service-quotas", region_name=region).get_service_quota(
            ServiceCode="ec2", QuotaCode=EC2_GVT_QUOTA)["Quota"]
        vcpus = int(float(q.get("Value", 0)))
        smallest = 4  # g5.xlarge
        if vcpus < smallest:
            checks.append(_check(f"EC2 G/VT vCPU quota ({region})", False,
                                 f"{vcpus} vCPUs for 'Running On-Demand G and VT instances': not even one g5.xlarge",
                                 f"request more: aws service-quotas request-service-quota-increase --service-code ec2 "
                                 f"--quota-code {EC2_GVT_QUOTA} --desired-value 64 --region {region}"))
        else:
            checks.append(_check(f"EC2 G/VT vCPU quota ({region})", True,
                                 f"{vcpus} vCPUs: room for {vcpus // smallest} g5.xlarge or "
                                 f"{vcpus // 48} g5.12xlarge nodes"))
    except (BotoCoreError, ClientError) as exc:
        checks.append(_check(f"EC2 G/VT vCPU quota ({region})", None, f"could not read quota {EC2_GVT_QUOTA}: {exc}"))
    return checks


def gc_regions(open_rows: list[dict[str, Any]], runs: list[dict[str, Any]], extra: tuple[str, ...]) -> list[str]:
    """Where `gc` looks: the regions given, those of open ledger rows and of recorded runs, and,
    without --region, the catalog's default (a cluster made without --region went there) and the
    region your AWS configuration names."""
    regions = list(extra)
    regions += [res["region"] for res in open_rows if res.get("region")]
    for run in runs:
        region = (run.get("spec") or {}).get("region")
        if region:
            regions.append(region)
    if not extra:
        from .catalog import DEFAULT_REGION
        from .leftovers import default_regions

        regions += [DEFAULT_REGION, *default_regions()]
    return list(dict.fromkeys(regions))
