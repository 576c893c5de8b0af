"""`gpucluster gc`: find what is tagged managed-by=gpucluster, is ours and no live cluster owns; delete it.

Another owner's resources (another home, another person in the same account) and standalone stacks
(made with `pulumi up -s STACK`) are listed with owner, age and hourly cost, never deleted, unless an
admin names them: `--any-owner --older-than DURATION` (every owner's, older than that, after a
question naming the owners) and `--stack STACK` (a standalone stack)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from gpucluster.cli import common
from gpucluster.errors import ExitCode
from gpucluster.infra.registry import provisioning
from gpucluster.states import TeardownVerdict

if TYPE_CHECKING:
    from gpucluster.lifecycle.teardown import Collected, Collection
    from gpucluster.domain import Leftover
    from gpucluster.states import JsonObject
    from collections.abc import Sequence

    from rich.console import Console

    from gpucluster.ledger.store import Ledger


def _swept() -> tuple[str, ...]:
    """The clouds `gc` sweeps: those gpucluster provisions, and those whose objects live in namespaces the
    user names (kubernetes: only with --namespace)."""
    from gpucluster.infra.registry import NAMES, traits

    return provisioning() + tuple(n for n in NAMES if "namespace" in traits(n).flags)


@click.command()
@click.option("--cloud", "clouds", multiple=True, type=click.Choice(_swept()),
              help=f"Cloud to sweep (repeatable) [default: {' and '.join(provisioning())}; an existing "
                   "cluster's (kubernetes) only when named, with --namespace].")
@click.option("--context", default=None, metavar="NAME", help="kubernetes: the kubeconfig context [default: current].")
@click.option("--namespace", "namespaces", multiple=True, metavar="NS",
              help="kubernetes: a namespace to sweep (repeatable; required with --cloud kubernetes).")
@click.option("--region", "regions", multiple=True, help="AWS region to sweep (repeatable) [default: the ledger's "
              "regions and your default region].")
@click.option("--project", default=None, help="GCP project [default: from google.auth / GOOGLE_CLOUD_PROJECT].")
@click.option("--include-kept", is_flag=True, help="Also delete clusters kept on purpose (`up`, `run --keep`).")
@click.option("--any-owner", is_flag=True, help="Also other owners' resources (other homes, other people in the "
              "account); needs --older-than and names the owners before asking.")
@click.option("--older-than", default=None, metavar="DURATION", help="Only resources made at least this long ago, "
              "e.g. 12h, 7d, 0s.")
@click.option("--stack", "stacks", multiple=True, metavar="STACK", help="Also sweep this standalone stack (made with "
              "`pulumi up -s STACK`), repeatable; never swept otherwise.")
@click.option("--yes", "-y", is_flag=True, help="Delete without asking.")
@click.option("--json", "as_json", is_flag=True, help="What was found (and deleted) as JSON.")
def gc(clouds, context, namespaces, regions, project, include_kept, any_owner, older_than, stacks, yes, as_json):
    """Find resources tagged managed-by=gpucluster that no live cluster owns; delete them after asking.

    Only this home's resources are deleted; other owners' and standalone stacks (`pulumi up`) are
    listed with owner, age and $/hour and left alone (see --any-owner, --stack).

    \b
    Examples:
      gpucluster gc --cloud aws            # list, then ask
      gpucluster gc --cloud aws --yes      # delete without asking
      gpucluster gc --cloud aws --any-owner --older-than 7d   # an admin: everyone's week-old leftovers
      gpucluster gc --cloud kubernetes --context lab --namespace ml   # this home's objects in ml
    """
    from gpucluster.errors import UsageError

    namespaced = [c for c in clouds if c not in provisioning()]  # objects in namespaces the user names
    if namespaced:
        cloud = namespaced[0]
        others = len(clouds) > 1 or regions or project or any_owner or stacks or include_kept
        _check_namespaced(cloud, bool(others), namespaces)
        from gpucluster.cli.gc_namespaces import sweep_namespaces

        return sweep_namespaces(cloud, context, namespaces, yes=yes, as_json=as_json)
    if context or namespaces:
        raise UsageError("--context and --namespace are for gc --cloud kubernetes")
    from gpucluster.infra.registry import plugin
    from gpucluster.ownership import parse_duration
    from gpucluster.lifecycle.prepare import check_place
    from gpucluster.lifecycle.teardown import Collected, Collection

    wanted = {c: plugin(c) for c in provisioning() if not clouds or c in clouds}  # the one lookup
    regions = check_place(wanted, regions=regions, project=project)  # refused (or defaulted) as `run` does
    age_limit = None if older_than is None else parse_duration(older_than)
    ledger = common.ledger()
    sweep = Collection(ledger, wanted, regions, project, include_kept, any_owner=any_owner, older_than=age_limit,
                       stacks=tuple(stacks), asked=bool(clouds))
    out = common.console(stderr=as_json)
    if sweep.not_installed:
        _not_installed(out, sweep.not_installed)
    by_cloud, skipped = sweep.look()
    result = Collected(sweep.flat(by_cloud), skipped, not_ours=sweep.not_ours())
    _left_alone(out, sweep)
    if result.found:
        result = _delete(out, sweep, result, by_cloud, yes=yes, named_owners=any_owner or bool(stacks))
    _render(out, result, sweep.where)
    if as_json:
        click.echo(json.dumps(_as_json(result, sweep), indent=2))
    return int(ExitCode.OK if result.check.verified else ExitCode.LEFTOVERS)


def _check_namespaced(cloud: str, others: bool, namespaces: tuple[str, ...]) -> None:
    """gc --cloud kubernetes: no other cloud's options, and at least one --namespace."""
    from gpucluster.errors import UsageError

    if others:
        raise UsageError(f"gc --cloud {cloud} takes only --context, --namespace, --yes and --json "
                         "(sweep the other clouds in another gc)")
    if not namespaces:
        raise UsageError(f"gc --cloud {cloud} needs --namespace NS (repeatable): it looks only where it is told")


def _not_installed(out: Console, not_installed: Sequence[str]) -> None:
    """The clouds not looked on: their package is not installed here."""
    out.print(f"gc finds cloud resources ({', '.join(provisioning())}) that gpucluster made and no run owns; not "
              f"looked for on {', '.join(not_installed)}: its package is not installed here (pip install "
              f"'gpucluster[{','.join(not_installed)}]') and no run of this home used it. local and ssh runs "
              "make no cloud resources (their processes: `gpucluster status`, `gpucluster down`)", highlight=False,
              markup=False)


def _delete(out: Console, sweep: Collection, result: Collected, by_cloud: dict[str, list[Leftover]], *, yes: bool,
            named_owners: bool) -> Collected:
    """List what was found, ask (naming the owners when others' were asked for), delete."""
    from gpucluster.ownership import owners_of

    _list(out, result.found)
    owners = owners_of(result.found)
    whose = f" of owner(s) {', '.join(owners)}" if named_owners else ""
    common.confirm(f"Delete these {len(result.found)} resource(s){whose}?", yes)
    result = sweep.delete(by_cloud)
    for err in result.errors:
        out.print(f"[red]could not delete {err}[/red]")
    return result


def _as_json(result: Collected, sweep: Collection) -> JsonObject:
    return {"verdict": result.check.verdict, "found": [lo.to_dict() for lo in result.found],
            "deleted": [lo.to_dict() for lo in result.deleted], "errors": result.errors,
            "unchecked": result.skipped, "live_clusters": sorted(sweep.live),
            "not_ours": [lo.to_dict() for lo in result.not_ours]}


def live_clusters(ledger: Ledger) -> set[str]:
    from gpucluster.lifecycle.teardown import live_clusters as live

    return live(ledger)


def _left_alone(out: Console, sweep: Collection) -> None:
    """The kept clusters, and what is not ours, with owner, age and $/hour: listed, never deleted."""
    from gpucluster.ownership import age

    if sweep.live:
        out.print(f"kept clusters left alone: {', '.join(sorted(sweep.live))} (remove one with `gpucluster down NAME`)")
    foreign = sweep.not_ours()
    if not foreign:
        return
    out.print(f"[yellow]left alone, not ours ({len(foreign)}): other owners' resources and standalone stacks "
              "(--any-owner / --stack to sweep them)[/yellow]")
    for lo in foreign:
        who = f"stack {lo.stack}" if lo.stack else f"owner {lo.owner or 'unknown'}"
        price = f"${lo.hourly}/h" if lo.hourly else "-"
        out.print(f"  {lo.kind:<18} {lo.id:<40} {lo.region or '-':<14} {who} {lo.made_by or '?'}, "
                  f"age {age(lo.since)}, {price}", highlight=False)


def _list(out: Console, found: list[Leftover]) -> None:
    for lo in found:
        out.print(f"  {lo.kind:<18} {lo.id:<40} {lo.region or '-':<14} {lo.detail}")


def _render(out: Console, result: Collected, where: str) -> None:
    check = result.check
    if check.verified:
        gone = f"deleted {len(result.deleted)} resource(s); " if result.deleted else ""
        kept = f"; {len(result.not_ours)} not ours left alone" if result.not_ours else ""
        out.print(f"[green]gc: verified ({where}): {gone}every check ran and nothing tagged "
                  f"managed-by=gpucluster that is ours is left{kept}[/green]")
        return
    for lo in result.found:
        out.print(f"[red]  still exists: {lo.kind} {lo.id} {lo.region or ''}[/red]")
    for line in result.skipped:
        out.print(f"[yellow]  not checked: {line}[/yellow]")
    if check.verdict == TeardownVerdict.LEFTOVERS:
        out.print(f"[bold red]gc: LEFTOVERS: {len(result.found)} resource(s) still exist[/bold red]")
    else:
        out.print(f"[bold red]gc: NOT VERIFIED: nothing found, but {len(result.skipped)} check(s) could not run; "
                  "fix the cause above (e.g. `gpucluster doctor`) and run gc again[/bold red]")
