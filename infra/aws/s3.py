"""S3 for `--data s3://...` and `--output s3://...`: URL checks, the scope the component grants, and
the IAM policy document. Imports nothing heavy (no boto3, no pulumi).

- `parse_url(text, what)`: `s3://bucket[/prefix]` -> "s3://bucket/prefix" (normalized: no trailing
  `/`), or UsageError (exit 2) naming the value and what is allowed. Bucket names follow the S3
  general purpose bucket naming rules,
  https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html: 3-63 characters,
  lowercase letters, digits, dots and hyphens, beginning and ending with a letter or digit, no two
  adjacent dots, not formatted as an IP address, none of the reserved prefixes and suffixes. The
  prefix may not hold `*`, `?` or `$` (they would be IAM wildcards or policy variables in the
  granted ARNs, widening the scope), `:` (the `--data` DEST separator), `..`/`.` segments or
  empty segments.
- `scopes(spec)`: the spec's `reads`/`writes` checked. A stack file (or `--option`) gives them as
  the options `s3Read` / `s3Write` (JSON lists of URLs), lifted into those fields by
  `gpucluster.spec.normalize`.
- `policy_document(reads, writes, partition)`: read = s3:GetObject on `bucket/prefix/*` and
  s3:ListBucket on the bucket restricted by an `s3:prefix` condition; write = s3:PutObject and
  s3:AbortMultipartUpload on `bucket/prefix/*`. Nothing else: no `s3:*`, no `*` resource.
"""

from __future__ import annotations

import ipaddress
import re
from typing import TYPE_CHECKING, Sequence

from gpucluster.states import JsonObject

from .sdk import AwsSession

if TYPE_CHECKING:  # pragma: no cover
    from gpucluster.spec import ClusterSpec

SCHEME = "s3://"
OPTION_PREFIX = "s3"  # the stack options s3Read and s3Write (ObjectStore.option_prefix)
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
ALLOWED = ("s3://BUCKET[/PREFIX], BUCKET 3-63 characters of a-z 0-9 . - (starting and ending with a letter or "
           "digit, not an IP address)")


def bucket_problem(bucket: str) -> str | None:
    """Why `bucket` is not a valid S3 general purpose bucket name, or None."""
    if not 3 <= len(bucket) <= 63:
        return f"the bucket name {bucket!r} is {len(bucket)} characters long (3-63 allowed)"
    if not _BUCKET_RE.match(bucket):
        return (f"the bucket name {bucket!r} may only hold lowercase letters, digits, dots and hyphens, "
                "and must begin and end with a letter or digit")
    if ".." in bucket:
        return f"the bucket name {bucket!r} has two adjacent dots"
    try:
        ipaddress.IPv4Address(bucket)
        return f"the bucket name {bucket!r} is formatted as an IP address"
    except ValueError:
        pass
    for p in _RESERVED_PREFIXES:
        if bucket.startswith(p):
            return f"the bucket name {bucket!r} starts with the reserved prefix {p!r}"
    for s in _RESERVED_SUFFIXES:
        if bucket.endswith(s):
            return f"the bucket name {bucket!r} ends with the reserved suffix {s!r}"
    return None


def prefix_problem(prefix: str) -> str | None:
    if len(prefix.encode()) > 900:
        return "the prefix is longer than 900 bytes (S3 keys are at most 1,024)"
    bad = sorted({c for c in prefix if c in "*?$:\\" or ord(c) < 32 or ord(c) == 127})
    if bad:
        return (f"the prefix holds {', '.join(repr(c) for c in bad)} (not allowed: '*', '?' and '$' would "
                "widen the granted IAM scope, ':' separates DEST)")
    parts = prefix.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "the prefix has an empty, '.' or '..' segment"
    return None


def split(url: str) -> tuple[str, str]:
    """A normalized URL -> (bucket, prefix); prefix '' for the whole bucket."""
    bucket, _, prefix = url[len(SCHEME):].partition("/")
    return bucket, prefix


def parse_url(text: str, what: str) -> str:
    """`s3://bucket[/prefix]` checked -> normalized URL; UsageError starting with `what`."""
    from gpucluster.infra.object_scopes import parse_url as check

    return check(text, what, SCHEME, ALLOWED, bucket_problem, prefix_problem)


def scopes(spec: ClusterSpec) -> tuple[list[str], list[str]]:
    """(read URLs, write URLs) the component grants the nodes: the spec's `reads`/`writes`, checked."""
    from gpucluster.infra.object_scopes import scopes as checked

    return checked(spec, parse_url)


def partition_of(region: str) -> str:
    """The ARN partition of a region (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference-arns.html)."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def policy_document(reads: Sequence[str], writes: Sequence[str], partition: str = "aws",
                    kms_keys: Sequence[str] = ()) -> JsonObject:
    """The role policy: exactly these buckets and prefixes, read or write, nothing more; with the
    SSE-KMS buckets' customer managed keys, their use (infra/aws/kms.py)."""
    arn = f"arn:{partition}:s3:::"
    statements: list[JsonObject] = []
    for i, url in enumerate(sorted(set(reads))):
        bucket, prefix = split(url)
        objects = f"{arn}{bucket}/{prefix}/*" if prefix else f"{arn}{bucket}/*"
        statements.append({"Sid": f"ReadData{i}", "Effect": "Allow", "Action": ["s3:GetObject"],
                           "Resource": [objects]})
        listing: JsonObject = {"Sid": f"ListData{i}", "Effect": "Allow", "Action": ["s3:ListBucket"],
                                   "Resource": [f"{arn}{bucket}"]}
        if prefix:
            listing["Condition"] = {"StringLike": {"s3:prefix": [f"{prefix}/*"]}}
        statements.append(listing)
    for i, url in enumerate(sorted(set(writes))):
        bucket, prefix = split(url)
        objects = f"{arn}{bucket}/{prefix}/*" if prefix else f"{arn}{bucket}/*"
        statements.append({"Sid": f"WriteOutputs{i}", "Effect": "Allow",
                           "Action": ["s3:PutObject", "s3:AbortMultipartUpload"], "Resource": [objects]})
    from .kms import statement

    keys = statement(kms_keys)
    return {"Version": "2012-10-17", "Statement": statements + ([keys] if keys else [])}


class NodeTransfer:
    """What the ssh launcher runs on a node to pull an `s3://` source or push its outputs
    (`infra/ssh/objects.py` drives it; the program is `s3_node.py`, sent as `python -c`).

    tool: "auto" (the AWS CLI when `aws` is on the node's PATH, else boto3) or "boto3" (boto3 even
    where an AWS CLI exists, e.g. one too old for the endpoint variables)."""

    scheme = "s3"
    TOOLS = ("auto", "boto3")

    def __init__(self, tool: str = "auto"):
        if tool not in self.TOOLS:
            raise ValueError(f"tool {tool!r}: one of {self.TOOLS}")
        self.tool = tool

    def script(self, python: str, mode: str, a: str, b: str) -> str:
        """A POSIX sh script: the node program under the launcher's Python when the AWS CLI ("auto")
        or boto3 is there for it, else under `python3` with boto3, else exit 4 naming what is missing."""
        import shlex
        from pathlib import Path

        py = shlex.quote(python)
        source = shlex.quote((Path(__file__).parent / "s3_node.py").read_text())
        args = " ".join(shlex.quote(x) for x in (mode, a, b))

        def run(interpreter: str) -> str:
            return f"env GPUCLUSTER_S3_TOOL={self.tool} {interpreter} -c {source} {args}"

        cli = "command -v aws >/dev/null 2>&1 || " if self.tool == "auto" else ""
        missing = f"neither the AWS CLI (aws on PATH) nor boto3 (in {python} or python3) is on this node" if cli \
            else f"boto3 is importable by neither {python} nor python3 on this node"
        return (f"if {cli}{py} -c 'import boto3' >/dev/null 2>&1; then exec {run(py)}; fi\n"
                f"if python3 -c 'import boto3' >/dev/null 2>&1; then exec {run('python3')}; fi\n"
                f"echo {shlex.quote(missing)} >&2\n"
                "exit 4")


def bucket_facts(url: str, session: AwsSession = None, max_pages: int = 100) -> tuple[str | None, int | None]:
    """`Operations.bucket_facts`: (the bucket's region, bytes under the URL's prefix) for placement's egress
    price (gpucluster.plan.egress). GetBucketLocation answers a null LocationConstraint for us-east-1
    (https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetBucketLocation.html); ListObjectsV2 lists
    1,000 keys a page (https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListObjectsV2.html), so
    past `max_pages` pages the size is not counted (None). An error is one line naming the bucket."""
    from botocore.exceptions import BotoCoreError, ClientError

    from gpucluster.errors import GpuclusterError

    bucket, prefix = split(url)
    try:
        import boto3

        s3 = (session or boto3.session.Session()).client("s3")
        region = s3.get_bucket_location(Bucket=bucket).get("LocationConstraint") or "us-east-1"
        size, pages = 0, 0
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            size += sum(int(o.get("Size") or 0) for o in page.get("Contents") or ())
            pages += 1
            if pages >= max_pages and page.get("IsTruncated"):
                return region, None
    except ClientError as exc:
        err = exc.response.get("Error", {})
        raise GpuclusterError(f"s3://{bucket}: {err.get('Code', 'error')} ({err.get('Message', '')})") from None
    except BotoCoreError as exc:
        raise GpuclusterError(f"s3://{bucket}: {exc}") from None
    return region, size
