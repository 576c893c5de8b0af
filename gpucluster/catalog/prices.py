"""The price catalog: dated, sourced prices in USD as `Decimal`.

Two layers, looked up row by row:

* the shipped catalog, `gpucluster/catalog/data/prices.json`, read from public sources on the date
  each row carries;
* the user catalog, `<home>/prices.json`, written by `refresh(cloud)` from the live price APIs. A
  user row replaces the shipped row with the same key (cloud, region, kind, item, market). A user
  catalog that cannot be read is reported in `Catalog.warnings` and ignored; it is never
  overwritten (refresh refuses until the user fixes or removes it).

Row kinds and units:

===========  ==========================  =================================================
kind         unit                        item
===========  ==========================  =================================================
instance     hour (per instance)         EC2 type (g5.*) or GCE machine type (n1-standard-*)
gpu          gpu-hour                    accelerator short name (V100); GCE bills GPUs apart
vcpu         vcpu-hour                   machine family (n1): prices custom/other N1 shapes
memory       gib-hour                    machine family (n1)
disk         gb-month                    gp3, pd-standard, pd-balanced, pd-ssd, hyperdisk-balanced
cluster-fee  cluster-hour                gke (region "*": the same everywhere)
ipv4         address-hour                public (aws: every public IPv4 address), external-ipv4 (gcp, by market); region "*"
egress       gb                          internet, inter-region: data read out of the cloud's storage (placement, docs/placement.md); region "*"
===========  ==========================  =================================================

`market` is "on-demand" or "spot". `gpus` is the number of GPUs one unit carries (an instance's
GPU count, 1 for a gpu row), from which the $/GPU-hour column is derived.

A row's `cloud` is one of the clouds the shipped catalog prices (`Catalog.clouds`): the priced
backends, since a priced backend ships its rows here (docs/backends.md; tests/test_prices.py checks
the two agree), so this module never asks the registry. `refresh(cloud, pricing)` asks the
backend's `Pricing` part, given by the caller, for live prices (`Pricing.fetch_prices`: the AWS
Price List / spot history fetcher lives in infra/aws/prices.py, the Cloud Billing Catalog one in
infra/gcp/prices.py); this module only loads, merges and writes catalogs.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Literal, Mapping, Sequence

from gpucluster.errors import ConfigError, GpuclusterError, UsageError, not_allowed
from gpucluster.states import JsonMapping, JsonObject

if TYPE_CHECKING:
    from gpucluster.infra.contract import Pricing

MARKETS = ("on-demand", "spot")
KINDS = ("instance", "gpu", "vcpu", "memory", "disk", "cluster-fee", "ipv4", "egress")
UNITS = {
    "instance": "hour",
    "gpu": "gpu-hour",
    "vcpu": "vcpu-hour",
    "memory": "gib-hour",
    "disk": "gb-month",
    "cluster-fee": "cluster-hour",
    "ipv4": "address-hour",
    "egress": "gb",
}
# The GPU names as users type them (--gpu) mapped to what the catalog calls them: gpucluster.catalog.gpus
# (case-insensitive names and aliases, GKE's accelerator names included).

_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_KEY_FIELDS = ("cloud", "region", "kind", "item", "market")
_CORE_FIELDS = set(_KEY_FIELDS) | {"unit", "price", "source", "date", "gpus", "gpu", "vcpus", "memory_gib"}


class PriceRefreshError(GpuclusterError):
    """Live prices could not be fetched; the catalog in use is unchanged."""


@dataclass(frozen=True)
class PriceRow:
    cloud: str
    region: str
    kind: str
    item: str
    market: str
    unit: str
    price: Decimal
    source: str
    date: str
    gpus: int = 0
    gpu: str | None = None
    vcpus: int | None = None
    memory_gib: Decimal | None = None
    extra: JsonMapping = field(default_factory=dict)
    origin: str = "shipped"  # shipped | user

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.cloud, self.region, self.kind, self.item, self.market)

    @property
    def per_gpu_hour(self) -> Decimal | None:
        """$/GPU-hour for rows that carry GPUs and are priced per hour."""
        if self.gpus and self.unit in ("hour", "gpu-hour"):
            return self.price / self.gpus
        return None

    def to_dict(self) -> JsonObject:
        d: JsonObject = {k: getattr(self, k) for k in _KEY_FIELDS}
        d.update(unit=self.unit, price=str(self.price), gpus=self.gpus, source=self.source, date=self.date)
        if self.gpu:
            d["gpu"] = self.gpu
        if self.vcpus is not None:
            d["vcpus"] = self.vcpus
        if self.memory_gib is not None:
            d["memory_gib"] = str(self.memory_gib)
        d.update(self.extra)
        return d

    def cite(self) -> dict[str, str]:
        """price / unit / source / date as strings: what a snapshot or cost line keeps."""
        return {"price": str(self.price), "unit": self.unit, "source": self.source, "date": self.date,
                "origin": self.origin}


def _check_names(d: JsonMapping, clouds: Sequence[str] | None) -> None:
    """Every key field, unit, price, source and date there; cloud, kind, market and unit among those allowed."""
    for name in _KEY_FIELDS + ("unit", "price", "source", "date"):
        if name not in d or d[name] in (None, ""):
            raise ValueError(f"a row lacks {name!r}: {dict(d)!r}"[:200])
    if clouds is not None and d["cloud"] not in clouds:
        raise ValueError(f"row cloud {d['cloud']!r} is not one of {', '.join(clouds)}")
    if d["kind"] not in KINDS:
        raise ValueError(f"row kind {d['kind']!r} is not one of {', '.join(KINDS)}")
    if d["market"] not in MARKETS:
        raise ValueError(f"row market {d['market']!r} is not one of {', '.join(MARKETS)}")
    if d["unit"] != UNITS[d["kind"]]:
        raise ValueError(f"row {d['item']}: unit {d['unit']!r} should be {UNITS[d['kind']]!r}")


def _row_price(d: JsonMapping) -> Decimal:
    try:
        price = Decimal(str(d["price"]))
    except InvalidOperation:
        raise ValueError(f"row {d['item']}: price {d['price']!r} is not a number") from None
    if not price.is_finite() or price < 0:
        raise ValueError(f"row {d['item']}: price {d['price']!r} is not a non-negative number")
    return price


def _row_gpus(d: JsonMapping) -> int:
    gpus = d.get("gpus", 0)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise ValueError(f"row {d['item']}: gpus {gpus!r} is not a count")
    return gpus


def row_from_dict(d: JsonMapping, origin: str = "shipped", clouds: Sequence[str] | None = None) -> PriceRow:
    """Validate one JSON row; ValueError names the bad field. `clouds`: the clouds a row may name
    (a user row: those the shipped catalog prices); None: any (the shipped rows define them)."""
    if not isinstance(d, Mapping):
        raise ValueError(f"a row is {type(d).__name__}, not an object")
    _check_names(d, clouds)
    price = _row_price(d)
    if not isinstance(d["date"], str) or not _DATE_RE.match(d["date"]):
        raise ValueError(f"row {d['item']}: date {d['date']!r} is not YYYY-MM-DD")
    gpus = _row_gpus(d)
    mem = d.get("memory_gib")
    return PriceRow(
        cloud=d["cloud"], region=d["region"], kind=d["kind"], item=d["item"], market=d["market"],
        unit=d["unit"], price=price, source=str(d["source"]), date=d["date"], gpus=gpus,
        gpu=d.get("gpu"), vcpus=d.get("vcpus"), memory_gib=None if mem is None else Decimal(str(mem)),
        extra={k: v for k, v in d.items() if k not in _CORE_FIELDS}, origin=origin,
    )


def parse_document(doc: object, origin: str, clouds: Sequence[str] | None = None) -> list[PriceRow]:
    if not isinstance(doc, Mapping) or not isinstance(doc.get("rows"), list):
        raise ValueError('expected an object with a "rows" list')
    if doc.get("currency", "USD") != "USD":
        raise ValueError(f"currency {doc.get('currency')!r} is not USD")
    return [row_from_dict(r, origin, clouds) for r in doc["rows"]]


def shipped_document() -> JsonObject:
    text = resources.files("gpucluster.catalog").joinpath("data/prices.json").read_text(encoding="utf-8")
    return json.loads(text)


def _clouds(rows: Iterable[PriceRow]) -> tuple[str, ...]:
    return tuple(sorted({r.cloud for r in rows}))


def catalog_clouds() -> tuple[str, ...]:
    """The clouds the shipped catalog prices: the priced backends (tests/test_prices.py checks
    that they are exactly `infra.registry.priced()`)."""
    return _clouds(parse_document(shipped_document(), "shipped"))


def user_catalog_path() -> Path:
    from gpucluster.home import home_dir

    return home_dir(create=False) / "prices.json"


class Catalog:
    """Shipped rows overlaid with user rows; lookups by key. `clouds`: the clouds it prices (the
    shipped rows'; default: its rows')."""

    def __init__(self, rows: Iterable[PriceRow], warnings: list[str] | None = None,
                 user_path: Path | None = None, clouds: Sequence[str] | None = None):
        self.rows: dict[tuple, PriceRow] = {}
        for row in rows:
            self.rows[row.key] = row
        self.clouds = tuple(clouds) if clouds is not None else _clouds(self.rows.values())
        self.warnings = list(warnings or [])
        self.user_path = user_path

    # -- lookups -----------------------------------------------------------------------------
    def find(self, cloud: str, region: str, kind: str, item: str, market: str = "on-demand") -> PriceRow | None:
        return self.rows.get((cloud, region, kind, item, market)) or self.rows.get((cloud, "*", kind, item, market))

    def get(self, cloud: str, region: str, kind: str, item: str, market: str = "on-demand") -> PriceRow:
        """The row, or a UsageError naming what is missing (with a did-you-mean)."""
        row = self.find(cloud, region, kind, item, market)
        if row is not None:
            return row
        regions = self.regions(cloud)
        if region not in regions and not self.find(cloud, "*", kind, item, market):
            raise UsageError(not_allowed(f"{cloud} region", region, regions))
        items = sorted({r.item for r in self.rows.values() if r.cloud == cloud and r.kind == kind})
        if item not in items:
            raise UsageError(not_allowed(f"{cloud} {kind} type", item, items))
        here = sorted({r.market for r in self.rows.values()
                       if r.cloud == cloud and r.kind == kind and r.item == item and r.region == region})
        where = sorted({r.region for r in self.rows.values()
                        if r.cloud == cloud and r.kind == kind and r.item == item and r.market == market})
        raise UsageError(
            f"no {market} price for {item} in {region} in the catalog"
            + (f" (it has {', '.join(here)} there)" if here else "")
            + (f"; {market} prices for {item} exist in: {', '.join(where)}" if where else "")
            + f"; run `gpucluster prices refresh --cloud {cloud} --region {region}` to fetch current prices"
        )

    def regions(self, cloud: str) -> list[str]:
        return sorted({r.region for r in self.rows.values() if r.cloud == cloud and r.region != "*"})

    def items(self, cloud: str, kind: str) -> list[str]:
        return sorted({r.item for r in self.rows.values() if r.cloud == cloud and r.kind == kind})

    def select(self, cloud: str | None = None, region: str | None = None, gpu: str | None = None) -> list[PriceRow]:
        """Rows filtered for display; unknown filter values raise a UsageError with did-you-mean."""
        if cloud is not None and cloud not in self.clouds:
            raise UsageError(not_allowed("cloud", cloud, self.clouds))
        rows = [r for r in self.rows.values() if cloud is None or r.cloud == cloud]
        if region is not None:
            regions = sorted({r.region for r in rows if r.region != "*"})
            if region not in regions:
                raise UsageError(not_allowed("region", region, regions))
            rows = [r for r in rows if r.region in (region, "*")]
        if gpu is not None:
            name = normalize_gpu(gpu, sorted({r.gpu for r in self.rows.values() if r.gpu}))
            rows = [r for r in rows if r.gpu == name]
        order = {k: i for i, k in enumerate(KINDS)}
        def natural(text: str) -> list:
            return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]

        return sorted(rows, key=lambda r: (r.cloud, r.region, order[r.kind], r.vcpus or 0, natural(r.item), r.market))

    def oldest_date(self, rows: Iterable[PriceRow] | None = None) -> str:
        dates = [r.date for r in (self.rows.values() if rows is None else rows)]
        return min(dates) if dates else ""


def normalize_gpu(name: str, known: Iterable[str] | None = None) -> str:
    """The catalog's name of a GPU (`gpus.lookup`: any case, aliases, GKE's accelerator names), one of
    `known` (default: every GPU gpucluster knows); UsageError naming the allowed ones."""
    from gpucluster.catalog.gpus import GPUS, lookup

    known = list(GPUS) if known is None else list(known)
    gpu = lookup(str(name))
    canonical = gpu.name if gpu is not None else str(name)
    if canonical not in known:
        raise UsageError(not_allowed("gpu", name, known))
    return canonical


def load_catalog(user_path: Path | None | Literal[False] = None) -> Catalog:
    """Shipped rows overlaid by the user catalog (`user_path`; None: the default under the home
    directory; False: shipped only). A user catalog that cannot be used becomes a warning."""
    shipped = parse_document(shipped_document(), "shipped")
    clouds = _clouds(shipped)
    if user_path is False:
        return Catalog(shipped, clouds=clouds)
    path = user_catalog_path() if user_path is None else Path(user_path)
    if not path.exists():
        return Catalog(shipped, user_path=path, clouds=clouds)
    try:
        user = read_user_rows(path, clouds)
    except ConfigError as exc:
        shipped_date = min(r.date for r in shipped)
        return Catalog(shipped, [f"{exc}; using the shipped catalog (read {shipped_date}) instead"], path, clouds)
    return Catalog(shipped + user, user_path=path, clouds=clouds)


def read_user_rows(path: Path, clouds: Sequence[str] | None = None) -> list[PriceRow]:
    """The user catalog's rows; each must name one of `clouds` (default: the shipped catalog's)."""
    clouds = catalog_clouds() if clouds is None else clouds
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return parse_document(doc, "user", clouds)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
        raise ConfigError(f"user price catalog {str(path)!r} is not usable ({exc})") from None


def write_user_rows(path: Path, new_rows: Iterable[PriceRow], clouds: Sequence[str] | None = None) -> int:
    """Merge rows into the user catalog (replacing by key), atomically. A corrupt existing file is
    never overwritten: ConfigError. `clouds`: as for `read_user_rows`."""
    existing = read_user_rows(path, clouds) if path.exists() else []
    merged = {r.key: r for r in existing}
    count = 0
    for row in new_rows:
        merged[row.key] = row
        count += 1
    doc = {"format": 1, "currency": "USD", "about": "written by `gpucluster prices refresh`",
           "rows": [r.to_dict() for r in sorted(merged.values(), key=lambda r: r.key)]}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".prices-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
        os.replace(tmp, path)
    except BaseException:  # Ctrl-C included: no half-written temporary file is left beside the catalog
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return count


# -- live refresh -------------------------------------------------------------------------------
def _today(now: _dt.datetime | None = None) -> str:
    return (now or _dt.datetime.now(_dt.timezone.utc)).strftime("%Y-%m-%d")


def refresh(cloud: str, pricing: Pricing | None, *, regions: list[str] | None = None, path: Path | None = None,
            now: _dt.datetime | None = None, **clients: Any) -> JsonObject:
    """Fetch live prices for `cloud` into the user catalog. Returns a summary dict.

    Raises UsageError for a bad cloud/region, ConfigError when the existing user catalog is
    corrupt (checked first: it is never overwritten), PriceRefreshError when the API cannot be
    reached or refuses (no credentials, no network); the catalog in use is unchanged then.
    The fetching is the backend's: `pricing` is the `Pricing` part of the backend called `cloud`,
    given by the caller (None where `cloud` is not a priced backend, which is refused here);
    `clients` are passed to its `fetch_prices` (pricing_client / ec2_client_for for aws, client for
    gcp: tests)."""
    shipped = Catalog(parse_document(shipped_document(), "shipped"))
    if cloud not in shipped.clouds or pricing is None:
        raise UsageError(not_allowed("cloud", cloud, shipped.clouds))
    path = Path(path) if path is not None else user_catalog_path()
    if path.exists():
        read_user_rows(path, shipped.clouds)  # raises ConfigError before any fetching; nothing is overwritten
    known_regions = shipped.regions(cloud)
    regions = list(regions or known_regions)
    date = _today(now)
    shipped_date = shipped.oldest_date()
    try:
        rows = pricing.fetch_prices(shipped, regions=regions, date=date, **clients)
    except GpuclusterError:
        raise
    except Exception as exc:  # SDK errors: no credentials, no network, access denied, throttling
        raise PriceRefreshError(
            f"could not fetch {cloud} prices ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            f"the catalog in use is unchanged (shipped prices read {shipped_date})",
            hint="configure credentials for the cloud (aws configure / gcloud auth application-default login)",
        ) from None
    if not rows:
        raise PriceRefreshError(f"the {cloud} price API returned no usable prices for {', '.join(regions)}; "
                                "the catalog in use is unchanged")
    written = write_user_rows(path, rows, shipped.clouds)
    return {"cloud": cloud, "regions": regions, "rows": written, "path": str(path), "date": date}


__all__ = [
    "Catalog", "PriceRow", "PriceRefreshError", "load_catalog", "refresh", "normalize_gpu", "user_catalog_path",
]
