"""The GCP tag scan: GKE clusters whose `resource_labels` carry `managed-by=gpucluster` (node
pools go with their cluster), each with who made it (owner, user@host, run, since), and their
deletion, awaited through GKE's long-running operations; and the Google service accounts the
clusters' pods use for Cloud Storage (`gpuc-<cluster>`), which take no labels: they are known by
their id prefix and the marks in their description (`managed-by=gpucluster,
gpucluster-cluster=NAME, gpucluster-owner=ID, ..., buckets=A,B`, written by `component_access`).
Deleting one removes its grants on those buckets first (IAM keeps a deleted account's bindings as
`deleted:serviceAccount:...` members), then the account (its Workload Identity binding is on the
account and goes with it). After a failed destroy, `down`, `gc` and the next run with the same name
(whose account id would be taken) find it. google-cloud-container is imported inside functions;
the IAM and Cloud Storage calls are REST (`preflight.Google`). The shared part (tags, report,
dispatch) is `gpucluster.infra.leftovers`."""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence, cast

from gpucluster.domain import Leftover
from gpucluster.errors import GpuclusterError, require
from gpucluster.infra.contract import ScanScope
from gpucluster.infra.leftovers import CLUSTER_TAG, RUN_TAG, Found, ScanReport, wanted, with_marks

from .marks import marks_from_description
from .preflight import IAM, Google, GoogleApi

# Any: google-cloud-container's ClusterManagerClient and the proto-plus messages it answers with
# (Cluster, Operation) are read by attribute here, and tests hand in stand-ins with those attributes
GkeClient = Any
GkeCluster = Any


def _created(text: object) -> float | None:
    """A GKE cluster's createTime (RFC 3339, e.g. 2026-11-25T10:02:03+00:00 or ...Z) as epoch seconds."""
    import datetime as _dt

    try:
        return _dt.datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp() if text else None
    except ValueError:
        return None

def _hourly(cl: GkeCluster) -> str | None:
    """At most what a GKE cluster bills per hour, from the price catalog: the cluster fee, and each
    node pool at its starting size (`initialNodeCount`: a pool the autoscaler shrank costs less) of
    its machine type and GPUs, spot where the pool is. None when a part has no price."""
    from decimal import Decimal

    from gpucluster.catalog.prices import load_catalog, normalize_gpu

    from .prices import n1_row

    location = str(getattr(cl, "location", "") or "")
    region = location if location.count("-") <= 1 else location.rsplit("-", 1)[0]  # us-central1-a -> us-central1
    try:
        catalog = load_catalog()
        total = catalog.get("gcp", region, "cluster-fee", "gke").price
        for pool in getattr(cl, "node_pools", None) or ():
            cfg = pool.config
            market = "spot" if getattr(cfg, "spot", False) or getattr(cfg, "preemptible", False) else "on-demand"
            per_node = n1_row(catalog, region, str(cfg.machine_type), market).price
            for acc in getattr(cfg, "accelerators", None) or ():
                gpu = normalize_gpu(str(acc.accelerator_type), catalog.items("gcp", "gpu"))
                per_node += catalog.get("gcp", region, "gpu", gpu, market).price * int(acc.accelerator_count)
            total += per_node * int(getattr(pool, "initial_node_count", 0) or 0)
    except (GpuclusterError, AttributeError, TypeError, ValueError):  # a part with no price: say none
        return None
    return format(Decimal(total).quantize(Decimal("0.0001")).normalize(), "f")


def gcp_project(flag: str | None = None) -> str | None:
    """The project by the one resolution order (`gcp_access.resolve_project`), or None."""
    from gpucluster.infra.gcp.access import resolve_project

    return resolve_project(flag, None, required=False)[0]


def _gke_client(client: GkeClient | None = None) -> GkeClient:
    if client is not None:
        return client
    require("google.cloud.container_v1", "gcp")
    from google.cloud import container_v1

    return container_v1.ClusterManagerClient()


def scan(name: str | None = None, run_id: str | None = None, *, project: str | None = None,
             client: GkeClient | None = None) -> ScanReport:
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
                        _created(getattr(cl, "create_time", None)),  # who made it: owner, user@host, since
                        _hourly(cl))
        report.found.append(Found(lo, labels.get(CLUSTER_TAG), labels.get(RUN_TAG)))
    return report


def delete(leftovers: list[Leftover], *, client: GkeClient | None = None, wait_seconds: float = 1800,
               poll_seconds: float = 10.0, clock: Callable[[], float] | None = None,
               sleep: Callable[[float], None] | None = None) -> list[str]:
    """Delete GKE clusters (node pools go with them) and poll each long-running delete operation
    (`get_operation` until status DONE, as the GKE API reference describes `projects.locations.operations`)
    within `wait_seconds`; an operation still running past it is an error naming it. A cluster the API
    is already deleting (STOPPING) is not deleted again."""
    import time as _time

    clock, sleep = clock or _time.monotonic, sleep or _time.sleep
    errors: list[str] = []
    ops: list[tuple[Leftover, str]] = []
    gke = _gke_client(client) if any(lo.kind == "gke-cluster" for lo in leftovers) else None
    if gke is None:  # no cluster among them: nothing here to delete
        return errors
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
                if err is not None and getattr(err, "message", None):
                    errors.append(f"GKE cluster {lo.id}: delete failed ({err.message})")
                break
            if clock() >= end:
                errors.append(f"GKE cluster {lo.id}: still deleting after {wait_seconds:.0f} s (operation "
                              f"{op_path} is {status})")
                break
            sleep(poll_seconds)
    return errors


# -- the pods' service accounts (no labels: id prefix and description markers) -------------------
STORAGE = "https://storage.googleapis.com/storage/v1"
ACCOUNT_PREFIX = "gpuc-"  # gcs.account_id
_MARK = re.compile(r"(managed-by|gpucluster-cluster|gpucluster-run|buckets)=([a-z0-9._,-]+)")


def markers(description: str) -> dict[str, str]:
    """The key=value markers of a service account's description (what stands for its labels)."""
    return {k: v.rstrip(",.") for k, v in _MARK.findall(description or "")}


def _google(client: GoogleApi | None) -> GoogleApi:
    if client is not None:
        return client
    return Google()


def scan_accounts(name: str | None, run_id: str | None, project: str, google: GoogleApi | None = None) -> list[Found]:
    """Our service accounts in the project (IAM `projects.serviceAccounts.list`, paged)."""
    google = _google(google)
    found, page = [], None
    while True:
        body = google.get(f"{IAM}/projects/{project}/serviceAccounts",
                          [("pageSize", "100")] + ([("pageToken", page)] if page else []))
        for acct in body.get("accounts") or []:
            email = str(acct.get("email") or "")
            marks = markers(str(acct.get("description") or ""))
            if not email.startswith(ACCOUNT_PREFIX) or not wanted(marks, name, run_id):
                continue
            buckets = [b for b in marks.get("buckets", "").split(",") if b]
            detail = f"the pods' Google service account (cluster={marks.get(CLUSTER_TAG, '?')})" + (
                f"; its grants on {', '.join('gs://' + b for b in buckets)}" if buckets else "")
            lo = with_marks(Leftover("service-account", email, "global", detail),  # who made it (its marks)
                            {**marks, **marks_from_description(str(acct.get("description") or ""))})
            found.append(Found(lo, marks.get(CLUSTER_TAG),
                               marks.get(RUN_TAG)))
        page = body.get("nextPageToken")
        if not page:
            return found


def _drop_grants(google: GoogleApi, bucket: str, email: str) -> None:
    """The bucket's IAM bindings without the account (live or already deleted), read-modify-write with
    the policy's etag (Cloud Storage JSON API: buckets.getIamPolicy / setIamPolicy, version 3 for
    conditional bindings)."""
    for _ in range(3):
        policy = google.get(f"{STORAGE}/b/{bucket}/iam", [("optionsRequestedPolicyVersion", "3")])
        member = f"serviceAccount:{email}"
        keep, changed = [], False
        for b in policy.get("bindings") or []:
            members = [m for m in b.get("members") or [] if m != member and not m.startswith(f"deleted:{member}?")]
            changed = changed or len(members) != len(b.get("members") or [])
            if members:
                keep.append({**b, "members": members})
        if not changed:
            return
        try:
            google.put(f"{STORAGE}/b/{bucket}/iam", {**policy, "bindings": keep, "version": 3})
            return
        except Exception as exc:  # noqa: BLE001 - 412: the policy changed meanwhile: read it again
            if getattr(exc, "status", None) != 412:
                raise


def delete_accounts(leftovers: Sequence[Leftover], google: GoogleApi | None = None) -> list[str]:
    errors: list[str] = []
    accounts = [lo for lo in leftovers if lo.kind == "service-account"]
    if not accounts:
        return errors
    google = _google(google)
    for lo in accounts:
        url = f"{IAM}/projects/-/serviceAccounts/{lo.id}"
        try:
            acct = google.get(url)
            for bucket in [b for b in markers(str(acct.get("description") or "")).get("buckets", "").split(",") if b]:
                _drop_grants(google, bucket, lo.id)
            google.delete(url)
        except Exception as exc:  # noqa: BLE001 - IAM/Storage REST errors vary; each account is tried and reported
            if getattr(exc, "status", None) != 404:
                errors.append(f"service account {lo.id}: {exc}")
    return errors


# -- the provisioner's scan and delete (infra.contract.Provisioner), from a typed scope -----------
def scan_scope(name: str | None, run_id: str | None, scope: ScanScope) -> ScanReport:
    report = scan(name, run_id, project=scope.project, client=scope.clients.get("gke_client"))
    project = gcp_project(scope.project) if not report.skipped else None
    if project:
        try:
            report.found += scan_accounts(name, run_id, project, _scope_google(scope))
        except Exception as exc:  # noqa: BLE001 - credentials, permission, network: said, never taken as clean
            report.skipped.append(f"service accounts in {project}: not checked ({str(exc).splitlines()[0][:200]})")
    return report


def delete_in(leftovers: Sequence[Leftover], scope: ScanScope, wait_seconds: float | None) -> list[str]:
    errors = delete(list(leftovers), client=scope.clients.get("gke_client"),
                    wait_seconds=1800 if wait_seconds is None else wait_seconds)
    return errors + delete_accounts(leftovers, _scope_google(scope))


def _scope_google(scope: ScanScope) -> GoogleApi | None:
    """The REST client a scope carries (a test's stand-in), else None (`Google()` is made when needed)."""
    # cast: ScanScope keeps each backend's clients untyped (`object`); the one under "google" is a GoogleApi
    return cast("GoogleApi | None", scope.clients.get("google"))
