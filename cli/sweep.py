"""`gpucluster sweep`: the same job at several sizes, a table, a diagnosis, plots and a report."""

from __future__ import annotations

import json
import sys

import click

from gpucluster.errors import ExitCode, UsageError, not_allowed
from gpucluster.cli.args import WORKLOADS
from gpucluster.infra.registry import NAMES as CLOUDS
from gpucluster.spec import parse_int


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


def parse_threshold(text: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = -1.0
    if not 0 < value <= 1:
        raise UsageError(not_allowed("threshold", text, "a number above 0 and at most 1, e.g. 0.7"))
    return value


@click.command(context_settings=dict(allow_interspersed_args=False))
@click.option("--nodes", "-n", default="1,2", show_default=True, help="Node counts to run, comma-separated (1,2,4).")
@click.option("--gpus-per-node", default=None,
              help="GPUs per node, comma-separated; 0 is a CPU-only baseline (0,1) [default: what is present].")
@click.option("--cloud", default="local", show_default=True, metavar="|".join(CLOUDS))
@click.option("--workload", "-w", default=None, metavar="|".join(WORKLOADS),
              help="Built-in workload (default synthetic when no command is given after --).")
@click.option("--epochs", default=None, help="Epochs for a built-in workload.")
@click.option("--workload-args", default="", help="More arguments for the built-in workload, e.g. \"--steps 5\".")
@click.option("--repeat", default="1", show_default=True, help="Runs per size; the report gives median and min-max.")
@click.option("--compare-cpu", is_flag=True, help="Also run every size without GPUs and report the GPU speed-up and costs.")
@click.option("--threshold", default="0.7", show_default=True, help="Scaling efficiency below which the sweep is diagnosed.")
@click.option("--threads-per-proc", default=None, help="CPU threads per training process [default: cores / processes].")
@click.option("--report", "report_dir", default=None, type=click.Path(file_okay=False),
              help="Write PNG plots and summary.md into this directory.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary and findings as JSON (progress on stderr).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before creating billable resources.")
@click.option("--ssh-cidr", default=None, help="Cloud sweeps: who may SSH to the nodes [aws default: this machine's "
              "public IPv4/32].")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
              help="Cloud option, as in the stack file (repeatable), e.g. --option image=base.")
@click.option("--data", "data", multiple=True, metavar="SRC[:DEST]",
              help="A folder (or the cloud's bucket URL) staged to every node of every run, as for `run --data` "
                   "(repeatable); each run's stage phase is in the report.")
@click.option("--setup", "setup", multiple=True, metavar="CMD",
              help="Shell command run on every node of every run before training, as for `run --setup` (repeatable).")
@click.option("--project", default=None, help="gcp: the project [default: stack config, GOOGLE_PROJECT... env, "
              "gcloud config, then the ADC project].")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def sweep(nodes, gpus_per_node, cloud, workload, epochs, workload_args, repeat, compare_cpu, threshold,
          threads_per_proc, report_dir, as_json, yes, ssh_cidr, options, project, data, setup, command):
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
    from gpucluster.cli.args import build_spec, check_command, workload_argv
    from gpucluster.infra.contract import Capability, LaunchOptions
    from gpucluster.infra.registry import plugin

    if cloud not in CLOUDS:
        raise UsageError(not_allowed("cloud", cloud, CLOUDS))
    chosen = plugin(cloud)  # the one look-up of this command: below, the plugin is passed down
    node_counts = sorted(parse_int_list("nodes", nodes, low=1, high=chosen.traits.max_nodes))
    gpn_list: list[int | None] = [None]
    if gpus_per_node is not None:
        gpn_list = sorted(parse_int_list("gpus per node", gpus_per_node, low=0, high=16))
    reps = parse_int("repeat", repeat, low=1, high=20)
    thr = parse_threshold(threshold)
    if command and workload:
        raise UsageError("give either --workload or a command after --, not both")
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        workload = workload or "synthetic"
        if workload not in WORKLOADS:
            raise UsageError(not_allowed("workload", workload, WORKLOADS))
    wl_args = workload_argv(workload, workload_args, epochs, command)
    if command:
        check_command(command)
    if report_dir:
        from gpucluster.home import check_writable_dir

        check_writable_dir(report_dir, "--report folder")  # before the first run, not after the last

    wants_gpu = compare_cpu or any(g for g in gpn_list if g)
    present = chosen.ops.known_gpus()  # local: this machine's GPUs; elsewhere unknown until provisioned
    if present is not None:
        if wants_gpu and present == 0:
            raise UsageError("there is no GPU to compare against: this machine has no NVIDIA GPU (nvidia-smi finds none), "
                             "so --compare-cpu / GPUs per node > 0 cannot run here; run the sweep on a machine or "
                             "cloud with GPUs, or sweep CPU nodes only")
        if compare_cpu:
            gpn_list = sorted({0, *[g if g is not None else max(1, present // max(node_counts)) for g in gpn_list]})
        elif gpn_list == [None]:
            gpn_list = [present // max(node_counts) if present else 0]
    elif compare_cpu:
        gpn_list = sorted({0, *[g for g in gpn_list if g is not None]}, key=lambda g: g) or [0]
        if gpn_list == [0]:
            gpn_list = [0, None]  # type: ignore[list-item]

    from gpucluster.home import home_dir
    from gpucluster.launch import JobSpec
    from gpucluster.ledger import Ledger
    from gpucluster.spec import new_run_id, resolve
    from gpucluster.sweep import new_sweep_id, plan_sizes

    base = resolve(build_spec(cloud, node_counts[0], None, None, None, None, None, False, "100", "240", ssh_cidr, (),
                              (), None, options), chosen)
    from gpucluster.spec import validate

    validate(base, chosen)  # unknown options and bad values are refused before anything starts
    base = chosen.with_project(base, project)  # every run of the sweep records the same resolved project
    from gpucluster.staging import parse_data, parse_setup

    mounts, setup_cmds = parse_data(data, chosen), parse_setup(setup)
    base = chosen.with_object_access(base, [m.src for m in mounts if m.remote], [])
    job = JobSpec(run_id="template", command=tuple(command), workload=None if command else workload,
                  workload_args=tuple(wl_args) if not command else (), nproc_per_node=1, data=mounts, setup=setup_cmds,
                  threads_per_proc=None if threads_per_proc is None else parse_int(
                      "threads per process", threads_per_proc, low=1, high=1024))
    provider_launcher = chosen.transport.make(LaunchOptions())
    from gpucluster.cli.args import resolve_spec

    resolved, _ = resolve_spec(base)  # aws: the SSH rule must let this machine in
    base = base.replace(ssh_cidr=resolved.ssh_cidr)
    ledger = Ledger.open_default()
    ledger.check()  # read-only or damaged: refused before the first run
    home_dir()
    plan = plan_sizes(node_counts, gpn_list, reps)

    from gpucluster.cli.render import RichRunUI
    from gpucluster.cli.common import console

    out = console(stderr=as_json)
    sweep_id = new_sweep_id()
    what = job.display
    out.print(f"[bold]sweep {sweep_id}[/bold]: {len(plan)} run(s) on {cloud}: nodes {node_counts}, "
              f"GPUs/node {['CPU' if g == 0 else ('present' if g is None else g) for g in gpn_list]}, "
              f"repeat {reps}: {what}")
    if chosen.can(Capability.PROVISIONS) and not yes:
        if not sys.stdin.isatty():
            raise UsageError("a sweep creates billable cloud resources: confirm with --yes when not on a terminal")
        if not click.confirm(f"Create {len(plan)} cluster(s) one after another and run?", default=False):
            raise click.exceptions.Abort()

    from gpucluster.sweep import run_sweep

    def on_run(i, total, done, size):
        n, g, r = size
        gl = "CPU" if g == 0 else (f"{g} GPU/node" if g else "GPUs present")
        if done is None:
            ui.message(f"[{i + 1}/{total}] {n} node(s), {gl}, repeat {r} ...")
        else:
            tail = "" if done.status == "succeeded" else f": {done.failure}"
            ui.message(f"[{i + 1}/{total}] run {done.run_id} {done.status}{tail}")

    ui = RichRunUI(out, quiet=True)
    with ui:
        result = run_sweep(base, job, node_counts, gpn_list, reps, ledger, provider_launcher, ui, plugin=chosen, sweep_id=sweep_id,
                           new_run_id=new_run_id, on_run=on_run,
                           workload=workload or (command[-1] if len(command) == 1 else (command[1] if command else None)))
    return report(out, ledger, sweep_id, thr, as_json=as_json, report_dir=report_dir, interrupted=result.interrupted,
                  all_ok=result.ok)


def report(out, ledger, sweep_id: str, threshold: float, *, as_json: bool, report_dir: str | None,
           interrupted: bool = False, all_ok: bool = True) -> int:
    """Summarise a sweep from the ledger and render it (terminal / JSON / report dir)."""
    from gpucluster.diagnose import diagnose
    from gpucluster.sweep import compare_cpu_gpu, load_sweep, summarize

    runs = load_sweep(ledger, sweep_id)
    summary = summarize(runs)
    findings = diagnose(summary, threshold)
    comparisons = compare_cpu_gpu(summary)
    report_path = None
    if report_dir:
        from gpucluster.plots import write_report

        util_runs = []
        for r in summary:
            ok = [f for f in r.facts if f.status == "succeeded" and f.util]
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

    from gpucluster.plots import SUMMARY_HEADERS, summary_rows

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
                  f"({c.speedup:.1f}x faster on {c.gpus_per_node} GPU/node){cost}", highlight=False)
    if not findings:
        out.print(Text(f"diagnosis: every size scaled at efficiency >= {threshold:g}", style="green"), highlight=False)
    for f in findings:
        style = {"error": "bold red", "warning": "yellow"}.get(f.severity, "")
        out.print(Text(f"{f.rule}: ", style=style) + Text(f.message), highlight=False, soft_wrap=True)
