"""Exec through the REAL kubernetes client (`kubernetes.stream.stream` and its websocket client) against
a small local HTTP server standing for the API server, while another thread makes REST calls.

`stream()` replaces its ApiClient's `request` with a websocket call for the duration of the call
(kubernetes/stream/stream.py, `_websocket_request`), so a REST call made meanwhile on the same client by
another thread goes out as a websocket handshake and fails with "Handshake status 200 OK"
(kubernetes-client/python#928, open since 2019; harbor-framework/harbor PR #1517, the same on GKE). The
server answers the exec's websocket upgrade slowly (as a busy API server and kubelet do) and refuses it,
so the swap window is wide; the pod listing is a plain GET answered at once.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

kubernetes = pytest.importorskip("kubernetes")

from gpucluster.infra.kubernetes import plan as k8s_plan  # noqa: E402
from gpucluster.infra.kubernetes.api import KubeApi  # noqa: E402
from gpucluster.infra.kubernetes.outputs import _exec  # noqa: E402

UPGRADE_DELAY_S = 1.5


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.headers.get("Upgrade", "").lower() == "websocket":
            self.server.upgrades.append(self.path)
            time.sleep(UPGRADE_DELAY_S)
            body = b'{"kind":"Status","status":"Failure","message":"upgrade refused","code":400}'
            self.send_response(400)
        elif self.path.startswith("/api/v1/namespaces/default/pods"):
            self.server.lists.append(self.path)
            body = json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []}).encode()
            self.send_response(200)
        else:
            body = b"{}"
            self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.upgrades, srv.lists = [], []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _api(server) -> KubeApi:
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "t",
              "clusters": [{"name": "t", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
              "users": [{"name": "t", "user": {"token": "secret-token"}}],
              "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}]}
    import yaml

    return KubeApi.from_kubeconfig(yaml.safe_dump(config))


def _list_during_exec(api: KubeApi, open_exec) -> tuple[list, BaseException | None]:
    """Open an exec in a thread; while its websocket handshake waits, list pods here."""
    errors: list = []

    def run():
        try:
            open_exec()
        except Exception as exc:  # the refused upgrade: ApiException(status=0)
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(UPGRADE_DELAY_S / 3)  # inside the exec's swap window
    listed = None
    try:
        api.core.list_namespaced_pod("default", label_selector="gpucluster-job=x")
    except Exception as exc:
        listed = exc
    thread.join(30)
    return errors, listed


def test_the_shared_client_is_patched_during_an_exec_and_a_rest_call_fails(server):
    """The mechanism, without our fix: exec on the client the main thread uses."""
    api = _api(server)
    errors, listed = _list_during_exec(api, lambda: api.stream(
        api.core.connect_get_namespaced_pod_exec, "p-0", "default", command=["true"], container="pytorch",
        stdin=False, stdout=True, stderr=True, tty=False, binary=True, _preload_content=False))
    assert errors  # the exec's refused upgrade (hidden by the client's AttributeError: see _exec)
    assert listed is not None  # the listing went out as a websocket handshake and failed
    assert len(server.upgrades) == 2 and server.lists == []


def test_each_exec_has_its_own_client_so_rest_calls_meanwhile_work(server):
    api = _api(server)
    plan = k8s_plan.Plan(name="x", namespace="default", mode="job", nodes=1, gpus_per_node=0, image="i",
                         run_id="r", hosts=("h",), argv_by_rank=((),), env=(), files=(), labels=())
    errors, listed = _list_during_exec(api, lambda: _exec(api, plan, "p-0", ["true"]))
    assert errors and getattr(errors[0], "status", None) == 0, errors  # the refused handshake, named
    assert "Handshake status 400" in str(errors[0])
    assert listed is None, listed  # the listing was a plain GET
    assert len(server.upgrades) == 1 and len(server.lists) == 1
    # and the main client was never left patched: a later listing is a GET too
    api.core.list_namespaced_pod("default")
    assert len(server.lists) == 2
