"""Data, outputs and egress in placement (issue 43 item 5, docs/placement.md): a run's object-storage
URLs (`--data`, `--output`; a `--resume` of a run whose outputs went to a bucket reads that bucket)
constrain where it may be placed. Data read from a bucket is billed as egress by the bucket's cloud
when the reader is elsewhere (another cloud: its internet egress; another region of that cloud:
its inter-region transfer); outputs written to a bucket are billed by the writer's cloud the same
way. A candidate that would cross is dropped, naming the price per GB, unless `--allow-egress`;
then it is kept and its total carries what reading the data costs (the size from the bucket's
listing, in a real run; "size unknown" when it could not be listed, "not checked" in a dry run,
which reaches no cloud). A cloud whose nodes do not read the bucket's scheme at all is dropped
whatever the flag says (no node of it could read the data).

The per-GB prices are the price catalog's `egress` rows (dated and sourced there). Cloud-agnostic:
which cloud holds a scheme comes from the caller (`readers`: scheme -> the clouds whose nodes read
it, the first holding it), the bucket's region and size from a lookup the caller passes (`facts`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from gpucluster.errors import GpuclusterError
from gpucluster.states import JsonObject

if TYPE_CHECKING:
    from gpucluster.catalog.prices import Catalog

GB = Decimal(10) ** 9  # the clouds bill transfer per GB (AWS) or GiB (GCP): GB here, the smaller unit
NOT_CHECKED = "not checked"  # a dry run looks nothing up
Facts = Callable[[str], "tuple[str | None, int | None]"]  # URL -> (the bucket's region, bytes under the URL)


@dataclass(frozen=True)
class Bucket:
    url: str  # s3://bucket[/prefix], gs://bucket[/prefix]
    cloud: str  # the cloud whose storage holds it
    use: str  # "read" (--data, --resume) or "write" (--output)
    region: str | None = None  # None: not known (see `note`)
    size: int | None = None  # bytes under the URL (reads); None: not known
    note: str = ""  # why region or size is not known ("not checked", "size unknown: ...")


@dataclass
class Egress:
    """What one candidate's data and outputs cost in transfer: `gb` and `cost` None where the size is not known."""

    gb: Decimal | None = None
    cost: Decimal | None = Decimal(0)
    lines: list[str] = field(default_factory=list)  # one per bucket crossed: what, where, $/GB
    why: str = ""  # why `cost` is not known: "not checked" (a dry run), "size unknown"

    def to_dict(self) -> JsonObject:
        return {"gb": None if self.gb is None else str(self.gb), "cost": None if self.cost is None else str(self.cost),
                "why": self.why or None, "crossed": list(self.lines)}


def buckets(data: Sequence[str], output: str | None, reads: Sequence[str], writes: Sequence[str],
            readers: Mapping[str, Sequence[str]]) -> list[Bucket]:
    """The request's bucket URLs (`--data SRC[:DEST]`, `--output`, and a prepared plan's `reads`/`writes`,
    which hold a resumed run's bucket), each with the cloud that holds it; local paths are not buckets."""
    found: dict[tuple[str, str], Bucket] = {}
    for use, urls in (("read", [_src(v) for v in data] + list(reads)), ("write", [output or "", *writes])):
        for url in urls:
            scheme = url.split("://", 1)[0].lower() if "://" in url else ""
            holders = list(readers.get(scheme, ()))
            if holders:
                found.setdefault((use, url.rstrip("/")), Bucket(url.rstrip("/"), holders[0], use))
    return list(found.values())


def _src(value: str) -> str:
    """`--data SRC[:DEST]`: a URL's DEST follows its last ':' (gpucluster.watch.staging)."""
    return value if value.count(":") <= 1 else value.rsplit(":", 1)[0]


def looked_up(found: Sequence[Bucket], facts: Callable[[str], Facts | None] | None) -> list[Bucket]:
    """Each bucket with its region and size: `facts(cloud)` gives that cloud's lookup (None: it has none);
    `facts` None (a dry run): every one "not checked". A lookup that fails says why, the bucket kept."""
    out: list[Bucket] = []
    for b in found:
        lookup = None if facts is None else facts(b.cloud)
        if lookup is None:
            out.append(replace(b, note=NOT_CHECKED if facts is None else f"size unknown: {b.cloud} lists no buckets"))
            continue
        try:
            region, size = lookup(b.url)
        except GpuclusterError as exc:
            out.append(replace(b, note=f"size unknown: {exc.message}"))
            continue
        out.append(replace(b, region=region, size=size if b.use == "read" else None,
                           note="" if size is not None or b.use == "write" else "size unknown"))
    return out


def crossing(b: Bucket, cloud: str, region: str | None) -> tuple[str, str] | None:
    """(catalog item, the cloud that bills it) when a candidate at (cloud, region) reads or writes `b`
    across a border: another cloud ("internet") or another region of the same one ("inter-region")."""
    payer = b.cloud if b.use == "read" else cloud
    if b.cloud != cloud:
        return "internet", payer
    if b.region is not None and region is not None and b.region != region:
        return "inter-region", payer
    return None


def per_gb(catalog: Catalog, cloud: str, item: str) -> Decimal | None:
    row = catalog.find(cloud, "*", "egress", item)
    return None if row is None else row.price


def refusal(b: Bucket, cloud: str, region: str | None, catalog: Catalog, readable: bool) -> str:
    """The one line that says what crossing costs, for a dropped candidate."""
    item, payer = crossing(b, cloud, region) or ("internet", b.cloud)
    price = per_gb(catalog, payer, item)
    where = f"{b.cloud}" + (f" {b.region}" if b.region else "")
    there = f"{cloud}" + (f" {region}" if region and item == "inter-region" else "")
    cost = f"${price}/GB {item} egress" if price is not None else f"{item} egress (not priced)"
    what = (f"data in {b.url} is on {where}; reading it from {there} costs {cost}" if b.use == "read" else
            f"outputs go to {b.url} on {where}; writing them from {there} costs {cost}")
    if not readable:
        scheme = b.url.split("://", 1)[0]
        return f"{what}, and {cloud} nodes do not read {scheme}:// (only {b.cloud}'s do)"
    return f"{what}: --allow-egress"


def _note_uncrossed(out: Egress, b: Bucket, cloud: str) -> None:
    """A bucket of the candidate's cloud whose region was not learned: said so."""
    if b.region is None and b.cloud == cloud:
        out.lines.append(f"{b.url}: region not checked" if b.note == NOT_CHECKED
                         else f"{b.url}: region not known ({b.note or 'not looked up'})")


def _add_crossing(out: Egress, b: Bucket, item: str, payer: str, catalog: Catalog) -> None:
    """A crossed bucket's GB and cost added to `out`; an unknown size or price makes them unknown."""
    price = per_gb(catalog, payer, item)
    size = None if b.use == "write" else b.size
    if size is None or price is None:
        out.gb = out.cost = None
        why = ("written during the run: size unknown" if b.use == "write" else b.note or "size unknown")
        out.why = out.why or ("not checked" if why == NOT_CHECKED else "size unknown")
        out.lines.append(f"{b.url}: {item} ${price}/GB, {why}")
        return
    gb = (Decimal(size) / GB).quantize(Decimal("0.001"))
    if out.gb is not None:
        out.gb += gb
    if out.cost is not None:
        out.cost += gb * price
    out.lines.append(f"{b.url}: {gb} GB × ${price}/GB {item}")


def priced(found: Sequence[Bucket], cloud: str, region: str | None, catalog: Catalog) -> Egress | None:
    """What `found` costs a candidate at (cloud, region) in transfer; None when nothing is crossed."""
    out = Egress(gb=Decimal(0))
    crossed = False
    for b in found:
        how = crossing(b, cloud, region)
        if how is None:
            _note_uncrossed(out, b, cloud)
            continue
        crossed = True
        item, payer = how
        _add_crossing(out, b, item, payer, catalog)
    if not crossed and not out.lines:
        return None
    if not crossed:  # the bucket's region was not looked up: whether it is crossed is not known
        out.gb = out.cost = None
        out.why = NOT_CHECKED if all(NOT_CHECKED in line for line in out.lines) else "region unknown"
    return out
