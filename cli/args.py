"""Turning the flags of `run`, `up` and `sweep` into a checked `ClusterSpec` and job: tags,
options, workload arguments, the command after --, key files, and the flags a cloud would ignore."""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import sys

import click

from gpucluster.errors import SpecError, UsageError, not_allowed
from gpucluster.infra.registry import NAMES as CLOUDS
from gpucluster.spec import ClusterSpec, parse_int

WORKLOADS = ("digits", "mnist", "synthetic")


def parse_tags(values: tuple[str, ...]) -> dict[str, str]:
    from gpucluster.spec import is_reserved_tag, reserved_tag_error

    tags = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(not_allowed("tag", item, "KEY=VALUE"))
        if is_reserved_tag(key):
            raise UsageError(reserved_tag_error(key.strip(), "--tag key"))
        tags[key.strip()] = value.strip()
    return tags


def cloud_only_flags() -> dict[str, tuple[str, ...]]:
    """Flags that only some clouds use (Click parameter name -> the backends listing it, in the
    registry's order): elsewhere they would be silently ignored, so they are refused."""
    from gpucluster.infra.registry import NAMES, traits

    users: dict[str, tuple[str, ...]] = {}
    for name in NAMES:
        for param in traits(name).flags:
            users[param] = users.get(param, ()) + (name,)
    return users


def check_cloud_flags(cloud: str, ctx: click.Context | None = None) -> None:
    """Refuse (exit 2) a flag the chosen cloud would silently ignore, naming it."""
    from click.core import ParameterSource

    from gpucluster.infra.registry import traits

    if cloud not in CLOUDS:
        return
    ctx = ctx or click.get_current_context()
    mine = traits(cloud)
    users = cloud_only_flags()
    for param in ctx.command.params:
        clouds = users.get(param.name or "")
        if not clouds or param.name in mine.flags or param.name not in ctx.params:
            continue
        source = ctx.get_parameter_source(param.name)
        if source is None or source == ParameterSource.DEFAULT:
            continue
        flag = "/".join(param.opts)
        raise UsageError(f"{flag} does not apply to --cloud {cloud} ({mine.flags_refused_why}); "
                         f"it is used with --cloud {' or '.join(clouds)} only: remove it")


def workload_argv(workload: str | None, workload_args: str, epochs: str | None,
                  command: tuple[str, ...] = ()) -> list[str]:
    """--workload-args split like a shell would, checked against the workload's own parser."""
    if command and (workload_args or epochs is not None):
        flag = "--workload-args" if workload_args else "--epochs"
        raise UsageError(f"{flag} is for built-in workloads (--workload); with a command after --, put the "
                         "arguments after the command")
    try:
        wl_args = shlex.split(workload_args) if workload_args else []
    except ValueError as exc:
        raise UsageError(f"--workload-args {workload_args!r} cannot be split into arguments ({exc}); "
                         "check the quotes") from None
    if epochs is not None:
        wl_args = ["--epochs", str(parse_int("epochs", epochs, low=1, high=100000))] + wl_args
    if workload and wl_args:
        from gpucluster.workloads.args import check_args

        problem = check_args(workload, wl_args)
        if problem:
            raise UsageError(f"--workload-args {workload_args!r} is refused by the {workload} workload: {problem} "
                             f"(see: python -m gpucluster.workloads.{workload} --help)")
    return wl_args


def check_ssh_files(identity: str | None, known_hosts: str | None) -> None:
    """Key and known_hosts files must exist before anything is recorded or started."""
    for flag, value, what in (("--identity", identity, "an ssh private key file"),
                              ("--known-hosts", known_hosts, "an OpenSSH known_hosts file")):
        if value is None:
            continue
        path = os.path.expanduser(value)
        if not os.path.isfile(path):
            state = "is a directory" if os.path.isdir(path) else "does not exist"
            raise UsageError(f"{flag} {value!r} {state}; give {what}")
        if not os.access(path, os.R_OK):
            raise UsageError(f"{flag} {value!r} cannot be read; give {what} you can read")


def parse_options(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Repeatable `--option KEY=VALUE` -> spec options; the cloud's `validate_spec` checks the
    keys and values against the same schema as the stack file's `gpucluster:` options."""
    opts: dict[str, str] = {}
    for item in values or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(not_allowed("option", item, "KEY=VALUE, e.g. --option efa=true"))
        opts[key.strip()] = value.strip()
    return tuple(sorted(opts.items()))


def resolve_spec(spec: ClusterSpec, *, dry_run: bool = False) -> tuple[ClusterSpec, list[str]]:
    """The backend's pre-plan resolution (`SpecRules.prepare`) (aws: SSH CIDR from this machine's public IPv4, GPUs
    per node from the type), re-validated. In a dry run a failed detection is a note, not an
    error: nothing is created."""
    from gpucluster.infra.registry import plugin
    from gpucluster.spec import validate

    chosen = plugin(spec.cloud)
    resolve = chosen.spec.prepare
    try:
        spec, notes = resolve(spec)
    except SpecError as exc:
        if not dry_run:
            raise
        spec, notes = resolve(spec, detect=None)
        notes.append(f"{exc.message} (a real run stops here with exit code 2; this preview has no SSH rule)")
    return spec, [*validate(spec, chosen), *notes]


def check_command(command: tuple[str, ...]) -> None:
    """A `--` command must exist before anything starts: script file, module or executable."""
    from gpucluster.launch import JobSpec, program_args

    prog = program_args(JobSpec(run_id="check", command=command))
    if prog[0] == "--no-python":
        exe = prog[1]
        if not (shutil.which(exe) or (os.sep in exe and os.access(exe, os.X_OK))):
            raise UsageError(not_allowed("command", exe, "an executable on PATH, or python SCRIPT.py / python -m MODULE"))
    elif prog[0] == "-m":
        sys.path.insert(0, os.getcwd())
        try:
            found = importlib.util.find_spec(prog[1]) is not None
        except (ImportError, ValueError):
            found = False
        finally:
            sys.path.pop(0)
        if not found:
            raise UsageError(not_allowed("python module", prog[1], "a module importable from the current directory"))
    elif not os.path.isfile(prog[0]):
        raise UsageError(not_allowed("script", prog[0], "a Python file that exists (path relative to the current directory)"))


def build_spec(cloud, nodes, gpus_per_node, name, region, zone, instance_type, spot, disk_gb, max_lifetime,
               ssh_cidr, tags, hosts, run_id, options: tuple[str, ...] = ()) -> ClusterSpec:
    if cloud not in CLOUDS:
        raise SpecError(not_allowed("cloud", cloud, CLOUDS))
    from gpucluster.infra.registry import traits

    n = parse_int("nodes", nodes, low=1, high=traits(cloud).max_nodes)
    g = None if gpus_per_node is None else parse_int("gpus per node", gpus_per_node, low=0, high=16)
    return ClusterSpec(
        cloud=cloud, nodes=n, name=name or f"gpucluster-{cloud}", region=region, zone=zone,
        instance_type=instance_type, gpus_per_node=g, spot=spot,
        disk_gb=parse_int("disk size (GB)", disk_gb, low=10, high=16384),
        max_lifetime_minutes=parse_int("max lifetime (minutes)", max_lifetime, low=5, high=7 * 24 * 60),
        ssh_cidr=ssh_cidr, tags=tuple(sorted(parse_tags(tags).items())), hosts=tuple(hosts), run_id=run_id,
        options=parse_options(options),
    )
