"""The marks a Google service account carries in its description (it takes no labels): who made it
and for which cluster and run, written by `component_access.account_description` and read back by the
leftover scan (`leftovers.scan_accounts`) as it reads other resources' labels. No cloud SDK is
imported here (the scan runs in `gc` and `down`)."""

from __future__ import annotations

DESCRIPTION_KEYS = ("managed-by", "gpucluster-cluster", "gpucluster-owner", "gpucluster-stack", "gpucluster-run",
                    "gpucluster-user", "gpucluster-host")


def description_marks(cluster_name: str, labels: dict[str, str]) -> str:
    """"managed-by=gpucluster, gpucluster-cluster=NAME, gpucluster-owner=ID, ...": the marks a
    service account carries where it takes no labels (who made it first: the description is cut at 256 characters)."""
    marks = {"managed-by": "gpucluster", "gpucluster-cluster": cluster_name,
             **{k: v for k, v in labels.items() if k in DESCRIPTION_KEYS[2:]}}
    return ", ".join(f"{k}={marks[k]}" for k in DESCRIPTION_KEYS if marks.get(k))


def marks_from_description(text: str) -> dict[str, str]:
    """The marks `description_marks` wrote, as a tag dict (what a scan compares like labels)."""
    out = {}
    for part in str(text or "").split(":", 1)[0].split(","):
        key, sep, value = part.strip().partition("=")
        if sep and key in DESCRIPTION_KEYS:
            out[key] = value.strip()
    return out
