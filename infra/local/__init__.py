"""The `local` backend: N "nodes" are N torchrun agents on this machine; nothing is provisioned.

Contract: `gpucluster.infra.contract`. Modules: catalog (GPU count, spec checks), provider
(`LocalProvider`: the run's processes are its leftovers), launch (`LocalLauncher`)."""

from __future__ import annotations

from typing import Any

from gpucluster.infra.contract import Backend


class LocalBackend(Backend):
    name = "local"
    # Local "nodes" are processes on this machine: beyond 16 they only measure contention.
    max_nodes = 16
    resource_kinds = ("process",)

    def validate_spec(self, spec: Any) -> list[str]:
        from .catalog import validate_spec

        return validate_spec(spec)

    def make(self, **options: Any) -> tuple[Any, Any]:
        from .launch import LocalLauncher
        from .provider import LocalProvider

        return LocalProvider(), LocalLauncher()


BACKEND = LocalBackend()
