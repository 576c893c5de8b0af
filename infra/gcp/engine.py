"""What Pulumi's engine reports about GCP resources, read for the ledger and for errors: the ledger
kind of each GKE type token, the cost detail of a requested cluster or node pool, and capacity
failures (stockouts: which zone, which V100 zones to try next). Imports nothing heavy."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Callable

from gpucluster.states import JsonMapping, JsonObject

if TYPE_CHECKING:
    from gpucluster.spec import ClusterSpec

PULUMI_KINDS = {
    "gcp:container/cluster:Cluster": "gke-cluster",
    "gcp:container/nodePool:NodePool": "node-pool",
    # the pods' Google service account (gs:// access): bills nothing, but one left by a failed destroy
    # would make the next `up` of the same cluster name fail (its account id is taken)
    "gcp:serviceaccount/account:Account": "service-account",
}

CAPACITY_MARKERS = (
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "GCE_STOCKOUT",
    "does not have enough resources available to fulfill the request",
)
ZONE = r"[a-z]+-[a-z]+\d+-[a-z]"


def resource_detail(kind: str, inputs: JsonMapping, spec: ClusterSpec | None) -> JsonObject:
    """What the cost code needs about a requested node pool or GKE cluster: from its inputs, else
    from the spec."""
    inputs = inputs or {}
    if kind == "node-pool":
        cfg = inputs.get("nodeConfig") or {}
        accel = (cfg.get("guestAccelerators") or [{}])[0]
        return {
            "machine_type": cfg.get("machineType") or (spec.instance_type if spec is not None else None),
            "node_count": inputs.get("nodeCount") or inputs.get("initialNodeCount") or (spec.nodes if spec is not None else 1),
            "gpus_per_node": accel.get("count", 0),
            "accelerator": accel.get("type"),
            "spot": bool(cfg.get("spot") or cfg.get("preemptible")),
            "disk_gb": cfg.get("diskSizeGb"),
            "disk_type": cfg.get("diskType"),
            "location": inputs.get("location"),
            # one external IPv4 per node unless the pool's nodes are private
            "external_ipv4": 0 if (inputs.get("networkConfig") or {}).get("enablePrivateNodes") else 1,
        }
    if kind == "gke-cluster":
        loc = inputs.get("location") or (spec.zone or spec.region if spec is not None else None)
        return {"location": loc, "zonal": bool(loc and re.fullmatch(ZONE, str(loc)))}
    return {}


def capacity_zones(spec: ClusterSpec, text: str, zone_lister: Callable[[str, str | None], list[str]] | None = None
                   ) -> tuple[str | None, list[str], str]:
    """(the zone that ran out, the zones offering the pool's shape to try next: same region first, what
    could not be placed) from a GKE/GCE stockout."""
    from . import catalog

    any_zone = re.search(r"\b(" + ZONE + r")\b", text)
    zone = any_zone.group(1) if any_zone else spec.zone
    try:
        zones = list(catalog.pool_zones(spec))
    except Exception:  # noqa: BLE001 - the zones to try next are a suggestion: best effort
        zones = []
    region = catalog.region_of(zone) if zone else None
    same = [z for z in zones if region and z.startswith(region + "-")]
    return zone, same + [z for z in zones if z not in same], f"{spec.accelerator or 'GPU'} nodes"


# IAM is eventually consistent (https://cloud.google.com/iam/docs/access-change-propagation: "typically
# takes 2 minutes", "7 minutes or longer" at times). The pods' new Google service account can be
# refused as a member of a bucket binding for a while after it is made ("Service account ... does not
# exist", HTTP 400: magic-modules PR 14447, which made the provider wait after creating one), and
# the project's Workload Identity pool appears only some time after its first such cluster ("Identity
# Pool does not exist (PROJECT.svc.id.goog)"). What failed was never created: `up` runs again as it
# was (the account, the cluster and the pool kept) after each of these delays, 120 s in all.
NOT_VISIBLE_YET = (r"Service account \S+ does not exist", r"Identity Pool does not exist")
RELAUNCH_DELAYS = (5.0, 10.0, 20.0, 40.0, 45.0)


def relaunch(spec: ClusterSpec, text: str) -> tuple[str | None, str] | None:
    """(None: run the same `up` again, why) when a failed `up` is IAM not showing what was just made."""
    if re.search(NOT_VISIBLE_YET[0], text):
        return None, "IAM does not show the pods' new service account yet (IAM changes take up to minutes to apply)"
    if re.search(NOT_VISIBLE_YET[1], text):
        return None, "the project's Workload Identity pool does not exist yet (it follows the first such cluster)"
    return None
