"""The GCP tag scan: GKE clusters whose `resource_labels` carry `managed-by=gpucluster` (node
pools go with their cluster), each with who made it (owner, user@host, run, since), and their deletion, awaited through GKE's long-running operations.
google-cloud-container is imported inside functions. The shared part (tags, report, dispatch) is
`gpucluster.infra.leftovers`."""

from __future__ import annotations

from typing import Any, Sequence

from gpucluster.domain import Leftover
from gpucluster.errors import GpuclusterError, require
from gpucluster.infra.contract import ScanScope
from gpucluster.infra.leftovers import CLUSTER_TAG, RUN_TAG, Found, ScanReport, wanted, with_marks


def _created(text: Any) -> float | None:
    """A GKE cluster's createTime (RFC 3339, e.g. 2026-11-25T10:02:03+00:00 or ...Z) as epoch seconds."""
    import datetime as _dt

    try:
        return _dt.datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp() if text else None
    except ValueError:
        return None

def gcp_project(flag: str | None = None) -> str | None:
    """The project by the one resolution order (`gcp_access.resolve_project`), or None."""
    from gpucluster.infra.gcp.access import resolve_project

    return resolve_project(flag, None, required=False)[0]


def _gke_client(client: Any = None) -> Any:
    if client is not None:
        return client
    require("google.cloud.container_v1", "gcp")
    from google.cloud import container_v1

    return container_v1.ClusterManagerClient()


def scan(name: str | None = None, run_id: str | None = None, *, project: str | None = None,
             client: Any = None) -> ScanReport:
    report = ScanReport()
    try:
        project = gcp_project(project)
    except GpuclusterError as exc:  # a malformed project name
        report.skipped.append(f"GKE clusters: not checked ({exc.message})")
        return report
    if not project:
        report.skipped.append("GKE clusters: not checked (no Google Cloud project: pass --project, or set "
                              "GOOGLE_CLOUD_PROJECT, or `gcloud config set project`)")
        return report
    try:
        resp = _gke_client(client).list_clusters(parent=f"projects/{project}/locations/-")
    except GpuclusterError:
        raise
    except Exception as exc:  # noqa: BLE001 - google.api_core errors vary
        report.skipped.append(f"GKE clusters in {project}: not checked ({exc})")
        return report
    for cl in resp.clusters:
        labels = dict(cl.resource_labels)
        if not wanted(labels, name, run_id):
            continue
        status = getattr(cl.status, "name", str(cl.status))
        path = f"projects/{project}/locations/{cl.location}/clusters/{cl.name}"
        # STOPPING: GKE is deleting it (a long-running operation, minutes); it still exists and may bill
        deleting = status == "STOPPING"
        detail = f"{status}{' (being deleted)' if deleting else ''} cluster={labels.get(CLUSTER_TAG, '?')}"
        lo = with_marks(Leftover("gke-cluster", path, cl.location, detail, deleting=deleting), labels,
                        _created(getattr(cl, "create_time", None)))  # who made it: owner, user@host, since
        report.found.append(Found(lo, labels.get(CLUSTER_TAG), labels.get(RUN_TAG)))
    return report


def delete(leftovers: list[Leftover], *, client: Any = None, wait_seconds: float = 1800,
               poll_seconds: float = 10.0, clock: Any = None, sleep: Any = None) -> list[str]:
    """Delete GKE clusters (node pools go with them) and poll each long-running delete operation
    (`get_operation` until status DONE, as the GKE API reference describes `projects.locations.operations`)
    within `wait_seconds`; an operation still running past it is an error naming it. A cluster the API
    is already deleting (STOPPING) is not deleted again."""
    import time as _time

    clock, sleep = clock or _time.monotonic, sleep or _time.sleep
    errors = []
    ops: list[tuple[Leftover, str]] = []
    gke = _gke_client(client) if any(lo.kind == "gke-cluster" for lo in leftovers) else None
    for lo in leftovers:
        if lo.kind != "gke-cluster" or lo.deleting:
            continue
        try:
            op = gke.delete_cluster(name=lo.id)
        except Exception as exc:  # noqa: BLE001 - google.api_core errors vary; each delete is tried and reported
            if "NotFound" in type(exc).__name__ or "404" in str(exc):
                continue
            errors.append(f"GKE cluster {lo.id}: {exc}")
            continue
        op_name = getattr(op, "name", None)
        if op_name:
            ops.append((lo, lo.id.split("/clusters/")[0] + f"/operations/{op_name.rsplit('/', 1)[-1]}"))
    end = clock() + wait_seconds
    for lo, op_path in ops:
        while True:
            try:
                op = gke.get_operation(name=op_path)
            except Exception as exc:  # noqa: BLE001 - the scan after this still checks
                errors.append(f"GKE cluster {lo.id}: cannot read its delete operation ({exc})")
                break
            status = getattr(getattr(op, "status", None), "name", str(getattr(op, "status", "")))
            if status == "DONE":
                err = getattr(op, "error", None)
                if err is not None and getattr(err, "message", ""):
                    errors.append(f"GKE cluster {lo.id}: delete failed ({err.message})")
                break
            if clock() >= end:
                errors.append(f"GKE cluster {lo.id}: still deleting after {wait_seconds:.0f} s (operation "
                              f"{op_path} is {status})")
                break
            sleep(poll_seconds)
    return errors


# -- the provisioner's scan and delete (infra.contract.Provisioner), from a typed scope -----------
def scan_scope(name: str | None, run_id: str | None, scope: ScanScope) -> ScanReport:
    return scan(name, run_id, project=scope.project, client=scope.clients.get("gke_client"))


def delete_in(leftovers: Sequence[Leftover], scope: ScanScope, wait_seconds: float | None) -> list[str]:
    return delete(list(leftovers), client=scope.clients.get("gke_client"),
                  wait_seconds=1800 if wait_seconds is None else wait_seconds)
