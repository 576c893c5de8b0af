"""The `ssh` backend: a list of existing hosts (head first) reached with OpenSSH; nothing is
provisioned. The launcher is also the one EC2 nodes are reached with (`infra.aws`).

Contract: `gpucluster.infra.contract`. Modules: provider (`SshProvider`, host list checks),
launch (`SshLauncher`: ships the job, runs one torchrun agent per host), session (the
connections), remote (programs run on the nodes), ship (the bundle), cleanup (leftover processes)."""

from __future__ import annotations

from typing import Any

from gpucluster.infra.contract import Backend


class SshBackend(Backend):
    name = "ssh"
    max_nodes = 64
    resource_kinds = ("process",)

    def validate_spec(self, spec: Any) -> list[str]:
        from .provider import validate_spec

        return validate_spec(spec)

    def make(self, **options: Any) -> tuple[Any, Any]:
        from .launch import SshLauncher
        from .provider import SshProvider

        kw = {k: options[k] for k in ("identity", "known_hosts") if options.get(k)}
        if options.get("remote_python"):
            kw["python"] = options["remote_python"]
        launcher = SshLauncher(**kw)
        # The provider asks only the nodes where this launcher started the run for leftovers.
        return SshProvider(launcher=launcher), launcher


BACKEND = SshBackend()
