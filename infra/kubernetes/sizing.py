"""The training pod's CPU and memory requests from the pool's real nodes, once they exist.

A platform's `pod_requests` (gcp: `infra.gcp.gke.pod_requests`) is a formula on the machine type: it
must fit a node the autoscaler has not made yet, so it guesses the kubelet's capacity (MemTotal) and
what the provider's DaemonSets take. When nodes of the pool are there, the API says both: each node's
`status.allocatable` (capacity less kube-reserved and the eviction threshold: Kubernetes docs, "Reserve
Compute Resources for System Daemons") and the requests of the DaemonSet pods bound to it (a pod's
effective request: the sum of its app containers', or its largest init container's, whichever is
larger: Kubernetes docs, "Resource Management for Pods and Containers"; "Init Containers", "Resource
sharing within containers"). The scheduler places a pod only where its requests fit what those leave
(same docs, "How Pods with resource requests are scheduled"), so `fitted` sizes the training container
from the tightest node: what is left less the keeper container's requests and a margin, never more
than the formula's. Without nodes (a pool at zero), or when the nodes cannot be read (403 for a user
who may not list nodes), the formula stays.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from .api import KubeApi, KubeObject, Retry, _is_api_error
from .plan import KEEPER, Plan

MARGIN_CPU_M, MARGIN_MI = 100, 256  # left free on the node beside our pod (a DaemonSet that grows a little)
KEEPER_CPU_M, KEEPER_MI = 10, 32  # the keeper container's requests (manifests.pod_template)


def _quantity(value: object) -> float:
    from kubernetes.utils import parse_quantity

    return float(parse_quantity(str(value)))


def _pod_request(pod: KubeObject) -> tuple[float, float]:
    """(CPU cores, memory bytes) a bound pod holds on its node."""
    def total(containers: list[KubeObject] | None, combine: Callable[[float, float], float]) -> tuple[float, float]:
        cpu = mem = 0.0
        for c in containers or []:
            res = getattr(c, "resources", None)
            req = dict(getattr(res, "requests", None) or {})
            for key, value in dict(getattr(res, "limits", None) or {}).items():
                req.setdefault(key, value)  # a limit alone is also the request
            cpu = combine(cpu, _quantity(req["cpu"]) if "cpu" in req else 0.0)
            mem = combine(mem, _quantity(req["memory"]) if "memory" in req else 0.0)
        return cpu, mem

    apps = total(pod.spec.containers, lambda a, b: a + b)
    inits = total(getattr(pod.spec, "init_containers", None), max)
    return max(apps[0], inits[0]), max(apps[1], inits[1])


def node_room(api: KubeApi, plan: Plan, retry: Retry) -> tuple[int, int] | None:
    """(millicores, MiB) left on the tightest node of the plan's pool once its DaemonSet pods are counted;
    None when the pool has no node now or the nodes cannot be read."""
    selector = ",".join(f"{k}={v}" for k, v in plan.node_selector) or None
    try:
        nodes = retry.call(api.core.list_node, label_selector=selector).items
        rooms = []
        for node in nodes:
            if getattr(node.spec, "unschedulable", None):
                continue
            alloc = dict(getattr(node.status, "allocatable", None) or {})
            if "cpu" not in alloc or "memory" not in alloc:
                continue
            pods = retry.call(api.core.list_pod_for_all_namespaces,
                              field_selector=f"spec.nodeName={node.metadata.name}").items
            cpu, mem = _quantity(alloc["cpu"]), _quantity(alloc["memory"])
            for pod in pods:
                owners = getattr(pod.metadata, "owner_references", None) or []
                if getattr(pod.status, "phase", None) in ("Succeeded", "Failed") or \
                        not any(o.kind == "DaemonSet" for o in owners):
                    continue  # only what every node of the pool keeps: the DaemonSets' pods
                used = _pod_request(pod)
                cpu, mem = cpu - used[0], mem - used[1]
            rooms.append((int(cpu * 1000), int(mem / 2**20)))
    except Exception as exc:  # ApiException is in the lazily imported SDK: non-API errors re-raise
        if not _is_api_error(exc):
            raise
        return None  # 403 (may not list nodes) and the like: the formula stays
    if not rooms:
        return None
    return min(r[0] for r in rooms), min(r[1] for r in rooms)


def fitted(api: KubeApi, plan: Plan, retry: Retry, say: Callable[[str], None] | None = None) -> Plan:
    """`plan` with the training container's requests from the pool's nodes (see the module docstring)."""
    formula = dict(plan.requests)
    if "cpu" not in formula or "memory" not in formula:
        return plan
    room = node_room(api, plan, retry)
    if room is None:
        return plan
    keeper = (KEEPER_CPU_M, KEEPER_MI) if plan.exec_container == KEEPER else (0, 0)
    cpu_m = room[0] - keeper[0] - MARGIN_CPU_M
    mem_mi = room[1] - keeper[1] - MARGIN_MI
    want_cpu, want_mi = int(_quantity(formula["cpu"]) * 1000), int(_quantity(formula["memory"]) / 2**20)
    if cpu_m >= want_cpu and mem_mi >= want_mi:
        return plan
    cpu_m, mem_mi = min(cpu_m, want_cpu), min(mem_mi, want_mi)
    if cpu_m < 500 or mem_mi < 1024:
        return plan  # a node too full to say anything useful: the scheduler's own message will say why
    if say is not None:
        say(f"pod requests from the pool's nodes: {cpu_m}m CPU, {mem_mi}Mi memory (their allocatable less their "
            f"DaemonSets; the machine type's formula asked {formula['cpu']}, {formula['memory']})")
    return dataclasses.replace(plan, requests=(("cpu", f"{cpu_m}m"), ("memory", f"{mem_mi}Mi")))
