"""`gpucluster sweep`: the same job at several sizes, a table, a diagnosis, plots and a report."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from gpucluster.cli.options import ENV, Float, Int, options
from gpucluster.cli.taskopts import TaskCommand
from gpucluster.cli.budgets import OVER_BUDGET
from gpucluster.errors import ExitCode, UsageError, not_allowed
from gpucluster.spec import parse_int
from gpucluster.states import RunStatus

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpucluster.cli.render import RichRunUI
    from gpucluster.sweep.runner import SweepRun
    from gpucluster.infra.contract import Plugin
    from rich.console import Console
    from gpucluster.ledger.store import Ledger
    from gpucluster.sweep.runner import Sweep


# what `run` takes about the cluster's shape and place that the lines above do not name
CLUSTER_SHAPE = ("gpu", "name", "region", "zone", "instance_type", "spot", "disk_gb", "max_lifetime", "tags", "hosts",
                 "identity", "known_hosts", "remote_python", "python", "ready_timeout", "start_deadline")


def parse_int_list(what: str, text: str, *, low: int, high: int) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; a bad, out-of-range or repeated item is a one-line UsageError."""
    items = [t.strip() for t in str(text).split(",")]
    if not text or not str(text).strip() or any(t == "" for t in items):
        raise UsageError(not_allowed(what, text, f"a comma-separated list of integers from {low} to {high}, e.g. 1,2,4"))
    values = []
    for item in items:
        values.append(parse_int(what, item, low=low, high=high))
        if values.count(values[-1]) > 1:
            raise UsageError(not_allowed(what, text, f"each value once (repeat runs with --repeat); {item} is repeated"))
    return values


@click.command(cls=TaskCommand, context_settings=dict(allow_interspersed_args=False))
@options("task_file", "nodes", "gpus_per_node", "cloud", "workload", "epochs", "workload_args",
         task_file=dict(help="A task file (docs/tasks.md): the cluster and job of every run; flags given here win "
                             "(--nodes N,N,... replaces its resources.nodes). Also as the first argument."),
         nodes=dict(default="1,2", show_default=True, type=None, metavar="N[,N...]",
                    help="Node counts to run, comma-separated (1,2,4)."),
         gpus_per_node=dict(type=None, metavar="N[,N...]", help="GPUs per node, comma-separated; 0 is a CPU-only "
                                                               "baseline (0,1) [default: what is present]."),
         workload=dict(help="Built-in workload (default synthetic when no command is given "
                            "after --)."),
         workload_args=dict(help="More arguments for the built-in workload, e.g. \"--steps 5\"."))
@click.option("--repeat", default=1, show_default=True, type=Int("repeat", 1, 20),
              help="Runs per size; the report gives median and min-max.")
@click.option("--compare-cpu", is_flag=True, help="Also run every size without GPUs and report the GPU speed-up and costs.")
@click.option("--threshold", default=0.7, show_default=True,
              type=Float("threshold", "a number above 0 and at most 1, e.g. 0.7", 0, 1),
              help="Scaling efficiency below which the sweep is diagnosed.")
@options("threads_per_proc")
@click.option("--report", "report_dir", default=None, type=click.Path(file_okay=False),
              help="Write PNG plots and summary.md into this directory.")
@options(*CLUSTER_SHAPE, *ENV, "max_minutes", "max_cost", "stall_minutes", "max_restarts", "max_hourly", "max_attempts", "allow_egress",
         max_cost=dict(help="aws/gcp: the whole sweep's cost cap in USD: each run is stopped when the sweep's cost "
                            "so far reaches it, and no further run starts (exit code 4)."))
@options("as_json", "yes", "ssh_cidr", "options", "data", "setup", "project", "state",
         as_json=dict(help="Print the summary and findings as JSON (progress on stderr)."),
         ssh_cidr=dict(help="Cloud sweeps: who may SSH to the nodes [aws default: this machine's public IPv4/32]."),
         options=dict(help="Cloud option, as in the stack file (repeatable), e.g. --option image=base."),
         data=dict(help="A folder (or the cloud's bucket URL) staged to every node of every run, as for `run --data` "
                        "(repeatable); each run's stage phase is in the report."),
         setup=dict(help="Shell command run on every node of every run before training, as for `run --setup` "
                         "(repeatable)."))
@click.option("--over-budget", "over_budget", **OVER_BUDGET)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def sweep(nodes: str, gpus_per_node: str | None, repeat: int, compare_cpu: bool, threshold: float,
          report_dir: str | None, as_json: bool, yes: bool, over_budget: bool = False, **flags: Any) -> int:
    """Run the same job at several cluster sizes and report how it scales.

    \b
    Per size: wall time per phase, training time, global samples/s, scaling efficiency against
    the smallest size (the 1-node run), accuracy, loss, cost per run and per epoch; a diagnosis
    names the measured cause when efficiency is below --threshold or more nodes are slower.

    \b
    Examples:
      gpucluster sweep --nodes 1,2,4 --workload synthetic --repeat 3 --report sweep-report
      gpucluster sweep --nodes 1,2 --json -- python train.py --epochs 2
      gpucluster sweep --nodes 1 --compare-cpu --workload mnist --epochs 1
      gpucluster sweep --nodes 1,2 --data ./shards --setup 'pip install -r requirements.txt' -- python train.py
    """
    from gpucluster.cli.budgets import check_budget
    from gpucluster.cli.common import console, print_notes
    from gpucluster.cli.render import RichRunUI
    from gpucluster.cli.run import confirm_billable
    from gpucluster.infra.registry import plugin, readers
    from gpucluster.lifecycle.prepare import Request, check_before_recording, open_ledger, prepare
    from gpucluster.spec import new_run_id
    from gpucluster.sweep.runner import gpu_sizes, known_gpus, new_sweep_id, plan_sizes, run_sweep

    from gpucluster.cli.args import check_cloud_flags

    from gpucluster.cli.place import prepared, print_placement
    from gpucluster.plan.placement import wanted

    limits = {k: flags.pop(k) for k in ("max_hourly", "max_attempts", "allow_egress")}
    placing = wanted(flags["cloud"], flags.get("region")) or any(v not in (None, False) for v in limits.values())
    chosen = None if placing else plugin(flags["cloud"])  # the one lookup: everything below is given it
    if chosen is not None:
        check_cloud_flags(flags["cloud"])  # e.g. --region with local: refused as `run` refuses it
    node_counts = sorted(parse_int_list("nodes", nodes, low=1, high=chosen.traits.max_nodes if chosen else 64))
    placement = None
    if placing:  # one placement for every size, chosen for the largest (docs/placement.md)
        chosen, _, placement = prepared({**flags, **limits}, nodes=node_counts[-1], default_workload="synthetic",
                                        procs_per_node=1)
        assert placement is not None  # asked to place: a ranking was made
        where = placement.chosen
        flags.update(cloud=chosen.name, region=where.region, zone=where.zones[0] if where.zones else flags.get("zone"))
    assert chosen is not None  # one cloud, or the ranking's first
    asked_gpn = _asked_gpus_per_node(gpus_per_node, flags.get("gpu"))
    _check_report_dir(report_dir)
    gpn_list = gpu_sizes(asked_gpn, compare_cpu, known_gpus(chosen), node_counts)
    plan = prepare(Request(**flags, nodes=node_counts[0], default_workload="synthetic", procs_per_node=1,
                           readers=readers()), chosen)
    ledger = open_ledger()  # read-only or damaged: refused before the first run
    sizes = plan_sizes(node_counts, gpn_list, repeat)
    out = console(stderr=as_json)
    if placement is not None:
        print_placement(out, placement)
    # the smallest size's estimate for each run: the least the sweep costs (its --max-cost when lower)
    over = check_budget(ledger, plan.estimate.total if plan.estimate else None, flags["max_cost"], over_budget,
                        runs=len(sizes))
    print_notes(out, over)
    check_before_recording(plan)
    sweep_id = new_sweep_id()
    out.print(f"[bold]sweep {sweep_id}[/bold]: {len(sizes)} run(s) on {flags['cloud']}: nodes {node_counts}, "
              f"GPUs/node {['CPU' if g == 0 else ('present' if g is None else g) for g in gpn_list]}, "
              f"repeat {repeat}: {plan.needs_job().display}")
    confirm_billable(chosen, yes, "a sweep creates billable cloud resources",
                     f"Create {len(sizes)} cluster(s) one after another and run?")
    from gpucluster.cli.budgets import claim_team, settle_team

    team = claim_team(plan, key=sweep_id, kind="sweep", max_cost=flags["max_cost"], over_budget=over_budget,
                      runs=len(sizes))  # the team's budget in the shared state: exit 2 here, nothing created
    print_notes(out, team)
    ui = RichRunUI(out, quiet=True)
    result = None
    try:
        with ui:
            result = run_sweep(plan.spec, plan.needs_job(), node_counts, gpn_list, repeat, ledger, (plan.provider, plan.needs_launcher()),
                               ui, sweep_id=sweep_id, new_run_id=new_run_id, on_run=_progress(ui), prices=plan.prices,
                               plugin=chosen, workload=plan.workload)
    finally:
        settle_team(ledger, sweep_id, [r.id for r in ledger.list_runs(limit=None, sweep_id=sweep_id)])
    if result.runs:
        from gpucluster.cli.budgets import record_override

        record_override(ledger, result.runs[0].run_id, [*over, *team])
    code = report(out, ledger, sweep_id, threshold, chosen, as_json=as_json, report_dir=report_dir,
                  interrupted=result.interrupted, all_ok=result.ok)
    code = _exit_code(result, code)
    from gpucluster.cli.common import ledger_kept_true

    return ledger_kept_true(ledger, code, "sweep", "the report above is all that is left of its runs")


def _asked_gpus_per_node(gpus_per_node: str | None, gpu: str | None) -> list[int] | None:
    """--gpus-per-node N,N,...; --gpu TYPE:COUNT fixes the GPUs per node of every size (the two must agree)."""
    asked_gpn = None if gpus_per_node is None else sorted(parse_int_list("gpus per node", gpus_per_node, low=0,
                                                                         high=16))
    if gpu is not None:  # --gpu TYPE:COUNT fixes the GPUs per node of every size
        from gpucluster.catalog.gpus import parse

        count = parse(gpu)[1]
        if asked_gpn is not None and asked_gpn != [count]:
            raise UsageError(f"--gpu {gpu} asks for {count} GPU(s) per node but --gpus-per-node is "
                             f"{gpus_per_node}: give one of them")
        asked_gpn = [count]
    return asked_gpn


def _check_report_dir(report_dir: str | None) -> None:
    """--report: a folder name, writable, checked before the first run (not after the last)."""
    if report_dir is not None and not report_dir.strip():
        raise UsageError("--report '' is not allowed: give the folder the report and its plots go to, "
                         "e.g. --report sweep-report")
    if report_dir:
        from gpucluster.home import check_writable_dir

        check_writable_dir(report_dir, "--report folder")  # before the first run, not after the last


def _exit_code(result: Sweep, code: int) -> int:
    """The report's exit code, unless a doubt (exit 3, each said) or the cost cap (exit 4) overrides it."""
    for line in result.doubts:  # a teardown not verified, a record not written: exit 3, whatever else
        click.echo(f"gpucluster: error: {line}", err=True)
    if result.capped and not result.doubts:
        click.echo(f"gpucluster: sweep stopped: {result.capped}; no further run was started", err=True)
        code = int(ExitCode.COST_CAP)
    elif result.doubts:
        code = int(ExitCode.LEFTOVERS)
    return code


def _progress(ui: RichRunUI) -> Callable[[int, int, SweepRun | None, tuple[int, int | None, int]], None]:
    def on_run(i, total, done, size):
        n, g, r = size
        gl = "CPU" if g == 0 else (f"{g} GPU/node" if g else "GPUs present")
        if done is None:
            ui.message(f"[{i + 1}/{total}] {n} node(s), {gl}, repeat {r} ...")
        else:
            tail = "" if done.status == RunStatus.SUCCEEDED else f": {done.failure}"
            ui.message(f"[{i + 1}/{total}] run {done.run_id} {done.status}{tail}")

    return on_run


def report(out: Console, ledger: Ledger, sweep_id: str, threshold: float, backend: Plugin, *, as_json: bool, report_dir: str | None,
           interrupted: bool = False, all_ok: bool = True) -> int:
    """Summarise a sweep from the ledger and render it (terminal / JSON / report dir)."""
    from gpucluster.sweep.diagnose import diagnose
    from gpucluster.sweep.runner import compare_cpu_gpu, load_sweep, summarize

    runs = load_sweep(ledger, sweep_id)
    summary = summarize(runs, {backend.name: backend})  # the sweep's runs are all on its backend
    findings = diagnose(summary, threshold)
    comparisons = compare_cpu_gpu(summary)
    report_path = None
    if report_dir:
        from gpucluster.costing.plots import write_report

        util_runs = []
        for r in summary:
            ok = [f for f in r.facts if f.status == RunStatus.SUCCEEDED and f.util]
            if ok:
                util_runs.append((ok[0].run_id, r.label, ok[0].util))
        report_path = write_report(report_dir, summary, findings, sweep_id=sweep_id, util_runs=util_runs,
                                   comparisons=comparisons, threshold=threshold)
    if as_json:
        click.echo(json.dumps({
            "sweep_id": sweep_id, "threshold": threshold, "interrupted": interrupted,
            "sizes": [r.to_dict() for r in summary], "findings": [f.to_dict() for f in findings],
            "cpu_vs_gpu": [c.to_dict() for c in comparisons],
            "report": str(report_path) if report_path else None,
        }, indent=2, default=str))
    else:
        render(out, sweep_id, summary, findings, comparisons, threshold)
        if report_path:
            out.print(f"report: {report_path}", highlight=False)
    if interrupted:
        return int(ExitCode.INTERRUPTED)
    return int(ExitCode.OK if all_ok else ExitCode.FAILURE)


def render(out, sweep_id, summary, findings, comparisons, threshold) -> None:
    from rich.table import Table
    from rich.text import Text

    from gpucluster.costing.plots import SUMMARY_HEADERS, summary_rows

    t = Table(title=f"sweep {sweep_id}", show_edge=False, title_justify="left")
    for h in SUMMARY_HEADERS:
        t.add_column(h, justify="left" if h in ("GPUs/node", "ok") else "right")
    for row in summary_rows(summary):
        t.add_row(*row)
    out.print(t)
    phases = [p for p in ("provision", "ready", "rendezvous", "train", "teardown") if any(p in r.phases for r in summary)]
    if phases:
        pt = Table(title="wall time per phase (median s)", show_edge=False, title_justify="left")
        for h in ("nodes", "GPUs/node", *phases):
            pt.add_column(h, justify="right")
        for r in summary:
            pt.add_row(str(r.nodes), str(r.gpus_per_node) if r.gpus_per_node else "CPU",
                       *[f"{r.phases[p].median:.2f}" if r.phases.get(p) else "-" for p in phases])
        out.print(pt)
    for c in comparisons:
        cost = ""
        if c.cpu_cost_usd is not None and c.gpu_cost_usd is not None:
            cost = f"; cost CPU ${c.cpu_cost_usd:.4f} vs GPU ${c.gpu_cost_usd:.4f}"
        out.print(f"CPU vs GPU at {c.nodes} node(s): {c.cpu_train_s:.2f} s vs {c.gpu_train_s:.2f} s "
                  f"({c.verdict}){cost}", highlight=False)
    if not findings:
        out.print(Text(f"diagnosis: every size scaled at efficiency >= {threshold:g}", style="green"), highlight=False)
    for f in findings:
        style = {"error": "bold red", "warning": "yellow"}.get(f.severity, "")
        out.print(Text(f"{f.rule}: ", style=style) + Text(f.message), highlight=False, soft_wrap=True)
