"""A Cloud Storage JSON API on loopback for tests, and a metadata server stand-in.

`gcs_server`: gcp-storage-emulator (`gcp_storage_emulator.server.create_server`, an HTTP server
speaking the JSON API: list, download with alt=media, uploadType=media) in this process, in memory,
on a free 127.0.0.1 port. A pod's program is pointed at it with STORAGE_EMULATOR_HOST, the variable
google-cloud-storage honours (and then sends no credentials). The emulator is kinder than GCS in
ways that would hide bugs, so a thin layer in front of it (`_Gate`) answers as GCS does:

- listing pages: GCS returns at most 1,000 items a page and "may return fewer", with
  nextPageToken until the last (https://cloud.google.com/storage/docs/json_api/v1/objects/list);
  the emulator returns everything at once. Here pages hold `page_size` items (2 by default), so a
  client that ignores nextPageToken loses objects.
- `ifGenerationMatch=0` on an upload: GCS answers 412 when the object exists
  (https://cloud.google.com/storage/docs/request-preconditions); the emulator overwrites.
- transient errors: GCS answers 429/503 now and then and expects retries with backoff
  (https://cloud.google.com/storage/docs/retry-strategy); `fail_next = N` makes the next N
  requests answer 503.
- IAM: the emulator checks no credentials at all; `deny` (bucket names) answers 403 with GCS's
  error shape ("... does not have storage.objects.list access ..."), and `reject_tokens` answers
  401 to a request bearing one of those tokens. That the bindings grant exactly the prefixes is
  tested on the declared conditions, not here. `grant_after` (bucket -> seconds) is a grant made
  just now: 403 until that long after the bucket's first request, then allowed (IAM docs, "Access
  change propagation": about 2 minutes, sometimes 7 or more).
- empty objects: GCS stores them; the emulator's media upload fails on an empty body, so they are
  stored here through its storage.
- object names: GCS allows names such as "train/../x" (only "." and ".." alone are refused,
  https://cloud.google.com/storage/docs/objects#naming); the emulator's filesystem cannot store
  them, so `extra_listed` adds such names to a bucket's listing (they cannot be downloaded here:
  a client must refuse them from the listing alone).

`metadata_server`: the metadata server a pod's token comes from
(http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token).
Like the real one it answers 403 to a request without `Metadata-Flavor: Google` and to one with
X-Forwarded-For (https://cloud.google.com/compute/docs/metadata/querying-metadata), and returns
{"access_token", "expires_in", "token_type"}; tokens are tok-1, tok-2, ... in order; `.../default/email`
is the account's email. `deny_for_s`: a Workload Identity binding made just now: the GKE metadata
server answers 403 (it cannot mint the token: iam.serviceAccounts.getAccessToken denied) for that
long after the first request (IAM docs, "Access change propagation").
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


@dataclass
class GateState:
    storage: object = None
    page_size: int = 2
    fail_next: int = 0
    deny: set = field(default_factory=set)
    grant_after: dict = field(default_factory=dict)  # bucket -> seconds a new grant takes to apply
    grant_seen: dict = field(default_factory=dict)  # bucket -> when its first request came
    reject_tokens: set = field(default_factory=set)
    extra_listed: dict = field(default_factory=dict)  # bucket -> [(name, size)]
    requests: list = field(default_factory=list)  # (method, path, query, Authorization)
    lock: threading.Lock = field(default_factory=threading.Lock)


_BUCKET_IN_PATH = re.compile(r"^(?:/upload|/download)?/storage/v1/b/([^/]+)(/o(?:/(.*))?)?$")


def _gate_handler(base, state: GateState):
    class _Gate(base):
        def _answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _drain(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            if n:
                self.rfile.read(n)

        def _gate(self, method: str) -> bool:
            """True when answered here (the emulator does not see the request)."""
            url = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(url.query)
            m = _BUCKET_IN_PATH.match(url.path)
            bucket = urllib.parse.unquote(m.group(1)) if m else None
            with state.lock:
                state.requests.append((method, url.path, query, self.headers.get("Authorization")))
                failing = state.fail_next > 0
                state.fail_next -= 1 if failing else 0
            if failing:
                self._drain()
                self._answer(503, {"error": {"code": 503, "message": "Service Unavailable (injected)"}})
                return True
            auth = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
            if auth and auth in state.reject_tokens:
                self._drain()
                self._answer(401, {"error": {"code": 401, "message": "Invalid Credentials"}})
                return True
            if bucket in state.grant_after:
                import time

                with state.lock:
                    first = state.grant_seen.setdefault(bucket, time.monotonic())
                propagating = time.monotonic() - first < state.grant_after[bucket]
            else:
                propagating = False
            if bucket in state.deny or propagating:
                self._drain()
                self._answer(403, {"error": {"code": 403, "message": "gpuc-x@p.iam.gserviceaccount.com does not "
                                             f"have storage.objects.list access to the Google Cloud Storage bucket. "
                                             f"Permission 'storage.objects.list' denied on resource (or it may not "
                                             f"exist)."}})
                return True
            if method == "GET" and m and m.group(2) == "/o" and not url.path.startswith("/upload"):
                return self._list(bucket, query)
            if method == "POST" and url.path.startswith("/upload") and query.get("ifGenerationMatch") == ["0"]:
                name = query.get("name", [""])[0]
                if name in state.storage.objects.get(bucket, {}):
                    self._drain()
                    self._answer(412, {"error": {"code": 412, "message": "At least one of the pre-conditions you "
                                                 "specified did not hold."}})
                    return True
            if method == "POST" and url.path.startswith("/upload") and not int(self.headers.get("Content-Length") or 0):
                return self._empty_upload(bucket, query.get("name", [""])[0])
            return False

        def _empty_upload(self, bucket: str, name: str) -> bool:
            """GCS stores empty objects; the emulator's media upload fails on an empty body."""
            from gcp_storage_emulator.exceptions import NotFound
            from gcp_storage_emulator.handlers import objects

            obj = objects._checksums(b"", objects._make_object_resource(
                "http://%s:%d" % self.server.server_address[:2], bucket, name, "application/octet-stream", "0"))
            try:
                state.storage.create_file(bucket, name, b"", obj)
            except NotFound:
                self._answer(404, {"error": {"code": 404, "message": "The specified bucket does not exist."}})
                return True
            self._answer(200, obj)
            return True

        def _list(self, bucket: str, query: dict) -> bool:
            from gcp_storage_emulator.exceptions import NotFound

            prefix = query.get("prefix", [""])[0]
            try:
                items, _ = state.storage.get_file_list(bucket, prefix or None)
            except NotFound:
                self._answer(404, {"error": {"code": 404, "message": "The specified bucket does not exist."}})
                return True
            # `updated` as GCS lists it (https://cloud.google.com/storage/docs/json_api/v1/objects#resource)
            items = [{"name": o["name"], "size": o["size"], "md5Hash": o.get("md5Hash"), "updated": o.get("updated")}
                     for o in items]
            items += [{"name": n, "size": str(s)} for n, s in state.extra_listed.get(bucket, []) if n.startswith(prefix)]
            items.sort(key=lambda o: o["name"])
            start = int(query.get("pageToken", ["0"])[0])
            size = min(state.page_size, int(query.get("maxResults", ["1000"])[0]))
            page: dict = {"kind": "storage#objects", "items": items[start:start + size]}
            if start + size < len(items):
                page["nextPageToken"] = str(start + size)
            self._answer(200, page)
            return True

        def do_GET(self):
            if not self._gate("GET"):
                super().do_GET()

        def do_POST(self):
            if not self._gate("POST"):
                super().do_POST()

    return _Gate


class GcsServer:
    def __init__(self, server, url: str, state: GateState):
        self.server, self.url, self.state = server, url, state

    @property
    def env(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.url, "GPUCLUSTER_GCS_RETRY_BASE_S": "0.05"}

    def _call(self, method: str, path: str, data: bytes | None = None, ctype: str = "application/json"):
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={"Content-Type": ctype})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read() or b"{}")

    def make_bucket(self, name: str) -> None:
        self._call("POST", "/storage/v1/b?project=test", json.dumps({"name": name}).encode())

    def put(self, bucket: str, name: str, data: bytes) -> None:
        q = urllib.parse.urlencode({"uploadType": "media", "name": name})
        self._call("POST", f"/upload/storage/v1/b/{bucket}/o?{q}", data, "application/octet-stream")

    def put_tree(self, bucket: str, prefix: str, root: Path) -> dict[str, str]:
        """Upload every file under root to bucket/prefix/; {relative path: sha256}."""
        want = {}
        for p in sorted(root.rglob("*")):
            if p.is_file():
                rel = p.relative_to(root).as_posix()
                self.put(bucket, f"{prefix}/{rel}", p.read_bytes())
                want[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        return want

    def objects(self, bucket: str) -> dict[str, int]:
        """{name: size} of what the bucket really holds (the emulator's own state)."""
        return {n: int(o["size"]) for n, o in self.state.storage.objects.get(bucket, {}).items()}

    def sha256(self, bucket: str, name: str) -> str:
        q = urllib.parse.quote(name, safe="")
        with urllib.request.urlopen(f"{self.url}/storage/v1/b/{bucket}/o/{q}?alt=media", timeout=30) as r:
            return hashlib.sha256(r.read()).hexdigest()


@pytest.fixture
def gcs_server(monkeypatch):
    pytest.importorskip("gcp_storage_emulator", reason="pip install gcp-storage-emulator (the test extra)")
    from gcp_storage_emulator import server as emulator

    state = GateState()
    monkeypatch.setattr(emulator, "RequestHandler", _gate_handler(emulator.RequestHandler, state))
    srv = emulator.create_server("127.0.0.1", 0, in_memory=True)
    srv.start()
    try:
        state.storage = srv._storage
        host, port = srv._api._httpd.server_address[:2]
        yield GcsServer(srv, f"http://{host}:{port}", state)
    finally:
        srv.stop()


class MetadataServer:
    def __init__(self):
        self.requests: list[dict[str, str]] = []
        self.issued = 0
        self.email = "gpuc-demo@my-proj.iam.gserviceaccount.com"
        self.deny_for_s = 0.0
        self.first: float | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                import time

                outer.requests.append(dict(self.headers))
                path = "/computeMetadata/v1/instance/service-accounts/default/token"
                asked = urllib.parse.urlsplit(self.path).path
                outer.first = outer.first if outer.first is not None else time.monotonic()
                if self.headers.get("Metadata-Flavor") != "Google" or self.headers.get("X-Forwarded-For"):
                    status, body = 403, b"Missing required header: Metadata-Flavor"
                elif asked == path.replace("/token", "/email"):
                    status, body = 200, outer.email.encode()
                elif asked == path and time.monotonic() - outer.first < outer.deny_for_s:
                    status, body = 403, (b"Unable to generate access token; IAM returned 403 Forbidden: Permission "
                                         b"'iam.serviceAccounts.getAccessToken' denied on resource")
                elif asked != path:
                    status, body = 404, b"not found"
                else:
                    outer.issued += 1
                    status, body = 200, json.dumps({"access_token": f"tok-{outer.issued}", "expires_in": 3599,
                                                    "token_type": "Bearer"}).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = "%s:%d" % self.httpd.server_address[:2]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def metadata_server():
    srv = MetadataServer()
    yield srv
    srv.stop()
