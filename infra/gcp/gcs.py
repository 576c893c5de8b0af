"""GCS for `--data gs://...` and `--output gs://...` on gcp: URL checks, the scope the component
grants the cluster's pods (Workload Identity), the bucket IAM bindings, and the script a pod runs to
pull or push (`gcs_node.py`). Imports nothing heavy (no google.*, no pulumi).

- `parse_url(text, what)`: `gs://bucket[/prefix]` -> "gs://bucket/prefix" (normalized: no trailing
  `/`), or UsageError (exit 2) naming the value and what is allowed. Bucket names follow the Cloud
  Storage bucket naming rules, https://cloud.google.com/storage/docs/buckets#naming: 3-63
  characters (up to 222 with dots, each dot-separated component at most 63), lowercase letters,
  digits, `-`, `_` and `.`, starting and ending with a letter or digit, not an IP address in
  dotted-decimal notation, not starting with "goog", not containing "google" or a close misspelling
  ("g00gle"). The prefix may not hold `*`, `?`, `[`, `]`, `#` (wildcards in gcloud/gsutil), `"`,
  `'`, `\\` (they would end or escape the string literal of the granted IAM condition, widening it),
  `:` (the `--data` DEST separator), control characters (object names cannot hold CR or LF),
  `.`/`..` or empty segments; object names are at most 1,024 bytes of UTF-8
  (https://cloud.google.com/storage/docs/objects#naming), so the prefix is at most 900.
- `scopes(spec)`: the spec's `reads`/`writes` checked. A stack file (or `--option`) gives them as
  the options `gcsRead` / `gcsWrite` (JSON lists of URLs), lifted into those fields by
  `gpucluster.spec.normalize`.
- `iam_bindings(reads, writes)`: read = roles/storage.objectViewer, write =
  roles/storage.objectCreator (create only: overwriting needs storage.objects.delete, which it
  lacks), each on its bucket with an IAM condition confining it to the prefix. Nothing broader: no
  project-level role, no storage.admin, no objectAdmin. Conditions on a bucket need uniform
  bucket-level access ("IAM Conditions", https://cloud.google.com/storage/docs/access-control/iam#conditions).
- `GcsTransfer`: what the Kubernetes launcher runs in a pod (`script(python, mode, a, b)`).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from typing import TYPE_CHECKING, Sequence

from gpucluster.errors import SpecError
from gpucluster.states import JsonObject

if TYPE_CHECKING:
    from gpucluster.spec import ClusterSpec

SCHEME = "gs://"
OPTION_PREFIX = "gcs"  # the stack options gcsRead and gcsWrite (ObjectStore.option_prefix)
READ_ROLE = "roles/storage.objectViewer"  # storage.objects.get + storage.objects.list (and folders)
WRITE_ROLE = "roles/storage.objectCreator"  # storage.objects.create: no read, no delete, no overwrite
WORKLOAD_IDENTITY_ROLE = "roles/iam.workloadIdentityUser"
NODE_PROGRAM = "gcs_node.py"  # what a pod runs to pull and push (GcsTransfer)
OBJECTS_KSA = "gpucluster-objects"  # the Kubernetes service account the pods run as for object storage
DEFAULT_NAMESPACE = "default"  # = infra.kubernetes.plan.DEFAULT_NAMESPACE (option `namespace` overrides both)
PREFIX_MAX_BYTES = 900  # object names are at most 1,024 bytes: room for RUN_ID/node-N/<file>
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*[a-z0-9]$")
_PREFIX_BAD = set("*?[]#\"'\\:")
ALLOWED = ("gs://BUCKET[/PREFIX], BUCKET 3-63 characters of a-z 0-9 - _ . (starting and ending with a letter or "
           "digit, not an IP address, no 'goog' prefix, no 'google')")


def bucket_problem(bucket: str) -> str | None:
    """Why `bucket` is not a valid Cloud Storage bucket name, or None."""
    limit = 222 if "." in bucket else 63
    if not 3 <= len(bucket) <= limit:
        return (f"the bucket name {bucket!r} is {len(bucket)} characters long (3-63 allowed, up to 222 when it "
                "holds dots)")
    if not _BUCKET_RE.match(bucket):
        return (f"the bucket name {bucket!r} may only hold lowercase letters, digits, '-', '_' and '.', and must "
                "start and end with a letter or digit")
    parts = bucket.split(".")
    if any(not p for p in parts):
        return f"the bucket name {bucket!r} has an empty dot-separated component"
    if any(len(p) > 63 for p in parts):
        return f"the bucket name {bucket!r} has a dot-separated component longer than 63 characters"
    try:
        ipaddress.IPv4Address(bucket)
        return f"the bucket name {bucket!r} is an IP address in dotted-decimal notation"
    except ValueError:
        pass
    if bucket.startswith("goog"):
        return f"the bucket name {bucket!r} starts with 'goog' (reserved)"
    # "close misspellings, such as g00gle": digits that read as letters
    if "google" in bucket.translate(str.maketrans("013", "ole")):
        return f"the bucket name {bucket!r} contains 'google' or a close misspelling of it (reserved)"
    return None


def prefix_problem(prefix: str) -> str | None:
    if len(prefix.encode()) > PREFIX_MAX_BYTES:
        return f"the prefix is longer than {PREFIX_MAX_BYTES} bytes (object names are at most 1,024)"
    bad = sorted({c for c in prefix if c in _PREFIX_BAD or ord(c) < 32 or ord(c) == 127})
    if bad:
        return (f"the prefix holds {', '.join(repr(c) for c in bad)} (not allowed: '*', '?', '[', ']' and '#' are "
                "wildcards, quotes and '\\' would widen the granted IAM condition, ':' separates DEST, "
                "control characters cannot be in object names)")
    if any(p in ("", ".", "..") for p in prefix.split("/")):
        return "the prefix has an empty, '.' or '..' segment"
    if prefix == ".well-known/acme-challenge" or prefix.startswith(".well-known/acme-challenge/"):
        return "object names cannot start with .well-known/acme-challenge/"
    return None


def split(url: str) -> tuple[str, str]:
    """A normalized URL -> (bucket, prefix); prefix '' for the whole bucket."""
    bucket, _, prefix = url[len(SCHEME):].partition("/")
    return bucket, prefix


def parse_url(text: str, what: str) -> str:
    """`gs://bucket[/prefix]` checked -> normalized URL; UsageError starting with `what`."""
    from gpucluster.infra.object_scopes import parse_url as check

    return check(text, what, SCHEME, ALLOWED, bucket_problem, prefix_problem)


def scopes(spec: ClusterSpec) -> tuple[list[str], list[str]]:
    """(read URLs, write URLs) the component grants the nodes: the spec's `reads`/`writes`, checked."""
    from gpucluster.infra.object_scopes import scopes as checked

    return checked(spec, parse_url)


# -- identities ------------------------------------------------------------------------------------
def account_id(cluster_name: str) -> str:
    """The Google service account ID for a cluster's pods: 6-30 characters, a lowercase letter first,
    then lowercase letters, digits and '-', ending with a letter or digit
    (https://cloud.google.com/iam/docs/service-accounts-create#creating). A name too long for it is
    cut and given a hash of the whole name, so two clusters never share one."""
    s = re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]+", "-", cluster_name.lower())).strip("-")
    full = f"gpuc-{s}" if s else "gpuc-" + hashlib.sha256(cluster_name.encode()).hexdigest()[:8]
    if len(full) <= 30:
        return full
    return f"gpuc-{s[:18].rstrip('-')}-{hashlib.sha256(cluster_name.encode()).hexdigest()[:6]}"


_NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def namespace_of(spec: ClusterSpec) -> str:
    """The Kubernetes namespace the pods run in (option `namespace`, the launcher's), checked as a
    DNS-1123 label since it goes into the Workload Identity member."""
    ns = dict(spec.options).get("namespace") or DEFAULT_NAMESPACE
    if not _NAMESPACE_RE.match(str(ns)):
        raise SpecError(f"option namespace {ns!r} is not allowed: a Kubernetes namespace (lowercase letters, "
                        "digits and '-', at most 63, starting and ending with a letter or digit)")
    return str(ns)


def workload_member(project: str, namespace: str = DEFAULT_NAMESPACE, ksa: str = OBJECTS_KSA) -> str:
    """The Workload Identity principal of a Kubernetes service account, as granted
    roles/iam.workloadIdentityUser on the Google service account
    (https://cloud.google.com/kubernetes-engine/docs/how-to/workload-identity#kubernetes-sa-to-iam)."""
    return f"serviceAccount:{project}.svc.id.goog[{namespace}/{ksa}]"


# -- IAM -------------------------------------------------------------------------------------------
def _covered(urls: Sequence[str]) -> list[str]:
    """Sorted, without a URL that another one already covers (gs://b/a/x under gs://b/a)."""
    out: list[str] = []
    for url in sorted(set(urls)):
        bucket, prefix = split(url)
        if not any(split(o)[0] == bucket and (not split(o)[1] or prefix.startswith(split(o)[1] + "/")) for o in out):
            out.append(url)
    return out


def _title(verb: str, url: str) -> str:
    """A condition title (at most 100 characters): unique per URL, readable when it fits."""
    title = f"gpucluster {verb} {url}"
    if len(title) <= 100:
        return title
    return f"gpucluster {verb} {url[:60]}... {hashlib.sha256(url.encode()).hexdigest()[:12]}"


def read_condition(bucket: str, prefix: str) -> str:
    """objects.get is checked on the object (`resource.name` = projects/_/buckets/B/objects/NAME),
    objects.list on the bucket, where the request's prefix is the API attribute
    `storage.googleapis.com/objectListPrefix`: a condition on the object name alone would refuse the
    listing. Resource names: https://cloud.google.com/iam/docs/conditions-resource-attributes#resource-name
    (Cloud Storage rows); the list attribute: https://cloud.google.com/iam/docs/conditions-attribute-reference
    ("API attributes", Cloud Storage). The node lists with `prefix=PREFIX/`, which this admits."""
    return (f'resource.name.startsWith("projects/_/buckets/{bucket}/objects/{prefix}/") || '
            f'api.getAttribute("storage.googleapis.com/objectListPrefix", "").startsWith("{prefix}/")')


def write_condition(bucket: str, prefix: str) -> str:
    """objects.create is checked on the new object's name (same resource-name source as above)."""
    return f'resource.name.startsWith("projects/_/buckets/{bucket}/objects/{prefix}/")'


def iam_bindings(reads: Sequence[str], writes: Sequence[str]) -> list[JsonObject]:
    """One bucket IAM binding per URL (covered URLs dropped): {url, bucket, role, condition_title,
    condition_expression, condition_description}; the condition keys are None for a whole bucket
    (what was asked for). The prefixes were checked by `parse_url` (no quote or backslash can end
    the string literals)."""
    out: list[JsonObject] = []
    for verb, role, urls, expr in (("read", READ_ROLE, reads, read_condition),
                                   ("write", WRITE_ROLE, writes, write_condition)):
        for url in _covered(urls):
            bucket, prefix = split(url)
            if prefix and prefix_problem(prefix):
                raise SpecError(f"{url!r} is not allowed: {prefix_problem(prefix)}")
            out.append({
                "url": url, "bucket": bucket, "role": role,
                "condition_title": _title(verb, url) if prefix else None,
                "condition_expression": expr(bucket, prefix) if prefix else None,
                "condition_description": (f"{'list and read' if verb == 'read' else 'create (no overwrite)'} "
                                          f"objects under {url}/")[:256] if prefix else None,
            })
    return out


class GcsTransfer:
    """What the Kubernetes launcher runs in a pod to pull a `gs://` source or push its outputs: the
    program is `gcs_node.py` (standard library only: the image need not have google-cloud-storage
    or gcloud). The same contract as `infra.aws.s3.NodeTransfer` (consumed by `infra/ssh/objects.py`
    and the Kubernetes launcher): `pull URL DEST` / `push SRC URL`; the last stdout line is one JSON
    object (tool, files, bytes; push: total_files, failed); exit 0 done, 3 some files failed (push),
    4 nothing done (why on stderr).

    `path`: where the program lies on the node (the launcher ships it in the job's ConfigMap, see
    `program`/`at`, so the exec request carries a short command); None: sent as `python -c`."""

    scheme = "gs"

    def __init__(self, path: str | None = None):
        self.path = path

    def program(self) -> tuple[str, str]:
        """(file name, text) of the node program, its module docstring left out (the node does not need it)."""
        from pathlib import Path

        text = (Path(__file__).parent / NODE_PROGRAM).read_text()
        if text.startswith('"""'):
            text = text[text.index('"""', 3) + 3:].lstrip("\n")
        return NODE_PROGRAM, text

    def at(self, path: str) -> "GcsTransfer":
        """The same transfer, running the program from `path` on the node."""
        return GcsTransfer(path)

    def script(self, python: str, mode: str, a: str, b: str) -> str:
        """A POSIX sh script: the node program under `python`, else under `python3`, else exit 4
        naming what is missing."""
        import shlex

        if mode not in ("pull", "push"):
            raise ValueError(f"mode {mode!r}: pull or push")
        py = shlex.quote(python)
        program = shlex.quote(self.path) if self.path else "-c " + shlex.quote(self.program()[1])
        args = " ".join(shlex.quote(x) for x in (mode, a, b))
        missing = f"neither {python} nor python3 is on this node (the GCS transfer needs a Python 3)"
        return (f"if command -v {py} >/dev/null 2>&1; then exec {py} {program} {args}; fi\n"
                f"if command -v python3 >/dev/null 2>&1; then exec python3 {program} {args}; fi\n"
                f"echo {shlex.quote(missing)} >&2\n"
                "exit 4")
