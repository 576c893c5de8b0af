"""The user config file: defaults for `run`, `up`, `sweep` and `cost estimate` (docs/tasks.md).

Where: `$GPUCLUSTER_CONFIG` when set, else `config.yaml` in the platform's user config folder
(`platformdirs.user_config_dir("gpucluster")`: ~/.config/gpucluster on Linux,
~/Library/Application Support/gpucluster on macOS). A missing file is no defaults.

    cloud: aws                       # the cloud when neither --cloud nor a task file names one
    budget: {daily: 50, monthly: 800}  # USD this home may spend per period (gpucluster/costing/budget.py)
    state: s3://team-bucket/pulumi   # the Pulumi state backend (`state_backend()`)
    notify:                          # webhooks told when a run ends (`run --notify`; gpucluster.lifecycle.notify)
      - https://hooks.slack.com/services/T000/B000/XXXX
    aws:                             # defaults for aws runs only
      region: us-west-2
      ssh_cidr: 203.0.113.7/32
      max_cost: 50                   # --max-cost for every aws run and sweep that does not give one
    gcp:
      region: us-central1
      project: my-project
    kubernetes:
      contexts:                      # settings per kubeconfig context (a cloud that takes --context)
        lab: {price_per_gpu_hour: 2.50}  # the internal price of that context's runs (else --option's, else $0)

Precedence, for every setting: a flag > the task file > the environment (GPUCLUSTER_CLOUD,
GPUCLUSTER_REGION, GPUCLUSTER_ZONE, GPUCLUSTER_SSH_CIDR, GPUCLUSTER_PROJECT, GPUCLUSTER_STATE) >
this file > the built-in default. This module reads and checks the file; the CLI applies it
(`gpucluster.cli.taskopts`). Nothing here prints or creates anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Mapping

from gpucluster.errors import ConfigError, did_you_mean

if TYPE_CHECKING:
    from yaml.nodes import Node


CONFIG_ENV = "GPUCLUSTER_CONFIG"
MAX_CONFIG_BYTES = 64 * 1024
TOP_KEYS = ("cloud", "state", "budget", "notify")  # budget: a mapping of periods (gpucluster/costing/budget.py)
# the keys of a cloud's section (each must be a flag that cloud takes)
CLOUD_KEYS = ("region", "zone", "instance_type", "ssh_cidr", "project", "identity", "known_hosts", "remote_python",
              "python", "max_cost", "stall_minutes")
# the keys of a `contexts:` entry in the section of a cloud that takes --context (kubernetes): per kubeconfig context
CONTEXT_KEYS = ("price_per_gpu_hour",)
MAX_PRICE_PER_GPU_HOUR = Decimal(1000)
# the environment's layer: variable -> the setting (a Click parameter name, or "state")
ENV_VARS = {"GPUCLUSTER_CLOUD": "cloud", "GPUCLUSTER_REGION": "region", "GPUCLUSTER_ZONE": "zone",
            "GPUCLUSTER_SSH_CIDR": "ssh_cidr", "GPUCLUSTER_PROJECT": "project", "GPUCLUSTER_STATE": "state"}


@dataclass
class UserConfig:
    path: Path
    top: dict[str, str] = field(default_factory=dict)  # cloud, state
    notify: list[str] = field(default_factory=list)  # webhook URLs (a URL or a list of them in the file)
    clouds: dict[str, dict[str, str]] = field(default_factory=dict)  # cloud -> setting -> value
    lines: dict[str, int] = field(default_factory=dict)  # "cloud", "aws.region" -> line
    budget: dict[str, float] = field(default_factory=dict)  # period -> USD (gpucluster/costing/budget.py)
    contexts: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)  # cloud -> context -> key -> value

    def context_setting(self, cloud: str, context: str, key: str) -> tuple[str, str] | None:
        """(the value, where it is: file and line) of a `contexts:` setting, or None."""
        value = self.contexts.get(cloud, {}).get(context, {}).get(key)
        return None if value is None else (value, self.where(f"{cloud}.contexts.{context}.{key}"))

    def where(self, key: str) -> str:
        return f"config file {str(self.path)!r}, line {self.lines.get(key, 0)}: {key}"


def config_path() -> Path:
    """$GPUCLUSTER_CONFIG, else config.yaml in the platform's user config folder."""
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_config_dir("gpucluster", appauthor=False)) / "config.yaml"


def load_config(path: Path | None = None, *, clouds: Mapping[str, tuple[str, ...]] | None = None) -> UserConfig:
    """The user config, checked; a missing file is an empty config. `clouds`: each cloud's name and
    the flags it takes (the CLI passes them): a section or a `cloud:` naming another cloud, or a
    setting the cloud does not take, is refused naming the key and line (ConfigError, exit 2)."""
    path = path or config_path()
    cfg = UserConfig(path=path)
    if os.environ.get(CONFIG_ENV) is not None and not os.environ[CONFIG_ENV]:
        return cfg  # GPUCLUSTER_CONFIG= (empty): no config file
    if not path.exists():
        if os.environ.get(CONFIG_ENV):
            raise ConfigError(f"config file {str(path)!r} (${CONFIG_ENV}) does not exist; create it or unset "
                              f"{CONFIG_ENV}")
        return cfg
    from gpucluster.plan.stackconfig import read_yaml_nodes

    root = read_yaml_nodes(path, "config file", MAX_CONFIG_BYTES, extra="local")
    if root is None:
        return cfg
    yaml = _yaml()
    names = tuple(clouds) if clouds is not None else ()
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError(f"config file {str(path)!r}: the file must be a mapping of keys ({', '.join(TOP_KEYS)} "
                          "and one section per cloud)")
    for knode, vnode in root.value:
        key = str(knode.value)
        line = knode.start_mark.line + 1
        if key in cfg.lines:
            raise ConfigError(f"config file {str(path)!r}, line {line}: {key} is given twice; keep one")
        cfg.lines[key] = line
        if key in ("budget", "notify", *TOP_KEYS):
            _top_key(cfg, key, vnode, clouds, names)
            continue
        if clouds is not None and key not in clouds:
            raise ConfigError(f"config file {str(path)!r}, line {line}: unknown key {key!r}"
                              f"{did_you_mean(key, TOP_KEYS + names)}; allowed: {', '.join(TOP_KEYS + names)}")
        if not isinstance(vnode, yaml.MappingNode):
            raise ConfigError(f"config file {str(path)!r}, line {line}: {key}: a mapping of settings "
                              f"({', '.join(CLOUD_KEYS)})")
        cfg.clouds[key] = _cloud_section(cfg, key, vnode, clouds)
    return cfg


def _top_key(cfg: UserConfig, key: str, vnode: Node, clouds: Mapping[str, tuple[str, ...]] | None,
             names: tuple[str, ...]) -> None:
    """`budget:`, `notify:` or one of TOP_KEYS (`cloud:` names a cloud, or a placement)."""
    yaml = _yaml()
    if key == "budget":
        from gpucluster.costing.budget import parse_budget

        given = ({str(k.value): v.value for k, v in vnode.value} if isinstance(vnode, yaml.MappingNode)
                 else vnode.value)
        cfg.budget = parse_budget(given, cfg.where(key))
    elif key == "notify":
        items = vnode.value if isinstance(vnode, yaml.SequenceNode) else [vnode]
        cfg.notify = [_text(cfg, key, item) for item in items]
    else:
        cfg.top[key] = _text(cfg, key, vnode)
        if key == "cloud" and clouds is not None and cfg.top[key] not in clouds and not _placed(cfg.top[key]):
            raise ConfigError(f"{cfg.where(key)}: {cfg.top[key]!r} is not a cloud{did_you_mean(cfg.top[key], names)}; "
                              f"allowed: {', '.join(names)}")


def _cloud_section(cfg: UserConfig, key: str, vnode: Node,
                   clouds: Mapping[str, tuple[str, ...]] | None) -> dict[str, str]:
    """One cloud's section: settings of CLOUD_KEYS, each once, and only those the cloud takes."""
    section: dict[str, str] = {}
    for sk, sv in vnode.value:
        name = str(sk.value)
        full = f"{key}.{name}"
        cfg.lines[full] = sk.start_mark.line + 1
        if name == "contexts" and (clouds is None or "context" in clouds[key]):
            if key in cfg.contexts:
                raise ConfigError(f"{cfg.where(full)} is given twice; keep one")
            cfg.contexts[key] = _contexts(cfg, full, sv)
            continue
        if name not in CLOUD_KEYS:
            raise ConfigError(f"config file {str(cfg.path)!r}, line {cfg.lines[full]}: unknown key {full!r}"
                              f"{did_you_mean(name, CLOUD_KEYS)}; allowed in a cloud's section: "
                              f"{', '.join(CLOUD_KEYS)}")
        if name in section:
            raise ConfigError(f"{cfg.where(full)} is given twice; keep one")
        if clouds is not None and name not in clouds[key] and name in _cloud_only(clouds):
            raise ConfigError(f"{cfg.where(full)}: {key} does not take --{name.replace('_', '-')}; remove it")
        section[name] = _text(cfg, full, sv)
    return section


def _contexts(cfg: UserConfig, key: str, node: Node) -> dict[str, dict[str, str]]:
    """`contexts:`: kubeconfig context -> its settings (CONTEXT_KEYS), each checked here."""
    yaml = _yaml()
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{cfg.where(key)}: a mapping of kubeconfig context names to their settings "
                          f"({', '.join(CONTEXT_KEYS)}), e.g. contexts: {{lab: {{price_per_gpu_hour: 2.50}}}}")
    out: dict[str, dict[str, str]] = {}
    for cnode, snode in node.value:
        context = str(cnode.value)
        where = f"{key}.{context}"
        cfg.lines[where] = cnode.start_mark.line + 1
        if context in out:
            raise ConfigError(f"{cfg.where(where)} is given twice; keep one")
        if not isinstance(snode, yaml.MappingNode):
            raise ConfigError(f"{cfg.where(where)}: a mapping of settings ({', '.join(CONTEXT_KEYS)})")
        settings: dict[str, str] = {}
        for sk, sv in snode.value:
            name, full = str(sk.value), f"{where}.{sk.value}"
            cfg.lines[full] = sk.start_mark.line + 1
            if name not in CONTEXT_KEYS:
                raise ConfigError(f"{cfg.where(full)}: unknown key{did_you_mean(name, CONTEXT_KEYS)}; allowed in "
                                  f"a context's settings: {', '.join(CONTEXT_KEYS)}")
            if name in settings:
                raise ConfigError(f"{cfg.where(full)} is given twice; keep one")
            settings[name] = _price(cfg, full, sv)
        out[context] = settings
    return out


def _price(cfg: UserConfig, key: str, node: Node) -> str:
    """Dollars per GPU-hour, 0 to MAX_PRICE_PER_GPU_HOUR."""
    yaml = _yaml()
    value = yaml.SafeLoader("").construct_object(node) if isinstance(node, yaml.ScalarNode) else None
    try:
        price = Decimal(str(value)) if isinstance(value, (str, int, float)) and not isinstance(value, bool) \
            else Decimal(-1)
    except InvalidOperation:
        price = Decimal(-1)
    if not price.is_finite() or price < 0 or price > MAX_PRICE_PER_GPU_HOUR:
        raise ConfigError(f"{cfg.where(key)}: {value!r} is not allowed: dollars per GPU-hour, 0 to "
                          f"{MAX_PRICE_PER_GPU_HOUR}, e.g. 2.50")
    return str(price)


def state_backend() -> str | None:
    """The Pulumi state backend the user chose outside the command line: $GPUCLUSTER_STATE, else the
    config file's `state`; None when neither sets one. (A `--state` flag, where a command has one,
    wins over both.)"""
    env = os.environ.get("GPUCLUSTER_STATE")
    if env:
        return env
    return load_config().top.get("state")


def notify_urls() -> list[str]:
    """The config file's `notify:` webhooks (added to `--notify` and the API's `notify=`)."""
    return list(load_config().notify)


def env_layer() -> dict[str, tuple[str, str]]:
    """The environment's settings: setting -> (value, the variable it came from)."""
    return {setting: (os.environ[var], var) for var, setting in ENV_VARS.items() if os.environ.get(var)}


def _placed(value: str) -> bool:
    """`auto` or a list (`aws,gcp`): placement's, checked item by item by the command (docs/placement.md)."""
    from gpucluster.plan.placement import wanted

    return wanted(value, None)


def _cloud_only(clouds: Mapping[str, tuple[str, ...]]) -> set[str]:
    return {flag for flags in clouds.values() for flag in flags}


def _yaml() -> ModuleType:  # PyYAML, imported when a file is read
    from gpucluster.errors import require

    return require("yaml", "local")


def _text(cfg: UserConfig, key: str, node: Node) -> str:
    yaml = _yaml()
    value = yaml.SafeLoader("").construct_object(node) if isinstance(node, yaml.ScalarNode) else None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not str(value).strip():
        raise ConfigError(f"{cfg.where(key)}: a string is needed here")
    return str(value)
