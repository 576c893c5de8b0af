"""Budgets (docs/cost.md, "Budgets"): `budget:` in config.yaml sets what this home may spend per
period, in US dollars:

    budget:
      daily: 50
      monthly: 800

A period is the UTC day, the ISO week (from Monday 00:00 UTC) or the calendar month (UTC). What
was spent in it is what `cost report --since START` totals: what the ledger's runs accrued in the
period (finished ones from their stored cost, running ones from what they have cost so far; a run
that started earlier, its part in the period: costing/periods.py). A team's budget in the shared
state is gpucluster/costing/teambudget.py. `run`, `up` and `sweep` refuse (exit 2, nothing created) a run whose estimate would take a
period past its budget, naming what was spent, what remains and the estimate, unless
`--over-budget` is given; that override is recorded with the run (a `budget` metric record).
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Callable, Iterable, Mapping

from gpucluster.errors import UsageError
from gpucluster.states import JsonObject

PERIODS = ("daily", "weekly", "monthly")
BUDGET_KIND = "budget"


def period_start(period: str, now: float | None = None) -> float:
    """The start (UTC, epoch seconds) of the period `now` is in."""
    at = dt.datetime.fromtimestamp(time.time() if now is None else now, dt.timezone.utc)
    day = at.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "daily":
        start = day
    elif period == "weekly":
        start = day - dt.timedelta(days=day.weekday())
    elif period == "monthly":
        start = day.replace(day=1)
    else:
        raise ValueError(period)
    return start.timestamp()


@dataclass(frozen=True)
class Standing:
    period: str
    limit: Decimal
    spent: Decimal
    since: float

    @property
    def left(self) -> Decimal:
        return self.limit - self.spent

    def to_dict(self) -> JsonObject:
        return {"period": self.period, "budget": str(self.limit), "spent": str(self.spent),
                "remaining": str(self.left), "since": dt.datetime.fromtimestamp(self.since, dt.timezone.utc)
                .isoformat(timespec="seconds")}


def standings(budget: Mapping[str, float], spent_since: Callable[[float], Decimal],
              now: float | None = None) -> list[Standing]:
    """Each budgeted period with what was spent in it so far (`spent_since(start)`: the report's total)."""
    return [Standing(p, Decimal(str(budget[p])), spent_since(period_start(p, now)), period_start(p, now))
            for p in PERIODS if p in budget]


def check(standing: Iterable[Standing], estimate: Decimal | None, *, over_budget: bool) -> list[str]:
    """The periods this run's `estimate` would take past their budget: a UsageError (exit 2) naming
    the first, or, with `over_budget`, one warning line each (returned)."""
    if estimate is None:
        return []
    lines = []
    for s in standing:
        if s.spent + estimate > s.limit:
            lines.append(f"the {s.period} budget is ${s.limit:,.2f}: ${s.spent:,.2f} spent since "
                         f"{dt.datetime.fromtimestamp(s.since, dt.timezone.utc):%Y-%m-%d %H:%M} UTC, "
                         f"${max(s.left, Decimal(0)):,.2f} remaining, and this run's estimate is ${estimate:,.2f}")
    if lines and not over_budget:
        raise UsageError(f"{lines[0]}: not started (give --over-budget to start it anyway; it is recorded)")
    return [f"over budget (--over-budget): {line}" for line in lines]


def parse_budget(value: object, where: str) -> dict[str, float]:
    """config.yaml's `budget:` mapping, checked: period -> USD > 0."""
    from gpucluster.errors import ConfigError, did_you_mean

    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: a mapping of periods ({', '.join(PERIODS)}) to US dollars, e.g. daily: 50")
    out = {}
    for period, amount in value.items():
        if period not in PERIODS:
            raise ConfigError(f"{where}.{period}: unknown period{did_you_mean(str(period), PERIODS)}; allowed: "
                              f"{', '.join(PERIODS)}")
        try:
            number = float(str(amount))
        except ValueError:
            number = float("nan")
        if not number > 0 or number == float("inf"):
            raise ConfigError(f"{where}.{period}: {amount!r} is not allowed: US dollars > 0, e.g. 50")
        out[str(period)] = number
    return out
