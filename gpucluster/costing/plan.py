"""A spec -> its priced plan (which catalog rows a run of it is billed by) and the launch-time
price snapshot; `Pricer` finds a price in a run's snapshot, else in today's catalog.

The cloud's own rules are its plugin's `Pricing` (`infra.contract`): `price_rows` returns the
machine, GPU and fee rows, the nodes' disk type, an always-on system pool and what the max lifetime
leaves billing; `instance_price` prices an instance type. A spec that names no region is priced
where the backend's `resolve` would put its run (`default_region`). Whether GPUs are billed apart
from the machines is a fact of the catalog (`gpus_billed_apart`). The plugin (`backend`) is given by
the caller, which looked it up once (a command in cli/) or is the backend itself (its dry run);
nothing here asks the registry."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Mapping

from gpucluster.catalog.prices import Catalog, PriceRow, load_catalog
from gpucluster.errors import UsageError, not_allowed
from gpucluster.spec import ClusterSpec, parse_int

from .rules import MINIMUM_SECONDS, MONTH_HOURS, iso, region_of
from gpucluster.states import JsonMapping, JsonObject

if TYPE_CHECKING:
    from gpucluster.infra.contract import Plugin, Pricing


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
    system_pool: JsonObject | None = None  # an always-on CPU pool's node-pool detail (GKE: the system pool)
    after_lifetime: str = ""  # what the max lifetime leaves billing (`PricedRows.after_lifetime`)


def pricing_of(backend: Plugin | None) -> Pricing | None:
    """The backend's `Pricing` part, or None (a backend whose machines gpucluster does not rent,
    or `backend` None: a cloud that no registered backend is called, as a ledger row may name)."""
    return backend.pricing if backend is not None else None


def is_free(backend: Plugin | None) -> bool:
    """Runs on machines gpucluster does not rent (local, ssh): they cost $0. `backend`: the plugin
    of the run's cloud; None (a cloud not registered) is not free: it is unknown."""
    return backend is not None and backend.pricing is None


def same_cloud(cloud: object, backend: Plugin | None) -> None:
    """The caller's plugin must be the one of the spec's or run's cloud (a bug otherwise)."""
    if backend is not None and backend.name != cloud:
        raise ValueError(f"the {backend.name} backend was given to price a {cloud} spec or run")


def default_region(backend: Plugin) -> str:
    """Where a spec that names no region is priced, and where a price missing in a region is borrowed from:
    the region the backend's `resolve` gives such a spec, the one its run would use (aws us-east-1; gcp
    us-central1, the region of its default zone)."""
    from gpucluster.spec import resolve

    bare = resolve(ClusterSpec(cloud=backend.name, nodes=1), backend)
    return str(bare.region or region_of(bare.zone))


def region_for(spec: ClusterSpec, backend: Plugin | None) -> str | None:
    """The region `spec` is priced in: its own (or its zone's), else its priced backend's default."""
    priced = backend is not None and backend.pricing is not None
    return spec.region or region_of(spec.zone) or (default_region(backend) if priced and backend else None)


def disk_row(catalog: Catalog, cloud: str, region: str, disk_type: str, notes: list[str],
             fallback_region: str | None) -> PriceRow:
    """The disk's price row in `region`, else in `fallback_region` (the backend's default region),
    saying so in `notes`."""
    allowed = catalog.items(cloud, "disk")
    if disk_type not in allowed:
        raise UsageError(not_allowed(f"{cloud} disk type", disk_type, allowed))
    row = catalog.find(cloud, region, "disk", disk_type)
    if row is None:
        row = catalog.get(cloud, fallback_region or region, "disk", disk_type)
        notes.append(f"no {disk_type} price for {region} in the catalog: used {row.region}'s "
                     f"({row.price}/GB-month); refresh prices for the exact figure")
    return row


def resolved(spec: ClusterSpec, backend: Plugin) -> ClusterSpec:
    """The spec with the backend's own defaults filled in (`SpecRules.resolve`): what would really
    be created is what is priced."""
    try:
        return backend.spec.resolve(spec)
    except Exception:  # noqa: BLE001 - validation reports a bad spec; the estimate prices what it can
        return spec


def gpus_billed_apart(catalog: Catalog, cloud: str) -> bool:
    """Whether `cloud` bills GPUs apart from the machines they are attached to (GCE: per GPU-hour) rather
    than in an instance's price (EC2): its catalog prices GPUs by themselves (rows of kind `gpu`)."""
    return any(row.cloud == cloud and row.kind == "gpu" for row in catalog.rows.values())


def kept_billing(planned: Plan) -> str:
    """What bills on once the GPU nodes are gone (the idle stop released them, or the max lifetime passed)
    until `down`, from the plan's rows: "the cluster fee and the system pool" (GKE); "" for nothing."""
    kept = [what for what, there in (("the cluster fee", planned.fee is not None),
                                     ("the system pool", planned.system_pool is not None)) if there]
    return " and ".join(kept)


def region_needs(cloud: str, region: str, backend: Plugin) -> list[str]:
    """What else `region` needs before a run there (aws: an opt-in region is enabled first), as the backend's
    own rules say it (`SpecRules.validate`): the warnings a one-node spec gets there and not in the backend's
    default region. A region the backend does not know is refused here by those rules (with their
    did-you-mean)."""
    from gpucluster.spec import resolve as resolve_spec, validate

    def warnings(where: str) -> list[str]:
        return validate(resolve_spec(ClusterSpec(cloud=cloud, nodes=1, region=where), backend), backend)

    here = warnings(region)
    try:
        usual = set(warnings(default_region(backend))) if here else set()
    except UsageError:  # the default region refused too: every warning of this one is said
        usual = set()
    return [w for w in here if w not in usual]


def plan(spec: ClusterSpec, catalog: Catalog, free_tier: bool | None = None, *, backend: Plugin) -> Plan:
    """The priced plan of `spec` on `backend` (the plugin of `spec.cloud`, which must be priced)."""
    same_cloud(spec.cloud, backend)
    chosen = backend.needs_pricing()
    spec = resolved(spec, backend)
    nodes = parse_int("nodes", spec.nodes, low=1, high=backend.traits.max_nodes)
    home = default_region(backend)
    region = region_for(spec, backend) or home
    regions = catalog.regions(spec.cloud)
    if region not in regions:
        needs = region_needs(spec.cloud, region, backend)
        raise UsageError(f"{spec.cloud} region {region!r} has no prices in the catalog; "
                         f"allowed: {', '.join(regions)}, "
                         f"or {region} once priced: `gpucluster prices refresh --cloud {spec.cloud} --region {region}` "
                         f"(needs {spec.cloud} credentials)" + "".join(f"; {n}" for n in needs))
    market = "spot" if spec.spot else "on-demand"
    result = Plan(cloud=spec.cloud, region=region, market=market, nodes=nodes)
    result.disk_gb = parse_int("disk size (GB)", spec.disk_size, low=1, high=65536)
    if spec.disk_type:  # a type named is checked first, as its error comes before the machine's
        result.disk = disk_row(catalog, spec.cloud, region, spec.disk_type, result.notes, home)
    rows = chosen.price_rows(spec, catalog, region, market, free_tier)
    if not spec.disk_type:  # none named: the backend's default (`PricedRows.disk_type`)
        result.disk = disk_row(catalog, spec.cloud, region, rows.disk_type, result.notes, home)
    result.machine, result.gpu, result.fee = rows.machine, rows.gpu, rows.fee
    result.gpus_per_node, result.gpu_name = rows.gpus_per_node, rows.gpu_name
    result.zonal, result.free_tier, result.system_unpriced = rows.zonal, rows.free_tier, rows.system_unpriced
    result.idle_nodes = min(rows.idle_nodes, nodes)
    result.notes += rows.notes
    result.system_pool, result.after_lifetime = rows.system_pool, rows.after_lifetime
    return result


# -- price snapshot ---------------------------------------------------------------------------
def snap_key(kind: str, item: str, market: str) -> str:
    return f"{kind}/{item}/{market}"


def price_snapshot(spec: ClusterSpec, catalog: Catalog | None = None, *, backend: Plugin,
                   free_tier: bool | None = None, now: float | None = None) -> JsonObject:
    """The prices a run will be billed at, taken at launch; JSON-able; stored in the ledger with
    the run (`Ledger.create_run(..., prices=price_snapshot(spec, backend=plugin))`). `backend`: the
    plugin of `spec.cloud`. Local/ssh: an empty snapshot that says such runs cost $0. Raises
    UsageError for a spec the catalog cannot price."""
    same_cloud(spec.cloud, backend)
    taken = iso(now)
    if is_free(backend):
        return {"cloud": spec.cloud, "currency": "USD", "taken_at": taken, "prices": {},
                "note": f"{spec.cloud} runs use machines gpucluster does not rent: $0"}
    catalog = catalog or load_catalog()
    chosen = backend.needs_pricing()
    planned = plan(spec, catalog, free_tier, backend=backend)
    prices: JsonObject = {}
    system = planned.system_pool
    rows = [planned.machine, planned.gpu, planned.disk, planned.fee]
    if system and not planned.system_unpriced:
        rows.append(chosen.instance_price(catalog, planned.region, str(system["machine_type"]), "on-demand"))
        rows.append(disk_row(catalog, spec.cloud, planned.region, str(system["disk_type"]), [], default_region(backend)))
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
    """Finds a price in a run's snapshot, else in the current catalog (and says so). `backend`: the
    run's backend, priced (None: a cloud not registered, or one whose runs are not priced; its prices
    are the catalog's rows alone)."""

    def __init__(self, snapshot: JsonMapping | None, cloud: str, catalog: Catalog | None,
                 backend: Plugin | None):
        self.snapshot = snapshot or {}
        self.cloud = cloud
        self._catalog = catalog
        self._backend = pricing_of(backend)
        self._home = default_region(backend) if backend is not None and self._backend is not None else None
        self._default_disk: str | None = None
        self.region = self.snapshot.get("region") or self._home

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = load_catalog()
        return self._catalog

    @property
    def default_disk_type(self) -> str | None:
        """For a disk row that names no type: the backend's default, the type its `price_rows` gives a spec that
        names none (in its default region); None for a cloud not registered."""
        if self._backend is None:
            return None
        if self._default_disk is None:
            bare = ClusterSpec(cloud=self.cloud, nodes=1)
            self._default_disk = self._backend.price_rows(bare, self.catalog, str(self._home),
                                                          "on-demand", None).disk_type
        return self._default_disk or None

    @property
    def gpus_billed_apart(self) -> bool:
        """The run's GPUs are billed apart from its instances (`gpus_billed_apart` of the catalog); a cloud
        not registered: no (its instances are priced by the catalog's rows alone)."""
        return self._backend is not None and gpus_billed_apart(self.catalog, self.cloud)

    def price(self, kind: str, item: str, market: str, region: str | None) -> tuple[Decimal, JsonObject, str]:
        region = region or self.region or ""  # none known: no row matches, and get() says so
        cited = self.snapshot.get("prices", {}).get(snap_key(kind, item, market))
        if cited and cited.get("region") in (region, "*", None):
            return Decimal(cited["price"]), cited, ""
        if kind == "instance" and self._backend is not None:
            row = self._backend.instance_price(self.catalog, region, item, market)
        elif kind == "disk":
            notes: list[str] = []
            row = disk_row(self.catalog, self.cloud, region, item, notes,
                           self._home)
        else:
            row = self.catalog.get(self.cloud, region, kind, item, market)
        return row.price, row.cite(), f"{item} {market} price not in the run's snapshot: today's catalog used"

    def in_zone(self, price: Decimal, cited: JsonObject, item: str, market: str, region: str | None,
                zone: str | None) -> tuple[Decimal, JsonObject, str]:
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
