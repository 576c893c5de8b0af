"""FAKE scheduler for tests/k8s_fake.py: GPU nodes with real-like capacity, and a pod placed only
where what it requests fits what is left of a node.

Each rule with its public source:

- A node's memory capacity is what the kernel reports (MemTotal), below the machine type's nominal
  memory: the firmware and the kernel keep some. Measured on GKE nodes: 1.6-2 % below nominal
  (2i2c-org/infrastructure node-capacity data, issue #2121; their PR #804 hit it on n1-standard-32).
  Here: 1.8 % (`MEMTOTAL_SHORTFALL`).
- Allocatable = capacity - kube-reserved - the eviction threshold (Kubernetes docs, "Reserve Compute
  Resources for System Daemons"); GKE reserves memory by the machine's memory: 25 % of the first
  4 GiB, 20 % of the next 4, 10 % of the next 8, 6 % of the next 112, 2 % above 128, and CPU 6 % of
  the first core, 1 % of the next, 0.5 % of the next 2, 0.25 % above 4, with a 100 MiB eviction
  threshold (GKE docs, "Standard cluster architecture", "Node allocatable resources").
- GKE's own DaemonSets on a GPU node (fluentbit, gke-metadata-server, nvidia device plugin, kube-proxy,
  pdcsi, netd, ...) request 566-656 MiB of memory and about 0.3 CPU per node (2i2c-org/infrastructure
  issue #2121's measurements): `DAEMONSET_MEM_MI`, `DAEMONSET_CPU_M` are taken from every node first.
- The scheduler places a pod on a node only when the sum of its containers' requests (init
  containers: the largest one, as they run one at a time) fits the node's allocatable minus the
  requests of the pods already there, for CPU, memory and extended resources such as nvidia.com/gpu
  (a limit alone is also the request) — Kubernetes docs, "Resource Management for Pods and
  Containers", "How Pods with resource requests are scheduled"; otherwise the pod stays Pending with
  a `FailedScheduling` event "0/N nodes are available: N Insufficient memory." and the condition
  PodScheduled=False, reason Unschedulable.
- A pod goes only to a node whose labels match its `nodeSelector` (every key, equal values) and its required
  node affinity (`affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`:
  the terms ORed, each term's `matchExpressions` ANDed; operators In, NotIn, Exists, DoesNotExist, Gt, Lt,
  NotIn and DoesNotExist also matching a node without the key) — Kubernetes docs, "Assigning Pods to Nodes"
  (https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/, "nodeSelector" and "Node
  affinity": "If you specify both nodeSelector and nodeAffinity, both must be satisfied"; "If you specify
  multiple terms in nodeSelectorTerms ... the Pod can be scheduled onto a node if one of the specified terms
  can be satisfied"; "If you specify multiple expressions in a single matchExpressions field ... the Pod can
  be scheduled onto a node only if all the expressions are satisfied"); the rest counts as "node(s) didn't
  match Pod's node affinity/selector" in FailedScheduling.
- A node's NoSchedule and NoExecute taints keep off every pod that does not tolerate them (operator Equal:
  key, value and effect; Exists: key and effect, or every taint with an empty key; an empty effect tolerates
  every effect) — Kubernetes docs, "Taints and Tolerations"; counted as "node(s) had untolerated taint".
- Required pod anti-affinity with topologyKey `kubernetes.io/hostname` (what gpucluster's pods carry): a pod
  does not go to a node where a pod whose labels match the term's `labelSelector.matchLabels` is bound
  (same page, "Inter-pod affinity and anti-affinity"); counted as "node(s) didn't match pod anti-affinity rules".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from k8s_fake_objects import _get

GIB_MI = 1024
MEMTOTAL_SHORTFALL = 0.018
DAEMONSET_MEM_MI = 620
DAEMONSET_CPU_M = 300


def gke_reserved(vcpus: float, mem_gib: float) -> tuple[float, float]:
    """(CPUs, GiB) GKE keeps from pods on a node of this machine type (the formula above)."""
    cpu, left = 0.0, float(vcpus)
    for size, rate in ((1, 0.06), (1, 0.01), (2, 0.005), (float("inf"), 0.0025)):
        part = min(left, size)
        cpu, left = cpu + part * rate, left - part
    mem, left = 0.1, float(mem_gib)
    for size, rate in ((4, 0.25), (4, 0.20), (8, 0.10), (112, 0.06), (float("inf"), 0.02)):
        part = min(left, size)
        mem, left = mem + part * rate, left - part
    return cpu, mem


@dataclass
class FakeNode:
    name: str
    cpu_m: int  # allocatable
    mem_mi: int
    gpus: int
    labels: dict = field(default_factory=dict)
    taints: list = field(default_factory=list)  # {"key", "value", "effect"} as the Node's spec.taints
    used: dict = field(default_factory=lambda: {"cpu": 0, "memory": 0, "gpu": 0})  # requests of the pods on it
    daemonsets: list = field(default_factory=list)  # (cpu_m, mem_mi) of each DaemonSet pod on it


def gke_node(name: str, vcpus: int, mem_gib: float, gpus: int, labels: dict | None = None, *,
             shortfall: float = MEMTOTAL_SHORTFALL, daemonset_mi: int = DAEMONSET_MEM_MI) -> FakeNode:
    """A GKE node of a machine type with `mem_gib` nominal memory: allocatable as the kubelet reports
    it, with GKE's DaemonSets already on it (their pods listed by `list_pod_for_all_namespaces`)."""
    capacity_mi = mem_gib * (1 - shortfall) * GIB_MI
    cpu_res, mem_res = gke_reserved(vcpus, mem_gib)
    node = FakeNode(name, int((vcpus - cpu_res) * 1000), int(capacity_mi - mem_res * GIB_MI), gpus, dict(labels or {}))
    node.daemonsets = [(DAEMONSET_CPU_M // 2, daemonset_mi // 2), (DAEMONSET_CPU_M - DAEMONSET_CPU_M // 2,
                                                                   daemonset_mi - daemonset_mi // 2)]
    node.used = {"cpu": DAEMONSET_CPU_M, "memory": daemonset_mi, "gpu": 0}
    return node


class NodeViews:
    """Mixin of FakeKubeApi: the scheduler's nodes as `list_node` shows them (status.allocatable) and the
    DaemonSet pods bound to each (`list_pod_for_all_namespaces(field_selector="spec.nodeName=N")`),
    owned by their DaemonSet (Kubernetes API reference, Node and Pod; "DaemonSet": one pod per node).
    Without a scheduler the pool has no node (scaled to zero)."""

    def list_node(self, label_selector=None, **kw):
        from types import SimpleNamespace as NS

        self.calls.append(("list", "node", "", label_selector))
        self._authenticate()
        want = dict(kv.split("=", 1) for kv in (label_selector or "").split(",") if "=" in kv)
        nodes = self.scheduler.nodes if self.scheduler is not None else []
        return NS(items=[NS(metadata=NS(name=n.name, labels=dict(n.labels)), spec=NS(unschedulable=None, taints=[]),
                            status=NS(allocatable={"cpu": f"{n.cpu_m}m", "memory": f"{n.mem_mi}Mi",
                                                   "nvidia.com/gpu": str(n.gpus)}))
                         for n in nodes if all(n.labels.get(k) == v for k, v in want.items())])

    def list_pod_for_all_namespaces(self, field_selector=None, **kw):
        from types import SimpleNamespace as NS

        self.calls.append(("list", "pod", "", field_selector))
        self._authenticate()
        name = (field_selector or "").partition("spec.nodeName=")[2]
        items = []
        for n in self.scheduler.nodes if self.scheduler is not None else []:
            if name and n.name != name:
                continue
            for i, (cpu, mem) in enumerate(n.daemonsets):
                items.append(NS(metadata=NS(name=f"ds{i}-{n.name}", namespace="kube-system",
                                            owner_references=[NS(kind="DaemonSet", name=f"gke-ds{i}")]),
                                spec=NS(node_name=n.name, init_containers=None, containers=[NS(resources=NS(
                                    requests={"cpu": f"{cpu}m", "memory": f"{mem}Mi"}, limits=None))]),
                                status=NS(phase="Running")))
        return NS(items=items)


def quantity_m(text) -> int:
    """CPU quantity in millicores."""
    text = str(text)
    return int(text[:-1]) if text.endswith("m") else int(float(text) * 1000)


def quantity_mi(text) -> int:
    """Memory quantity in MiB."""
    text = str(text)
    for suffix, mi in (("Ki", 1 / 1024), ("Mi", 1), ("Gi", 1024), ("Ti", 1024 * 1024), ("M", 1e6 / 2**20),
                       ("G", 1e9 / 2**20)):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * mi)
    return int(int(text) / 2**20)


def _container_requests(c) -> dict:
    res = _get(c, "resources")
    requests, limits = dict(_get(res, "requests") or {}), dict(_get(res, "limits") or {})
    for key, value in limits.items():  # a limit without a request is the request
        requests.setdefault(key, value)
    return {"cpu": quantity_m(requests["cpu"]) if "cpu" in requests else 0,
            "memory": quantity_mi(requests["memory"]) if "memory" in requests else 0,
            "gpu": int(requests.get("nvidia.com/gpu", 0))}


def pod_requests(pod_spec) -> dict:
    """The pod's effective requests: the sum of its app containers', or its largest init container's."""
    total = {"cpu": 0, "memory": 0, "gpu": 0}
    for c in _get(pod_spec, "containers") or []:
        for key, value in _container_requests(c).items():
            total[key] += value
    for c in _get(pod_spec, "init_containers") or _get(pod_spec, "initContainers") or []:
        for key, value in _container_requests(c).items():
            total[key] = max(total[key], value)
    return total


def _expression_matches(expr, labels: dict) -> bool:
    key, op = _get(expr, "key"), _get(expr, "operator")
    values = [str(v) for v in (_get(expr, "values") or [])]
    if op == "In":
        return key in labels and str(labels[key]) in values
    if op == "NotIn":
        return key not in labels or str(labels[key]) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt"):
        try:
            have, bound = int(labels[key]), int(values[0])
        except (KeyError, IndexError, ValueError):
            return False
        return have > bound if op == "Gt" else have < bound
    raise ValueError(f"unknown node selector operator {op!r}")  # the API server's validation refuses it


def node_matches(pod_spec, labels: dict) -> bool:
    """The pod's nodeSelector and required node affinity against a node's labels (module docstring)."""
    selector = dict(_get(pod_spec, "node_selector") or _get(pod_spec, "nodeSelector") or {})
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    node_affinity = _get(_get(pod_spec, "affinity"), "node_affinity") or _get(_get(pod_spec, "affinity"), "nodeAffinity")
    required = (_get(node_affinity, "required_during_scheduling_ignored_during_execution")
                or _get(node_affinity, "requiredDuringSchedulingIgnoredDuringExecution"))
    if required is None:
        return True
    terms = _get(required, "node_selector_terms") or _get(required, "nodeSelectorTerms") or []
    return any(all(_expression_matches(e, labels)
                   for e in (_get(t, "match_expressions") or _get(t, "matchExpressions") or [])) for t in terms)


def tolerated(pod_spec, taint: dict) -> bool:
    if taint.get("effect") not in ("NoSchedule", "NoExecute"):
        return True  # PreferNoSchedule only steers
    for t in _get(pod_spec, "tolerations") or []:
        key, op, effect = _get(t, "key"), _get(t, "operator") or "Equal", _get(t, "effect")
        if effect and effect != taint.get("effect"):
            continue
        if op == "Exists" and (not key or key == taint.get("key")):
            return True
        if op == "Equal" and key == taint.get("key") and (_get(t, "value") or "") == (taint.get("value") or ""):
            return True
    return False


class Scheduler:
    """Binds pods to nodes, first fit; `place` -> None when bound, else the FailedScheduling message."""

    def __init__(self, nodes: list[FakeNode]):
        self.nodes = nodes
        self.bound: dict[str, tuple[FakeNode, dict]] = {}
        self.labels: dict[str, dict] = {}  # the bound pods' labels (pod anti-affinity)

    def _repelled(self, pod_spec, node: FakeNode) -> bool:
        anti = _get(pod_spec, "affinity", "pod_anti_affinity") or _get(pod_spec, "affinity", "podAntiAffinity")
        terms = (_get(anti, "required_during_scheduling_ignored_during_execution")
                 or _get(anti, "requiredDuringSchedulingIgnoredDuringExecution") or [])
        for term in terms:
            if (_get(term, "topology_key") or _get(term, "topologyKey")) != "kubernetes.io/hostname":
                continue
            match = dict(_get(term, "label_selector", "match_labels") or _get(term, "labelSelector", "matchLabels") or {})
            if any(bound_node is node and all(self.labels.get(name, {}).get(k) == v for k, v in match.items())
                   for name, (bound_node, _) in self.bound.items()):
                return True
        return False

    def place(self, pod_name: str, pod_spec, holds=None, labels: dict | None = None) -> str | None:
        """`holds(name)`: whether a pod placed earlier still holds its node's resources (a pod that ended,
        Succeeded or Failed, or was deleted gives them back: the scheduler counts only non-terminal pods)."""
        if pod_name in self.bound:
            return None
        for name in [n for n in self.bound if holds is not None and not holds(n)]:
            self.release(name)
        want = pod_requests(pod_spec)
        short: dict[str, int] = {}
        for node in self.nodes:
            if not node_matches(pod_spec, node.labels):
                short["node(s) didn't match Pod's node affinity/selector"] = short.get(
                    "node(s) didn't match Pod's node affinity/selector", 0) + 1
                continue
            if any(not tolerated(pod_spec, t) for t in node.taints):
                short["node(s) had untolerated taint"] = short.get("node(s) had untolerated taint", 0) + 1
                continue
            if labels is not None and self._repelled(pod_spec, node):
                short["node(s) didn't match pod anti-affinity rules"] = short.get(
                    "node(s) didn't match pod anti-affinity rules", 0) + 1
                continue
            free = {"cpu": node.cpu_m - node.used["cpu"], "memory": node.mem_mi - node.used["memory"],
                    "gpu": node.gpus - node.used["gpu"]}
            lacking = [k for k in ("cpu", "memory", "gpu") if want[k] > free[k]]
            if not lacking:
                for k in node.used:
                    node.used[k] += want[k]
                self.bound[pod_name] = (node, want)
                self.labels[pod_name] = dict(labels or {})
                return None
            for k in lacking:
                what = {"cpu": "Insufficient cpu", "memory": "Insufficient memory", "gpu": "Insufficient nvidia.com/gpu"}[k]
                short[what] = short.get(what, 0) + 1
        reasons = ", ".join(f"{n} {why}" for why, n in sorted(short.items()))
        return f"0/{len(self.nodes)} nodes are available: {reasons}."

    def release(self, pod_name: str) -> None:
        """A pod that ended or was deleted gives its node's resources back."""
        bound = self.bound.pop(pod_name, None)
        self.labels.pop(pod_name, None)
        if bound is not None:
            node, want = bound
            for k in node.used:
                node.used[k] -= want[k]
