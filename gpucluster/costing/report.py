"""Cost reports: what each run cost (stored, or computed now when something was left billing),
with totals and groups, as a dict, CSV or a PNG."""

from __future__ import annotations

import datetime as _dt
import time
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from gpucluster.catalog.prices import Catalog
from gpucluster.errors import UsageError, not_allowed
from gpucluster.ledger.records import RunRecord

from .rules import money
from .runcost import run_cost
from gpucluster.states import JsonMapping, JsonObject

if TYPE_CHECKING:
    from gpucluster.infra.contract import Plugin


GROUPS = ("day", "cloud", "cluster", "chain")  # chain: a resumed job (gpucluster.ledger.chains), by its first run


def parse_since(value: str | None) -> float | None:
    """'YYYY-MM-DD' (UTC) or an ISO time -> Unix seconds; UsageError otherwise."""
    if value is None:
        return None
    try:
        d = _dt.datetime.fromisoformat(value.strip())
    except ValueError:
        raise UsageError(not_allowed("date", value, "YYYY-MM-DD or an ISO time such as 2026-11-22T10:00")) from None
    if d.tzinfo is None:
        d = d.replace(tzinfo=_dt.timezone.utc)
    return d.timestamp()


def report(records: Iterable[RunRecord], *, backends: Mapping[str, Plugin], group_by: str | None = None,
           now: float | None = None, catalog: Catalog | None = None,
           links: Mapping[str, tuple] | None = None, since: float | None = None) -> JsonObject:
    """Per-run costs (the stored cost if the run has one and nothing was left billing, else
    computed now) with totals, optionally grouped by day (UTC), cloud, cluster or chain: a run and
    every run resumed from it, transitively, as one job (its first run's id, and `run_ids`).
    `backends`: the plugins of the clouds the records name, by name, from the caller (a cloud
    missing from it is one no registered backend is called: see `run_cost`).
    `links` (`Ledger.resume_links()`) finds a chain's first run even when the report leaves it out
    (--since); without it, the runs' own `resumed_from` are used.
    `since`: each run counts what accrued from then on (a run that started before it, part of its
    cost: `periods.py`), and `--group-by day` splits a run's cost over the days it billed in."""
    from .periods import by_day

    if group_by is not None and group_by not in GROUPS:
        raise UsageError(not_allowed("group-by", group_by, GROUPS))
    now = time.time() if now is None else now
    records = list(records)
    known: dict[str, tuple] = {}
    if group_by == "chain":
        known = {r.id: (r.run.resumed_from, r.run.created_at) for r in records if r.id is not None}
        known.update(links or {})
    rows: list[JsonObject] = []
    days_of: dict[str, dict[str, Decimal]] = {}  # --group-by day: run id -> its cost per day
    for record in records:
        row, cut = _report_row(record, backends, now, catalog, since)
        if group_by == "day":
            days_of[row["run_id"]] = by_day(cut)
        if group_by == "chain":
            from gpucluster.ledger.chains import root_of

            row["chain"] = root_of(row["run_id"], known)
        rows.append(row)
    rows.sort(key=lambda r: r["created"])
    total = sum((Decimal(r["cost"]) for r in rows), Decimal(0))
    return {"currency": "USD", "runs": rows, "groups": _groups(rows, group_by, days_of) if group_by else [],
            "group_by": group_by, "total": str(total),
            "still_billing": [r["run_id"] for r in rows if r["still_billing"]]}


def _report_row(record: RunRecord, backends: Mapping[str, Plugin], now: float, catalog: Catalog | None,
                since: float | None) -> tuple[JsonObject, Any]:
    """One run's row of the report, and its cost cut at `since` (periods.py)."""
    from .periods import since as cut_at

    run = record.run
    if run.id is None or run.created_at is None:  # every ledger row has both (an estimate's run has no id)
        raise ValueError("report needs runs the ledger holds")
    stored = run.cost
    cost = stored if stored and not stored.get("still_billing") and "total" in stored else None
    if cost is None:
        cost = run_cost(record, backend=backends.get(run.cloud or ""), now=now, catalog=catalog)
    wall = None if not (run.ended_at and run.created_at) else round(float(run.ended_at) - float(run.created_at), 3)
    created = _dt.datetime.fromtimestamp(float(run.created_at), _dt.timezone.utc)
    cut = cut_at(cost, since, started=float(run.created_at))
    counted = sum((amount for amount, _a, _b in cut), Decimal(0)) if since is not None else Decimal(cost["total"])
    notes = list(cost.get("notes") or [])
    before = since is not None and float(run.created_at) < since
    if before:
        notes.insert(0, f"started before --since: {money(counted)} of its {money(cost['total'])} accrued since")
    row = {"run_id": run.id, "created": created.isoformat(timespec="seconds"),
           "day": created.strftime("%Y-%m-%d"), "cloud": run.cloud, "cluster": run.cluster,
           "status": run.status, "nodes": run.nodes, "wall_s": wall,
           "cost": str(counted), "still_billing": bool(cost.get("still_billing")),
           "note": "; ".join(notes), "price_date": cost.get("price_date"),
           "resumed_from": run.resumed_from}
    if before:
        row["cost_in_all"] = str(cost["total"])
    return row, cut


def _groups(rows: list[JsonObject], group_by: str, days_of: Mapping[str, dict[str, Decimal]]) -> list[dict]:
    """Runs, cost and wall time per group; by day: a run's cost in each day it billed in (its wall
    time in the day it started); by chain: the chain's run ids in creation order."""
    acc: dict[str, JsonObject] = {}
    for r in rows:
        parts = days_of[r["run_id"]] if group_by == "day" else {str(r[group_by]): Decimal(r["cost"])}
        for key, part in (parts or {r["day"]: Decimal(0)}).items():
            grp = acc.setdefault(key, {group_by: key if group_by == "day" else r[group_by], "runs": 0,
                                       "cost": Decimal(0), "wall_s": 0.0})
            grp["runs"] += 1
            grp["cost"] += part
        g = acc.get(str(r[group_by]))
        if g is not None:
            g["wall_s"] += r["wall_s"] or 0.0
        if group_by == "chain" and g is not None:
            g.setdefault("run_ids", []).append(r["run_id"])  # rows are in creation order
    return [{**g, "cost": str(g["cost"]), "wall_s": round(g["wall_s"], 3)} for _, g in sorted(acc.items())]


REPORT_CSV_FIELDS = ("run_id", "created", "cloud", "cluster", "status", "nodes", "wall_s", "cost", "still_billing",
                     "price_date", "note")


def report_csv(rep: JsonMapping) -> str:
    import csv
    import io

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=REPORT_CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rep["runs"]:
        writer.writerow(row)
    return buf.getvalue()


def plot_report(rep: JsonMapping, path: str | Path) -> Path:
    """A PNG of what each run cost (top) and how long it ran (bottom), one bar per run in the order they
    started, coloured by cloud: separate runs are separate bars, never points joined by a line.
    Needs matplotlib (the `plot` extra)."""
    from gpucluster.costing.plots import save_png

    return save_png(report_figure(rep), path, "--plot file", format="png")


def report_figure(rep: JsonMapping) -> Any:
    """The figure `plot_report` saves (a matplotlib Figure)."""
    from gpucluster.errors import require

    matplotlib = require("matplotlib", "plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = rep["runs"]
    if not runs:
        raise UsageError("no runs to plot (check --since / --cloud)")
    palette = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
    clouds = list(dict.fromkeys(r["cloud"] for r in runs))
    colors = [palette[clouds.index(r["cloud"]) % len(palette)] for r in runs]
    xs = list(range(len(runs)))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(6.5, 0.45 * len(runs) + 2.5), 5.6), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    top.bar(xs, [float(r["cost"]) for r in runs], color=colors)
    top.set_ylabel("cost (USD)")
    billing = [i for i, r in enumerate(runs) if r["still_billing"]]
    for i in billing:  # not final: something of it may still bill
        top.annotate("still billing", (i, float(runs[i]["cost"])), ha="center", va="bottom", fontsize=6, color="red")
    top.set_title(f"gpucluster runs: total {money(rep['total']).replace(',', '')}", fontsize=10)
    bottom.bar(xs, [(r["wall_s"] or 0) / 60 for r in runs], color=colors, alpha=0.75)
    bottom.set_ylabel("wall time (min)")
    bottom.set_xticks(xs, [r["run_id"] for r in runs], rotation=60, ha="right", fontsize=8 if len(runs) <= 20 else 6)
    for ax in (top, bottom):
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    from matplotlib.patches import Patch

    top.legend(handles=[Patch(color=palette[i % len(palette)], label=c) for i, c in enumerate(clouds)], fontsize=7)
    fig.tight_layout()
    return fig
