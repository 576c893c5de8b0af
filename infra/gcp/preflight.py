"""Preflight for `run`/`up --cloud gcp`: what a new or half-set-up project lacks, asked of Google
before anything is recorded or created (after the plan, before `pulumi up`), and the same checks
for `gpucluster doctor --cloud gcp`. Without them the first run fails inside `pulumi up` (a 403 for
a disabled API) or at node-pool creation minutes later, with GPUs possibly already billing.

- APIs: Kubernetes Engine (container.googleapis.com) and Compute Engine (compute.googleapis.com)
  enabled, by Service Usage `services.batchGet` (its answer names each service with the project
  NUMBER and a `state` of ENABLED or DISABLED: Service Usage API reference, "services.batchGet").
  A new project has both disabled (reference/FACTS.md).
- billing enabled: Cloud Billing `projects.getBillingInfo` (`billingEnabled`), with
  google-cloud-billing's `CloudBillingClient.get_project_billing_info`.
- quotas, against what the cluster needs at its largest: the global `GPUS_ALL_REGIONS` and
  `CPUS_ALL_REGIONS` (Compute `projects.get`, its `quotas[]`), the region's V100 GPUs, CPUs and
  in-use external addresses (`regions.get`). Every GKE node has an external IPv4 (a public
  cluster), and while the cluster is made GKE also starts (then removes) its default pool's one
  e2-medium node (2 vCPU, one address). Spot VMs draw from the preemptible quotas
  (`PREEMPTIBLE_NVIDIA_V100_GPUS`, `PREEMPTIBLE_CPUS`) where the project has them, else from the
  standard ones (Compute docs, "Create and use Spot VMs": request preemptible quota "to prevent
  Spot VMs from consuming your quotas for standard VMs' CPUs, GPUs"). A new project has
  GPUS_ALL_REGIONS = 0 and regional GPU quotas of 0, which free-trial billing accounts cannot
  raise (reference/FACTS.md).
- buckets (`--data/--output gs://`, options gcsRead/gcsWrite): the caller may set each bucket's
  IAM policy (Cloud Storage `buckets.testIamPermissions`, `storage.buckets.setIamPolicy`) and a
  bucket given with a prefix has uniform bucket-level access (`buckets.get`,
  `iamConfiguration.uniformBucketLevelAccess.enabled`): IAM Conditions, which confine the grant to
  the prefix, work only there (Cloud Storage docs, "IAM Conditions" / "Uniform bucket-level
  access"); otherwise `pulumi up` fails minutes in, creating the binding.
- the project's shape (issue 41 items 5 and 7): what a hardened organisation's project may lack, which
  would otherwise fail inside `pulumi up`, after the cluster's 5-10 minutes (`check_node_account`,
  `check_network`, below):
  - the nodes' service account: the node pools run as the Compute Engine default service account (named
    by Compute `projects.get`, `defaultServiceAccount`). Creating a node pool that runs as a service
    account needs `iam.serviceAccounts.actAs` on it (GKE docs, "Use least privilege service accounts for
    your nodes"; IAM docs, "Service account impersonation": attaching a service account to a resource
    needs actAs, granted by roles/iam.serviceAccountUser); organisations that disable the automatic
    grants (`iam.automaticIamGrantsForDefaultServiceAccounts`) or delete or disable the account break
    it. Asked with IAM `projects.serviceAccounts.get` (404: deleted; `disabled: true`) and
    `projects.serviceAccounts.testIamPermissions` (its answer lists only the permissions the caller
    holds; none: `{}`).
  - the network: the cluster goes on the option `network` (default `default`) and `subnetwork`; a project
    made under `compute.skipDefaultNetworkCreation` has no `default` network (Resource Manager docs,
    "Organization policy constraints"). Compute `networks.get` (404: missing); a custom-mode network
    (`autoCreateSubnetworks: false`) needs a subnetwork named (GKE docs, "Creating a cluster in an
    existing network": in a custom-mode network a subnet must be given), checked with
    `subnetworks.get` in the region.

Each check is a dict shaped like `doctor`'s ({check, ok, detail, fix}); ok None is a check that
could not run (said, never taken as passed). `preflight(spec)` raises a one-line `PreflightError`
(exit 2) for the first failure, naming the API, quota or bucket, needed against available, and the
exact command or console page that fixes it. The REST calls go through `Google` (google-auth's
AuthorizedSession); tests pass a stand-in with the same `get(url, params)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Protocol, Sequence

from gpucluster.errors import SpecError
from gpucluster.spec import ClusterSpec
from gpucluster.states import JsonMapping, JsonObject

from . import access, catalog, shapes
from .access import QUOTAS_PAGE, quota_fix  # noqa: F401 - quota_fix: named here by callers and tests

SERVICES = (("container.googleapis.com", "Kubernetes Engine API"), ("compute.googleapis.com", "Compute Engine API"))
SERVICE_USAGE = "https://serviceusage.googleapis.com/v1"
COMPUTE = "https://compute.googleapis.com/compute/v1"
STORAGE = "https://storage.googleapis.com/storage/v1"
IAM = "https://iam.googleapis.com/v1"
BILLING_PAGE = "https://console.cloud.google.com/billing/linkedaccount?project={project}"
V100, V100_SPOT = "NVIDIA_V100_GPUS", "PREEMPTIBLE_NVIDIA_V100_GPUS"
GKE_DEFAULT_POOL_VCPUS = 2  # the default pool's e2-medium node, made and removed while the cluster is created
GKE_DEFAULT_POOL_DISK = (100, "pd-balanced")  # its boot disk (GKE docs, "Configuring node disks": 100 GB default)


def disk_metric(disk_type: str) -> str:
    """The regional quota a Persistent Disk type draws on: pd-ssd and pd-balanced on SSD_TOTAL_GB, pd-standard
    on DISKS_TOTAL_GB (Compute Engine docs, "Allocation quotas", Persistent Disk). New projects often have 250-500 GB
    of SSD_TOTAL_GB: without this check `--nodes 5` fails at node-pool creation, after the cluster was built."""
    if disk_type == "hyperdisk-balanced":  # Hyperdisk Balanced has its own regional quota (shapes.py)
        return "HDB_TOTAL_GB"
    return "DISKS_TOTAL_GB" if disk_type == "pd-standard" else "SSD_TOTAL_GB"
SET_POLICY = "storage.buckets.setIamPolicy"


if TYPE_CHECKING:
    from google.auth.credentials import Credentials

# a REST call's query: a mapping, or (name, value) pairs where a name repeats (`names=...&names=...`)
Params = Mapping[str, str] | Sequence[tuple[str, str]] | None


class GoogleApi(Protocol):
    """What the checks, the leftover scan and the bucket facts ask of Google's REST APIs: `Google`
    here, `SharedGets` around it, a test's stand-in."""

    def get(self, url: str, params: Params = None) -> JsonObject: ...

    def put(self, url: str, body: JsonObject) -> JsonObject: ...

    def delete(self, url: str) -> JsonObject: ...

    def post(self, url: str, body: JsonObject) -> JsonObject: ...


class BillingClient(Protocol):
    """google-cloud-billing's `CloudBillingClient`, as far as the billing check uses it."""

    def get_project_billing_info(self, *, name: str) -> object: ...


class PreflightError(SpecError):
    """The project cannot run the cluster as it is: said before anything is created (exit 2)."""


class ApiError(Exception):
    """A Google API's error answer: HTTP status, the google.rpc `status` and ErrorInfo `reason`."""

    def __init__(self, status: int, message: str, reason: str = "", service: str = ""):
        super().__init__(f"{status} {message}")
        self.status, self.message, self.reason, self.service = status, message, reason, service


def api_error(status: int, body: object) -> ApiError:
    """From Google's JSON error body ({"error": {code, message, status, errors[], details[]}}: Google
    Cloud APIs, "Errors"; the ErrorInfo detail carries reason SERVICE_DISABLED and the service)."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return ApiError(status, str(body)[:200])
    reason, service = "", ""
    for d in err.get("details") or []:
        if isinstance(d, dict) and str(d.get("@type", "")).endswith("google.rpc.ErrorInfo"):
            reason, service = str(d.get("reason") or ""), str((d.get("metadata") or {}).get("service") or "")
    if not reason:
        reason = next((str(e.get("reason")) for e in err.get("errors") or [] if isinstance(e, dict)), "")
    return ApiError(status, str(err.get("message") or "").split("\n")[0][:300], reason, service)


class Google:
    """Google REST APIs (GET, PUT, DELETE, POST) with application-default credentials (AuthorizedSession);
    an error answer raises `ApiError`."""

    def __init__(self, credentials: Credentials | None = None):
        from google.auth.transport.requests import AuthorizedSession

        self.session = AuthorizedSession(access.google_credentials(credentials))

    def _call(self, method: str, url: str, **kw: object) -> JsonObject:
        resp = self.session.request(method, url, timeout=30, **kw)
        try:
            body = resp.json() if resp.content else {}
        except ValueError:
            body = {"error": {"message": resp.text[:200]}}
        if resp.status_code != 200:
            raise api_error(resp.status_code, body)
        return body

    def get(self, url: str, params: Params = None) -> JsonObject:
        return self._call("GET", url, params=params)

    def put(self, url: str, body: JsonObject) -> JsonObject:
        return self._call("PUT", url, json=body)

    def delete(self, url: str) -> JsonObject:
        return self._call("DELETE", url)

    def post(self, url: str, body: JsonObject) -> JsonObject:
        return self._call("POST", url, json=body)


def _check(name: str, ok: bool | None, detail: str, fix: str = "") -> JsonObject:
    return {"check": name, "ok": ok, "detail": detail, "fix": fix}


def _why(exc: Exception) -> str:
    return exc.message if isinstance(exc, ApiError) else f"{type(exc).__name__}: {exc}"[:300]


# -- what the cluster needs --------------------------------------------------------------------
def needs(spec: ClusterSpec) -> JsonObject:
    """What the cluster of `spec` (resolved) takes from the quotas at its largest."""
    r = catalog.resolve(spec)
    gpu = catalog.gpu_of(r)
    carried = shapes.BY_NAME.get(r.instance_type or "")
    vcpus = carried.vcpus if carried else (catalog.n1_shape(r.instance_type or "") or (0, 0))[0]
    system = catalog.system_pool(r)["machine_type"]
    system_vcpus = (catalog.n1_shape(system) or (2, 0))[0]
    disks: dict[str, int] = {}
    for gb, kind in ((r.nodes * r.disk_size, r.disk_type or catalog.DEFAULT_DISK_TYPE),
                     (catalog.SYSTEM_DISK_GB, catalog.SYSTEM_DISK_TYPE), GKE_DEFAULT_POOL_DISK):
        disks[disk_metric(kind)] = disks.get(disk_metric(kind), 0) + gb
    return {"project": r.project, "region": r.region, "nodes": r.nodes, "spot": bool(r.spot),
            "gpus": r.nodes * int(r.gpus_per_node or 0), "gpu_vcpus": r.nodes * vcpus,
            "other_vcpus": system_vcpus + GKE_DEFAULT_POOL_VCPUS, "addresses": r.nodes + 2,
            "cpu_metric": shapes.cpu_quota_metric(r.instance_type or "n1"),  # A2_CPUS, G2_CPUS, A3_CPUS or CPUS
            "system_cpu_metric": shapes.cpu_quota_metric(system),
            "gpu": gpu, "metric": shapes.QUOTA_METRICS.get(gpu, V100), "disks": disks,
            "shape": f"{r.nodes} x {r.instance_type}" + ("" if carried else f" + {r.gpus_per_node} {gpu}")
            + (f" ({r.gpus_per_node} {gpu} each)" if carried else "")}


def _quotas(body: JsonMapping) -> dict[str, tuple[float, float]]:
    return {str(q.get("metric")): (float(q.get("limit") or 0), float(q.get("usage") or 0))
            for q in body.get("quotas") or [] if q.get("metric")}


def _free(quotas: Mapping[str, tuple[float, float]], metric: str) -> float | None:
    if metric not in quotas:
        return None
    limit, usage = quotas[metric]
    return limit - usage


def _spot_metric(quotas: Mapping[str, tuple[float, float]], standard: str, preemptible: str, spot: bool) -> str:
    """The quota a VM draws from: spot VMs the preemptible one where the project has it (limit > 0)."""
    return preemptible if spot and quotas.get(preemptible, (0.0, 0.0))[0] > 0 else standard


# -- the checks --------------------------------------------------------------------------------
def check_services(google: GoogleApi, project: str) -> list[JsonObject]:
    names = [f"projects/{project}/services/{s}" for s, _ in SERVICES]
    try:
        body = google.get(f"{SERVICE_USAGE}/projects/{project}/services:batchGet", [("names", n) for n in names])
    except Exception as exc:  # noqa: BLE001 - ApiError, transport errors: the check could not run
        return [_check(f"gcp {title}", None, f"not checked: Service Usage answered {_why(exc)}",
                       f"gcloud services list --enabled --project {project}") for _, title in SERVICES]
    state = {}
    for s in body.get("services") or []:
        key = (s.get("config") or {}).get("name") or str(s.get("name", "")).rsplit("/", 1)[-1]
        state[key] = s.get("state")
    out = []
    for service, title in SERVICES:
        if state.get(service) == "ENABLED":
            out.append(_check(f"gcp {title}", True, f"{service} enabled in {project}"))
        else:
            out.append(_check(f"gcp {title}", False, f"{service} is {state.get(service) or 'not enabled'} in {project}",
                              f"gcloud services enable {service} --project {project} (or "
                              f"https://console.cloud.google.com/apis/library/{service}?project={project})"))
    return out


def check_billing(project: str, billing: BillingClient | None = None) -> JsonObject:
    name = "gcp billing"
    try:
        if billing is None:
            from gpucluster.errors import require

            require("google.cloud.billing_v1", "gcp")
            from google.cloud import billing_v1

            billing = billing_v1.CloudBillingClient()
        info = billing.get_project_billing_info(name=f"projects/{project}")
    except Exception as exc:  # noqa: BLE001 - google.api_core errors (PermissionDenied, a disabled API): noted
        return _check(name, None, f"not checked: Cloud Billing answered {str(exc).splitlines()[0][:200]}",
                      f"gcloud billing projects describe {project}")
    if getattr(info, "billing_enabled", False):
        return _check(name, True, f"enabled for {project} ({getattr(info, 'billing_account_name', '') or 'an account'})")
    return _check(name, False, f"billing is not enabled for {project}: GKE and Compute Engine refuse to create anything",
                  f"gcloud billing projects link {project} --billing-account ACCOUNT_ID (or "
                  f"{BILLING_PAGE.format(project=project)})")


def _quota_check(project: str, quotas: Mapping[str, tuple[float, float]], metric: str, need: float,
                 region: str | None, what: str) -> JsonObject:
    scope = region or "all regions"
    name = f"gcp quota {metric} ({scope})"
    if metric not in quotas:
        return _check(name, None, f"not checked: {'regions' if region else 'projects'}.get lists no {metric}",
                      QUOTAS_PAGE.format(project=project))
    limit, usage = quotas[metric]
    if limit - usage >= need:
        return _check(name, True, f"{usage:g} used of {limit:g}: room for {what} ({need:g})")
    return _check(name, False, f"{usage:g} used of {limit:g} in {scope}: {what} needs {need:g}",
                  quota_fix(project, metric, region, need + usage))


def check_quotas(google: GoogleApi, project: str, need: JsonMapping) -> list[JsonObject]:
    region, spot = need["region"], need["spot"]
    out = []
    try:
        glob = _quotas(google.get(f"{COMPUTE}/projects/{project}"))
    except Exception as exc:  # noqa: BLE001 - a disabled Compute API, a permission: noted
        glob = None
        out.append(_check("gcp quotas (all regions)", None, f"not checked: Compute Engine answered {_why(exc)}",
                          QUOTAS_PAGE.format(project=project)))
    if glob is not None:
        out.append(_quota_check(project, glob, "GPUS_ALL_REGIONS", need["gpus"], None,
                                f"{need['gpus']} {need.get('gpu', 'V100')}"))
        out.append(_quota_check(project, glob, "CPUS_ALL_REGIONS", need["gpu_vcpus"] + need["other_vcpus"], None,
                                "the nodes' vCPUs"))
    try:
        reg = _quotas(google.get(f"{COMPUTE}/projects/{project}/regions/{region}"))
    except Exception as exc:  # noqa: BLE001 - as above
        out.append(_check(f"gcp quotas ({region})", None, f"not checked: Compute Engine answered {_why(exc)}",
                          QUOTAS_PAGE.format(project=project)))
        return out
    metric = need.get("metric", V100)  # the GPU's own metric: NVIDIA_H100_GPUS for a3-highgpu, ...
    gpu = _spot_metric(reg, metric, "PREEMPTIBLE_" + metric, spot)
    out.append(_quota_check(project, reg, gpu, need["gpus"], region, f"{need['shape']}"))
    out += _cpu_checks(project, reg, need)
    out.append(_quota_check(project, reg, "IN_USE_ADDRESSES", need["addresses"], region,
                            "one external IPv4 per node"))
    for metric, gb in sorted((need.get("disks") or {}).items()):
        if gb:
            out.append(_quota_check(project, reg, metric, gb, region,
                                    "the boot disks of the GPU nodes, the system node and GKE's default node"))
    return out


def _cpu_checks(project: str, reg: Mapping[str, tuple[float, float]], need: JsonMapping) -> list[JsonObject]:
    """The regional vCPU quotas: the GPU nodes' family metric (CPUS for N1, A2_CPUS / G2_CPUS / A3_CPUS for the
    accelerator-optimized series: shapes.cpu_quota_metric), or PREEMPTIBLE_CPUS for spot nodes where the project
    has it; the system node's family metric and GKE's default e2-medium node (CPUS), each summed per metric."""
    region = need["region"]
    gpu_metric = _spot_metric(reg, need.get("cpu_metric", "CPUS"), "PREEMPTIBLE_CPUS", need["spot"])
    system_metric = need.get("system_cpu_metric", "CPUS")
    wants: dict[str, list[tuple[float, str]]] = {}
    gpu_what = "the spot GPU nodes" if gpu_metric == "PREEMPTIBLE_CPUS" else "the GPU nodes"
    wants.setdefault(gpu_metric, []).append((need["gpu_vcpus"], f"{gpu_what} ({need['shape']})"))
    system_vcpus = need["other_vcpus"] - GKE_DEFAULT_POOL_VCPUS
    wants.setdefault(system_metric, []).append((system_vcpus, "the system node"))
    wants.setdefault("CPUS", []).append((GKE_DEFAULT_POOL_VCPUS, "GKE's default node"))
    return [_quota_check(project, reg, metric, sum(n for n, _ in parts), region, " + ".join(w for _, w in parts))
            for metric, parts in wants.items()]


def check_buckets(google: GoogleApi, spec: ClusterSpec) -> list[JsonObject]:
    """Each bucket the cluster grants access to: the caller may set its IAM policy; one given with
    a prefix (a conditional grant) has uniform bucket-level access."""
    from . import gcs

    prefixed: dict[str, bool] = {}
    for b in gcs.iam_bindings(*gcs.scopes(spec)):
        prefixed[b["bucket"]] = prefixed.get(b["bucket"], False) or bool(b["condition_expression"])
    out = []
    for bucket, conditional in sorted(prefixed.items()):
        name = f"gcp bucket gs://{bucket}"
        try:
            granted = google.get(f"{STORAGE}/b/{bucket}/iam/testPermissions", [("permissions", SET_POLICY)])
        except ApiError as exc:
            if exc.status == 404:
                out.append(_check(name, False, f"gs://{bucket} does not exist (or is not visible to you)",
                                  f"gcloud storage buckets create gs://{bucket} --uniform-bucket-level-access"))
            else:
                out.append(_check(name, None, f"not checked: Cloud Storage answered {_why(exc)}"))
            continue
        except Exception as exc:  # noqa: BLE001 - transport errors: noted
            out.append(_check(name, None, f"not checked: {_why(exc)}"))
            continue
        if SET_POLICY not in (granted.get("permissions") or []):
            out.append(_check(name, False, f"you may not change the IAM policy of gs://{bucket} ({SET_POLICY}), "
                                           "which granting the pods access needs",
                              f"ask for roles/storage.admin on it: gcloud storage buckets add-iam-policy-binding "
                              f"gs://{bucket} --member=user:YOU --role=roles/storage.admin"))
            continue
        if not conditional:
            out.append(_check(name, True, "you may set its IAM policy (the whole bucket is granted: no condition)"))
            continue
        try:
            meta = google.get(f"{STORAGE}/b/{bucket}", [("fields", "iamConfiguration")])
        except Exception as exc:  # noqa: BLE001 - noted
            out.append(_check(name, None, f"not checked whether it has uniform bucket-level access: {_why(exc)}",
                              f"gcloud storage buckets describe gs://{bucket} --format='value(uniform_bucket_level_access)'"))
            continue
        ubla = ((meta.get("iamConfiguration") or {}).get("uniformBucketLevelAccess") or {}).get("enabled")
        if ubla:
            out.append(_check(name, True, "uniform bucket-level access on; you may set its IAM policy"))
        else:
            out.append(_check(name, False, f"gs://{bucket} has no uniform bucket-level access, so the grant confined "
                                           "to its prefix (an IAM condition) would be refused",
                              f"gcloud storage buckets update gs://{bucket} --uniform-bucket-level-access"))
    return out


# -- the project's shape: the nodes' service account, the network ------------------------------
ACT_AS = "iam.serviceAccounts.actAs"
DEFAULT_NETWORK = "default"


def check_node_account(google: GoogleApi, project: str) -> JsonObject:
    """The nodes' service account exists, is enabled, and the caller may act as it."""
    name = "gcp node service account"
    try:
        email = google.get(f"{COMPUTE}/projects/{project}").get("defaultServiceAccount")
    except Exception as exc:  # noqa: BLE001 - a disabled Compute API, a permission: noted
        return _check(name, None, f"not checked: Compute Engine answered {_why(exc)}")
    if not email:
        return _check(name, None, "not checked: Compute Engine names no default service account")
    try:
        account = google.get(f"{IAM}/projects/{project}/serviceAccounts/{email}")
    except ApiError as exc:
        if exc.status == 404:
            return _check(name, False, f"the node pools run as the Compute Engine default service account {email}, "
                                       "which does not exist (deleted)",
                          f"restore it within 30 days: gcloud beta iam service-accounts undelete ITS_UNIQUE_ID "
                          f"--project {project} (the unique id is in the audit log of its deletion)")
        return _check(name, None, f"not checked: IAM answered {_why(exc)}")
    except Exception as exc:  # noqa: BLE001 - transport errors: noted
        return _check(name, None, f"not checked: {_why(exc)}")
    if account.get("disabled"):
        return _check(name, False, f"the node pools run as {email}, which is disabled",
                      f"gcloud iam service-accounts enable {email} --project {project}")
    try:
        held = google.post(f"{IAM}/projects/{project}/serviceAccounts/{email}:testIamPermissions",
                           {"permissions": [ACT_AS]}).get("permissions") or []
    except Exception as exc:  # noqa: BLE001 - noted
        return _check(name, None, f"not checked whether you may act as {email}: {_why(exc)}")
    if ACT_AS not in held:
        return _check(name, False, f"the node pools run as {email}, and you may not act as it ({ACT_AS}), which "
                                   "creating them needs",
                      f"gcloud iam service-accounts add-iam-policy-binding {email} --member=user:YOU "
                      f"--role=roles/iam.serviceAccountUser --project {project}")
    return _check(name, True, f"{email}: enabled, and you may act as it")


def check_network(google: GoogleApi, project: str, region: str, network: str | None,
                  subnetwork: str | None) -> list[JsonObject]:
    """The cluster's network exists (and its subnetwork in the region, when named or needed)."""
    net = network or DEFAULT_NETWORK
    name = f"gcp network {net}"
    try:
        body = google.get(f"{COMPUTE}/projects/{project}/global/networks/{net}")
    except ApiError as exc:
        if exc.status == 404:
            fix = (f"create it (gcloud compute networks create default --subnet-mode=auto --project {project}) or "
                   "name an existing one: --option network=NAME [--option subnetwork=NAME]") if not network else \
                  f"name an existing network: gcloud compute networks list --project {project}"
            return [_check(name, False, f"network {net!r} does not exist in {project}"
                                        + (" (projects made under compute.skipDefaultNetworkCreation have none)"
                                           if not network else ""), fix)]
        return [_check(name, None, f"not checked: Compute Engine answered {_why(exc)}")]
    except Exception as exc:  # noqa: BLE001 - transport errors: noted
        return [_check(name, None, f"not checked: {_why(exc)}")]
    custom = body.get("autoCreateSubnetworks") is False and not body.get("IPv4Range")
    if not subnetwork:
        if custom:
            return [_check(name, False, f"network {net!r} is a custom-mode network: the cluster needs a subnetwork "
                                        f"of it in {region} named",
                           f"--option subnetwork=NAME (gcloud compute networks subnets list --network {net} "
                           f"--regions {region} --project {project})")]
        return [_check(name, True, f"network {net!r} exists (auto mode: GKE uses its subnet in {region})")]
    sub = f"gcp subnetwork {subnetwork}"
    try:
        google.get(f"{COMPUTE}/projects/{project}/regions/{region}/subnetworks/{subnetwork}")
    except ApiError as exc:
        if exc.status == 404:
            return [_check(sub, False, f"subnetwork {subnetwork!r} does not exist in {region} of {project}",
                           f"name one of network {net!r} in {region}: gcloud compute networks subnets list "
                           f"--network {net} --regions {region} --project {project}")]
        return [_check(sub, None, f"not checked: Compute Engine answered {_why(exc)}")]
    except Exception as exc:  # noqa: BLE001 - noted
        return [_check(sub, None, f"not checked: {_why(exc)}")]
    return [_check(name, True, f"network {net!r} exists"), _check(sub, True, f"subnetwork {subnetwork!r} in {region}")]


class SharedGets:
    """A client whose GETs (reads: quotas, networks, service accounts, buckets) are asked once per
    placement (gpucluster.plan.shared_answers): every zone of a region asks the same."""

    def __init__(self, google: GoogleApi):
        self.google = google

    def get(self, url: str, params: Params = None) -> JsonObject:
        from gpucluster.plan.shared_answers import shared

        return shared(("gcp", "GET", url, repr(params)), lambda: self.google.get(url, params))

    def put(self, url: str, body: JsonObject) -> JsonObject:
        return self.google.put(url, body)

    def delete(self, url: str) -> JsonObject:
        return self.google.delete(url)

    def post(self, url: str, body: JsonObject) -> JsonObject:
        return self.google.post(url, body)


def checks(spec: ClusterSpec, *, google: GoogleApi | None = None, billing: BillingClient | None = None,
           credentials: Credentials | None = None) -> list[JsonObject]:
    """Every check for `spec` (resolved, with its project); `google`/`billing` are stand-ins in tests."""
    need = needs(spec)
    project = need["project"]
    if not project:
        return [_check("gcp project", None, "not checked: no project resolved")]
    from gpucluster.plan.shared_answers import shared

    google = SharedGets(google if google is not None else Google(credentials))
    out = list(shared(("gcp", project, "services"), lambda: check_services(google, project)))
    out.append(shared(("gcp", project, "billing"), lambda: check_billing(project, billing)))
    compute_off = any(c["ok"] is False and "compute" in c["detail"] for c in out)
    if compute_off:
        out.append(_check("gcp quotas", None, "not checked: the Compute Engine API is not enabled"))
    else:
        out += check_quotas(google, project, need)
        out += check_network(google, project, need["region"], spec.option("network"), spec.option("subnetwork"))
        out.append(check_node_account(google, project))
    out += check_buckets(google, spec)
    return out


def first_failure(found: list[JsonObject]) -> str | None:
    bad = next((c for c in found if c["ok"] is False), None)
    if bad is None:
        return None
    return f"{bad['check']}: {bad['detail']}; nothing was created; fix: {bad['fix']}"


def preflight(spec: ClusterSpec, *, google: GoogleApi | None = None, billing: BillingClient | None = None,
              credentials: Credentials | None = None) -> None:
    """`Provisioner.preflight`: raise PreflightError (exit 2) for the first check that failed. The
    checks start with the credentials (they run as the user): none is one line, exit 2, with the fix."""
    try:
        found = checks(spec, google=google, billing=billing, credentials=credentials)
    except access.GcpAuthError as exc:
        from gpucluster.errors import UsageError

        raise UsageError(f"gcp credentials: {exc.message}; nothing was started: {exc.hint}") from None
    problem = first_failure(found)
    if problem:
        raise PreflightError(problem)


def need_line(need: JsonMapping) -> str:
    return (f"{need['shape']} in {need['region']}: {need['gpus']} GPU(s), "
            f"{need['gpu_vcpus'] + need['other_vcpus']} vCPU(s), {need['addresses']} address(es)")
