"""`gpucluster up`: create a cluster and leave it running, through the run lifecycle's bookkeeping."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from gpucluster.cli import common
from gpucluster.cli.budgets import OVER_BUDGET, check_budget
from gpucluster.cli.idle import IDLE_HELP, IDLE_MINUTES
from gpucluster.cli.options import CLUSTER, options
from gpucluster.cli.taskopts import TaskCommand
from gpucluster.errors import TeardownIncomplete, UsageError
from gpucluster.infra.contract import Capability
from gpucluster.infra.registry import provisioning

if TYPE_CHECKING:
    from gpucluster.states import JsonObject
    from decimal import Decimal
    from gpucluster.domain import Cluster
    from gpucluster.lifecycle.prepare import Prepared
    from rich.console import Console
    from gpucluster.infra.contract import Plugin
    from gpucluster.spec import ClusterSpec


@click.command(cls=TaskCommand)
@options("task_file", *CLUSTER, "max_hourly", "max_attempts", "hosts", "identity", "known_hosts", "remote_python", "python",
         "context", "namespace", "create_namespace",
         task_file=dict(help="A task file (docs/tasks.md): its resources are the defaults, flags given here win "
                             "(its job keys are for `run`). Also as the argument: `gpucluster up task.yaml`."),
         cloud=dict(default=None, metavar="|".join(provisioning()) + "|ssh|local|auto|A,B", show_default=False,
                    help="Where the cluster is created [default: the task file's, GPUCLUSTER_CLOUD, the config "
                         "file's cloud; no default]. ssh (--hosts) and local: machines that exist, checked ready "
                         "once and kept under --name for `exec`; nothing is created."),
         nodes=dict(default=2, show_default=True, help="Number of nodes (at most 64)."),
         max_lifetime=dict(help="Minutes after which the nodes power themselves off, even if this machine is gone "
                                "[default: 240]."),
         ssh_cidr=dict(help="Who may SSH to the nodes (e.g. 203.0.113.7/32)."),
         dry_run=dict(help="Show what would be declared (the real Pulumi program under Pulumi's mocks) and the "
                           "estimate; create nothing, need no credentials."),
         as_json=dict(help="Print the cluster as JSON (secrets left out)."))
@click.option("--idle-minutes", "idle_minutes", default=None, type=IDLE_MINUTES, metavar="N", help=IDLE_HELP)
@options("max_cost", max_cost=dict(help="aws/gcp: the cluster's cost cap in USD: each `exec` job is stopped when the "
                                          "cluster has cost that much, none starts past it, and the nodes power off "
                                          "once it is spent (their lifetime is what the cap buys)."))
@click.option("--over-budget", "over_budget", **OVER_BUDGET)
def up(yes: bool, as_json: bool, idle_minutes: int | None, over_budget: bool = False, **flags: Any) -> int:
    """Create a cluster and leave it running (remove it with `gpucluster down NAME`).

    \b
    Examples:
      gpucluster up --cloud aws --nodes 2 --instance-type g5.xlarge --ssh-cidr 203.0.113.7/32
      gpucluster up --cloud ssh --hosts ubuntu@gpu1,ubuntu@gpu2 --name lab   (machines that exist)
      gpucluster up task.yaml
    """
    from gpucluster.api.clusters import plan_up, provision
    from gpucluster.cli.place import print_placement
    from gpucluster.lifecycle.prepare import check_before_recording, open_ledger

    if flags["cloud"] is None:  # `up` alone keeps nothing by default: not even this machine's "nodes"
        raise UsageError(f"give --cloud: {', '.join(provisioning())} (a cluster created), ssh with --hosts or local "
                         "(machines that exist, kept under --name)")
    planned = plan_up(flags, idle_minutes=idle_minutes)  # the one path: gpucluster.up's (api/clusters.py)
    chosen, plan, placement = planned.backend, planned.plan, planned.placement
    spec, dry_run = plan.spec, flags["dry_run"]
    out = common.console(stderr=as_json)
    if placement is not None:
        print_placement(out, placement)
    common.print_notes(out, plan.notes)
    held = not chosen.can(Capability.PROVISIONS)  # machines that exist (gpucluster.lifecycle.held): nothing is created
    plan_line = _plan_line(chosen, plan.spec, held)
    cap = (f" (up to {common.money(plan.estimate.total)} for {plan.limit_minutes:g} min, {plan.limit_what})"
           if plan.estimate is not None else "")
    gaps = [f"  estimate: {gap}" for gap in (plan.estimate.gaps if plan.estimate is not None else [])]
    if dry_run:
        from gpucluster.cli.dryrun import print_dry_run

        out.print(plan_line + _rate(plan.hourly, True) + cap)
        for line in [*gaps, *(f"  {b}" for b in plan.bounds)]:
            out.print(line, highlight=False)
        dry_shape = plan.shape() if placement is None else {**plan.shape(), **placement.to_dict()}
        return print_dry_run(out, None, spec, None, as_json, dry_shape)
    ledger = open_ledger()  # read-only or damaged: said before anything is asked or created
    over = check_budget(ledger, plan.estimate.total if plan.estimate else None, None, over_budget)
    common.print_notes(out, over)  # config.yaml's budget: refused above (exit 2) unless --over-budget
    if placement is None:  # a missing Pulumi CLI is offered or said before anything is asked or recorded
        common.preflight(lambda: check_before_recording(plan), yes)
    out.print(plan_line + ("" if held else f"{_rate(plan.hourly, False)} until `gpucluster down {spec.name}`{cap}"))
    for line in [*gaps, *([] if held else [f"  {b}" for b in plan.bounds])]:
        out.print(line, highlight=False)
    if not held:
        common.confirm("Create the cluster (it bills until you run `gpucluster down`)?", yes)
    from gpucluster.cli.render import RichRunUI
    from gpucluster.cli.watch import run_watch

    # messages printed; the status line ticks with the resources created, planned and in flight
    with RichRunUI(out, quiet=True, watch=run_watch(ledger, plan.spec)) as ui:
        made = provision(planned, ledger=ledger, ui=ui, over=over, over_budget=over_budget)  # the state recorded
    plan = planned.plan  # with --cloud auto: the candidate that is up (gpucluster.lifecycle.failover.up_placed)
    code = _render(out, made.cluster, plan, as_json, chosen)
    if made.record_error:  # the cluster is up (and shown): exit 3 with the one line, never 2
        from gpucluster.ledger.recording import kept_line

        raise TeardownIncomplete(kept_line(made.record_error, plan.spec.name))
    return common.ledger_kept_true(ledger, code, "up", _unrecorded(plan.spec, held))


def _plan_line(chosen: Plugin, spec: ClusterSpec, held: bool) -> str:
    """`plan: keep ...` (machines that exist, nothing created) or `plan: create N node(s) ...`."""
    cloud = chosen.name
    shape = chosen.spec.plan_line(spec, spec.gpus_per_node or 1, None) if held else None  # kubernetes: pods, namespace
    return (f"[bold]plan[/bold]: keep {shape or f'{spec.nodes} machine(s) that exist on {cloud}'} as cluster "
            f"{spec.name} ({'checked once as a run is' if shape else 'each checked ready once'}; nothing created), "
            "billed by nobody here" if held else
            f"[bold]plan[/bold]: create {spec.nodes} node(s) on {cloud} as cluster {spec.name}, ")


def _unrecorded(spec: ClusterSpec, held: bool) -> str:
    """What a ledger that kept nothing means for the cluster (`ledger_kept_true`)."""
    if held:  # machines that exist: nothing was created, nothing bills; the record is all `exec` needs
        return (f"cluster {spec.name} is no longer recorded (gpucluster created nothing that bills for it: it "
                "runs on what exists); run `gpucluster up` again to record it")
    return (f"cluster {spec.name} is up and billing but no longer recorded: `gpucluster gc --cloud "
            f"{spec.cloud}` finds it by its owner tags")


def _rate(hourly: Decimal | None, dry_run: bool) -> str:
    if hourly is not None:
        return f"about {common.money(hourly)}/hour"
    return "no price known here" if dry_run else "billed by the hour (no price known here)"


def _render(out: Console, cluster: Cluster, plan: Prepared, as_json: bool, backend: Plugin) -> int:
    cloud = plan.spec.cloud
    nodes_out: list[JsonObject] = [{"rank": n.rank, "host": n.host, "private_ip": n.private_ip, "user": n.user,
                  "instance_id": n.instance_id, "gpus": n.gpus} for n in cluster.nodes]
    if as_json:
        click.echo(json.dumps({"run_id": plan.spec.run_id, "cluster": cluster.name, "cloud": cloud,
                               "region": cluster.region, "zone": cluster.zone, "nodes": nodes_out,
                               "outputs": cluster.outputs,
                               "hourly_usd": None if plan.hourly is None else str(plan.hourly)}, indent=2, default=str))
        return 0
    from rich.table import Table

    t = Table(title=f"cluster {cluster.name} ({cloud} {cluster.zone or cluster.region or ''})", show_edge=False,
              title_justify="left")
    for col in ("rank", "host", "private ip", "id", "gpus"):
        t.add_column(col)
    for n in nodes_out:
        t.add_row(str(n["rank"]), n["host"] or "-", n["private_ip"] or "-", n["instance_id"] or "-", str(n["gpus"]))
    if nodes_out:  # a kept namespace of a Kubernetes cluster lists no nodes (a job's pods are placed by its scheduler)
        out.print(t)
    if cloud in provisioning():
        out.print(f"hourly cost: {_rate(plan.hourly, False)} while it runs; remove it with: gpucluster down {cluster.name}")
    else:
        from gpucluster.lifecycle.held import kept_said

        what, spares = kept_said(backend, plan.spec, cluster)
        out.print(f"{what}; jobs: gpucluster exec {cluster.name} -- ...; gpucluster down {cluster.name} removes what "
                  f"gpucluster put there, never {spares}")
    return 0
