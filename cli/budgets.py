"""Budgets on the command line (gpucluster/costing/budget.py): the check before `run`, `up` and `sweep`
create anything, the override recorded with the run, and `cost report`'s standing per period."""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpucluster.costing.teambudget import Store
    from gpucluster.costing.budget import Standing
    from gpucluster.lifecycle.prepare import Prepared
    from gpucluster.states import JsonObject
    from gpucluster.ledger.store import Ledger

OVER_BUDGET: dict[str, Any] = dict(is_flag=True, help="Start even when the estimate takes a budgeted period (config.yaml `budget:`, "
                                      "or the team's in the shared state: `gpucluster budget`) past its budget; "
                                      "recorded with the run.")


def standing(ledger: Ledger, now: float | None = None) -> list[Standing]:
    """Each budgeted period of the user config with what this ledger's runs spent in it ([] without a budget)."""
    from gpucluster.costing.budget import standings
    from gpucluster.plan.userconfig import load_config

    budget = load_config().budget
    if not budget:
        return []

    def spent_since(since: float) -> Decimal:
        from gpucluster.cli.cost import _plugins_of
        from gpucluster.costing.cost import report

        links = ledger.resume_links()  # what accrued since the period's start, a run across it in part
        got = (ledger.get_run(r.id, links=links) for r in ledger.list_runs(limit=None, billed_since=since))
        runs = [rec for rec in got if rec is not None]  # a run deleted since the list (`runs --prune`) costs nothing
        return Decimal(report(runs, backends=_plugins_of(r.run.cloud for r in runs), since=since, now=now)["total"])

    return standings(budget, spent_since, now)


def check_budget(ledger: Ledger, estimate: Decimal | None, max_cost: float | None, over_budget: bool,
                 runs: int = 1) -> list[str]:
    """Before anything is created: a UsageError (exit 2) when this run's estimate (its --max-cost
    when that is lower; `runs` times it for a sweep) takes a budgeted period past its budget, unless
    `over_budget`; the warning lines to say (and record) when it does with the override."""
    from gpucluster.costing.budget import check

    found = standing(ledger)
    if not found or estimate is None:
        return []
    est = Decimal(str(estimate)) * runs
    if max_cost is not None:
        est = min(est, Decimal(str(max_cost)))
    return check(found, est, over_budget=over_budget)


def record_override(ledger: Ledger, run_id: str, lines: list[str]) -> None:
    """`--over-budget` used past a budget: a `budget` record with the run (what `show` and the ledger keep)."""
    from gpucluster.costing.budget import BUDGET_KIND
    from gpucluster.errors import GpuclusterError

    if lines:
        try:
            ledger.add_metrics(run_id, [(None, {"kind": BUDGET_KIND, "over_budget": True, "lines": lines})])
        except GpuclusterError:
            pass


# -- the team's budget in the shared state (gpucluster/costing/teambudget.py) ---------------------------------
def team_store(url: str | None = None) -> Store | None:
    """The objects beside the shared state (`url`, else the state chosen: --state, GPUCLUSTER_STATE,
    ...), or None where there is no shared state of a kind that can keep them (the home's own, Pulumi Cloud)."""
    from gpucluster.infra.pulumi.objects import open_store
    from gpucluster.infra.pulumi.state import chosen

    url = url or chosen()[0]
    if not url or not url.startswith(("s3://", "gs://", "file://")):
        return None
    return open_store(url)


def claim_team(plan: Prepared, *, key: str, kind: str, max_cost: float | None, over_budget: bool, runs: int = 1) -> list[str]:
    """Before the run creates anything: its open spend record in the shared state, checked against the
    team's budget with every member's (`teambudget.claim`: UsageError, exit 2, unless `over_budget`)."""
    import time

    from gpucluster.ownership import installation_id, user_and_host
    from gpucluster.costing.teambudget import claim, open_record

    store = team_store()
    if store is None or plan.estimate is None:
        return []
    est = Decimal(str(plan.estimate.total)) * runs
    if max_cost is not None:
        est = min(est, Decimal(str(max_cost)))
    now = time.time()
    lifetime = plan.spec.max_lifetime_minutes
    user, host = user_and_host()
    record = open_record(run_id=key, kind=kind, owner=installation_id(), who=f"{user}@{host}", cloud=plan.spec.cloud,
                         cluster=plan.spec.name, reserve=est, hourly=plan.hourly,
                         until=now + float(lifetime) * 60 * runs if lifetime else None, over_budget=over_budget,
                         now=now)
    return claim(store, record, over_budget=over_budget, now=now)


def settle_team(ledger: Ledger, key: str, run_ids: list[str], url: str | None = None) -> None:
    """The run (a sweep's runs, a kept cluster's maker at `down`) has ended: its spend record gets the
    cost lines of its report (`teambudget.settle`); nothing where it has no open record."""
    from gpucluster.cli.cost import _plugins_of
    from gpucluster.costing.runcost import run_cost
    from gpucluster.errors import GpuclusterError
    from gpucluster.costing.teambudget import settle

    try:
        store = team_store(url)
        if store is None:
            return
        lines: list[JsonObject] = []
        for rid in run_ids:
            record = ledger.get_run(rid)
            if record is not None and record.run.cloud:
                lines += run_cost(record, backend=_plugins_of([record.run.cloud]).get(record.run.cloud))["lines"]
        settle(store, key, lines, sum((Decimal(str(ln.get("cost") or 0)) for ln in lines), Decimal(0)))
    except GpuclusterError as exc:  # the run has ended whatever the state says: said, and left open there
        import click

        click.echo(f"gpucluster: warning: the team's spend record of {key} could not be ended in the shared state "
                   f"({exc}); it counts at its estimate until `gpucluster budget forget {key}`", err=True)


TEAM_KIND = "team_spend"  # a kept cluster's run: the key of its open spend record in the shared state, for `down`


def remember_team(ledger: Ledger, run_id: str, key: str) -> None:
    """A cluster left up (`up`, `run --keep`): where its open spend record is, so `down` can end it."""
    from gpucluster.errors import GpuclusterError
    from gpucluster.infra.pulumi.state import chosen

    url = chosen()[0]
    if url and url.startswith(("s3://", "gs://", "file://")):
        try:
            ledger.add_metrics(run_id, [(None, {"kind": TEAM_KIND, "key": key, "state": url})])
        except GpuclusterError:
            pass


def settle_kept(ledger: Ledger, cluster: str) -> None:
    """`down` of a cluster whose resources are all confirmed gone: the open spend record of the run that
    left it up ends with that run's cost (in the state it was written to)."""
    for run in ledger.list_runs(limit=None):
        if run.cluster != cluster:
            continue
        for rec in ledger.metrics(run.id, kind=TEAM_KIND):
            settle_team(ledger, str(rec.get("key")), [run.id], url=str(rec.get("state") or "") or None)
