"""Small JSON objects kept beside the Pulumi state, under `<state URL>/.gpucluster/` (a team's budget
and its members' spend records: gpucluster/costing/teambudget.py). Pulumi's own backend keeps its files
under `.pulumi/` of the same URL ("State and backends", Pulumi docs) and reads nothing else there.

`open_store(url)` gives a store of the state URL's kind, each with the same four calls: `put(name,
bytes)` (the whole object, replaced), `get(name)` (None when absent), `delete(name)` (absent: fine),
`list(prefix)` ([(name, last modified, epoch seconds)], every page). Names are relative to the
`.gpucluster/` folder.

- `file:///PATH`: files; a write goes to a temporary file first and is renamed into place (rename(2)
  is atomic, so a reader sees the old object or the new one, never a part); the modification time
  is the file's mtime.
- `s3://BUCKET[/PREFIX][?region=R]`: boto3 (PutObject, GetObject, DeleteObject, ListObjectsV2 with its
  paginator: at most 1,000 keys a page, https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListObjectsV2.html;
  LastModified). S3 is strongly consistent for reads and lists after a write or delete
  (https://aws.amazon.com/s3/consistency/). AWS_ENDPOINT_URL_S3 is honoured by boto3 itself.
- `gs://BUCKET[/PREFIX]`: the Cloud Storage JSON API (objects insert with uploadType=media, get with
  alt=media, delete, list following nextPageToken: a page "may return fewer" items than asked,
  https://cloud.google.com/storage/docs/json_api/v1/objects/list; `updated`), with the retries GCS
  asks for on 408/429/5xx (https://cloud.google.com/storage/docs/retry-strategy). Listing is strongly
  consistent (https://cloud.google.com/storage/docs/consistency). Credentials: application default
  (google-auth); STORAGE_EMULATOR_HOST points it at an emulator, and then none are sent.
- anything else (azblob://, Pulumi Cloud): no store (`UsageError`, exit 2, naming what is allowed).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpucluster.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

# Any: boto3 builds its clients at run time; they carry no types
S3Client = Any

FOLDER = ".gpucluster"
FORMS = "s3://BUCKET[/PREFIX], gs://BUCKET[/PREFIX] or file:///PATH"


class ObjectStore(Protocol):
    """The four calls every store has (the module's docstring says what each does)."""

    def put(self, name: str, data: bytes) -> None: ...

    def get(self, name: str) -> bytes | None: ...

    def delete(self, name: str) -> None: ...

    def list(self, prefix: str) -> list[tuple[str, float]]: ...


def open_store(url: str) -> ObjectStore:
    """The store of objects under the state `url`'s `.gpucluster/` folder."""
    if url.startswith("file://"):
        return FileStore(Path(urllib.parse.urlsplit(url).path) / FOLDER)
    if url.startswith(("s3://", "gs://")):
        parts = urllib.parse.urlsplit(url)
        prefix = "/".join(p for p in (parts.path.strip("/"), FOLDER) if p)
        if url.startswith("s3://"):
            regions = urllib.parse.parse_qs(parts.query).get("region") or []
            region = regions[0] if regions else None
            return S3Store(parts.netloc, prefix, region)
        return GcsStore(parts.netloc, prefix)
    raise UsageError(f"a team budget is kept in the shared state, and {url.split('?')[0]!r} is not one it can use: "
                     f"{FORMS}")


class FileStore:
    def __init__(self, root: Path):
        self.root = root

    def _path(self, name: str) -> Path:
        return self.root / name

    def put(self, name: str, data: bytes) -> None:
        path = self._path(name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{random.getrandbits(32):08x}")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except OSError as exc:
            raise ConfigError(f"the shared state's {FOLDER} folder {str(self.root)!r} cannot be written "
                              f"({exc.strerror or exc})") from None

    def get(self, name: str) -> bytes | None:
        try:
            return self._path(name).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConfigError(f"{str(self._path(name))!r} cannot be read ({exc.strerror or exc})") from None

    def delete(self, name: str) -> None:
        try:
            self._path(name).unlink()
        except FileNotFoundError:
            pass

    def list(self, prefix: str) -> list[tuple[str, float]]:
        folder = self._path(prefix)
        if not folder.is_dir():
            return []
        out = []
        for p in folder.iterdir():
            if p.is_file() and not p.name.startswith("."):
                try:
                    out.append((f"{prefix.rstrip('/')}/{p.name}", p.stat().st_mtime))
                except FileNotFoundError:  # renamed or removed since the listing
                    pass
        return sorted(out)


class S3Store:
    def __init__(self, bucket: str, prefix: str, region: str | None):
        self.bucket, self.prefix, self.region = bucket, prefix, region
        self._client: S3Client | None = None

    def client(self) -> S3Client:
        if self._client is None:
            try:
                import boto3
            except ImportError:
                raise ConfigError("a team budget in an s3:// state needs boto3: pip install 'gpucluster[aws]'") from None
            self._client = boto3.client("s3", region_name=self.region or os.environ.get("AWS_REGION")
                                        or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1")
        return self._client

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def _failed(self, what: str, exc: Exception) -> ConfigError:
        return ConfigError(f"the shared state s3://{self.bucket}/{self.prefix}: {what} failed ({exc})")

    def put(self, name: str, data: bytes) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client().put_object(Bucket=self.bucket, Key=self._key(name), Body=data,
                                     ContentType="application/json")
        except (BotoCoreError, ClientError) as exc:
            raise self._failed(f"PutObject {name}", exc) from None

    def get(self, name: str) -> bytes | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return bytes(self.client().get_object(Bucket=self.bucket, Key=self._key(name))["Body"].read())
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code")) in ("NoSuchKey", "404"):
                return None
            raise self._failed(f"GetObject {name}", exc) from None
        except BotoCoreError as exc:
            raise self._failed(f"GetObject {name}", exc) from None

    def delete(self, name: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client().delete_object(Bucket=self.bucket, Key=self._key(name))
        except (BotoCoreError, ClientError) as exc:
            raise self._failed(f"DeleteObject {name}", exc) from None

    def list(self, prefix: str) -> list[tuple[str, float]]:
        from botocore.exceptions import BotoCoreError, ClientError

        out = []
        try:
            pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                             Prefix=self._key(prefix.rstrip("/") + "/"))
            for page in pages:
                for o in page.get("Contents", []):
                    out.append((o["Key"][len(self.prefix) + 1:], o["LastModified"].timestamp()))
        except (BotoCoreError, ClientError) as exc:
            raise self._failed(f"ListObjectsV2 {prefix}", exc) from None
        return sorted(out)


class GcsStore:
    RETRY = (408, 429, 500, 502, 503, 504)
    ATTEMPTS = 6

    def __init__(self, bucket: str, prefix: str):
        self.bucket, self.prefix = bucket, prefix
        host = os.environ.get("STORAGE_EMULATOR_HOST")
        self.base = (host if "://" in host else f"http://{host}") if host else "https://storage.googleapis.com"
        self.anonymous = bool(host)
        self._creds: Credentials | None = None

    def _token(self) -> str | None:
        if self.anonymous:
            return None
        try:
            import google.auth
            import google.auth.transport.requests
        except ImportError:
            raise ConfigError("a team budget in a gs:// state needs google-auth: pip install 'gpucluster[gcp]'") from None
        if self._creds is None:
            self._creds, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/devstorage.read_write"])
        if not self._creds.valid:
            self._creds.refresh(google.auth.transport.requests.Request())
        return str(self._creds.token)

    def _call(self, method: str, path: str, query: dict[str, str] | None = None, body: bytes | None = None,
              missing_ok: bool = False) -> bytes | None:
        url = self.base + path + ("?" + urllib.parse.urlencode(query) if query else "")
        base_s = float(os.environ.get("GPUCLUSTER_GCS_RETRY_BASE_S") or 1)
        for attempt in range(self.ATTEMPTS):
            headers = {"Content-Type": "application/octet-stream"} if body is not None else {}
            token = self._token()
            if token:
                headers["Authorization"] = f"Bearer {token}"
            try:
                req = urllib.request.Request(url, data=body, headers=headers, method=method)
                with urllib.request.urlopen(req, timeout=60) as r:
                    return bytes(r.read())
            except urllib.error.HTTPError as exc:
                if exc.code == 404 and missing_ok:
                    return None
                if exc.code not in self.RETRY or attempt + 1 == self.ATTEMPTS:
                    why = exc.read()[:300].decode("utf-8", "replace")
                    raise ConfigError(f"the shared state gs://{self.bucket}/{self.prefix}: {method} {path} answered "
                                      f"{exc.code} ({why.strip()})") from None
            except OSError as exc:
                if attempt + 1 == self.ATTEMPTS:
                    raise ConfigError(f"the shared state gs://{self.bucket}: cannot reach {self.base} ({exc})") from None
            time.sleep(min(32.0, base_s * 2 ** attempt) * (0.5 + random.random() / 2))
        return None  # not reached

    def _object(self, name: str) -> str:
        return (f"/storage/v1/b/{urllib.parse.quote(self.bucket, safe='')}/o/"
                f"{urllib.parse.quote(f'{self.prefix}/{name}', safe='')}")

    def put(self, name: str, data: bytes) -> None:
        self._call("POST", f"/upload/storage/v1/b/{urllib.parse.quote(self.bucket, safe='')}/o",
                   {"uploadType": "media", "name": f"{self.prefix}/{name}"}, data)

    def get(self, name: str) -> bytes | None:
        return self._call("GET", self._object(name), {"alt": "media"}, missing_ok=True)

    def delete(self, name: str) -> None:
        self._call("DELETE", self._object(name), missing_ok=True)

    def list(self, prefix: str) -> list[tuple[str, float]]:
        out, token = [], None
        path = f"/storage/v1/b/{urllib.parse.quote(self.bucket, safe='')}/o"
        while True:
            query = {"prefix": f"{self.prefix}/{prefix.rstrip('/')}/", "maxResults": "1000"}
            if token:
                query["pageToken"] = token
            page = json.loads(self._call("GET", path, query) or b"{}")
            for o in page.get("items") or []:
                stamp = str(o.get("updated") or "")  # RFC 3339; absent: taken as now (read, never skipped)
                updated = (dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp
                           else time.time())
                out.append((o["name"][len(self.prefix) + 1:], updated))
            token = page.get("nextPageToken")
            if not token:
                return sorted(out)
