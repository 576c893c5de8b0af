"""A spec -> its priced plan (which catalog rows a run of it is billed by) and the launch-time
price snapshot; `Pricer` finds a price in a run's snapshot, else in today's catalog.

The cloud's own rules are its plugin's `Pricing` (`infra.contract`): `price_rows` returns the
machine, GPU and fee rows, `instance_price` prices an instance type, `default_region` and
`default_disk_type` fill what the spec leaves out."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Mapping

from gpucluster.catalog.prices import Catalog, PriceRow, load_catalog
from gpucluster.errors import UsageError, not_allowed
from gpucluster.infra.contract import Pricing
from gpucluster.infra.registry import NAMES, plugin, priced, traits
from gpucluster.spec import ClusterSpec, parse_int

from .rules import MINIMUM_SECONDS, MONTH_HOURS, iso, region_of


@dataclass
class Plan:
    """What a spec is billed by: filled in by the core (region, market, disk) and by the
    backend's `Pricing.price_rows` (machine, GPUs, fee, zonal / free tier, notes)."""

    cloud: str
    region: str
    market: str
    nodes: int
    machine: PriceRow | None = None  # instance row (derived for shapes priced from unit prices)
    gpu: PriceRow | None = None  # per-GPU row, where GPUs are billed apart from the instance
    gpus_per_node: int = 0
    gpu_name: str | None = None
    disk: PriceRow | None = None
    disk_gb: int = 0
    fee: PriceRow | None = None
    zonal: bool = False
    free_tier: bool = False
    system_unpriced: bool = False
    idle_nodes: int = 0  # GPU nodes that keep billing after the job ends (GKE: a fixed pool, or its minimum)
    notes: list[str] = field(default_factory=list)


def known(cloud: object) -> Pricing | None:
    """The pricing of the registered backend called `cloud`, or None (a ledger row may name
    anything; local and ssh are not priced)."""
    return plugin(cloud).pricing if isinstance(cloud, str) and cloud in NAMES else None


def is_free(cloud: object) -> bool:
    """Runs on machines gpucluster does not rent (local, ssh): they cost $0."""
    return isinstance(cloud, str) and cloud in NAMES and plugin(cloud).pricing is None


def _clouds_listed() -> tuple[str, ...]:
    """Every cloud, the priced ones first (the order the cost messages have always named them)."""
    return priced() + tuple(n for n in NAMES if n not in priced())


def region_for(spec: ClusterSpec) -> str:
    chosen = known(spec.cloud)
    return spec.region or region_of(spec.zone) or (chosen.default_region if chosen else None)


def disk_row(catalog: Catalog, cloud: str, region: str, disk_type: str, notes: list[str]) -> PriceRow:
    allowed = catalog.items(cloud, "disk")
    if disk_type not in allowed:
        raise UsageError(not_allowed(f"{cloud} disk type", disk_type, allowed))
    row = catalog.find(cloud, region, "disk", disk_type)
    if row is None:
        row = catalog.get(cloud, plugin(cloud).needs_pricing().default_region, "disk", disk_type)
        notes.append(f"no {disk_type} price for {region} in the catalog: used {row.region}'s "
                     f"({row.price}/GB-month); refresh prices for the exact figure")
    return row


def resolved(spec: ClusterSpec) -> ClusterSpec:
    """The spec with the backend's own defaults filled in (`SpecRules.resolve`): what would really
    be created is what is priced."""
    try:
        return plugin(spec.cloud).spec.resolve(spec)
    except Exception:  # noqa: BLE001 - validation reports a bad spec; the estimate prices what it can
        return spec


def system_pool(spec: ClusterSpec) -> dict[str, Any] | None:
    """The backend's always-on extras (GKE: the CPU system pool), from `Pricing.system_pool`."""
    pricing = known(spec.cloud)
    return pricing.system_pool(spec) if pricing else None


def plan(spec: ClusterSpec, catalog: Catalog, free_tier: bool | None = None) -> Plan:
    chosen = known(spec.cloud)
    if chosen is None:
        raise UsageError(not_allowed("cloud", spec.cloud, _clouds_listed()))
    spec = resolved(spec)
    nodes = parse_int("nodes", spec.nodes, low=1, high=traits(spec.cloud).max_nodes)
    region = region_for(spec)
    regions = catalog.regions(spec.cloud)
    if region not in regions:
        from gpucluster.spec import resolve as resolve_spec, validate

        # a region the backend does not know is refused by its own rules (with their did-you-mean)
        backend = plugin(spec.cloud)
        validate(resolve_spec(ClusterSpec(cloud=spec.cloud, nodes=1, region=region), backend), backend)
        note = chosen.region_note(region)
        raise UsageError(f"{spec.cloud} region {region!r} has no prices in the catalog; "
                         f"allowed: {', '.join(regions)}, "
                         f"or {region} once priced: `gpucluster prices refresh --cloud {spec.cloud} --region {region}` "
                         f"(needs {spec.cloud} credentials)" + (f"; {note}" if note else ""))
    market = "spot" if spec.spot else "on-demand"
    result = Plan(cloud=spec.cloud, region=region, market=market, nodes=nodes)
    result.disk_gb = parse_int("disk size (GB)", spec.disk_gb, low=1, high=65536)
    result.disk = disk_row(catalog, spec.cloud, region, spec.disk_type or chosen.default_disk_type, result.notes)
    rows = chosen.price_rows(spec, catalog, region, market, free_tier)
    result.machine, result.gpu, result.fee = rows.machine, rows.gpu, rows.fee
    result.gpus_per_node, result.gpu_name = rows.gpus_per_node, rows.gpu_name
    result.zonal, result.free_tier, result.system_unpriced = rows.zonal, rows.free_tier, rows.system_unpriced
    result.idle_nodes = min(rows.idle_nodes, nodes)
    result.notes += rows.notes
    return result


# -- price snapshot ---------------------------------------------------------------------------
def snap_key(kind: str, item: str, market: str) -> str:
    return f"{kind}/{item}/{market}"


def price_snapshot(spec: ClusterSpec, catalog: Catalog | None = None, *, free_tier: bool | None = None,
                   now: float | None = None) -> dict[str, Any]:
    """The prices a run will be billed at, taken at launch; JSON-able; stored in the ledger with
    the run (`Ledger.create_run(..., prices=price_snapshot(spec))`). Local/ssh: an empty snapshot
    that says such runs cost $0. Raises UsageError for a spec the catalog cannot price."""
    taken = iso(now)
    if is_free(spec.cloud):
        return {"cloud": spec.cloud, "currency": "USD", "taken_at": taken, "prices": {},
                "note": f"{spec.cloud} runs use machines gpucluster does not rent: $0"}
    catalog = catalog or load_catalog()
    chosen = plugin(spec.cloud).needs_pricing()
    planned = plan(spec, catalog, free_tier)
    prices: dict[str, Any] = {}
    system = system_pool(resolved(spec))
    rows = [planned.machine, planned.gpu, planned.disk, planned.fee]
    if system and not planned.system_unpriced:
        rows.append(chosen.instance_price(catalog, planned.region, system["machine_type"], "on-demand"))
        rows.append(disk_row(catalog, spec.cloud, planned.region, system["disk_type"], []))
    rows.append(catalog.find(spec.cloud, planned.region, "ipv4", "public"))  # aws: every public address
    for market in dict.fromkeys((planned.market, "on-demand")):  # gcp: the nodes' external addresses, by market
        rows.append(catalog.find(spec.cloud, planned.region, "ipv4", "external-ipv4", market))
    for row in rows:
        if row is not None:
            # "region": where the run is; "priced_in": the catalog row's region (differs for a
            # fallback disk price or a region-independent fee); "zones": per-zone spot prices, if known
            prices[snap_key(row.kind, row.item, row.market)] = {
                **row.cite(), "gpus": row.gpus, "region": planned.region, "priced_in": row.region,
                **({"zones": dict(row.extra["zones"])} if row.extra.get("zones") else {})}
    return {
        "cloud": spec.cloud, "region": planned.region, "currency": "USD", "taken_at": taken,
        "prices": prices,
        "rules": {"minimum_seconds": MINIMUM_SECONDS, "disk_month_hours": MONTH_HOURS,
                  "gke_free_tier": planned.free_tier},
        "notes": planned.notes,
    }


class Pricer:
    """Finds a price in a run's snapshot, else in the current catalog (and says so)."""

    def __init__(self, snapshot: Mapping[str, Any] | None, cloud: str, catalog: Catalog | None):
        self.snapshot = snapshot or {}
        self.cloud = cloud
        self._catalog = catalog
        self._backend = known(cloud)
        self.region = self.snapshot.get("region") or (self._backend.default_region if self._backend else None)
        self.gpus_billed_apart = bool(self._backend and self._backend.gpus_billed_apart)
        self.default_disk_type = self._backend.default_disk_type if self._backend else None

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = load_catalog()
        return self._catalog

    def price(self, kind: str, item: str, market: str, region: str | None) -> tuple[Decimal, dict[str, Any], str]:
        region = region or self.region
        cited = self.snapshot.get("prices", {}).get(snap_key(kind, item, market))
        if cited and cited.get("region") in (region, "*", None):
            return Decimal(cited["price"]), cited, ""
        if kind == "instance" and self._backend is not None:
            row = self._backend.instance_price(self.catalog, region, item, market)
        elif kind == "disk":
            notes: list[str] = []
            row = disk_row(self.catalog, self.cloud, region, item, notes)
        else:
            row = self.catalog.get(self.cloud, region, kind, item, market)
        return row.price, row.cite(), f"{item} {market} price not in the run's snapshot: today's catalog used"

    def in_zone(self, price: Decimal, cited: dict[str, Any], item: str, market: str, region: str | None,
                zone: str | None) -> tuple[Decimal, dict[str, Any], str]:
        """A zonal price (spot: each zone has its own) for the zone a resource ran in, from the run's
        snapshot or the catalog (rows read from the cloud's price history keep one price per zone),
        else the region's row as given (the highest of its zones), saying which was used."""
        region = region or self.region
        zones = cited.get("zones")
        if zones is None and self._backend is not None:
            row = self.catalog.find(self.cloud, region or "", "instance", item, market)
            zones = row.extra.get("zones") if row is not None else None
        if zone and zones and zone in zones:
            return Decimal(str(zones[zone])), {**cited, "price": str(zones[zone])}, f"{market} price of {zone}"
        where = f"the price of {zone} is not known" if zone else "the zone is not known"
        return price, cited, (f"{market} price for the region ({where}; the region's row is the highest of its "
                              f"zones: `gpucluster prices refresh --cloud {self.cloud} --region {region}` reads "
                              "each zone's)")
