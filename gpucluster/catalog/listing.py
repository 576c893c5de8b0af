"""`gpucluster gpus`: every GPU gpucluster knows, with its memory, the clouds and machines that carry
it (GPUs per node), and the cheapest on-demand and spot $/GPU-hour the price catalog gives, where,
read when and from what source. What `sky show-gpus` shows, plus the dates and sources.

Cloud-agnostic: the caller passes the backends (the registry's plugins); each tells its GPU shapes
(`SpecRules.gpu_shapes`) and prices one through its own pricing rules (`Pricing.price_rows`: an EC2
type's instance row; a GCE host row plus COUNT GPU rows), the same rules an estimate uses.
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Mapping

from gpucluster.catalog.gpus import GPUS, normalize
from gpucluster.errors import GpuclusterError
from gpucluster.infra.contract import Capability
from gpucluster.states import JsonMapping, JsonObject

if TYPE_CHECKING:
    from gpucluster.catalog.prices import Catalog, PriceRow
    from gpucluster.infra.contract import Plugin

MARKETS = ("on-demand", "spot")


def _per_gpu(backend: Plugin, cloud: str, shape: JsonMapping, region: str, market: str,
             catalog: Catalog) -> tuple[Decimal, list[PriceRow]] | None:
    """$/GPU-hour of one shape in one region and market, with the rows it came from; None: not priced."""
    from gpucluster.spec import ClusterSpec

    spec = ClusterSpec(cloud=cloud, nodes=1, region=region, instance_type=str(shape["machine"]),
                       accelerator=str(shape["gpu"]), gpus_per_node=int(shape["gpus"]), spot=market == "spot")
    try:
        rows = backend.needs_pricing().price_rows(spec, catalog, region, market, None)  # free_tier: the default
    except (GpuclusterError, KeyError, ValueError):
        return None
    total = rows.machine.price + (rows.gpu.price * int(shape["gpus"]) if rows.gpu is not None else 0)
    return total / int(shape["gpus"]), [r for r in (rows.machine, rows.gpu) if r is not None]


def gpu_listing(backends: Mapping[str, Plugin], catalog: Catalog, gpu: str | None = None) -> list[JsonObject]:
    """One entry per GPU (or the one named): memory, per cloud its machines and GPUs per node, and the
    cheapest on-demand and spot $/GPU-hour over the priced regions with where, date and source."""
    wanted = [normalize(gpu)] if gpu is not None else list(GPUS)
    out: list[JsonObject] = []
    for name in wanted:
        g = GPUS[name]
        entry: JsonObject = {"gpu": name, "memory_gib": round(g.memory_mib / 1024, 1), "nominal_gb": g.nominal_gb,
                                 "generation": g.generation, "clouds": {}, "cheapest": {}}
        for cloud, backend in backends.items():
            shapes: list[JsonMapping] = [s for s in backend.spec.gpu_shapes() if s["gpu"] == name]
            if not shapes:
                continue
            entry["clouds"][cloud] = [{"machine": s["machine"], "gpus": s["gpus"],
                                       "on_demand": bool(s.get("on_demand", True))} for s in shapes]
            priced_regions = set(catalog.regions(cloud)) if backend.can(Capability.PRICED) else set()
            for shape in shapes:
                for region in sorted(priced_regions & set(shape["regions"])):
                    for market in MARKETS:
                        if market == "on-demand" and not shape.get("on_demand", True):
                            continue
                        got = _per_gpu(backend, cloud, shape, region, market, catalog)
                        if got is None:
                            continue
                        best = entry["cheapest"].get(market)
                        if best is None or got[0] < Decimal(best["per_gpu_hour"]):
                            rows = got[1]
                            entry["cheapest"][market] = {
                                "per_gpu_hour": str(got[0].quantize(Decimal("0.0001"))), "cloud": cloud,
                                "region": region, "machine": shape["machine"], "gpus": shape["gpus"],
                                "date": min(r.date for r in rows), "source": rows[-1].source}
        out.append(entry)
    return out
