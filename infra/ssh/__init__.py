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

    # -- CLI and run lifecycle (h-cli) -----------------------------------------------------------
    flags = ("hosts", "identity", "known_hosts",  # aws: the cluster's own key and pinned host keys
             "remote_python", "data", "setup", "resume")
    flags_refused_why = "the ssh backend uses machines that already exist"
    verified_how = "by run id"
    verified_detail = "every process of the run gone"

    def host_list(self, text: str | None) -> tuple[str, ...]:
        from gpucluster.errors import UsageError

        if not text:
            raise UsageError("the ssh backend needs --hosts user@host1,user@host2[:port] (head first)")
        from .provider import parse_hosts

        return parse_hosts(text)

    def check_down(self, provider: Any, name: str, runs: dict[str, dict[str, Any]]) -> Any:
        """Every host a run reached (also those its teardown closed) is cleaned through the
        connection details its ledger rows hold."""
        from gpucluster.domain import Check

        from .cleanup import clean_recorded_hosts
        from .launch import RUN_RESOURCE

        rows = []
        for rid in sorted(runs):
            run = runs[rid] or {}
            rows += [{**r, "cluster": name} for r in run.get("resources", []) if r["kind"] == RUN_RESOURCE]
        recorded = {r["run_id"] for r in rows}
        check = Check.of(clean_recorded_hosts(rows))
        return check.with_unchecked(*(
            f"run {rid}: the ledger holds no ssh connection details for it; check its hosts by hand"
            for rid in sorted(set(runs) - recorded)))


BACKEND = SshBackend()
