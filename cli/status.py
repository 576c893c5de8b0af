"""`gpucluster status`: clusters that may still exist, their state, age and cost."""

from __future__ import annotations

import json
import time
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import click

from gpucluster.cli import common
from gpucluster.cli.options import options
from gpucluster.errors import GpuclusterError
from gpucluster.infra.registry import provisioning
from gpucluster.states import JsonMapping, JsonObject, RunStatus, TeardownVerdict

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from gpucluster.ledger.records import RunRecord, RunRow
    from rich.console import Console
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.teardown import CensusRow


def ended_resources(cloud: str, rows: list[JsonObject], lifetime: int | None) -> dict[int, tuple[float, str]]:
    """Ask the cluster's cloud which of its open rows no longer bill, and since when
    (`Operations.gone_at`; aws: instances the dead-man switch or a spot reclaim terminated)."""
    from gpucluster.infra.registry import NAMES, plugin

    ask = plugin(cloud).ops.gone_at if cloud in NAMES else None
    return ask(rows, lifetime) if ask is not None else {}


def close_ended(ledger: Ledger, now: float) -> dict[str, tuple[list[str], int]]:
    """For every cluster not in use (kept, or its process gone), close the rows of resources the
    cloud says are gone, at the end it reports, so their cost stops there; {cluster: (notes, rows closed)}."""
    from gpucluster.lifecycle.owner import owner as lock_owner

    by_cluster: dict[str, list[JsonObject]] = {}
    for res in ledger.open_resources():
        by_cluster.setdefault(res["cluster"], []).append(res)
    notes: dict[str, tuple[list[str], int]] = {}
    for cluster, rows in by_cluster.items():
        if lock_owner(cluster):
            continue  # a run or command is using it: it records its own resources
        _close_cluster(ledger, cluster, rows, now, notes)
    return notes


def _latest_run(runs: list[RunRecord]) -> RunRow:
    return max(runs, key=lambda x: x.run.created_at or 0).run


def _read_runs(ledger: Ledger, run_ids: Iterable[str], links: Mapping[str, tuple] | None = None) -> list[RunRecord]:
    """The runs of these ids that the ledger still holds (one may vanish between the list and the read:
    `runs --prune` in another process)."""
    got = (ledger.get_run(rid, links=links) for rid in run_ids)
    return [rec for rec in got if rec is not None]


def _close_cluster(ledger: Ledger, cluster: str, rows: list[JsonObject], now: float,
                   notes: dict[str, tuple[list[str], int]]) -> None:
    """One cluster's open rows: ask its cloud which ended, close those, note each (or why none was asked)."""
    runs = _read_runs(ledger, {r["run_id"] for r in rows})
    lifetime = (_latest_run(runs).spec or {}).get("max_lifetime_minutes") if runs else None
    try:
        ended = ended_resources(rows[0]["cloud"], rows, lifetime)
    except Exception as exc:  # noqa: BLE001 - any failure to ask the cloud (credentials, network) is a note
        notes[cluster] = ([f"not checked with {rows[0]['cloud']} ({type(exc).__name__}: {str(exc)[:160]}): "
                           "cost accrues up to now"], 0)
        return
    for res in rows:
        if res["id"] in ended:
            end, how = ended[res["id"]]
            ledger.resource_deleted(res["run_id"], res["kind"], res["name"], now=min(end, now))
            said, closed = notes.get(cluster, ([], 0))
            notes[cluster] = ([*said, f"{res['kind']} {res.get('cloud_id') or res['name']}: {how}"], closed + 1)


def cluster_rows(ledger: Ledger, now: float | None = None, observe: bool = True) -> list[JsonObject]:
    """Clusters that may still exist (open ledger rows), with age, hourly and accrued cost; with
    `observe`, first closes the rows of resources the cloud says are gone (`close_ended`)."""
    now = time.time() if now is None else now
    observed = close_ended(ledger, now) if observe else {}
    rows = _open_clusters(ledger, now)
    out = []
    links = ledger.resume_links() if rows else {}  # read once, not once per run
    for r in rows.values():
        runs = _read_runs(ledger, sorted(r["runs"]), links)
        if not runs:  # every run of its rows vanished from the ledger since they were listed
            continue
        latest = _latest_run(runs)
        r["runs"] = sorted(r["runs"])
        r["nodes"] = latest.nodes
        r["age_s"] = round(now - r["since"], 1)
        _state(ledger, r, latest, now)
        r["observed"], closed = observed.get(r["cluster"], ([], 0))
        r["hourly_usd"] = r["accrued_usd"] = None
        try:
            _costs(ledger, r, latest, runs, closed, links, now)
        except (GpuclusterError, KeyError, ValueError, TypeError):  # an old or hand-edited spec row
            pass
        _cap(ledger, r)
        out.append(r)
    return sorted(out, key=lambda x: x["since"])


def _open_clusters(ledger: Ledger, now: float) -> dict[str, JsonObject]:
    """{cluster: its row so far} from the open resource rows, and from the runs orphaned before their first."""
    rows: dict[str, JsonObject] = {}
    for res in ledger.open_resources():
        r = rows.setdefault(res["cluster"], {"cluster": res["cluster"], "cloud": res["cloud"], "since": res["requested_at"],
                                             "runs": set(), "resources": 0})
        r["since"] = min(r["since"], res["requested_at"])
        r["runs"].add(res["run_id"])
        r["resources"] += 1
    from gpucluster.lifecycle.teardown import orphaned_runs

    for run in orphaned_runs(ledger):  # killed before its first resource row (in `check`): its node programs may live on
        r = rows.setdefault(str(run.cluster), {"cluster": run.cluster, "cloud": run.cloud, "since": run.created_at,
                                               "runs": set(), "resources": 0})
        r["since"] = min(r["since"], run.created_at or now)
        r["runs"].add(run.id)
    return rows


def _state(ledger: Ledger, r: JsonObject, latest: RunRow, now: float) -> None:
    """owner_pid and state: in use, orphaned, kept (with its idle stop) or its teardown verdict."""
    from gpucluster.lifecycle.owner import owner as lock_owner

    owner = lock_owner(r["cluster"])
    r["owner_pid"] = owner["pid"] if owner else None
    if owner:
        r["state"] = f"in use (pid {owner.get('pid')}, {owner.get('op')})"
    elif latest.status == RunStatus.RUNNING:
        r["state"] = "orphaned (its process ended without teardown)"
    elif latest.teardown in (None, TeardownVerdict.KEPT):
        r["state"] = "kept"
    else:
        r["state"] = f"teardown {latest.teardown}"
    from gpucluster.lifecycle.kept import idle_left

    idle = idle_left(ledger, r["cluster"], now) if r["state"] == "kept" else None
    if idle is not None:  # `up --idle-minutes N`: the nodes stop themselves after N minutes without a job
        _idle_state(r, idle, latest.spec)


def _idle_state(r: JsonObject, idle: tuple[int, float], spec: JsonMapping | None) -> None:
    r["idle_minutes"], r["idle_stop_in_s"] = idle[0], round(max(0.0, idle[1]), 1)
    r["state"] += f", idle stop in {fmt_minutes(idle[1])}" if idle[1] > 0 else ", idle stop due now"
    keeps = _kept_billing(str(r["cloud"]), spec)
    if keeps:  # gcp: the GPU nodes go; the fee and the system pool bill until `down`
        r["idle_stop_keeps"] = keeps
        r["state"] += f" (of the GPU nodes; {keeps} bill until down)"


def _kept_billing(cloud: str, spec: JsonMapping | None) -> str:
    """What the cluster's priced plan bills with its GPU nodes gone (`costing.plan.kept_billing`: the fee,
    the system pool); "" for nothing, an unpriced backend, or a recorded spec that cannot be priced."""
    from gpucluster.costing.plan import kept_billing, plan
    from gpucluster.catalog.prices import load_catalog
    from gpucluster.infra.registry import NAMES, plugin
    from gpucluster.spec import ClusterSpec

    backend = plugin(cloud) if cloud in NAMES else None
    if backend is None or backend.pricing is None or spec is None:
        return ""
    try:
        return kept_billing(plan(ClusterSpec.from_dict(dict(spec)), load_catalog(), backend=backend))
    except (GpuclusterError, KeyError, ValueError, TypeError):  # an old or hand-edited spec row
        return ""


def _costs(ledger: Ledger, r: JsonObject, latest: RunRow, runs: list[RunRecord], closed: int,
           links: Mapping[str, tuple], now: float) -> None:
    """hourly_usd (the nodes still there) and accrued_usd (every run holding the cluster)."""
    from gpucluster.costing import cost
    from gpucluster.spec import ClusterSpec

    if latest.spec is None:  # no recorded spec: no price (as the TypeError of reading None was)
        return
    hourly = common.hourly(ClusterSpec.from_dict(latest.spec))
    if hourly is not None and closed and latest.nodes:  # some nodes are gone: they bill no more
        live = sum(1 if res["kind"] == "instance" else int((res.get("detail") or {}).get("node_count") or 1)
                   for res in ledger.open_resources(r["cluster"]) if res["kind"] in ("instance", "fleet"))
        hourly = hourly * live / latest.nodes
        r["state"] += f", {latest.nodes - live} of {latest.nodes} node(s) gone"
    r["hourly_usd"] = None if hourly is None else str(hourly)
    from gpucluster.infra.registry import NAMES, plugin

    backends = {c: plugin(c) for c in {run.run.cloud for run in runs} if c in NAMES}  # the runs' backends
    from gpucluster.infra.contract import Capability

    chosen = backends.get(str(r["cloud"]))
    if chosen is not None and not chosen.can(Capability.PROVISIONS):
        runs = runs + _jobs_since(ledger, r["cluster"], runs, links)  # what holds machines that exist: its jobs
    r["accrued_usd"] = str(sum((Decimal(cost.run_cost(run, backend=backends.get(run.run.cloud or ""),
                                                      now=now)["total"]) for run in runs), Decimal(0)))


def _cap(ledger: Ledger, r: JsonObject) -> None:
    """max_cost_usd (`up --max-cost`) and the share of it accrued."""
    from gpucluster.costing.guards import kept_cap, money

    caps = [c for c in (kept_cap(ledger, rid) for rid in r["runs"]) if c is not None]
    r["max_cost_usd"] = str(caps[0]) if caps else None  # `up --max-cost`: accrued against it
    if caps and r["accrued_usd"] is not None:
        r["state"] += f", {float(r['accrued_usd']) / caps[0]:.0%} of its cap {money(caps[0])}"


def _jobs_since(ledger: Ledger, cluster: str, runs: list[RunRecord], links: Mapping[str, tuple]) -> list[RunRecord]:
    """The ended jobs of a kept cluster of machines that exist (`exec`: a run each, its rows closed), since the
    cluster's first open run: the machines are not rented by gpucluster, so what the cluster has cost (an
    internal price, `gpucluster.costing.internal`) is what its jobs held; the `up` itself holds nothing."""
    since = min((float(x.run.created_at or 0) for x in runs), default=0.0)
    held = {x.run.id for x in runs}
    return _read_runs(ledger, [x.id for x in ledger.list_runs(limit=None, since=since)
                               if x.cluster == cluster and x.id not in held], links)


def fmt_minutes(seconds: float) -> str:
    m = max(0, int(seconds + 59) // 60)
    return f"{m} min" if m < 120 else f"{m // 60} h {m % 60:02d} min"


def node_gpu_state(cloud: str, name: str) -> list[JsonObject]:
    """Per-node GPU state of a live cluster, by its backend (aws: asked over ssh): one dict per node
    with reachable, problems and gpus (name, utilisation %, memory used/total MiB), or a note."""
    from gpucluster.infra.registry import plugin

    read = plugin(cloud).ops.node_gpu_state
    if read is None:
        return [{"note": f"per-node GPU state is read over ssh; not available for {cloud} clusters"}]
    return read(common.provider_for(cloud), name)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="JSON list for scripts.")
@click.option("--gpus", "with_gpus", is_flag=True,
              help="Also ask every reachable node for its GPU state (utilisation, memory) over ssh.")
@click.option("--cloud", "clouds", multiple=True, type=click.Choice(provisioning()),
              help="Also ask this cloud (repeatable), by tag: every gpucluster cluster in the account, ours, other "
                   "owners' and standalone stacks (`pulumi up -s`), with owner, age and $/hour.")
@click.option("--region", "regions", multiple=True, help="With --cloud aws: the regions to ask [default: the "
              "ledger's and your default region].")
@click.option("--project", default=None, help="With --cloud gcp: the project to ask.")
@options("state")
def status(as_json, with_gpus, clouds, regions, project):
    """Clusters that may still exist: state, age, hourly and accrued cost.

    With a shared Pulumi state (--state, GPUCLUSTER_STATE), the stacks in it are listed too, with
    the owner that made each.

    \b
    Examples:
      gpucluster status
      gpucluster status --gpus
      gpucluster status --cloud aws --region us-east-1     # everyone's clusters and standalone stacks there
    """
    from gpucluster.cli.render import fmt_secs

    ledger = common.ledger()
    rows = cluster_rows(ledger)
    found, unchecked = _census(ledger, clouds, regions, project)
    stacks = _shared_stacks(rows)
    if with_gpus:
        for r in rows:
            try:
                r["node_gpus"] = node_gpu_state(r["cloud"], r["cluster"])
            except GpuclusterError as exc:
                r["node_gpus"] = [{"note": f"not reachable: {exc.message}"}]
    if as_json:
        extra = ({"found_by_tag": found, "unchecked": unchecked} if clouds else {}) | (
            {"shared_state": stacks} if stacks is not None else {})
        click.echo(json.dumps({"clusters": rows, **extra} if extra else rows, indent=2, default=str))
        return 0
    con = common.console()
    _print_found(con, found, unchecked, stacks)
    if not rows:
        con.print("no clusters: nothing recorded as still existing")
        return 0
    from gpucluster.cli.tables import Col, fitted

    cells = [[r["cluster"], r["cloud"], r["state"], str(r["nodes"]), fmt_secs(r["age_s"]),
              common.money(None if r["hourly_usd"] is None else Decimal(r["hourly_usd"])),
              common.money(None if r["accrued_usd"] is None else Decimal(r["accrued_usd"])), str(r["resources"])]
             for r in rows]
    # the cluster name is typed next (down, exec, ssh): never cut; at 80 columns the others wrap or go
    con.print(fitted(con.width, [Col("cluster", keep=True), Col("cloud", drop=3), Col("state"), Col("nodes", drop=2),
                                 Col("age"), Col("$/hour", drop=4), Col("accrued"), Col("resources", drop=5)], cells))
    for r in rows:
        _row_notes(con, r)
    con.print("remove one with: gpucluster down CLUSTER   (all: gpucluster down --all)")
    return 0


def _row_notes(con: Console, r: JsonObject) -> None:
    """A cluster's notes under the table: what the cloud said had ended, then each node's GPUs (--gpus)."""
    for note in r.get("observed") or []:
        con.print(f"{r['cluster']}: {note}", highlight=False)
    for n in r.get("node_gpus") or []:
        if "note" in n:
            con.print(f"{r['cluster']}: {n['note']}")
            continue
        gpus = ", ".join(f"{g.get('name')} {g.get('util')}% {g.get('mem_used_mib')}/{g.get('mem_total_mib')} MiB"
                         for g in n["gpus"]) or "no GPU visible"
        problems = f"  ({'; '.join(n['problems'])})" if n["problems"] else ""
        con.print(f"{r['cluster']} node {n['node']} {n['host']}: {gpus}{problems}")


def _census(ledger: Ledger, clouds: tuple[str, ...], regions: tuple[str, ...], project: str | None
            ) -> tuple[list[CensusRow], list[str]]:
    """--cloud: what a tag scan finds, by cluster and owner (`teardown.census`); nothing is deleted."""
    if not clouds:
        return [], []
    from gpucluster.infra.registry import plugin
    from gpucluster.lifecycle.prepare import check_place
    from gpucluster.lifecycle.teardown import census

    backends = {c: plugin(c) for c in clouds}
    check_place(backends, regions=regions, project=project)
    return census(ledger, backends, tuple(regions), project)


def _shared_stacks(rows: list[JsonObject]) -> list[JsonObject] | None:
    """With a shared state: its stacks (listed through Pulumi) that this ledger does not hold, each
    with the owner its outputs name (`infra.program.run` exports the marks); None without one."""
    from gpucluster.infra.pulumi.state import shared

    if not shared():
        return None
    # Any: the driver is the Pulumi-backed providers' own (infra/pulumi), not part of the core's Provider contract
    provider: Any = common.provider_for(provisioning()[0])
    driver = provider.driver  # one state holds every cloud's stacks
    try:
        names = driver.list_stacks()
    except GpuclusterError as exc:
        return [{"note": f"the shared state could not be read: {exc.message}"}]
    known = {r["cluster"] for r in rows}
    out: list[JsonObject] = []
    for name in sorted(set(names) - known):
        try:
            outputs = driver.outputs(name) or {}
        except GpuclusterError as exc:
            out.append({"cluster": name, "note": f"stack {name}: outputs not readable ({exc.message})"})
            continue
        marks = dict(outputs.get("gpucluster_marks") or {})
        out.append({"cluster": name, "cloud": outputs.get("gpucluster_cloud") or outputs.get("cloud"),
                    "owner": marks.get("gpucluster-owner"), "stack": marks.get("gpucluster-stack"),
                    "made_by": f"{marks.get('gpucluster-user', '?')}@{marks.get('gpucluster-host', '?')}" if marks else None,
                    "resources": names[name]})
    return out


def _print_found(con: Console, found: list[CensusRow], unchecked: list[str], stacks: list[JsonObject] | None) -> None:
    from gpucluster.ownership import age

    for r in found:
        who = ("ours" if r["whose"] == "ours" else f"standalone stack {r['stack']}" if r["stack"]
               else f"not ours: owner {r['owner'] or 'unknown'}")
        price = f"${r['hourly_usd']}/h" if r["hourly_usd"] else "-"
        con.print(f"found by tag: {r['cloud']} {r['cluster']} ({who}, {r['made_by'] or '?'}), {r['resources']} "
                  f"resource(s) in {', '.join(r['regions']) or '-'}, age {age(r['since'])}, {price}", highlight=False)
    for line in unchecked:
        con.print(f"[yellow]not checked: {line}[/yellow]")
    for st in stacks or []:
        if "note" in st:
            con.print(f"[yellow]{st['note']}[/yellow]")
            continue
        who = f"owner {st['owner']} ({st['made_by']})" if st["owner"] else "owner unknown"
        con.print(f"in the shared state: stack {st['cluster']} ({st['cloud'] or '?'}, {who}), {st['resources']} "
                  f"resource(s); destroy it with: gpucluster down {st['cluster']} --cloud {st['cloud'] or 'CLOUD'}",
                  highlight=False)
