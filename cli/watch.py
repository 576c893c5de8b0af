"""The console's live resource progress for `run`, `up`, `exec` and `down` (`gpucluster.ledger.progress`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpucluster.errors import GpuclusterError

if TYPE_CHECKING:
    from collections.abc import Callable
    from gpucluster.spec import ClusterSpec
    from gpucluster.ledger.store import Ledger


def run_watch(ledger: Ledger, spec: ClusterSpec) -> Callable[[str], str | None] | None:
    """A `ResourceWatch` over the rows of the run `spec.run_id`, with the plan's counts per kind
    (`Pricing.planned_resources`: e.g. one instance per node); None without a run id."""
    from gpucluster.ledger.progress import ResourceWatch, planned_counts

    if not spec.run_id:
        return None
    planned: dict[str, int] = {}
    from gpucluster.costing.plan import default_region
    from gpucluster.infra.registry import plugin

    backend = plugin(spec.cloud)
    pricing = backend.pricing
    if pricing is not None:
        try:
            planned = planned_counts(pricing.planned_resources(spec, spec.region or default_region(backend), None))
        except (GpuclusterError, KeyError, ValueError, TypeError):  # a shape the catalog cannot plan: no totals
            planned = {}
    return ResourceWatch.for_run(ledger.path, spec.run_id, planned).line


def cluster_watch(ledger: Ledger, cluster: str) -> Callable[[str], str | None]:
    """`down`: the cluster's open rows, each closed row a deletion done."""
    from gpucluster.ledger.progress import ResourceWatch

    return ResourceWatch.for_cluster(ledger.path, cluster).line
