"""What `gpucluster doctor` and `gpucluster gc` ask of AWS: the preflight of a run (credentials,
the G/VT vCPU quota, the AMI, a RunInstances dry run: infra/aws/preflight.py) for a region and
shape, and the regions a sweep of every cluster looks in."""

from __future__ import annotations

import re
from typing import Sequence

from gpucluster.states import JsonMapping, JsonObject

from .sdk import AwsSession

EC2_GVT_QUOTA = "L-DB2E81BA"  # "Running On-Demand G and VT instances" (vCPUs)
DEFAULT_RUN_NODES = 2  # `run --cloud aws` without --nodes


def _check(name: str, ok: bool | None, detail: str, fix: str = "") -> JsonObject:
    """ok: True passed, False failed (with a fix), None skipped/informational."""
    return {"check": name, "ok": ok, "detail": detail, "fix": fix if ok is False else ""}


def doctor(region: str | None = None, session: AwsSession = None, *, nodes: int | None = None,
           instance_type: str | None = None, spot: bool = False) -> list[JsonObject]:
    """`doctor --cloud aws`: the preflight of `run` (infra/aws/preflight.py) for the region and
    shape given. Defaults: those of a default `run` (2 x g5.xlarge on-demand in the catalog's
    default region, us-east-1: `run` does not read $AWS_REGION, so neither does this)."""
    from .catalog import DEFAULT_REGION

    return check_aws(region or DEFAULT_REGION, session=session, nodes=nodes, instance_type=instance_type, spot=spot)


def check_aws(region: str, session: AwsSession = None, *, nodes: int | None = None, instance_type: str | None = None,
              spot: bool = False) -> list[JsonObject]:
    from gpucluster.errors import SpecError
    from gpucluster.spec import ClusterSpec

    from .catalog import DEFAULT_INSTANCE_TYPE, validate_spec
    from .preflight import checks

    spec = ClusterSpec(cloud="aws", nodes=int(nodes or DEFAULT_RUN_NODES), name="doctor", region=region,
                       instance_type=instance_type or DEFAULT_INSTANCE_TYPE, spot=bool(spot))
    try:
        validate_spec(spec)
    except SpecError as exc:
        return [_check("aws shape", False, exc.message, "pass a region and --instance-type that `run` accepts")]
    from .permissions import summary

    found = checks(spec, session=session)
    shape = f"{spec.nodes} x {spec.instance_type}{' spot' if spot else ''}"
    return [_check("aws region checked", None, f"{region}, for {shape} (pass --region / --nodes / "
                                               "--instance-type / --spot to check another)"), *found,
            _check("aws permissions a run needs", None, summary(spec))]


def gc_regions(open_rows: Sequence[JsonMapping], runs: Sequence[JsonMapping],
               extra: tuple[str, ...]) -> list[str]:
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

        configured = default_regions()
        for region in configured:  # AWS_REGION=mars-1: refused by name, never 27 unchecked lines (issue 45 item 10)
            if not _REGION_RE.match(region):
                from gpucluster.errors import UsageError, not_allowed

                raise UsageError(not_allowed("AWS region", region, "a region name such as us-east-1 (it comes from "
                                             "AWS_REGION, AWS_DEFAULT_REGION or your AWS config; or pass --region)"))
        regions += [DEFAULT_REGION, *configured]
    return list(dict.fromkeys(regions))


# a region's name: its partition's geography, a direction and a number (us-east-1, ap-southeast-3,
# us-gov-west-1, cn-north-1, eu-isoe-west-1), "Regions and Availability Zones", AWS general reference
_REGION_RE = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d{1,2}$")
