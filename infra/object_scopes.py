"""Object-storage scopes a cluster grants its nodes, kept in the spec's options as JSON lists of URLs
(a pair of option names per backend: aws `s3Read`/`s3Write`, gcp `gcsRead`/`gcsWrite`, also settable
in a stack file). Shared by the backends' URL modules (`infra/aws/s3.py`, `infra/gcp/gcs.py`), each
passing its own URL check. Imports nothing heavy."""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Sequence

from gpucluster.errors import SpecError, UsageError


def snake(key: str) -> str:
    """`gcsRead` -> `gcs_read` (the CLI's spelling of a stack option)."""
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), key)


def urls(spec: Any, key: str, parse: Callable[[str, str], str], scheme: str) -> list[str]:
    """The URLs of option `key` (camelCase or snake_case), each checked by `parse(url, what)`; a
    single URL is taken as a list of one. SpecError naming the option for anything else."""
    opts = dict(spec.options)
    raw = opts.get(key, opts.get(snake(key)))
    if raw in (None, ""):
        return []
    allowed = f"a JSON list of {scheme}:// URLs"
    try:
        values = json.loads(raw) if str(raw).lstrip().startswith("[") else [raw]
    except json.JSONDecodeError:
        raise SpecError(f"option {key} {raw!r} is not allowed: {allowed}") from None
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise SpecError(f"option {key} {raw!r} is not allowed: {allowed}")
    try:
        return [parse(v, f"option {key} {v!r}") for v in values]
    except UsageError as exc:
        raise SpecError(exc.message) from None


def with_access(spec: Any, reads: Sequence[str], writes: Sequence[str], read_key: str, write_key: str) -> Any:
    """The spec with the read and write scopes in its options (replacing any given before)."""
    drop = {read_key, write_key, snake(read_key), snake(write_key)}
    opts = [(k, v) for k, v in spec.options if k not in drop]
    if reads:
        opts.append((read_key, json.dumps(sorted(set(reads)))))
    if writes:
        opts.append((write_key, json.dumps(sorted(set(writes)))))
    return spec.replace(options=tuple(opts))


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
