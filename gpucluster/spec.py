"""`ClusterSpec`: what the user asked for, validated in one place before anything is created.

A spec is built from CLI flags or from Pulumi stack config (see `infra.program`) and checked by
`validate(spec, backend)`, which runs the generic checks here and then the cloud's own checks
against its catalog (`SpecRules.validate` of the plugin the caller passes, see `infra.contract`;
this module never looks a backend up). Validation either raises a
`SpecError` naming the bad value and what is allowed, or returns a list of warnings.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
import secrets
import time
import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, TypeVar

from gpucluster.errors import SpecError, UsageError, not_allowed
from gpucluster.states import JsonMapping, JsonObject

if TYPE_CHECKING:
    from gpucluster.infra.contract import Plugin

# Lifetime after which cloud nodes power themselves off even if this machine is gone.
DEFAULT_MAX_LIFETIME_MINUTES = 240
MAX_LIFETIME_MINUTES = 7 * 24 * 60
# Root/boot disk per node when the user gives none (`disk_gb` None): a backend may size it up for its
# image (aws: at least the AMI's root snapshot plus headroom, `infra/aws/catalog.root_disk_gb`).
DEFAULT_DISK_GB = 100

_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,38}[a-z0-9]$")
_TAG_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")

# Tags/labels gpucluster sets itself: the teardown check and `gc` find resources by them, so a user
# tag must never replace them. "managed-by", and every key starting with "gpucluster" (cluster, run,
# the owner marks gpucluster-owner/-user/-host/-stack of gpucluster.ownership, and the per-resource
# ones: gpucluster-rank, gpucluster-pool, gpucluster-job).
RESERVED_TAG_KEYS = ("managed-by",)
RESERVED_TAG_PREFIX = "gpucluster"


# EC2: "Maximum tags per resource: 50" (Tag your Amazon EC2 resources, tag restrictions); GCP labels: 64
# per resource. gpucluster's own (managed-by, gpucluster-cluster, -run, the MARK_KEYS, the per-resource
# ones) take up to 10 of them.
OWN_TAGS = 10
MAX_TAGS = 50 - OWN_TAGS
MARK_KEYS = ("gpucluster-owner", "gpucluster-user", "gpucluster-host", "gpucluster-stack")
_MARK_VALUE_RE = re.compile(r"^[a-z0-9_-]{1,63}$")


def is_reserved_tag(key: str) -> bool:
    k = str(key).strip().lower()
    return k in RESERVED_TAG_KEYS or k.startswith(RESERVED_TAG_PREFIX)


def reserved_tag_error(key: str, where: str = "tag") -> str:
    return (f"{where} {key!r} is reserved: gpucluster sets managed-by and gpucluster-* itself to find what a run "
            "created (teardown check, gc); choose another key")


def dns_label(text: str, limit: int = 63, prefix: str = "g-") -> str:
    """`text` as a DNS-1035 label (lowercase a-z0-9 and '-', starting with a letter, no '--' runs,
    at most `limit` characters): cluster names from stack names, Kubernetes object names."""
    name = re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]+", "-", str(text).lower())).strip("-")
    if not name or not name[0].isalpha():
        name = prefix + name
    return name[:limit].rstrip("-")


def new_run_id() -> str:
    """Sortable, unique, short, valid as a tag value, a GCP label and a torchrun rdzv id."""
    return time.strftime("r%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


@dataclass(frozen=True)
class ClusterSpec:
    cloud: str
    nodes: int
    name: str = "gpucluster"
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None  # aws: g5.*; gcp: N1 machine type
    accelerator: str | None = None  # gcp: nvidia-tesla-v100; aws: implied by the type (A10G)
    gpus_per_node: int | None = None  # None: what the instance type carries / what is present
    spot: bool = False
    disk_gb: int | None = None  # None: not given, the backend's default (DEFAULT_DISK_GB, sized up for the image)
    disk_type: str | None = None  # aws: gp3; gcp: pd-balanced
    max_lifetime_minutes: int = DEFAULT_MAX_LIFETIME_MINUTES
    ssh_cidr: str | None = None
    tags: tuple[tuple[str, str], ...] = ()
    run_id: str | None = None
    hosts: tuple[str, ...] = ()  # ssh backend: user@host[:port], head first
    options: tuple[tuple[str, str], ...] = ()  # cloud-specific extras (vpc_id, ami, efa, ...)
    # who made it (gpucluster.ownership.owner_marks / stack_marks): reserved tags on every resource
    marks: tuple[tuple[str, str], ...] = ()
    state: str | None = None  # aws/gcp: the Pulumi backend URL its stack lives in (recorded with the run)
    # object storage the nodes may read / write: URLs of the backend's scheme (`run --data/--output
    # s3://...`, or the stack options s3Read/s3Write, gcsRead/gcsWrite, lifted here by `normalize`)
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    # the account its resources live in (gcp: the project) and where that came from (flag, env, ...)
    project: str | None = None
    project_source: str | None = None

    # -- convenience -------------------------------------------------------------------------
    @property
    def tag_dict(self) -> dict[str, str]:
        return dict(self.tags)

    @property
    def option_dict(self) -> dict[str, str]:
        return dict(self.options)

    def option(self, key: str, default: Any = None) -> Any:
        return self.option_dict.get(key, default)

    @property
    def disk_size(self) -> int:
        """The disk per node in GB: the one given, else DEFAULT_DISK_GB (a backend may size it up)."""
        return DEFAULT_DISK_GB if self.disk_gb is None else int(self.disk_gb)

    def replace(self, **changes: Any) -> "ClusterSpec":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> JsonObject:
        d = dataclasses.asdict(self)
        d["tags"] = dict(self.tags)
        d["options"] = dict(self.options)
        d["hosts"] = list(self.hosts)
        d["marks"] = dict(self.marks)
        d["reads"], d["writes"] = list(self.reads), list(self.writes)
        return d

    @classmethod
    def from_dict(cls, d: JsonMapping) -> "ClusterSpec":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise SpecError(not_allowed("spec key", unknown[0], sorted(known)))
        kw = dict(d)
        kw["tags"] = _pairs(kw.get("tags") or {})
        kw["options"] = _pairs(kw.get("options") or {})
        kw["hosts"] = tuple(kw.get("hosts") or ())
        kw["marks"] = _pairs(kw.get("marks") or {})
        kw["reads"], kw["writes"] = tuple(kw.get("reads") or ()), tuple(kw.get("writes") or ())
        # a spec recorded before the project was a field kept it among the options
        legacy = dict(kw["options"])
        if kw.get("project") is None and legacy.get("project"):
            kw["project"], kw["project_source"] = legacy.pop("project"), legacy.pop("projectSource", None)
            kw["options"] = tuple(sorted(legacy.items()))
        return cls(**kw)

    def managed_tags(self) -> dict[str, str]:
        """Tags/labels put on every resource: they drive cost allocation and the leftover sweep."""
        tags = {k: v for k, v in self.tag_dict.items() if not is_reserved_tag(k)}  # validate() refuses them
        tags.update({"managed-by": "gpucluster", "gpucluster-cluster": self.name})
        if self.run_id:
            tags["gpucluster-run"] = self.run_id
        tags.update((k, v) for k, v in self.marks if k in MARK_KEYS)  # validate() refuses others
        return tags


def key_forms(key: str) -> tuple[str, str]:
    """An option name's two spellings: camelCase (stack config) and snake_case (`--option`; `normalize` also
    takes the snake_case form with '-' for '_', as kubectl-style flags write it: gpu-resource)."""
    camel = re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), key)
    snake = re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), camel)
    return camel, snake


def normalize(spec: ClusterSpec, backend: Plugin) -> ClusterSpec:
    """The spec in its one representation, whatever it was built from (`--option`, a stack file, a
    recorded run): each option the backend knows under its one spelling (`SpecRules.options`; the
    other spelling is accepted as input), the object-storage scopes (options such as `s3Read`) as
    the URL fields `reads`/`writes`, the project as a field. An unknown option stays as given, so
    `validate` names it as the user wrote it. SpecError for a scope option that is not a URL list."""
    store = backend.objects
    # the backend's options, and the option forms of the typed fields (lifted below, so that a spec
    # that skipped this step still carries them and `validate` refuses them, never drops them)
    lifted = [*(store.scope_options if store is not None else ()),
              *(("project",) if "project" in backend.traits.flags else ())]
    canonical = {form: name for name in (*backend.spec.options, *lifted)
                 for form in (name, *key_forms(name), key_forms(name)[1].replace("_", "-"))}  # and kebab-case
    options: dict[str, str] = {}
    for key, value in spec.options:
        options[canonical.get(key, key)] = value
    changes: JsonObject = {}
    if store is not None:
        for option, field in zip(store.scope_options, ("reads", "writes")):
            if option in options:
                given = option_urls(options.pop(option), option, store.url, store.scheme)
                changes[field] = tuple(sorted(set(getattr(spec, field)) | set(given)))
    if options.get("project") and "project" in backend.traits.flags:
        changes["project"] = options.pop("project")
        changes["project_source"] = options.pop("projectSource", None) or spec.project_source or "option project"
    options.pop("projectSource", None)
    return spec.replace(options=tuple(sorted(options.items())), **changes)


def option_urls(raw: str, key: str, parse: Callable[[str, str], str], scheme: str) -> list[str]:
    """The URLs of scope option `key` (its value `raw`: a JSON list, or one URL taken as a list of
    one), each checked by `parse(url, what)`; SpecError naming the option for anything else."""
    if raw in (None, ""):
        return []
    allowed = f"a JSON list of {scheme}:// URLs"
    try:
        values = json.loads(raw) if str(raw).lstrip().startswith("[") else [raw]
    except json.JSONDecodeError:
        raise SpecError(f"option {key} {raw!r} is not allowed: {allowed}") from None
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise SpecError(f"option {key} {raw!r} is not allowed: {allowed}")
    return scope_urls(values, f"option {key}", parse)


def scope_urls(values: Sequence[str], what: str, parse: Callable[[str, str], str]) -> list[str]:
    """Each URL checked by `parse`, SpecError naming `what` and the URL otherwise."""
    try:
        return [parse(v, f"{what} {v!r}") for v in values]
    except UsageError as exc:
        raise SpecError(exc.message) from None


def _pairs(m: JsonMapping | tuple) -> tuple[tuple[str, str], ...]:
    if isinstance(m, tuple):
        return m
    return tuple(sorted((str(k), str(v)) for k, v in m.items()))


T = TypeVar("T")


def parse_int(what: str, value: object, *, low: int, high: int | None = None) -> int:
    """An integer within [low, high], or a SpecError naming the value and the range."""
    allowed = f"an integer from {low} to {high}" if high is not None else f"an integer >= {low}"
    if isinstance(value, bool):
        raise SpecError(not_allowed(what, value, allowed))
    try:
        n = int(str(value).strip())
    except (TypeError, ValueError):
        raise SpecError(not_allowed(what, value, allowed)) from None
    if n < low or (high is not None and n > high):
        raise SpecError(not_allowed(what, value, allowed))
    return n


_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off", ""}


def parse_bool(what: str, raw: object, default: bool = False) -> bool:
    """A config/option boolean (true/false, yes/no, 1/0, on/off), or a SpecError naming it."""
    if raw is None:
        return default
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise SpecError(not_allowed(what, raw, "true or false"))


def parse_minutes(what: str, raw: object, most: int) -> int | None:
    """An option's whole number of minutes from 1 to `most` (None when unset), or a SpecError naming it."""
    if raw in (None, ""):
        return None
    allowed = f"a whole number of minutes from 1 to the max lifetime ({most})"
    try:
        minutes = int(str(raw).strip())
    except ValueError:
        raise SpecError(not_allowed(what, raw, allowed)) from None
    if not 1 <= minutes <= most:
        raise SpecError(not_allowed(what, raw, allowed))
    return minutes


def config_scalar(what: str, value: T) -> T:
    """A stack-config value that must be one string/number/boolean (not a mapping or list)."""
    if isinstance(value, (Mapping, list, tuple, set)):
        shape = "a mapping" if isinstance(value, Mapping) else "a list"
        raise SpecError(f"{what} is {shape} ({_short(value)}); it must be a single value (a string or number)")
    return value


def config_tags(what: str, value: object) -> dict[str, str]:
    """A stack config's tags: a mapping of key: value, no reserved key, no nested values."""
    if not isinstance(value, Mapping):
        raise SpecError(not_allowed(what, _short(value), "a mapping of key: value"))
    out = {}
    for k, v in value.items():
        if is_reserved_tag(str(k)):
            raise SpecError(reserved_tag_error(str(k), f"{what} key"))
        config_scalar(f"{what}.{k}", v)
        out[str(k)] = "true" if v is True else "false" if v is False else str(v)
    return out


def _short(value: object, limit: int = 60) -> str:
    text = repr(value) if not isinstance(value, str) else value
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_ssh_cidr(spec: ClusterSpec) -> None:
    if spec.ssh_cidr is not None:
        try:
            ipaddress.ip_network(spec.ssh_cidr, strict=False)
        except ValueError:
            raise SpecError(
                not_allowed("ssh CIDR", spec.ssh_cidr, "an IPv4/IPv6 network such as 203.0.113.7/32")
            ) from None


def _check_tags(spec: ClusterSpec) -> None:
    if len(spec.tags) > MAX_TAGS:
        raise SpecError(not_allowed("number of tags", len(spec.tags),
                                    f"at most {MAX_TAGS} (EC2 takes 50 per resource, and gpucluster keeps {OWN_TAGS} for its own)"))
    for key, value in spec.tags:
        if is_reserved_tag(key):
            raise SpecError(reserved_tag_error(key))
        if not _TAG_KEY_RE.match(key):
            raise SpecError(
                not_allowed("tag key", key, "lowercase letters, digits, '_' and '-' (GCP label rules)")
            )
        if len(value) > 63:
            raise SpecError(not_allowed(f"tag {key} value", value, "at most 63 characters"))
        if any(unicodedata.category(ch).startswith("C") for ch in value):
            raise SpecError(not_allowed(f"tag {key} value", value, "printable characters: no newline, tab or "
                                        "other control character (EC2 tags and GCP labels refuse them)"))


def _check_marks(spec: ClusterSpec) -> None:
    for key, value in spec.marks:
        if key not in MARK_KEYS:
            raise SpecError(not_allowed("owner mark", key, MARK_KEYS))
        if not _MARK_VALUE_RE.match(value):
            raise SpecError(not_allowed(f"owner mark {key} value", value,
                                        "1-63 lowercase letters, digits, '_' and '-' (a GCP label value)"))


def validate(spec: ClusterSpec, backend: Plugin) -> list[str]:
    """Check a spec against the generic rules and those of `backend` (the plugin its `cloud`
    names); raise SpecError on the first problem, return warnings otherwise."""
    if spec.cloud != backend.name:
        raise SpecError(not_allowed("cloud", spec.cloud, (backend.name,)))
    parse_int("nodes", spec.nodes, low=1, high=backend.traits.max_nodes)
    if not _NAME_RE.match(spec.name or ""):
        raise SpecError(
            not_allowed(
                "cluster name",
                spec.name,
                "2-40 characters: lowercase letters, digits and '-', starting with a letter",
            )
        )
    if spec.gpus_per_node is not None:
        parse_int("gpus per node", spec.gpus_per_node, low=0, high=16)
    if spec.disk_gb is not None:
        parse_int("disk size (GB)", spec.disk_gb, low=10, high=16384)
    parse_int("max lifetime (minutes)", spec.max_lifetime_minutes, low=5, high=MAX_LIFETIME_MINUTES)
    _check_ssh_cidr(spec)
    _check_tags(spec)
    _check_marks(spec)
    known = backend.spec.options
    for key, _ in spec.options:
        if key not in known:
            raise SpecError(not_allowed(f"{backend.name} option", key, list(known) or "none (this backend takes no options)"))
    return list(backend.spec.validate(spec))


def resolve(spec: ClusterSpec, backend: Plugin) -> ClusterSpec:
    """The spec with the location actually used filled in, defaults included (aws: the region;
    gcp: zone and region), by `backend`'s `SpecRules.resolve`.

    Called once, before the ledger row is written: the ledger, the provider, the teardown check
    and `gc` then all read the same region/zone, never an ambient default."""
    return backend.spec.resolve(spec)
