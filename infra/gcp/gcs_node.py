"""Run IN a GKE pod (its source is sent through the Kubernetes exec API as `python -c`): GCS in and
out with the pod's own credentials, the Google service account that Workload Identity maps its
Kubernetes service account to; never keys copied here. Standard library only (the pytorch image
has neither google-cloud-storage nor gcloud); Python 3.8+.

    python -c SOURCE pull gs://bucket/prefix DEST    every object under prefix/ -> DEST/<rest of name>
    python -c SOURCE push SRC gs://bucket/prefix     every regular file under SRC -> prefix/<relative path>

The Cloud Storage JSON API:
- list: GET /storage/v1/b/BUCKET/o?prefix=P/&pageToken=T, following nextPageToken
  (https://cloud.google.com/storage/docs/json_api/v1/objects/list);
- download: GET /storage/v1/b/BUCKET/o/NAME?alt=media
  (https://cloud.google.com/storage/docs/json_api/v1/objects/get), checked against the listed size
  and md5Hash (absent for composite objects) unless the object is stored gzip-encoded (served
  decompressed: https://cloud.google.com/storage/docs/transcoding);
- upload: POST /upload/storage/v1/b/BUCKET/o?uploadType=media&name=NAME&ifGenerationMatch=0
  (https://cloud.google.com/storage/docs/json_api/v1/objects/insert, single-request upload); the
  precondition makes a retry idempotent ("Retry strategy", below): a 412 on a retry means an
  earlier attempt stored the object; on the first attempt, that it already existed.
The access token: the metadata server, which on GKE with Workload Identity is the GKE metadata
server answering for the pod's service account
(http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token with
`Metadata-Flavor: Google`, https://cloud.google.com/compute/docs/access/authenticate-workloads#applications);
GCE_METADATA_HOST (host[:port]) overrides the host, as google-auth honours it. It can take a few
seconds to answer in a new pod (https://cloud.google.com/kubernetes-engine/docs/concepts/workload-identity#metadata_server),
so connection failures are retried for about 30 s. STORAGE_EMULATOR_HOST (http://host:port, or
host:port) replaces https://storage.googleapis.com, and then no token is fetched (google-cloud-storage
uses anonymous credentials with an emulator): that is how tests point a pod at a local GCS.
Retries: 408, 429, 5xx and connection errors, exponential backoff with jitter, 1 s doubling to
32 s, 6 attempts ("Retry strategy", https://cloud.google.com/storage/docs/retry-strategy); a 401
fetches a fresh token once. A 403 (from GCS, or from the metadata server minting the token) is
retried the same way for up to GRANT_WAIT_S from the first one: the cluster's grants are new, and IAM
changes "typically take about 2 minutes to take effect, in some cases 7 minutes or more" (IAM docs,
"Access change propagation", https://cloud.google.com/iam/docs/access-change-propagation). Past it, the
failure names the bucket, the prefix or object, the principal (the metadata server's `email` of the
pod's account) and what Workload Identity needs.

The last stdout line is one JSON object: tool, files, bytes (push: total_files, and failed, a list
of "path: why"). Exit 0: everything done; 3: some files failed (push); 4: nothing done (the reason
on stderr).
"""

import base64
import hashlib
import http.client
import json
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

PARTIAL_RC, FAILED_RC = 3, 4
TOOL = "gcs-json-api"
API = "https://storage.googleapis.com"
TOKEN_PATH = "/computeMetadata/v1/instance/service-accounts/default/token"
RETRY_STATUS = (408, 429, 500, 502, 503, 504)
ATTEMPTS = 6
EMAIL_PATH = "/computeMetadata/v1/instance/service-accounts/default/email"
GRANT_WAIT_S = float(os.environ.get("GPUCLUSTER_GCS_GRANT_WAIT_S") or 420)  # IAM propagation: 7+ minutes
CHUNK = 1 << 20
THREADS = 8
WORKLOAD_IDENTITY = ("the pod's Kubernetes service account must be bound to the cluster's Google service account "
                     "(Workload Identity: annotated iam.gke.io/gcp-service-account, and granted "
                     "roles/iam.workloadIdentityUser on it), which must be granted this bucket and prefix")


class Failure(Exception):
    def __init__(self, message, status=None):
        Exception.__init__(self, message)
        self.status = status


def split(url):
    bucket, _, prefix = url[len("gs://"):].partition("/")
    return bucket, prefix.strip("/")


def backoff(attempt):
    base = float(os.environ.get("GPUCLUSTER_GCS_RETRY_BASE_S", "1"))
    return min(32.0, base * (2 ** attempt)) * (0.5 + random.random() / 2)


class Grants:
    """The window in which a 403 is taken for a grant still propagating: GRANT_WAIT_S from the first."""

    def __init__(self, wait_s=None):
        self.wait_s = GRANT_WAIT_S if wait_s is None else wait_s
        self.first = None
        self.lock = threading.Lock()

    def pending(self):
        """True while a 403 may still be a new grant on its way (starts the window at the first call)."""
        with self.lock:
            now = time.monotonic()
            self.first = now if self.first is None else self.first
            return now - self.first < self.wait_s


class Tokens:
    """Access tokens from the metadata server, cached until 5 minutes before they expire."""

    def __init__(self, host=None, grants=None):
        host = host or os.environ.get("GCE_METADATA_HOST") or os.environ.get("GCE_METADATA_ROOT") \
            or "metadata.google.internal"
        self.url = "http://%s%s" % (host, TOKEN_PATH)
        self.email_url = "http://%s%s" % (host, EMAIL_PATH)
        self.grants = grants or Grants()
        self.lock = threading.Lock()
        self.token, self.expires = None, 0.0

    def email(self):
        """The pod's Google service account (who the grants must name), or a placeholder."""
        req = urllib.request.Request(self.email_url, headers={"Metadata-Flavor": "Google"})
        try:
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=5) as r:
                return r.read().decode().strip() or "the pod's service account"
        except (OSError, ValueError):
            return "the pod's service account (the metadata server did not say which)"

    def get(self):
        with self.lock:
            if self.token is None or time.time() > self.expires - 300:
                self.token, self.expires = self.fetch()
            return self.token

    def invalidate(self, token):
        with self.lock:
            if self.token == token:
                self.token = None

    def fetch(self):
        req = urllib.request.Request(self.url, headers={"Metadata-Flavor": "Google"})
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
        deadline, attempt = time.monotonic() + 30, 0
        while True:
            try:
                with direct.open(req, timeout=10) as r:
                    got = json.loads(r.read().decode())
                return got["access_token"], time.time() + float(got.get("expires_in", 300))
            except urllib.error.HTTPError as exc:
                body = exc.read()[:300].decode("utf-8", "replace").strip()
                if exc.code in RETRY_STATUS and time.monotonic() < deadline:
                    pass
                elif exc.code == 403 and self.grants.pending():  # the Workload Identity grant is new
                    deadline = max(deadline, time.monotonic() + 1)
                else:
                    raise Failure("the metadata server (%s) answered %d %s: %s; %s" % (
                        self.url, exc.code, exc.reason, body, WORKLOAD_IDENTITY), exc.code)
            except (OSError, ValueError, KeyError) as exc:
                if time.monotonic() >= deadline:
                    raise Failure("no access token from the metadata server (%s): %s: %s (is this a GKE pod "
                                  "with Workload Identity, GKE_METADATA on its node pool?)"
                                  % (self.url, type(exc).__name__, exc))
            time.sleep(min(backoff(attempt), max(0.1, deadline - time.monotonic())))
            attempt += 1


class Gcs:
    """The few JSON API calls needed, with retries. `tokens` None: anonymous (an emulator)."""

    def __init__(self, base=API, tokens=None, grants=None):
        self.base, self.tokens = base.rstrip("/"), tokens
        self.grants = grants or (tokens.grants if tokens is not None else Grants())

    @classmethod
    def from_env(cls):
        host = os.environ.get("STORAGE_EMULATOR_HOST")
        if host:
            return cls(host if "://" in host else "http://" + host, None)
        return cls(API, Tokens())

    def principal(self):
        return self.tokens.email() if self.tokens is not None else "anonymous (a storage emulator)"

    def call(self, method, path, bucket, query=None, upload=None, out=None, target=None):
        """JSON of the answer (or the bytes written to `out`, a path); Failure when it failed for
        good. `upload`: a local file sent as the body (with ifGenerationMatch=0: None when a retry
        finds the object an earlier attempt stored)."""
        url = self.base + path + ("?" + urllib.parse.urlencode(query) if query else "")
        refreshed, attempt = False, 0
        while True:
            headers, token = self._headers(upload)
            body = open(upload, "rb") if upload is not None else None
            try:
                req = urllib.request.Request(url, data=body, headers=headers, method=method)
                with urllib.request.urlopen(req, timeout=300) as r:
                    if out is None:
                        return json.loads(r.read().decode() or "{}")
                    return save(r, out)
            except urllib.error.HTTPError as exc:
                step = self._after_http_error(exc, token, refreshed, attempt, upload, (path, bucket, target))
                if step == "refresh":
                    refreshed = True
                    continue
                if step == "stored":
                    return None  # an earlier attempt stored it (ifGenerationMatch=0)
                if step == "grant":  # a new grant on its way: wait for it
                    time.sleep(min(32.0, backoff(min(attempt, 5))))
                    attempt += 1
                    continue
            except (OSError, ValueError, http.client.HTTPException) as exc:  # resets, timeouts, a cut-off body
                if attempt + 1 >= ATTEMPTS:
                    raise Failure("cannot reach %s: %s: %s" % (self.base, type(exc).__name__, exc)) from None
            finally:
                if body is not None:
                    body.close()
            time.sleep(backoff(attempt))
            attempt += 1

    def _headers(self, upload):
        """The headers of one attempt, and the token they carry (None without tokens)."""
        headers, token = {}, None
        if self.tokens is not None:
            token = self.tokens.get()
            headers["Authorization"] = "Bearer " + token
        if upload is not None:
            headers["Content-Type"] = "application/octet-stream"
            headers["Content-Length"] = str(os.path.getsize(upload))
        return headers, token

    def _after_http_error(self, exc, token, refreshed, attempt, upload, where):
        """What an HTTP error means for `call`: "refresh" (a stale token, dropped: once), "stored" (a
        retried upload finds the object), "grant" (403 while a new grant is on its way), "retry" (a
        status worth another attempt); Failure when it failed for good."""
        status, why = exc.code, error_text(exc)
        if status == 401 and token is not None and not refreshed:
            self.tokens.invalidate(token)
            return "refresh"
        if status == 412 and upload is not None and attempt > 0:
            return "stored"
        if status == 403 and self.grants.pending():
            return "grant"
        if status not in RETRY_STATUS or attempt + 1 >= ATTEMPTS:
            path, bucket, target = where
            who = self.principal() if status in (401, 403) else None
            raise Failure(explain(status, why, path, bucket, target, who, self.grants.wait_s), status) from None
        return "retry"

    def list(self, bucket, prefix):
        """[(name, size, md5Hash or None, gzip)] of every object whose name starts with `prefix`."""
        out, token = [], None
        path = "/storage/v1/b/%s/o" % urllib.parse.quote(bucket, safe="")
        while True:
            q = {"prefix": prefix, "maxResults": "1000",
                 "fields": "items(name,size,md5Hash,contentEncoding),nextPageToken"}
            if token:
                q["pageToken"] = token
            page = self.call("GET", path, bucket, q, target="gs://%s/%s" % (bucket, prefix.rstrip("/")))
            for o in page.get("items") or []:
                out.append((o["name"], int(o.get("size", 0)), o.get("md5Hash"), o.get("contentEncoding") == "gzip"))
            token = page.get("nextPageToken")
            if not token:
                return out

    def download(self, bucket, name, target):
        path = "/storage/v1/b/%s/o/%s" % (urllib.parse.quote(bucket, safe=""), urllib.parse.quote(name, safe=""))
        return self.call("GET", path, bucket, {"alt": "media"}, out=target, target="gs://%s/%s" % (bucket, name))

    def upload(self, bucket, name, src):
        path = "/upload/storage/v1/b/%s/o" % urllib.parse.quote(bucket, safe="")
        q = {"uploadType": "media", "name": name, "ifGenerationMatch": "0"}
        return self.call("POST", path, bucket, q, upload=src, target="gs://%s/%s" % (bucket, name))


def save(r, out):
    """The answer's body -> the file `out`; its size. A local error is final (Failure), a network
    one (OSError, HTTPException while reading) goes back to the retry loop."""
    try:
        f = open(out, "wb")
    except OSError as exc:
        raise Failure("cannot write %s: %s" % (out, exc)) from None
    n = 0
    with f:
        while True:
            block = r.read(CHUNK)
            if not block:
                return n
            try:
                f.write(block)
            except OSError as exc:
                raise Failure("cannot write %s: %s" % (out, exc)) from None
            n += len(block)


def explain(status, why, path, bucket, target=None, who=None, waited=0.0):
    if status in (401, 403):
        return "%d from GCS for bucket %s (%s) as %s%s: %s; %s" % (
            status, bucket, target or "gs://%s" % bucket, who or "the pod's service account",
            ", still after %.0f s (IAM grants take up to 7 minutes to apply)" % waited if status == 403 and waited
            else "", why, WORKLOAD_IDENTITY)
    if status == 404 and path.endswith("/o"):  # a list or an upload: the bucket is not there
        return "bucket %s does not exist (404 from GCS): %s" % (bucket, why)
    if status == 412:
        return "the object already exists (412 from GCS; outputs are never overwritten): %s" % why
    return "%d from GCS for bucket %s: %s" % (status, bucket, why)


def error_text(exc):
    raw = exc.read()[:2000].decode("utf-8", "replace")
    try:
        return json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return (raw.strip().splitlines() or [exc.reason or ""])[0][:300]


def local_files(root):
    """[(relative path, size)] of the regular files under root (symlinks not followed)."""
    out = []
    for d, _dirs, names in os.walk(root):
        for name in sorted(names):
            p = os.path.join(d, name)
            if os.path.isfile(p) and not os.path.islink(p):
                out.append((os.path.relpath(p, root).replace(os.sep, "/"), os.path.getsize(p)))
    return sorted(out)


def safe_rel(rel):
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and "\0" not in rel and not any(p in ("", ".", "..") for p in parts)


def md5_hasher():
    try:
        return hashlib.md5(usedforsecurity=False)  # a checksum, allowed where FIPS mode refuses md5
    except TypeError:  # Python < 3.9
        return hashlib.md5()


def fail(msg):
    sys.stderr.write(msg.strip()[-2000:] + "\n")
    sys.exit(FAILED_RC)


def pull(gcs, url, dest):
    """Every object under the prefix -> dest; (files, bytes). Failure on the first object that
    cannot be fetched; every name is checked before anything is written."""
    bucket, prefix = split(url)
    base = prefix + "/" if prefix else ""
    todo = []
    for name, size, md5, gz in gcs.list(bucket, base):
        rel = name[len(base):]
        if (rel == "" or rel.endswith("/")) and size == 0:
            continue  # a "folder" placeholder made by the console (or the prefix's own)
        if not safe_rel(rel):
            raise Failure("refusing object name %r: it would land outside %s" % (name, dest))
        todo.append((name, rel, size, md5, gz))
    if not todo:
        raise Failure("%s holds no objects: check the bucket and prefix" % url)
    os.makedirs(dest, exist_ok=True)

    def one(item):
        name, rel, size, md5, gz = item
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = target + ".gpucluster-part"
        try:
            n = gcs.download(bucket, name, tmp)
            if not gz and n != size:
                raise Failure("gs://%s/%s: got %d bytes of %d" % (bucket, name, n, size))
            if not gz and md5:
                h = md5_hasher()
                with open(tmp, "rb") as f:
                    for block in iter(lambda: f.read(CHUNK), b""):
                        h.update(block)
                if base64.b64encode(h.digest()).decode() != md5:
                    raise Failure("gs://%s/%s: the MD5 of the bytes received differs from the object's" % (bucket, name))
            os.replace(tmp, target)
        except BaseException:  # Ctrl-C and kills included: no partial download is left behind
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
        return n

    stop = threading.Event()  # the first failure ends the pull: the others are not started

    def guarded(item):
        if stop.is_set():
            return 0
        try:
            return one(item)
        except BaseException:  # any failure in one worker stops the others before it is raised
            stop.set()
            raise

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        sizes = list(pool.map(guarded, todo))
    return len(todo), sum(sizes)


def push(gcs, src, url, todo):
    """Upload each (rel, size) of `todo`; the list of "rel: why" that failed."""
    bucket, prefix = split(url)
    base = prefix + "/" if prefix else ""

    def one(item):
        rel, size = item
        try:
            got = gcs.upload(bucket, base + rel, os.path.join(src, rel))
        except Failure as exc:
            return "%s: %s" % (rel, str(exc)[:400])
        except OSError as exc:
            return "%s: %s: %s" % (rel, type(exc).__name__, exc)
        if got is not None and "size" in got and int(got["size"]) != size:
            return "%s: GCS stored %s bytes of %d" % (rel, got["size"], size)
        return None

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        return [f for f in pool.map(one, todo) if f]


def main(argv):
    mode, a, b = argv[1], argv[2], argv[3]
    gcs = Gcs.from_env()
    if mode == "pull":
        try:
            files, nbytes = pull(gcs, a, b)
        except Failure as exc:
            fail("reading %s failed: %s" % (a, exc))
        except OSError as exc:
            fail("reading %s failed: %s: %s" % (a, type(exc).__name__, exc))
        print(json.dumps({"tool": TOOL, "files": files, "bytes": nbytes}))
        return 0
    todo = local_files(a) if os.path.isdir(a) else []
    failed = push(gcs, a, b, todo) if todo else []
    bad = {f.split(": ", 1)[0] for f in failed}
    ok = [(rel, s) for rel, s in todo if rel not in bad]
    print(json.dumps({"tool": TOOL, "files": len(ok), "bytes": sum(s for _, s in ok), "total_files": len(todo),
                      "failed": failed}))
    return 0 if not failed else (PARTIAL_RC if ok else FAILED_RC)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
