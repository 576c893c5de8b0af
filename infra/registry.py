"""The backend registry: the one place that maps a `--cloud` name to its package.

Consulted only at the composition roots (once per command in `cli/`, once in the Pulumi program
`infra/program.py`); everything below receives the plugin or its parts as arguments, and no core
module (`gpucluster/*`) imports this one (tests/test_layout.py). Adding a backend is one line
here, one package under `infra/` (see `infra.contract` and docs/backends.md) and, when its runs
are priced, its rows in the price catalog. `traits()` imports only a package's `__init__` (plain
values, no SDK), so listing names and capabilities costs nothing; `plugin()` loads its parts."""

from __future__ import annotations

import importlib

from gpucluster.errors import UsageError, not_allowed
from gpucluster.infra.contract import Capability, Plugin, Traits

PACKAGES = {
    "local": "gpucluster.infra.local",
    "ssh": "gpucluster.infra.ssh",
    "aws": "gpucluster.infra.aws",
    "gcp": "gpucluster.infra.gcp",
    "kubernetes": "gpucluster.infra.kube",
}

NAMES = tuple(PACKAGES)


def _package(name: str) -> str:
    package = PACKAGES.get(name) if isinstance(name, str) else None
    if package is None:
        raise UsageError(not_allowed("cloud", name, tuple(PACKAGES)))
    return package


def traits(name: str) -> Traits:
    """The plain facts of the backend called `name` (its package's `TRAITS`), or a UsageError."""
    traits_: Traits = importlib.import_module(_package(name)).TRAITS
    return traits_


def plugin(name: str) -> Plugin:
    """The backend called `name` (its package's `plugin.PLUGIN`), or a UsageError."""
    plugin_: Plugin = importlib.import_module(_package(name) + ".plugin").PLUGIN
    return plugin_


def plugins() -> dict[str, Plugin]:
    """Every registered backend by name (for commands that read records of any cloud)."""
    return {n: plugin(n) for n in PACKAGES}


def having(capability: Capability) -> tuple[str, ...]:
    """Names of the backends with `capability`, in the registry's order."""
    return tuple(n for n in PACKAGES if traits(n).can(capability))


def provisioning() -> tuple[str, ...]:
    """Names of the backends that create cloud resources (have stacks, tag scans, `up`, `gc`)."""
    return having(Capability.PROVISIONS)


def priced() -> tuple[str, ...]:
    return having(Capability.PRICED)


def readers() -> dict[str, tuple[str, ...]]:
    """URL scheme -> names of the backends whose nodes read it ("s3" -> ("aws",)), in the registry's
    order: what the core names when it refuses a `--data`/`--output`/`--resume` URL (`staging.Readers`)."""
    out: dict[str, tuple[str, ...]] = {}
    for n in having(Capability.OBJECT_STORE):  # only these load their plugin (`Plugin.object_store`)
        scheme = plugin(n).object_store
        if scheme:
            out[scheme] = out.get(scheme, ()) + (n,)
    return out


def accepting(flag: str) -> tuple[str, ...]:
    """Names of the backends that accept the cloud-only option `flag` (e.g. "project")."""
    return tuple(n for n in PACKAGES if flag in traits(n).flags)


def project_id(text: str) -> str:
    """A `--project` value checked for form by the backend that has projects (`down`, `cost report`)."""
    from gpucluster.lifecycle.prepare import checked_project

    names = accepting("project")
    if names:
        return checked_project(plugin(names[0]), text)
    raise UsageError(f"--project {text} is not allowed: no backend has projects")
