"""`gpucluster run`: provision, train with torchrun, tear down, report."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click

from gpucluster.cli.budgets import OVER_BUDGET, check_budget
from gpucluster.cli.common import console as _console
from gpucluster.cli.idle import IDLE_HELP, IDLE_MINUTES
from gpucluster.cli.options import options
from gpucluster.cli.taskopts import TaskCommand
from gpucluster.infra.contract import Capability
from gpucluster.errors import ExitCode, UsageError

if TYPE_CHECKING:
    from gpucluster.lifecycle.steps import RunOutcome
    from gpucluster.lifecycle.recovery import ChainOutcome
    from gpucluster.lifecycle.prepare import Prepared
    from gpucluster.ledger.records import RunRecord
    from gpucluster.infra.contract import Plugin
    from rich.console import Console
    from gpucluster.ledger.store import Ledger


@click.command(cls=TaskCommand, context_settings=dict(ignore_unknown_options=False, allow_interspersed_args=False))
@options("task_file", "cloud", "nodes", "gpu", "gpus_per_node", "procs_per_node", "workload", "epochs", "workload_args", "name", "region",
         "zone", "instance_type", "spot", "disk_gb", "max_minutes", "max_cost", "stall_minutes", "max_lifetime", "ssh_cidr", "tags", "options",
         "dry_run", "ready_timeout", "hosts", "identity", "known_hosts", "remote_python", "threads_per_proc",
         "max_restarts", "project", "start_deadline", "data", "setup", "output", "keep", "yes", "quiet", "as_json",
         "resume", "python", "collect", "collect_limit", "env", "env_file", "secret", "state", "check", "recover",
         "fallback", "fallback_after", "checkpoint_every", "context", "namespace", "create_namespace",
         "max_hourly", "max_attempts", "allow_egress", as_json=dict(help="Print the run record as JSON at the end (logs go to stderr)."))
@click.option("--idle-minutes", "idle_minutes", default=None, type=IDLE_MINUTES, metavar="N",
              help="With --keep: " + IDLE_HELP)
@click.option("--over-budget", "over_budget", **OVER_BUDGET)
@click.option("--notify", "notify", multiple=True, metavar="URL",
              help="POST a JSON event (Slack-compatible `text`) to this webhook when the run ends, fails, is "
                   "recovered or leaves something not verified (repeatable; also `notify:` in the config file). "
                   "A webhook that fails is retried twice, then said; the run is not affected.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(keep: bool, yes: bool, quiet: bool, as_json: bool, idle_minutes: int | None = None, over_budget: bool = False,
        notify: tuple[str, ...] = (), **flags: Any) -> int:
    """Provision a cluster, train on it with torchrun, tear it down, report.

    \b
    Examples:
      gpucluster run --cloud local --nodes 4
      gpucluster run task.yaml --nodes 4              (a task file: docs/tasks.md)
      gpucluster run --cloud local --nodes 2 --workload mnist --epochs 1
      gpucluster run --cloud local --nodes 2 -- python my_train.py --epochs 3
      gpucluster run --cloud local --nodes 2 --epochs 8 --resume r20261122-101500-ab12cd
      gpucluster run --cloud ssh --hosts ubuntu@10.0.0.5,ubuntu@10.0.0.6 --identity ~/.ssh/id_ed25519
      gpucluster run --cloud aws --nodes 2 --dry-run
      gpucluster run --cloud kubernetes --context lab --namespace ml --nodes 2 --gpus-per-node 4
      gpucluster run --cloud aws --nodes 4 --spot --recover 3 --fallback on-demand --checkpoint-every 200
    """
    from gpucluster.api.jobs import all_webhooks, execute_plan, plan_run
    from gpucluster.cli.common import preflight, print_notes
    from gpucluster.cli.place import print_placement
    from gpucluster.lifecycle.prepare import check_before_recording, open_ledger

    urls = all_webhooks(notify)  # checked before anything else is done
    planned = plan_run(flags, keep=keep, idle_minutes=idle_minutes)  # the one path: gpucluster.run's (api/jobs.py)
    chosen, plan, placement = planned.backend, planned.plan, planned.placement
    out = _console(stderr=as_json)
    if placement is not None:
        print_placement(out, placement)
    print_notes(out, plan.notes)
    print_plan(out, plan)
    if flags["dry_run"]:
        from gpucluster.cli.dryrun import print_dry_run

        shape = plan.shape() if placement is None else {**plan.shape(), **placement.to_dict()}
        return print_dry_run(out, plan.launcher, plan.spec, plan.job, as_json, shape)
    ledger = open_ledger()
    over = check_budget(ledger, plan.estimate.total if plan.estimate else None, flags["max_cost"], over_budget)
    print_notes(out, over)  # config.yaml's budget: refused above (exit 2) unless --over-budget
    if placement is None:  # a placed plan's preflight ran while ranking
        preflight(lambda: check_before_recording(plan), yes)  # e.g. a missing Pulumi CLI: offered or said first
    for line in plan.described:
        out.print(f"  {line}")
    confirm_billable(chosen, yes, "this creates billable cloud resources", "Create the cluster and run?")
    from gpucluster.cli.render import RichRunUI
    from gpucluster.cli.watch import run_watch

    with RichRunUI(out, quiet=quiet, epochs=flags["epochs"], watch=run_watch(ledger, plan.spec)) as ui:
        done = execute_plan(planned, ledger=ledger, ui=ui, notify=urls, over=over, over_budget=over_budget)
    result = done.result
    report(out, as_ended(with_attempts(ledger, done.record), result.final), as_json)
    _said_after(out, result, plan.spec.name, as_json)
    for line in done.undelivered:  # a webhook that failed changes nothing of the run: said, not fatal
        click.echo(f"gpucluster: warning: {line}", err=True)
    from gpucluster.cli.common import ledger_kept_true

    return ledger_kept_true(ledger, int(result.exit_code))  # a record written into a file that is gone: said last, exit 3


def _said_after(out: Console, result: ChainOutcome, cluster: str, as_json: bool) -> None:
    """After the report: why recovery stopped, and a ledger that could not be kept true (exit 3)."""
    if result.stopped and not as_json:
        out.print(f"recovery stopped: {result.stopped}", highlight=False)
    earlier = [a for a in result.attempts[:-1] if a.outcome.exit_code == ExitCode.LEFTOVERS]
    if earlier and result.final.exit_code != ExitCode.LEFTOVERS:  # the exit 3 is theirs: said last (issue 45 item 13)
        first = earlier[0].outcome
        why = "; ".join([*first.unchecked, *(str(x.get("id", x)) for x in first.leftovers)][:2]) or first.teardown
        click.echo(f"gpucluster: exit 3: {len(earlier)} earlier attempt(s) did not tear down verified: "
                   f"{earlier[0].run_id} ({first.teardown}: {why}); see `gpucluster show {earlier[0].run_id}`, finish "
                   f"with `gpucluster down {cluster}`", err=True)
    if result.final.record_error:  # the ledger does not say what happened: one line
        from gpucluster.ledger.recording import record_line

        click.echo(f"gpucluster: error: {record_line(result.final.record_error, cluster)}", err=True)


def with_attempts(ledger: Ledger, record: RunRecord | None) -> RunRecord | None:
    """The record with its chain's attempts (`show`, `run`): only for a chain that has attempts
    (a recovered run), so every other record prints as it always has."""
    if record is None or len(record.chain) < 2:
        return record
    from gpucluster.ledger.attempts import chain_attempts

    rows = chain_attempts(ledger, record.chain)
    return replace(record, attempts=rows) if any(r.get("interruption") for r in rows) else record


def as_ended(record: RunRecord | None, outcome: RunOutcome) -> RunRecord | None:
    """The record to report: the ledger's, except where the ledger could not be written (a full or
    read-only home, a lock held past the wait): its row may still say `running` with no teardown,
    while the run has ended and torn down. Then what the run knows in memory is shown (issue 45
    item 13: the report said `RUNNING ... teardown: not run` above a last line saying it ran)."""
    if record is None or not outcome.record_error:
        return record
    run = replace(record.run, status=outcome.status, exit_code=int(outcome.exit_code), failure=outcome.failure,
                  teardown=outcome.teardown, leftovers=list(outcome.leftovers), unchecked=list(outcome.unchecked),
                  teardown_verified=outcome.teardown_verified)
    return replace(record, run=run)


def report(out: Console, record: RunRecord | None, as_json: bool) -> None:
    """The run's record: as JSON on stdout, or the rendered report (a record the ledger does not hold: said)."""
    if record is None:  # its row gone from the ledger since the run ended (a ledger deleted or replaced meanwhile)
        click.echo("gpucluster: error: the run's record is not in the ledger; there is no report to show", err=True)
        return
    if as_json:
        click.echo(json.dumps(record.to_dict(), indent=2, default=str))
        return
    from gpucluster.cli.render import run_report

    out.print()
    run_report(out, record)


def confirm_billable(chosen: Plugin, yes: bool, what: str, question: str) -> None:
    """Ask before creating billable resources (aws, gcp); without a terminal, --yes is needed."""
    if not chosen.can(Capability.PROVISIONS) or yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"{what}: confirm with --yes when not on a terminal")
    if not click.confirm(question, default=False):
        raise click.exceptions.Abort()


def print_plan(out: Console, plan: Prepared) -> None:
    """What will happen and what it is estimated to cost."""
    job = plan.needs_job()
    out.print(f"[bold]plan[/bold]: {plan.plan_line} as cluster {plan.spec.name}, run {job.run_id}: {job.display}",
              highlight=False)
    for line in plan.bounds:  # how long the nodes may take to be ready, and how long they live
        out.print(f"  {line}", highlight=False)
    for cmd in job.setup:
        out.print(f"  setup: {cmd}", highlight=False)
    if job.resume is not None:
        out.print(f"  resumes: the outputs in {job.resume.src} as $GPUCLUSTER_RESUME_DIR", highlight=False)
        if job.resume_files:
            out.print(f"  resumes: the working-folder files of {job.resume_files[1]} laid back into every node's "
                      "working folder", highlight=False)
    from gpucluster.plan.jobenv import describe as env_lines

    for line in env_lines(job.env, job.secrets):
        out.print(f"  {line}", highlight=False)
    if plan.estimate is not None:
        out.print(f"estimated cost: {plan.estimate.render_limit(plan.limit_minutes, plan.limit_what)}")
        for gap in plan.estimate.gaps:  # e.g. a disk priced at another region's price: said, never hidden
            out.print(f"  estimate: {gap}", highlight=False)
    else:
        out.print("estimated cost: $0 (machines gpucluster does not rent)")
