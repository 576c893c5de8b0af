"""Task files: everything `gpucluster run` takes, kept in one YAML file (docs/tasks.md).

    gpucluster run task.yaml            gpucluster run -f task.yaml --nodes 4
    gpucluster up task.yaml             gpucluster sweep -f task.yaml --nodes 1,2,4
    gpucluster cost estimate -f task.yaml

Every key is the flag of the same name (dashes written as underscores), grouped as `KEYS` says;
a flag given on the command line wins over the file. This module reads and checks the file's
shape (known keys, one value of the right kind each, no key twice) and returns the values as the
flags would give them (`TaskFile.values`, by Click parameter name), each with the key and line it
came from (`TaskFile.where`), so every later check can name both. It is read as stack files are
read (`stackconfig.read_yaml_nodes`: size, UTF-8, aliases and depth bounded). Nothing here
prints, creates or records anything.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from gpucluster.errors import ConfigError, did_you_mean
from gpucluster.states import JsonObject

if TYPE_CHECKING:
    from yaml.nodes import Node


MAX_TASK_BYTES = 256 * 1024  # a task file is a few hundred bytes

# kinds of value
STR, INT, FLOAT, BOOL, LIST, ARGV, MAP, HOSTS, PATH = ("a string", "an integer", "a number", "true or false",
                                                       "a list of strings (or one string)",
                                                       "a command: a string or a list of arguments",
                                                       "a mapping of KEY: value", "a list of user@host[:port]",
                                                       "a path")


@dataclass(frozen=True)
class Key:
    param: str  # the Click parameter it gives a value to (the flag's name)
    kind: str
    flag: str  # the flag, as --help shows it


def _key(param: str, kind: str, flag: str | None = None) -> Key:
    return Key(param, kind, flag or "--" + param.replace("_", "-"))


# file key (dotted for a group) -> what it sets; docs/tasks.md lists them in this order
KEYS: dict[str, Key] = {
    "name": _key("name", STR),
    "resources.cloud": _key("cloud", STR),
    "resources.region": _key("region", STR),
    "resources.zone": _key("zone", STR),
    "resources.gpu": _key("gpu", STR),
    "resources.instance_type": _key("instance_type", STR),
    "resources.nodes": _key("nodes", INT),
    "resources.gpus_per_node": _key("gpus_per_node", INT),
    "resources.spot": _key("spot", BOOL),
    "resources.disk_gb": _key("disk_gb", INT),
    "resources.ssh_cidr": _key("ssh_cidr", STR),
    "resources.project": _key("project", STR),
    "resources.hosts": _key("hosts", HOSTS),
    "resources.context": _key("context", STR),  # kubernetes: the kubeconfig context
    "resources.namespace": _key("namespace", STR),
    "resources.create_namespace": _key("create_namespace", BOOL),
    "resources.tags": _key("tags", MAP, "--tag"),
    "resources.options": _key("options", MAP, "--option"),
    "ssh.identity": _key("identity", PATH),
    "ssh.known_hosts": _key("known_hosts", PATH),
    "ssh.remote_python": _key("remote_python", STR),
    "python": _key("python", STR),
    "workdir": _key("workdir", PATH, "(none: the folder the command runs from)"),
    "setup": _key("setup", LIST),
    "run": _key("command", ARGV, "-- COMMAND"),
    "workload": _key("workload", STR),
    "epochs": _key("epochs", INT),
    "workload_args": _key("workload_args", STR),
    "procs_per_node": _key("procs_per_node", INT),
    "threads_per_proc": _key("threads_per_proc", INT),
    "data": _key("data", LIST),
    "resume": _key("resume", STR),
    "env": _key("env", MAP),
    "env_file": _key("env_file", LIST),
    "secrets": _key("secret", LIST, "--secret"),
    "outputs.dir": _key("output", STR, "--output"),
    "outputs.collect": _key("collect", LIST),
    "outputs.limit": _key("collect_limit", STR, "--collect-limit"),
    "limits.max_minutes": _key("max_minutes", FLOAT),
    "limits.max_cost": _key("max_cost", FLOAT, "--max-cost"),
    "limits.stall_minutes": _key("stall_minutes", FLOAT),
    "limits.max_lifetime": _key("max_lifetime", INT),
    "limits.max_restarts": _key("max_restarts", INT),
    "limits.ready_timeout": _key("ready_timeout", INT),
    "limits.start_deadline": _key("start_deadline", INT),
    "keep": _key("keep", BOOL),
    # the health check and recovery (docs/recovery.md)
    "check": _key("check", BOOL, "--check/--no-check"),
    "recover": _key("recover", INT),
    "fallback": _key("fallback", STR),
    "fallback_after": _key("fallback_after", INT),
    "checkpoint_every": _key("checkpoint_every", INT),
}
GROUPS = sorted({k.split(".")[0] for k in KEYS if "." in k})
TOP = sorted({k.split(".")[0] for k in KEYS})
BY_PARAM = {k.param: name for name, k in KEYS.items()}


@dataclass(frozen=True)
class Where:
    key: str  # the file's key, dotted (resources.nodes)
    line: int  # 1-based

    def __str__(self) -> str:
        return f"line {self.line}: {self.key}"


@dataclass
class TaskFile:
    path: Path
    workdir: Path  # where the command runs from: `workdir`, relative to the file's folder (default: that folder)
    values: JsonObject = field(default_factory=dict)  # Click parameter name -> value as the flag gives it
    where: dict[str, Where] = field(default_factory=dict)  # Click parameter name -> the key and its line

    def error(self, param: str, message: str) -> ConfigError:
        """A one-line error about the value of `param`, naming the file, the line and the key."""
        return ConfigError(f"task file {str(self.path)!r}, {self.where[param]}: {message}")


def load(path: str | Path) -> TaskFile:
    """The task file at `path`, checked for shape; ConfigError (exit 2) naming the key and line."""
    from gpucluster.plan.stackconfig import read_yaml_nodes

    path = Path(path).expanduser()
    root = read_yaml_nodes(path, "task file", MAX_TASK_BYTES, extra="local")
    task = TaskFile(path=path, workdir=path.resolve().parent)
    if root is None:
        raise ConfigError(f"task file {str(path)!r} is empty; see docs/tasks.md for its keys")
    yaml = _yaml()
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError(f"task file {str(path)!r}, line {_line(root)}: the file must be a mapping of keys "
                          f"({', '.join(TOP)}), not {_shape(root)}")
    for key, node in _pairs(task, root, ""):
        if key in GROUPS:
            if not isinstance(node, yaml.MappingNode):
                raise _err(task, node, key, f"a mapping of {', '.join(_group_keys(key))}, not {_shape(node)}")
            for sub, value in _pairs(task, node, key + "."):
                _take(task, f"{key}.{sub}", value)
        else:
            _take(task, key, node)
    if "workdir" in task.values:
        raw = task.values.pop("workdir")
        where = task.where.pop("workdir")
        folder = (task.path.resolve().parent / Path(raw).expanduser()).resolve()
        if not folder.is_dir():
            state = "is a file" if folder.exists() else "does not exist"
            raise ConfigError(f"task file {str(path)!r}, {where}: the folder {raw!r} ({folder}) {state}; give the "
                              "folder the command runs from (relative to the task file's folder)")
        task.workdir = folder
    return task


# -- reading the nodes -------------------------------------------------------------------------
def _yaml() -> ModuleType:  # PyYAML, imported when a file is read
    from gpucluster.errors import require

    return require("yaml", "local")


def _line(node: Node) -> int:
    return node.start_mark.line + 1


def _shape(node: Node) -> str:
    yaml = _yaml()
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return repr(_scalar(node))


def _err(task: TaskFile, node: Node, key: str, allowed: str) -> ConfigError:
    return ConfigError(f"task file {str(task.path)!r}, line {_line(node)}: {key}: {allowed}")


def _group_keys(group: str) -> list[str]:
    return [k.split(".", 1)[1] for k in KEYS if k.startswith(group + ".")]


def _pairs(task: TaskFile, node: Node, prefix: str) -> list[tuple[str, Node]]:
    """The mapping's (key, value node) pairs; a key that is unknown, not a string, or given twice is refused."""
    yaml = _yaml()
    known = _group_keys(prefix[:-1]) if prefix else TOP
    seen: dict[str, int] = {}
    out = []
    for knode, vnode in node.value:
        if not isinstance(knode, yaml.ScalarNode) or knode.tag == "tag:yaml.org,2002:merge":
            raise _err(task, knode, prefix.rstrip(".") or "the file", "YAML merge keys and keys that are not "
                       "names are not allowed here: write the keys out")
        key = str(knode.value)
        if key not in known:
            where = f"in {prefix[:-1]}" if prefix else "at the top"
            raise ConfigError(f"task file {str(task.path)!r}, line {_line(knode)}: unknown key {prefix + key!r} "
                              f"{where}{did_you_mean(key, known)}; allowed: {', '.join(known)}")
        if key in seen:
            raise ConfigError(f"task file {str(task.path)!r}, line {_line(knode)}: {prefix}{key} is given twice "
                              f"(first on line {seen[key]}); keep one")
        seen[key] = _line(knode)
        out.append((key, vnode))
    return out


def _scalar(node: Node) -> object:
    """A scalar node's value as YAML resolves it (int, float, bool, None, str)."""
    return _yaml().SafeLoader("").construct_object(node)


def _take(task: TaskFile, key: str, node: Node) -> None:
    spec = KEYS[key]
    value = _convert(task, key, spec, node)
    if value is None:
        return  # `key:` with no value: as if it were not there
    task.values[spec.param] = value
    task.where[spec.param] = Where(key, _line(node))


def _convert(task: TaskFile, key: str, spec: Key, node: Node) -> object:
    yaml = _yaml()
    kind = spec.kind
    if isinstance(node, yaml.ScalarNode) and _scalar(node) is None:
        return None
    if kind in (STR, INT, FLOAT, BOOL, PATH):
        return _convert_scalar(task, key, kind, node)
    if kind == MAP:
        return _convert_map(task, key, kind, node)
    items = _items(task, key, kind, node)
    if kind == ARGV:
        return _convert_argv(task, key, node, items)
    if kind == HOSTS:
        return ",".join(items)
    return items


def _convert_scalar(task: TaskFile, key: str, kind: str, node: Node) -> object:
    """A str, int, float, bool or path key's one value."""
    if not isinstance(node, _yaml().ScalarNode):
        raise _err(task, node, key, f"{kind}, not {_shape(node)}")
    value = _scalar(node)
    if kind == BOOL:
        if not isinstance(value, bool):
            raise _err(task, node, key, f"true or false, not {value!r}")
        return value
    if isinstance(value, bool):
        raise _err(task, node, key, f"{kind}, not {str(value).lower()} (quote it if it is text)")
    if kind == INT and isinstance(value, float):
        raise _err(task, node, key, f"an integer, not {value!r}")
    if kind in (INT, FLOAT) and isinstance(value, str):
        raise _err(task, node, key, f"{kind}, not {value!r}")
    if kind in (STR, PATH):
        return _text_value(task, key, kind, node, value)
    return value


def _text_value(task: TaskFile, key: str, kind: str, node: Node, value: object) -> str:
    """A str or path key's value as text: a string or number that is not blank."""
    if not isinstance(value, (str, int, float)):
        raise _err(task, node, key, f"{kind}, not {value!r}")
    text = str(value)
    if not text.strip():
        raise _err(task, node, key, f"{kind} that is not empty")
    return text


def _convert_map(task: TaskFile, key: str, kind: str, node: Node) -> list[str]:
    """A mapping key's `name=value` items, in the file's order."""
    yaml = _yaml()
    if not isinstance(node, yaml.MappingNode):
        raise _err(task, node, key, f"{kind}, not {_shape(node)}")
    out: list[str] = []
    seen: set[str] = set()
    for knode, vnode in node.value:
        name = _scalar(knode) if isinstance(knode, yaml.ScalarNode) else None
        if not isinstance(name, str) or not name:
            raise _err(task, knode, key, "keys that are names (strings)")
        if name in seen:
            raise _err(task, knode, key, f"{name} is given twice; keep one")
        seen.add(name)
        if not isinstance(vnode, yaml.ScalarNode):
            raise _err(task, vnode, f"{key}.{name}", f"one value (a string, number or true/false), not "
                       f"{_shape(vnode)}")
        out.append(f"{name}={_map_text(_scalar(vnode))}")
    return out


def _map_text(v: object) -> str:
    return "" if v is None else ("true" if v is True else "false" if v is False else str(v))


def _convert_argv(task: TaskFile, key: str, node: Node, items: list[str]) -> tuple[str, ...]:
    """A command: a list of arguments, or one line split as a shell would (no operators)."""
    if len(items) == 1 and isinstance(node, _yaml().ScalarNode):
        op = shell_operator(items[0])
        if op:
            raise _err(task, node, key, f"one command, not a shell line: {op!r} is a shell operator and no shell "
                                        "runs it (the script would get it as an argument); put the pipeline in "
                                        "a script, or write run: [bash, -c, '...']")
        try:
            items = shlex.split(items[0])
        except ValueError as exc:
            raise _err(task, node, key, f"a command that splits into arguments ({exc}); check the quotes") from None
    if not items:
        raise _err(task, node, key, "a command, e.g. python train.py --epochs 3")
    return tuple(items)


def shell_operator(text: str) -> str | None:
    """The first unquoted shell operator in a command line (`|`, `||`, `&&`, `;`, `&`, `>`, `>>`,
    `<`, `2>`), or None. `run: python train.py | tee log` split into arguments gave the script `|`,
    `tee` and `log` (issue 45 item 10). Quoted or backslash-escaped characters are arguments."""
    quote = None
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == quote:
                quote = None
            elif c == "\\" and quote == '"':
                i += 1
        elif c in "'\"":
            quote = c
        elif c == "\\":
            i += 1
        elif c in "|;&<>":
            j = i + 1
            while j < len(text) and text[j] in "|&>" and j - i < 2:
                j += 1
            start = i - 1 if c == ">" and i > 0 and text[i - 1].isdigit() and (i < 2 or text[i - 2].isspace()) else i
            return text[start:j]
        i += 1
    return None


def _items(task: TaskFile, key: str, kind: str, node: Node) -> list[str]:
    """One string or a list of strings (numbers taken as text)."""
    yaml = _yaml()
    nodes = node.value if isinstance(node, yaml.SequenceNode) else [node]
    if isinstance(node, yaml.MappingNode):
        raise _err(task, node, key, f"{kind}, not a mapping")
    out = []
    for item in nodes:
        value = _scalar(item) if isinstance(item, yaml.ScalarNode) else None
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not str(value).strip():
            shown = _shape(item) if not isinstance(item, yaml.ScalarNode) else repr(value)
            raise _err(task, item, key, f"{kind}; an item is {shown}")
        out.append(str(value))
    return out
