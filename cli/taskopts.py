"""Task files and the user config, fed to `run`, `up`, `sweep` and `cost estimate` as Click
defaults (`ctx.default_map`), so the one set of options (`cli.options`) and the one prepare step
(`gpucluster.lifecycle.prepare`) serve flags and files alike. See docs/tasks.md.

Precedence, for every setting: a flag > the task file > the environment (GPUCLUSTER_CLOUD, ...) >
the user config file > the built-in default. `env`, `env_file` and `secrets` of the file and the
flags add up (a flag's value wins for the same name); any other list given as a flag replaces the
file's. With a task file the command runs from its `workdir` (default: the task file's folder):
the file's relative paths and its command are relative to it; relative paths typed as flags stay
relative to where you are (they are made absolute first).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import click

from gpucluster.errors import ConfigError, GpuclusterError, UsageError, not_allowed
from gpucluster.plan.placement import wanted

if TYPE_CHECKING:
    from gpucluster.infra.contract import Plugin
    from gpucluster.plan.taskfile import TaskFile
    from gpucluster.plan.userconfig import UserConfig

META = "gpucluster.taskopts"
TASK_SUFFIXES = (".yaml", ".yml")
MERGED = ("env", "env_file", "secret")  # file + flags add up
# flags holding local paths: typed relative to the shell's folder, made absolute before the workdir is entered
PATH_PARAMS = ("identity", "known_hosts", "env_file", "report_dir", "output", "python", "data", "stack")


@dataclass
class Found:
    """What `TaskCommand.parse_args` found, for `invoke`."""

    task: TaskFile | None = None
    merged: dict[str, list[str]] = field(default_factory=dict)  # MERGED param -> the file's values


class TaskCommand(click.Command):
    """A command that takes a task file (`-f FILE`, or FILE as its first argument) and the user
    config: both become the context's `default_map` before Click reads the flags."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        args = list(args)
        if not any(a in ("-h", "--help") for a in _before_dashes(args)):
            args, path = _task_path(self, ctx, args)
            found = Found()
            ctx.default_map = {**(ctx.default_map or {}), **_defaults(self, ctx, args, path, found)}
            ctx.meta[META] = found
        return super().parse_args(ctx, args)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The options under headings (`cli.options.SECTIONS`), each section in the command's own order."""
        from gpucluster.cli.options import SECTIONS

        heading_of = {name: heading for heading, names in SECTIONS for name in names}
        rows: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
            if record is not None:
                name = "help" if "--help" in param.opts else param.name or ""
                rows.setdefault(heading_of.get(name, "Options"), []).append(record)
        for heading in ["Task file", "Options", *(h for h, _ in SECTIONS[1:])]:
            if rows.get(heading):
                with formatter.section(heading):
                    formatter.write_dl(rows[heading])

    def invoke(self, ctx: click.Context) -> object:
        found: Found | None = ctx.meta.get(META)
        if found is None:
            return super().invoke(ctx)
        from click.core import ParameterSource

        for name, values in found.merged.items():
            if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE:
                ctx.params[name] = tuple(values) + tuple(ctx.params.get(name) or ())
        task = found.task
        if task is None or task.workdir == Path.cwd().resolve():
            return _located(super().invoke, ctx, task)
        _absolute_flags(ctx)
        with _cwd(task.workdir):
            return _located(super().invoke, ctx, task)


# -- finding the task file ----------------------------------------------------------------------
def _before_dashes(args: list[str]) -> list[str]:
    return args[:args.index("--")] if "--" in args else args


def _task_path(cmd: click.Command, ctx: click.Context, args: list[str]) -> tuple[list[str], str | None]:
    """(args without a positional task file, the task file's path or None)."""
    try:
        opts, largs, _ = cmd.make_parser(ctx).parse_args(args=list(args))
    except click.UsageError:
        return args, None  # the real parse says it
    given = opts.get("task_file")
    rest = opts.get("command")
    if isinstance(rest, (tuple, list)):  # `run`, `sweep`: the first argument ends the options
        rest, i = list(rest), len(args) - len(rest)
        if rest and not (0 <= i < len(args) and args[i] == rest[0]):  # `exec CLUSTER FILE --env ...`: options after it
            before = _before_dashes(args)
            i = before.index(rest[0]) if rest[0] in before else -1
    else:  # no arguments of its own (`up`, `cost estimate`): the file may stand among the options
        rest = list(largs)
        i = _before_dashes(args).index(rest[0]) if rest and rest[0] in _before_dashes(args) else -1
    if rest and str(rest[0]).endswith(TASK_SUFFIXES):
        if 0 <= i < len(args) and args[i] == rest[0] and (i == 0 or args[i - 1] != "--"):
            if given:
                raise UsageError(f"give the task file once: -f {given} or {rest[0]}, not both")
            return args[:i] + args[i + 1:], str(rest[0])
    return args, given if isinstance(given, str) else None


# -- the layers -----------------------------------------------------------------------------------
def _defaults(cmd: click.Command, ctx: click.Context, args: list[str], path: str | None, found: Found) -> dict:
    from gpucluster.infra.registry import NAMES, traits
    from gpucluster.plan.userconfig import env_layer, load_config

    params = {p.name: p for p in cmd.params if p.name}
    flags = {name: traits(name).flags for name in NAMES}
    cloud_only = {f for fl in flags.values() for f in fl}
    config = load_config(clouds=flags)
    env = env_layer()
    task = None
    if path is not None:
        from gpucluster.plan import taskfile

        task = found.task = taskfile.load(path)
    cloud = _cloud(cmd, ctx, args, task, env, config, NAMES)

    def applies(name: str) -> bool:
        return name in params and (name not in cloud_only or (cloud is not None and name in flags.get(cloud, ())))

    out: dict[str, Any] = {}
    for name in ("cloud", "state"):  # "state": a command with a --state flag (the Pulumi state backend)
        if name in params and config.top.get(name):
            out[name] = config.top[name]
    for name, value in config.clouds.get(cloud or "", {}).items():
        if name in params:
            out[name] = value
    for name, (value, _var) in env.items():
        if applies(name) or (name in ("cloud", "state") and name in params):
            out[name] = value
    if task is not None:
        out.update(_task_values(cmd, ctx, params, task, cloud, flags, cloud_only, found))
    return out


def _cloud(cmd: click.Command, ctx: click.Context, args: list[str], task: TaskFile | None,
           env: dict[str, tuple[str, str]], config: UserConfig,
           names: tuple[str, ...]) -> str | None:
    """The cloud the command will use: the flag, else the file's, the environment's, the config's,
    the built-in default; each checked here, naming where it came from."""
    try:
        opts, _, _ = cmd.make_parser(ctx).parse_args(args=list(args))
    except click.UsageError:
        opts = {}
    if isinstance(opts.get("cloud"), str):
        return opts["cloud"]
    known = getattr(cmd, "known_cloud", None)  # `exec CLUSTER`: the cloud is the kept cluster's
    if known is not None:
        return known(ctx, opts)
    if task is not None and "cloud" in task.values:
        if task.values["cloud"] not in names and not wanted(task.values["cloud"], None):  # auto, a list: placement
            raise task.error("cloud", not_allowed("cloud", task.values["cloud"], names))
        return task.values["cloud"]
    if "cloud" in env:
        value, var = env["cloud"]
        if value not in names and not wanted(value, None):
            raise ConfigError(not_allowed(f"{var}", value, names))
        return value
    if config.top.get("cloud"):
        return config.top["cloud"]
    default = next((p.default for p in cmd.params if p.name == "cloud"), None)
    return default if isinstance(default, str) else None


def _task_values(cmd: click.Command, ctx: click.Context, params: dict, task: TaskFile, cloud: str | None,
                 flags: dict, cloud_only: set, found: Found) -> dict[str, Any]:
    from gpucluster.plan.taskfile import BY_PARAM

    out: dict[str, Any] = {}
    if "command" in task.values and "workload" in task.values:
        raise task.error("workload", f"run and workload: give one (run is on line {task.where['command'].line})")
    for name, value in task.values.items():
        if name not in params:
            continue  # a key this command does not use (`up` has no job): the file serves them all
        if name in cloud_only and (cloud is None or name not in flags.get(cloud, ())):
            users = [c for c, fl in flags.items() if name in fl]
            raise task.error(name, f"not used with cloud {cloud} (only with {' or '.join(users)}): remove it, "
                                   "or set resources.cloud")
        param = params[name]
        if name in MERGED:
            found.merged[name] = list(value)
        with _cwd(task.workdir):
            _check(ctx, task, param, value, cloud)
        out[name] = value
    if "hours" in params and ("max_minutes" in task.values or "max_lifetime" in task.values):
        minutes = task.values.get("max_minutes") or task.values.get("max_lifetime")
        if minutes is not None:  # `max_minutes: 0` (or null) without a lifetime: no limit to estimate for
            out["hours"] = f"{float(minutes) / 60:g}"  # cost estimate: the run's limit, as `run` estimates it
    return out


def _check(ctx: click.Context, task: TaskFile, param: click.Parameter, value: object, cloud: str | None) -> None:
    """The value as the flag would take it (Click's type: ranges), then the core's own check."""
    items = value if isinstance(value, list) and getattr(param, "multiple", False) else [value]
    try:
        if param.type is not None and not isinstance(param, click.Argument):
            for item in items:
                param.type.convert(item, param, ctx)
        check = _CHECKS.get(param.name or "")
        if check is not None:
            check(value, cloud)
    except (GpuclusterError, click.BadParameter) as exc:
        message = exc.message if isinstance(exc, GpuclusterError) else exc.format_message()
        raise task.error(param.name, message) from None


def _check_nodes(value: Any, cloud: str | None) -> None:
    from gpucluster.infra.registry import NAMES, traits
    from gpucluster.spec import parse_int

    if cloud in NAMES and not isinstance(value, str):
        parse_int("nodes", value, low=1, high=traits(cloud).max_nodes)


def _plugin(cloud: str | None) -> Plugin | None:
    from gpucluster.infra.registry import NAMES, plugin

    return plugin(cloud) if cloud in NAMES else None


def _check_data(value: Any, cloud: str | None) -> None:
    from gpucluster.infra.registry import readers
    from gpucluster.watch.staging import parse_data

    parse_data(value, _plugin(cloud), readers())


def _check_output(value: Any, cloud: str | None) -> None:
    from gpucluster.infra.registry import readers
    from gpucluster.watch.outputs import check_output_dest

    check_output_dest(value, _plugin(cloud), readers())


def _check_hosts(value: Any, cloud: str | None) -> None:
    """A task file's `hosts:` checked as `--hosts` is (`prepare.given_hosts`: the backend's own `validate`)."""
    from gpucluster.lifecycle.prepare import given_hosts

    backend = _plugin(cloud)
    if backend is not None:
        given_hosts(None if value is None else str(value), backend)


def _check_limit(value: Any, cloud: str | None) -> None:
    from gpucluster.plan.jobargs import parse_size

    parse_size("--collect-limit", value)


def _check_workload(value: Any, cloud: str | None) -> None:
    from gpucluster.lifecycle.prepare import WORKLOADS

    if value not in WORKLOADS:
        raise UsageError(not_allowed("workload", value, WORKLOADS))


def _check_fallback(value: Any, cloud: str | None) -> None:
    from gpucluster.lifecycle.recovery import FALLBACKS

    if value not in FALLBACKS:
        raise UsageError(not_allowed("--fallback", value, FALLBACKS))


def _check_env(value: Any, cloud: str | None) -> None:
    from gpucluster.plan.jobenv import parse_env

    parse_env(value)


def _check_env_files(value: Any, cloud: str | None) -> None:
    from gpucluster.plan.jobenv import read_env_file

    for path in value:
        read_env_file(path)


def _check_secrets(value: Any, cloud: str | None) -> None:
    from gpucluster.plan.jobenv import parse_secrets

    parse_secrets(value)


def _check_command(value: Any, cloud: str | None) -> None:
    from gpucluster.lifecycle.prepare import check_command

    check_command(tuple(value))


def _check_ssh_file(flag: str) -> Callable[[Any, str | None], None]:
    def check(value: Any, cloud: str | None) -> None:
        from gpucluster.lifecycle.prepare import check_ssh_files

        check_ssh_files(*((value, None) if flag == "identity" else (None, value)))

    return check


def _simple(fn_path: str) -> Callable[[Any, str | None], None]:
    def check(value: Any, cloud: str | None) -> None:
        import importlib

        module, _, attr = fn_path.partition(":")
        getattr(importlib.import_module(module), attr)(value)

    return check


_CHECKS: dict[str, Callable[[Any, str | None], None]] = {
    "nodes": _check_nodes,
    "workload": _check_workload,
    "data": _check_data,
    "output": _check_output,
    "hosts": _check_hosts,
    "setup": _simple("gpucluster.watch.staging:parse_setup"),
    "tags": _simple("gpucluster.lifecycle.prepare:parse_tags"),
    "options": _simple("gpucluster.lifecycle.prepare:parse_options"),
    "collect_limit": _check_limit,
    "env": _check_env,
    "env_file": _check_env_files,
    "secret": _check_secrets,
    "command": _check_command,
    "fallback": _check_fallback,
    "identity": _check_ssh_file("identity"),
    "known_hosts": _check_ssh_file("known_hosts"),
}


# -- running from the workdir ----------------------------------------------------------------------
@contextlib.contextmanager
def _cwd(folder: Path) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def _absolute_flags(ctx: click.Context) -> None:
    """Paths typed as flags, made absolute before the task's workdir is entered (and $GPUCLUSTER_HOME)."""
    from click.core import ParameterSource

    home = os.environ.get("GPUCLUSTER_HOME")
    if home and not os.path.isabs(os.path.expanduser(home)):
        os.environ["GPUCLUSTER_HOME"] = os.path.abspath(os.path.expanduser(home))
    for name in PATH_PARAMS:
        if name not in ctx.params or ctx.get_parameter_source(name) != ParameterSource.COMMANDLINE:
            continue
        value = ctx.params[name]
        if isinstance(value, (tuple, list)):
            ctx.params[name] = type(value)(_absolute(name, v) for v in value)
        elif isinstance(value, str):
            ctx.params[name] = _absolute(name, value)


def _absolute(name: str, value: str) -> str:
    if "://" in value or (name == "python" and os.sep not in value):
        return value  # a URL; a Python found on PATH
    if name == "stack" and not value.endswith(TASK_SUFFIXES):
        return value  # a stack's name
    src, sep, dest = value.partition(":") if name == "data" else (value, "", "")
    full = os.path.expanduser(src)
    return (full if os.path.isabs(full) else os.path.abspath(full)) + sep + dest


def _located(call: Callable[[click.Context], object], ctx: click.Context, task: TaskFile | None) -> object:
    """`call(ctx)`; a bad-input error about a value that came from the task file names its key and line."""
    try:
        return call(ctx)
    except UsageError as exc:
        if task is None or "task file" in exc.message:
            raise
        from click.core import ParameterSource
        from gpucluster.plan.taskfile import KEYS, BY_PARAM

        for name, where in task.where.items():
            if ctx.get_parameter_source(name) != ParameterSource.DEFAULT_MAP:
                continue
            flag = KEYS[BY_PARAM[name]].flag
            if exc.message.startswith((flag + " ", f"{flag.lstrip('-')} ")) or f" {flag} " in f" {exc.message} ":
                raise type(exc)(f"task file {str(task.path)!r}, {where}: {exc.message}", hint=exc.hint) from None
        raise
