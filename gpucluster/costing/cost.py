"""Cost: estimates before a run, the true cost of a run after it, what-if projections, reports.

This module is the cost engine's public face; the work is done in `gpucluster.costing` (one
module per job, listed there), and what is particular to a cloud by its backend's cost hooks.

Billing rules (what the clouds publish, applied the same way before and after a run):

* EC2 Linux instances and GCE VMs (and the GPUs attached to GCE VMs): per second, at least 60
  seconds for each resource that existed. A 59 s life is billed as 60 s; 61.2 s as 62 s.
* GKE cluster management fee: the cluster-hour price prorated per second, no minimum. With the
  free-tier rule on (`gke_free_tier`, off by default because the one free cluster of a billing
  account may already be in use) a *zonal* cluster costs $0 for the fee; a regional one is charged.
* Disks (EBS gp3, GCE persistent disk): the GB-month price prorated per second of a 730-hour month.

Every amount is a `Decimal` in USD; each resource's cost is kept to nano-dollars and totals are
sums of those, so an estimate and the cost of a run whose resources lived exactly the estimated
time agree to the digit.

Resource records (`Ledger.resource_requested(run_id, kind, name, region=..., detail=...)`). A
resource is billed from `requested_at` (the cloud may start billing any moment after the request)
to `deleted_at` (deletion confirmed). One never confirmed gone is billed up to *now* and flagged
"still billing". What `detail` must hold, per kind:

=============  ===========================================================================
kind           detail (JSON)
=============  ===========================================================================
instance       {"instance_type": "g5.12xlarge" | "n1-standard-16", "spot": bool,
               optional "gpus": int and "accelerator": "nvidia-tesla-v100" (GCE VMs only;
               EC2 GPUs are in the instance price), optional "disk_gb": int and "disk_type":
               "gp3" for a root/boot disk deleted together with the instance}
volume / disk  {"disk_gb": int, "disk_type": "gp3" | "pd-standard" | "pd-balanced" | "pd-ssd"}
gke-cluster    {"zonal": bool}   (or "location": a zone such as us-central1-a)
node-pool      {"machine_type": "n1-standard-16", "node_count": int, "gpus_per_node": int,
               "accelerator": "nvidia-tesla-v100", "spot": bool, "disk_gb": int,
               "disk_type": "pd-balanced"}   (the pool's nodes live as long as the pool)
anything else  no charge (security groups, key pairs, VPCs, placement groups, processes, ...)
=============  ===========================================================================

The region is the resource row's `region` column (a zone is reduced to its region), else the
price snapshot's. Prices come from the run's snapshot (`price_snapshot`, stored with the run at
launch); a price missing there is looked up in the current catalog and the line says so.

Which of these a run of a cloud records is its backend's `planned_resources`; an instance's GPUs
are billed apart from it (GCE) where the cloud's catalog prices GPUs by themselves (rows of kind
`gpu`), else they are inside its price (EC2): `plan.gpus_billed_apart`.
"""

from __future__ import annotations

from gpucluster.costing.estimate import Estimate, estimate, parse_hours, planned_resources
from gpucluster.costing.plan import Plan, Pricer, is_free, price_snapshot
from gpucluster.costing.report import GROUPS, REPORT_CSV_FIELDS, parse_since, plot_report, report, report_csv
from gpucluster.costing.rules import (CATEGORIES, CENT, MINIMUM_SECONDS, MONTH_HOURS, NANO, billed_seconds,
                                      disk_cost, money, region_of, time_cost)
from gpucluster.costing.runcost import record_run_cost, run_cost
from gpucluster.costing.whatif import what_if

__all__ = [
    "CATEGORIES", "CENT", "GROUPS", "MINIMUM_SECONDS", "MONTH_HOURS", "NANO", "REPORT_CSV_FIELDS", "Estimate",
    "Plan", "Pricer", "billed_seconds", "disk_cost", "estimate", "is_free", "money", "parse_hours", "parse_since",
    "planned_resources", "plot_report", "price_snapshot", "record_run_cost", "region_of", "report", "report_csv",
    "run_cost", "time_cost", "what_if",
]
