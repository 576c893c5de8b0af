"""The flags a cloud would ignore, refused by name (`run`, `up`). Turning the flags into a checked
`ClusterSpec` and job is the core's prepare step (`gpucluster.lifecycle.prepare`)."""

from __future__ import annotations

import click

from gpucluster.errors import UsageError
from gpucluster.infra.registry import NAMES as CLOUDS


def cloud_only_flags() -> dict[str, tuple[str, ...]]:
    """Flags that only some clouds use (Click parameter name -> the backends listing it, in the
    registry's order): elsewhere they would be silently ignored, so they are refused."""
    from gpucluster.infra.registry import NAMES, traits

    users: dict[str, tuple[str, ...]] = {}
    for name in NAMES:
        for param in traits(name).flags:
            users[param] = users.get(param, ()) + (name,)
    return users


_PLACES = ("project", "region", "zone", "instance_type")  # where a cluster goes: '' would fall back to a default


def check_cloud_flags(cloud: str, ctx: click.Context | None = None) -> None:
    """Refuse (exit 2) a flag the chosen cloud would silently ignore, naming it."""
    from click.core import ParameterSource

    ctx = ctx or click.get_current_context()
    given: dict[str, tuple[tuple[str, ...], object]] = {}
    for param in ctx.command.params:
        if not param.name or (param.name not in ctx.params and param.expose_value):
            continue  # (--state is read by its callback, not passed on: expose_value False)
        source = ctx.get_parameter_source(param.name)
        if source is None or source == ParameterSource.DEFAULT:
            if not (param.name in _PLACES and ctx.params.get(param.name) == ""):
                continue
        given[param.name] = (tuple(param.opts), ctx.params.get(param.name))
    refuse_flags(cloud, given)


def refuse_flags(cloud: str, given: dict[str, tuple[tuple[str, ...], object]]) -> None:
    """The check of `check_cloud_flags` on the settings given (name -> (its flags, value)): also the
    Python API's (gpucluster.api), so both refuse the same settings with the same words."""
    from gpucluster.infra.registry import traits

    if cloud not in CLOUDS:
        return
    mine = traits(cloud)
    users = cloud_only_flags()
    for name, (opts, value) in given.items():
        if name in _PLACES and value == "":  # `--project ''`: never the default
            raise UsageError(f"{'/'.join(opts)} '' is not allowed: give a value, or leave the flag out")
        clouds = users.get(name)
        if not clouds or name in mine.flags:
            continue
        kept = (f"; to keep these machines for `exec`: gpucluster up --cloud {cloud} ... --name NAME"
                if name == "keep" and _holds(cloud) else "")  # a kept cluster of machines that exist
        raise UsageError(f"{'/'.join(opts)} does not apply to --cloud {cloud} ({mine.flags_refused_why}); "
                         f"it is used with --cloud {' or '.join(clouds)} only: remove it{kept}")


def _holds(cloud: str) -> bool:
    """`up` keeps this backend's machines that exist under a name (`Operations.hold`)."""
    from gpucluster.infra.registry import plugin

    return plugin(cloud).ops.hold is not None


# flags that a backend keeps among its spec's options (`--context X` is `--option context=X`), so the
# ledger records them with the run and `down` finds the run's objects again
OPTION_FLAGS = {"context": "context", "namespace": "namespace", "create_namespace": "createNamespace"}


def fold_option_flags(flags: dict) -> tuple[str, ...]:
    """`flags` without the option flags (popped), and its `options` with them added as K=V."""
    added = []
    for flag, key in OPTION_FLAGS.items():
        value = flags.pop(flag, None)
        if value not in (None, False, ""):
            added.append(f"{key}={'true' if value is True else value}")
    return tuple(flags.get("options") or ()) + tuple(added)
