"""Estimates: the itemized cost of a spec for some hours, computed by costing the resources such
a run records (`planned_resources`) with the same rules and snapshot as `run_cost`, so an
estimate and the cost of a run that lived as long agree to the digit. The spec's backend (its
plugin) is given by the caller."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from typing import TYPE_CHECKING

from gpucluster.catalog.prices import Catalog, load_catalog
from gpucluster.errors import UsageError, not_allowed
from gpucluster.ledger.records import ResourceRow, RunRecord, RunRow
from gpucluster.spec import ClusterSpec, parse_int
from gpucluster.states import JsonMapping, JsonObject

from .plan import Plan, default_region, gpus_billed_apart, is_free, plan, price_snapshot, region_for, resolved, same_cloud
from .rules import CATEGORIES, MINIMUM_SECONDS, MONTH_HOURS, NANO, money
from .runcost import run_cost

if TYPE_CHECKING:
    from gpucluster.infra.contract import Plugin


@dataclass
class Estimate:
    cloud: str
    region: str | None
    nodes: int
    hours: Decimal
    market: str
    lines: list[JsonObject]
    hourly: Decimal
    total: Decimal
    price_date: str | None
    gpus: int = 0
    per_gpu_hour: Decimal | None = None
    notes: list[str] = field(default_factory=list)
    snapshot: JsonObject = field(default_factory=dict)
    # what the catalog lacked for this spec and what was used or left out instead (a price borrowed
    # from another region, an unpriced pool): a run's plan prints these under its estimate line
    gaps: list[str] = field(default_factory=list)
    instance_type: str | None = None  # the machine priced (EC2 type / GCE machine type), `--gpu`'s pick included
    gpu: str | None = None  # TYPE:COUNT per node, e.g. H100:8

    def render_line(self) -> str:
        """One line for a plan: total, hourly, the items, the price date."""
        if not self.lines:
            return f"$0 ({'; '.join(self.notes)})"
        by: dict[str, Decimal] = {}  # per category (instances: the VMs and their addresses), in line order
        for ln in self.lines:
            if not ln["description"].startswith("system pool: "):
                by[ln["category"]] = by.get(ln["category"], Decimal(0)) + Decimal(ln["hourly"])
        items = ", ".join(f"{c} {money(v)}/h" for c, v in by.items() if v or c != "gpus")
        system = sum((Decimal(ln["hourly"]) for ln in self.lines if ln["description"].startswith("system pool: ")),
                     Decimal(0))
        if system:
            items += f", system pool {money(system)}/h"
        per_gpu = f", {money(self.per_gpu_hour)}/GPU-hour" if self.per_gpu_hour is not None else ""
        return (f"{money(self.total)} for {self.hours.normalize():f} h at {money(self.hourly)}/h "
                f"({items}{per_gpu}; {self.market} prices read {self.price_date})")

    def render_limit(self, minutes: float, what: str) -> str:
        """One line for a run's plan: "up to $X for Y min (what limits it) at $H/h (items ...)"."""
        line = self.render_line()
        if not self.lines:
            return line
        return f"up to {money(self.total)} for {minutes:g} min ({what}) at {line.split(' at ', 1)[1]}"

    def __str__(self) -> str:
        return self.render_line()

    def to_dict(self) -> JsonObject:
        return {"cloud": self.cloud, "region": self.region, "nodes": self.nodes, "hours": str(self.hours),
                "market": self.market, "lines": self.lines, "hourly": str(self.hourly), "total": str(self.total),
                "price_date": self.price_date, "gpus": self.gpus,
                "per_gpu_hour": None if self.per_gpu_hour is None else str(self.per_gpu_hour),
                "notes": self.notes, "currency": "USD", "instance_type": self.instance_type, "gpu": self.gpu}


def planned_resources(spec: ClusterSpec, seconds: Decimal, start: float = 0.0,
                      catalog: Catalog | None = None, *, backend: Plugin) -> list[JsonObject]:
    """The resource rows a run of `spec` records when it lives `seconds` (what estimates cost):
    the backend's `planned_resources` (EC2: one `instance` per node with its root gp3 volume;
    GKE: the cluster, the GPU pool and the system pool, with the real defaults of `resolve`),
    each created at `start` and confirmed gone `seconds` later. `backend`: the plugin of `spec.cloud`."""
    same_cloud(spec.cloud, backend)
    spec = resolved(spec, backend)
    end = float(Decimal(str(start)) + seconds)
    pricing = backend.needs_pricing()
    region = region_for(spec, backend) or default_region(backend)
    common = {"requested_at": start, "created_at": start, "deleted_at": end, "confirmed_gone": True,
              "region": region}
    return [{**common, **row} for row in pricing.planned_resources(spec, region, catalog)]


def parse_hours(value: object) -> Decimal:
    try:
        hours = Decimal(str(value).strip())
    except Exception:  # noqa: BLE001 - decimal raises several types
        hours = None
    if hours is None or not hours.is_finite() or hours <= 0 or hours > 24 * 366:
        raise UsageError(not_allowed("hours", value, "a number of hours above 0 (e.g. 0.5, 3)"))
    return hours


def _merged_lines(cost_lines: list[JsonObject]) -> list[JsonObject]:
    """The run cost's lines, one per (category, description) with the quantities and totals added;
    a system pool's lines said so."""
    merged: dict[tuple[str, str], JsonObject] = {}
    for line in cost_lines:
        key = (line["category"], line["description"])
        if line.get("resource", "").endswith("-system"):
            key = (line["category"], "system pool: " + line["description"])
            line = {**line, "description": key[1]}
        if key in merged:
            m = merged[key]
            m["quantity"] = str(Decimal(m["quantity"]) + Decimal(line["quantity"]))
            m["total"] = str(Decimal(m["total"]) + Decimal(line["cost"]))
            m["count"] += 1
        else:
            merged[key] = {"category": line["category"], "description": line["description"],
                           "quantity": line["quantity"], "unit": line["unit"], "unit_price": line["unit_price"],
                           "total": line["cost"], "source": line["source"], "date": line["date"],
                           "note": line["note"], "count": 1}
    return list(merged.values())


def _set_hourly(line: JsonObject) -> None:
    """A merged line's count into its description, and its hourly rate."""
    count = line.pop("count")
    if count > 1:
        line["description"] = f"{count} x {line['description']}"

    qty, price = Decimal(line["quantity"]), Decimal(line["unit_price"])
    rate = qty * price / MONTH_HOURS if line["unit"] == "gb-month" else qty * price
    if line["category"] == "cluster fee" and Decimal(line["total"]) == 0:
        rate = Decimal(0)
    line["hourly"] = str(rate.quantize(NANO, ROUND_HALF_UP))


def _included_gpus(planned: Plan) -> JsonObject:
    """The line that says the GPUs are in the instance price."""
    return {"category": "gpus",
            "description": f"{planned.nodes * planned.gpus_per_node} x {planned.gpu_name}",
            "quantity": str(planned.nodes * planned.gpus_per_node), "unit": "-", "unit_price": "0",
            "hourly": "0", "total": "0", "source": planned.machine.source if planned.machine else None,
            "date": planned.machine.date if planned.machine else None,
            "note": "included in the instance price"}


def _system_pool(line: JsonMapping) -> bool:
    return str(line["description"]).startswith("system pool: ")


def _always_on(lines: list[JsonObject], hourly: Decimal, planned: Plan) -> Decimal:
    """What bills with no GPU node left (GKE: after the dead-man switch): the fee and the system pool."""
    always_on = sum((Decimal(ln["hourly"]) for ln in lines
                     if ln["category"] == "cluster fee" or _system_pool(ln)), Decimal(0))
    if planned.idle_nodes:  # GPU nodes the pool keeps after the job (no autoscaling, or its minimum)
        always_on += (hourly - always_on) / planned.nodes * planned.idle_nodes
    return always_on


def _gpu_hourly(lines: list[JsonObject]) -> Decimal:
    return sum((Decimal(ln["hourly"]) for ln in lines if ln["category"] in ("instances", "gpus")
                and not _system_pool(ln)), Decimal(0))


def _after_notes(planned: Plan, always_on: Decimal) -> list[str]:
    """What keeps billing after the max lifetime (GKE: the fee and the system pool), in the backend's words
    (`PricedRows.after_lifetime`) with its hourly figure; the GKE free tier, where it was asked for."""
    notes = []
    if always_on and planned.after_lifetime:
        notes.append(f"{planned.after_lifetime} {money(always_on)}/h ({always_on.quantize(Decimal('0.0001'))}) "
                     "until `gpucluster down`")
    if planned.free_tier:
        notes.append("GKE fee: free tier applied" + ("" if planned.zonal else " only to zonal clusters; this one is "
                                                     "regional (no zone given)"))
    return notes


def _free_estimate(spec: ClusterSpec, hours: Decimal, backend: Plugin) -> Estimate:
    parse_int("nodes", spec.nodes, low=1, high=backend.traits.max_nodes)
    return Estimate(cloud=spec.cloud, region=None, nodes=int(spec.nodes), hours=hours, market="-", lines=[],
                    hourly=Decimal(0), total=Decimal(0), price_date=None,
                    notes=[f"{spec.cloud} runs use machines gpucluster does not rent: $0"])


def estimate(spec: ClusterSpec, hours: object, *, backend: Plugin, catalog: Catalog | None = None,
             free_tier: bool | None = None, now: float | None = None) -> Estimate:
    """Itemized estimate (instances, GPUs, disks, cluster fee) of running `spec` for `hours`;
    `backend`: the plugin of `spec.cloud`, given by the caller.

    Computed by costing the resources such a run records (`planned_resources`) with the same
    rules and snapshot as `run_cost`, so the two agree when the durations do."""
    hours = parse_hours(hours)
    same_cloud(spec.cloud, backend)
    if is_free(backend):
        return _free_estimate(spec, hours, backend)
    catalog = catalog or load_catalog()
    planned = plan(spec, catalog, free_tier, backend=backend)
    snapshot = price_snapshot(spec, catalog, backend=backend, free_tier=free_tier, now=now)
    run = RunRecord(RunRow(id=None, cloud=spec.cloud, prices=snapshot),
                    resources=[ResourceRow.from_dict(r) for r in planned_resources(spec, hours * 3600, catalog=catalog,
                                                                                     backend=backend)])
    cost = run_cost(run, backend=backend, now=now, catalog=catalog)
    lines = _merged_lines(cost["lines"])
    for line in lines:
        _set_hourly(line)
    if not gpus_billed_apart(catalog, spec.cloud):  # the GPUs are in the instance price: a line of their own says so
        lines.insert(1, _included_gpus(planned))
    order = {c: i for i, c in enumerate(CATEGORIES)}
    lines.sort(key=lambda ln: order.get(ln["category"], 99))
    hourly = sum((Decimal(ln["hourly"]) for ln in lines), Decimal(0))
    always_on = _always_on(lines, hourly, planned)
    total = Decimal(cost["total"])
    gpus = planned.nodes * planned.gpus_per_node
    gpu_hourly = _gpu_hourly(lines)
    notes = list(planned.notes) + _after_notes(planned, always_on)
    if hours * 3600 < MINIMUM_SECONDS:
        notes.append("instances are billed at least 60 seconds each")
    if spec.spot:
        notes.append("spot prices are a point-in-time reference and the nodes can be reclaimed")
    machine = planned.machine
    return Estimate(cloud=spec.cloud, region=planned.region, nodes=planned.nodes, hours=hours, market=planned.market,
                    lines=lines, hourly=hourly, total=total, price_date=cost["price_date"], gpus=gpus,
                    per_gpu_hour=(gpu_hourly / gpus) if gpus else None, notes=notes, snapshot=snapshot,
                    gaps=list(planned.notes), instance_type=machine.item if machine else None,
                    gpu=f"{planned.gpu_name}:{planned.gpus_per_node}" if planned.gpu_name and planned.gpus_per_node
                    else None)
