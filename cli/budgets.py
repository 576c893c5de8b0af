"""Budgets on the command line (gpucluster/budget.py): the check before `run`, `up` and `sweep`
create anything, the override recorded with the run, and `cost report`'s standing per period."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

OVER_BUDGET: dict[str, Any] = dict(is_flag=True, help="Start even when the estimate takes a budgeted period (config.yaml `budget:`) "
                                      "past its budget; recorded with the run.")


def standing(ledger: Any, now: float | None = None) -> list[Any]:
    """Each budgeted period of the user config with what this ledger's runs spent in it ([] without a budget)."""
    from gpucluster.budget import standings
    from gpucluster.userconfig import load_config

    budget = load_config().budget
    if not budget:
        return []

    def spent_since(since: float) -> Decimal:
        from gpucluster.cli.cost import _plugins_of
        from gpucluster.cost import report

        links = ledger.resume_links()  # what accrued since the period's start, a run across it in part
        runs = [ledger.get_run(r.id, links=links) for r in ledger.list_runs(limit=None, billed_since=since)]
        return Decimal(report(runs, backends=_plugins_of(r.run.cloud for r in runs), since=since, now=now)["total"])

    return standings(budget, spent_since, now)


def check_budget(ledger: Any, estimate: Decimal | None, max_cost: float | None, over_budget: bool,
                 runs: int = 1) -> list[str]:
    """Before anything is created: a UsageError (exit 2) when this run's estimate (its --max-cost
    when that is lower; `runs` times it for a sweep) takes a budgeted period past its budget, unless
    `over_budget`; the warning lines to say (and record) when it does with the override."""
    from gpucluster.budget import check

    found = standing(ledger)
    if not found or estimate is None:
        return []
    est = Decimal(str(estimate)) * runs
    if max_cost is not None:
        est = min(est, Decimal(str(max_cost)))
    return check(found, est, over_budget=over_budget)


def record_override(ledger: Any, run_id: str, lines: list[str]) -> None:
    """`--over-budget` used past a budget: a `budget` record with the run (what `show` and the ledger keep)."""
    from gpucluster.budget import BUDGET_KIND
    from gpucluster.errors import GpuclusterError

    if lines:
        try:
            ledger.add_metrics(run_id, [(None, {"kind": BUDGET_KIND, "over_budget": True, "lines": lines})])
        except GpuclusterError:
            pass
