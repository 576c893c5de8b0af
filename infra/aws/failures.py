"""The AWS cause of a failed `pulumi up`, for the one-line failure and the ledger.

The Pulumi CLI prints the failing resource's diagnostic first and the stack's own
`error: update failed` last, so the last "error:" line is never the cause. The cause is the AWS
error code and message that terraform-provider-aws (bridged by pulumi-aws) wraps:
- AWS SDK for Go v2 (EC2 and most services in provider v5+):
  `operation error EC2: RunInstances, https response error StatusCode: 400, RequestID: ..., api error
  VcpuLimitExceeded: You have requested more vCPU capacity than your current vCPU limit of 0 allows ...`
- AWS SDK for Go v1 (older resources): `VcpuLimitExceeded: You have requested ...\n\tstatus code: 400,
  request id: ...`.
"""

from __future__ import annotations

import re
from gpucluster.errors import ProvisionError
from gpucluster.spec import ClusterSpec

SDK_V2 = re.compile(r"api error (?P<code>[A-Za-z][A-Za-z0-9.]*): (?P<msg>[^\n]*)")
SDK_V1 = re.compile(r"(?P<code>[A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)+(?:\.[A-Za-z0-9]+)*): (?P<msg>[^\n]*?)"
                    r"\s*(?:\n\s*)?status code: \d+")
BARE = re.compile(r"(?<![\w.])(?P<code>[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+(?:\.[A-Za-z0-9]+)*): (?P<msg>[^\n]*)")
# a quota too low in the region (EC2's vCPU limits, On-Demand and Spot): the error's `cause` is "quota", which
# placement fails over on (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/troubleshooting-launch.html)
QUOTA_CODES = ("VcpuLimitExceeded", "MaxSpotInstanceCountExceeded")
SUMMARY = re.compile(r"^(error: )?(update|preview|destroy|refresh) failed\s*$", re.I)


def aws_error(text: str) -> tuple[str, str] | None:
    """(code, message) of the first AWS error in `text`, or None."""
    for pattern in (SDK_V2, SDK_V1, BARE):
        m = pattern.search(text)
        if m:
            msg = re.sub(r",?\s*(?:status code: \d+|RequestID: \S+|request id: \S+).*$", "", m.group("msg")).strip()
            return m.group("code"), msg[:300]
    return None


def _hint(spec: ClusterSpec, code: str) -> str | None:
    region = spec.region or "us-east-1"
    if code in QUOTA_CODES:
        from .preflight import quota_code

        return (f"request more vCPUs: aws service-quotas request-service-quota-increase --service-code ec2 "
                f"--quota-code {quota_code(spec)} --desired-value N --region {region} "
                "(`gpucluster doctor --cloud aws` computes N)")
    if code in ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException"):
        return "grant the permission named above to these credentials (`gpucluster doctor --cloud aws` checks it)"
    if code == "OptInRequired":
        return f"enable the region (aws account enable-region --region-name {region}) or accept the AMI's terms"
    if code == "PendingVerification":
        return "AWS is still verifying the account (usually minutes, up to 4 hours); try again later"
    return None


def classify(spec: ClusterSpec, text: str) -> ProvisionError | None:
    """A ProvisionError naming the AWS error code and message (the caller adds the cluster and the
    cleanup), or None when the text holds no AWS error."""
    found = aws_error("\n".join(ln for ln in text.splitlines() if not SUMMARY.match(ln.strip())))
    if found is None:
        return None
    code, msg = found
    return ProvisionError(f"{code}: {msg}", hint=_hint(spec, code), cause="quota" if code in QUOTA_CODES else None)
