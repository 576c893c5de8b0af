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
    if cloud not in CLOUDS:
        raise UsageError(not_allowed("cloud", cloud, CLOUDS))
    raise UsageError(f"cloud {cloud!r} cannot run jobs in this version yet; allowed now: local")
