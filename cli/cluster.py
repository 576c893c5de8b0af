"""`gpucluster up`, `down`, `status`, `logs`, `gc` and `doctor`.

Thin: parse, call the core/providers, render. Top-level imports are click and gpucluster's light
core only; rich, boto3, pulumi and google-* are imported inside the commands that use them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from decimal import Decimal
from typing import Any

import click

from gpucluster.errors import ExitCode, GpuclusterError, TeardownIncomplete, UsageError, did_you_mean, not_allowed
from gpucluster.spec import CLOUDS

CLOUD_CLOUDS = ("aws", "gcp")
EC2_GVT_QUOTA = "L-DB2E81BA"  # "Running On-Demand G and VT instances" (vCPUs)


from gpucluster.cli.console import make_console as _console  # noqa: E402


def provider_for(cloud: str) -> Any:
    """The provider that can tear down a cluster of `cloud` (tests replace this)."""
    if cloud in CLOUD_CLOUDS:
        from gpucluster.infra.pulumi_provider import PulumiProvider

        return PulumiProvider(cloud)
    from gpucluster.infra.registry import get_backend

    return get_backend(cloud)[0]


def _confirm(question: str, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"{question.rstrip('?')}: confirm with --yes when not on a terminal")
    if not click.confirm(question, default=False):
        raise click.exceptions.Abort()


def _hourly(spec: Any) -> Decimal | None:
    """Estimated $/hour of a spec, when the cost module can price it."""
    try:
        from gpucluster import cost
    except ImportError:
        return None
    try:
        return cost.estimate(spec, 1).hourly
    except (GpuclusterError, AttributeError, KeyError, ValueError):
        return None


def _money(value: Decimal | None) -> str:
    return "-" if value is None else f"${value.quantize(Decimal('0.01'))}"


class LedgerEvents:
    """ProvisionEvents -> ledger rows of `run_id` (or, for `down`, every open row of a cluster)."""

    def __init__(self, ledger: Any, cluster: str, run_id: str | None = None, region: str | None = None,
                 say=None):
        self.ledger, self.cluster, self.run_id, self.region = ledger, cluster, run_id, region
        self.say = say or (lambda text: None)

    def resource_requested(self, kind: str, name: str, **detail: Any) -> None:
        if self.run_id:
            self.ledger.resource_requested(self.run_id, kind, name, region=detail.pop("region", self.region),
                                           detail=detail or None)

    def resource_created(self, kind: str, name: str, cloud_id: str | None = None, **detail: Any) -> None:
        if self.run_id:
            self.ledger.resource_created(self.run_id, kind, name, cloud_id)

    def resource_deleted(self, kind: str, name: str, cloud_id: str | None = None) -> None:
        for row in self.ledger.open_resources(self.cluster):
            if row["kind"] == kind and (row["name"] == name or (cloud_id and row.get("cloud_id") == cloud_id)):
                self.ledger.resource_deleted(row["run_id"], row["kind"], row["name"])

    def message(self, text: str) -> None:
        self.say(text)


def _ledger():
    from gpucluster.ledger import Ledger

    return Ledger.open_default()


# -- up ---------------------------------------------------------------------------------------------
@click.command()
@click.option("--cloud", default="aws", show_default=True, metavar="aws|gcp", help="Where the cluster is created.")
@click.option("--nodes", "-n", default="2", show_default=True)
@click.option("--gpus-per-node", default=None)
@click.option("--name", default=None, help="Cluster name [default: gpucluster-CLOUD].")
@click.option("--region", default=None)
@click.option("--zone", default=None)
@click.option("--instance-type", "--machine-type", "instance_type", default=None)
@click.option("--spot", is_flag=True)
@click.option("--disk-gb", default="100", show_default=True)
@click.option("--max-lifetime", default="240", show_default=True,
              help="Minutes after which the nodes power themselves off, even if this machine is gone.")
@click.option("--ssh-cidr", default=None, help="Who may SSH to the nodes (e.g. 203.0.113.7/32).")
@click.option("--tag", "tags", multiple=True, metavar="KEY=VALUE")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
              help="Cloud option, as in the stack file (repeatable), e.g. --option efa=true.")
@click.option("--dry-run", is_flag=True, help="Show what would be declared (the real Pulumi program under "
              "Pulumi's mocks) and the estimate; create nothing, need no credentials.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before creating billable resources.")
@click.option("--json", "as_json", is_flag=True, help="Print the cluster as JSON (secrets left out).")
@click.option("--project", default=None, help="gcp: the project [default: stack config, GOOGLE_PROJECT... env, "
              "gcloud config, then the ADC project].")
def up(cloud, nodes, gpus_per_node, name, region, zone, instance_type, spot, disk_gb, max_lifetime, ssh_cidr, tags,
       options, dry_run, yes, as_json, project):
    """Create a cluster and leave it running (remove it with `gpucluster down NAME`).

    \b
    Example:
      gpucluster up --cloud aws --nodes 2 --instance-type g5.xlarge --ssh-cidr 203.0.113.7/32
    """
    from gpucluster.cli.runs import build_spec, check_cloud_flags
    from gpucluster.spec import new_run_id, resolve, validate

    if cloud not in CLOUD_CLOUDS:
        raise UsageError(not_allowed("cloud", cloud, CLOUD_CLOUDS)
                         + ("; local and ssh clusters need no `up`: use `gpucluster run`" if cloud in CLOUDS else ""))
    check_cloud_flags(cloud)  # e.g. --ssh-cidr with gcp: GKE would ignore it
    run_id = new_run_id()
    spec = build_spec(cloud, nodes, gpus_per_node, name, region, zone, instance_type, spot, disk_gb, max_lifetime,
                      ssh_cidr, tags, (), run_id, options)
    validate(spec)
    spec = resolve(spec)  # the location actually used, defaults included: stored and checked later
    from gpucluster.infra.gcp.access import spec_with_project

    spec = spec_with_project(spec, project, required=not dry_run)
    provider = provider_for(cloud)
    from gpucluster.cli.runs import print_dry_run, resolve_spec

    spec, warnings = resolve_spec(provider, spec, dry_run=dry_run)
    out = _console(stderr=as_json)
    for w in warnings:
        out.print(f"[yellow]note:[/yellow] {w}" if "detected" in w else f"[yellow]warning:[/yellow] {w}")
    if dry_run:
        hourly = _hourly(spec)
        out.print(f"[bold]plan[/bold]: create {spec.nodes} node(s) on {cloud} as cluster {spec.name}, "
                  + (f"about {_money(hourly)}/hour" if hourly is not None else "no price known here"))
        return print_dry_run(out, provider, None, spec, None, as_json)
    ledger = _ledger()
    ledger.check()  # read-only or damaged: said before anything is asked or created
    preflight = getattr(provider, "preflight", None)
    if preflight:
        preflight()  # a missing Pulumi CLI is reported before anything is asked or recorded
    hourly = _hourly(spec)
    rate = f"about {_money(hourly)}/hour" if hourly is not None else "billed by the hour (no price known here)"
    out.print(f"[bold]plan[/bold]: create {spec.nodes} node(s) on {cloud} as cluster {spec.name}, "
              f"{rate} until `gpucluster down {spec.name}`")
    _confirm("Create the cluster (it bills until you run `gpucluster down`)?", yes)

    snapshot = None
    try:
        from gpucluster import cost

        snapshot = cost.price_snapshot(spec)
    except (ImportError, GpuclusterError, AttributeError):
        pass
    ledger.create_run(run_id, cloud=cloud, cluster=spec.name, nodes=spec.nodes, gpus_per_node=spec.gpus_per_node,
                      command=["gpucluster", "up"], spec=spec.to_dict(), workload=None, prices=snapshot)
    ledger.phase_start(run_id, "provision")
    events = LedgerEvents(ledger, spec.name, run_id, spec.region, say=lambda t: out.print(f"[yellow]{t}[/yellow]"))
    try:
        cluster = provider.up(spec, events)
    except KeyboardInterrupt:
        ledger.phase_end(run_id, "provision", "interrupted", "stopped by Ctrl-C")
        ledger.finish_run(run_id, status="interrupted", exit_code=int(ExitCode.INTERRUPTED), failure="stopped by Ctrl-C")
        raise
    except GpuclusterError as exc:
        ledger.phase_end(run_id, "provision", "failed", exc.message)
        ledger.finish_run(run_id, status="failed", exit_code=int(exc.exit_code), failure=exc.message)
        raise
    ledger.phase_end(run_id, "provision", "ok")
    ledger.finish_run(run_id, status="succeeded", exit_code=0, teardown="kept")
    nodes_out = [{"rank": n.rank, "host": n.host, "private_ip": n.private_ip, "user": n.user,
                  "instance_id": n.instance_id, "gpus": n.gpus} for n in cluster.nodes]
    if as_json:
        click.echo(json.dumps({"run_id": run_id, "cluster": cluster.name, "cloud": cloud, "region": cluster.region,
                               "zone": cluster.zone, "nodes": nodes_out, "outputs": cluster.outputs,
                               "hourly_usd": None if hourly is None else str(hourly)}, indent=2, default=str))
        return 0
    from rich.table import Table

    t = Table(title=f"cluster {cluster.name} ({cloud} {cluster.zone or cluster.region or ''})", show_edge=False,
              title_justify="left")
    for col in ("rank", "host", "private ip", "id", "gpus"):
        t.add_column(col)
    for n in nodes_out:
        t.add_row(str(n["rank"]), n["host"] or "-", n["private_ip"] or "-", n["instance_id"] or "-", str(n["gpus"]))
    out.print(t)
    out.print(f"hourly cost: {rate} while it runs; remove it with: gpucluster down {cluster.name}")
    return 0


# -- down -------------------------------------------------------------------------------------------
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


def _check_after_down(provider: Any, cloud: str, name: str, run_ids: set[str], ledger: Any = None) -> Any:
    """The independent check, as a three-state `Check`: by tag for clouds; per run for local/ssh
    processes (a local run's stray processes, e.g. after a crash, are killed first; an ssh run's
    hosts are cleaned through the connection details its ledger rows hold)."""
    from gpucluster.domain import Check

    if cloud in CLOUD_CLOUDS:
        return Check.of(provider.leftovers(name))
    if cloud == "ssh" and ledger is not None:
        from gpucluster.infra.ssh.cleanup import clean_recorded_hosts
        from gpucluster.infra.ssh.launch import RUN_RESOURCE

        rows = []
        for rid in sorted(run_ids):  # every node the run reached, also those its teardown closed
            run = ledger.get_run(rid) or {}
            rows += [{**r, "cluster": name} for r in run.get("resources", []) if r["kind"] == RUN_RESOURCE]
        recorded = {r["run_id"] for r in rows}
        check = Check.of(clean_recorded_hosts(rows))
        return check.with_unchecked(*(
            f"run {rid}: the ledger holds no ssh connection details for it; check its hosts by hand"
            for rid in sorted(run_ids - recorded)))
    if cloud == "local":
        from gpucluster.procs import kill_run_processes

        for rid in run_ids:
            kill_run_processes(rid)
    check = Check()
    for rid in sorted(run_ids):
        check = check + Check.of(provider.leftovers(name, rid))
    return check


@click.command()
@click.argument("cluster", required=False)
@click.option("--all", "all_", is_flag=True, help="Every cluster the ledger says may still exist.")
@click.option("--cloud", default=None, type=click.Choice(CLOUD_CLOUDS),
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
    from gpucluster.owner import busy_error, owner, owner_lock, stop_owner

    if cluster and all_:
        raise UsageError("give a cluster name or --all, not both")
    ledger = _ledger()
    open_ = _open_clusters(ledger)
    known = _clusters_known(ledger)
    if all_:
        targets = dict(open_)
    elif cluster:
        c = cloud or open_.get(cluster) or known.get(cluster)
        if c is None:
            raise UsageError(f"cluster {cluster!r} is not in the ledger{did_you_mean(cluster, known)}; "
                             "pass --cloud aws|gcp to tear down a cluster made elsewhere with this home")
        targets = {cluster: c}
    else:
        listed = ", ".join(sorted(open_)) or "none"
        raise UsageError(f"name a cluster or pass --all (clusters that may still exist: {listed})")
    if project:
        from gpucluster.infra.gcp.access import resolve_project

        project = resolve_project(project, None, env={})[0]  # checks the ID's form
        others = sorted(n for n, c in targets.items() if c != "gcp")
        if others:
            raise UsageError(f"--project {project} is not allowed for {', '.join(others)}: it names a GCP project "
                             "(give it for gcp clusters only)")
    out = _console(stderr=as_json)
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
    _confirm(f"Delete {', '.join(sorted(targets))} and everything in it?", yes)
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
                provider = provider_for(c)
                if project:
                    provider.sweep_options["project"] = project
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
            how = "by tag" if c in CLOUD_CLOUDS else "by run id"
            out.print(f"[green]{name}: down; verified {how}: every check ran and found nothing[/green]")
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
                f"   or   gpucluster gc --cloud {c}" if c in CLOUD_CLOUDS else ""))
        verdicts.append(verdict)
    if as_json:
        click.echo(json.dumps(verdicts, indent=2, default=str))
    return int(worst)


# -- status -----------------------------------------------------------------------------------------
def cluster_rows(ledger: Any, now: float | None = None) -> list[dict[str, Any]]:
    """Clusters that may still exist (open ledger rows), with age, hourly and accrued cost."""
    from gpucluster.owner import owner as lock_owner

    now = time.time() if now is None else now
    rows: dict[str, dict[str, Any]] = {}
    for res in ledger.open_resources():
        r = rows.setdefault(res["cluster"], {"cluster": res["cluster"], "cloud": res["cloud"], "since": res["requested_at"],
                                             "runs": set(), "resources": 0})
        r["since"] = min(r["since"], res["requested_at"])
        r["runs"].add(res["run_id"])
        r["resources"] += 1
    out = []
    for r in rows.values():
        runs = [ledger.get_run(rid) for rid in sorted(r["runs"])]
        latest = max(runs, key=lambda x: x["created_at"])
        r["runs"] = sorted(r["runs"])
        r["nodes"] = latest["nodes"]
        r["age_s"] = round(now - r["since"], 1)
        owner = lock_owner(r["cluster"])
        r["owner_pid"] = owner["pid"] if owner else None
        if owner:
            r["state"] = f"in use (pid {owner.get('pid')}, {owner.get('op')})"
        elif latest["status"] == "running":
            r["state"] = "orphaned (its process ended without teardown)"
        elif latest["teardown"] in (None, "kept"):
            r["state"] = "kept"
        else:
            r["state"] = f"teardown {latest['teardown']}"
        r["hourly_usd"] = r["accrued_usd"] = None
        try:
            from gpucluster import cost
            from gpucluster.spec import ClusterSpec

            hourly = _hourly(ClusterSpec.from_dict(latest["spec"]))
            r["hourly_usd"] = None if hourly is None else str(hourly)
            r["accrued_usd"] = str(sum((Decimal(cost.run_cost(run, now=now)["total"]) for run in runs), Decimal(0)))
        except (ImportError, GpuclusterError, KeyError, ValueError, TypeError):
            pass
        out.append(r)
    return sorted(out, key=lambda x: x["since"])


def node_gpu_state(cloud: str, name: str) -> list[dict[str, Any]]:
    """Per-node GPU state of a live cluster, asked over ssh (aws): one dict per node with
    reachable, problems and gpus (name, utilisation %, memory used/total MiB)."""
    if cloud != "aws":
        return [{"note": f"per-node GPU state is read over ssh; not available for {cloud} clusters"}]
    from gpucluster.infra.aws.outputs import cluster_from_outputs
    from gpucluster.infra.ssh.launch import SshLauncher

    outputs = provider_for(cloud).driver.outputs(name)
    if not outputs:
        return [{"note": "no stack outputs: the cluster is not up"}]
    cluster = cluster_from_outputs(outputs)
    return [{"node": r.rank, "host": r.label, "reachable": r.ok or bool(r.gpu_state), "problems": r.problems,
             "gpus": r.gpu_state} for r in SshLauncher().probe(cluster)]


@click.command()
@click.option("--json", "as_json", is_flag=True, help="JSON list for scripts.")
@click.option("--gpus", "with_gpus", is_flag=True,
              help="Also ask every reachable node for its GPU state (utilisation, memory) over ssh.")
def status(as_json, with_gpus):
    """Clusters that may still exist: state, age, hourly and accrued cost.

    \b
    Examples:
      gpucluster status
      gpucluster status --gpus
    """
    from gpucluster.cli.render import fmt_secs

    rows = cluster_rows(_ledger())
    if with_gpus:
        for r in rows:
            try:
                r["node_gpus"] = node_gpu_state(r["cloud"], r["cluster"])
            except GpuclusterError as exc:
                r["node_gpus"] = [{"note": f"not reachable: {exc.message}"}]
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return 0
    con = _console()
    if not rows:
        con.print("no clusters: nothing recorded as still existing")
        return 0
    from rich.table import Table

    t = Table(show_edge=False)
    for col in ("cluster", "cloud", "state", "nodes", "age", "$/hour", "accrued", "resources"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["cluster"], r["cloud"], r["state"], str(r["nodes"]), fmt_secs(r["age_s"]),
                  _money(None if r["hourly_usd"] is None else Decimal(r["hourly_usd"])),
                  _money(None if r["accrued_usd"] is None else Decimal(r["accrued_usd"])), str(r["resources"]))
    con.print(t)
    for r in rows:
        for n in r.get("node_gpus") or []:
            if "note" in n:
                con.print(f"{r['cluster']}: {n['note']}")
                continue
            gpus = ", ".join(f"{g.get('name')} {g.get('util')}% {g.get('mem_used_mib')}/{g.get('mem_total_mib')} MiB"
                             for g in n["gpus"]) or "no GPU visible"
            problems = f"  ({'; '.join(n['problems'])})" if n["problems"] else ""
            con.print(f"{r['cluster']} node {n['node']} {n['host']}: {gpus}{problems}")
    con.print("remove one with: gpucluster down CLUSTER   (all: gpucluster down --all)")
    return 0


# -- logs -------------------------------------------------------------------------------------------
@click.command()
@click.argument("run_id")
@click.option("--node", default=None, type=click.IntRange(0, 4096), help="Only this node's log.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the run ends.")
def logs(run_id, node, follow):
    """Print a run's per-node logs (node-N.log under the run's log directory).

    \b
    Examples:
      gpucluster logs r20261122-031500-1a2b3c --node 0
      gpucluster logs r20261122-031500-1a2b3c --follow
    """
    from pathlib import Path

    ledger = _ledger()
    run = ledger.get_run(run_id)
    if run is None:
        raise UsageError(f"run {run_id!r} is not in the ledger; list runs with 'gpucluster runs'")
    log_dir = Path(run.get("log_dir") or "")
    files = sorted(log_dir.glob("node-*.log"), key=lambda p: int(p.stem.split("-")[1])) if log_dir.is_dir() else []
    if node is not None:
        files = [p for p in files if p.stem == f"node-{node}"]
        if not files:
            have = sorted(p.stem for p in log_dir.glob("node-*.log")) if log_dir.is_dir() else []
            raise UsageError(not_allowed("node", node, ", ".join(have) or "none: the run has no node logs"))
    if not files:
        click.echo(f"run {run['id']} has no node logs in {log_dir}", err=True)
        return 0
    prefix = len(files) > 1
    offsets = {p: 0 for p in files}

    def pump() -> bool:
        grew = False
        for p in files:
            with open(p, "r", encoding="utf-8", errors="replace") as fh:
                fh.seek(offsets[p])
                chunk = fh.read()
                if chunk and not chunk.endswith("\n") and follow:
                    chunk = chunk[: chunk.rfind("\n") + 1]
                offsets[p] += len(chunk.encode("utf-8", errors="replace"))
            for line in chunk.splitlines():
                click.echo(f"[{p.stem.replace('-', ' ')}] {line}" if prefix else line)
            grew = grew or bool(chunk)
        return grew

    pump()
    if follow:
        try:
            while True:
                grew = pump()
                if not grew and (ledger.get_run(run["id"]) or {}).get("status") != "running":
                    break
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    return 0


# -- gc ---------------------------------------------------------------------------------------------
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


def _aws_regions(ledger: Any, extra: tuple[str, ...]) -> list[str]:
    regions = list(extra)
    for res in ledger.open_resources():
        if res["cloud"] == "aws" and res.get("region"):
            regions.append(res["region"])
    for run in ledger.list_runs(limit=200, cloud="aws"):
        region = (run.get("spec") or {}).get("region")
        if region:
            regions.append(region)
    if not extra:
        from gpucluster.infra.aws.catalog import DEFAULT_REGION
        from gpucluster.infra.aws.leftovers import default_regions as default_aws_regions

        # where a cluster made without --region went, and the region your AWS configuration names
        regions += [DEFAULT_REGION, *default_aws_regions()]
    return list(dict.fromkeys(regions))


@click.command()
@click.option("--cloud", "clouds", multiple=True, type=click.Choice(CLOUD_CLOUDS),
              help="Cloud to sweep (repeatable) [default: aws and gcp].")
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
    from gpucluster.infra import leftovers as sweep
    from gpucluster.domain import Check

    ledger = _ledger()
    live = set() if include_kept else live_clusters(ledger)
    out = _console(stderr=as_json)
    wanted = clouds or CLOUD_CLOUDS
    aws_regions = _aws_regions(ledger, regions) if "aws" in wanted else []

    def look() -> tuple[list[Any], list[str]]:
        found, skipped = [], []
        for c in wanted:
            try:
                if c == "aws":
                    report = sweep.scan("aws", live_clusters=live, regions=aws_regions)
                else:
                    report = sweep.scan("gcp", live_clusters=live, project=project)
            except GpuclusterError as exc:
                skipped.append(f"{c}: not checked ({exc.message})")
                continue
            except Exception as exc:  # noqa: BLE001 - no credentials, no network: say so, go on
                skipped.append(f"{c}: not checked ({type(exc).__name__}: {exc})")
                continue
            found += [f.leftover for f in report.found]
            skipped += report.skipped
        return found, skipped

    found, skipped = look()
    where = ", ".join(([f"aws {'/'.join(aws_regions)}"] if "aws" in wanted else [])
                      + (["gcp"] if "gcp" in wanted else []))
    if live:
        out.print(f"kept clusters left alone: {', '.join(sorted(live))} (remove one with `gpucluster down NAME`)")
    errors: list[str] = []
    deleted: list[Any] = []
    if found:
        for lo in found:
            out.print(f"  {lo.kind:<18} {lo.id:<40} {lo.region or '-':<14} {lo.detail}")
        _confirm(f"Delete these {len(found)} resource(s)?", yes)
        errors = sweep.delete_leftovers(found)
        for err in errors:
            out.print(f"[red]could not delete {err}[/red]")
        deleted = found
        found, skipped = look()  # the verdict rests on a fresh look, not on the delete calls
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


# -- doctor -----------------------------------------------------------------------------------------
def _check(name: str, ok: bool | None, detail: str, fix: str = "") -> dict[str, Any]:
    """ok: True passed, False failed (with a fix), None skipped/informational."""
    return {"check": name, "ok": ok, "detail": detail, "fix": fix if ok is False else ""}


def check_ssh() -> dict[str, Any]:
    import shutil
    import subprocess

    path = shutil.which("ssh")
    if not path:
        return _check("ssh client", False, "`ssh` is not on PATH (AWS and ssh clusters launch over OpenSSH)",
                      "install OpenSSH: `sudo apt-get install openssh-client` / `brew install openssh`")
    try:
        version = subprocess.run([path, "-V"], capture_output=True, text=True, timeout=10).stderr.strip()
    except (OSError, subprocess.TimeoutExpired):
        version = path
    return _check("ssh client", True, version or path)


def check_pulumi(pulumi_command: Any = None) -> list[dict[str, Any]]:
    from gpucluster.infra import automation

    try:
        cmd = automation.load_cli(pulumi_command)
    except GpuclusterError as exc:
        return [_check("pulumi CLI", False, exc.message.split(":")[0],
                       f"`curl -fsSL https://get.pulumi.com | sh` (needs {automation.MIN_PULUMI_VERSION}+; "
                       f"{automation.INSTALL_URL})")]
    checks = [_check("pulumi CLI", True, f"version {cmd.version} (needs {automation.MIN_PULUMI_VERSION}+)")]
    try:
        res = cmd.run(["plugin", "ls", "--json"], os.getcwd(), {"PULUMI_SKIP_UPDATE_CHECK": "true"})
        names = sorted({p.get("name") for p in json.loads(res.stdout or "[]")})
        missing = [p for p in ("aws", "gcp", "tls") if p not in names]
        detail = f"installed: {', '.join(names) or 'none'}"
        if missing:
            detail += f"; not yet: {', '.join(missing)} (installed automatically by the first `up`)"
        checks.append(_check("pulumi plugins", None if missing else True, detail))
    except Exception as exc:  # noqa: BLE001 - informational
        checks.append(_check("pulumi plugins", None, f"could not list plugins ({exc})"))
    return checks


def check_aws(region: str, session: Any = None) -> list[dict[str, Any]]:
    try:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        return [_check("aws credentials", False, "boto3 is not installed", "pip install 'gpucluster[aws]'")]
    session = session or boto3.session.Session()
    try:
        ident = session.client("sts", region_name=region).get_caller_identity()
    except (BotoCoreError, ClientError) as exc:
        return [_check("aws credentials", False, f"STS get_caller_identity failed: {exc}",
                       "configure credentials: `aws configure` (or `aws sso login --profile P` and "
                       "export AWS_PROFILE=P)")]
    checks = [_check("aws credentials", True, f"account {ident.get('Account')} as {ident.get('Arn')}")]
    try:
        q = session.client("service-quotas", region_name=region).get_service_quota(
            ServiceCode="ec2", QuotaCode=EC2_GVT_QUOTA)["Quota"]
        vcpus = int(float(q.get("Value", 0)))
        smallest = 4  # g5.xlarge
        if vcpus < smallest:
            checks.append(_check(f"EC2 G/VT vCPU quota ({region})", False,
                                 f"{vcpus} vCPUs for 'Running On-Demand G and VT instances': not even one g5.xlarge",
                                 f"request more: aws service-quotas request-service-quota-increase --service-code ec2 "
                                 f"--quota-code {EC2_GVT_QUOTA} --desired-value 64 --region {region}"))
        else:
            checks.append(_check(f"EC2 G/VT vCPU quota ({region})", True,
                                 f"{vcpus} vCPUs: room for {vcpus // smallest} g5.xlarge or "
                                 f"{vcpus // 48} g5.12xlarge nodes"))
    except (BotoCoreError, ClientError) as exc:
        checks.append(_check(f"EC2 G/VT vCPU quota ({region})", None, f"could not read quota {EC2_GVT_QUOTA}: {exc}"))
    return checks


def check_gcp(project: str | None = None, region: str | None = None) -> list[dict[str, Any]]:
    from gpucluster.infra.gcp.access import doctor_checks

    return doctor_checks(project, region)


def check_home() -> dict[str, Any]:
    from gpucluster.infra import automation

    try:
        path = automation.passphrase_file()
    except GpuclusterError as exc:
        return _check("state directory", False, exc.message, exc.message.rsplit("fix it with: ", 1)[-1])
    return _check("state directory", True, f"{path.parent} (Pulumi passphrase file mode 0600)")


@click.command()
@click.option("--cloud", "clouds", multiple=True, type=click.Choice(CLOUD_CLOUDS),
              help="Check only this cloud (repeatable) [default: both].")
@click.option("--region", default=None, help="Region for the quota check [default: aws: your default or us-east-1; "
              "gcp: us-central1].")
@click.option("--project", default=None, help="gcp: the project to check [default: the usual resolution order].")
@click.option("--json", "as_json", is_flag=True, help="The checks as JSON.")
def doctor(clouds, region, project, as_json):
    """Check what cloud runs need: credentials, Pulumi CLI and plugins, EC2 GPU quota, ssh client.

    \b
    Example:
      gpucluster doctor --cloud aws --region us-west-2
    """
    clouds = clouds or CLOUD_CLOUDS
    checks = [check_home(), check_ssh(), *check_pulumi()]
    if "aws" in clouds:
        aws_region = region
        if aws_region is None:
            from gpucluster.infra.aws.catalog import DEFAULT_REGION

            aws_region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION
        checks += check_aws(aws_region)
    if "gcp" in clouds:
        checks += check_gcp(project, region if "aws" not in clouds or len(clouds) == 1 else None)
    if as_json:
        click.echo(json.dumps(checks, indent=2))
    else:
        for c in checks:
            mark = {True: "ok  ", False: "FAIL", None: "note"}[c["ok"]]
            click.echo(f"{mark}  {c['check']}: {c['detail']}")
            if c["fix"]:
                click.echo(f"      fix: {c['fix']}")
    return int(ExitCode.FAILURE if any(c["ok"] is False for c in checks) else ExitCode.OK)
