"""What the provider of a Kubernetes cluster adds to the generic launcher: a `Platform`.

The launcher (`infra.kubernetes.launcher`) knows the Kubernetes API only. What depends on who runs
the cluster is given to it as one `Platform`: how to reach the API of a cluster gpucluster knows
(GKE: the stack's kubeconfig with a bearer token from Google credentials), which nodes the pods
go to and what they request of them (GKE: its node-pool labels and its documented allocatable),
and the identity the pods read and write object storage as (GKE: a Kubernetes service account
bound to a Google service account through Workload Identity). The default, `Platform()`, adds
nothing: the cluster's kubeconfig (or ~/.kube/config), no node selector, no requests, no
object-storage identity. gcp's is `infra.gcp.gke.GKE`. Nothing here imports a cloud's package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

from gpucluster.domain import Cluster
from gpucluster.states import JsonMapping, JsonObject

if TYPE_CHECKING:
    from gpucluster.watch.launch import JobSpec

    from .api import KubeApi, KubeObject

# (kind, manifest) -> the manifest as created: a typed model of the kubernetes client or a JSON dict in, the same out
Shape = Callable[[str, "KubeObject"], "KubeObject"]


def _none(*_: object) -> None:
    return None


def _empty(*_: object) -> dict[str, str]:
    return {}


def _as_built(kind: str, manifest: KubeObject) -> KubeObject:
    return manifest


def kubeconfig_api(cluster: Cluster, credentials: object = None) -> KubeApi:
    """The API of a cluster from its `kubeconfig` (a kubeconfig text), else ~/.kube/config."""
    from .api import KubeApi

    return KubeApi.from_kubeconfig(cluster.kubeconfig)


@dataclass(frozen=True)
class Platform:
    """The provider's parts of a Kubernetes run; every one has a plain Kubernetes default."""

    name: str = "kubernetes"  # the --cloud the messages name ("-L ... is not allowed on gcp")
    # (cluster, credentials) -> KubeApi: how the launcher reaches the cluster's API
    api: Callable[[Cluster, object], KubeApi] = kubeconfig_api
    # the cluster's outputs -> the pods' node selector (GKE: its accelerator and node-pool labels)
    node_selector: Callable[[JsonMapping], dict[str, str]] = _empty
    # the cluster's outputs -> the training image when the option `image` names none (GKE: by the GPU's
    # generation); None: the launcher's DEFAULT_IMAGE
    default_image: Callable[[JsonMapping], str | None] = _none
    # a machine type -> the training container's CPU and memory requests ({}: none)
    pod_requests: Callable[[str | None], dict[str, str]] = _empty
    # (cluster, job) -> (Kubernetes service account, the identity it is bound to) the pods run as
    # when the job reads or writes object storage; None: the namespace's default account
    object_account: Callable[[Cluster, JobSpec], tuple[str, str] | None] = _none
    # the bound identity -> the service account's annotations (GKE: iam.gke.io/gcp-service-account)
    account_annotations: Callable[[str], dict[str, str]] = _empty
    # the service account a plan names before the cluster exists (the dry run's, `describe`)
    account_name: str | None = None
    # how pods get their object-storage access, for the plan's notes ("Workload Identity")
    identity: str = ""
    # what the service account is bound to, for the plan's notes ("the cluster's Google service account")
    account_bound_to: str = ""
    # what holds no pod of ours between jobs, for `ssh` with no job running
    between_jobs: str = "between jobs no pod of ours runs"
    # (kind, manifest) -> the manifest as created: what the provider adds to each object the run makes
    # (kubernetes: the user's queue label, priority class, node selector, tolerations, service account,
    # image pull secret); kind is "secret", "configmap", "service", "job" or "pytorchjob"
    shape: Shape = _as_built
    # (a node, the time now) -> a `node_notice` record when the provider is taking that node back (GKE: host
    # maintenance, read from its node labels; `infra.kubernetes.notices`); None: the nodes are not read
    node_notice: Callable[[KubeObject, float], JsonObject | None] | None = None
    # a namespace other people use too (kubernetes): every object of a run carries its cluster's name
    # (`gpucluster-cluster`), and `ssh` reaches only pods of that cluster made by this home's owner; a cluster
    # gpucluster made for itself (GKE) holds nothing else of note, and is not asked
    shared: bool = False


GENERIC = Platform()


class ObjectTransfer(Protocol):
    """The backend's node transfer program for object storage (gcp: `infra.gcp.gcs.GcsTransfer`)."""

    def program(self) -> tuple[str, str]:
        """(its file name, its text), shipped in the ConfigMap."""
        ...

    def at(self, path: str) -> "ObjectTransfer":
        """The same program, run from `path` on the node."""
        ...

    def script(self, python: str, mode: str, a: str, b: str) -> str:
        """The node's shell command that pulls `a` to `b` or pushes `a` to `b` (`mode`)."""
        ...
