"""Whether the namespace's LimitRanges admit the run's pods, judged on the pod the Job will make (its containers
and init container as the launcher builds them, the user's options added), as the API server's LimitRanger
admission plugin judges a Pod at its create (kubernetes/kubernetes plugin/pkg/admission/limitranger/admission.go,
`PodLimitFunc`):

1. the API server's defaulting first (pkg/apis/core/v1/defaults.go `SetDefaults_Pod`): a container that states a
   limit and no request for a resource requests its limit (our GPU limit becomes a GPU request);
2. each LimitRange in turn: its `Container` item's `default` (limits) and `defaultRequest` (requests) are set on
   every container and init container that does not state them (`defaultContainerResourceRequirements`,
   `mergePodResourceRequirements`);
3. a `Container` item holds for every container and init container, a `Pod` item for the pod: the containers'
   sum (a resource counts only when every container states it: `sum`), or any init container's when larger;
   - `min`: a request must be stated and be at least min, a stated limit too (`minConstraint`);
   - `max`: a limit must be stated and be at most max, a stated request too (`maxConstraint`);
   - `maxLimitRequestRatio`: request and limit both stated and not 0, limit/request at most the ratio
     (`limitRequestRatioConstraint`).
The LimitRange objects are read as the API returns them, already defaulted at their own create (an item with a
`max` and no `default` gets default = max, `defaultRequest` = default: `SetDefaults_LimitRangeItem`).
Messages are the plugin's own wording, so what the user reads is what `kubectl describe job` would have said.
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Mapping

from gpucluster.domain import Cluster
from gpucluster.states import JsonMapping, JsonObject

if TYPE_CHECKING:
    from gpucluster.infra.kubernetes.api import KubeObject
    from gpucluster.infra.kubernetes.launcher import KubernetesLauncher
    from gpucluster.spec import ClusterSpec
    from gpucluster.watch.launch import JobSpec

Resources = dict[str, Decimal]


def _q(value: object) -> Decimal:
    from kubernetes.utils import parse_quantity

    return Decimal(parse_quantity(str(value)))


def _said(value: Decimal) -> str:
    """A quantity as Kubernetes writes it: whole, else in thousandths (`100m`)."""
    if value == value.to_integral_value():
        return str(int(value))
    milli = value * 1000
    return f"{int(milli)}m" if milli == milli.to_integral_value() else format(value.normalize(), "f")


def _field(obj: KubeObject, snake: str, camel: str) -> KubeObject:
    return obj.get(camel) if isinstance(obj, Mapping) else getattr(obj, snake, None)


def _resources(container: JsonMapping) -> tuple[Resources, Resources]:
    res = container.get("resources") or {}
    requests = {k: _q(v) for k, v in (res.get("requests") or {}).items()}
    limits = {k: _q(v) for k, v in (res.get("limits") or {}).items()}
    for k, v in limits.items():  # SetDefaults_Pod: a limit without a request requests the limit
        requests.setdefault(k, v)
    return requests, limits


def _min(kind: str, name: str, given: str, req: Resources, lim: Resources) -> str | None:
    low = _q(given)
    if name not in req:
        return f"Minimum {name} usage per {kind} is {given}.  No request is specified."
    if req[name] < low:
        return f"Minimum {name} usage per {kind} is {given}, but request is {_said(req[name])}."
    if name in lim and lim[name] < low:
        return f"Minimum {name} usage per {kind} is {given}, but limit is {_said(lim[name])}."
    return None


def _max(kind: str, name: str, given: str, req: Resources, lim: Resources) -> str | None:
    high = _q(given)
    if name not in lim:
        return f"Maximum {name} usage per {kind} is {given}.  No limit is specified."
    if lim[name] > high:
        return f"Maximum {name} usage per {kind} is {given}, but limit is {_said(lim[name])}."
    if name in req and req[name] > high:
        return f"Maximum {name} usage per {kind} is {given}, but request is {_said(req[name])}."
    return None


def _ratio(kind: str, name: str, given: str, req: Resources, lim: Resources) -> str | None:
    most = _q(given)
    if not req.get(name):
        return f"{name} max limit to request ratio per {kind} is {given}, but no request is specified or request is 0."
    if not lim.get(name):
        return f"{name} max limit to request ratio per {kind} is {given}, but no limit is specified or limit is 0."
    if lim[name] / req[name] > most:
        return (f"{name} max limit to request ratio per {kind} is {given}, but provided ratio is "
                f"{float(lim[name] / req[name]):f}.")
    return None


def _checks(kind: str, item: KubeObject, req: Resources, lim: Resources) -> list[str]:
    out = []
    for rule, field in ((_min, ("min", "min")), (_max, ("max", "max")),
                        (_ratio, ("max_limit_request_ratio", "maxLimitRequestRatio"))):
        for name, value in (_field(item, *field) or {}).items():
            said = rule(kind, name, str(value), req, lim)
            if said:
                out.append(said)
    return out


def _pod_total(containers: list[tuple[Resources, Resources]], inits: list[tuple[Resources, Resources]]
               ) -> tuple[Resources, Resources]:
    def total(which: int) -> Resources:
        names = {k for c in containers for k in c[which]}
        out = {k: sum((c[which][k] for c in containers), Decimal(0)) for k in names
               if all(k in c[which] for c in containers)}
        for c in inits:  # max(sum of the containers, any init container)
            for k, v in c[which].items():
                out[k] = max(out.get(k, v), v)
        return out

    return total(0), total(1)


def _defaults(item: KubeObject, containers: list[tuple[object, Resources, Resources]]) -> None:
    """A `Container` limit item's defaultRequest and default, set on each container that does not
    state them (the LimitRanger's defaulting, before any bound is checked)."""
    if _field(item, "type", "type") != "Container":
        return
    for _, req, lim in containers:
        for k, v in (_field(item, "default_request", "defaultRequest") or {}).items():
            req.setdefault(k, _q(v))
        for k, v in (_field(item, "default", "default") or {}).items():
            lim.setdefault(k, _q(v))


def refusals(pod: JsonMapping, ranges: list[KubeObject]) -> list[tuple[str, str]]:
    """[(LimitRange name, the plugin's message)] for each constraint the pod (its spec, as JSON) breaks."""
    containers = [(c.get("name"), *_resources(c)) for c in pod.get("containers") or []]
    inits = [(c.get("name"), *_resources(c)) for c in pod.get("initContainers") or []]
    out: list[tuple[str, str]] = []
    for lr in ranges:
        name = str(_field(_field(lr, "metadata", "metadata"), "name", "name"))
        items = list(_field(_field(lr, "spec", "spec") or {}, "limits", "limits") or [])
        for item in items:  # this range's defaults on every container that does not state them
            _defaults(item, containers + inits)
        for item in items:
            kind = _field(item, "type", "type")
            if kind == "Container":
                for cname, req, lim in containers + inits:
                    out += [(name, f"{said} (container {cname})") for said in _checks(kind, item, req, lim)]
            elif kind == "Pod":
                req, lim = _pod_total([(r, m) for _, r, m in containers], [(r, m) for _, r, m in inits])
                out += [(name, said) for said in _checks(kind, item, req, lim)]
    return out


def job_pod(launcher: KubernetesLauncher, spec: ClusterSpec, job: JobSpec) -> JsonObject:
    """The pod spec (as JSON) the run's Job (or PyTorchJob master) will carry: the launcher's own plan and
    manifests, the user's options added (`Platform.shape`)."""
    from kubernetes.client import ApiClient

    from gpucluster.infra.kubernetes.manifests import job_manifest, pytorchjob_manifest
    from gpucluster.infra.kubernetes.plan import plan_job

    cluster = Cluster(name=spec.name, cloud=spec.cloud, nodes=(), gpus_per_node=spec.gpus_per_node or 0,
                      outputs={"nodes": spec.nodes, "max_lifetime_minutes": spec.max_lifetime_minutes})
    plan = plan_job(cluster, job, namespace=str(spec.option("namespace") or launcher.namespace), image=launcher.image,
                    mode=launcher.mode, start_deadline_s=launcher.start_deadline_s,
                    collect_wait_s=launcher.collect_wait_s, platform=launcher.platform)
    shape = launcher.platform.shape
    if plan.mode == "job":
        body = ApiClient().sanitize_for_serialization(shape("job", job_manifest(plan)))
        return dict(body["spec"]["template"]["spec"])
    body = shape("pytorchjob", pytorchjob_manifest(plan))
    return dict(body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"])


def pod_usage(pod: JsonMapping, ranges: list[KubeObject]) -> tuple[Resources, Resources, dict[str, list[str]]]:
    """(the pod's requests, its limits, {"requests.cpu": [containers not stating it], ...}) once the LimitRanges'
    defaults are set, as the ResourceQuota admission counts a pod after the LimitRanger (the pod's usage: the
    containers' sum, or an init container's when larger; a compute resource the quota tracks must be stated by
    every container: kubernetes/kubernetes pkg/quota/v1/evaluator/core/pods.go `podComputeUsageHelper`,
    `enforcePodContainerConstraints`)."""
    containers = [(c.get("name"), *_resources(c)) for c in pod.get("containers") or []]
    inits = [(c.get("name"), *_resources(c)) for c in pod.get("initContainers") or []]
    for lr in ranges:
        for item in list(_field(_field(lr, "spec", "spec") or {}, "limits", "limits") or []):
            _defaults(item, containers + inits)
    missing = {f"{which}.{r}": [str(n) for n, req, lim in containers + inits if r not in (req if which == "requests" else lim)]
               for which in ("requests", "limits") for r in ("cpu", "memory")}
    req, lim = _pod_total([(r, m) for _, r, m in containers], [(r, m) for _, r, m in inits])
    return req, lim, missing
