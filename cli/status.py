"""`gpucluster status`: clusters that may still exist, their state, age and cost."""

from __future__ import annotations

import json
import time
from decimal import Decimal
from typing import Any

import click

from gpucluster.cli import common
from gpucluster.errors import GpuclusterError


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
    links = ledger.resume_links() if rows else {}  # read once, not once per run
    for r in rows.values():
        runs = [ledger.get_run(rid, links=links) for rid in sorted(r["runs"])]
        latest = max(runs, key=lambda x: x.run.created_at).run
        r["runs"] = sorted(r["runs"])
        r["nodes"] = latest.nodes
        r["age_s"] = round(now - r["since"], 1)
        owner = lock_owner(r["cluster"])
        r["owner_pid"] = owner["pid"] if owner else None
        if owner:
            r["state"] = f"in use (pid {owner.get('pid')}, {owner.get('op')})"
        elif latest.status == "running":
            r["state"] = "orphaned (its process ended without teardown)"
        elif latest.teardown in (None, "kept"):
            r["state"] = "kept"
        else:
            r["state"] = f"teardown {latest.teardown}"
        r["hourly_usd"] = r["accrued_usd"] = None
        from gpucluster import cost
        from gpucluster.spec import ClusterSpec

        try:
            hourly = common.hourly(ClusterSpec.from_dict(latest.spec))
            r["hourly_usd"] = None if hourly is None else str(hourly)
            r["accrued_usd"] = str(sum((Decimal(cost.run_cost(run, now=now)["total"]) for run in runs), Decimal(0)))
        except (GpuclusterError, KeyError, ValueError, TypeError):  # an old or hand-edited spec row
            pass
        out.append(r)
    return sorted(out, key=lambda x: x["since"])


def node_gpu_state(cloud: str, name: str) -> list[dict[str, Any]]:
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
def status(as_json, with_gpus):
    """Clusters that may still exist: state, age, hourly and accrued cost.

    \b
    Examples:
      gpucluster status
      gpucluster status --gpus
    """
    from gpucluster.cli.render import fmt_secs

    rows = cluster_rows(common.ledger())
    if with_gpus:
        for r in rows:
            try:
                r["node_gpus"] = node_gpu_state(r["cloud"], r["cluster"])
            except GpuclusterError as exc:
                r["node_gpus"] = [{"note": f"not reachable: {exc.message}"}]
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return 0
    con = common.console()
    if not rows:
        con.print("no clusters: nothing recorded as still existing")
        return 0
    from rich.table import Table

    t = Table(show_edge=False)
    for col in ("cluster", "cloud", "state", "nodes", "age", "$/hour", "accrued", "resources"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["cluster"], r["cloud"], r["state"], str(r["nodes"]), fmt_secs(r["age_s"]),
                  common.money(None if r["hourly_usd"] is None else Decimal(r["hourly_usd"])),
                  common.money(None if r["accrued_usd"] is None else Decimal(r["accrued_usd"])), str(r["resources"]))
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
