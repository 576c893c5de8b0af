"""`gpucluster prices` and `gpucluster cost`: thin Click layers over gpucluster.catalog.prices and
gpucluster.costing.cost. Only click is imported at module level; rich and the core are imported inside
the commands so `gpucluster --help` stays fast.

Domain errors (`GpuclusterError`) leave every command as a `click.ClickException` carrying the
error's exit code (2 for bad input), so the message is one line whether these groups are run by
`gpucluster.cli.main` or on their own.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ParamSpec, TypeVar

import click

if TYPE_CHECKING:
    from gpucluster.ledger.store import Ledger
    from rich.console import Console

    from gpucluster.states import JsonMapping, JsonObject


class CommandError(click.ClickException):
    """A GpuclusterError at the CLI boundary: its message (and hint) and its exit code."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        # click declares exit_code a ClassVar, yet reads it from the instance: each carries its own
        self.exit_code = exit_code  # type: ignore[misc]


P = ParamSpec("P")
R = TypeVar("R")


def _boundary(fn: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        from gpucluster.errors import GpuclusterError

        try:
            return fn(*args, **kwargs)
        except GpuclusterError as exc:
            raise CommandError(exc.message + (f"\nhint: {exc.hint}" if exc.hint else ""), int(exc.exit_code)) from None

    return wrapper


from gpucluster.cli.console import make_console as _console  # noqa: E402
from gpucluster.cli.options import Float, Int, options  # noqa: E402
from gpucluster.cli.taskopts import TaskCommand  # noqa: E402

MAX_GPUS = 16  # gpucluster.lifecycle.prepare.MAX_GPUS_PER_NODE, as `run --gpus-per-node` takes it


class _Hours(Float):
    """--hours: FLOAT RANGE in --help; a bad value is the one-line error with exit 2, also when this
    group runs on its own (a CommandError, as `_boundary` makes)."""

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        from gpucluster.errors import GpuclusterError

        try:
            return super().convert(value, param, ctx)
        except GpuclusterError as exc:
            raise CommandError(exc.message, int(exc.exit_code)) from None


def _warn(messages: list[str]) -> None:
    for msg in messages:
        click.echo(f"gpucluster: warning: {msg}", err=True)


def _dec(value: object, places: int = 4) -> str:
    from decimal import Decimal

    if value is None:
        return "-"
    d = Decimal(str(value))
    return f"{d.quantize(Decimal(1).scaleb(-places)).normalize():f}" if d else "0"


# -- prices ----------------------------------------------------------------------------------------
@click.group(invoke_without_command=True)
@click.option("--cloud", help="aws or gcp (default: both).")
@click.option("--region", help="Only this region (rows priced everywhere are kept).")
@click.option("--gpu", help="Only rows for this GPU (any case: H100, l4, nvidia-tesla-v100; `gpucluster gpus` lists them).")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON (prices as strings).")
@click.pass_context
@_boundary
def prices(ctx: click.Context, cloud: str | None, region: str | None, gpu: str | None, as_json: bool) -> None:
    """Show the price catalog: every row with its source and the date it was read.

    User prices fetched by `gpucluster prices refresh` override the shipped ones row by row.
    """
    if ctx.invoked_subcommand is not None:
        return
    from gpucluster.catalog.prices import load_catalog

    catalog = load_catalog()
    _warn(catalog.warnings)
    rows = catalog.select(cloud=cloud, region=region, gpu=gpu)
    if as_json:
        out = []
        for r in rows:
            d = r.to_dict()
            d["per_gpu_hour"] = None if r.per_gpu_hour is None else str(r.per_gpu_hour)
            d["origin"] = r.origin
            out.append(d)
        click.echo(json.dumps({"currency": "USD", "rows": out}, indent=1))
        return
    from rich.table import Table

    table = Table(title="gpucluster price catalog (USD)", show_lines=False)
    right = {"price", "GPUs", "$/GPU-hour"}
    for col in ("cloud", "region", "item", "market", "price", "unit", "GPUs", "$/GPU-hour", "read"):
        table.add_column(col, overflow="fold", justify="right" if col in right else "left")
    for r in rows:
        table.add_row(r.cloud, r.region, r.item, r.market, f"{r.price.normalize():f}", r.unit,
                      str(r.gpus or ""), _dec(r.per_gpu_hour, 4) if r.per_gpu_hour is not None else "",
                      r.date + (" (user)" if r.origin == "user" else ""))
    console = _console()
    console.print(table)
    sources = sorted({r.source for r in rows})
    console.print("Sources:", highlight=False)
    for s in sources:
        console.print(f"  - {s}", highlight=False)


@prices.command("refresh")
@click.option("--cloud", required=True, help="aws or gcp.")
@click.option("--region", "regions", multiple=True, help="Region to fetch (repeatable; default: the shipped ones).")
@_boundary
def prices_refresh(cloud: str, regions: tuple[str, ...]) -> None:
    """Fetch current prices from the cloud's price API into the user catalog.

    AWS: Price List API + spot price history (needs AWS credentials). GCP: Cloud Billing Catalog
    (needs application-default credentials). On failure the catalog in use is unchanged.
    """
    from gpucluster.catalog.prices import refresh
    from gpucluster.infra.registry import plugin, priced

    pricing = plugin(cloud).pricing if cloud in priced() else None  # the one lookup; refresh refuses the rest
    result = refresh(cloud, pricing, regions=list(regions) or None)
    click.echo(f"fetched {result['rows']} {cloud} price rows for {', '.join(result['regions'])} "
               f"(read {result['date']}) into {result['path']}")


# -- cost ------------------------------------------------------------------------------------------
@click.group()
def cost() -> None:
    """Estimate costs before a run, and report what runs cost."""


@cost.command("estimate", cls=TaskCommand)
@options("task_file", "cloud", "gpu", "instance_type", "gpus_per_node",
         task_file=dict(help="Price a task file's cluster (docs/tasks.md) for its limit (limits.max_minutes, else "
                             "limits.max_lifetime), as `run` does; flags given here win."),
         cloud=dict(default=None, show_default=False, help="aws, gcp (local and ssh cost $0)."),
         instance_type=dict(help="EC2 type (g5.*, p5.*, ...) or GCE machine type (n1-*, a3-*, ...); --gpu picks one."),
         gpus_per_node=dict(type=Int("gpus per node", 0, MAX_GPUS), help="GPUs per node (aws: what the type "
                            "carries; gcp: 1, 2, 4 or 8 V100)."))
@click.option("--gpus", "gpus", hidden=True, type=Int("gpus per node", 0, MAX_GPUS))  # the old spelling
@click.option("--nodes", metavar="N[,N...]", help="Node count, or a list (1,2,4,8) with --workload for a what-if "
              "projection.")
@click.option("--hours", default=None, type=_Hours("hours", "a number of hours above 0 (e.g. 0.5, 3)", 0, 24 * 366),
              help="Hours to price [default: 1; with a task file: its limit].")
@click.option("--spot/--on-demand", default=None, help="Spot (reference price) or on-demand.")
@options("disk_gb", "region", "zone", disk_gb=dict(default=None, show_default=False, help="Disk per node in GB "
                                                                                          "(default 100)."),
         region=dict(help="Region (default us-east-1 / us-central1)."),
         zone=dict(help="GCP zone: makes the GKE cluster zonal (free-tier eligible)."))
@click.option("--disk-type", help="gp3 (aws), pd-standard / pd-balanced / pd-ssd (gcp).")
@click.option("--stack", help="Read the spec from stacks/Pulumi.STACK.yaml (or a .yaml path); flags override it.")
@click.option("--free-tier", is_flag=True, help="GKE: the billing account's free zonal cluster covers the fee.")
@click.option("--workload", help="What-if: project from measured runs of this workload.")
@options("epochs", "as_json", "max_hourly", epochs=dict(help="What-if: epochs to project."), as_json=dict(help="Print JSON."))
@_boundary
def estimate_cmd(cloud, gpu, instance_type, gpus_per_node, gpus, nodes, hours, spot, disk_gb, region, zone, disk_type, stack,
                 free_tier, workload, epochs, as_json, max_hourly=None) -> None:
    """Itemized cost of a cluster for some hours, or (with --workload) a what-if projection.

    \b
    Examples:
      gpucluster cost estimate --cloud aws --instance-type g5.12xlarge --nodes 2 --hours 3 --disk-gb 200
      gpucluster cost estimate --stack aws-g5 --hours 2
      gpucluster cost estimate --nodes 1,2,4,8 --workload mnist --epochs 8
    """
    from gpucluster.api.clusters import estimate, parse_nodes
    from gpucluster.errors import UsageError

    gpus = gpus_per_node if gpus_per_node is not None else gpus
    node_list = parse_nodes(None if nodes is None else str(nodes), cloud)
    if workload is not None:
        if epochs is None:
            raise UsageError("--workload needs --epochs (how many epochs to project)")
        return _what_if(node_list or [1, 2, 4, 8], workload, epochs, cloud, instance_type, gpus, as_json)
    if epochs is not None:
        raise UsageError("--epochs is for what-if projections: give --workload too")
    if node_list is not None and len(node_list) > 1:
        raise UsageError(f"--nodes {nodes!r}: a list of node counts needs --workload and --epochs")
    from gpucluster.api.clusters import build_spec
    from gpucluster.cli.place import estimate_placed, wanted

    if wanted(cloud, region) or max_hourly is not None:  # the ranking `run --cloud auto` shows
        return estimate_placed(build_spec, cloud, region, max_hourly, as_json, hours, dict(
            gpu=gpu, instance_type=instance_type, gpus=gpus, nodes=node_list[0] if node_list else None, spot=spot,
            disk_gb=disk_gb, disk_type=disk_type, zone=zone, stack=None))
    # the one path: gpucluster.estimate's (api/clusters.py)
    est = estimate(cloud=cloud, nodes=nodes, gpu=gpu, instance_type=instance_type, gpus_per_node=gpus,
                   hours=hours, spot=spot, disk_gb=disk_gb, region=region, zone=zone,
                   disk_type=disk_type, stack=stack, free_tier=free_tier)
    if as_json:
        click.echo(json.dumps(est.to_dict(), indent=1))
        return
    render_estimate(est)


def render_estimate(est, console=None) -> None:
    """Print an Estimate as a table (also used by `gpucluster run`'s plan)."""
    from rich.table import Table

    from gpucluster.costing.cost import money

    console = console or _console()
    if not est.lines:
        console.print(f"Estimated cost: $0 ({'; '.join(est.notes)})", highlight=False)
        return
    table = Table(title=f"Estimate: {est.nodes} node(s), {est.cloud} {est.region}, {est.market}, "
                        f"{_dec(est.hours, 3)} h (USD)")
    right = {"unit price", "per hour", "total"}
    for col in ("item", "what", "unit price", "unit", "per hour", "total", "note"):
        table.add_column(col, overflow="fold", justify="right" if col in right else "left")
    for ln in est.lines:
        table.add_row(ln["category"], ln["description"], _dec(ln["unit_price"], 6), ln["unit"],
                      money_or_dash(ln["hourly"]), money_or_dash(ln["total"]), ln.get("note") or "")
    table.add_row("total", "", "", "", money(est.hourly), money(est.total), "", style="bold")
    console.print(table)
    if est.per_gpu_hour is not None:
        console.print(f"{est.gpus} GPU(s): ${_dec(est.per_gpu_hour, 4)} per GPU-hour (instances + GPUs)",
                      highlight=False)
    console.print(f"Prices read {est.price_date}; see `gpucluster prices` for their sources.", highlight=False)
    for note in est.notes:
        console.print(f"note: {note}", highlight=False)


def render_run_cost(cost: dict, console=None) -> None:
    """Print a run's cost (`gpucluster.costing.cost.run_cost` output) line by line, for run reports."""
    from decimal import Decimal

    from rich.table import Table

    from gpucluster.costing.cost import money

    console = console or _console()
    if cost.get("local"):
        total = f"${cost['total']} internal" if cost.get("internal") else "$0"  # the user's own price (kubernetes)
        console.print(f"Cost: {total} ({'; '.join(cost['notes'])})", highlight=False)
        return
    table = Table(title=f"Cost of run {cost.get('run_id') or ''} (USD, prices read {cost.get('price_date')})")
    for col in ("resource", "item", "what", "billed s", "cost", "note"):
        table.add_column(col, justify="right" if col in ("billed s", "cost") else "left", overflow="fold")
    for ln in cost["lines"]:
        if ln["category"] == "no charge":
            continue
        note = ln.get("note") or ""
        if ln.get("still_billing"):
            note = ("STILL BILLING; " + note).rstrip("; ")
        table.add_row(str(ln["resource"]), ln["category"], ln["description"], str(ln.get("billed_seconds", "")),
                      money(Decimal(ln["cost"])), note)
    table.add_row("total", "", "", "", money(Decimal(cost["total"])), "", style="bold")
    console.print(table)
    for note in cost.get("notes") or []:
        console.print(f"note: {note}", highlight=False)


def money_or_dash(value: str) -> str:
    from decimal import Decimal

    from gpucluster.costing.cost import money

    return money(value) if Decimal(value) else "-"


def _open_ledger():
    from gpucluster.ledger.store import Ledger

    return Ledger.open_default()


def _plugins_of(clouds) -> dict:
    """The plugins of the registered backends among `clouds` (those the ledger's runs name), by name:
    what the cost engine is given for records of any cloud."""
    from gpucluster.infra.registry import NAMES as CLOUDS, plugin

    return {c: plugin(c) for c in sorted({c for c in clouds if c in CLOUDS})}


def _what_if(node_list, workload, epochs, cloud, instance_type, gpus, as_json) -> None:
    from gpucluster.costing.cost import what_if
    from gpucluster.infra.registry import NAMES as CLOUDS, traits

    ledger = _open_ledger()
    try:
        runs = ledger.list_runs(limit=None)
        named = [r.cloud or (r.spec or {}).get("cloud") for r in runs if r.workload == workload]
        result = what_if(runs, node_list, workload, epochs, cloud=cloud, instance_type=instance_type,
                         gpus_per_node=gpus, backends=_plugins_of(named),
                         max_nodes=max(traits(c).max_nodes for c in CLOUDS))
    finally:
        ledger.close()
    if as_json:
        click.echo(json.dumps(result, indent=1, default=str))
        return
    from rich.table import Table

    from gpucluster.costing.cost import money
    from decimal import Decimal

    table = Table(title=f"What-if: {workload}, {result['epochs']} epochs on {result['shape']}")
    for col in ("nodes", "basis", "s/epoch", "train s", "wall s", "efficiency", "per hour", "cost"):
        table.add_column(col, justify="right" if col not in ("basis",) else "left")
    for p in result["projection"]:
        if p.get("basis") is None:
            table.add_row(str(p["nodes"]), "unknown", "", "", "", "", "", p["note"])
            continue
        table.add_row(str(p["nodes"]), p["basis"], f"{p['epoch_s']:.2f}", f"{p['train_s']:.1f}", f"{p['wall_s']:.1f}",
                      f"{p['efficiency']:.0%}", money(Decimal(p["hourly"])), money(Decimal(p["cost"])))
    console = _console()
    console.print(table)
    console.print("Measured (median per node count): " + "; ".join(
        f"{m['nodes']} node(s) {m['epoch_s']:.2f} s/epoch, efficiency {m['efficiency']:.0%}, runs {', '.join(m['runs'])}"
        for m in result["measured"]), highlight=False)
    if result["fit"]:
        console.print(f"Fitted: epoch time ~ nodes^{result['fit']['exponent']:.2f} "
                      "(-1 = perfect scaling, 0 = none, > 0 = more nodes are slower)", highlight=False)


def report_of(ledger: Ledger, *, cloud: str | None = None, since_ts: float | None = None, group_by: str | None = None,
              project: str | None = None, team: bool = False) -> JsonObject:
    """What `cost report` shows (`gpucluster.costing.cost.report` over the ledger's runs, a recovered chain's
    attempts, config.yaml's budgets), for the command and the dashboard's costs page alike."""
    from gpucluster.costing.cost import report
    from gpucluster.errors import UsageError

    links = ledger.resume_links()  # once: read per run it made the report quadratic in the runs
    got = (ledger.get_run(r.id, links=links) for r in ledger.list_runs(limit=None, cloud=cloud, billed_since=since_ts))
    runs = [rec for rec in got if rec is not None]  # a run deleted since the list (`runs --prune`) is in no report
    if project is not None:
        from gpucluster.infra.registry import project_id, traits

        if cloud is not None and "project" not in traits(cloud).flags:
            raise UsageError(f"--project {project} does not apply to --cloud {cloud}: it names a GCP project "
                             "(give it with --cloud gcp, or without --cloud)")

        project = project_id(project)
        runs = [r for r in runs if r.run.project == project]
    rep = report(runs, backends=_plugins_of(r.run.cloud for r in runs), group_by=group_by,
                 links=links if group_by == "chain" else None, since=since_ts)
    if group_by == "chain":  # a recovered chain: its attempts (what interrupted each, what was redone)
        from gpucluster.ledger.attempts import chain_attempts

        for g in rep["groups"]:
            rows = chain_attempts(ledger, g["run_ids"], links) if len(g["run_ids"]) > 1 else []
            if any(r.get("interruption") for r in rows):
                g["attempts"] = rows
    _add_budgets(rep, ledger, team)
    return rep


def _add_budgets(rep: JsonObject, ledger: Ledger, team: bool) -> None:
    """config.yaml's budgets, and (`team`) the shared state's team budget: keys only where one is set."""
    from gpucluster.cli.budgets import standing

    budgets = [b.to_dict() for b in standing(ledger)]  # config.yaml's budget: spent against it
    if budgets:  # a key only where a budget is set: the JSON without one stays as it was
        rep["budget"] = budgets
    from gpucluster.cli.budgets import team_store

    store = team_store() if team else None  # the shared state's team budget (--state): every member's spend
    if store is not None:
        from gpucluster.cli.team import standing_of

        shared = standing_of(store)
        if shared["budget"]:
            rep["team_budget"] = shared


@cost.command("report")
@click.option("--since", help="What accrued on/after this date (YYYY-MM-DD, UTC): runs started since, and the part "
              "of an earlier run that billed since.")
@click.option("--cloud", help="Only runs on this cloud: aws, gcp, local, ssh.")
@click.option("--group-by", "group_by", help="Subtotals by day, cloud, cluster or chain (a run and every run "
              "resumed from it with --resume, transitively: one job, with its run ids).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (amounts as exact decimal strings).")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV, one row per run.")
@click.option("--plot", "plot", type=click.Path(dir_okay=False), help="Write a PNG of cost and wall time per run.")
@click.option("--project", help="Only gcp runs made in this GCP project (as resolved and recorded at launch).")
@options("state", state=dict(help="The shared state whose team budget to show too (`gpucluster budget`): s3://BUCKET"
                                  "[/PREFIX], gs://BUCKET[/PREFIX] or file:///PATH; default $GPUCLUSTER_STATE, ..."))
@_boundary
def report_cmd(since, cloud, group_by, as_json, as_csv, plot, project) -> None:
    """What each run cost (from its resources' recorded lifetimes and launch-time prices), with totals."""
    from gpucluster.costing.cost import parse_since, plot_report

    _check_report_options(cloud, group_by, as_json, as_csv, plot)
    since_ts = parse_since(since)
    ledger = _open_ledger()
    try:
        rep = report_of(ledger, cloud=cloud, since_ts=since_ts, group_by=group_by, project=project, team=True)
    finally:
        ledger.close()
    if plot:
        plot_report(rep, plot)
    if as_json:
        click.echo(json.dumps(rep, indent=1))
        return
    if as_csv:
        from gpucluster.costing.cost import report_csv

        click.echo(report_csv(rep), nl=False)
        return
    console = _console()
    _runs_table(console, rep)
    if rep["groups"]:
        _groups_section(console, rep["groups"], group_by)
    _totals_lines(console, rep)
    if plot:
        console.print(f"Plot written to {plot}", highlight=False)


def _check_report_options(cloud: str | None, group_by: str | None, as_json: bool, as_csv: bool,
                          plot: str | None) -> None:
    """`cost report`'s options, checked in this order: one output format, a known cloud and group, a plot file."""
    from gpucluster.costing.cost import GROUPS
    from gpucluster.errors import UsageError, not_allowed
    from gpucluster.infra.registry import NAMES as CLOUDS

    if as_json and as_csv:
        raise UsageError("--json and --csv: choose one")
    if cloud is not None and cloud not in CLOUDS:
        raise UsageError(not_allowed("cloud", cloud, CLOUDS))
    if group_by is not None and group_by not in GROUPS:
        raise UsageError(not_allowed("group-by", group_by, GROUPS))
    if plot is not None:
        from gpucluster.costing.plots import check_plot_file

        check_plot_file(plot, "--plot file")  # .png, in an existing writable folder


def _runs_table(console: Console, rep: JsonMapping) -> None:
    """One row per run: started, cloud, cluster, status, nodes, wall, cost, note."""
    from decimal import Decimal

    from gpucluster.cli.tables import Col, fitted
    from gpucluster.costing.cost import money

    cells = [[r["run_id"], r["created"][:19], r["cloud"], r["cluster"], r["status"], str(r["nodes"]),
              "" if r["wall_s"] is None else f"{r['wall_s']:.0f}", money(Decimal(r["cost"])),
              r["note"] + (" [STILL BILLING]" if r["still_billing"] else "")] for r in rep["runs"]]
    # run ids, cluster names and costs are never cut; at 80 columns the others wrap or go
    console.print(fitted(console.width, [
        Col("run", keep=True), Col("started (UTC)", drop=5), Col("cloud", drop=3), Col("cluster", keep=True),
        Col("status", drop=2), Col("nodes", drop=4, justify="right"), Col("wall s", drop=6, justify="right"),
        Col("cost", keep=True, justify="right"), Col("note", drop=1)], cells, edge=True, title="Run costs (USD)"))


def _groups_section(console: Console, groups: list[JsonObject], group_by: str) -> None:
    """--group-by: the subtotals, then a recovered chain's attempts."""
    from decimal import Decimal

    from rich.table import Table

    from gpucluster.costing.cost import money

    gt = Table(title=f"By {group_by}")
    for col in (group_by, "runs", "wall s", "cost") + (("run ids",) if group_by == "chain" else ()):
        gt.add_column(col, justify="left" if col in (group_by, "run ids") else "right")
    for g in groups:
        gt.add_row(str(g[group_by]), str(g["runs"]), f"{g['wall_s']:.0f}", money(Decimal(g["cost"])),
                   *([", ".join(g["run_ids"])] if group_by == "chain" else []))
    console.print(gt)
    for g in groups:
        for a in g.get("attempts") or []:
            _attempt_line(console, g[group_by], a)


def _attempt_line(console: Console, group: object, a: JsonMapping) -> None:
    from decimal import Decimal

    from gpucluster.costing.cost import money

    redo = "" if a.get("recomputed_epochs") is None else f", {a['recomputed_epochs']:g} epoch(s) redone"
    console.print(f"  {group} attempt {a['attempt']}: {a['run_id']} {a['status']}, "
                  f"{money(Decimal(a['cost'] or 0))}{redo}"
                  + (f"; interrupted: {a['interruption']}" if a.get("interruption") else ""),
                  highlight=False)


def _totals_lines(console: Console, rep: JsonMapping) -> None:
    """The total, the budgets (config.yaml's, the team's) and what still bills."""
    from decimal import Decimal

    from gpucluster.costing.cost import money

    console.print(f"Total: {money(Decimal(rep['total']))} over {len(rep['runs'])} run(s)", highlight=False)
    for b in rep.get("budget", []):
        console.print(f"Budget ({b['period']}, since {b['since'][:16]} UTC): {money(Decimal(b['spent']))} spent of "
                      f"{money(Decimal(b['budget']))}, {money(Decimal(b['remaining']))} remaining", highlight=False)
    if rep.get("team_budget"):
        from gpucluster.cli.team import lines_of

        for line in lines_of(rep["team_budget"]):
            console.print(line, highlight=False)
    if rep["still_billing"]:
        console.print("Still billing (resources never confirmed deleted): " + ", ".join(rep["still_billing"])
                      + " -- run `gpucluster down` / `gpucluster gc`", highlight=False)

