"""A run's cost split across periods (docs/cost.md, "Budgets": "Across periods").

A run's cost (`run_cost`) is a list of lines, one per priced item of a resource, each with the
resource's billed life: `from` (creation requested) and `to` (deletion confirmed, or the time the
cost was computed while it still bills). What a line cost is split across periods in proportion
to the seconds of that life in each: a line of cost C living from a to b puts
C x |[a, b) n [p0, p1)| / (b - a) in the period [p0, p1); a line with no length (b <= a) is in the
period holding a. Its minimum-minute surcharge and its rounding follow the same shares, so the
shares of every period add up to the line's cost (to the nano-dollar each share is rounded to).

A stored cost from before the lines carried `from`/`to` has no lifetimes to split: it counts whole
in the period its run started in (`started`), as every cost did before.
"""

from __future__ import annotations

import datetime as dt
from decimal import ROUND_HALF_UP, Decimal
from typing import Iterator, Mapping

from .rules import NANO
from gpucluster.states import JsonMapping


def spans(cost: JsonMapping, started: float) -> Iterator[tuple[Decimal, float, float]]:
    """(cost, from, to) of each priced line of a run's cost; a line without its life: (cost, started, started)."""
    for line in cost.get("lines") or []:
        try:
            amount = Decimal(str(line.get("cost") or 0))
        except ArithmeticError:
            continue
        if not amount:
            continue
        a, b = line.get("from"), line.get("to")
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            yield amount, float(a), float(b)
        else:
            yield amount, started, started
    if not cost.get("lines") and cost.get("total") not in (None, "0"):  # a cost stored with its total alone
        try:
            total = Decimal(str(cost["total"]))
        except ArithmeticError:
            return
        if total:
            yield total, started, started


def accrued_between(cost: JsonMapping, start: float, end: float | None, *, started: float) -> Decimal:
    """What of a run's cost accrued in [start, end) (end None: up to any time)."""
    out = Decimal(0)
    for amount, a, b in spans(cost, started):
        out += share(amount, a, b, start, end)
    return out


def share(amount: Decimal, a: float, b: float, start: float, end: float | None) -> Decimal:
    """The part of `amount`, billed for a life from a to b, that falls in [start, end)."""
    hi = float("inf") if end is None else end
    if b <= a:
        return amount if start <= a < hi else Decimal(0)
    overlap = min(b, hi) - max(a, start)
    if overlap <= 0:
        return Decimal(0)
    if overlap >= b - a:
        return amount
    return (amount * Decimal(str(overlap)) / Decimal(str(b - a))).quantize(NANO, ROUND_HALF_UP)


def since(cost: JsonMapping, start: float | None, *, started: float) -> list[tuple[Decimal, float, float]]:
    """The run's spans cut at `start` (None: whole): what accrued from then on, with the life it accrued in."""
    out = []
    for amount, a, b in spans(cost, started):
        if start is not None and a < start:
            amount, a, b = share(amount, a, b, start, None), start, max(b, start)
        if amount:
            out.append((amount, a, b))
    return out


def by_day(cut: list[tuple[Decimal, float, float]]) -> dict[str, Decimal]:
    """{UTC day (YYYY-MM-DD): what of these spans (`since`) accrued that day}, days with nothing left out."""
    out: dict[str, Decimal] = {}
    for amount, a, b in cut:
        day = dt.datetime.fromtimestamp(a, dt.timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
        while True:
            p0 = day.timestamp()
            p1 = (day + dt.timedelta(days=1)).timestamp()
            part = share(amount, a, b, p0, p1)
            if part:
                key = day.strftime("%Y-%m-%d")
                out[key] = out.get(key, Decimal(0)) + part
            if b <= p1:
                break
            day += dt.timedelta(days=1)
    return out
