"""`gpucluster gc`: find what is tagged managed-by=gpucluster and no live cluster owns; delete it."""

from __future__ import annotations

import json
from typing import Any

import click

from gpucluster.cli import common
from gpucluster.errors import ExitCode, GpuclusterError
from gpucluster.infra.registry import provisioning


def live_clusters(ledger: Any) -> set[str]:
    """Clusters someone wants: kept ones (`up`, `run --keep`) and those a live process owns."""
    from gpucluster.owner import owner as lock_owner

    live = set()
    latest: dict[str, dict[str, Any]] = {}
    for run in ledger.list_runs(limit=None):
        latest.setdefault(run["cluster"], run)
    for name, run in latest.items():
        if lock_owner(name):
            live.add(name)
        elif run["status"] != "running" and run["teardown"] in (None, "kept"):
            live.add(name)  # kept on purpose: `up`, or `run --keep` (whatever the run's outcome)
    return live


def scopes(ledger: Any, clouds: tuple[str, ...], regions: tuple[str, ...], project: str | None) -> dict[str, dict]:
    """cloud -> where its sweep looks (the backend's `gc_scope`, from the ledger and the flags)."""
    from gpucluster.infra.registry import plugin

    open_rows = ledger.open_resources()
    return {c: plugin(c).needs_provisioner().gc_scope([r for r in open_rows if r["cloud"] == c],
                                                      ledger.list_runs(limit=200, cloud=c), regions, project)
            for c in clouds}


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
    from gpucluster.domain import Check
    from gpucluster.infra.registry import plugin

    ledger = common.ledger()
    live = set() if include_kept else live_clusters(ledger)
    out = common.console(stderr=as_json)
    wanted = tuple(c for c in provisioning() if not clouds or c in clouds)
    where_to = scopes(ledger, wanted, regions, project)

    def look() -> tuple[dict[str, list[Any]], list[str]]:
        found: dict[str, list[Any]] = {}
        skipped: list[str] = []
        for c in wanted:
            try:
                report = plugin(c).needs_provisioner().scan(None, None, where_to[c])
            except GpuclusterError as exc:
                skipped.append(f"{c}: not checked ({exc.message})")
                continue
            except Exception as exc:  # noqa: BLE001 - no credentials, no network: say so, go on
                skipped.append(f"{c}: not checked ({type(exc).__name__}: {exc})")
                continue
            found[c] = [f.leftover for f in report.found if f.cluster not in live]
            skipped += report.skipped
        return found, skipped

    by_cloud, skipped = look()
    found = [lo for c in wanted for lo in by_cloud.get(c, [])]
    where = ", ".join(plugin(c).needs_provisioner().gc_label(where_to[c]) for c in wanted)
    if live:
        out.print(f"kept clusters left alone: {', '.join(sorted(live))} (remove one with `gpucluster down NAME`)")
    errors: list[str] = []
    deleted: list[Any] = []
    if found:
        for lo in found:
            out.print(f"  {lo.kind:<18} {lo.id:<40} {lo.region or '-':<14} {lo.detail}")
        common.confirm(f"Delete these {len(found)} resource(s)?", yes)
        for c in wanted:
            if by_cloud.get(c):
                errors += plugin(c).needs_provisioner().delete(by_cloud[c], where_to[c], 600)
        for err in errors:
            out.print(f"[red]could not delete {err}[/red]")
        asked = by_cloud
        by_cloud, skipped = look()  # the verdict rests on a fresh look, not on the delete calls
        found = [lo for c in wanted for lo in by_cloud.get(c, [])]
        # deleted: what the fresh look saw gone, only where it could look again
        deleted = [lo for c, los in asked.items() if c in by_cloud for lo in los
                   if (lo.kind, lo.id) not in {(x.kind, x.id) for x in by_cloud[c]}]
    check = Check(tuple(found), tuple(skipped))
    if check.verified:
        gone = f"deleted {len(deleted)} resource(s); " if deleted else ""
        out.print(f"[green]gc: verified ({where}): {gone}every check ran and nothing tagged "
                  "managed-by=gpucluster is left[/green]")
    else:
        for lo in found:
            out.print(f"[red]  still exists: {lo.kind} {lo.id} {lo.region or ''}[/red]")
        for line in skipped:
            out.print(f"[yellow]  not checked: {line}[/yellow]")
        if check.verdict == "leftovers":
            out.print(f"[bold red]gc: LEFTOVERS: {len(found)} resource(s) still exist[/bold red]")
        else:
            out.print(f"[bold red]gc: NOT VERIFIED: nothing found, but {len(skipped)} check(s) could not run; "
                      "fix the cause above (e.g. `gpucluster doctor`) and run gc again[/bold red]")
    if as_json:
        click.echo(json.dumps({"verdict": check.verdict, "found": [lo.__dict__ for lo in found],
                               "deleted": [lo.__dict__ for lo in deleted], "errors": errors,
                               "unchecked": skipped, "live_clusters": sorted(live)}, indent=2))
    return int(ExitCode.OK if check.verified else ExitCode.LEFTOVERS)
