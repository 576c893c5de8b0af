"""Object-storage scopes a cluster grants its nodes: the spec's `reads`/`writes` URL fields. A stack
file (or `--option`) gives them as a pair of options per backend, JSON lists of URLs (aws
`s3Read`/`s3Write`, gcp `gcsRead`/`gcsWrite`), which `gpucluster.spec.normalize` lifts into the
fields. Shared by the backends' URL modules (`infra/aws/s3.py`, `infra/gcp/gcs.py`), each
passing its own URL check. Imports nothing heavy."""

from __future__ import annotations

from typing import Callable

from gpucluster.errors import UsageError
from gpucluster.spec import ClusterSpec, scope_urls as checked


def scopes(spec: ClusterSpec, parse: Callable[[str, str], str]) -> tuple[list[str], list[str]]:
    """(reads, writes): the spec's object-storage scopes, each URL checked by the backend's `parse`."""
    return checked(spec.reads, "read scope", parse), checked(spec.writes, "write scope", parse)


def parse_url(text: str, what: str, scheme: str, allowed: str, bucket_problem: Callable[[str], str | None],
              prefix_problem: Callable[[str], str | None]) -> str:
    """`SCHEME://bucket[/prefix]` checked by the backend's naming rules -> the normalized URL (no
    trailing '/'); UsageError starting with `what`, naming the problem and what is `allowed`."""
    if not text.startswith(scheme):
        raise UsageError(f"{what} is not allowed: {allowed}")
    bucket, _, prefix = text[len(scheme):].partition("/")
    prefix = prefix.rstrip("/")
    problem = bucket_problem(bucket) if bucket else "no bucket name"
    if problem is None and prefix:
        problem = prefix_problem(prefix)
    if problem:
        raise UsageError(f"{what} is not allowed: {problem}; give {allowed}")
    return f"{scheme}{bucket}/{prefix}" if prefix else f"{scheme}{bucket}"
