"""Billing arithmetic, the same before a run (estimates) and after it (run costs).

Every amount is a `Decimal` in USD; each resource's cost is kept to nano-dollars and totals are
sums of those. `money` is the one display format of an amount."""

from __future__ import annotations

import datetime as _dt
import re
import time
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal
from typing import Any

MINIMUM_SECONDS = 60
MONTH_HOURS = 730
NANO = Decimal("0.000000001")
CENT = Decimal("0.01")
CATEGORIES = ("instances", "gpus", "disks", "public IPv4", "cluster fee")
ZONE_RE = re.compile(r"^([a-z]+-[a-z]+\d+)-[a-z]$")  # us-central1-a
_AZ_RE = re.compile(r"^([a-z]{2}(?:-gov)?-[a-z]+-\d)[a-z]$")  # us-east-1a


def billed_seconds(seconds: float | Decimal, minimum: int = MINIMUM_SECONDS) -> int:
    """Whole seconds billed for a life of `seconds`: rounded up, at least `minimum` if it existed."""
    if seconds is None or seconds < 0:
        raise ValueError(f"a resource life of {seconds!r} s is not possible")
    if seconds == 0:
        return 0
    whole = int(Decimal(str(seconds)).to_integral_value(rounding=ROUND_CEILING))
    return max(whole, minimum)


def time_cost(hourly: Decimal, seconds: float | Decimal, count: Decimal | int = 1,
              minimum: int = MINIMUM_SECONDS) -> tuple[int, Decimal]:
    """(billed seconds, cost) of `count` units priced per hour for a life of `seconds`."""
    billed = billed_seconds(seconds, minimum)
    return billed, (Decimal(count) * hourly * billed / 3600).quantize(NANO, ROUND_HALF_UP)


def disk_cost(gb_month: Decimal, gb: Decimal | int, seconds: float | Decimal) -> tuple[int, Decimal]:
    """(billed seconds, cost) of `gb` GB for a life of `seconds` at a GB-month price (730 h)."""
    billed = billed_seconds(seconds, 0)
    return billed, (gb_month * Decimal(gb) * billed / (MONTH_HOURS * 3600)).quantize(NANO, ROUND_HALF_UP)


def money(value: object) -> str:
    """'$1,234.57' (rounded half up to cents) for display; 'n/a' for None. Accepts a Decimal, or
    a number or string that is turned into one exactly."""
    if value is None:
        return "n/a"
    if not isinstance(value, Decimal):
        value = Decimal(str(value))
    return f"${value.quantize(CENT, ROUND_HALF_UP):,}"


def region_of(location: str | None) -> str | None:
    """A zone (us-central1-a, us-east-1a) reduced to its region; anything else as it is."""
    if not location:
        return location
    for rx in (ZONE_RE, _AZ_RE):
        m = rx.match(location)
        if m:
            return m.group(1)
    return location


def iso(now: float | None = None) -> str:
    return _dt.datetime.fromtimestamp(now if now is not None else time.time(), _dt.timezone.utc).isoformat(
        timespec="seconds")
