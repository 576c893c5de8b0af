"""GPU host maintenance on GKE, read from the node as a notice (`GKE.node_notice`, watched by
`infra.kubernetes.notices`).

GPU VMs cannot live-migrate: when Compute Engine maintains their host it terminates them (GCE docs,
"Host events": `onHostMaintenance: TERMINATE` is the only policy for VMs with GPUs; the metadata
server's `instance/maintenance-event` says `TERMINATE_ON_HOST_MAINTENANCE` about an hour before on N1
GPU VMs). Host events bypass GKE's maintenance windows and exclusions (GKE docs, "Manage disruption to
GKE nodes that don't live migrate", and "Manage AI-optimized GKE clusters": "they bypass GKE maintenance
windows and exclusions"), so the NO_UPGRADES exclusion the cluster declares does not hold them off.
GKE (1.31.1-gke.2008000 and later, machine types with GPUs) shows them on the node (GKE docs, "Monitor
maintenance events"; the label and taint names as GKE's maintenance controller spells them):

- label `cloud.google.com/scheduled-maintenance-time`: the Unix time the upcoming maintenance starts,
  set while it is scheduled but not active;
- label `cloud.google.com/active-node-maintenance` (`ONGOING`) and the taint
  `cloud.google.com/impending-node-termination:NoSchedule`: the maintenance is under way, GKE is
  stopping the node's pods.

`maintenance_notice` turns either into a `node_notice` record: an active maintenance at once, a
scheduled one once its start is MAINTENANCE_LEAD_S away (the ranks keep training until then; the notice's
save grace, `gpucluster.watch.nodeloss.save_grace`, and the outputs copy fit in that lead). The metadata
server's `maintenance-event` is seen only from inside the VM (a pod under Workload Identity reaches
GKE's metadata server, not the VM's), so it is not read; the node labels are GKE's view of the same event.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpucluster.states import JsonObject

# Any: a Kubernetes node as the kubernetes client gives it (its models carry no types) or as JSON, and
# whatever is read from it by attribute or key
KubeObject = Any

SCHEDULED_LABEL = "cloud.google.com/scheduled-maintenance-time"
ACTIVE_LABEL = "cloud.google.com/active-node-maintenance"
TERMINATION_TAINT = "cloud.google.com/impending-node-termination"
# act this long before a scheduled maintenance starts: the save grace (up to 90 s), the copy of every node's
# outputs through the exec API (minutes for large checkpoints), and a reading of the nodes (15 s)
MAINTENANCE_LEAD_S = 900
SOURCE = "GCE host maintenance"


def _iso(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _field(obj: KubeObject, *names: str) -> KubeObject:
    for name in names:
        obj = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
        if obj is None:
            return None
    return obj


def maintenance_notice(node: KubeObject, now: float) -> JsonObject | None:
    """A `node_notice` record (source, action, when) when GKE says `node`'s host maintenance is under way,
    or starts within MAINTENANCE_LEAD_S of `now` (Unix seconds); None otherwise."""
    labels = _field(node, "metadata", "labels") or {}
    taints = [_field(t, "key") for t in (_field(node, "spec", "taints") or [])]
    if labels.get(ACTIVE_LABEL) or TERMINATION_TAINT in taints:
        what = f"{ACTIVE_LABEL}={labels[ACTIVE_LABEL]}" if labels.get(ACTIVE_LABEL) else f"taint {TERMINATION_TAINT}"
        return {"source": SOURCE, "action": f"terminate (GPU VMs cannot live-migrate; {what})", "when": _iso(now)}
    scheduled = labels.get(SCHEDULED_LABEL)
    try:
        at = float(scheduled) if scheduled else None
    except ValueError:
        return None
    if at is None or at - now > MAINTENANCE_LEAD_S:
        return None
    return {"source": SOURCE, "action": f"terminate (GPU VMs cannot live-migrate; {SCHEDULED_LABEL}={scheduled})",
            "when": _iso(at)}
