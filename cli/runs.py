"""`gpucluster runs` and `show`: the ledger's runs, listed and one by one."""

from __future__ import annotations

import json

import click

from gpucluster.cli.common import console as _console
from gpucluster.cli.complete import complete_run_id
from gpucluster.infra.registry import NAMES as CLOUDS
from gpucluster.states import RunStatus


@click.command()
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 100000))
@click.option("--cloud", default=None, type=click.Choice(CLOUDS))
@click.option("--status", default=None, type=click.Choice([s.value for s in RunStatus]))
@click.option("--json", "as_json", is_flag=True, help="JSON list for scripts.")
def runs(limit, cloud, status, as_json):
    """List recorded runs, newest first.

    \b
    Example:
      gpucluster runs --limit 5
    """
    from gpucluster.api.records import runs as listed
    from gpucluster.ledger.store import Ledger

    ledger = Ledger.open_default()
    rows = listed(limit, cloud=cloud, status=status, ledger=ledger)  # the one path: gpucluster.runs (api/records.py)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in rows], indent=2, default=str))
        return 0
    from gpucluster.cli.render import fmt_secs, fmt_time

    orphans: set[str] = set()
    if any(r.status == RunStatus.RUNNING for r in rows):  # its process is gone: "orphaned", not running for ever
        from gpucluster.lifecycle.teardown import orphaned_runs

        orphans = {str(r.id) for r in orphaned_runs(ledger)}
    cells = []
    for r in rows:
        m = r.metrics or {}
        acc = f"{m['accuracy']:.2%}" if m.get("accuracy") is not None else "-"
        c = r.cost or {}
        from gpucluster.costing.cost import money

        cost = money(c["total"]) if c.get("total") is not None else "-"
        cells.append([r.id, fmt_time(r.created_at), r.cloud, r.cluster, str(r.nodes),
                      r.workload or "-", "orphaned" if r.id in orphans else r.status, fmt_secs(r.wall_s), acc, cost])
    con = _console()
    from gpucluster.cli.tables import Col, fitted

    # the run id and the cluster name are typed next: never cut; at 80 columns the others wrap or go
    t = fitted(con.width, [Col("run", keep=True), Col("started (UTC)", drop=7), Col("cloud", drop=4),
                           Col("cluster", keep=True), Col("nodes", drop=5), Col("job", drop=2), Col("status"),
                           Col("wall", drop=3), Col("accuracy", drop=6), Col("cost", drop=1)], cells)
    if not rows:
        con.print("no runs recorded yet: try 'gpucluster run --cloud local --nodes 2'")
    else:
        con.print(t)
    return 0


@click.command()
@click.argument("run_id", shell_complete=complete_run_id)
@click.option("--json", "as_json", is_flag=True, help="The whole record as JSON (metrics included).")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False),
              help="Write GPU/CPU utilisation over time (one line per node) to this PNG.")
def show(run_id, as_json, plot_path):
    """Show one run: phases, nodes, metrics, resources, teardown verdict, cost.

    \b
    Example:
      gpucluster show r20261122-031500-1a2b3c
      gpucluster show r20261122-031500-1a2b3c --plot util.png
    """
    from gpucluster.ledger.store import Ledger

    if plot_path:
        from gpucluster.costing.plots import check_plot_file

        check_plot_file(plot_path, "--plot file")  # before anything is read or drawn
    from gpucluster.api.records import show as shown

    ledger = Ledger.open_default()
    run = shown(run_id, metrics=as_json, ledger=ledger)  # gpucluster.show: a recovered chain with its attempts
    if plot_path:
        from gpucluster.costing.plots import plot_run

        written = plot_run(ledger, run.id or run_id, plot_path)
        click.echo(f"utilisation plot: {written}", err=as_json)
    if as_json:
        click.echo(json.dumps(run.to_dict(), indent=2, default=str))
        return 0
    from gpucluster.cli.render import run_report

    con = _console()
    run_report(con, run)
    if run.resources:
        from rich.table import Table

        t = Table(title="resources", show_edge=False, title_justify="left")
        for col in ("kind", "name", "id", "gone"):
            t.add_column(col)
        for r in run.resources:
            t.add_row(r.kind, r.name, r.cloud_id or "-", "yes" if r.confirmed_gone else "NO")
        con.print(t)
    return 0
