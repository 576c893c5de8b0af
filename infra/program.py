"""The one Pulumi program: stack config -> `ClusterSpec` -> validated -> the cloud's component.

`pulumi up -s aws-g5` (stacks/__main__.py calls `main()`) and the Automation API both run this.
Config keys live in the `gpucluster:` namespace:

    cloud, nodes, name, region, zone, instanceType, accelerator, gpusPerNode, spot, diskGb,
    diskType, maxLifetimeMinutes, sshCidr, tags (an object), runId

Every other key of the namespace is a cloud option and goes into `spec.options` under its own
(camelCase) name, e.g. `gpucluster:efa`, `gpucluster:allowOpenSsh`, `gpucluster:ami`.
The spec is validated before any resource is declared: a bad spec declares nothing.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Mapping, Union

from gpucluster.errors import ConfigError, SpecError, not_allowed
from gpucluster.infra.registry import backend
from gpucluster.spec import ClusterSpec, config_scalar, config_tags, parse_int, validate

NAMESPACE = "gpucluster"

# config key -> ClusterSpec field, for the keys that are not cloud options
GENERIC_KEYS = {
    "cloud": "cloud",
    "nodes": "nodes",
    "name": "name",
    "region": "region",
    "zone": "zone",
    "instanceType": "instance_type",
    "accelerator": "accelerator",
    "gpusPerNode": "gpus_per_node",
    "spot": "spot",
    "diskGb": "disk_gb",
    "diskType": "disk_type",
    "maxLifetimeMinutes": "max_lifetime_minutes",
    "sshCidr": "ssh_cidr",
    "tags": "tags",
    "runId": "run_id",
}
def _normal(key: str) -> str:
    return re.sub(r"[^a-z0-9]", "", key.lower())


_GENERIC_BY_NORMAL = {_normal(k): k for k in GENERIC_KEYS}
_INT_FIELDS = {"nodes": 1, "gpus_per_node": 0, "disk_gb": 1, "max_lifetime_minutes": 1}

ConfigSource = Union[Mapping[str, Any], Callable[[], Mapping[str, Any]]]


def sanitize_name(stack_name: str) -> str:
    """A stack name as a cluster name: lowercase, [a-z0-9-], starts with a letter, <= 40 chars."""
    name = re.sub(r"[^a-z0-9-]+", "-", stack_name.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)
    if not name or not name[0].isalpha():
        name = "gc-" + name
    return name[:40].rstrip("-") or "gpucluster"


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "1"):
        return True
    if text in ("false", "no", "0"):
        return False
    raise SpecError(not_allowed(f"{NAMESPACE}:{key}", value, "true or false"))


def _option_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _tags(value: Any) -> dict[str, str]:
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError:
            raise ConfigError(not_allowed(f"{NAMESPACE}:tags", value, "an object of key: value")) from None
    return config_tags(f"{NAMESPACE}:tags", value)  # a mapping, no reserved key (managed-by, gpucluster-*)


def spec_from_config(config_getter: ConfigSource, stack_name: str) -> ClusterSpec:
    """Build a (not yet validated) spec from the `gpucluster:` namespace of a stack's config.

    `config_getter` is the namespace as a mapping (keys without the `gpucluster:` prefix;
    values as Pulumi passes them, i.e. strings, or as YAML decodes them), or a callable returning
    that mapping. Keys that are not generic spec keys become `spec.options`.
    """
    config = dict(config_getter() if callable(config_getter) else config_getter)
    fields: dict[str, Any] = {}
    options: dict[str, str] = {}
    for key, value in config.items():
        if value is None:
            continue
        field = GENERIC_KEYS.get(key)
        if field is None:
            twin = _GENERIC_BY_NORMAL.get(_normal(key))
            if twin is not None:
                raise ConfigError(f'config key {NAMESPACE}:{key} is misspelled (did you mean "{NAMESPACE}:{twin}"?)')
            options[key] = _option_text(value)
        elif field == "tags":
            fields[field] = _tags(value)
        else:
            config_scalar(f"{NAMESPACE}:{key}", value)  # a mapping or list where one value belongs
            if field in _INT_FIELDS:
                fields[field] = parse_int(f"{NAMESPACE}:{key}", value, low=_INT_FIELDS[field])
            elif field == "spot":
                fields[field] = _bool(key, value)
            else:
                fields[field] = str(value)
    if "cloud" not in fields:
        raise ConfigError(
            f"stack {stack_name!r} has no {NAMESPACE}:cloud; set it, e.g. "
            f"`pulumi config set {NAMESPACE}:cloud aws -s {stack_name}`"
        )
    fields.setdefault("nodes", 1)
    fields.setdefault("name", sanitize_name(stack_name))
    fields["tags"] = tuple(sorted(fields.get("tags", {}).items()))
    fields["options"] = tuple(sorted(options.items()))
    return ClusterSpec(**fields)


def run(spec: ClusterSpec) -> dict[str, Any]:
    """Validate (raising before anything is declared), declare the cloud's component, export."""
    import pulumi

    for warning in validate(spec):
        pulumi.log.warn(warning)
    chosen = backend(spec.cloud)
    if not chosen.provisions:
        raise SpecError(f"cloud {spec.cloud!r} has no Pulumi program (use the {spec.cloud} provider directly)")
    outputs = chosen.declare(spec)
    for key, value in outputs.items():
        pulumi.export(key, value)
    return outputs


def namespace_config() -> dict[str, Any]:
    """The `gpucluster:` keys of the running stack's config (prefix removed)."""
    from pulumi.runtime import config as runtime_config

    merged: dict[str, Any] = {}
    merged.update(runtime_config.get_config_env())
    merged.update(runtime_config.CONFIG.get())
    prefix = f"{NAMESPACE}:"
    return {k[len(prefix):]: v for k, v in merged.items() if k.startswith(prefix)}


def main() -> None:
    """Entry point of stacks/__main__.py."""
    import pulumi

    config = namespace_config()
    if "region" not in config:
        aws_region = pulumi.Config("aws").get("region")
        if aws_region and config.get("cloud") == "aws":
            config["region"] = aws_region
    run(spec_from_config(config, pulumi.get_stack()))
