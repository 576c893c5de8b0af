"""What AWS charges: the price fetcher behind `Pricing.fetch_prices` (Price List API for on-demand
instances and EBS gp3, DescribeSpotPriceHistory for spot) and the EC2 pricing rules the cost
engine calls (`price_rows`, `planned_resources`).

EC2 prices an instance with its GPUs included; each node's root gp3 volume is billed per GB-month.
The fetchers import boto3 lazily and are split from pure parsers (`parse_aws_price_list`,
`parse_aws_spot_history`) that take the API's own response shapes, so they are tested offline.
"""

from __future__ import annotations

import datetime
import datetime as _dt
import json
import re
from decimal import Decimal
from typing import Callable, Iterable, Mapping

from gpucluster.catalog.prices import Catalog, PriceRow
from gpucluster.errors import UsageError, not_allowed, require
from gpucluster.infra.contract import PricedRows
from gpucluster.spec import ClusterSpec
from gpucluster.states import JsonMapping, JsonObject

from .catalog import DEFAULT_DISK_TYPE, DEFAULT_INSTANCE_TYPE, instance_type_of
from .sdk import Ec2Client, PricingClient

_REGION_RE = re.compile(r"[a-z]{2}(-gov)?-[a-z]+-\d")


# -- live prices: pure parsers ------------------------------------------------------------------
def _on_demand_prices(doc: JsonMapping) -> list[tuple[Decimal, str]]:
    """(USD price, unit) of every on-demand price dimension of one Price List item."""
    prices = []
    for term in doc.get("terms", {}).get("OnDemand", {}).values():
        for dim in term.get("priceDimensions", {}).values():
            usd = dim.get("pricePerUnit", {}).get("USD")
            if usd is not None:
                prices.append((Decimal(usd), dim.get("unit", "")))
    return prices


def _instance_row(attrs: JsonMapping, region: str, price: Decimal, src: str, date: str,
                  known: Mapping[str, PriceRow] | None) -> PriceRow:
    itype: str = attrs["instanceType"]
    shipped = (known or {}).get(itype)
    gpus = attrs.get("gpu")
    gpus = int(gpus) if gpus and str(gpus).isdigit() else (shipped.gpus if shipped else 0)
    vcpus = attrs.get("vcpu")
    mem = attrs.get("memory", "").replace(" GiB", "").replace(",", "")
    return PriceRow(
        cloud="aws", region=region, kind="instance", item=itype, market="on-demand", unit="hour",
        price=price, source=src, date=date, gpus=gpus, gpu=shipped.gpu if shipped else None,
        vcpus=int(vcpus) if vcpus and str(vcpus).isdigit() else None,
        memory_gib=Decimal(mem) if re.fullmatch(r"\d+(\.\d+)?", mem) else None, origin="user")


def parse_aws_price_list(price_list: Iterable[str | JsonMapping], date: str,
                         known: Mapping[str, PriceRow] | None = None) -> list[PriceRow]:
    """Rows from `pricing.get_products(...)["PriceList"]` items (JSON strings).

    Compute instances give on-demand "instance" rows (Hrs); EBS gp3 storage gives "disk" rows
    (GB-Mo). `known` (instance type -> a shipped row) fills in GPU counts when the attributes lack
    them. Items with no USD on-demand price are skipped."""
    rows: list[PriceRow] = []
    for item in price_list:
        doc = json.loads(item) if isinstance(item, (str, bytes)) else item
        product = doc.get("product", {})
        attrs = product.get("attributes", {})
        region = attrs.get("regionCode")
        prices = _on_demand_prices(doc)
        if not region or not prices:
            continue
        price, unit = max(prices)
        family = product.get("productFamily", "")
        src = f"AWS Price List API (pricing.get_products, AmazonEC2, sku {product.get('sku', '?')})"
        if family == "Compute Instance" and unit == "Hrs" and attrs.get("instanceType"):
            rows.append(_instance_row(attrs, region, price, src, date, known))
        elif family == "Storage" and unit == "GB-Mo" and attrs.get("volumeApiName"):
            rows.append(PriceRow(
                cloud="aws", region=region, kind="disk", item=attrs["volumeApiName"], market="on-demand",
                unit="gb-month", price=price, source=src, date=date, origin="user"))
    return rows


def parse_aws_spot_history(history: Iterable[JsonMapping], region: str, date: str,
                           known: Mapping[str, PriceRow] | None = None) -> list[PriceRow]:
    """Rows from `ec2.describe_spot_price_history(...)["SpotPriceHistory"]`: the newest price per
    availability zone, and per instance type the highest of those (spot is a per-AZ point-in-time
    price; the highest is the safe one to estimate with), with the range and each zone's price kept
    (`zones`: a run's cost uses the price of the zone it ran in)."""
    latest: dict[tuple[str, str], tuple[datetime.datetime | None, Decimal]] = {}
    for rec in history:
        if "Linux/UNIX" not in rec.get("ProductDescription", "Linux/UNIX"):
            continue
        k = (rec["InstanceType"], rec["AvailabilityZone"])
        ts = rec.get("Timestamp")
        if k not in latest or (ts is not None and ts > latest[k][0]):
            latest[k] = (ts, Decimal(str(rec["SpotPrice"])))
    per_type: dict[str, list[Decimal]] = {}
    for (itype, _az), (_ts, price) in latest.items():
        per_type.setdefault(itype, []).append(price)
    rows = []
    for itype, prices in sorted(per_type.items()):
        shipped = (known or {}).get(itype)
        rows.append(PriceRow(
            cloud="aws", region=region, kind="instance", item=itype, market="spot", unit="hour",
            price=max(prices), date=date, gpus=shipped.gpus if shipped else 0,
            gpu=shipped.gpu if shipped else None, vcpus=shipped.vcpus if shipped else None,
            memory_gib=shipped.memory_gib if shipped else None,
            source=f"AWS EC2 DescribeSpotPriceHistory, Linux/UNIX, {region}: highest of {len(prices)} AZ prices",
            extra={"range": [str(min(prices)), str(max(prices))],
                   "zones": {az: str(p) for (t, az), (_ts, p) in sorted(latest.items()) if t == itype}},
            origin="user"))
    return rows


# -- live prices: fetching ---------------------------------------------------------------------
def _aws_filters(**terms: str) -> list[dict[str, str]]:
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in terms.items()]


def fetch_aws(regions: list[str], instance_types: list[str], *, date: str,
              known: Mapping[str, PriceRow] | None = None, pricing_client: PricingClient = None,
              ec2_client_for: Callable[[str], Ec2Client] | None = None) -> list[PriceRow]:
    """On-demand (Price List API) and spot (DescribeSpotPriceHistory) rows for the regions."""
    if pricing_client is None or ec2_client_for is None:
        boto3 = require("boto3", "aws")
        # a session of its own, as preflight and the leftover sweep use: boto3's default session
        # keeps the first credentials it found for the life of the process
        session = boto3.session.Session()
        if pricing_client is None:
            pricing_client = session.client("pricing", region_name="us-east-1")
        if ec2_client_for is None:
            ec2_client_for = lambda region: session.client("ec2", region_name=region)  # noqa: E731
    rows: list[PriceRow] = []
    for region in regions:
        items: list[str] = []
        queries = [_aws_filters(instanceType=t, regionCode=region, operatingSystem="Linux", tenancy="Shared",
                                preInstalledSw="NA", capacitystatus="Used") for t in instance_types]
        queries.append(_aws_filters(productFamily="Storage", volumeApiName="gp3", regionCode=region))
        for filters in queries:
            kwargs: JsonObject = {"ServiceCode": "AmazonEC2", "Filters": filters, "FormatVersion": "aws_v1"}
            while True:
                resp = pricing_client.get_products(**kwargs)
                items.extend(resp.get("PriceList", []))
                if not resp.get("NextToken"):
                    break
                kwargs["NextToken"] = resp["NextToken"]
        rows.extend(parse_aws_price_list(items, date, known))
        ec2 = ec2_client_for(region)
        history: list[JsonObject] = []
        kwargs = {"InstanceTypes": list(instance_types), "ProductDescriptions": ["Linux/UNIX"],
                  "StartTime": _dt.datetime.now(_dt.timezone.utc)}
        while True:
            resp = ec2.describe_spot_price_history(**kwargs)
            history.extend(resp.get("SpotPriceHistory", []))
            if not resp.get("NextToken"):
                break
            kwargs["NextToken"] = resp["NextToken"]
        rows.extend(parse_aws_spot_history(history, region, date, known))
    return rows


def fetch_prices(catalog: Catalog, *, regions: list[str], date: str, pricing_client: PricingClient = None,
                 ec2_client_for: Callable[[str], Ec2Client] | None = None) -> list[PriceRow]:
    """`Pricing.fetch_prices`: current rows for the regions, for every instance type the shipped
    `catalog` prices (whose rows fill in GPU facts the Price List lacks)."""
    bad = [r for r in regions if not _REGION_RE.fullmatch(r)]
    if bad:
        raise UsageError(not_allowed("aws region", bad[0], catalog.regions("aws")))
    known = {r.item: r for r in catalog.rows.values() if r.cloud == "aws" and r.kind == "instance"}
    return fetch_aws(regions, sorted(known), date=date, known=known, pricing_client=pricing_client,
                     ec2_client_for=ec2_client_for)


# -- pricing rules (the cost engine's hooks) ---------------------------------------------------
def price_rows(spec: ClusterSpec, catalog: Catalog, region: str, market: str,
               free_tier: bool | None = None) -> PricedRows:
    """The instance row (GPUs included in its price), the root disk's type; a GPU count the type does not carry
    is refused."""
    itype = _type_of(spec)
    machine = catalog.get("aws", region, "instance", itype, market)
    if spec.gpus_per_node is not None and int(spec.gpus_per_node) != machine.gpus:
        same = [t for t in catalog.items("aws", "instance")
                if (row := catalog.find("aws", region, "instance", t, market)) is not None
                and row.gpus == int(spec.gpus_per_node)]
        raise UsageError(f"gpus {spec.gpus_per_node} is not allowed for {itype}: it carries exactly "
                         f"{machine.gpus} GPU(s)"
                         + (f"; types with {spec.gpus_per_node}: {', '.join(same)}" if same else ""))
    return PricedRows(machine=machine, disk_type=spec.disk_type or DEFAULT_DISK_TYPE, gpus_per_node=machine.gpus,
                      gpu_name=machine.gpu)


def _type_of(spec: ClusterSpec) -> str:
    """The type named, else the one `--gpu` picks (catalog.select_type), else the default."""
    if spec.instance_type is None and spec.accelerator is not None:
        return instance_type_of(spec).name
    return spec.instance_type or DEFAULT_INSTANCE_TYPE


def instance_price(catalog: Catalog, region: str, item: str, market: str) -> PriceRow:
    return catalog.get("aws", region, "instance", item, market)


def planned_resources(spec: ClusterSpec, region: str, catalog: Catalog | None = None) -> list[dict[str, object]]:
    """One `fleet` of N nodes (the instant EC2 Fleet that launches them all: component.py), each node
    with its root volume (deleted with it) and its public IPv4 address (assigned at launch, billed
    per address-hour): what engine.resource_detail records for the fleet."""
    disk = {"disk_gb": spec.disk_size, "disk_type": spec.disk_type or DEFAULT_DISK_TYPE}
    itype = _type_of(spec)
    return [{"kind": "fleet", "name": f"{spec.name}-fleet",
             "detail": {"instance_type": itype, "node_count": int(spec.nodes), "spot": spec.spot, "public_ipv4": 1,
                        "availability_zone": spec.zone, **disk}}]
