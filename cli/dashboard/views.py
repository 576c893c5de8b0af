"""What the dashboard's pages and JSON show, read from the ledger through the functions the CLI
itself calls: `gpucluster.runs` / `show` (api/records.py) for the runs, `status`'s `cluster_rows`
for the clusters, `cost report`'s `report_of` for the costs, `cost.run_cost` for a run still going.
Nothing here queries the ledger's tables itself."""

from __future__ import annotations

import time
from decimal import Decimal
from typing import TYPE_CHECKING

from gpucluster.states import RunStatus

if TYPE_CHECKING:
    from gpucluster.ledger.records import RunRow
    from gpucluster.ledger.records import StoredRun
    from gpucluster.ledger.records import RunRecord
    from gpucluster.states import JsonObject
    from gpucluster.ledger.store import Ledger

RUN_STATUSES = tuple(s.value for s in RunStatus)  # what `runs --status` takes


def money(value: object) -> str:
    from gpucluster.costing.cost import money as dollars

    return "-" if value is None else dollars(Decimal(str(value)))


def gpu_label(run: RunRow) -> str:
    """The GPU column: per-node GPUs and the machine (or its accelerator), as recorded in the spec."""
    spec = run.spec or {}
    what = spec.get("accelerator") or spec.get("instance_type") or ""
    gpus = run.gpus_per_node if run.gpus_per_node is not None else spec.get("gpus_per_node")
    if not gpus:
        return f"CPU {what}".strip() if what else "CPU"
    return f"{gpus} x {what}".strip() if what else f"{gpus} GPU"


def orphans(ledger: Ledger, rows: list[StoredRun]) -> set[str]:
    """The `running` rows whose process is gone (as `gpucluster runs` shows them: orphaned)."""
    if not any(r.status == RunStatus.RUNNING for r in rows):
        return set()
    from gpucluster.lifecycle.teardown import orphaned_runs

    return {str(r.id) for r in orphaned_runs(ledger)}


def runs_view(ledger: Ledger, *, limit: int = 200, cloud: str | None = None, status: str | None = None,
              q: str | None = None) -> list[JsonObject]:
    """The runs list (`gpucluster.runs`, newest first), each row as `runs --json` gives it plus
    `orphaned`, filtered by `q` (a part of the id, cluster, job or command)."""
    from gpucluster.api.records import runs

    rows = runs(limit, cloud=cloud, status=status, ledger=ledger)
    if q:
        needle = q.lower()
        rows = [r for r in rows if needle in " ".join(str(x) for x in (r.id, r.cluster, r.cloud, r.workload,
                                                                    " ".join(r.command or []))).lower()]
    gone = orphans(ledger, rows)
    return [{**r.to_dict(), "orphaned": r.id in gone} for r in rows]


def run_cells(row: JsonObject) -> JsonObject:
    """A runs-list row as the page shows it."""
    from gpucluster.cli.render import fmt_secs, fmt_time

    m = row.get("metrics") or {}
    cost = (row.get("cost") or {}).get("total")
    wall = None if not (row.get("ended_at") and row.get("created_at")) else row["ended_at"] - row["created_at"]
    status = "orphaned" if row["orphaned"] else row["status"]
    from gpucluster.ledger.records import RunRow

    return {"id": row["id"], "started": fmt_time(row.get("created_at")), "status": status, "cloud": row["cloud"],
            "cluster": row["cluster"], "nodes": row["nodes"], "gpu": gpu_label(RunRow.from_dict(row)),
            "job": row.get("workload") or " ".join(row.get("command") or [])[:60] or "-",
            "wall": fmt_secs(wall), "cost": "-" if cost is None else money(cost),
            "verdict": row.get("teardown") or "-",
            "accuracy": f"{m['accuracy']:.2%}" if isinstance(m.get("accuracy"), (int, float)) else "-"}


def run_view(ledger: Ledger, run_id: str) -> RunRecord:
    """One run's record as `gpucluster show` reads it (`gpucluster.show`, metric records included)."""
    from gpucluster.api.records import show

    return show(run_id, metrics=True, ledger=ledger)


def is_live(record: RunRecord) -> bool:
    """Whether the run is still going: `running` and its gpucluster process alive (as `logs --follow`)."""
    from gpucluster.api.records import owner_alive

    return record.run.status == RunStatus.RUNNING and owner_alive(record)


def run_cost_now(record: RunRecord, now: float | None = None) -> JsonObject | None:
    """The run's itemised cost: the stored one when final, else computed now (as `cost report` does)."""
    stored = record.cost
    if stored and not stored.get("still_billing") and "total" in stored:
        return stored
    from gpucluster.costing import cost
    from gpucluster.infra.registry import NAMES, plugin

    cloud = record.run.cloud
    try:
        return cost.run_cost(record, backend=plugin(cloud) if cloud in NAMES else None, now=now or time.time())
    except Exception:  # noqa: BLE001 - an old or hand-edited row: the page shows no cost rather than failing
        return stored


def series(records: list[JsonObject], key: str, t0: float) -> list[tuple[str, list[tuple[float, float]]]]:
    """`key` (loss, accuracy, samples_per_s) over seconds since the run began, one series per kind
    of record that carries it: per epoch, per step, and read from printed text."""
    import math

    names = {"epoch": "per epoch", "step": "per step", "text_metric": "printed"}
    out: dict[str, list[tuple[float, float]]] = {}
    for r in records:
        value, at = r.get(key), r.get("time")
        if r.get("kind") not in names or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if not isinstance(at, (int, float)) or not math.isfinite(value):
            continue
        out.setdefault(names[r["kind"]], []).append((float(at) - t0, float(value)))
    return [(name, sorted(points)) for name, points in out.items()]


def util_series(records: list[JsonObject], t0: float) -> tuple[list, list]:
    """GPU utilisation (mean of the node's GPUs) and CPU per node over time, from `util` records."""
    gpu: dict[int, list[tuple[float, float]]] = {}
    cpu: dict[int, list[tuple[float, float]]] = {}
    for r in records:
        if r.get("kind") != "util" or not isinstance(r.get("time"), (int, float)):
            continue
        node, at = int(r.get("node_rank") or 0), float(r["time"]) - t0
        vals = [float(g["util"]) for g in r.get("gpu") or []
                if isinstance(g, dict) and isinstance(g.get("util"), (int, float))]
        if vals:
            gpu.setdefault(node, []).append((at, sum(vals) / len(vals)))
        if isinstance(r.get("cpu_percent"), (int, float)):
            cpu.setdefault(node, []).append((at, float(r["cpu_percent"])))
    return ([(f"node {n}", sorted(p)) for n, p in sorted(gpu.items())],
            [(f"node {n}", sorted(p)) for n, p in sorted(cpu.items())])


def clusters_view(ledger: Ledger, now: float | None = None) -> list[JsonObject]:
    """What `gpucluster status` lists (`cluster_rows`), from the ledger alone: the clouds are not
    asked which resources ended on their own (status does that; the page refreshes every few seconds)."""
    from gpucluster.cli.status import cluster_rows

    return cluster_rows(ledger, now=now, observe=False)


def costs_view(ledger: Ledger) -> JsonObject:
    """`cost report` by day, with each day's spend split by cloud, and the totals by cloud and cluster."""
    from gpucluster.cli.cost import report_of

    rep = report_of(ledger, group_by="day")
    by_day: dict[str, dict[str, Decimal]] = {}
    by_cloud: dict[str, Decimal] = {}
    by_cluster: dict[str, Decimal] = {}
    for r in rep["runs"]:
        c = Decimal(r["cost"])
        day = by_day.setdefault(r["day"], {})
        day[r["cloud"]] = day.get(r["cloud"], Decimal(0)) + c
        by_cloud[r["cloud"]] = by_cloud.get(r["cloud"], Decimal(0)) + c
        by_cluster[r["cluster"]] = by_cluster.get(r["cluster"], Decimal(0)) + c
    return {"report": rep, "by_day": dict(sorted(by_day.items())), "by_cloud": by_cloud,
            "by_cluster": dict(sorted(by_cluster.items(), key=lambda kv: -kv[1]))}
