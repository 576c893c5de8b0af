"""Access to a cluster's Kubernetes API for the launcher (`infra.kubernetes.launcher`): `KubeApi` (the API groups
and the exec stream) from a kubeconfig or from a configured `ApiClient` (gcp builds one for a GKE stack:
`infra.gcp.gke`); how API errors are told apart, and how calls are retried. `kubernetes` is imported lazily."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from gpucluster.errors import LaunchError, require

# Any: the kubernetes client generates its API groups (CoreV1Api, BatchV1Api, ...), its ApiClient and its
# stream functions from an OpenAPI spec without type hints, and the tests pass fakes of their own.
KubeClient = Any
# Any: the model objects those calls return (V1Pod, V1Job, V1Status, ..., a streamed response) are
# untyped too, and read by attribute.
KubeObject = Any
T = TypeVar("T")


# -- API access --------------------------------------------------------------------------------
@dataclass
class KubeApi:
    """The three API groups the launcher calls (CoreV1Api, BatchV1Api, CustomObjectsApi or fakes),
    and `stream` (kubernetes.stream.stream, or the fake's) for exec into a pod."""

    core: KubeClient
    batch: KubeClient
    custom: KubeClient
    stream: KubeClient = None
    rbac: KubeClient = None  # RbacAuthorizationV1Api and AppsV1Api: the idle stop's objects (infra.gcp.idle)
    apps: KubeClient = None
    portforward: KubeClient = None  # kubernetes.stream.portforward (or a fake's), looked up when first used

    def __post_init__(self) -> None:
        if self.stream is None:
            from kubernetes.stream import stream

            self.stream = stream

    def open_portforward(self, method: KubeClient, *args: object, **kw: object) -> KubeObject:
        """A portforward websocket (`kubernetes.stream.portforward(method, POD, NS, ports=...)`):
        a `PortForward` whose `socket(port)` is the pod's port."""
        if self.portforward is None:
            from kubernetes.stream import portforward

            self.portforward = portforward
        return self.portforward(method, *args, **kw)

    def exec_core(self) -> KubeClient:
        """The CoreV1Api to open ONE exec stream with: on an `ApiClient` of its own (the same
        `Configuration`: host, CA, token and its refresh hook). `kubernetes.stream.stream` replaces the
        client's `request` method with a websocket call for the duration of the call and puts it back
        afterwards, so a REST call another thread makes on a shared client meanwhile goes out as a
        websocket handshake ("Handshake status 200 OK"), and overlapping swaps can leave the client
        patched for good (kubernetes-client/python#928; harbor-framework/harbor PR #1517 on GKE).
        Fakes without an `api_client` are returned as they are."""
        api_client = getattr(self.core, "api_client", None)
        if api_client is None:
            return self.core
        from kubernetes import client

        return client.CoreV1Api(client.ApiClient(api_client.configuration))

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None) -> "KubeApi":
        """From a kubeconfig text (the GKE stack's secret output), else ~/.kube/config."""
        k8s = require("kubernetes", "gcp")
        import yaml

        try:
            if kubeconfig:
                api_client = k8s.config.new_client_from_config_dict(yaml.safe_load(kubeconfig))
            else:
                api_client = k8s.config.new_client_from_config()
        except Exception as exc:  # the loaders raise ConfigException, YAMLError, OSError, ...
            raise LaunchError(f"cannot use the cluster's kubeconfig: {exc}") from None
        return cls.from_api_client(api_client)

    @classmethod
    def from_api_client(cls, api_client: KubeClient) -> "KubeApi":
        """The API groups on one `kubernetes.client.ApiClient` (host, CA, credentials already set)."""
        k8s = require("kubernetes", "gcp")
        return cls(k8s.client.CoreV1Api(api_client), k8s.client.BatchV1Api(api_client),
                   k8s.client.CustomObjectsApi(api_client), rbac=k8s.client.RbacAuthorizationV1Api(api_client),
                   apps=k8s.client.AppsV1Api(api_client))


_CA_FILES: list[str] = []


def ca_file(ca_base64: str) -> str:
    """The cluster CA (base64 PEM, as in a kubeconfig) in a private temporary file, removed at exit."""
    import atexit
    import os
    import tempfile

    fd, path = tempfile.mkstemp(prefix="gpucluster-ca-", suffix=".crt")
    with os.fdopen(fd, "wb") as f:
        f.write(base64.b64decode(ca_base64))
    def remove_all() -> None:
        for p in _CA_FILES:
            if os.path.exists(p):
                os.unlink(p)

    if not _CA_FILES:
        atexit.register(remove_all)
    _CA_FILES.append(path)
    return path


def _status(exc: BaseException) -> int | None:
    return getattr(exc, "status", None)


def _is_api_error(exc: BaseException) -> bool:
    """ApiException (status + reason) or a urllib3 connection error (reason)."""
    return _status(exc) is not None or hasattr(exc, "reason")


# -- retries -----------------------------------------------------------------------------------
# A zonal GKE cluster has one control plane: while GKE upgrades or repairs it the API answers 5xx or
# refuses connections for minutes (GKE docs, "Standard cluster upgrades": "the control plane is
# unavailable" during a zonal cluster's upgrade; repairs ignore maintenance exclusions). So a failed
# call that may succeed later (a connection error, 429, 500, 502, 503, 504) is retried with
# exponential backoff (1 s doubling to 30 s, with jitter) for up to API_RETRY_S, the bound of a
# control-plane upgrade; any other answer (401, 403, 404, 409, 422) is final at once.
API_RETRY_S = 600.0
RETRY_STATUS = (429, 500, 502, 503, 504)
BACKOFF_FIRST_S, BACKOFF_CAP_S = 1.0, 30.0


def transient(exc: BaseException) -> bool:
    """An API error worth retrying: the server was unreachable or answered 429/5xx (for an exec, in its
    refused websocket handshake: ws_client raises ApiException(status=0, "Handshake status 503 ...")."""
    if not _is_api_error(exc):
        return False
    status = _status(exc)
    if status == 0:
        import re

        m = re.search(r"Handshake status (\d+)", str(getattr(exc, "reason", "")))
        return m is not None and int(m.group(1)) in RETRY_STATUS
    return status in RETRY_STATUS or (status is None and hasattr(exc, "reason"))


def backoff(attempt: int) -> float:
    """Seconds to wait before retry `attempt` (1, 2, ...): 1, 2, 4, ... up to 30, +/- 20 %."""
    import random

    return min(BACKOFF_CAP_S, BACKOFF_FIRST_S * 2 ** (attempt - 1)) * random.uniform(0.8, 1.2)


class Retry:
    """Calls retried while they fail transiently, for at most `bound_s` from the first failure;
    `clock` and `sleep` are injectable (tests run the fake API server's outage scaled down)."""

    def __init__(self, bound_s: float = API_RETRY_S, clock: Callable[[], float] | None = None,
                 sleep: Callable[[float], None] | None = None, stopped: Callable[[], bool] | None = None):
        import time

        self.bound_s = bound_s
        self.clock: Callable[[], float] = clock or time.monotonic
        self.sleep: Callable[[float], None] = sleep or time.sleep
        self.stopped = stopped  # () -> bool: give up early (the run is being stopped)

    def call(self, fn: Callable[..., T], *args: object, **kw: object) -> T:
        first, attempt = None, 0
        while True:
            try:
                return fn(*args, **kw)
            except Exception as exc:  # ApiException is in the lazily imported SDK: `transient` tells them apart
                if not transient(exc):
                    raise
                now = self.clock()
                first = now if first is None else first
                attempt += 1
                wait = backoff(attempt)
                if now + wait - first > self.bound_s or (self.stopped is not None and self.stopped()):
                    raise
                self.sleep(wait)
