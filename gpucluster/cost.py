"""Cost: estimates before a run, the true cost of a run after it, what-if projections, reports.

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
"""

from __future__ import annotations

import datetime as _dt
import math
import re
import statistics
import time
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any, Iterable, Mapping

from gpucluster.catalog.prices import Catalog, PriceRow, load_catalog, n1_machine_types, n1_shape, normalize_gpu
from gpucluster.errors import SpecError, UsageError, not_allowed
from gpucluster.infra.registry import NAMES, backend
from gpucluster.spec import ClusterSpec, max_nodes, config_scalar, config_tags, parse_int

MINIMUM_SECONDS = 60
MONTH_HOURS = 730
NANO = Decimal("0.000000001")
CENT = Decimal("0.01")
FREE_CLOUDS = ("local", "ssh")
PRICED_CLOUDS = ("aws", "gcp")
DEFAULT_REGION = {"aws": "us-east-1", "gcp": "us-central1"}
DEFAULT_DISK_TYPE = {"aws": "gp3", "gcp": "pd-balanced"}
DEFAULT_INSTANCE = {"aws": "g5.xlarge", "gcp": "n1-standard-16"}
# GCE limits for V100 (max vCPU, max GB RAM per VM) by GPU count; FACTS.md, N1 + V100.
V100_LIMITS = {1: (12, 78), 2: (24, 156), 4: (48, 312), 8: (96, 624)}
CATEGORIES = ("instances", "gpus", "disks", "cluster fee")
_ZONE_RE = re.compile(r"^([a-z]+-[a-z]+\d+)-[a-z]$")
_AWS_AZ_RE = re.compile(r"^([a-z]{2}(?:-gov)?-[a-z]+-\d)[a-z]$")


# -- billing rules ---------------------------------------------------------------------------
def billed_seconds(seconds: float | Decimal, minimum: int = MINIMUM_SECONDS) -> int:
    """Whole seconds billed for a life of `seconds`: rounded up, at least `minimum` if it existed."""
    if seconds is None or seconds < 0:
        raise ValueError(f"a resource life of {seconds!r} s is not possible")
    if seconds == 0:
        return 0
    whole = int(Decimal(str(seconds)).to_integral_value(rounding=ROUND_CEILING))
    return max(whole, minimum)


def time_cost(hourly: Decimal, seconds: float | Decimal, count: Decimal | int = 1,
              minimum: int = MINIMUM_SECONDS) -> tuple[int, Decimal]:
    """(billed seconds, cost) of `count` units priced per hour for a life of `seconds`."""
    billed = billed_seconds(seconds, minimum)
    return billed, (Decimal(count) * hourly * billed / 3600).quantize(NANO, ROUND_HALF_UP)


def disk_cost(gb_month: Decimal, gb: Decimal | int, seconds: float | Decimal) -> tuple[int, Decimal]:
    """(billed seconds, cost) of `gb` GB for a life of `seconds` at a GB-month price (730 h)."""
    billed = billed_seconds(seconds, 0)
    return billed, (gb_month * Decimal(gb) * billed / (MONTH_HOURS * 3600)).quantize(NANO, ROUND_HALF_UP)


def money(value: Decimal | None) -> str:
    """'$1,234.57' (rounded half up to cents) for display; 'n/a' for None."""
    if value is None:
        return "n/a"
    return f"${value.quantize(CENT, ROUND_HALF_UP):,}"


def region_of(location: str | None) -> str | None:
    if not location:
        return location
    for rx in (_ZONE_RE, _AWS_AZ_RE):
        m = rx.match(location)
        if m:
            return m.group(1)
    return location


# -- the priced plan of a spec ----------------------------------------------------------------
@dataclass
class _Plan:
    cloud: str
    region: str
    market: str
    nodes: int
    machine: PriceRow | None = None  # instance row (derived for non-named N1 types)
    gpu: PriceRow | None = None  # GCE: per-GPU row
    gpus_per_node: int = 0
    gpu_name: str | None = None
    disk: PriceRow | None = None
    disk_gb: int = 0
    fee: PriceRow | None = None
    zonal: bool = False
    free_tier: bool = False
    system_unpriced: bool = False
    notes: list[str] = field(default_factory=list)


def _region_for(spec: ClusterSpec) -> str:
    return spec.region or region_of(spec.zone) or DEFAULT_REGION[spec.cloud]


def _n1_row(catalog: Catalog, region: str, machine_type: str, market: str) -> PriceRow:
    named = catalog.find("gcp", region, "instance", machine_type, market)
    if named is not None:
        return named
    shape = n1_shape(machine_type)
    if shape is None:
        allowed = sorted(set(n1_machine_types()) | set(catalog.items("gcp", "instance")))
        raise UsageError(not_allowed("gcp machine type", machine_type, allowed))
    vcpu = catalog.get("gcp", region, "vcpu", "n1", market)
    mem = catalog.get("gcp", region, "memory", "n1", market)
    cpus, gib = shape
    return PriceRow(
        cloud="gcp", region=region, kind="instance", item=machine_type, market=market, unit="hour",
        price=vcpu.price * cpus + mem.price * gib, vcpus=cpus, memory_gib=gib,
        date=min(vcpu.date, mem.date), origin=vcpu.origin,
        source=f"derived: {cpus} vCPU x {vcpu.price} + {gib} GiB x {mem.price} (N1 unit prices; {vcpu.source})")


def _disk_row(catalog: Catalog, cloud: str, region: str, disk_type: str, notes: list[str]) -> PriceRow:
    allowed = catalog.items(cloud, "disk")
    if disk_type not in allowed:
        raise UsageError(not_allowed(f"{cloud} disk type", disk_type, allowed))
    row = catalog.find(cloud, region, "disk", disk_type)
    if row is None:
        row = catalog.get(cloud, DEFAULT_REGION[cloud], "disk", disk_type)
        notes.append(f"no {disk_type} price for {region} in the catalog: used {row.region}'s "
                     f"({row.price}/GB-month); refresh prices for the exact figure")
    return row


def _resolved(spec: ClusterSpec) -> ClusterSpec:
    """The spec with the backend's own defaults filled in (`Backend.resolve`): what would really
    be created is what is priced."""
    try:
        return backend(spec.cloud).resolve(spec)
    except Exception:  # noqa: BLE001 - validation reports a bad spec; the estimate prices what it can
        return spec


def _system_pool(spec: ClusterSpec) -> dict[str, Any] | None:
    """The backend's always-on extras (GKE: the CPU system pool), from `Backend.system_pool`."""
    return backend(spec.cloud).system_pool(spec)


def _plan(spec: ClusterSpec, catalog: Catalog, free_tier: bool | None = None) -> _Plan:
    if spec.cloud not in PRICED_CLOUDS:
        raise UsageError(not_allowed("cloud", spec.cloud, PRICED_CLOUDS + FREE_CLOUDS))
    spec = _resolved(spec)
    nodes = parse_int("nodes", spec.nodes, low=1, high=max_nodes(spec.cloud))
    region = _region_for(spec)
    regions = catalog.regions(spec.cloud)
    if region not in regions:
        raise UsageError(not_allowed(f"{spec.cloud} region", region, regions))
    market = "spot" if spec.spot else "on-demand"
    itype = spec.instance_type or DEFAULT_INSTANCE[spec.cloud]
    plan = _Plan(cloud=spec.cloud, region=region, market=market, nodes=nodes)
    plan.disk_gb = parse_int("disk size (GB)", spec.disk_gb, low=1, high=65536)
    plan.disk = _disk_row(catalog, spec.cloud, region, spec.disk_type or DEFAULT_DISK_TYPE[spec.cloud], plan.notes)
    if spec.cloud == "aws":
        plan.machine = catalog.get("aws", region, "instance", itype, market)
        plan.gpus_per_node, plan.gpu_name = plan.machine.gpus, plan.machine.gpu
        if spec.gpus_per_node is not None and int(spec.gpus_per_node) != plan.machine.gpus:
            same = [t for t in catalog.items("aws", "instance")
                    if catalog.find("aws", region, "instance", t, market)
                    and catalog.find("aws", region, "instance", t, market).gpus == int(spec.gpus_per_node)]
            raise UsageError(f"gpus {spec.gpus_per_node} is not allowed for {itype}: it carries exactly "
                             f"{plan.machine.gpus} GPU(s)"
                             + (f"; types with {spec.gpus_per_node}: {', '.join(same)}" if same else ""))
        return plan
    plan.machine = _n1_row(catalog, region, itype, market)
    gpus = 0 if spec.gpus_per_node is None else int(spec.gpus_per_node)
    if gpus:
        plan.gpu_name = normalize_gpu(spec.accelerator or "V100", catalog.items("gcp", "gpu"))
        if gpus not in V100_LIMITS:
            raise UsageError(not_allowed("V100 count per node", gpus, [str(n) for n in V100_LIMITS]))
        max_cpu, max_gb = V100_LIMITS[gpus]
        cpus, gib = n1_shape(itype) or (plan.machine.vcpus, plan.machine.memory_gib)
        if cpus is not None and (cpus > max_cpu or gib > max_gb):
            fits = [mt for mt in n1_machine_types() if n1_shape(mt)[0] <= max_cpu and n1_shape(mt)[1] <= max_gb]
            raise UsageError(f"machine type {itype} ({cpus} vCPU, {gib.normalize():f} GB) cannot take {gpus} V100: "
                             f"{gpus} V100 allow at most {max_cpu} vCPU and {max_gb} GB per VM, e.g. "
                             + ", ".join(f for f in fits if f.startswith("n1-standard")))
        plan.gpu = catalog.get("gcp", region, "gpu", plan.gpu_name, market)
        plan.gpus_per_node = gpus
    else:
        plan.notes.append("no GPUs requested (pass --gpus-per-node to add V100s)")
    system = (_system_pool(spec) or {}).get("machine_type")
    if system and catalog.find("gcp", region, "instance", system, "on-demand") is None and n1_shape(system) is None:
        plan.notes.append(f"the GKE system node pool ({system}) has no price in the catalog: not included")
        plan.system_unpriced = True
    plan.fee = catalog.get("gcp", region, "cluster-fee", "gke")
    plan.zonal = spec.zone is not None
    opt = spec.option("gke_free_tier", False) if free_tier is None else free_tier
    plan.free_tier = str(opt).lower() in ("1", "true", "yes")
    return plan


# -- price snapshot ---------------------------------------------------------------------------
def _snap_key(kind: str, item: str, market: str) -> str:
    return f"{kind}/{item}/{market}"


def price_snapshot(spec: ClusterSpec, catalog: Catalog | None = None, *, free_tier: bool | None = None,
                   now: float | None = None) -> dict[str, Any]:
    """The prices a run will be billed at, taken at launch; JSON-able; stored in the ledger with
    the run (`Ledger.create_run(..., prices=price_snapshot(spec))`). Local/ssh: an empty snapshot
    that says such runs cost $0. Raises UsageError for a spec the catalog cannot price."""
    taken = _iso(now)
    if spec.cloud in FREE_CLOUDS:
        return {"cloud": spec.cloud, "currency": "USD", "taken_at": taken, "prices": {},
                "note": f"{spec.cloud} runs use machines gpucluster does not rent: $0"}
    catalog = catalog or load_catalog()
    plan = _plan(spec, catalog, free_tier)
    prices: dict[str, Any] = {}
    system = _system_pool(_resolved(spec))
    rows = [plan.machine, plan.gpu, plan.disk, plan.fee]
    if system and not plan.system_unpriced:
        rows.append(_n1_row(catalog, plan.region, system["machine_type"], "on-demand"))
        rows.append(_disk_row(catalog, spec.cloud, plan.region, system["disk_type"], []))
    for row in rows:
        if row is not None:
            # "region": where the run is; "priced_in": the catalog row's region (differs for a
            # fallback disk price or a region-independent fee)
            prices[_snap_key(row.kind, row.item, row.market)] = {**row.cite(), "gpus": row.gpus,
                                                                 "region": plan.region, "priced_in": row.region}
    return {
        "cloud": spec.cloud, "region": plan.region, "currency": "USD", "taken_at": taken,
        "prices": prices,
        "rules": {"minimum_seconds": MINIMUM_SECONDS, "disk_month_hours": MONTH_HOURS,
                  "gke_free_tier": plan.free_tier},
        "notes": plan.notes,
    }


def _iso(now: float | None = None) -> str:
    return _dt.datetime.fromtimestamp(now if now is not None else time.time(), _dt.timezone.utc).isoformat(
        timespec="seconds")


class _Pricer:
    """Finds a price in a run's snapshot, else in the current catalog (and says so)."""

    def __init__(self, snapshot: Mapping[str, Any] | None, cloud: str, catalog: Catalog | None):
        self.snapshot = snapshot or {}
        self.cloud = cloud
        self._catalog = catalog
        self.region = self.snapshot.get("region") or DEFAULT_REGION.get(cloud)

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = load_catalog()
        return self._catalog

    def price(self, kind: str, item: str, market: str, region: str | None) -> tuple[Decimal, dict[str, Any], str]:
        region = region or self.region
        cited = self.snapshot.get("prices", {}).get(_snap_key(kind, item, market))
        if cited and cited.get("region") in (region, "*", None):
            return Decimal(cited["price"]), cited, ""
        if kind == "instance" and self.cloud == "gcp":
            row = _n1_row(self.catalog, region, item, market)
        elif kind == "disk":
            notes: list[str] = []
            row = _disk_row(self.catalog, self.cloud, region, item, notes)
        else:
            row = self.catalog.get(self.cloud, region, kind, item, market)
        return row.price, row.cite(), f"{item} {market} price not in the run's snapshot: today's catalog used"


# -- costing resources ------------------------------------------------------------------------
def _truthy(v: Any) -> bool:
    return str(v).lower() in ("1", "true", "yes")


def _resource_lines(res: Mapping[str, Any], pricer: _Pricer, free_tier: bool, now: float) -> list[dict[str, Any]]:
    """Cost lines of one ledger resource row (see the module docstring for `detail`)."""
    kind = res["kind"]
    detail = res.get("detail") or {}
    start = res.get("requested_at")
    gone = bool(res.get("confirmed_gone")) and res.get("deleted_at") is not None
    end = res["deleted_at"] if gone else now
    seconds = max(Decimal(str(end)) - Decimal(str(start)), Decimal(0))
    region = region_of(res.get("region") or detail.get("region") or detail.get("location")) or pricer.region
    market = "spot" if _truthy(detail.get("spot", False)) else "on-demand"
    base = {"resource": res.get("name"), "kind": kind, "seconds": str(seconds), "still_billing": not gone,
            "region": region}
    notes = []
    if res.get("created_at") is None and kind in ("instance", "node-pool", "gke-cluster", "volume", "disk"):
        notes.append("creation never confirmed: billed from the request (upper bound)")
    lines: list[dict[str, Any]] = []

    def add(category: str, description: str, unit_price: Decimal, quantity: Decimal | int, unit: str,
            billed: int, cost: Decimal, cited: dict[str, Any], note: str) -> None:
        lines.append({**base, "category": category, "description": description, "unit_price": str(unit_price),
                      "unit": unit, "quantity": str(quantity), "billed_seconds": billed, "cost": str(cost),
                      "source": cited.get("source"), "date": cited.get("date"),
                      "note": "; ".join(n for n in notes + [note] if n)})

    if kind == "instance":
        itype = detail.get("instance_type") or detail.get("machine_type")
        price, cited, note = pricer.price("instance", itype, market, region)
        billed, cost = time_cost(price, seconds)
        add("instances", f"{itype} ({market})", price, 1, "hour", billed, cost, cited, note)
        gpus = int(detail.get("gpus") or 0)
        if gpus and pricer.cloud == "gcp":
            name = normalize_gpu(detail.get("accelerator") or "V100")
            price, cited, note = pricer.price("gpu", name, market, region)
            billed, cost = time_cost(price, seconds, gpus)
            add("gpus", f"{gpus} x {name} ({market})", price, gpus, "gpu-hour", billed, cost, cited, note)
        _disk_lines(detail, 1, seconds, pricer, region, add)
    elif kind == "node-pool":
        count = int(detail.get("node_count") or 1)
        mtype = detail.get("machine_type") or detail.get("instance_type")
        price, cited, note = pricer.price("instance", mtype, market, region)
        billed, cost = time_cost(price, seconds, count)
        add("instances", f"{count} x {mtype} ({market})", price, count, "hour", billed, cost, cited, note)
        gpus = int(detail.get("gpus_per_node") or 0) * count
        if gpus:
            name = normalize_gpu(detail.get("accelerator") or "V100")
            price, cited, note = pricer.price("gpu", name, market, region)
            billed, cost = time_cost(price, seconds, gpus)
            add("gpus", f"{gpus} x {name} ({market})", price, gpus, "gpu-hour", billed, cost, cited, note)
        _disk_lines(detail, count, seconds, pricer, region, add)
    elif kind in ("volume", "disk"):
        _disk_lines(detail, 1, seconds, pricer, region, add)
    elif kind == "gke-cluster":
        price, cited, note = pricer.price("cluster-fee", "gke", "on-demand", region)
        zonal = _truthy(detail["zonal"]) if "zonal" in detail else bool(_ZONE_RE.match(str(detail.get("location", ""))))
        if free_tier and zonal:
            billed = billed_seconds(seconds, 0)
            add("cluster fee", "GKE cluster fee (zonal, free tier)", price, 1, "cluster-hour", billed, Decimal(0),
                cited, "covered by the GKE free tier: one zonal cluster per billing account")
        else:
            billed, cost = time_cost(price, seconds, 1, minimum=0)
            why = "regional clusters are not covered by the free tier" if free_tier else ""
            add("cluster fee", f"GKE cluster fee ({'zonal' if zonal else 'regional'})", price, 1, "cluster-hour",
                billed, cost, cited, why)
    else:
        lines.append({**base, "category": "no charge", "description": f"{kind} (no charge)", "cost": "0",
                      "billed_seconds": 0, "note": ""})
    return lines


def _disk_lines(detail: Mapping[str, Any], count: int, seconds: Decimal, pricer: _Pricer, region: str, add) -> None:
    gb = detail.get("disk_gb")
    if not gb:
        return
    dtype = detail.get("disk_type") or DEFAULT_DISK_TYPE[pricer.cloud]
    price, cited, note = pricer.price("disk", dtype, "on-demand", region)
    total_gb = int(gb) * count
    billed, cost = disk_cost(price, total_gb, seconds)
    add("disks", f"{total_gb} GB {dtype}", price, total_gb, "gb-month", billed, cost, cited, note)


def _summarize(lines: list[dict[str, Any]]) -> dict[str, str]:
    by = {c: Decimal(0) for c in CATEGORIES}
    for line in lines:
        if line["category"] in by:
            by[line["category"]] += Decimal(line["cost"])
    return {c: str(v) for c, v in by.items()}


def run_cost(run: Mapping[str, Any], *, now: float | None = None, catalog: Catalog | None = None) -> dict[str, Any]:
    """The cost of a run (finished, failed, interrupted or still going) from its ledger dict
    (`Ledger.get_run`): its resources' lifetimes, the price snapshot stored at launch, and the
    billing rules. JSON-able; store it with `Ledger.set_cost(run_id, cost)`."""
    now = time.time() if now is None else now
    cloud = run.get("cloud")
    if "resources" not in run:
        raise ValueError("run_cost needs the run's resources: pass Ledger.get_run(run_id), not a list_runs row")
    result: dict[str, Any] = {"run_id": run.get("id"), "cloud": cloud, "currency": "USD",
                              "computed_at": _iso(now), "lines": [], "notes": [], "still_billing": []}
    if cloud in FREE_CLOUDS:
        result.update(total="0", by_category=_summarize([]), local=True, price_date=None)
        result["notes"].append(f"{cloud} run: no rented cloud resources, $0")
        return result
    snapshot = run.get("prices")
    if not snapshot:
        result["notes"].append("no price snapshot stored with the run: priced with today's catalog")
    free_tier = bool((snapshot or {}).get("rules", {}).get("gke_free_tier", False))
    pricer = _Pricer(snapshot, cloud, catalog)
    if not snapshot and run.get("spec"):
        try:
            pricer.region = _region_for(ClusterSpec.from_dict(run["spec"]))
        except Exception:  # noqa: BLE001 - an odd stored spec only loses the default region
            pass
    for res in run.get("resources") or []:
        try:
            result["lines"].extend(_resource_lines(res, pricer, free_tier, now))
        except UsageError as exc:
            result["lines"].append({"resource": res.get("name"), "kind": res.get("kind"), "category": "unpriced",
                                    "description": str(res.get("detail")), "cost": "0", "billed_seconds": 0,
                                    "still_billing": not res.get("confirmed_gone"), "note": f"not priced: {exc}"})
            result["notes"].append(f"{res.get('kind')} {res.get('name')} could not be priced ({exc}): "
                                   "the total leaves it out")
    total = sum((Decimal(line["cost"]) for line in result["lines"]), Decimal(0))
    result["still_billing"] = sorted({line["resource"] for line in result["lines"]
                                      if line.get("still_billing") and line["category"] != "no charge"})
    if result["still_billing"]:
        result["notes"].append("still billing (never confirmed deleted, costed up to now): "
                               + ", ".join(result["still_billing"]))
    if not run.get("resources"):
        result["notes"].append("the ledger records no resources for this run: nothing was billed")
    dates = [line["date"] for line in result["lines"] if line.get("date")]
    result.update(total=str(total), by_category=_summarize(result["lines"]), local=False,
                  price_date=min(dates) if dates else (snapshot or {}).get("taken_at"))
    return result


def record_run_cost(ledger: Any, run_id: str, *, now: float | None = None) -> dict[str, Any]:
    """Compute a run's cost from the ledger and store it there (`runs.cost`); returns it."""
    run = ledger.get_run(run_id)
    if run is None:
        raise UsageError(f"no run {run_id!r} in the ledger")
    cost = run_cost(run, now=now)
    ledger.set_cost(run["id"], cost)
    return cost


# -- estimates --------------------------------------------------------------------------------
@dataclass
class Estimate:
    cloud: str
    region: str | None
    nodes: int
    hours: Decimal
    market: str
    lines: list[dict[str, Any]]
    hourly: Decimal
    total: Decimal
    price_date: str | None
    gpus: int = 0
    per_gpu_hour: Decimal | None = None
    notes: list[str] = field(default_factory=list)
    snapshot: dict[str, Any] = field(default_factory=dict)

    def render_line(self) -> str:
        """One line for a plan: total, hourly, the items, the price date."""
        if not self.lines:
            return f"$0 ({'; '.join(self.notes)})"
        items = ", ".join(f"{ln['category']} {money(Decimal(ln['hourly']))}/h" for ln in self.lines
                          if (Decimal(ln["hourly"]) or ln["category"] != "gpus")
                          and not ln["description"].startswith("system pool: "))
        system = sum((Decimal(ln["hourly"]) for ln in self.lines if ln["description"].startswith("system pool: ")),
                     Decimal(0))
        if system:
            items += f", system pool {money(system)}/h"
        per_gpu = f", {money(self.per_gpu_hour)}/GPU-hour" if self.per_gpu_hour is not None else ""
        return (f"{money(self.total)} for {self.hours.normalize():f} h at {money(self.hourly)}/h "
                f"({items}{per_gpu}; {self.market} prices read {self.price_date})")

    def __str__(self) -> str:
        return self.render_line()

    def to_dict(self) -> dict[str, Any]:
        return {"cloud": self.cloud, "region": self.region, "nodes": self.nodes, "hours": str(self.hours),
                "market": self.market, "lines": self.lines, "hourly": str(self.hourly), "total": str(self.total),
                "price_date": self.price_date, "gpus": self.gpus,
                "per_gpu_hour": None if self.per_gpu_hour is None else str(self.per_gpu_hour),
                "notes": self.notes, "currency": "USD"}


def planned_resources(spec: ClusterSpec, seconds: Decimal, start: float = 0.0) -> list[dict[str, Any]]:
    """The resource rows a run of `spec` records when it lives `seconds` (what estimates cost):
    EC2: one `instance` per node with its root gp3 volume; GKE: the cluster, the GPU pool and the
    system pool (the real defaults: `catalog.gcp.resolve`)."""
    spec = _resolved(spec)
    end = float(Decimal(str(start)) + seconds)
    region = _region_for(spec)
    common = {"requested_at": start, "created_at": start, "deleted_at": end, "confirmed_gone": True,
              "region": region}
    disk = {"disk_gb": spec.disk_gb, "disk_type": spec.disk_type or DEFAULT_DISK_TYPE[spec.cloud]}
    if spec.cloud == "aws":
        itype = spec.instance_type or DEFAULT_INSTANCE["aws"]
        return [{**common, "kind": "instance", "name": f"{spec.name}-{i}",
                 "detail": {"instance_type": itype, "spot": spec.spot, **disk}} for i in range(int(spec.nodes))]
    pool = {"machine_type": spec.instance_type or DEFAULT_INSTANCE["gcp"], "node_count": int(spec.nodes),
            "gpus_per_node": int(spec.gpus_per_node or 0), "accelerator": spec.accelerator or "nvidia-tesla-v100",
            "spot": spec.spot, **disk}
    rows = [{**common, "kind": "gke-cluster", "name": spec.name, "detail": {"zonal": spec.zone is not None}},
            {**common, "kind": "node-pool", "name": f"{spec.name}-gpu", "detail": pool}]
    system = _system_pool(spec)
    if system:
        try:
            priced = n1_shape(system["machine_type"]) is not None or load_catalog().find(
                "gcp", region, "instance", system["machine_type"], "on-demand") is not None
        except Exception:  # noqa: BLE001
            priced = False
        if priced:
            rows.append({**common, "kind": "node-pool", "name": f"{spec.name}-system", "detail": system})
    return rows


def parse_hours(value: Any) -> Decimal:
    try:
        hours = Decimal(str(value).strip())
    except Exception:  # noqa: BLE001 - decimal raises several types
        hours = None
    if hours is None or not hours.is_finite() or hours <= 0 or hours > 24 * 366:
        raise UsageError(not_allowed("hours", value, "a number of hours above 0 (e.g. 0.5, 3)"))
    return hours


def estimate(spec: ClusterSpec, hours: Any, *, catalog: Catalog | None = None,
             free_tier: bool | None = None, now: float | None = None) -> Estimate:
    """Itemized estimate (instances, GPUs, disks, cluster fee) of running `spec` for `hours`.

    Computed by costing the resources such a run records (`planned_resources`) with the same
    rules and snapshot as `run_cost`, so the two agree when the durations do."""
    hours = parse_hours(hours)
    if spec.cloud in FREE_CLOUDS:
        parse_int("nodes", spec.nodes, low=1, high=max_nodes(spec.cloud))
        return Estimate(cloud=spec.cloud, region=None, nodes=int(spec.nodes), hours=hours, market="-", lines=[],
                        hourly=Decimal(0), total=Decimal(0), price_date=None,
                        notes=[f"{spec.cloud} runs use machines gpucluster does not rent: $0"])
    catalog = catalog or load_catalog()
    plan = _plan(spec, catalog, free_tier)
    snapshot = price_snapshot(spec, catalog, free_tier=free_tier, now=now)
    run = {"cloud": spec.cloud, "prices": snapshot, "resources": planned_resources(spec, hours * 3600)}
    cost = run_cost(run, now=now, catalog=catalog)
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for line in cost["lines"]:
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
    lines = list(merged.values())
    for line in lines:
        count = line.pop("count")
        if count > 1:
            line["description"] = f"{count} x {line['description']}"

        qty, price = Decimal(line["quantity"]), Decimal(line["unit_price"])
        rate = qty * price / MONTH_HOURS if line["unit"] == "gb-month" else qty * price
        if line["category"] == "cluster fee" and Decimal(line["total"]) == 0:
            rate = Decimal(0)
        line["hourly"] = str(rate.quantize(NANO, ROUND_HALF_UP))
    if spec.cloud == "aws":
        lines.insert(1, {"category": "gpus", "description": f"{plan.nodes * plan.gpus_per_node} x {plan.gpu_name}",
                         "quantity": str(plan.nodes * plan.gpus_per_node), "unit": "-", "unit_price": "0",
                         "hourly": "0", "total": "0", "source": plan.machine.source, "date": plan.machine.date,
                         "note": "included in the instance price"})
    order = {c: i for i, c in enumerate(CATEGORIES)}
    lines.sort(key=lambda ln: order.get(ln["category"], 99))
    hourly = sum((Decimal(ln["hourly"]) for ln in lines), Decimal(0))
    # What bills with no GPU node left (GKE: after the dead-man switch): the fee and the system pool.
    always_on = sum((Decimal(ln["hourly"]) for ln in lines
                     if ln["category"] == "cluster fee" or ln["description"].startswith("system pool: ")), Decimal(0))
    total = Decimal(cost["total"])
    gpus = plan.nodes * plan.gpus_per_node
    gpu_hourly = sum((Decimal(ln["hourly"]) for ln in lines if ln["category"] in ("instances", "gpus")
                      and not ln["description"].startswith("system pool: ")), Decimal(0))
    notes = list(plan.notes)
    if spec.cloud == "gcp" and always_on:
        notes.append(f"after the max lifetime the Job stops and the GPU pool scales to zero; the cluster fee and the "
                     f"system pool keep billing {money(always_on)}/h ({always_on.quantize(Decimal('0.0001'))}) "
                     "until `gpucluster down`")
    if hours * 3600 < MINIMUM_SECONDS:
        notes.append("instances are billed at least 60 seconds each")
    if spec.spot:
        notes.append("spot prices are a point-in-time reference and the nodes can be reclaimed")
    if spec.cloud == "gcp" and plan.free_tier:
        notes.append("GKE fee: free tier applied" + ("" if plan.zonal else " only to zonal clusters; this one is "
                                                     "regional (no zone given)"))
    return Estimate(cloud=spec.cloud, region=plan.region, nodes=plan.nodes, hours=hours, market=plan.market,
                    lines=lines, hourly=hourly, total=total, price_date=cost["price_date"], gpus=gpus,
                    per_gpu_hour=(gpu_hourly / gpus) if gpus else None, notes=notes, snapshot=snapshot)


# -- what-if from measured speed --------------------------------------------------------------
def _run_shape(run: Mapping[str, Any], catalog: Catalog | None) -> tuple[str, str | None, str | None, int | None]:
    spec = run.get("spec") or {}
    cloud = run.get("cloud") or spec.get("cloud")
    itype = spec.get("instance_type")
    gpu = spec.get("accelerator")
    if cloud == "aws" and itype and catalog is not None:
        row = next((r for r in catalog.rows.values() if r.cloud == "aws" and r.item == itype), None)
        gpu = row.gpu if row else gpu
    if gpu:
        try:
            gpu = normalize_gpu(gpu, ("A10G", "V100"))
        except UsageError:
            pass
    return cloud, itype, gpu, run.get("gpus_per_node")


def _fmt_shape(shape: tuple) -> str:
    cloud, itype, gpu, gpn = shape
    return f"{cloud}" + (f" {itype}" if itype else "") + (f" {gpn} x {gpu}" if gpu else (f" {gpn} GPU" if gpn else ""))


def what_if(ledger_runs: Iterable[Mapping[str, Any]], nodes_list: Iterable[int], workload: str, epochs: int, *,
            cloud: str | None = None, instance_type: str | None = None, gpus_per_node: int | None = None,
            catalog: Catalog | None = None) -> dict[str, Any]:
    """Project wall time and cost of `epochs` epochs of `workload` on each node count, from the
    runs in the ledger (succeeded, same workload, same cloud / instance type / GPU type / GPUs per
    node). Epoch time per node count is the median measured; counts not measured are projected
    from a power-law fit of epoch time against node count over the measured counts (the measured
    scaling, never an assumed linear one); with one measured count nothing else is projected.
    Set-up and tear-down time (run wall time minus training time) is the median measured at the
    nearest measured count. Raises UsageError when no run qualifies."""
    nodes_list = [parse_int("nodes", n, low=1, high=max(max_nodes(c) for c in NAMES)) for n in nodes_list]
    epochs = parse_int("epochs", epochs, low=1)
    if not nodes_list:
        raise UsageError("nodes: give at least one node count, e.g. --nodes 1,2,4,8")
    catalog = catalog or load_catalog()
    usable: list[tuple[tuple, Mapping[str, Any], float, float | None]] = []
    seen_workload = False
    for run in ledger_runs:
        if run.get("workload") != workload:
            continue
        seen_workload = True
        summary = run.get("metrics") or {}
        train_s, run_epochs = summary.get("train_time_s"), summary.get("epochs")
        if run.get("status") != "succeeded" or not train_s or not run_epochs:
            continue
        shape = _run_shape(run, catalog)
        if cloud and shape[0] != cloud or instance_type and shape[1] != instance_type \
                or gpus_per_node is not None and shape[3] != gpus_per_node:
            continue
        wall = None
        if run.get("ended_at") and run.get("created_at"):
            wall = float(run["ended_at"]) - float(run["created_at"])
        usable.append((shape, run, float(train_s) / float(run_epochs), wall))
    if not usable:
        why = ("no succeeded run with training metrics matches" if seen_workload
               else "the ledger has no run of this workload")
        raise UsageError(f"cannot project {workload!r}: {why}; run it first (e.g. on 1 and 2 nodes) so the "
                         "projection rests on measured speed")
    shapes = sorted({u[0] for u in usable}, key=str)
    if len(shapes) > 1:
        listed = "; ".join(_fmt_shape(s) for s in shapes)
        raise UsageError(f"runs of {workload!r} were measured on several node shapes ({listed}); choose one with "
                         "--cloud / --instance-type / --gpus")
    shape = shapes[0]
    by_nodes: dict[int, list[tuple[Mapping[str, Any], float, float | None]]] = {}
    for _, run, epoch_s, wall in usable:
        by_nodes.setdefault(int(run["nodes"]), []).append((run, epoch_s, wall))
    measured = []
    for n in sorted(by_nodes):
        rows = by_nodes[n]
        epoch_s = statistics.median(e for _, e, _ in rows)
        overheads = [max(w - e * float(r["metrics"]["epochs"]), 0.0) for r, e, w in rows if w is not None]
        sps = [float(r["metrics"]["samples_per_s"]) for r, _, _ in rows if r["metrics"].get("samples_per_s")]
        measured.append({"nodes": n, "runs": [r["id"] for r, _, _ in rows], "epoch_s": epoch_s,
                         "overhead_s": statistics.median(overheads) if overheads else 0.0,
                         "samples_per_s": statistics.median(sps) if sps else None})
    base = measured[0]
    for m in measured:
        m["efficiency"] = (base["epoch_s"] * base["nodes"]) / (m["epoch_s"] * m["nodes"])
    fit = None
    if len(measured) >= 2:
        xs = [math.log(m["nodes"]) for m in measured]
        ys = [math.log(m["epoch_s"]) for m in measured]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        fit = {"exponent": b, "intercept": my - b * mx,
               "meaning": "epoch time ~ nodes^exponent; -1 would be perfect scaling, 0 none, > 0 slower"}
    latest = max((u[1] for u in usable), key=lambda r: r.get("created_at") or 0)
    spec_base = None
    if latest.get("spec"):
        spec_base = ClusterSpec.from_dict(latest["spec"])
    known = {m["nodes"]: m for m in measured}
    lo, hi = measured[0]["nodes"], measured[-1]["nodes"]
    projection = []
    for n in nodes_list:
        row: dict[str, Any] = {"nodes": n}
        nearest = min(measured, key=lambda m: (abs(math.log(m["nodes"]) - math.log(n)), m["nodes"]))
        if n in known:
            epoch_s, basis = known[n]["epoch_s"], "measured"
        elif fit is not None:
            epoch_s = math.exp(fit["intercept"] + fit["exponent"] * math.log(n))
            basis = "fitted" if lo < n < hi else "extrapolated"
        else:
            row.update(basis=None, note=f"not measured: only {lo} node(s) measured, so scaling to {n} is unknown; "
                                        f"run it on {n} nodes (or one more node count) first")
            projection.append(row)
            continue
        train_s = epoch_s * epochs
        wall_s = train_s + nearest["overhead_s"]
        row.update(basis=basis, epoch_s=round(epoch_s, 3), train_s=round(train_s, 3), wall_s=round(wall_s, 3),
                   efficiency=round((base["epoch_s"] * base["nodes"]) / (epoch_s * n), 4),
                   overhead_from_nodes=nearest["nodes"])
        if shape[0] in FREE_CLOUDS or spec_base is None:
            row.update(cost="0", hourly="0", note=f"{shape[0]} runs cost $0")
        else:
            est = estimate(spec_base.replace(nodes=n), Decimal(str(round(wall_s, 3))) / 3600, catalog=catalog)
            row.update(cost=str(est.total), hourly=str(est.hourly), price_date=est.price_date)
        projection.append(row)
    return {"workload": workload, "epochs": epochs, "shape": _fmt_shape(shape),
            "runs_used": [rid for m in measured for rid in m["runs"]], "measured": measured, "fit": fit,
            "projection": projection}


# -- reports ----------------------------------------------------------------------------------
GROUPS = ("day", "cloud", "cluster")


def parse_since(value: str | None) -> float | None:
    """'YYYY-MM-DD' (UTC) or an ISO time -> Unix seconds; UsageError otherwise."""
    if value is None:
        return None
    try:
        d = _dt.datetime.fromisoformat(value.strip())
    except ValueError:
        raise UsageError(not_allowed("date", value, "YYYY-MM-DD or an ISO time such as 2026-11-22T10:00")) from None
    if d.tzinfo is None:
        d = d.replace(tzinfo=_dt.timezone.utc)
    return d.timestamp()


def report(runs: Iterable[Mapping[str, Any]], *, group_by: str | None = None, now: float | None = None,
           catalog: Catalog | None = None) -> dict[str, Any]:
    """Per-run costs (the stored cost if the run has one and nothing was left billing, else
    computed now) with totals, optionally grouped by day (UTC), cloud or cluster."""
    if group_by is not None and group_by not in GROUPS:
        raise UsageError(not_allowed("group-by", group_by, GROUPS))
    now = time.time() if now is None else now
    rows = []
    for run in runs:
        stored = run.get("cost")
        cost = stored if stored and not stored.get("still_billing") and "total" in stored else None
        if cost is None:
            cost = run_cost(run, now=now, catalog=catalog)
        end = run.get("ended_at")
        wall = None if not (end and run.get("created_at")) else round(float(end) - float(run["created_at"]), 3)
        created = _dt.datetime.fromtimestamp(float(run["created_at"]), _dt.timezone.utc)
        rows.append({"run_id": run["id"], "created": created.isoformat(timespec="seconds"),
                     "day": created.strftime("%Y-%m-%d"), "cloud": run.get("cloud"), "cluster": run.get("cluster"),
                     "status": run.get("status"), "nodes": run.get("nodes"), "wall_s": wall,
                     "cost": cost["total"], "still_billing": bool(cost.get("still_billing")),
                     "note": "; ".join(cost.get("notes") or []), "price_date": cost.get("price_date")})
    rows.sort(key=lambda r: r["created"])
    total = sum((Decimal(r["cost"]) for r in rows), Decimal(0))
    groups = []
    if group_by:
        acc: dict[str, dict[str, Any]] = {}
        for r in rows:
            g = acc.setdefault(str(r[group_by]), {group_by: r[group_by], "runs": 0, "cost": Decimal(0), "wall_s": 0.0})
            g["runs"] += 1
            g["cost"] += Decimal(r["cost"])
            g["wall_s"] += r["wall_s"] or 0.0
        groups = [{**g, "cost": str(g["cost"]), "wall_s": round(g["wall_s"], 3)} for _, g in sorted(acc.items())]
    return {"currency": "USD", "runs": rows, "groups": groups, "group_by": group_by, "total": str(total),
            "still_billing": [r["run_id"] for r in rows if r["still_billing"]]}


REPORT_CSV_FIELDS = ("run_id", "created", "cloud", "cluster", "status", "nodes", "wall_s", "cost", "still_billing",
                     "price_date", "note")


def report_csv(rep: Mapping[str, Any]) -> str:
    import csv
    import io

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=REPORT_CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rep["runs"]:
        writer.writerow(row)
    return buf.getvalue()


def plot_report(rep: Mapping[str, Any], path: str | Path) -> Path:
    """A PNG with cost (bars) and wall time (line) per run. Needs matplotlib (the `plot` extra)."""
    from gpucluster.errors import require

    matplotlib = require("matplotlib", "plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = rep["runs"]
    if not runs:
        raise UsageError("no runs to plot (check --since / --cloud)")
    labels = [r["run_id"][-12:] for r in runs]
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(runs) + 2), 4))
    ax.bar(range(len(runs)), [float(r["cost"]) for r in runs], color="tab:blue")
    ax.set_ylabel("cost (USD)")
    ax.set_xticks(range(len(runs)), labels, rotation=45, ha="right", fontsize=7)
    ax2 = ax.twinx()
    ax2.plot(range(len(runs)), [r["wall_s"] or 0 for r in runs], color="tab:red", marker="o")
    ax2.set_ylabel("wall time (s)")
    ax.set_title(f"gpucluster runs: total ${Decimal(rep['total']).quantize(CENT, ROUND_HALF_UP)}")
    fig.tight_layout()
    from gpucluster.plots import save_png

    return save_png(fig, path, "--plot file", format="png")


# -- stack files --------------------------------------------------------------------------------
def spec_from_stack_file(path: str | Path) -> ClusterSpec:
    """A ClusterSpec from a Pulumi stack file's `gpucluster:` keys (camelCase -> spec field; other
    keys become options). Needs PyYAML (installed with pulumi, the aws/gcp extras)."""
    from gpucluster.errors import ConfigError, require

    yaml = require("yaml", "aws")
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise UsageError(f"stack file {str(path)!r} does not exist") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"stack file {str(path)!r} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at "
                          f"offset {exc.start}); save it as UTF-8") from None
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"stack file {str(path)!r} cannot be read: {str(exc).splitlines()[0]}") from None
    config = doc.get("config") if isinstance(doc, dict) else None
    if not isinstance(config, dict):
        raise ConfigError(f"stack file {str(path)!r} has no config: mapping")
    fields = {f for f in ClusterSpec.__dataclass_fields__}
    kw: dict[str, Any] = {}
    options: dict[str, str] = {}
    for key, value in config.items():
        ns, _, name = str(key).partition(":")
        if ns != "gpucluster":
            continue
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
        try:  # a mapping or list where one value belongs, a reserved tag: one line naming the key
            if snake == "tags":
                kw[snake] = config_tags(str(key), value if value is not None else {})
            elif snake in fields and snake not in ("options", "hosts", "run_id"):
                kw[snake] = config_scalar(str(key), value)
            else:
                options[snake] = str(value)
        except SpecError as exc:
            raise SpecError(f"stack file {str(path)!r}: {exc.message}") from None
    if "cloud" not in kw:
        raise ConfigError(f"stack file {str(path)!r} has no gpucluster:cloud")
    for name in ("nodes", "gpus_per_node", "disk_gb", "max_lifetime_minutes"):
        if name in kw and kw[name] is not None:
            kw[name] = parse_int(name.replace("_", " "), kw[name], low=0)
    if "spot" in kw:
        kw["spot"] = _truthy(kw["spot"])
    kw["tags"] = kw.get("tags") or {}
    kw["options"] = options
    kw.setdefault("nodes", 1)
    return ClusterSpec.from_dict(kw)
