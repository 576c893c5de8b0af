"""FAKE Kubernetes API server over HTTP: FakeKubeApi (tests/k8s_fake.py) behind the REST paths and the
exec websocket the launcher's calls go to, so that the REAL kubernetes client makes them: its ApiClient,
its urllib3 pool, its log stream, and `kubernetes.stream.stream` with its websocket client (which
swaps its ApiClient's `request` for a websocket call while an exec opens: kubernetes-client/python#928).
`serve(fake)` starts it on loopback and returns `(KubeApi, stop)`; the KubeApi comes from a kubeconfig,
as `KubeApi.from_kubeconfig` makes it for a real cluster.

Each behaviour from its source:

- REST: JSON objects and lists as the API server sends them (Kubernetes API reference: `PodList`,
  `EventList`, `Status` for every error with its `code`, `reason` and `message`); request bodies are
  read into the client's typed models, as the server decodes them.
- Logs: `GET .../pods/NAME/log` with `follow`, `timestamps`, `sinceSeconds`, `tailLines`, `container`;
  a followed log is a chunked body that stays open while the container runs (HTTP/1.1 chunked
  transfer coding, RFC 9112 section 7.1); a stream the API server drops (an outage, a cut) ends
  without the last chunk, so the client sees "Connection broken: IncompleteRead".
- Exec: `GET .../pods/NAME/exec?command=...&container=...&stdin=...&stdout=...&stderr=...` upgraded to
  a websocket (RFC 6455: `Sec-WebSocket-Accept` = base64(SHA-1(key + the RFC's GUID)), server frames
  unmasked, client frames masked) speaking the channel protocol the client offers and the server
  knows: `v4.channel.k8s.io` here, an API server older than v5's stdin close (kubernetes/kubernetes#89899):
  each binary frame starts with its channel byte (0 stdin, 1 stdout, 2 stderr, 3 error); when the
  command ends, channel 3 carries a `Status` (`Success`, or `Failure` with reason NonZeroExitCode and the
  code in `details.causes[0].message`, as the kubelet's remotecommand reports it), then the socket
  closes. The handshake crosses the API server, the kubelet and the runtime's streaming server
  (Kubernetes design, "CRI streaming requests"), so it takes EXEC_HANDSHAKE_S before the 101 answer; a
  refused exec (no such pod, a container not running) is an HTTP error before any upgrade.
- Patches (Kubernetes docs, "API Concepts", patch): a PATCH must say its patch type in Content-Type
  (`application/merge-patch+json`, `application/strategic-merge-patch+json`, ...); any other answers
  415 Unsupported Media Type. PUT replaces an object by name (404 when it is not there).
- A request made with a service account's token goes through RBAC first (tests/k8s_fake_rbac.py): 403
  unless a Role bound to that account allows it.
- A REST path asked for with `Upgrade: websocket` (what the kubernetes client sends for ANY call made
  through an ApiClient whose `request` another thread's exec has swapped) is answered as the plain
  request it names, without upgrading (the API server upgrades only streaming endpoints), so the
  client fails with "Handshake status 200 OK" (or 404/405); each is recorded in `fake.rest_upgrades`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from urllib.parse import parse_qs, urlparse

from k8s_fake import FakeApiException
from k8s_fake_rbac import authorize

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
EXEC_HANDSHAKE_S = 0.2
PROTOCOLS = ("v4.channel.k8s.io",)  # what this API server speaks (no v5)
_ID = {"image_id": "imageID", "container_id": "containerID", "pod_ip": "podIP"}


def to_json(obj):
    """A fake's SimpleNamespace view as the API server's JSON (camelCase keys, nulls left out)."""
    if isinstance(obj, SimpleNamespace):
        obj = vars(obj)
    if isinstance(obj, dict):
        return {_ID.get(k, re.sub(r"_([a-z])", lambda m: m.group(1).upper(), k)): to_json(v)
                for k, v in obj.items() if v is not None}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    return obj


def model(data: dict, kind: str):
    from kubernetes.client import ApiClient

    return ApiClient()._ApiClient__deserialize(data, kind)


ROUTES = [  # (method, path regex, handler name)
    ("GET", r"/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/log", "log"),
    ("GET", r"/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/exec", "exec"),
    ("POST", r"/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/exec", "exec"),
    ("GET", r"/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/portforward", "portforward"),
    ("POST", r"/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/portforward", "portforward"),
    ("GET", r"/api/v1/namespaces/(?P<ns>[^/]+)/pods", "pods"),
    ("GET", r"/api/v1/namespaces/(?P<ns>[^/]+)/events", "events"),
    ("POST", r"/api/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>configmaps|services|serviceaccounts|secrets)", "create"),
    ("GET", r"/api/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>configmaps|services|secrets)", "list"),
    ("DELETE", r"/api/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>configmaps|services|secrets)/(?P<name>[^/]+)", "delete"),
    ("GET", r"/api/v1/namespaces/(?P<name>[^/]+)", "read_namespace"),
    ("DELETE", r"/api/v1/namespaces/(?P<name>[^/]+)", "delete_namespace"),
    ("POST", r"/api/v1/namespaces", "create_namespace"),
    ("PUT", r"/api/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>configmaps|serviceaccounts)/(?P<name>[^/]+)", "replace"),
    ("POST", r"/apis/(?P<group>rbac.authorization.k8s.io|apps)/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>roles|rolebindings|deployments)",
     "create"),
    ("PUT", r"/apis/(?P<group>rbac.authorization.k8s.io|apps)/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>roles|rolebindings|deployments)"
     r"/(?P<name>[^/]+)", "replace"),
    ("GET", r"/apis/batch/v1/namespaces/(?P<ns>[^/]+)/jobs/(?P<name>[^/]+)", "read_job"),
    ("PATCH", r"/apis/batch/v1/namespaces/(?P<ns>[^/]+)/jobs/(?P<name>[^/]+)", "patch_job"),
    ("GET", r"/apis/batch/v1/namespaces/(?P<ns>[^/]+)/jobs", "jobs"),
    ("POST", r"/apis/batch/v1/namespaces/(?P<ns>[^/]+)/jobs", "create_job"),
    ("DELETE", r"/apis/batch/v1/namespaces/(?P<ns>[^/]+)/jobs/(?P<name>[^/]+)", "delete_job"),
    ("POST", r"/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/]+)", "create_custom"),
    ("DELETE", r"/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/]+)/(?P<name>[^/]+)",
     "delete_custom"),
    ("GET", r"/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/]+)", "list_custom"),
]
MODELS = {"configmaps": ("V1ConfigMap", "create_namespaced_config_map"),
          "services": ("V1Service", "create_namespaced_service"),
          "serviceaccounts": ("V1ServiceAccount", "create_namespaced_service_account"),
          "secrets": ("V1Secret", "create_namespaced_secret"),
          "roles": ("V1Role", "create_namespaced_role"),
          "rolebindings": ("V1RoleBinding", "create_namespaced_role_binding"),
          "deployments": ("V1Deployment", "create_namespaced_deployment")}
REPLACE = {"configmaps": "replace_namespaced_config_map", "serviceaccounts": "replace_namespaced_service_account",
           "roles": "replace_namespaced_role", "rolebindings": "replace_namespaced_role_binding",
           "deployments": "replace_namespaced_deployment"}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    @property
    def fake(self):
        return self.server.fake

    def do_GET(self):  # noqa: N802 - http.server's names
        self._route("GET")

    def do_POST(self):  # noqa: N802
        self._route("POST")

    def do_DELETE(self):  # noqa: N802
        self._route("DELETE")

    def do_PATCH(self):  # noqa: N802
        self._route("PATCH")

    def do_PUT(self):  # noqa: N802
        self._route("PUT")

    # -- plumbing ------------------------------------------------------------------------------
    def _route(self, method: str) -> None:
        url = urlparse(self.path)
        self.query = parse_qs(url.query)
        length = int(self.headers.get("Content-Length") or 0)
        self.body = json.loads(self.rfile.read(length) or b"null") if length else None
        self.fake._tls.authorization = self.headers.get("Authorization")
        upgrade = self.headers.get("Upgrade", "").lower() == "websocket"
        for m, pattern, name in ROUTES:
            match = re.fullmatch(pattern, url.path)
            if match and m == method:
                if upgrade and name not in ("exec", "portforward"):
                    self.fake.rest_upgrades.append((method, url.path))
                try:
                    token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                    if token in self.fake.sa_tokens:  # tests/k8s_fake_rbac.py: RBAC for service accounts
                        self.fake._authenticate()
                        authorize(self.fake, token, method, url.path)
                    args = {k: v for k, v in match.groupdict().items() if k != "group"}
                    getattr(self, "h_" + name)(**args)
                except FakeApiException as exc:
                    self._status(exc)
                return
        if upgrade:
            self.fake.rest_upgrades.append((method, url.path))
        self._send(405 if any(re.fullmatch(p, url.path) for _, p, _ in ROUTES) else 404,
                   {"kind": "Status", "status": "Failure", "code": 404, "message": f"no route {method} {url.path}"})

    def q(self, key: str, default=None):
        return self.query.get(key, [default])[0]

    def flag(self, key: str) -> bool:
        """A boolean query parameter as the API server parses it (Go's strconv.ParseBool: 1, t, T, TRUE,
        true, True); the python client sends True/False."""
        return self.q(key) in ("1", "t", "T", "TRUE", "true", "True")

    def _send(self, code: int, obj) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, exc: FakeApiException) -> None:
        code = exc.status or int((re.search(r"Handshake status (\d+)", exc.reason) or [0, 500])[1])
        reason = exc.reason.split(":")[0].replace("Handshake status ", "")
        self._send(code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                          "message": exc.reason, "reason": reason, "code": code})

    # -- REST ----------------------------------------------------------------------------------
    def h_pods(self, ns):
        got = self.fake.list_namespaced_pod(ns, label_selector=self.q("labelSelector"))
        items = [to_json(p) for p in got.items]
        for item in items:
            item.setdefault("spec", {"containers": [{"name": "pytorch"}]})
        self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})

    def h_events(self, ns):
        got = self.fake.list_namespaced_event(ns, field_selector=self.q("fieldSelector"))
        pod = (self.q("fieldSelector") or "").partition("=")[2]
        items = [{**to_json(e), "metadata": {"name": f"{pod}.{i}", "namespace": ns},
                  "involvedObject": {"kind": "Pod", "name": pod, "namespace": ns}} for i, e in enumerate(got.items)]
        self._send(200, {"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": items})

    def h_create(self, ns, kind):
        cls, method = MODELS[kind]
        getattr(self.fake, method)(ns, model(self.body, cls))
        self._send(201, self.body)

    def h_replace(self, ns, kind, name):
        cls = MODELS[kind][0]
        getattr(self.fake, REPLACE[kind])(name, ns, model(self.body, cls))
        self._send(200, self.body)

    def h_read_job(self, ns, name):
        from kubernetes.client import ApiClient

        self._send(200, ApiClient().sanitize_for_serialization(self.fake.read_namespaced_job(name, ns)))

    def h_patch_job(self, ns, name):
        from kubernetes.client import ApiClient

        if self.headers.get("Content-Type", "").split(";")[0] not in ("application/merge-patch+json",
                                                                     "application/strategic-merge-patch+json"):
            raise FakeApiException(415, "UnsupportedMediaType")
        self._send(200, ApiClient().sanitize_for_serialization(self.fake.patch_namespaced_job(name, ns, self.body)))

    def h_delete(self, ns, kind, name):
        {"configmaps": self.fake.delete_namespaced_config_map,
         "services": self.fake.delete_namespaced_service,
         "secrets": self.fake.delete_namespaced_secret}[kind](name, ns)
        self._send(200, {"kind": "Status", "status": "Success"})

    def h_read_namespace(self, name):
        got = self.fake.read_namespace(name)
        self._send(200, {"kind": "Namespace", "apiVersion": "v1", "metadata": to_json(got.metadata),
                         "status": {"phase": "Active"}})

    def h_create_namespace(self):
        self.fake.create_namespace(model(self.body, "V1Namespace"))
        self._send(201, self.body)

    def h_delete_namespace(self, name):
        self.fake.delete_namespace(name)
        self._send(200, {"kind": "Status", "status": "Success"})

    def h_list(self, ns, kind):
        lister = {"configmaps": "list_namespaced_config_map", "services": "list_namespaced_service",
                  "secrets": "list_namespaced_secret"}[kind]
        got = getattr(self.fake, lister)(ns, label_selector=self.q("labelSelector"))
        name = {"configmaps": "ConfigMapList", "services": "ServiceList", "secrets": "SecretList"}[kind]
        self._send(200, {"kind": name, "apiVersion": "v1", "metadata": {},
                         "items": [{"metadata": to_json(i.metadata)} for i in got.items]})

    def h_list_custom(self, version, ns, plural):
        group = urlparse(self.path).path.split("/")[2]  # `_route` passes no `group` (the RBAC routes' word)
        got = self.fake.list_namespaced_custom_object(group, version, ns, plural,
                                                      label_selector=self.q("labelSelector"))
        self._send(200, {"kind": "List", "apiVersion": f"{group}/{version}", "metadata": {}, "items": got["items"]})

    def h_jobs(self, ns):
        got = self.fake.list_namespaced_job(ns, label_selector=self.q("labelSelector"))
        items = [{"metadata": to_json(j.metadata), "spec": {"template": {}}} for j in got.items]
        self._send(200, {"kind": "JobList", "apiVersion": "batch/v1", "metadata": {}, "items": items})

    def h_create_job(self, ns):
        self.fake.create_namespaced_job(ns, model(self.body, "V1Job"))
        self._send(201, self.body)

    def h_delete_job(self, ns, name):
        self.fake.delete_namespaced_job(name, ns, body=model(self.body or {}, "V1DeleteOptions"))
        self._send(200, {"kind": "Status", "status": "Success"})

    def h_create_custom(self, group, version, ns, plural):
        self.fake.create_namespaced_custom_object(group, version, ns, plural, self.body)
        self._send(201, self.body)

    def h_delete_custom(self, group, version, ns, plural, name):
        self.fake.delete_namespaced_custom_object(group, version, ns, plural, name, body=self.body or {})
        self._send(200, {"kind": "Status", "status": "Success"})

    # -- logs ----------------------------------------------------------------------------------
    def h_log(self, ns, name):
        follow = self.flag("follow")
        since, tail = self.q("sinceSeconds"), self.q("tailLines")
        response = self.fake.read_namespaced_pod_log(
            name, ns, container=self.q("container"), follow=follow, _preload_content=False,
            timestamps=self.flag("timestamps"), since_seconds=int(since) if since else None,
            tail_lines=int(tail) if tail else None)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for piece in response.stream():
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                self.wfile.flush()
        except Exception:  # noqa: BLE001 - the stream broke (outage, cut): the connection drops mid-body
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(b"0\r\n\r\n")

    # -- port forward over a websocket (tests/k8s_fake_forward.py) -------------------------------------
    def h_portforward(self, ns, name):
        from k8s_fake_forward import WebSocketForward, check

        offered = [p.strip() for p in self.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
        chosen = next((p for p in offered if p in PROTOCOLS), None)
        key = self.headers.get("Sec-WebSocket-Key")
        if self.headers.get("Upgrade", "").lower() != "websocket" or not key or chosen is None:
            raise FakeApiException(400, "BadRequest: portforward needs a websocket upgrade with a channel protocol")
        self.fake._authenticate()
        ports = check(self.fake, name, self.q("ports"))
        self._upgrade(key, chosen)
        WebSocketForward(self.connection, self.fake, name, ports).run()

    def _upgrade(self, key: str, chosen: str) -> None:
        accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
        self.send_response(101, "Switching Protocols")
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.send_header("Sec-WebSocket-Protocol", chosen)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True

    # -- exec over a websocket -----------------------------------------------------------------------
    def h_exec(self, ns, name):
        offered = [p.strip() for p in self.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
        chosen = next((p for p in offered if p in PROTOCOLS), None)
        key = self.headers.get("Sec-WebSocket-Key")
        if self.headers.get("Upgrade", "").lower() != "websocket" or not key or chosen is None:
            raise FakeApiException(400, "BadRequest: exec needs a websocket upgrade with a channel protocol")
        self.fake.calls.append(("exec", "pod", ns, name, tuple(self.query.get("command", []))))
        time.sleep(self.fake.exec_handshake_s)
        try:
            self.fake._authenticate()
        except FakeApiException as exc:
            raise FakeApiException(0, f"Handshake status {exc.status} {exc.reason}") from None
        client = self.fake.exec_in(name, self.query.get("command", []), self.q("container"),
                                   self.flag("stdin"), True, True, self.flag("stderr"), self.flag("tty"))
        self._upgrade(key, chosen)
        WebSocketExec(self.connection, client, self.fake).run()


class WebSocketExec:
    """One exec's websocket: the command's stdout/stderr out as channel frames, stdin frames in."""

    def __init__(self, conn: socket.socket, client, fake=None):
        self.conn, self.client = conn, client
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self.owner = fake
        if fake is not None:  # an outage drops it (FakeKubeApi._go_down)
            fake.websockets = getattr(fake, "websockets", set())
            fake.websockets.add(self)

    def forget(self) -> None:
        if self.owner is not None:
            self.owner.websockets.discard(self)

    def drop(self) -> None:
        """The API server went away: the connection ends with no close frame."""
        self.closed.set()
        try:
            self.conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def send(self, opcode: int, payload: bytes) -> None:
        n = len(payload)
        head = bytes([0x80 | opcode]) + (bytes([n]) if n < 126 else struct.pack("!BH", 126, n) if n < 65536
                                         else struct.pack("!BQ", 127, n))
        with self.lock:
            self.conn.sendall(head + payload)

    def _recv(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            more = self.conn.recv(n - len(data))
            if not more:
                raise EOFError
            data += more
        return data

    def reader(self) -> None:
        """Client frames: stdin (channel 0), close, ping."""
        try:
            while not self.closed.is_set():
                b0, b1 = self._recv(2)
                n = b1 & 0x7F
                if n == 126:
                    n = struct.unpack("!H", self._recv(2))[0]
                elif n == 127:
                    n = struct.unpack("!Q", self._recv(8))[0]
                mask = self._recv(4) if b1 & 0x80 else b"\0\0\0\0"
                payload = bytes(c ^ mask[i % 4] for i, c in enumerate(self._recv(n)))
                opcode = b0 & 0x0F
                if opcode == 0x8:
                    break
                if opcode == 0x9:
                    self.send(0xA, payload)
                elif opcode in (0x1, 0x2) and payload[:1] == b"\x00" and len(payload) > 1:
                    self.client.write_stdin(payload[1:])
                elif opcode in (0x1, 0x2) and payload[:1] == b"\x04" and hasattr(self.client, "resize"):
                    self.client.resize(payload[1:])  # the resize channel (a terminal's size)
        except (EOFError, OSError):
            pass
        self.closed.set()
        self.client.close()  # the websocket went: the API server ends the command

    def run(self) -> None:
        threading.Thread(target=self.reader, daemon=True).start()
        try:
            while not self.closed.is_set():
                self.client.update(timeout=0.05)
                for channel, read in ((1, self.client.read_stdout), (2, self.client.read_stderr)):
                    data = read(timeout=0)
                    if data:
                        self.send(0x2, bytes([channel]) + data)
                if not self.client.is_open():
                    for channel, read in ((1, self.client.read_stdout), (2, self.client.read_stderr)):
                        data = read(timeout=0)
                        if data:
                            self.send(0x2, bytes([channel]) + data)
                    rc = self.client.returncode
                    status = {"metadata": {}, "status": "Success"} if rc == 0 else {
                        "metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
                        "message": f"command terminated with non-zero exit code: exit status {rc}",
                        "details": {"causes": [{"reason": "ExitCode", "message": str(rc)}]}}
                    self.send(0x2, b"\x03" + json.dumps(status).encode())
                    self.send(0x8, struct.pack("!H", 1000))
                    break
        except OSError:
            pass
        finally:
            self.closed.set()
            self.forget()
            try:
                self.conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve_http(fake, token: str = "fake-token"):
    """(the API server's URL, stop) for `fake` served on loopback, accepting bearer `token` only."""
    fake.rest_upgrades = []
    fake.exec_handshake_s = EXEC_HANDSHAKE_S
    fake.tokens.add(token)
    fake.auth = lambda: (getattr(fake._tls, "authorization", None) or "").removeprefix("Bearer ")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.fake = fake
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()

    return f"http://127.0.0.1:{server.server_address[1]}", stop


def serve(fake, token: str = "fake-token"):
    """(KubeApi on the real kubernetes client, stop) for `fake` served on loopback."""
    import yaml

    from gpucluster.infra.kubernetes.api import KubeApi

    url, stop = serve_http(fake, token)
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "fake",
              "clusters": [{"name": "fake", "cluster": {"server": url}}],
              "users": [{"name": "fake", "user": {"token": token}}],
              "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}
    api = KubeApi.from_kubeconfig(yaml.safe_dump(config))
    return api, stop
