"""Backend registry: the provider and launcher for each cloud, imported only when used."""

from __future__ import annotations

from typing import Any

from .errors import UsageError, not_allowed
from .spec import CLOUDS


def get_backend(cloud: str, **options: Any) -> tuple[Any, Any]:
    """(provider, launcher) for a cloud. Options: identity, known_hosts (ssh and aws), ..."""
    if cloud == "local":
        from .local import LocalLauncher
        from gpucluster.infra.local import LocalProvider

        return LocalProvider(), LocalLauncher()
    if cloud == "ssh":
        from .sshlaunch import SshLauncher
        from gpucluster.infra.ssh import SshProvider

        kw = {k: options[k] for k in ("identity", "known_hosts") if options.get(k)}
        if options.get("remote_python"):
            kw["python"] = options["remote_python"]
        launcher = SshLauncher(**kw)
        # The provider asks only the nodes where this launcher started the run for leftovers.
        return SshProvider(launcher=launcher), launcher
    if cloud == "aws":
        # EC2 nodes are reached like any ssh host, with the cluster's own key and pinned host keys.
        from .catalog.aws import NODE_PYTHON
        from .sshlaunch import SshLauncher
        from gpucluster.infra.aws_outputs import console_tail
        from gpucluster.infra.cloud import PulumiProvider

        kw: dict[str, Any] = {"python": options.get("remote_python") or NODE_PYTHON, "diagnose": console_tail}
        if options.get("ready_timeout") is not None:
            kw["ready_timeout"] = options["ready_timeout"]
        return PulumiProvider("aws"), SshLauncher(**kw)
    if cloud == "gcp":
        from .k8s import KubernetesLauncher
        from gpucluster.infra.cloud import PulumiProvider

        kw = {"start_deadline_s": options["start_deadline_s"]} if options.get("start_deadline_s") else {}
        return PulumiProvider("gcp"), KubernetesLauncher.from_options(options.get("spec_options") or {}, **kw)
    raise UsageError(not_allowed("cloud", cloud, CLOUDS))
