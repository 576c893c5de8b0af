"""Reaching an existing cluster: the kubeconfig as kubectl reads it, through the kubernetes client's own
loader (no parser here), and the API's first answers told apart as bad input.

kubectl's rules (Kubernetes docs, "Organizing Cluster Access Using kubeconfig Files"): `$KUBECONFIG` is a
list of files separated by ':' (';' on Windows) merged in order, the first file to set a value winning;
without it, `~/.kube/config`. The kubernetes client does the same (`kubernetes.config.kube_config`:
`KubeConfigMerger` splits the list; `new_client_from_config(config_file, context)`); its default path is
read from the environment when the module is imported, so the path is given here on every call. Exec
credential plugins (`gke-gcloud-auth-plugin`, `aws eks get-token`, any program printing an ExecCredential)
run inside that loader (`ExecProvider`), which also refreshes the token once its expirationTimestamp has
passed. `persist_config=False`: the user's kubeconfig files are never written.

What goes wrong, each one line (exit 2) before anything is created: no kubeconfig, one that cannot be
read, a context it does not hold (the known ones listed), an API server that does not answer, and
credentials it refuses (401: an expired token, a plugin that failed).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from gpucluster.errors import UsageError, require

from gpucluster.states import JsonObject

from .options import DEFAULT_NAMESPACE

if TYPE_CHECKING:
    from gpucluster.infra.kubernetes.api import KubeClient


def kubeconfig_path(env: Mapping[str, str] | None = None) -> str:
    """`$KUBECONFIG` (a ':'-separated list) or ~/.kube/config, as kubectl reads it."""
    env = os.environ if env is None else env
    return env.get("KUBECONFIG") or os.path.join(os.path.expanduser("~"), ".kube", "config")


def _paths(path: str) -> list[str]:
    return [os.path.expanduser(p) for p in path.split(os.pathsep) if p]


@dataclass(frozen=True)
class Target:
    """The cluster a run goes to: its context, the namespace used, and where each came from."""

    context: str
    namespace: str
    namespace_from: str  # "--namespace", "the context's namespace" or "the default"
    server: str = ""


def contexts(path: str | None = None) -> tuple[list[JsonObject], str | None]:
    """(the contexts the kubeconfig holds, its current context), or a UsageError naming the file."""
    k8s = require("kubernetes", "kubernetes")
    path = path or kubeconfig_path()
    existing = [p for p in _paths(path) if os.path.exists(p)]
    if not existing:
        raise UsageError(f"no kubeconfig at {path}: set KUBECONFIG or write ~/.kube/config "
                         "(e.g. `gcloud container clusters get-credentials`, `aws eks update-kubeconfig`, "
                         "`k3d kubeconfig merge`)")
    try:
        known, current = k8s.config.list_kube_config_contexts(config_file=path)
    except Exception as exc:  # noqa: BLE001 - ConfigException, YAMLError, OSError, KeyError, TypeError ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"kubeconfig {path} cannot be read: {first}") from None
    return list(known or []), (current or {}).get("name") if isinstance(current, dict) else None


def target(context: str | None, namespace: str | None, path: str | None = None) -> Target:
    """The context (default: the current one) and namespace (default: the context's, else `default`)."""
    path = path or kubeconfig_path()
    known, current = contexts(path)
    names = [c.get("name") for c in known if isinstance(c, dict)]
    name = context or current
    if not name:
        raise UsageError(f"kubeconfig {path} sets no current context: give --context, one of: "
                         f"{', '.join(n for n in names if n) or '(none)'}")
    chosen = next((c for c in known if c.get("name") == name), None)
    if chosen is None:
        raise UsageError(f"context {name!r} is not in kubeconfig {path}: known contexts: "
                         f"{', '.join(n for n in names if n) or '(none)'}")
    if namespace:
        return Target(name, namespace, "--namespace")
    own = ((chosen.get("context") or {}).get("namespace") or "").strip()
    return Target(name, own or DEFAULT_NAMESPACE, "the context's namespace" if own else "the default")


def api_client(context: str, path: str | None = None) -> KubeClient:
    """An ApiClient for `context` from the kubernetes client's loader (exec plugins run there)."""
    k8s = require("kubernetes", "kubernetes")
    path = path or kubeconfig_path()
    import logging

    class _Caught(logging.Handler):  # the loader logs a failed exec plugin instead of raising
        def __init__(self) -> None:
            super().__init__(logging.ERROR)
            self.lines: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.lines.append(record.getMessage())

    caught, root = _Caught(), logging.getLogger()
    root.addHandler(caught)
    try:
        client = k8s.config.new_client_from_config(config_file=path, context=context, persist_config=False)
    except Exception as exc:  # noqa: BLE001 - ConfigException, OSError, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"context {context!r} of kubeconfig {path} cannot be used: {first}") from None
    finally:
        root.removeHandler(caught)
    client.gpucluster_plugin_errors = caught.lines  # said with a 401, which is what follows them
    return client


def refused(exc: BaseException, context: str, what: str, plugin: list[str] | None = None) -> UsageError | None:
    """The API's answer as bad input (unreachable, 401), or None for anything else."""
    from gpucluster.infra.kubernetes.api import _is_api_error, _status

    if not _is_api_error(exc) and not isinstance(exc, OSError):
        return None
    status = _status(exc)
    if status in (None, 0):
        reason = str(getattr(exc, "reason", exc)).strip().splitlines()[0][:200]
        return UsageError(f"the API server of context {context!r} cannot be reached ({what}): {reason}")
    if status == 401:
        why = f"; the credential plugin said: {plugin[-1]}" if plugin else ""
        return UsageError(f"the API server of context {context!r} refused its credentials (401 Unauthorized, {what}): "
                          f"they are missing or expired{why}; log in again (e.g. `gcloud auth login`, "
                          "`aws sso login`) or refresh the kubeconfig")
    return None
