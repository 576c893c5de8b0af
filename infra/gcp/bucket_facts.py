"""`Operations.bucket_facts` for `gs://` URLs: the bucket's region and the bytes under the URL's prefix,
for placement's egress price (gpucluster.plan.egress), read with the caller's credentials through the
Cloud Storage JSON API (the same REST client as the preflight, `preflight.Google`).

- `buckets.get` gives `location` upper-case ("US-CENTRAL1") and `locationType` "region",
  "dual-region" or "multi-region" (https://cloud.google.com/storage/docs/json_api/v1/buckets); only a
  regional bucket has one region (a dual- or multi-region one: None, its crossing not known).
- `objects.list` pages its `items` (at most 1,000 a page, "may return fewer") with `nextPageToken`
  until the last, each item's `size` a decimal string (uint64)
  (https://cloud.google.com/storage/docs/json_api/v1/objects/list); past `max_pages` pages the size
  is not counted (None).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpucluster.errors import GpuclusterError

if TYPE_CHECKING:
    from .preflight import GoogleApi


def bucket_facts(url: str, google: GoogleApi | None = None, max_pages: int = 100) -> tuple[str | None, int | None]:
    from .access import GcpAuthError
    from .gcs import split
    from .preflight import STORAGE, ApiError, Google

    bucket, prefix = split(url)
    try:
        google = google if google is not None else Google()
        meta = google.get(f"{STORAGE}/b/{bucket}", [("fields", "location,locationType")])
        region = str(meta.get("location") or "").lower() if meta.get("locationType") == "region" else None
        size, token = 0, None
        for _ in range(max_pages):
            params = [("prefix", prefix), ("fields", "items(size),nextPageToken")]
            page = google.get(f"{STORAGE}/b/{bucket}/o", params + ([("pageToken", token)] if token else []))
            size += sum(int(str(o.get("size") or 0)) for o in page.get("items") or ())
            token = page.get("nextPageToken")
            if not token:
                return region or None, size
        return region or None, None
    except ApiError as exc:
        raise GpuclusterError(f"gs://{bucket}: {exc.status} {exc.message}") from None
    except GcpAuthError as exc:
        raise GpuclusterError(f"gs://{bucket}: {exc.message}") from None
