"""The true cost of a run, from the lifetimes of the resources its ledger records and the price
snapshot stored at launch (`gpucluster.costing.cost` documents the resource records and the rules)."""

from __future__ import annotations

import time
from decimal import Decimal
from typing import TYPE_CHECKING, Callable

from gpucluster.catalog.prices import Catalog, normalize_gpu
from gpucluster.errors import UsageError
from gpucluster.ledger.records import UP_COMMAND, ResourceRow, RunRecord, RunRow
from gpucluster.spec import ClusterSpec, parse_bool
from gpucluster.states import JsonMapping, JsonObject

from .internal import internal_cost
from .plan import Pricer, is_free, region_for, same_cloud
from .rules import CATEGORIES, ZONE_RE, billed_seconds, disk_cost, iso, region_of, time_cost

if TYPE_CHECKING:
    from gpucluster.infra.contract import Plugin
    from gpucluster.ledger.store import Ledger


# _Lines.add: category, description, unit price, quantity, unit, billed seconds, cost, cited source, note
AddLine = Callable[[str, str, Decimal, "Decimal | int", str, int, Decimal, JsonObject, str], None]


class _Lines:
    """The cost lines of one ledger resource row, built by kind (see the module docstring for
    `detail`)."""

    def __init__(self, res: ResourceRow, pricer: Pricer, now: float) -> None:
        self.detail: JsonMapping = res.detail or {}
        gone = bool(res.confirmed_gone) and res.deleted_at is not None
        end = res.deleted_at if gone else now
        self.seconds = max(Decimal(str(end)) - Decimal(str(res.requested_at)), Decimal(0))
        self.pricer = pricer
        self.region = region_of(res.region or self.detail.get("region") or self.detail.get("location")) or pricer.region
        self.market = "spot" if parse_bool("spot", self.detail.get("spot", False)) else "on-demand"
        born = float(res.requested_at or 0)
        self.base = {"resource": res.name, "kind": res.kind, "seconds": str(self.seconds), "still_billing": not gone,
                     "region": self.region, "from": born, "to": max(float(end or 0), born)}  # its billed life (periods.py)
        self.notes = []
        if res.created_at is None and res.kind in ("instance", "fleet", "node-pool", "gke-cluster", "volume", "disk"):
            self.notes.append("creation never confirmed: billed from the request (upper bound)")
        self.lines: list[JsonObject] = []

    def add(self, category: str, description: str, unit_price: Decimal, quantity: Decimal | int, unit: str,
            billed: int, cost: Decimal, cited: JsonObject, note: str) -> None:
        self.lines.append({**self.base, "category": category, "description": description,
                           "unit_price": str(unit_price), "unit": unit, "quantity": str(quantity),
                           "billed_seconds": billed, "cost": str(cost), "source": cited.get("source"),
                           "date": cited.get("date"), "note": "; ".join(n for n in self.notes + [note] if n)})

    def timed(self, category: str, what: str, key: str, count: int, unit: str, description: str,
              market: str | None = None, minimum: int | None = None) -> None:
        """`count` of a thing priced per hour (`what`, `key` in the catalog) for the resource's life."""
        price, cited, note = self.pricer.price(what, key, market or self.market, self.region)
        billed, cost = (time_cost(price, self.seconds, count) if minimum is None
                        else time_cost(price, self.seconds, count, minimum=minimum))
        self.add(category, description, price, count, unit, billed, cost, cited, note)

    def gpus(self, gpus: int) -> None:
        if gpus:
            name = normalize_gpu(self.detail.get("accelerator") or "V100")
            self.timed("gpus", "gpu", name, gpus, "gpu-hour", f"{gpus} x {name} ({self.market})")

    def instances(self, fleet: bool) -> None:
        """An instance, or a fleet: node_count identical instances living as long as it."""
        detail, market = self.detail, self.market
        count = int(detail.get("node_count") or 1) if fleet else 1
        itype = str(detail.get("instance_type") or detail.get("machine_type"))  # the detail is JSON
        price, cited, note = self.pricer.price("instance", itype, market, self.region)
        if market == "spot":  # the launched zone's price where it is known, else the catalog's (said which)
            price, cited, said = self.pricer.in_zone(price, cited, itype, market, self.region,
                                                     detail.get("availability_zone"))
            note = "; ".join(n for n in (note, said) if n)
        billed, cost = time_cost(price, self.seconds, count)
        self.add("instances", f"{count} x {itype} ({market})" if fleet else f"{itype} ({market})", price, count,
                 "hour", billed, cost, cited, note)
        _ipv4_lines(int(detail.get("public_ipv4") or 0) * count, self.seconds, self.pricer, self.region, self.add)
        gpus = int(detail.get("gpus") or 0)
        if gpus and self.pricer.gpus_billed_apart:  # GCE VMs: GPUs billed apart; EC2: in the instance price
            self.gpus(gpus)
        _disk_lines(detail, count, self.seconds, self.pricer, self.region, self.add)

    def node_pool(self) -> None:
        detail = self.detail
        count = int(detail.get("node_count") or 1)
        mtype = str(detail.get("machine_type") or detail.get("instance_type"))
        self.timed("instances", "instance", mtype, count, "hour", f"{count} x {mtype} ({self.market})")
        self.gpus(int(detail.get("gpus_per_node") or 0) * count)
        _disk_lines(detail, count, self.seconds, self.pricer, self.region, self.add)
        ips = int(detail.get("external_ipv4") or 0) * count  # addresses per node (GCE bills each in use)
        if ips:
            self.timed("instances", "ipv4", "external-ipv4", ips, "address-hour",
                       f"{ips} x external IPv4 ({self.market})")

    def cluster_fee(self, free_tier: bool) -> None:
        detail = self.detail
        price, cited, note = self.pricer.price("cluster-fee", "gke", "on-demand", self.region)
        zonal = (parse_bool("zonal", detail["zonal"]) if "zonal" in detail
                 else bool(ZONE_RE.match(str(detail.get("location", "")))))
        if free_tier and zonal:
            billed = billed_seconds(self.seconds, 0)
            self.add("cluster fee", "GKE cluster fee (zonal, free tier)", price, 1, "cluster-hour", billed,
                     Decimal(0), cited, "covered by the GKE free tier: one zonal cluster per billing account")
        else:
            billed, cost = time_cost(price, self.seconds, 1, minimum=0)
            why = "regional clusters are not covered by the free tier" if free_tier else ""
            self.add("cluster fee", f"GKE cluster fee ({'zonal' if zonal else 'regional'})", price, 1,
                     "cluster-hour", billed, cost, cited, why)


def _resource_lines(res: ResourceRow, pricer: Pricer, free_tier: bool, now: float) -> list[JsonObject]:
    """Cost lines of one ledger resource row (see the module docstring for `detail`)."""
    out = _Lines(res, pricer, now)
    kind = res.kind
    if kind in ("instance", "fleet"):
        out.instances(fleet=kind == "fleet")
    elif kind == "node-pool":
        out.node_pool()
    elif kind in ("volume", "disk"):
        _disk_lines(out.detail, 1, out.seconds, pricer, out.region, out.add)
    elif kind == "elastic-ip":  # billed as a public IPv4 address, attached or not
        _ipv4_lines(1, out.seconds, pricer, out.region, out.add)
    elif kind == "gke-cluster":
        out.cluster_fee(free_tier)
    else:
        out.lines.append({**out.base, "category": "no charge", "description": f"{kind} (no charge)", "cost": "0",
                          "billed_seconds": 0, "note": ""})
    return out.lines


def _disk_lines(detail: JsonMapping, count: int, seconds: Decimal, pricer: Pricer, region: str | None,
                add: AddLine) -> None:
    gb = detail.get("disk_gb")
    if not gb:
        return
    dtype = str(detail.get("disk_type") or pricer.default_disk_type)
    price, cited, note = pricer.price("disk", dtype, "on-demand", region)
    total_gb = int(gb) * count
    billed, cost = disk_cost(price, total_gb, seconds)
    add("disks", f"{total_gb} GB {dtype}", price, total_gb, "gb-month", billed, cost, cited, note)


def _ipv4_lines(count: int, seconds: Decimal, pricer: Pricer, region: str | None, add: AddLine) -> None:
    """Public IPv4 addresses, billed per address-hour (aws: auto-assigned ones too)."""
    if not count:
        return
    price, cited, note = pricer.price("ipv4", "public", "on-demand", region)
    billed, cost = time_cost(price, seconds, count, minimum=0)
    add("public IPv4", f"{count} public IPv4 address{'es' if count > 1 else ''}", price, count, "address-hour",
        billed, cost, cited, note)


def _summarize(lines: list[JsonObject]) -> dict[str, str]:
    by = {c: Decimal(0) for c in CATEGORIES}
    for line in lines:
        if line["category"] in by:
            by[line["category"]] += Decimal(line["cost"])
    return {c: str(v) for c, v in by.items()}


def run_cost(record: RunRecord, *, backend: Plugin | None, now: float | None = None,
             catalog: Catalog | None = None) -> JsonObject:
    """The cost of a run (finished, failed, interrupted or still going) from its ledger record
    (`Ledger.get_run`): its resources' lifetimes, the price snapshot stored at launch, and the
    billing rules. `backend`: the plugin of the run's cloud, given by the caller; None when no
    registered backend is called that (a ledger row may name anything: its resources are priced
    from the catalog alone, or said unpriced). JSON-able; store it with `Ledger.set_cost(run_id, cost)`."""
    now = time.time() if now is None else now
    if not isinstance(record, RunRecord):
        raise ValueError("run_cost needs the run's resources: pass Ledger.get_run(run_id), not a list_runs row")
    run = record.run
    cloud = run.cloud
    if cloud is None:  # every ledger row has one; an estimate's imagined run too
        raise ValueError("run_cost needs the run's cloud")
    same_cloud(cloud, backend)
    result: JsonObject = {"run_id": run.id, "cloud": cloud, "currency": "USD",
                          "computed_at": iso(now), "lines": [], "notes": [], "still_billing": []}
    if is_free(backend):
        return _free_run_cost(result, run, cloud, backend, now)
    snapshot = run.prices
    if not snapshot:
        result["notes"].append("no price snapshot stored with the run: priced with today's catalog")
    free_tier = bool((snapshot or {}).get("rules", {}).get("gke_free_tier", False))
    pricer = _pricer(run, snapshot, cloud, catalog, backend)
    _price_resources(result, record, pricer, free_tier, now)
    _close_rented(result, record, snapshot)
    return result


def _free_run_cost(result: JsonObject, run: RunRow, cloud: str, backend: Plugin | None, now: float) -> JsonObject:
    """A run on machines gpucluster does not rent: $0, or the user's own internal price."""
    result.update(total="0", by_category=_summarize([]), local=True, price_date=None)
    # a run without a job (`up` of machines that exist) holds no GPU: its own price is none
    job = tuple(run.command or ()) != UP_COMMAND
    priced = (internal_cost(backend, run.spec or {}, max(0.0, (run.ended_at or now) - (run.created_at or now)))
              if job else None)
    if priced is not None:  # the user's own price for machines gpucluster does not rent
        result.update(total=str(priced[0]), internal=True)
        result["notes"].append(f"{cloud} run: no rented cloud resources; {priced[1]}")
        return result
    result["notes"].append(f"{cloud} run: no rented cloud resources, $0")
    return result


def _pricer(run: RunRow, snapshot: JsonObject | None, cloud: str, catalog: Catalog | None,
            backend: Plugin | None) -> Pricer:
    """The run's prices: its snapshot, else today's catalog in the region its spec names."""
    pricer = Pricer(snapshot, cloud, catalog, backend)
    if not snapshot and run.spec:
        try:
            pricer.region = region_for(ClusterSpec.from_dict(run.spec), backend)
        except Exception:  # noqa: BLE001 - an odd stored spec only loses the default region
            pass
    return pricer


def _price_resources(result: JsonObject, record: RunRecord, pricer: Pricer, free_tier: bool, now: float) -> None:
    """Each ledger resource's cost lines; one that cannot be priced gets an unpriced line and a note."""
    for res in record.resources:
        try:
            result["lines"].extend(_resource_lines(res, pricer, free_tier, now))
        except UsageError as exc:
            result["lines"].append({"resource": res.name, "kind": res.kind, "category": "unpriced",
                                    "description": str(res.detail), "cost": "0", "billed_seconds": 0,
                                    "still_billing": not res.confirmed_gone, "note": f"not priced: {exc}"})
            result["notes"].append(f"{res.kind} {res.name} could not be priced ({exc}): "
                                   "the total leaves it out")


def _close_rented(result: JsonObject, record: RunRecord, snapshot: JsonObject | None) -> None:
    """The total, what still bills, the notes on it, the categories and the price date."""
    total = sum((Decimal(line["cost"]) for line in result["lines"]), Decimal(0))
    result["still_billing"] = sorted({line["resource"] for line in result["lines"]
                                      if line.get("still_billing") and line["category"] != "no charge"})
    if result["still_billing"]:
        result["notes"].append("still billing (never confirmed deleted, costed up to now): "
                               + ", ".join(result["still_billing"]))
    if not record.resources:
        result["notes"].append("the ledger records no resources for this run: nothing was billed")
    dates = [line["date"] for line in result["lines"] if line.get("date")]
    result.update(total=str(total), by_category=_summarize(result["lines"]), local=False,
                  price_date=min(dates) if dates else (snapshot or {}).get("taken_at"))


def record_run_cost(ledger: Ledger, run_id: str, *, backend: Plugin | None, now: float | None = None) -> JsonObject:
    """Compute a run's cost from the ledger and store it there (`runs.cost`); returns it.
    `backend`: the plugin of the run's cloud (as for `run_cost`)."""
    run = ledger.get_run(run_id)
    if run is None or run.id is None:  # a stored run always has its id
        raise UsageError(f"no run {run_id!r} in the ledger")
    cost = run_cost(run, backend=backend, now=now)
    ledger.set_cost(run.id, cost)
    return cost
