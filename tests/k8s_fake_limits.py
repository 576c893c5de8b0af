"""FAKE Kubernetes API, the LimitRanger admission of "someone else's cluster" (tests/k8s_fake_cluster.py installs it):
the namespace's LimitRanges as the API server stores them, and a Job whose pods they refuse.

Each behaviour from its source (kubernetes/kubernetes, read at commit 8f672ecf):
- A LimitRange is defaulted when it is stored (pkg/apis/core/v1/defaults.go `SetDefaults_LimitRangeItem`): in a
  `Container` item, a `max` with no `default` makes default = max, a `default` with no `defaultRequest` makes
  defaultRequest = default, and a `min` with no `defaultRequest` makes defaultRequest = min. GET
  .../limitranges serves them so (`served`).
- A pod's container that states a limit and no request requests its limit (same file, `SetDefaults_Pod`).
- The LimitRanger plugin (plugin/pkg/admission/limitranger/admission.go `PodLimitFunc`) admits a Pod at its
  create: per LimitRange, the `Container` item's default/defaultRequest are set on each container and init
  container lacking them (`mergePodResourceRequirements`); then `Container` items hold for each container and
  init container, `Pod` items for the containers' sum (`sum`: a resource only when every container states it)
  or any init container's when larger; `minConstraint` (request stated and >= min, a stated limit too),
  `maxConstraint` (limit stated and <= max, a stated request too), `limitRequestRatioConstraint` (both stated
  and non-zero, limit/request <= ratio).
- The Job is created (the plugin judges Pods, not Jobs: `SupportsAttributes` is Pod only), and the Job
  controller's every pod create is refused (pkg/controller/job: a `FailedCreate` event, "Error creating: pods
  ... is forbidden: ..."): the Job has no pod until its deadline. `refused_jobs` keeps what it said.
"""

from __future__ import annotations

import copy
from fractions import Fraction


def _q(v) -> Fraction:
    from kubernetes.utils import parse_quantity

    return Fraction(str(parse_quantity(str(v))))


def served(lr: dict) -> dict:
    """The LimitRange as the API server stored it (SetDefaults_LimitRangeItem)."""
    lr = copy.deepcopy(lr)
    for item in (lr.get("spec") or {}).get("limits") or []:
        if item.get("type") != "Container":
            continue
        default, request = item.setdefault("default", {}), item.setdefault("defaultRequest", {})
        for k, v in (item.get("max") or {}).items():
            default.setdefault(k, v)
        for k, v in default.items():
            request.setdefault(k, v)
        for k, v in (item.get("min") or {}).items():
            request.setdefault(k, v)
    return lr


def _container(c: dict) -> list[dict]:
    res = c.get("resources") or {}
    lim = {k: _q(v) for k, v in (res.get("limits") or {}).items()}
    req = {k: _q(v) for k, v in (res.get("requests") or {}).items()}
    for k, v in lim.items():  # SetDefaults_Pod
        req.setdefault(k, v)
    return [c.get("name"), req, lim]


def _constraints(kind: str, item: dict, req: dict, lim: dict) -> list[str]:
    out = []
    for k, v in (item.get("min") or {}).items():
        low = _q(v)
        if k not in req:
            out.append(f"minimum {k} usage per {kind} is {v}, no request is specified")
        elif req[k] < low or (k in lim and lim[k] < low):
            out.append(f"minimum {k} usage per {kind} is {v}")
    for k, v in (item.get("max") or {}).items():
        high = _q(v)
        if k not in lim:
            out.append(f"maximum {k} usage per {kind} is {v}, no limit is specified")
        elif lim[k] > high or (k in req and req[k] > high):
            out.append(f"maximum {k} usage per {kind} is {v}")
    for k, v in (item.get("maxLimitRequestRatio") or {}).items():
        if not req.get(k) or not lim.get(k) or lim[k] / req[k] > _q(v):
            out.append(f"{k} max limit to request ratio per {kind} is {v}")
    return out


def pod_refusals(pod_spec: dict, ranges: list[dict]) -> list[str]:
    """The plugin's complaints about a pod (its spec as JSON) in a namespace holding `ranges` (as served)."""
    containers = [_container(c) for c in pod_spec.get("containers") or []]
    inits = [_container(c) for c in pod_spec.get("initContainers") or []]
    out: list[str] = []
    for lr in ranges:
        items = (lr.get("spec") or {}).get("limits") or []
        for item in items:
            if item.get("type") == "Container":
                for _, req, lim in containers + inits:
                    for k, v in (item.get("defaultRequest") or {}).items():
                        req.setdefault(k, _q(v))
                    for k, v in (item.get("default") or {}).items():
                        lim.setdefault(k, _q(v))
        for item in items:
            if item.get("type") == "Container":
                for _, req, lim in containers + inits:
                    out += _constraints("Container", item, req, lim)
            elif item.get("type") == "Pod":
                total = []
                for which in (1, 2):
                    keys = {k for c in containers for k in c[which]}
                    sums = {k: sum(c[which][k] for c in containers) for k in keys if all(k in c[which] for c in containers)}
                    for c in inits:
                        for k, v in c[which].items():
                            sums[k] = max(sums.get(k, v), v)
                    total.append(sums)
                out += _constraints("Pod", item, total[0], total[1])
    return out
