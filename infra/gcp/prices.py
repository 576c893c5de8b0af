"""What GCP charges: the price fetcher behind `Pricing.fetch_prices` (Cloud Billing Catalog SKUs
of Compute Engine) and the GCE/GKE pricing rules the cost engine calls (`n1_row`, `price_rows`,
`planned_resources`).

GCE bills an N1 VM's vCPUs and memory (named types: the catalog's rows; other N1 shapes: derived
from the unit prices) and its GPUs apart; GKE adds the cluster fee and an always-on CPU system
pool; every node's external IPv4 is billed per hour (GKE nodes of a public cluster have one). The
fetcher imports google-cloud-billing lazily; `parse_gcp_skus` takes the API's own
message types, so it is tested offline. N1 shapes and V100 limits are the catalog's
(`infra/gcp/catalog.py`), their one home.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import TYPE_CHECKING, Iterable, Protocol

from gpucluster.catalog.prices import UNITS, Catalog, PriceRow, normalize_gpu
from gpucluster.errors import UsageError, not_allowed, require
from gpucluster.infra.contract import PricedRows
from gpucluster.spec import ClusterSpec
from gpucluster.spec import parse_bool
from gpucluster.states import JsonObject

from .catalog import (ACCELERATOR, DEFAULT_DISK_TYPE, EXTERNAL_IPV4_PER_NODE, N1_LIMITS, V100_LIMITS, min_nodes, n1_machine_types,
                      idle_minutes, n1_shape, option_bool, system_pool)
from .shapes import Shape

if TYPE_CHECKING:
    from google.cloud.billing_v1.types import Sku

GCP_COMPUTE_SERVICE = "services/6F81-5844-456A"


class SkuLister(Protocol):
    """google-cloud-billing's `CloudCatalogClient`, as far as the fetcher uses it (a test passes its own)."""

    def list_skus(self, *, parent: str) -> Iterable[Sku]: ...

# the machine type priced when a spec names none and resolve could not choose one
DEFAULT_PRICED_MACHINE_TYPE = "n1-standard-16"
_REGION_RE = re.compile(r"[a-z]+-[a-z]+\d+")


# -- live prices ------------------------------------------------------------------------------
_GCP_SKU_PATTERNS = [
    # (regex on the description, kind, item, market)
    (re.compile(r"^Nvidia Tesla V100 GPU running in "), "gpu", "V100", "on-demand"),
    (re.compile(r"^Spot Preemptible Nvidia Tesla V100 GPU running in "), "gpu", "V100", "spot"),
    (re.compile(r"^N1 Predefined Instance Core running in "), "vcpu", "n1", "on-demand"),
    (re.compile(r"^Spot Preemptible N1 Predefined Instance Core running in "), "vcpu", "n1", "spot"),
    (re.compile(r"^N1 Predefined Instance Ram running in "), "memory", "n1", "on-demand"),
    (re.compile(r"^Spot Preemptible N1 Predefined Instance Ram running in "), "memory", "n1", "spot"),
    # issue 42: the other GKE GPUs and the hosts of G2/A2/A3 (descriptions as the Cloud Billing Catalog
    # lists them, e.g. "Nvidia L4 GPU running in Americas", "Nvidia H100 80GB GPU running in Americas",
    # "A2 Instance Core running in Americas"; the H200 one is taken in the same form, not seen here)
    *[(re.compile(rf"^{spot}Nvidia {name} GPU running in ", re.I), "gpu", gpu, market)
      for gpu, name in (("T4", "Tesla T4"), ("L4", "L4"), ("A100", "Tesla A100"), ("A100-80GB", "(Tesla )?A100 80GB"),
                        ("H100", "H100( 80GB)?"), ("H200", "H200( 141GB)?"))
      for spot, market in (("", "on-demand"), ("Spot Preemptible ", "spot"))],
    *[(re.compile(rf"^{spot}{fam.upper()} Instance {part} running in ", re.I), kind, fam, market)
      for fam in ("a2", "a3", "g2") for part, kind in (("Core", "vcpu"), ("Ram", "memory"))
      for spot, market in (("", "on-demand"), ("Spot Preemptible ", "spot"))],
    (re.compile(r"^Storage PD Capacity( in |$)"), "disk", "pd-standard", "on-demand"),
    (re.compile(r"^Balanced PD Capacity( in |$)"), "disk", "pd-balanced", "on-demand"),
    (re.compile(r"^SSD backed PD Capacity( in |$)"), "disk", "pd-ssd", "on-demand"),
    # A3 Ultra boots from Hyperdisk Balanced only (shapes.py); the SKU's description taken in the PD form, not seen here
    (re.compile(r"^Hyperdisk Balanced Capacity( in |$)"), "disk", "hyperdisk-balanced", "on-demand"),
]
_GCP_UNITS = {"gpu": "h", "vcpu": "h", "memory": "GiBy.h", "disk": "GiBy.mo"}


def parse_gcp_skus(skus: Iterable[Sku], regions: Iterable[str], date: str) -> list[PriceRow]:
    """Rows from Cloud Billing Catalog SKUs (`google.cloud.billing_v1.types.Sku` messages, as
    `CloudCatalogClient.list_skus` yields them) for the given regions. Price = units + nanos/1e9
    of the highest tier (the rate after any free allowance). Named N1 types are then derived from
    the vCPU and memory unit prices."""
    wanted = set(regions)
    rows: dict[tuple, PriceRow] = {}
    for sku in skus:
        for row in _sku_rows(sku, wanted, date):
            rows[row.key] = row
    _derive_n1(rows, date)
    _derive_hosts(rows, date)
    return list(rows.values())


def _sku_rows(sku: Sku, wanted: set[str], date: str) -> list[PriceRow]:
    """One SKU's rows, one per wanted region it is sold in; none for a SKU we do not price."""
    desc = sku.description
    match = next(((kind, item, market) for rx, kind, item, market in _GCP_SKU_PATTERNS if rx.search(desc)), None)
    if match is None or not sku.pricing_info:
        return []
    kind, item, market = match
    expr = sku.pricing_info[0].pricing_expression
    if expr.usage_unit != _GCP_UNITS[kind] or not expr.tiered_rates:
        return []
    rate = expr.tiered_rates[-1].unit_price
    if rate.currency_code and rate.currency_code != "USD":
        return []
    price = Decimal(rate.units) + Decimal(rate.nanos) / Decimal(10**9)
    sku_id = sku.sku_id or sku.name
    return [PriceRow(
        cloud="gcp", region=region, kind=kind, item=item, market=market, unit=UNITS[kind],
        price=price, date=date, gpus=1 if kind == "gpu" else 0, gpu=item if kind == "gpu" else None,
        source=f"Cloud Billing Catalog API, {GCP_COMPUTE_SERVICE} sku {sku_id}: {desc}", origin="user")
        for region in sku.service_regions if region in wanted]


def _derive_n1(rows: dict[tuple, PriceRow], date: str) -> None:
    """The named N1 types' rows from the N1 vCPU and memory unit prices."""
    for (cloud, region, kind, item, market), vcpu in list(rows.items()):
        if kind != "vcpu":
            continue
        mem = rows.get((cloud, region, "memory", item, market))
        if mem is None:
            continue
        for fam, counts in (("standard", (4, 8, 16, 32)),):
            for n in counts:
                mt = f"n1-{fam}-{n}"
                shape = n1_shape(mt)
                if shape is None:  # every n1-standard-N above is a predefined N1 type
                    continue
                cpus, gib = shape
                row = PriceRow(
                    cloud="gcp", region=region, kind="instance", item=mt, market=market, unit="hour",
                    price=vcpu.price * cpus + mem.price * gib, date=date, vcpus=cpus, memory_gib=gib,
                    source=f"derived: {cpus} x vCPU + {gib} GiB x RAM from the Cloud Billing Catalog N1 SKUs",
                    origin="user")
                rows[row.key] = row


def _derive_hosts(rows: dict[tuple, PriceRow], date: str) -> None:
    """The G2/A2/A3 machine types' host rows from their family's vCPU and memory unit prices (GCE bills
    the GPUs of these machines apart, in the gpu rows): vCPUs x core price + GB x RAM price."""
    from . import shapes

    for shape in shapes.SHAPES:
        if shape.attached:
            continue
        for (cloud, region, kind, item, market), vcpu in list(rows.items()):
            if kind != "vcpu" or item != shape.family:
                continue
            mem = rows.get((cloud, region, "memory", item, market))
            if mem is None:
                continue
            gib = Decimal(str(shape.memory_gb))
            row = PriceRow(
                cloud="gcp", region=region, kind="instance", item=shape.name, market=market, unit="hour",
                price=vcpu.price * shape.vcpus + mem.price * gib, date=date, vcpus=shape.vcpus, memory_gib=gib,
                source=(f"derived: {shape.vcpus} x vCPU + {gib} GB x RAM from the Cloud Billing Catalog "
                        f"{shape.family.upper()} SKUs (the host; its GPUs are in the gpu rows)"), origin="user")
            rows[row.key] = row


def fetch_gcp(regions: list[str], *, date: str, client: SkuLister | None = None) -> list[PriceRow]:
    if client is None:
        billing = require("google.cloud.billing_v1", "gcp")
        client = billing.CloudCatalogClient()
    return parse_gcp_skus(client.list_skus(parent=GCP_COMPUTE_SERVICE), regions, date)


def fetch_prices(catalog: Catalog, *, regions: list[str], date: str, client: SkuLister | None = None) -> list[PriceRow]:
    """`Pricing.fetch_prices`: current rows for the regions from the Cloud Billing Catalog."""
    bad = [r for r in regions if not _REGION_RE.fullmatch(r)]
    if bad:
        raise UsageError(not_allowed("gcp region", bad[0], catalog.regions("gcp")))
    return fetch_gcp(regions, date=date, client=client)


# -- pricing rules (the cost engine's hooks) ---------------------------------------------------
def n1_row(catalog: Catalog, region: str, machine_type: str, market: str) -> PriceRow:
    """The hourly row of an N1 type: the catalog's own, else vCPUs x vCPU price + GiB x memory price."""
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


def price_rows(spec: ClusterSpec, catalog: Catalog, region: str, market: str,
               free_tier: bool | None = None) -> PricedRows:
    """The host row (N1, or the G2/A2/A3 machine without its GPUs), the GPU row (a count and shape GCE
    allows), the GKE fee, the system pool, and what the max lifetime leaves billing."""
    from . import shapes

    itype = spec.instance_type or DEFAULT_PRICED_MACHINE_TYPE
    carried = shapes.BY_NAME.get(itype)
    rows = PricedRows(machine=catalog.get("gcp", region, "instance", itype, market) if carried
                      else n1_row(catalog, region, itype, market), disk_type=spec.disk_type or DEFAULT_DISK_TYPE)
    gpus = 0 if spec.gpus_per_node is None else int(spec.gpus_per_node)
    if gpus:
        _gpu_rows(rows, spec, catalog, region, market, itype, carried, gpus)
    else:
        rows.notes.append("no GPUs requested (pass --gpu TYPE:COUNT, e.g. --gpu L4:1, to add GPUs)")
    rows.system_pool = system_pool(spec)
    system = str(rows.system_pool["machine_type"])
    if catalog.find("gcp", region, "instance", system, "on-demand") is None and n1_shape(system) is None:
        rows.notes.append(f"the GKE system node pool ({system}) has no price in the catalog: not included")
        rows.system_unpriced = True
    rows.fee = catalog.get("gcp", region, "cluster-fee", "gke")
    rows.zonal = spec.zone is not None
    opt = spec.option("gke_free_tier", False) if free_tier is None else free_tier
    rows.free_tier = parse_bool("option gke_free_tier", opt)
    # what the GPU pool keeps after the job: all its nodes without autoscaling, else its minimum
    rows.idle_nodes = min_nodes(spec) if option_bool(spec, "autoscale", True) else int(spec.nodes)
    idle = idle_minutes(spec)
    if idle:  # infra/gcp/idle.py
        floor = f"{rows.idle_nodes} node(s)" if rows.idle_nodes else "zero"
        rows.notes.append(f"idle stop: {idle} min after the last gpucluster job the GPU nodes are released and the "
                          f"pool scales to {floor} about 10 min later (the cluster autoscaler's delay); the cluster "
                          "fee and the system pool keep billing until `gpucluster down`")
    rows.after_lifetime = _after_lifetime(min(rows.idle_nodes, int(spec.nodes)), int(spec.nodes))
    return rows


def _after_lifetime(idle: int, nodes: int) -> str:
    """After the max lifetime the Job stops; what keeps billing then (the core adds the figure and "until down")."""
    kept = ("the cluster fee and the system pool" if not idle else
            f"all {nodes} GPU node(s) (the option autoscale is false), the cluster fee and the system pool"
            if idle >= nodes else
            f"the pool's minimum of {idle} GPU node(s) (option minNodes), the cluster fee and the system pool")
    how = ("the GPU pool scales to zero" if not idle else "the GPU pool keeps its nodes"
           if idle >= nodes else f"the GPU pool scales down to {idle} node(s)")
    return f"after the max lifetime the Job stops and {how}; {kept} keep billing"


def _gpu_rows(rows: PricedRows, spec: ClusterSpec, catalog: Catalog, region: str, market: str, itype: str,
              carried: Shape | None, gpus: int) -> None:
    """The GPU row: `gpus` of the machine's own GPU (G2/A2/A3: exactly its count) or of the one asked
    for on an N1 VM (a count GCE allows, on a VM within that count's vCPU and memory limits)."""
    if carried is not None and gpus != carried.gpus:
        raise UsageError(f"gpus {gpus} is not allowed for {itype}: it carries exactly {carried.gpus} "
                         f"{carried.gpu_model}")
    default = carried.gpu_model if carried else "V100"
    rows.gpu_name = normalize_gpu(spec.accelerator or default, catalog.items("gcp", "gpu"))
    if carried is None:
        limits = N1_LIMITS.get(rows.gpu_name, V100_LIMITS)
        if gpus not in limits:
            raise UsageError(not_allowed(f"{rows.gpu_name} count per node", gpus, [str(n) for n in limits]))
        max_cpu, max_gb = limits[gpus]
        cpus, gib = n1_shape(itype) or (rows.machine.vcpus, rows.machine.memory_gib)
        # a catalog row may give the vCPUs without the memory: then only the vCPUs are checked
        if cpus is not None and (cpus > max_cpu or (gib is not None and gib > max_gb)):
            fits = [mt for mt in n1_machine_types()
                    if (shape := n1_shape(mt)) is not None and shape[0] <= max_cpu and shape[1] <= max_gb]
            memory = "" if gib is None else f", {gib.normalize():f} GB"
            raise UsageError(f"machine type {itype} ({cpus} vCPU{memory}) cannot take {gpus} {rows.gpu_name}: "
                             f"{gpus} {rows.gpu_name} allow at most {max_cpu} vCPU and {max_gb:g} GB per VM, e.g. "
                             + ", ".join(f for f in fits if f.startswith("n1-standard")))
    rows.gpu = catalog.get("gcp", region, "gpu", rows.gpu_name, market)
    rows.gpus_per_node = gpus


def planned_resources(spec: ClusterSpec, region: str, catalog: Catalog | None = None) -> list[JsonObject]:
    """The GKE cluster (its fee), the GPU pool and, when it can be priced, the system pool."""
    disk = {"disk_gb": spec.disk_size, "disk_type": spec.disk_type or DEFAULT_DISK_TYPE}
    pool = {"machine_type": spec.instance_type or DEFAULT_PRICED_MACHINE_TYPE, "node_count": int(spec.nodes),
            "gpus_per_node": int(spec.gpus_per_node or 0), "accelerator": spec.accelerator or ACCELERATOR,
            "spot": spec.spot, "external_ipv4": EXTERNAL_IPV4_PER_NODE, **disk}
    rows = [{"kind": "gke-cluster", "name": spec.name, "detail": {"zonal": spec.zone is not None}},
            {"kind": "node-pool", "name": f"{spec.name}-gpu", "detail": pool}]
    system = system_pool(spec)
    try:
        if catalog is None:
            from gpucluster.catalog.prices import load_catalog

            catalog = load_catalog()
        priced = n1_shape(system["machine_type"]) is not None or catalog.find(
            "gcp", region, "instance", system["machine_type"], "on-demand") is not None
    except Exception:  # noqa: BLE001 - an unreadable catalog leaves the system pool out, as the plan says
        priced = False
    if priced:
        rows.append({"kind": "node-pool", "name": f"{spec.name}-system", "detail": system})
    return rows
