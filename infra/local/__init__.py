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

        return LocalProvider(), LocalLauncher(python=options.get("python"))

    # -- CLI and run lifecycle (h-cli) -----------------------------------------------------------
    flags = ("data", "setup", "resume", "python")  # gcp: not supported yet
    flags_refused_why = "local runs use this machine as it is"
    verified_how = "by run id"
    verified_detail = "every process of the run gone"

    def known_gpus(self) -> int | None:
        from .catalog import gpus_present

        return gpus_present()

    def check_down(self, provider: Any, name: str, runs: dict[str, dict[str, Any]]) -> Any:
        """A crashed run's stray processes are killed first; then each run's processes are looked for."""
        from gpucluster.domain import Check
        from gpucluster.procs import kill_run_processes

        for rid in runs:
            kill_run_processes(rid)
        check = Check()
        for rid in sorted(runs):
            check = check + Check.of(provider.leftovers(name, rid))
        return check


BACKEND = LocalBackend()
