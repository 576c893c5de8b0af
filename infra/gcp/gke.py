"""GKE's part of a Kubernetes run (`GKE`, the `Platform` gcp gives `infra.kubernetes.launcher`).

The launcher itself is plain Kubernetes (`infra.kubernetes`); this module adds what only a cluster
gpucluster made on GKE has: its API reached with the stack's kubeconfig (server and CA) and a bearer
token from Google application-default credentials, the pods sent to its GPU node pool by GKE's node
labels, their CPU and memory requests by GKE's documented node allocatable, and the identity they
read and write `gs://` as (a Kubernetes service account bound to the cluster's Google service
account through Workload Identity; the component makes the binding: `component_access.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from gpucluster.errors import LaunchError, require
from gpucluster.infra.kubernetes.api import KubeApi, ca_file
from gpucluster.infra.kubernetes.platform import Platform
from gpucluster.states import JsonMapping

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

    from gpucluster.domain import Cluster
    from gpucluster.watch.launch import JobSpec

from .catalog import CURRENT_GPU_IMAGE, LEGACY_GPU_IMAGE, machine_shape
from .gcs import OBJECTS_KSA
from .maintenance import maintenance_notice


# -- the API ---------------------------------------------------------------------------------------
def api_from_gke(kubeconfig: str, *, credentials: Credentials | None = None) -> KubeApi:
    """From the GKE stack's kubeconfig (server and CA only) with a bearer token from Google
    application-default credentials (google-auth), refreshed before it expires. No gcloud and no
    `gke-gcloud-auth-plugin` are needed; the kubeconfig's exec entry is for kubectl users."""
    k8s = require("kubernetes", "gcp")
    import yaml

    from .access import bearer_token_hook, google_credentials

    try:
        config = yaml.safe_load(kubeconfig)
        cluster = config["clusters"][0]["cluster"]
        server, ca = cluster["server"], cluster.get("certificate-authority-data")
    except Exception as exc:  # noqa: BLE001 - YAMLError, KeyError, TypeError, ...
        raise LaunchError(f"cannot read the cluster's kubeconfig: {exc!r}") from None
    credentials = google_credentials(credentials)  # fails here, as one line, when ADC is missing
    configuration = k8s.client.Configuration()
    configuration.host = server
    if ca:
        configuration.ssl_ca_cert = ca_file(ca)
    configuration.api_key = {"authorization": credentials.token}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    configuration.refresh_api_key_hook = bearer_token_hook(credentials)
    return KubeApi.from_api_client(k8s.client.ApiClient(configuration))


def cluster_api(cluster: Cluster, credentials: object = None) -> KubeApi:
    """The API of a gcp cluster: its stack's kubeconfig with Google credentials; without one (a
    cluster given by hand), the cluster's kubeconfig or ~/.kube/config. `credentials` is what the
    launcher was given (the Kubernetes layer holds it without knowing its kind): google-auth
    credentials or None."""
    kubeconfig = cluster.kubeconfig
    if kubeconfig:  # a GKE stack's kubeconfig: a bearer token from Google credentials
        from .access import GcpAuthError

        try:
            # cast: the SDK boundary; what gcp's `make` gave the launcher (google-auth credentials, or a
            # stand-in with their refresh/token/valid in the tests), passed back here unread
            return api_from_gke(kubeconfig, credentials=cast("Credentials | None", credentials))
        except GcpAuthError as exc:
            raise LaunchError(f"cannot authenticate to the GKE cluster: {exc.message}", hint=exc.hint) from None
    return KubeApi.from_kubeconfig(kubeconfig)


# -- where the pods run, and what they request ------------------------------------------------------
def node_selector(outputs: JsonMapping) -> dict[str, str]:
    """The GPU pool's node labels (GKE sets them on every node of a pool) from the stack's outputs."""
    selector = {}
    if outputs.get("accelerator_type"):
        selector["cloud.google.com/gke-accelerator"] = str(outputs["accelerator_type"])
    if outputs.get("node_pool_name"):
        selector["cloud.google.com/gke-nodepool"] = str(outputs["node_pool_name"])
    return selector


# What a training pod requests of its node (so it is not a BestEffort pod, the first the kubelet evicts
# under memory pressure: Kubernetes docs, "Node-pressure Eviction"): the node's allocatable, by GKE's
# documented reservations (GKE docs, "Standard cluster architecture", node allocatable: CPU 6 % of the
# first core, 1 % of the next, 0.5 % of the next 2, 0.25 % above 4; memory 25 % of the first 4 GiB,
# 20 % of the next 4, 10 % of the next 8, 6 % of the next 112, 2 % above 128, plus a 100 MiB eviction
# threshold), taken from the memory the kubelet really reports as capacity: MemTotal, 1.6-2 % below the
# machine type's nominal memory (measured on GKE nodes: 2i2c-org/infrastructure issue #2121; their
# PR #804 hit exactly this on n1-standard-32), here 2.5 % to be safe; less what GKE's own DaemonSets
# on a GPU node request (fluentbit, metadata server, device plugin, kube-proxy, ...: 566-656 MiB and
# about 0.3 CPU measured there; DAEMONSETS_GIB/CPU, above that), and a margin. The pod must fit a node
# the autoscaler has not made yet (a pool scaled to zero), so this is computed, not read from a node.
MEMTOTAL_SHORTFALL = 0.025
DAEMONSETS_CPU, DAEMONSETS_GIB = 0.5, 0.75
REQUEST_MARGIN_CPU, REQUEST_MARGIN_GIB = 0.5, 0.25


def allocatable(vcpus: float, mem_gib: float) -> tuple[float, float]:
    """(CPUs, GiB) of a GKE node of a machine type with `mem_gib` nominal memory that Kubernetes may
    give to pods: its capacity (MemTotal, taken as MEMTOTAL_SHORTFALL below nominal) less GKE's
    reservations, which GKE computes from the machine's memory."""
    cpu_reserved, left = 0.0, float(vcpus)
    for size, rate in ((1, 0.06), (1, 0.01), (2, 0.005), (float("inf"), 0.0025)):
        part = min(left, size)
        cpu_reserved += part * rate
        left -= part
    mem_reserved, left = 0.1, float(mem_gib)  # the eviction threshold
    if mem_gib < 1:
        mem_reserved += 0.25
    else:
        for size, rate in ((4, 0.25), (4, 0.20), (8, 0.10), (112, 0.06), (float("inf"), 0.02)):
            part = min(left, size)
            mem_reserved += part * rate
            left -= part
    return vcpus - cpu_reserved, mem_gib * (1 - MEMTOTAL_SHORTFALL) - mem_reserved


def pod_requests(machine_type: str | None) -> dict[str, str]:
    """{"cpu": "2920m", "memory": "10148Mi"} for a pod that has the node to itself; {} when the machine
    type is not a GPU machine type this code knows (N1, G2, A2, A3: `catalog.machine_shape`)."""
    shape = machine_shape(machine_type) if machine_type else None
    if shape is None:
        return {}
    cpus, mem = allocatable(float(shape[0]), float(shape[1]))
    cpu_m = int((cpus - DAEMONSETS_CPU - REQUEST_MARGIN_CPU) * 1000)
    mem_mi = int((mem - DAEMONSETS_GIB - REQUEST_MARGIN_GIB) * 1024)
    if cpu_m < 500 or mem_mi < 1024:
        return {}
    return {"cpu": f"{cpu_m}m", "memory": f"{mem_mi}Mi"}


# -- the pods' object-storage identity (Workload Identity) -----------------------------------------
def object_account(cluster: Cluster, job: JobSpec) -> tuple[str, str] | None:
    """(Kubernetes service account, Google service account) the pods run as when the job reads or
    writes object storage (`--data gs://...`, `--output gs://...`): the cluster's outputs name them
    (the component binds the one to the other for Workload Identity). None when the job uses none;
    LaunchError when it does and the cluster was made without object access."""
    from gpucluster.watch.staging import staged_mounts

    urls = [m.src for m in staged_mounts(job) if m.remote] + ([str(job.output)] if job.output and job.output.remote
                                                               else [])
    if not urls:
        return None
    outputs = dict(cluster.outputs or {})
    ksa, gsa = outputs.get("objects_ksa"), outputs.get("objects_service_account")
    if not ksa or not gsa:
        raise LaunchError(f"cluster {cluster.name!r} grants its pods no object storage access, which "
                          f"{', '.join(urls)} needs: it was made without them (gpucluster run declares the access "
                          "for the URLs it is given; for a stack, set gpucluster:gcsRead / gpucluster:gcsWrite)")
    return str(ksa), str(gsa)


def account_annotations(gsa: str) -> dict[str, str]:
    """The Kubernetes service account acts as the Google service account `gsa` (GKE Workload Identity)."""
    return {"iam.gke.io/gcp-service-account": gsa}


def default_image(outputs: JsonMapping) -> str | None:
    """The image for the GPU pool's accelerator (outputs accelerator_type: GKE's name), None when unknown."""
    from gpucluster.catalog.gpus import LEGACY_GENERATIONS, lookup

    gpu = lookup(str(outputs.get("accelerator_type") or ""))
    if gpu is None:
        return None
    return LEGACY_GPU_IMAGE if gpu.generation in LEGACY_GENERATIONS else CURRENT_GPU_IMAGE


GKE = Platform(
    name="gcp",
    default_image=default_image,
    api=cluster_api,
    node_selector=node_selector,
    pod_requests=pod_requests,
    object_account=object_account,
    account_annotations=account_annotations,
    account_name=OBJECTS_KSA,
    identity="Workload Identity",
    account_bound_to="the cluster's Google service account",
    between_jobs="between jobs the GPU pool holds no pod of ours and scales to zero",
    node_notice=maintenance_notice,
)
