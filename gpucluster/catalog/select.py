"""`--gpu TYPE:COUNT` -> the machine: the cheapest shape of one cloud, in one region, that carries
exactly COUNT of that GPU. Cloud-agnostic: each cloud's catalog passes its shapes and how to price
one (an EC2 type is one `instance` row; a GCE machine is its host row plus COUNT `gpu` rows).

Refusals are one line (UsageError, exit 2) that says what exists instead: the counts per node this
cloud offers for the GPU, the regions that have the shape (with the catalog's price), or the other
clouds that have the GPU at all.
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Callable, Protocol, Sequence, TypeVar

from gpucluster.errors import SpecError

if TYPE_CHECKING:
    from gpucluster.catalog.prices import Catalog


class Shape(Protocol):
    """What a cloud's shape tells (read-only: the shapes are frozen dataclasses)."""

    @property
    def name(self) -> str: ...

    @property
    def gpus(self) -> int: ...

    @property
    def gpu_model(self) -> str: ...

    @property
    def regions(self) -> tuple[str, ...]: ...

    @property
    def vcpus(self) -> int: ...


S = TypeVar("S", bound=Shape)
PriceOf = Callable[[S, str, str], "Decimal | None"]  # (shape, region, market) -> $/h or None


def _money(value: Decimal) -> str:
    return f"${value.quantize(Decimal('0.001')).normalize():f}"


def where_else(gpu: str, catalog: Catalog, *, but: str | None = None, limit: int = 4) -> str:
    """Where the price catalog has `gpu` (any cloud but `but`): 'gcp us-central1 $2.934/GPU-h, ...'."""
    best: dict[tuple[str, str], Decimal] = {}
    for row in catalog.rows.values():
        per = row.per_gpu_hour
        if row.gpu != gpu or row.market != "on-demand" or per is None or row.cloud == but:
            continue
        key = (row.cloud, row.region)
        best[key] = min(per, best.get(key, per))
    ranked = sorted(best.items(), key=lambda kv: kv[1])[:limit]
    return ", ".join(f"{cloud} {region} {_money(p)}/GPU-h on-demand" for (cloud, region), p in ranked)


def _not_offered(cloud: str, gpu: str, shapes: Sequence[Shape], catalog: Catalog | None) -> SpecError:
    elsewhere = where_else(gpu, catalog, but=cloud) if catalog is not None else ""
    return SpecError(f"gpu {gpu} is not offered on {cloud} in gpucluster's catalog"
                     + (f"; it is on {elsewhere}" if elsewhere else "")
                     + f"; {cloud} offers: {', '.join(sorted({s.gpu_model for s in shapes}))}")


def _no_such_count(cloud: str, gpu: str, count: int, carrying: Sequence[Shape]) -> SpecError:
    counts = sorted({s.gpus for s in carrying})
    by_count = "; ".join(f"{n}: {', '.join(s.name for s in carrying if s.gpus == n)}" for n in counts)
    return SpecError(f"gpu {gpu}:{count} is not allowed: no {cloud} machine carries {count} × {gpu}; "
                     f"GPUs per node that exist: {', '.join(map(str, counts))} ({by_count})")


def _not_in_region(cloud: str, gpu: str, count: int, region: str, exact: Sequence[S], price_of: PriceOf[S],
                   market: str) -> SpecError:
    others: list[str] = []
    for r in sorted({r for s in exact for r in s.regions}):
        priced = [(price_of(s, r, market), s) for s in exact if r in s.regions]
        known = sorted((p, s.name) for p, s in priced if p is not None)
        others.append(f"{r} ({known[0][1]} {_money(known[0][0])}/h)" if known
                      else f"{r} ({', '.join(s.name for _, s in priced)}, not priced)")
    priced_first = sorted(others, key=lambda o: ("not priced" in o, o))
    return SpecError(f"gpu {gpu}:{count} is not offered on {cloud} in region {region!r} "
                     f"({', '.join(s.name for s in exact)} are not there); it is in: "
                     f"{', '.join(priced_first[:8])}{', ...' if len(priced_first) > 8 else ''}; pass --region")


def _rank(s: S, region: str, market: str, price_of: PriceOf[S]) -> tuple[int, Decimal, int, int, str]:
    p = price_of(s, region, market)
    # unpriced here: a shape sold in this market somewhere (p5en) before one never priced in it (p5e,
    # capacity blocks only), then the fewest vCPUs
    elsewhere = p is not None or any(price_of(s, r, market) is not None for r in s.regions)
    return (0 if p is not None else 1, p if p is not None else Decimal(0), 0 if elsewhere else 1, s.vcpus, s.name)


def pick(cloud: str, gpu: str, count: int, region: str, shapes: Sequence[S], price_of: PriceOf[S], *,
         market: str = "on-demand", catalog: Catalog | None = None) -> S:
    """The cheapest of `shapes` with `count` x `gpu` offered in `region` (unpriced ones after the
    priced, fewest vCPUs first); SpecError naming what exists otherwise."""
    carrying = [s for s in shapes if s.gpu_model == gpu]
    if not carrying:
        raise _not_offered(cloud, gpu, shapes, catalog)
    exact = [s for s in carrying if s.gpus == count]
    if not exact:
        raise _no_such_count(cloud, gpu, count, carrying)
    here = [s for s in exact if region in s.regions]
    if not here:
        raise _not_in_region(cloud, gpu, count, region, exact, price_of, market)
    return min(here, key=lambda s: _rank(s, region, market, price_of))
