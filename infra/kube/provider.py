"""The `kubernetes` provider: nothing is provisioned. `prepare` pins the context and namespace a run uses
(read from the kubeconfig, recorded with the run, so `down` finds its objects again); `preflight` asks the
cluster, before the run's ledger row and before anything is created: the namespace (made only with
--create-namespace), every permission the run uses (permissions.py), and whether the job fits (fit.py);
`up` hands the launcher the cluster as it is; `leftovers` are the objects labelled with the run.
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Mapping

from gpucluster.domain import Check, Cluster, Provider, ProvisionEvents
from gpucluster.errors import SpecError, UsageError
from gpucluster.states import JsonMapping, JsonObject

from . import access, options
from .options import price_per_gpu_hour

if TYPE_CHECKING:
    from gpucluster.infra.kubernetes.api import KubeClient
    from gpucluster.spec import ClusterSpec

    from . import fit
    from .gpus import GpuNodes


def prepare(spec: ClusterSpec, *, dry_run: bool = False, detect: object = True) -> tuple[ClusterSpec, list[str]]:
    """The context and namespace the run uses, pinned in its options from the kubeconfig (a local file:
    the cluster is not asked here), and what the run costs, said. `detect=None` (a dry run after a
    failure): the spec as given. A dry run looks the same up (a failure there is the core's note)."""
    notes: list[str] = []
    given = dict(spec.options)
    given.pop("priceSource", None)  # gpucluster's own mark, set below
    if detect is None:
        return spec.replace(options=tuple(sorted(given.items()))), notes
    try:
        where = access.target(spec.option("context"), options.namespace(spec))
    except UsageError as exc:
        raise SpecError(exc.message) from None
    given.update(context=where.context, namespace=where.namespace)
    notes.append(f"detected from the kubeconfig: context {where.context}, namespace {where.namespace} "
                 f"({where.namespace_from})")
    if price_per_gpu_hour(spec) is None:  # --option price-per-gpu-hour wins over config.yaml's for the context
        from gpucluster.plan.userconfig import load_config

        found = load_config().context_setting("kubernetes", where.context, "price_per_gpu_hour")
        if found is not None:
            given.update(pricePerGpuHour=found[0], priceSource=options.PRICE_FROM_CONFIG)
            notes.append(f"internal price ${found[0]}/GPU-hour from config.yaml, context {where.context} ({found[1]})")
    return spec.replace(options=tuple(sorted(given.items()))), notes


def hourly(spec: ClusterSpec) -> Decimal:
    price = price_per_gpu_hour(spec) or Decimal(0)
    return price * (spec.gpus_per_node or 0) * spec.nodes


class KubeProvider(Provider):
    cloud = "kubernetes"
    check_is_complete = True  # every object a run makes carries its label, in the namespace it names

    def __init__(self, retry_s: float = 30.0):
        self.retry_s = retry_s
        self.checked: list[str] = []  # what preflight found, for the plan
        self.skipped: list[str] = []
        self.where: tuple[str, str] | None = None  # (context, namespace) of the run `up` handed over
        self.kinds: list[str] = ["configmap", "service", "job"]  # what the run makes (the launcher says)
        self.secrets = False  # the job passes --secret values: the run makes a Secret (the launcher says)
        self.spec: ClusterSpec | None = None  # the spec `up` was handed
        self.pod: JsonObject | None = None  # the pod spec the run's Job will carry (the launcher says)
        self.gpu_nodes: GpuNodes | None = None  # --gpu TYPE: the nodes carrying it, found by preflight

    def preflight(self, spec: ClusterSpec | None = None) -> None:
        """Bad input (exit 2) before anything is recorded or created: the cluster cannot be reached, refuses
        the credentials, lacks the namespace, a permission, or room for the job."""
        if spec is None:
            return
        from gpucluster.infra.kubernetes.api import _is_api_error, _status

        context, namespace = str(spec.option("context")), str(spec.option("namespace"))
        client = access.api_client(context)
        plugin = list(getattr(client, "gpucluster_plugin_errors", []) or [])
        from kubernetes import client as k8s

        try:
            result, unread = self._ask(spec, k8s, client, context, namespace)
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001 - an API answer: unreachable and 401 are bad input
            if not _is_api_error(exc) and not isinstance(exc, OSError):
                raise  # not an answer of the API server: a bug, shown as one
            said = access.refused(exc, context, "asked before the run", plugin)
            if said is not None:
                raise said from None
            raise UsageError(f"the API server of context {context!r} answered {_status(exc)} "
                             f"{getattr(exc, 'reason', exc)} before the run; nothing was created") from None
        self.checked = result.notes
        self.gpu_nodes = result.gpu
        self.skipped = result.skipped + ([f"namespace {namespace} exists (this user may not read namespaces)"]
                                         if unread else [])

    def _ask(self, spec: ClusterSpec, k8s: KubeClient, client: KubeClient, context: str,
             namespace: str) -> tuple[fit.Fit, bool]:
        """The cluster asked: the namespace, the permissions, the nodes, the queue, the LimitRanges and the
        ResourceQuotas; (what was found, whether the namespace could not be read)."""
        from gpucluster.infra.kubernetes.api import Retry

        from . import fit, permissions

        core, retry = k8s.CoreV1Api(client), Retry(self.retry_s)
        exists, unread = _namespace_state(core, namespace)
        create = options.create_namespace(spec)
        if not exists and not create:
            raise UsageError(f"namespace {namespace!r} does not exist in context {context!r}: give an existing "
                             "one with --namespace, or add --create-namespace to make it for the run")
        mode = str(spec.option("launcher") or "job").lower()
        secrets = self.secrets  # the job's --secret (KubeLauncher.describe says it): a Secret is created
        permissions.check(client, namespace, context, permissions.needed(mode, secrets, create and not exists))
        result = fit.Fit()
        resource = options.gpu_resource(spec)
        extra = options.passthrough(spec)
        gpus = int(spec.gpus_per_node or 0)
        fit.check_nodes(core, spec.nodes, gpus, resource, extra, bool(extra.queue),
                        retry, result, options.gpu(spec), options.pinned_product(spec))
        if extra.queue and exists:
            fit.check_queue(k8s.CustomObjectsApi(client), namespace, extra.queue, retry, result, resource,
                            float(spec.nodes * gpus))
        if exists:
            ranges = fit.check_limits(core, namespace, self.pod, resource, gpus, retry, result)
            fit.check_quota(core, namespace, fit.needs(spec.nodes, gpus, resource, mode, secrets), retry, result,
                            self.pod, ranges, spec.nodes)
        return result, unread

    def up(self, spec: ClusterSpec, events: ProvisionEvents) -> Cluster:
        self.where = (str(spec.option("context")), str(spec.option("namespace")))
        if self.gpu_nodes is None and options.gpu(spec):  # --gpu without a preflight's reading: the rule's values
            from .gpus import assumed

            self.gpu_nodes = assumed(str(options.gpu(spec)), options.pinned_product(spec))
        self.spec = spec  # a kept cluster's check (`held.hold`) asks the preflight of this spec
        return Cluster(name=spec.name, cloud="kubernetes", nodes=(), gpus_per_node=int(spec.gpus_per_node or 0),
                       kept_as="a namespace of an existing Kubernetes cluster",
                       spares="the namespace, the cluster or its nodes",
                       outputs={"nodes": spec.nodes, "context": spec.option("context"),
                                "namespace": spec.option("namespace"), "max_lifetime_minutes": spec.max_lifetime_minutes,
                                "gpu_resource": options.gpu_resource(spec),
                                **({"gpu_nodes": self.gpu_nodes.to_dict()} if self.gpu_nodes is not None else {})})

    def down(self, name: str, events: ProvisionEvents) -> None:
        return None  # nothing was provisioned: a run's objects go with the run (check_down for a killed one)

    def leftovers(self, name: str, run_id: str | None = None) -> Check:
        if not run_id:
            return Check(unchecked=(f"objects of cluster {name!r}: no run id to look for",))
        if self.where is None:
            return Check(unchecked=(f"run {run_id}: its context and namespace are in its ledger record (gpucluster down)",))
        from gpucluster.infra.kubernetes.api import KubeApi, Retry

        from .cleanup import run_leftovers

        context, namespace = self.where  # read back by the run's label, deletion under way counting as gone
        api = KubeApi.from_api_client(access.api_client(context))
        return Check.of(run_leftovers(api, namespace, run_id, self.kinds, retry=Retry(30)))


def _namespace_state(core: KubeClient, namespace: str) -> tuple[bool, bool]:
    """(whether the namespace exists, whether this user may not read it: then it is taken to exist)."""
    from gpucluster.infra.kubernetes.api import Retry, _is_api_error, _status

    try:
        Retry(0).call(core.read_namespace, namespace)  # the first contact: unreachable is said at once
    except Exception as exc:  # noqa: BLE001 - ApiException lives in the lazily imported SDK
        if not (_is_api_error(exc) and _status(exc) in (404, 403)):
            raise
        return _status(exc) != 404, _status(exc) == 403  # 403: may not read namespaces
    return True, False


def run_where(record: JsonMapping) -> tuple[str, str] | None:
    """(context, namespace) a recorded run used, from its spec's options."""
    spec = record.get("spec") or {}
    opts = spec.get("options") if isinstance(spec, Mapping) else None
    given = dict(opts) if isinstance(opts, (Mapping, list, tuple)) else {}
    if given.get("context") and given.get("namespace"):
        return str(given["context"]), str(given["namespace"])
    return None
