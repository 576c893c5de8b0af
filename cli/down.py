"""`gpucluster down`: delete a cluster, then check independently what is left (idempotent)."""

from __future__ import annotations

import json
from typing import Any

import click

from gpucluster.cli import common
from gpucluster.errors import ExitCode, GpuclusterError, TeardownIncomplete, UsageError, did_you_mean
from gpucluster.infra.contract import Capability
from gpucluster.infra.registry import project_id, provisioning, traits


def _clusters_known(ledger: Any) -> dict[str, str]:
    """cluster -> cloud, for every cluster in the ledger (newest run wins)."""
    known: dict[str, str] = {}
    for run in ledger.list_runs(limit=None):
        known.setdefault(run["cluster"], run["cloud"])
    return known


def _open_clusters(ledger: Any) -> dict[str, str]:
    return {row["cluster"]: row["cloud"] for row in ledger.open_resources()}


def _finish_cluster_rows(ledger: Any, cluster: str, run_ids: set[str]) -> int:
    """After a verified teardown: every open row of `cluster` is gone; orphaned runs are closed.
    `run_ids`: the runs that had open rows before the teardown."""
    for row in ledger.open_resources(cluster):
        ledger.resource_deleted(row["run_id"], row["kind"], row["name"])
        run_ids.add(row["run_id"])
    for run in ledger.list_runs(limit=None):
        if run["cluster"] != cluster:
            continue
        if run["status"] == "running":
            ledger.finish_run(run["id"], status="failed", exit_code=int(ExitCode.FAILURE),
                              failure="the gpucluster process ended before the run finished (crash or kill); "
                                      "its resources were removed by `gpucluster down`",
                              teardown="verified", leftovers=[])
        elif run["id"] in run_ids or run["teardown"] in (None, "kept"):
            ledger.set_teardown(run["id"], "verified", [])
    return len(run_ids)


def _check_after_down(provider: Any, cloud: str, name: str, run_ids: set[str], ledger: Any) -> Any:
    """The independent check, as a three-state `Check`, by the backend's own `check_down` (by tag
    for clouds; by run id for processes, from the records of the runs that had open rows)."""
    from gpucluster.infra.registry import plugin

    runs = {rid: ledger.get_run(rid) or {} for rid in sorted(run_ids)}
    return plugin(cloud).ops.check_down(provider, name, runs)


@click.command()
@click.argument("cluster", required=False)
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
    from gpucluster.lifecycle import LedgerEvents
    from gpucluster.owner import busy_error, owner, owner_lock, stop_owner

    if cluster and all_:
        raise UsageError("give a cluster name or --all, not both")
    ledger = common.ledger()
    open_ = _open_clusters(ledger)
    known = _clusters_known(ledger)
    if all_:
        targets = dict(open_)
    elif cluster:
        c = cloud or open_.get(cluster) or known.get(cluster)
        if c is None:
            raise UsageError(f"cluster {cluster!r} is not in the ledger{did_you_mean(cluster, known)}; "
                             f"pass --cloud {'|'.join(provisioning())} to tear down a cluster made elsewhere with this home")
        targets = {cluster: c}
    else:
        listed = ", ".join(sorted(open_)) or "none"
        raise UsageError(f"name a cluster or pass --all (clusters that may still exist: {listed})")
    if project:
        project = project_id(project)
        others = sorted(n for n, c in targets.items() if "project" not in traits(c).flags)
        if others:
            raise UsageError(f"--project {project} is not allowed for {', '.join(others)}: it names a GCP project "
                             "(give it for gcp clusters only)")
    out = common.console(stderr=as_json)
    if not targets:
        out.print("nothing to do: the ledger records no cluster that may still exist")
        if as_json:
            click.echo(json.dumps([]))
        return 0
    if not force:  # refuse before asking anything: a live run is not pulled from under its owner
        for name in sorted(targets):
            info = owner(name)
            if info and not info.get("self"):
                raise busy_error(name, info)
    common.confirm(f"Delete {', '.join(sorted(targets))} and everything in it?", yes)
    verdicts = []
    worst = ExitCode.OK
    for name, c in sorted(targets.items()):
        say = (lambda text, n=name: out.print(f"[yellow]{n}: {text}[/yellow]"))
        events = LedgerEvents(ledger, name, say=say)
        verdict: dict[str, Any] = {"cluster": name, "cloud": c}
        try:
            if force:
                stopped = stop_owner(name, say=say)
                if stopped:
                    verdict["stopped_owner"] = stopped
            with owner_lock(name, "down"):
                had_open = {r["run_id"] for r in ledger.open_resources(name)}
                provider = common.provider_for(c)
                if project:
                    provider.scan_options["project"] = project
                not_run = []
                try:
                    provider.down(name, events)
                except TeardownIncomplete as exc:
                    not_run.append(f"delete: {exc.message}")
                check = _check_after_down(provider, c, name, had_open, ledger).with_unchecked(*not_run)
        except GpuclusterError as exc:
            verdict.update(verdict="not verified", error=exc.message)
            worst = max(worst, exc.exit_code if exc.exit_code == ExitCode.USAGE else ExitCode.LEFTOVERS)
            out.print(f"[red]{name}: {exc.message}[/red]")
            verdicts.append(verdict)
            continue
        verdict.update(check.to_dict())
        if check.verified:
            verdict["runs_closed"] = _finish_cluster_rows(ledger, name, had_open)
            out.print(f"[green]{name}: down; verified {traits(c).verified_how}: every check ran and found nothing[/green]")
        else:
            worst = max(worst, ExitCode.LEFTOVERS)
            runs = {r["run_id"] for r in ledger.open_resources(name)} | had_open
            for rid in runs:
                ledger.set_teardown(rid, check.verdict, verdict["leftovers"], verdict["unchecked"])
            out.print(f"[bold red]{name}: {check.verdict.upper()}[/bold red]")
            for lo in check.leftovers:
                out.print(f"  still exists: {lo.kind} {lo.id} {lo.region or ''} {lo.detail}".rstrip())
            for line in check.unchecked:
                out.print(f"  not checked: {line}")
            out.print(f"  finish it with: gpucluster down {name}" + (
                f"   or   gpucluster gc --cloud {c}" if traits(c).can(Capability.PROVISIONS) else ""))
        verdicts.append(verdict)
    if as_json:
        click.echo(json.dumps(verdicts, indent=2, default=str))
    return int(worst)
