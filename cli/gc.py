"""`gpucluster gc`: find what is tagged managed-by=gpucluster and no live cluster owns; delete it."""

from __future__ import annotations

import json
from typing import Any

import click

from gpucluster.cli import common
from gpucluster.errors import ExitCode
from gpucluster.infra.registry import provisioning


@click.command()
@click.option("--cloud", "clouds", multiple=True, type=click.Choice(provisioning()),
              help=f"Cloud to sweep (repeatable) [default: {' and '.join(provisioning())}].")
@click.option("--region", "regions", multiple=True, help="AWS region to sweep (repeatable) [default: the ledger's "
              "regions and your default region].")
@click.option("--project", default=None, help="GCP project [default: from google.auth / GOOGLE_CLOUD_PROJECT].")
@click.option("--include-kept", is_flag=True, help="Also delete clusters kept on purpose (`up`, `run --keep`).")
@click.option("--yes", "-y", is_flag=True, help="Delete without asking.")
@click.option("--json", "as_json", is_flag=True, help="What was found (and deleted) as JSON.")
def gc(clouds, regions, project, include_kept, yes, as_json):
    """Find resources tagged managed-by=gpucluster that no live cluster owns; delete them after asking.

    \b
    Examples:
      gpucluster gc --cloud aws            # list, then ask
      gpucluster gc --cloud aws --yes      # delete without asking
    """
    from gpucluster.infra.registry import plugin
    from gpucluster.prepare import check_place
    from gpucluster.teardown import Collected, Collection

    wanted = {c: plugin(c) for c in provisioning() if not clouds or c in clouds}  # the one lookup
    regions = check_place(wanted, regions=regions, project=project)  # refused (or defaulted) as `run` does
    ledger = common.ledger()
    sweep = Collection(ledger, wanted, regions, project, include_kept)
    out = common.console(stderr=as_json)
    by_cloud, skipped = sweep.look()
    result = Collected(sweep.flat(by_cloud), skipped)
    if sweep.live:
        out.print(f"kept clusters left alone: {', '.join(sorted(sweep.live))} (remove one with `gpucluster down NAME`)")
    if result.found:
        _list(out, result.found)
        common.confirm(f"Delete these {len(result.found)} resource(s)?", yes)
        result = sweep.delete(by_cloud)
        for err in result.errors:
            out.print(f"[red]could not delete {err}[/red]")
    _render(out, result, sweep.where)
    if as_json:
        click.echo(json.dumps({"verdict": result.check.verdict, "found": [lo.__dict__ for lo in result.found],
                               "deleted": [lo.__dict__ for lo in result.deleted], "errors": result.errors,
                               "unchecked": result.skipped, "live_clusters": sorted(sweep.live)}, indent=2))
    return int(ExitCode.OK if result.check.verified else ExitCode.LEFTOVERS)


def live_clusters(ledger: Any) -> set[str]:
    from gpucluster.teardown import live_clusters as live

    return live(ledger)


def _list(out: Any, found: list[Any]) -> None:
    for lo in found:
        out.print(f"  {lo.kind:<18} {lo.id:<40} {lo.region or '-':<14} {lo.detail}")


def _render(out: Any, result: Any, where: str) -> None:
    check = result.check
    if check.verified:
        gone = f"deleted {len(result.deleted)} resource(s); " if result.deleted else ""
        out.print(f"[green]gc: verified ({where}): {gone}every check ran and nothing tagged "
                  "managed-by=gpucluster is left[/green]")
        return
    for lo in result.found:
        out.print(f"[red]  still exists: {lo.kind} {lo.id} {lo.region or ''}[/red]")
    for line in result.skipped:
        out.print(f"[yellow]  not checked: {line}[/yellow]")
    if check.verdict == "leftovers":
        out.print(f"[bold red]gc: LEFTOVERS: {len(result.found)} resource(s) still exist[/bold red]")
    else:
        out.print(f"[bold red]gc: NOT VERIFIED: nothing found, but {len(result.skipped)} check(s) could not run; "
                  "fix the cause above (e.g. `gpucluster doctor`) and run gc again[/bold red]")
