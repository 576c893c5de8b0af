"""`gpucluster down`: delete a cluster, then check independently what is left (idempotent)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from gpucluster.cli import common
from gpucluster.domain import UNWITNESSED
from gpucluster.cli.complete import complete_cluster
from gpucluster.cli.options import options
from gpucluster.errors import ExitCode, GpuclusterError, UsageError
from gpucluster.infra.contract import Capability
from gpucluster.infra.registry import project_id, provisioning

if TYPE_CHECKING:
    from gpucluster.lifecycle.teardown import Downed
    from gpucluster.infra.contract import Plugin
    from rich.console import Console
    from gpucluster.ledger.store import Ledger


@click.command()
@click.argument("cluster", required=False, shell_complete=complete_cluster)
@click.option("--all", "all_", is_flag=True, help="Every cluster the ledger says may still exist.")
@click.option("--cloud", default=None, type=click.Choice(provisioning()),
              help="The cluster's cloud, when the ledger does not know the cluster.")
@click.option("--force", is_flag=True, help="If a live gpucluster process owns the cluster, stop it (SIGTERM) and "
              "wait for its own teardown first.")
@click.option("--any-owner", is_flag=True, help="Also delete other owners' resources under this name (other homes, "
              "other people in the account), and a stack another owner made; names each owner and asks.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per cluster with the verdict.")
@click.option("--project", default=None, help="gcp: the project to check for leftovers [default: the one the "
              "cluster was made in, else the usual resolution order].")
@click.option("--ack-unwitnessed", is_flag=True, help="You checked by hand the nodes whose reaper was killed (or "
              "whose session was cut) and nothing of the run is left there: no check gpucluster can run finds a "
              "process the job detached there, so without this those runs stay 'not verified'. Recorded with "
              "each such run.")
@click.option("--context", default=None, metavar="NAME", help="kubernetes: the kubeconfig context the cluster's "
              "runs used (checked against the ledger); once that one is gone from the kubeconfig (renamed), the "
              "context to look for their objects in instead.")
@options("state")
def down(cluster, all_, cloud, force, any_owner, yes, as_json, project, ack_unwitnessed, context):
    """Delete a cluster, then check independently (by tag, by run id) what is left (idempotent).

    Only what is ours is deleted: resources another owner made under the same name are listed as
    "not ours" and left alone (--any-owner deletes them too, after naming each owner). The verdict
    has three states: verified (every check ran, nothing of ours found), leftovers (listed), or not
    verified (each check that could not run, and why). Exit 0 only when verified; 3 otherwise; 2
    when a live gpucluster process owns the cluster (without --force nothing is touched).

    \b
    Examples:
      gpucluster down gpucluster-aws-3f9c
      gpucluster down gpucluster-local-3f9c --force   # stop the run that owns it, then check
      gpucluster down --all --yes
      gpucluster down gpucluster-local --ack-unwitnessed   # a killed reaper's node, checked by hand
      gpucluster down lab-cluster --cloud aws --state s3://team-state --any-owner
      gpucluster down lab --context lab-renamed   # kubernetes: its recorded context was renamed
    """
    from gpucluster.lifecycle.teardown import refuse_busy

    ledger = common.ledger()
    targets, backends, project = _targets(ledger, cluster, all_, cloud, project)
    if context is not None:  # refused before anything is asked or touched
        _check_context(ledger, targets, backends, context, all_)
    out = common.console(stderr=as_json)
    if not targets:
        out.print("nothing to do: the ledger records no cluster that may still exist")
        if as_json:
            click.echo(json.dumps([]))
        return 0
    if not force:  # refuse before asking anything: a live run is not pulled from under its owner
        refuse_busy(targets)
    if any_owner:
        _name_owners(out, ledger, targets, backends, project)
    common.confirm(f"Delete {', '.join(sorted(targets))} and everything in it"
                   f"{' whoever made it' if any_owner else ''}?", yes)
    _offer_pulumi(targets, backends, yes)
    results = [_take_down_one(out, ledger, name, backends[c], force=force, project=project,
                              ack_unwitnessed=ack_unwitnessed, any_owner=any_owner, context=context)
               for name, c in sorted(targets.items())]  # each verdict is shown as soon as it is known
    if as_json:
        click.echo(json.dumps([r.verdict for r in results], indent=2, default=str))
    return int(max((r.exit_code for r in results), default=ExitCode.OK))


def _targets(ledger: Ledger, cluster: str | None, all_: bool, cloud: str | None,
             project: str | None) -> tuple[dict[str, str], dict[str, Plugin], str | None]:
    """The clusters to take down (name -> cloud), their backends (the one lookup: the lifecycle is
    given them) and the checked `--project`."""
    from gpucluster.infra.registry import plugin
    from gpucluster.lifecycle.teardown import check_project, down_targets

    if cluster and all_:
        raise UsageError("give a cluster name or --all, not both")
    targets = down_targets(ledger, cluster, all_, cloud, provisioning())
    backends = {c: plugin(c) for c in set(targets.values())}
    return targets, backends, None if not project else check_project(project_id(project), targets, backends)


def _check_context(ledger: Ledger, targets: dict[str, str], backends: dict[str, Plugin], context: str, all_: bool) -> None:
    """`--context`: one cluster, of a backend whose runs name a kubeconfig context, its runs made in that context
    (or in one the kubeconfig no longer holds); else one line, exit 2."""
    from gpucluster.lifecycle.teardown import run_records

    if all_:
        raise UsageError("--context goes with one cluster's name (gpucluster down NAME --context C); --all takes "
                         "each cluster down in the context its runs recorded")
    for name, c in sorted(targets.items()):
        in_context = backends[c].ops.in_context
        if in_context is None:
            raise UsageError(f"--context {context} does not apply: cluster {name}'s cloud is {c} (--context names a "
                             "kubeconfig context, for a kubernetes cluster); leave it out")
        in_context(context, run_records(ledger, name))


def _offer_pulumi(targets: dict[str, str], backends: dict[str, Plugin], yes: bool) -> None:
    """The Pulumi CLI missing or too old: offer to install it; without it, down deletes by tag. A shared
    state without the team's passphrase stops here: nothing could be destroyed through it."""
    from gpucluster.infra.pulumi.state import StateSecretsMissing

    for c in sorted({c for c in targets.values() if backends[c].can(Capability.PROVISIONS)}):
        try:
            common.preflight(common.provider_for(c).preflight, yes)
        except StateSecretsMissing:
            raise
        except GpuclusterError:  # any other: down goes on by tag (said by the verdict)
            pass


def _take_down_one(out: Console, ledger: Ledger, name: str, chosen: Plugin, **how: Any) -> Downed:
    # Any: `take_down`'s keyword arguments (force, project, ack_unwitnessed, any_owner, context)
    """One cluster down, with a terminal's status line (the clock, what is deleted of what was open,
    what it waits on), then its verdict."""
    from gpucluster.api.records import take_down_one
    from gpucluster.cli.render import RichRunUI
    from gpucluster.cli.watch import cluster_watch

    with RichRunUI(out, quiet=True, watch=cluster_watch(ledger, name)) as ui:
        ui.phase("teardown")  # the one path: gpucluster.down's (api/records.py)
        result = take_down_one(name, chosen, ledger=ledger, say=lambda text: ui.message(f"{name}: {text}"), **how)
    _render(out, result, chosen)
    return result


def _name_owners(out: Console, ledger: Ledger, targets: dict[str, str], backends: dict[str, Plugin], project: str | None) -> None:
    """`--any-owner`: before the question, each owner whose resources would go (from a tag scan)."""
    from gpucluster.ownership import owners_of
    from gpucluster.lifecycle.teardown import ownership_of

    for name, c in sorted(targets.items()):
        if not backends[c].can(Capability.PROVISIONS):
            continue
        provider = common.provider_for(c, ownership=ownership_of(ledger, any_owner=True), project=project)
        found = provider.leftovers(name)
        owners = owners_of(found.leftovers)
        out.print(f"[yellow]{name}: {len(found.leftovers)} resource(s) found by tag"
                  + (f", made by owner(s) {', '.join(owners)}" if owners else "") + "[/yellow]")
        for lo in found.not_ours:  # standalone stacks stay out even now
            from gpucluster.ownership import not_ours_line

            out.print(f"  left alone: {not_ours_line(lo)}", highlight=False)


def _render(out: Console, result: Downed, chosen: Plugin) -> None:
    from gpucluster.ownership import not_ours_line

    name, c, check = result.verdict["cluster"], result.verdict["cloud"], result.check
    untouched = [not_ours_line(lo) for lo in (check.not_ours if check is not None else ())]
    if check is None:
        out.print(f"[red]{name}: {result.error}[/red]")
    elif check.verified:
        alone = f"; {len(untouched)} resource(s) not ours left alone" if untouched else ""
        out.print(f"[green]{name}: down; verified {check.how}: every check ran and found nothing "
                  f"of ours{alone}[/green]")
        for line in result.verdict.get("acknowledged", ()):
            out.print(f"  checked by you (--ack-unwitnessed): {line}")
    else:
        out.print(f"[bold red]{name}: {check.verdict.upper()}[/bold red]")
        for lo in check.leftovers:
            out.print(f"  still exists: {lo.kind} {lo.id} {lo.region or ''} {lo.detail}".rstrip())
        for line in check.unchecked:
            out.print(f"  not checked: {line}")
        out.print(f"  finish it with: gpucluster down {name}" + (
            f"   or   gpucluster gc --cloud {c}" if chosen.can(Capability.PROVISIONS) else ""))
        if any(line.startswith(UNWITNESSED) for line in check.unchecked):
            out.print("  a node without a witness: a process the job detached there carries nothing of the run. "
                      "Look on that node yourself (ps -ef; the job's own commands); once nothing of it is left: "
                      f"gpucluster down {name} --ack-unwitnessed")
    for line in untouched:
        out.print(f"  not touched: {line}", highlight=False)
