"""`gpucluster budget`: a team's budget kept in the shared state (gpucluster/costing/teambudget.py), with
what its members spent against it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from gpucluster.cli.cost import _boundary
from gpucluster.cli.options import options

if TYPE_CHECKING:
    from gpucluster.costing.teambudget import Store
    from gpucluster.states import JsonObject

_USD = "US dollars > 0, e.g. 500"


def _amount(flag: str, value: str | None) -> float | None:
    from gpucluster.errors import UsageError, not_allowed

    if value is None:
        return None
    try:
        number = float(value.strip().lstrip("$"))
    except ValueError:
        number = float("nan")
    if not 0 < number < 1e9:
        raise UsageError(not_allowed(flag, value, _USD))
    return number


def _store() -> Store:
    """The shared state's store, or the one-line refusal (exit 2) naming how to give one."""
    from gpucluster.cli.budgets import team_store
    from gpucluster.errors import UsageError
    from gpucluster.infra.pulumi.state import chosen

    url, _ = chosen()
    store = team_store(url) if url else None
    if url and store is None:
        from gpucluster.infra.pulumi.objects import open_store

        open_store(url)  # the one-line refusal naming the forms a team budget can use
    if store is None:
        raise UsageError("a team budget lives in a shared state: give --state s3://BUCKET[/PREFIX], gs://BUCKET[/PREFIX] "
                         "or file:///PATH (or GPUCLUSTER_STATE); a budget for this home alone is config.yaml's "
                         "`budget:`")
    return store


@click.group()
def budget() -> None:
    """A team's budget in the shared state (--state): set it, and see what the team spent against it."""


@budget.command("set")
@options("state")
@click.option("--daily", help="USD per UTC day.")
@click.option("--weekly", help="USD per ISO week (from Monday 00:00 UTC).")
@click.option("--monthly", help="USD per calendar month (UTC).")
@_boundary
def set_cmd(daily: str | None, weekly: str | None, monthly: str | None) -> None:
    """Set the team's budget per period (the periods given replace those; the others are kept).

    \b
    Example:
      gpucluster budget set --state s3://team-bucket/gpucluster --monthly 500 --daily 60
    """
    from gpucluster.errors import UsageError
    from gpucluster.ownership import user_and_host
    from gpucluster.costing.teambudget import read_budget, write_budget

    amounts = {p: _amount(f"--{p}", v) for p, v in (("daily", daily), ("weekly", weekly), ("monthly", monthly))}
    given = {p: v for p, v in amounts.items() if v is not None}
    if not given:
        raise UsageError("budget set: give at least one of --daily, --weekly, --monthly (US dollars)")
    store = _store()
    now = {**read_budget(store), **given}
    user, host = user_and_host()
    write_budget(store, now, f"{user}@{host}")
    click.echo("team budget: " + ", ".join(f"{p} ${v:,.2f}" for p, v in now.items()))


@budget.command("clear")
@options("state")
@_boundary
def clear_cmd() -> None:
    """Remove the team's budget (runs are no longer checked against it)."""
    _store().delete("budget.json")
    click.echo("team budget removed")


@budget.command("show")
@options("state", "as_json")
@_boundary
def show_cmd(as_json: bool) -> None:
    """The team's budget per period, what its members spent in each, and the runs still open."""
    store = _store()
    rep = standing_of(store)
    if as_json:
        click.echo(json.dumps(rep, indent=1))
        return
    for line in lines_of(rep):
        click.echo(line)


@budget.command("forget")
@click.argument("run_id")
@options("state")
@_boundary
def forget_cmd(run_id: str) -> None:
    """Remove a run's open spend record (a run whose process died: it counts at its estimate until then)."""
    from gpucluster.costing.teambudget import forget

    forget(_store(), run_id)
    click.echo(f"spend record of {run_id} removed")


def standing_of(store: Store, now: float | None = None) -> JsonObject:
    """{budget: [...per period], open: [...open records]} of the team (`budget show`, `cost report`)."""
    import time

    from gpucluster.costing.teambudget import counted, read_budget, records, standings

    now = time.time() if now is None else now
    found = standings(store, read_budget(store), now)
    opened = [r for r in records(store, now) if r.get("ended") is None]
    return {"budget": [s.to_dict() for s in found],
            "open": [{"run_id": r.get("run_id"), "kind": r.get("kind"), "who": r.get("who"), "cluster": r.get("cluster"),
                      "counted": str(counted(r, 0.0, now))} for r in opened]}


def lines_of(rep: JsonObject) -> list[str]:
    from decimal import Decimal

    from gpucluster.costing.cost import money

    if not rep["budget"]:
        return ["no team budget is set (gpucluster budget set --state URL --monthly USD)"]
    out = [f"Team budget ({b['period']}, since {b['since'][:16]} UTC): {money(Decimal(b['spent']))} spent of "
           f"{money(Decimal(b['budget']))}, {money(Decimal(b['remaining']))} remaining" for b in rep["budget"]]
    out += [f"  open: {o['run_id']} ({o['kind']}, {o['who']}, cluster {o['cluster']}): counted at "
            f"{money(Decimal(o['counted']))}" for o in rep["open"]]
    return out
