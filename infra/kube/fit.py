"""Whether a run fits the cluster, judged from what the API server says before anything is created.

The scheduler's rules that decide it (Kubernetes docs): a pod goes only to a node that is schedulable
(`spec.unschedulable` unset: "Safely Drain a Node", cordon), whose labels match its nodeSelector
("Assigning Pods to Nodes"), whose NoSchedule and NoExecute taints it all tolerates ("Taints and
Tolerations"; PreferNoSchedule only steers), and whose allocatable extended resource, less what the pods
already bound there request, covers its request ("Resource Management for Pods and Containers": extended
resources such as nvidia.com/gpu are integers, never overcommitted). The run's pods avoid sharing a node
(its required pod anti-affinity on kubernetes.io/hostname), so N pods need N distinct such nodes.
With `--gpu TYPE` only the nodes whose GPU feature discovery label names TYPE count (gpus.py: the rule, and
the refusals when no node carries it or the label is missing); their product values select the pods' nodes.
A ResourceQuota admits an object only while `used + request <= hard` for each resource it names
("Resource Quotas"; extended resources only as `requests.<name>`; object counts as `count/<resource>` or
the short names pods, services, configmaps, secrets); with `requests.cpu`/`requests.memory` (or `limits.*`)
set, a pod that does not say them is refused at admission.

"Ever": the largest allocatable cannot hold the request, or a quota's hard limit is below it.
"Now": the free GPUs or a quota's remaining room are too small today. Without a Kueue queue a run that
does not fit now is refused (its pods would wait Pending up to the start deadline for GPUs others hold);
with one, Kueue holds the Job until it is admitted, and the wait is said instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpucluster.errors import UsageError
from gpucluster.states import JsonMapping, JsonObject

from .gpus import PRODUCT_LABEL, GpuNodes
from .options import GPU_RESOURCE, Passthrough

if TYPE_CHECKING:
    from gpucluster.infra.kubernetes.api import KubeClient, KubeObject, Retry

OUR_TOLERATION = (GPU_RESOURCE, None, "NoSchedule")  # infra/kubernetes/manifests.py: every pod tolerates it


@dataclass
class Fit:
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    gpu: GpuNodes | None = None  # --gpu TYPE: the nodes carrying it (gpus.py), for the pods' node selection


def _quantity(value: object) -> float:
    from kubernetes.utils import parse_quantity

    try:
        return float(parse_quantity(str(value)))
    except Exception:  # noqa: BLE001 - a quantity we cannot read counts as none
        return 0.0


def _tolerated(taint: KubeObject, tolerations: list[tuple[str, str | None, str]]) -> bool:
    if taint.effect not in ("NoSchedule", "NoExecute"):
        return True
    return any(k == taint.key and (v is None or v == (taint.value or "")) and e == taint.effect
               for k, v, e in tolerations)


def node_room(nodes: list[KubeObject], resource: str, passthrough: Passthrough,
              gpu: GpuNodes | None = None) -> tuple[list[tuple[str, float]], list[str]]:
    """([(node, allocatable)] of the nodes (those offering `resource`) the pods may go to, [why each other
    node may not]); with `gpu`, the nodes without that GPU are left out of both (its check said them)."""
    tolerations = [OUR_TOLERATION] + [(t.key, t.value, t.effect) for t in passthrough.tolerations]
    selector = dict(passthrough.node_selector)
    eligible, others = [], []
    for n in nodes:
        name, labels = n.metadata.name, n.metadata.labels or {}
        if gpu is not None and not gpu.admits(labels):
            continue
        have = _quantity((n.status.allocatable or {}).get(resource, 0))
        wrong = [f"{k}={labels.get(k, '(unset)')}" for k, v in selector.items() if labels.get(k) != v]
        taints = [t for t in (n.spec.taints or []) if not _tolerated(t, tolerations)]
        if n.spec.unschedulable:
            others.append(f"{name}: cordoned")
        elif wrong:
            others.append(f"{name}: label {', '.join(wrong)}")
        elif taints:
            said = ", ".join(f"{t.key}={t.value or ''}:{t.effect}" for t in taints)
            others.append(f"{name}: taint {said} not tolerated")
        else:
            eligible.append((name, have))
    return eligible, others


def offered(nodes: list[KubeObject]) -> list[str]:
    """The extended resources any node offers (their names), for the refusal of one none offers."""
    names = set()
    for n in nodes:
        names |= {k for k, v in (n.status.allocatable or {}).items() if "/" in k and _quantity(v) > 0}
    return sorted(names)


def bound_requests(core: KubeClient, resource: str, retry: Retry) -> dict[str, float] | None:
    """{node: `resource` requested by the pods bound there and not ended}; None when the user may not list
    every namespace's pods (then the "now" check is skipped, and said)."""
    from gpucluster.infra.kubernetes.api import _status

    try:
        pods = retry.call(core.list_pod_for_all_namespaces).items
    except Exception as exc:  # noqa: BLE001 - ApiException lives in the lazily imported SDK
        if _status(exc) == 403:
            return None
        raise
    used: dict[str, float] = {}
    for p in pods:
        if not p.spec.node_name or (p.status and p.status.phase in ("Succeeded", "Failed")):
            continue
        for c in p.spec.containers or []:
            req = (c.resources.requests or {}) if c.resources else {}
            lim = (c.resources.limits or {}) if c.resources else {}
            used[p.spec.node_name] = used.get(p.spec.node_name, 0.0) + _quantity(req.get(resource, lim.get(resource, 0)))
    return used


def check_nodes(core: KubeClient, nodes: int, gpus: int, resource: str, passthrough: Passthrough, queued: bool,
                retry: Retry, fit: Fit, gpu: str | None = None, pinned: str | None = None) -> None:
    """Whether `nodes` pods of `gpus` fit; with `gpu` (--gpu TYPE), only on the nodes carrying it (gpus.py),
    which `fit.gpu` then names for the pods' node selection. `pinned`: the product value the user gave."""
    if gpus <= 0:
        return
    from .gpus import choose

    listed = _listed_nodes(core, resource, retry, fit, gpu, pinned)
    if listed is None:
        return
    offering = _offering(listed, resource)
    if gpu:
        fit.gpu = choose(offering, gpu, resource, pinned)
        fit.notes.append(fit.gpu.said())
    eligible, others = node_room(offering, resource, passthrough, fit.gpu)
    kind = f" {gpu}" if gpu else ""
    asked = f"{nodes} node{'s' if nodes > 1 else ''} × {gpus}{kind} GPU{'s' if gpus > 1 else ''} requested"
    _check_ever(asked, [have for _, have in eligible], others, nodes, gpus, resource, gpu)
    used = bound_requests(core, resource, retry)
    if used is None:
        fit.skipped.append("free GPUs now (this user may not list every namespace's pods)")
        return
    _check_now(asked, eligible, used, nodes, gpus, resource, queued, fit)


def _listed_nodes(core: KubeClient, resource: str, retry: Retry, fit: Fit, gpu: str | None,
                  pinned: str | None) -> list[KubeObject] | None:
    """The cluster's nodes; None when this user may not list them (said in `fit`, with the GPU assumed)."""
    from gpucluster.infra.kubernetes.api import _status

    from .gpus import assumed

    try:
        return list(retry.call(core.list_node).items)
    except Exception as exc:  # noqa: BLE001 - ApiException lives in the lazily imported SDK
        if _status(exc) != 403:
            raise
        fit.skipped.append(f"the nodes' {resource} (this user may not list nodes: a namespaced Role cannot grant it)")
        if gpu:
            fit.gpu = assumed(gpu, pinned)
            fit.skipped.append(f"which nodes carry GPU {gpu} (their {PRODUCT_LABEL} labels): the pods select "
                               f"{', '.join(fit.gpu.products)}, the values GPU feature discovery writes for it; "
                               "--option gpu-product=VALUE pins the one your nodes carry")
        return None


def _offering(listed: list[KubeObject], resource: str) -> list[KubeObject]:
    """The nodes offering `resource`; refused when none does."""
    offering = [n for n in listed if _quantity((n.status.allocatable or {}).get(resource, 0)) > 0]
    if not offering:
        have = offered(listed)
        raise UsageError(f"no node of the cluster offers {resource} (offered: {', '.join(have) or 'no extended resource'})"
                         "; name the GPU resource with --option gpu-resource=NAME, or install the device plugin")
    return offering


def _check_ever(asked: str, haves: list[float], others: list[str], nodes: int, gpus: int, resource: str,
                gpu: str | None) -> None:
    """Refused when fewer than `nodes` eligible nodes could ever hold `gpus`."""
    why = f"; not eligible: {'; '.join(others)}" if others else ""
    big = sorted(haves, reverse=True)
    if len([h for h in big if h >= gpus]) < nodes:
        node_ = f"node with GPU {gpu}" if gpu else "node"
        largest = (f"the largest {node_} has {int(big[0])} allocatable {resource}" if big
                   else f"no {node_} the pods may use has {resource}")
        enough = len([h for h in big if h >= gpus])
        raise UsageError(f"{asked}; {largest}" + (f" and {enough} node(s) have {gpus}" if big and enough else "")
                         + f"{why}: it can never fit (ask for fewer GPUs per node with --gpus-per-node, or fewer nodes)")


def _check_now(asked: str, eligible: list[tuple[str, float]], used: dict[str, float], nodes: int, gpus: int,
               resource: str, queued: bool, fit: Fit) -> None:
    """Whether `nodes` eligible nodes have `gpus` free now; refused when not, unless a Kueue queue waits for it."""
    free = sorted((have - used.get(name, 0.0) for name, have in eligible), reverse=True)
    room = len([f for f in free if f >= gpus])
    if room < nodes:
        text = (f"{asked}; {room} node(s) have {gpus} free {resource} now (the others' GPUs are held by running pods)")
        if not queued:
            raise UsageError(text + ": it does not fit now; try later, ask for less, or give a Kueue queue "
                                    "(--option queue=NAME) to wait for it")
        fit.notes.append(text + "; the queue's admission is waited for")
    else:
        fit.notes.append(f"fits: {room} eligible node(s) have {gpus} free {resource} now")


def needs(nodes: int, gpus: int, resource: str, mode: str, secrets: bool) -> dict[str, float]:
    """What the run's objects count against a quota."""
    out = {f"requests.{resource}": float(nodes * gpus), "pods": float(nodes), f"count/pods": float(nodes),
           "configmaps": 1.0, "count/configmaps": 1.0}
    if mode == "job":
        out.update({"services": 1.0, "count/services": 1.0, "count/jobs.batch": 1.0})
    if secrets:
        out.update({"secrets": 1.0, "count/secrets": 1.0})
    return out


KUEUE_GROUP, KUEUE_VERSION, LOCAL_QUEUES = "kueue.x-k8s.io", "v1beta1", "localqueues"


def check_queue(custom: KubeClient, namespace: str, queue: str, retry: Retry, fit: Fit, resource: str = GPU_RESOURCE,
                total: float = 0) -> None:
    """The Kueue LocalQueue the Job names exists in the namespace (Kueue docs, "Local Queue": a Job whose
    queue-name label names no LocalQueue stays suspended, "LocalQueue ... doesn't exist", and would wait out
    the start deadline). A 404 is also what a cluster without Kueue's CRDs answers. Then its ClusterQueue's
    quota for `resource` against the job's `total` (`cluster_queue_room`)."""
    from gpucluster.infra.kubernetes.api import _status

    try:
        local = retry.call(custom.get_namespaced_custom_object, KUEUE_GROUP, KUEUE_VERSION, namespace, LOCAL_QUEUES,
                           queue)
    except Exception as exc:  # noqa: BLE001 - ApiException lives in the lazily imported SDK
        if _status(exc) == 404:
            raise UsageError(f"no Kueue LocalQueue {queue!r} in namespace {namespace} (or Kueue is not installed): "
                             "the Job would stay suspended; `kubectl get localqueues -n " + namespace + "` lists them"
                             ) from None
        if _status(exc) != 403:
            raise
        fit.skipped.append(f"the Kueue LocalQueue {queue} (this user may not get localqueues in {namespace})")
        return
    fit.notes.append(f"Kueue LocalQueue {queue} exists in {namespace}")
    cq = str(((local or {}).get("spec") or {}).get("clusterQueue") or "")
    if cq and total > 0:
        cluster_queue_room(custom, cq, queue, resource, total, retry, fit)


def cluster_queue_room(custom: KubeClient, name: str, queue: str, resource: str, total: float, retry: Retry,
                       fit: Fit) -> None:
    """Whether Kueue can ever admit `total` of `resource` from ClusterQueue `name` (kueue.x-k8s.io/v1beta1): one
    podset's request goes to one flavor that covers the resource, and a flavor whose potential capacity is below
    it is "insufficient quota ... request > maximum capacity" for ever (kubernetes-sigs/kueue
    pkg/scheduler/flavorassigner/flavorassigner.go `fitsResourceQuota`: the capacity is the ClusterQueue's
    `PotentialAvailable`, its nominalQuota, plus its borrowingLimit when it is in a cohort). In a cohort with no
    borrowingLimit it may borrow whatever the cohort lends: not judged here. A user who may not read
    clusterqueues (cluster-scoped) gets "not checked"."""
    from gpucluster.infra.kubernetes.api import _status

    try:
        cq = retry.call(custom.get_cluster_custom_object, KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", name) or {}
    except Exception as exc:  # noqa: BLE001 - ApiException lives in the lazily imported SDK
        if _status(exc) not in (403, 404):
            raise
        why = "this user may not get clusterqueues" if _status(exc) == 403 else "it was not found"
        fit.skipped.append(f"the room in Kueue ClusterQueue {name} of LocalQueue {queue} ({why})")
        return
    spec = cq.get("spec") or {}
    cohort = spec.get("cohort") or spec.get("cohortName")
    flavors, unbounded = _flavor_capacity(spec, resource, bool(cohort))
    if unbounded:
        fit.skipped.append(f"the room in Kueue ClusterQueue {name}: it may borrow {resource} from cohort {cohort} "
                           "without a limit")
        return
    if not flavors:
        raise UsageError(f"Kueue ClusterQueue {name} (of LocalQueue {queue}) has no quota for {resource}: Kueue "
                         "would never admit the Job; ask for a queue whose ClusterQueue covers it")
    if all(total > most for _, most in flavors):
        said = ", ".join(f"{f} {most:g}" for f, most in flavors)
        raise UsageError(f"{total:g} {resource} requested; Kueue ClusterQueue {name} (of LocalQueue {queue}) can admit "
                         f"at most {said} (nominalQuota{' + borrowingLimit, cohort ' + str(cohort) if cohort else ''}): "
                         "it would never be admitted (ask for fewer GPUs or nodes, or another queue)")
    fit.notes.append(f"Kueue ClusterQueue {name} has room for {total:g} {resource} in flavor "
                     f"{next(f for f, most in flavors if total <= most)}")


def _flavor_capacity(spec: JsonMapping, resource: str, cohort: bool) -> tuple[list[tuple[str, float]], bool]:
    """([(flavor, the most of `resource` it can admit)], whether one may borrow without a limit) of a
    ClusterQueue's spec."""
    flavors, unbounded = [], False
    for group in spec.get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for res in flavor.get("resources") or []:
                if res.get("name") != resource:
                    continue
                most = _quantity(res.get("nominalQuota", 0))
                if cohort:
                    if res.get("borrowingLimit") is None:
                        unbounded = True
                    most += _quantity(res.get("borrowingLimit") or 0)
                flavors.append((str(flavor.get("name")), most))
    return flavors, unbounded


def check_limits(core: KubeClient, namespace: str, pod: JsonObject | None, resource: str, gpus: int, retry: Retry,
                 fit: Fit) -> list[KubeObject]:
    """Each LimitRange of the namespace against the pod the run's Job will make, as the LimitRanger admission
    plugin judges it at the pod's create (limits.py: min, max and maxLimitRequestRatio, per container and per pod,
    after its defaults); without the pod (none planned), the GPUs one container asks for against each `max`.
    Returns the LimitRanges read (their defaults count in a ResourceQuota's check)."""
    from gpucluster.infra.kubernetes.api import _status

    try:
        ranges = list(retry.call(core.list_namespaced_limit_range, namespace).items)
    except Exception as exc:  # noqa: BLE001 - ApiException lives in the lazily imported SDK
        if _status(exc) != 403:
            raise
        fit.skipped.append(f"the namespace's LimitRanges (this user may not list limitranges in {namespace})")
        return []
    if pod is not None:
        from .limits import refusals

        refused = refusals(pod, ranges)
        if refused:
            more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
            raise UsageError(f"LimitRange {refused[0][0]} in namespace {namespace} refuses the run's pods: "
                             f"{refused[0][1]}{more}; the API server would refuse every pod the Job makes")
        if ranges:
            fit.notes.append(f"the run's pods pass the namespace's LimitRanges ({', '.join(lr.metadata.name for lr in ranges)})")
        return ranges
    for lr in ranges if gpus > 0 else []:
        for item in (lr.spec.limits or []) if lr.spec else []:
            most = (item.max or {}).get(resource)
            if item.type in ("Container", "Pod") and most is not None and _quantity(most) < gpus:
                raise UsageError(f"LimitRange {lr.metadata.name} in namespace {namespace} allows at most {most} "
                                 f"{resource} per {item.type.lower()}; the run asks {gpus} (--gpus-per-node)")
    return ranges


COMPUTE = {"requests.cpu": "requests.cpu", "cpu": "requests.cpu", "requests.memory": "requests.memory",
           "memory": "requests.memory", "limits.cpu": "limits.cpu", "limits.memory": "limits.memory"}


def compute_needs(pod: JsonObject, ranges: list[KubeObject], nodes: int, quota: str, namespace: str,
                  hard: dict[str, float]) -> dict[str, float]:
    """What N of the run's pods count against a quota's CPU and memory keys (ResourceQuota docs: `cpu` is
    `requests.cpu`); a key it tracks that a container does not state (after the LimitRanges' defaults) is the
    quota admission's refusal, said here."""
    from .limits import pod_usage

    req, lim, missing = pod_usage(pod, ranges)
    out = {}
    for key in hard:
        if key not in COMPUTE:
            continue
        which = COMPUTE[key]
        if missing[which]:
            raise UsageError(f"ResourceQuota {quota} in namespace {namespace} limits {key}, so every container must "
                             f"state {which}, and the run's {', '.join(missing[which])} do not (no LimitRange default "
                             "sets it): use a namespace whose LimitRange gives defaults, or one without that quota")
        amount = (req if which.startswith("requests.") else lim)[which.split(".", 1)[1]]
        out[key] = float(amount) * nodes
    return out


def check_quota(core: KubeClient, namespace: str, need: dict[str, float], retry: Retry, fit: Fit,
                pod: JsonObject | None = None, ranges: list[KubeObject] | None = None, nodes: int = 1) -> None:
    """Each ResourceQuota of the namespace against what the run's objects will ask for (CPU and memory: the
    pods as the LimitRanges' defaults leave them, `compute_needs`)."""
    from gpucluster.infra.kubernetes.api import _status

    try:
        quotas = retry.call(core.list_namespaced_resource_quota, namespace).items
    except Exception as exc:  # noqa: BLE001 - ApiException lives in the lazily imported SDK
        if _status(exc) != 403:
            raise
        fit.skipped.append(f"the namespace's ResourceQuotas (this user may not list resourcequotas in {namespace})")
        return
    for q in quotas:
        _check_one_quota(q, need, namespace, pod, ranges, nodes)
    if quotas:
        fit.notes.append(f"fits the namespace's ResourceQuota ({', '.join(q.metadata.name for q in quotas)})")


def _check_one_quota(q: KubeObject, need: dict[str, float], namespace: str, pod: JsonObject | None,
                     ranges: list[KubeObject] | None, nodes: int) -> None:
    """One ResourceQuota (`q`) against what the run's objects will ask for."""
    hard = {k: _quantity(v) for k, v in ((q.status.hard if q.status and q.status.hard else None)
                                         or (q.spec.hard or {})).items()}
    used = {k: _quantity(v) for k, v in ((q.status.used if q.status else None) or {}).items()}
    wanted = dict(need)
    if pod is not None:
        wanted.update(compute_needs(pod, ranges or [], nodes, q.metadata.name, namespace, hard))
    else:
        for key in COMPUTE:
            if key in hard:
                raise UsageError(f"ResourceQuota {q.metadata.name} in namespace {namespace} limits {key}, so every "
                                 "pod must state it, and gpucluster's training container states no CPU or memory: "
                                 "use a namespace without that quota")
    for key, amount in wanted.items():
        if key not in hard or amount <= 0:
            continue
        if amount > hard[key]:
            raise UsageError(f"ResourceQuota {q.metadata.name} in namespace {namespace} allows {key} "
                             f"{hard[key]:g}; the run needs {amount:g}: it can never fit there")
        if used.get(key, 0.0) + amount > hard[key]:
            raise UsageError(f"ResourceQuota {q.metadata.name} in namespace {namespace} allows {key} {hard[key]:g} "
                             f"with {used.get(key, 0.0):g} in use; the run needs {amount:g}: it does not fit now")
