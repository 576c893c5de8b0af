"""`gpucluster down`: delete a cluster, then check independently what is left (idempotent)."""

from __future__ import annotations

import json
from typing import Any

import click

from gpucluster.cli import common
from gpucluster.cli.complete import complete_cluster
from gpucluster.errors import ExitCode, GpuclusterError, UsageError
from gpucluster.infra.contract import Capability
from gpucluster.infra.registry import project_id, provisioning


@click.command()
@click.argument("cluster", required=False, shell_complete=complete_cluster)
@click.option("--all", "all_", is_flag=True, help="Every cluster the ledger says may still exist.")
@click.option("--cloud", default=None, type=click.Choice(provisioning()),
              help="The cluster's cloud, when the ledger does not know the cluster.")
@click.option("--force", is_flag=True, help="If a live gpucluster process owns the cluster, stop it (SIGTERM) and "
              "wait for its own teardown first.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per cluster with the verdict.")
@click.option("--project", default=None, help="gcp: the project to check for leftovers [default: the one the "
              "cluster was made in, else the usual resolution order].")
def down(cluster, all_, cloud, force, yes, as_json, project):
    """Delete a cluster, then check independently (by tag, by run id) what is left (idempotent).

    The verdict has three states: verified (every check ran, nothing found), leftovers (listed), or
    not verified (each check that could not run, and why). Exit 0 only when verified; 3 otherwise;
    2 when a live gpucluster process owns the cluster (without --force nothing is touched).

    \b
    Examples:
      gpucluster down gpucluster-aws
      gpucluster down gpucluster-local --force     # stop the run that owns it, then check
      gpucluster down --all --yes
    """
    from gpucluster.infra.registry import plugin
    from gpucluster.teardown import check_project, down_targets, refuse_busy, take_down

    if cluster and all_:
        raise UsageError("give a cluster name or --all, not both")
    ledger = common.ledger()
    targets = down_targets(ledger, cluster, all_, cloud, provisioning())
    backends = {c: plugin(c) for c in set(targets.values())}  # the one lookup: the lifecycle is given them
    project = None if not project else check_project(project_id(project), targets, backends)
    out = common.console(stderr=as_json)
    if not targets:
        out.print("nothing to do: the ledger records no cluster that may still exist")
        if as_json:
            click.echo(json.dumps([]))
        return 0
    if not force:  # refuse before asking anything: a live run is not pulled from under its owner
        refuse_busy(targets)
    common.confirm(f"Delete {', '.join(sorted(targets))} and everything in it?", yes)
    for c in sorted({c for c in targets.values() if backends[c].can(Capability.PROVISIONS)}):
        try:  # the Pulumi CLI missing or too old: offer to install it; without it, down deletes by tag
            common.preflight(common.provider_for(c).preflight, yes)
        except GpuclusterError:
            pass
    results = []
    from gpucluster.cli.render import RichRunUI
    from gpucluster.cli.watch import cluster_watch

    for name, c in sorted(targets.items()):  # each verdict is shown as soon as it is known
        # a terminal's status line: the clock and what is deleted of what was open, what it waits on
        with RichRunUI(out, quiet=True, watch=cluster_watch(ledger, name)) as ui:
            ui.phase("teardown")
            results.append(take_down(name, c, ledger=ledger, provider_for=common.provider_for, backend=backends[c],
                                     force=force, project=project, say=lambda text, n=name: ui.message(f"{n}: {text}")))
        _render(out, results[-1], backends[c])
    if as_json:
        click.echo(json.dumps([r.verdict for r in results], indent=2, default=str))
    return int(max((r.exit_code for r in results), default=ExitCode.OK))


def _render(out: Any, result: Any, chosen: Any) -> None:
    name, c, check = result.verdict["cluster"], result.verdict["cloud"], result.check
    if check is None:
        out.print(f"[red]{name}: {result.error}[/red]")
    elif check.verified:
        out.print(f"[green]{name}: down; verified {chosen.traits.verified_how}: every check ran and found nothing[/green]")
    else:
        out.print(f"[bold red]{name}: {check.verdict.upper()}[/bold red]")
        for lo in check.leftovers:
            out.print(f"  still exists: {lo.kind} {lo.id} {lo.region or ''} {lo.detail}".rstrip())
        for line in check.unchecked:
            out.print(f"  not checked: {line}")
        out.print(f"  finish it with: gpucluster down {name}" + (
            f"   or   gpucluster gc --cloud {c}" if chosen.can(Capability.PROVISIONS) else ""))
