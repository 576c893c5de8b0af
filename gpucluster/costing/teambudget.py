"""A team's budget, kept in the shared state (`--state URL`) with every member's spend (docs/cost.md,
"Team budgets"). No member's ledger is visible to another, so what the team spent is what its
members write beside the state, under `<state URL>/.gpucluster/` (`infra/pulumi/objects.py`):

    budget.json                 {"daily"|"weekly"|"monthly": USD, "set_by", "set_at"}   (`budget set`)
    spend/open/RUN_ID.json      a run (or a sweep, or a kept cluster) that has started and not ended
    spend/ended/RUN_ID.json     the same record once it ended, with the cost lines of its report

A record is written by the run it describes (and, for a kept cluster, by `down`): one writer per
object, so members never overwrite each other's. It holds who (owner id, user@host), the run's
start, its hourly price and its estimate (`reserve`: the plan's for its --max-minutes or lifetime,
or its --max-cost when lower), and once ended its cost lines (each with its billed life, as the
report computes it: `costing/periods.py`).

What a record counts in a period (the same split as a home's runs):
- ended: its lines, each split by the seconds of its life in the period;
- open: the larger of its reserve and what it has cost at its hourly price up to now (at most up to
  its `until`, the nodes' own lifetime): a run counts at what it may cost until it has ended, as if
  billing at its hourly price from its start. An open record whose writer died counts that forever
  after (bounded by `until`): `budget show` names it, `budget forget RUN_ID` removes it.

The check before a run (`claim`): the run's own open record is written first, then every record is
listed and read, and the run is refused (its record deleted) when what the others count in a
period plus its estimate passes the period's budget. Two members starting at once: each writes
before it reads, so with a store whose list is strongly consistent after a write (S3, GCS, a local
file system) the later of the two to list sees the other's record: they cannot both pass when
together they would exceed the budget (both may be refused; start one again). A store whose list
lags (an NFS `file://` with attribute caching) can hide a record written within that lag: then the
budget can be exceeded by at most the estimates of the runs started within it. A budget changed
by two members at once: the last write wins.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Mapping, Protocol

from gpucluster.costing.budget import PERIODS, Standing, period_start
from gpucluster.costing.periods import accrued_between, share
from gpucluster.errors import UsageError
from gpucluster.states import JsonMapping, JsonObject

BUDGET, OPEN, ENDED = "budget.json", "spend/open", "spend/ended"
VERSION = 1


class Store(Protocol):
    """The objects beside a shared state (`infra/pulumi/objects.py`)."""

    def put(self, name: str, data: bytes) -> None: ...

    def get(self, name: str) -> bytes | None: ...

    def delete(self, name: str) -> None: ...

    def list(self, prefix: str) -> list[tuple[str, float]]: ...


def _json(data: bytes | None) -> JsonObject | None:
    try:
        got = json.loads(data) if data else None
    except ValueError:
        return None
    return got if isinstance(got, dict) else None


def read_budget(store: Store) -> dict[str, float]:
    """The team's budget ({} when none is set)."""
    got = _json(store.get(BUDGET)) or {}
    out = {}
    for p in PERIODS:
        try:
            if got.get(p) is not None and float(got[p]) > 0:
                out[p] = float(got[p])
        except (TypeError, ValueError):
            pass
    return out


def write_budget(store: Store, budget: Mapping[str, float], who: str, now: float | None = None) -> None:
    store.put(BUDGET, json.dumps({**{p: budget[p] for p in PERIODS if p in budget}, "set_by": who,
                                  "set_at": time.time() if now is None else now}).encode())


def records(store: Store, since: float) -> list[JsonObject]:
    """Every open record, and the ended ones last written at or after `since` (an ended record written
    before a period began accrued nothing in it); one per run, the ended one where both exist."""
    found: dict[str, JsonObject] = {}
    for name, _ in store.list(OPEN):
        rec = _json(store.get(name))
        if rec and rec.get("run_id"):
            found[str(rec["run_id"])] = rec
    for name, modified in store.list(ENDED):
        if modified < since:
            continue
        rec = _json(store.get(name))
        if rec and rec.get("run_id"):
            found[str(rec["run_id"])] = rec
    return list(found.values())


def _dec(value: object) -> Decimal:
    try:
        return Decimal(str(value)) if value not in (None, "") else Decimal(0)
    except InvalidOperation:
        return Decimal(0)


def counted(rec: JsonMapping, start: float, now: float) -> Decimal:
    """What one record counts from `start` (a period's start) up to `now` (see the module docstring)."""
    started = float(rec.get("started") or 0)
    if rec.get("ended") is not None:
        return accrued_between({"lines": rec.get("lines") or [], "total": rec.get("total")}, start, None,
                               started=started)
    hourly, reserve = _dec(rec.get("hourly")), _dec(rec.get("reserve"))
    until = float(rec.get("until") or now)
    so_far = hourly * Decimal(str(max(0.0, min(now, until) - started) / 3600))
    amount = max(reserve, so_far)
    if not hourly:
        return amount if start <= started or started == 0 else Decimal(0)
    end = started + float(amount / hourly * 3600)  # as if billing at its hourly price from its start
    return share(amount, started, end, start, None)


def standings(store: Store, budget: Mapping[str, float], now: float | None = None,
              leave_out: str | None = None) -> list[Standing]:
    """Each period of the team's budget with what its members' records count in it (`leave_out`: a
    run's own record, while it is checked)."""
    now = time.time() if now is None else now
    starts = {p: period_start(p, now) for p in PERIODS if p in budget}
    if not starts:
        return []
    found = [r for r in records(store, min(starts.values())) if r.get("run_id") != leave_out]
    return [Standing(p, Decimal(str(budget[p])), sum((counted(r, s, now) for r in found), Decimal(0)), s)
            for p, s in starts.items()]


@dataclass(frozen=True)
class Claim:
    """A run's own open record in the team's spend (what `settle` ends)."""

    run_id: str
    kind: str  # run, sweep, up


def open_record(*, run_id: str, kind: str, owner: str, who: str, cloud: str, cluster: str, reserve: Decimal,
                hourly: Decimal | None, until: float | None, over_budget: bool, now: float) -> JsonObject:
    return {"version": VERSION, "run_id": run_id, "kind": kind, "owner": owner, "who": who, "cloud": cloud,
            "cluster": cluster, "started": now, "reserve": str(reserve), "hourly": str(hourly or 0),
            "until": until, "over_budget": over_budget, "ended": None}


def claim(store: Store, record: JsonObject, *, over_budget: bool, now: float | None = None) -> list[str]:
    """Write the run's open record, then check the team's budget with everyone else's: a UsageError
    (exit 2; the record deleted) when its reserve takes a period past the budget, unless
    `over_budget` (then one warning line each, returned)."""
    from gpucluster.costing.budget import check

    now = time.time() if now is None else now
    budget = read_budget(store)
    if not budget:
        return []
    store.put(f"{OPEN}/{record['run_id']}.json", json.dumps(record).encode())
    try:
        found = standings(store, budget, now, leave_out=str(record["run_id"]))
        lines = [line.replace("the ", "the team's ", 1) for line in
                 check(found, _dec(record["reserve"]), over_budget=True)]
        if lines and not over_budget:
            raise UsageError(f"{lines[0].split(': ', 1)[1]}: not started (give --over-budget to start it anyway; it is "
                             "recorded)")
    except BaseException:
        store.delete(f"{OPEN}/{record['run_id']}.json")
        raise
    return lines


def settle(store: Store, run_id: str, lines: list[JsonObject], total: Decimal, now: float | None = None) -> bool:
    """The run has ended: its record written again under `ended/` with its cost lines (their billed
    lives), then the open one deleted. False when there was no open record (no team budget then)."""
    rec = _json(store.get(f"{OPEN}/{run_id}.json"))
    if rec is None:
        return False
    keep = [{"cost": ln.get("cost"), "from": ln.get("from"), "to": ln.get("to")} for ln in lines
            if _dec(ln.get("cost"))]
    rec.update(ended=time.time() if now is None else now, lines=keep, total=str(total))
    store.put(f"{ENDED}/{run_id}.json", json.dumps(rec).encode())
    store.delete(f"{OPEN}/{run_id}.json")
    return True


def forget(store: Store, run_id: str) -> None:
    """`budget forget RUN_ID`: an open record whose run will never end it (its process died)."""
    if store.get(f"{OPEN}/{run_id}.json") is None:
        raise UsageError(f"no open spend record for run {run_id!r} in the shared state (`gpucluster budget show` "
                         "lists them)")
    store.delete(f"{OPEN}/{run_id}.json")
