"""The backend registry: the one place that maps a `--cloud` name to its package.

Adding a backend is one line here, one package under `infra/` (see `infra.contract` and
docs/backends.md) and, when its runs are priced, its rows in the price catalog. Packages are
imported on first use, and import no SDK themselves, so listing names costs nothing."""

from __future__ import annotations

import importlib
from typing import Any

from gpucluster.errors import UsageError, not_allowed

PACKAGES = {
    "local": "gpucluster.infra.local",
    "ssh": "gpucluster.infra.ssh",
    "aws": "gpucluster.infra.aws",
    "gcp": "gpucluster.infra.gcp",
}

NAMES = tuple(PACKAGES)


def backend(name: str) -> Any:
    """The registered backend called `name` (a `infra.contract.Backend`), or a UsageError."""
    package = PACKAGES.get(name) if isinstance(name, str) else None
    if package is None:
        raise UsageError(not_allowed("cloud", name, NAMES))
    return importlib.import_module(package).BACKEND


def all_backends() -> list[Any]:
    return [backend(n) for n in NAMES]


def provisioning() -> tuple[str, ...]:
    """Names of the backends that create cloud resources (have stacks, tag scans, `up`, `gc`)."""
    return tuple(b.name for b in all_backends() if b.provisions)


def priced() -> tuple[str, ...]:
    return tuple(b.name for b in all_backends() if b.priced)


def accepting(flag: str) -> tuple[str, ...]:
    """Names of the backends that accept the cloud-only option `flag` (e.g. "project")."""
    return tuple(b.name for b in all_backends() if flag in b.flags)


def project_id(text: str) -> str:
    """A `--project` value checked for form by the backend that has projects (`down`, `cost report`)."""
    owners = accepting("project")
    if not owners:
        raise UsageError(f"--project {text} is not allowed: no backend has projects")
    return backend(owners[0]).parse_project(text)


def get_backend(cloud: str, **options: Any) -> tuple[Any, Any]:
    """(provider, launcher) for a cloud. Options: identity, known_hosts, remote_python (ssh and
    aws), ready_timeout (aws), start_deadline_s and spec_options (gcp)."""
    return backend(cloud).make(**options)
