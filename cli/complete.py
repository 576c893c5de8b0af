"""Shell completion of run ids and cluster names (Click's `shell_complete` on the arguments).

Install (bash; zsh and fish have their own `_source` values, see Click's "Shell Completion"):

    eval "$(_GPUCLUSTER_COMPLETE=bash_source gpucluster)"

Completion reads the ledger read-only and never creates it: with no ledger there is nothing to offer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from click.shell_completion import CompletionItem

if TYPE_CHECKING:
    import click

    from gpucluster.ledger.store import Ledger


def _ledger() -> Ledger | None:
    from gpucluster.home import home_dir
    from gpucluster.ledger.store import Ledger

    path = home_dir(create=False) / "ledger.sqlite3"
    return Ledger(path) if path.is_file() else None


def complete_run_id(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Run ids starting with what was typed, newest first, with the run's cluster and status."""
    try:
        ledger = _ledger()
        if ledger is None:
            return []
        runs = ledger.list_runs(limit=200)
    except Exception:  # noqa: BLE001 - completion must never print a traceback into the shell
        return []
    return [CompletionItem(r.id, help=f"{r.cluster} {r.status}") for r in runs if r.id.startswith(incomplete)]


def complete_cluster(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Cluster names that may still exist (open ledger rows) first, then the others the ledger knows."""
    try:
        ledger = _ledger()
        if ledger is None:
            return []
        live = {row["cluster"] for row in ledger.open_resources()}
        known = list(dict.fromkeys(r.cluster for r in ledger.list_runs(limit=500)))
    except Exception:  # noqa: BLE001 - completion must never print a traceback into the shell
        return []
    names = sorted(live) + [c for c in known if c not in live]
    return [CompletionItem(c, help="may still exist" if c in live else "") for c in names if c.startswith(incomplete)]
