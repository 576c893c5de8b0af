"""Stack config -> `ClusterSpec`: the one reader of the `gpucluster:` namespace.

Two callers read the same keys: the Pulumi program (`infra.program`, which gets the namespace
from the running stack) and `gpucluster cost estimate --stack` (which reads the file
`stacks/Pulumi.<stack>.yaml`). Both go through `spec_from_config`, so a stack file is priced as
exactly the spec `pulumi up` would declare. Keys of the `gpucluster:` namespace:

    cloud, nodes, name, region, zone, instanceType, accelerator, gpusPerNode, spot, diskGb,
    diskType, maxLifetimeMinutes, sshCidr, tags (an object), runId

Every other key of the namespace is a cloud option and goes into `spec.options` under its own
(camelCase) name, e.g. `gpucluster:efa`, `gpucluster:allowOpenSsh`, `gpucluster:systemMachineType`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Callable, Mapping, Union

from gpucluster.errors import ConfigError, SpecError, UsageError, not_allowed
from gpucluster.spec import ClusterSpec, config_scalar, config_tags, dns_label, parse_bool, parse_int
from gpucluster.states import JsonMapping, JsonObject

if TYPE_CHECKING:
    from yaml.nodes import Node

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
    "gpu": "gpu",  # TYPE[:COUNT], as --gpu: sets accelerator and gpus_per_node (the cloud picks the machine)
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

ConfigSource = Union[JsonMapping, Callable[[], JsonMapping]]


def sanitize_name(stack_name: str) -> str:
    """A stack name as a cluster name: lowercase, [a-z0-9-], starts with a letter, <= 40 chars."""
    return dns_label(stack_name, 40, prefix="gc-") or "gpucluster"


def _option_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _tags(value: object) -> dict[str, str]:
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
    fields: JsonObject = {}
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
                fields[field] = parse_bool(f"{NAMESPACE}:{key}", value)
            else:
                fields[field] = str(value)
    if "cloud" not in fields:
        raise ConfigError(
            f"stack {stack_name!r} has no {NAMESPACE}:cloud; set it, e.g. "
            f"`pulumi config set {NAMESPACE}:cloud aws -s {stack_name}`"
        )
    if "gpu" in fields:
        from gpucluster.catalog.gpus import combine

        fields["accelerator"], fields["gpus_per_node"] = combine(
            fields.pop("gpu"), fields.get("gpus_per_node"), fields.get("accelerator"),
            flag=f"{NAMESPACE}:gpu", count_flag=f"{NAMESPACE}:gpusPerNode")
    fields.setdefault("nodes", 1)
    fields.setdefault("name", sanitize_name(stack_name))
    fields["tags"] = tuple(sorted(fields.get("tags", {}).items()))
    fields["options"] = tuple(sorted(options.items()))
    return ClusterSpec(**fields)


def stack_name_of(path: str | Path) -> str:
    """`stacks/Pulumi.aws-g5.yaml` -> `aws-g5` (Pulumi's own naming); other names: the file stem."""
    stem = Path(path).stem
    return stem[len("Pulumi."):] if stem.startswith("Pulumi.") and len(stem) > len("Pulumi.") else stem


MAX_STACK_BYTES = 1 << 20  # a Pulumi stack file is a few KB
MAX_YAML_DEPTH = 32  # levels of nesting (the real ones have 3)
MAX_YAML_VALUES = 10_000  # values once aliases are expanded (a "billion laughs" file expands to 10^9)
# The tags a plain YAML document resolves to (YAML 1.1's core schema, as PyYAML's SafeLoader resolves
# them, and `<<` merge keys). An explicit tag (`!custom`, `!!python/name:os.system`) is refused by
# name before anything is constructed: SafeLoader would raise a ConstructorError traceback for it.
PLAIN_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq",
                                                           "merge", "timestamp"))


def compose_bounded(yaml: ModuleType, text: str, where: str, what: str = "stack file") -> Node | None:
    """The document's node graph (`yaml.compose`, safe), measured before anything is built: with
    YAML aliases a 2 KB file can expand to billions of values (the "billion laughs" file), and deep
    nesting exhausts the stack. Over MAX_YAML_VALUES (aliases expanded) or MAX_YAML_DEPTH, or a
    tag outside PLAIN_TAGS: ConfigError naming `what` and `where` (and the tag's line). None for
    an empty document. The nodes keep their positions (`start_mark`), so a reader can name the
    line of a bad value (task files)."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        values, todo = 0, [(root, 1)]
        node: Node
        while todo:
            node, depth = todo.pop()
            values += 1
            if values > MAX_YAML_VALUES:
                raise ConfigError(f"{what} {where!r} expands to more than {MAX_YAML_VALUES} values "
                                  "(YAML aliases repeating others?); write the values out")
            if depth > MAX_YAML_DEPTH:
                raise ConfigError(f"{what} {where!r} is nested too deeply (at most {MAX_YAML_DEPTH} levels)")
            if node.tag not in PLAIN_TAGS:
                tag = node.tag.replace("tag:yaml.org,2002:", "!!")
                raise ConfigError(f"{what} {where!r}, line {node.start_mark.line + 1}: the YAML tag {tag!r} is not "
                                  "allowed (plain values only: strings, numbers, booleans, lists and mappings)")
            if isinstance(node, yaml.SequenceNode):
                todo.extend((child, depth + 1) for child in node.value)
            elif isinstance(node, yaml.MappingNode):
                todo.extend((child, depth + 1) for pair in node.value for child in pair)
        return root
    finally:
        loader.dispose()


def _load_bounded(yaml: ModuleType, text: str, where: str) -> object:
    """`yaml.safe_load`, bounded as `compose_bounded` says."""
    root = compose_bounded(yaml, text, where)
    return None if root is None else yaml.SafeLoader("").construct_document(root)


def read_yaml_nodes(path: str | Path, what: str, max_bytes: int = MAX_STACK_BYTES, extra: str = "aws") -> Node | None:
    """A YAML file's node graph, read as stack files are read (size, UTF-8, bounded expansion and
    depth); every problem is one ConfigError (UsageError when the file is missing) naming `what`,
    the file and, for a syntax error, its line. Needs PyYAML (the `extra` to install otherwise)."""
    from gpucluster.errors import require

    yaml = require("yaml", extra)
    path = Path(path)
    try:
        return compose_bounded(yaml, _read_bounded(path, max_bytes, what).decode("utf-8"), str(path), what)
    except FileNotFoundError:
        raise UsageError(f"{what} {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise UsageError(f"{what} {str(path)!r} is a folder; give a YAML file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {str(path)!r} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at "
                          f"offset {exc.start}); save it as UTF-8") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f", line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{what} {str(path)!r}{line}: not valid YAML: {exc.problem or exc.context}") from None
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{what} {str(path)!r} cannot be read: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise ConfigError(f"{what} {str(path)!r} is nested too deeply (at most {MAX_YAML_DEPTH} levels)") from None


def _read_bounded(path: Path, max_bytes: int = MAX_STACK_BYTES, what: str = "stack file") -> bytes:
    """The file's bytes, at most `max_bytes` of them (gpucluster.userfile.read_bounded: a regular
    file only; a FIFO would block, /dev/zero never ends); every refusal a ConfigError."""
    from gpucluster.userfile import read_bounded

    hint = "a Pulumi stack YAML file" if what == "stack file" else "a YAML file"
    return read_bounded(path, what, max_bytes, hint=hint, error=ConfigError)


def read_stack_file(path: str | Path) -> JsonObject:
    """The `gpucluster:` namespace of a Pulumi stack file (keys without the prefix), as YAML
    decodes it. Needs PyYAML (installed with pulumi, the aws/gcp extras)."""
    from gpucluster.errors import require

    yaml = require("yaml", "aws")
    path = Path(path)
    try:
        doc = _load_bounded(yaml, _read_bounded(path).decode("utf-8"), str(path)) or {}
    except FileNotFoundError:
        raise UsageError(f"stack file {str(path)!r} does not exist") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"stack file {str(path)!r} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at "
                          f"offset {exc.start}); save it as UTF-8") from None
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"stack file {str(path)!r} cannot be read: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise ConfigError(f"stack file {str(path)!r} is nested too deeply (at most {MAX_YAML_DEPTH} levels)") from None
    config = doc.get("config") if isinstance(doc, dict) else None
    if not isinstance(config, dict):
        raise ConfigError(f"stack file {str(path)!r} has no config: mapping")
    prefix = f"{NAMESPACE}:"
    return {str(k)[len(prefix):]: v for k, v in config.items() if str(k).startswith(prefix)}


def spec_from_stack_file(path: str | Path) -> ClusterSpec:
    """The spec a stack file declares, read as the Pulumi program reads it (`spec_from_config`);
    errors name the file."""
    config = read_stack_file(path)
    if config.get("cloud") is None:
        raise ConfigError(f"stack file {str(path)!r} has no {NAMESPACE}:cloud")
    try:
        return spec_from_config(config, stack_name_of(path))
    except SpecError as exc:
        raise SpecError(f"stack file {str(path)!r}: {exc.message}") from None
    except ConfigError as exc:
        raise ConfigError(f"stack file {str(path)!r}: {exc.message}") from None
