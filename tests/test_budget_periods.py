"""A run's cost split across periods (issue 48, item 3; docs/cost.md "Budgets", gpucluster/costing/periods.py).

A run that bills across a UTC midnight, a Monday 00:00 UTC or the first of a month counts in each
period only what accrued in it: the report's own lines (each resource's life x its launch-time
price, https://aws.amazon.com/ec2/pricing/ "Per-second billing") split by the seconds of each
resource's life in the period. The ledgers here are written at fixed times (the "scaled clock": the
ledger's own `now=` arguments), priced with the shipped catalog's real g5.xlarge price.
"""

from __future__ import annotations

import calendar
from decimal import Decimal

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py)


def ts(text: str) -> float:
    return float(calendar.timegm(__import__("time").strptime(text, "%Y-%m-%d %H:%M")))


def _ledger(path, runs):
    """runs: (run id, start, end or None (still billing)): each a fleet of 2 g5.xlarge in us-east-1."""
    from gpucluster.costing import cost
    from gpucluster.infra.registry import plugin
    from gpucluster.ledger.store import Ledger
    from gpucluster.spec import ClusterSpec

    ledger = Ledger(path / "ledger.sqlite3")
    for rid, start, end in runs:
        spec = ClusterSpec(cloud="aws", nodes=2, name=f"c-{rid}", region="us-east-1", instance_type="g5.xlarge",
                           run_id=rid)
        ledger.create_run(rid, cloud="aws", cluster=spec.name, nodes=2, gpus_per_node=1, command=["x"],
                          spec=spec.to_dict(), workload=None, prices=cost.price_snapshot(spec, backend=plugin("aws")),
                          now=start)
        detail = dict(instance_type="g5.xlarge", node_count=2, spot=False, public_ipv4=1, disk_gb=100, disk_type="gp3")
        ledger.resource_requested(rid, "fleet", f"{rid}-fleet", region="us-east-1", detail=detail, now=start)
        ledger.resource_created(rid, "fleet", f"{rid}-fleet", "fleet-1", now=start)
        if end is not None:
            ledger.resource_deleted(rid, "fleet", f"{rid}-fleet", now=end)
            ledger.finish_run(rid, status="succeeded", exit_code=0, teardown="verified", now=end)
            cost.record_run_cost(ledger, rid, backend=plugin("aws"), now=end)
    return ledger


def _report(ledger, since=None, group_by=None, now=None):
    from gpucluster.costing.cost import report
    from gpucluster.infra.registry import plugin

    runs = [ledger.get_run(r.id) for r in ledger.list_runs(limit=None, billed_since=since)]
    return report(runs, backends={"aws": plugin("aws")}, since=since, group_by=group_by, now=now)


def test_a_run_across_midnight_counts_in_each_day_what_accrued_in_it(tmp_path):
    """23:30 to 00:30 UTC: half of every line in each day; `--since` the second day counts that half."""
    ledger = _ledger(tmp_path, [("r-night", ts("2026-11-27 23:30"), ts("2026-11-28 00:30"))])
    whole = Decimal(ledger.get_run("r-night").run.cost["total"])
    assert whole > Decimal("2.01")  # 2 x $1.006/h for 1 h, disks and addresses
    rep = _report(ledger, group_by="day", now=ts("2026-11-28 12:00"))
    days = {g["day"]: Decimal(g["cost"]) for g in rep["groups"]}
    assert set(days) == {"2026-11-27", "2026-11-28"}
    assert days["2026-11-27"] == days["2026-11-28"] and abs(sum(days.values()) - whole) <= Decimal("0.00000001")
    since = _report(ledger, since=ts("2026-11-28 00:00"), now=ts("2026-11-28 12:00"))
    (row,) = since["runs"]
    assert Decimal(row["cost"]) == days["2026-11-28"] and row["cost_in_all"] == str(whole)
    assert row["note"].startswith("started before --since: $1.0")
    # a run that ended before --since is not in it at all
    assert _report(ledger, since=ts("2026-11-28 00:30"), now=ts("2026-11-28 12:00"))["runs"] == []


@pytest.mark.parametrize("period,start,boundary,now", [
    ("daily", "2026-11-27 18:00", "2026-11-28 00:00", "2026-11-28 06:00"),
    ("weekly", "2026-11-29 20:00", "2026-11-30 00:00", "2026-11-30 06:00"),  # Sunday -> Monday
    ("monthly", "2026-11-30 16:00", "2026-12-01 00:00", "2026-12-01 08:00"),
])
def test_the_budget_of_a_period_counts_only_what_a_run_across_its_start_accrued_in_it(
        tmp_path, monkeypatch, period, start, boundary, now):
    """A finished run (`start` to the boundary + 2 h) and a run still billing since before the
    boundary: the period's spend is their part after the boundary, not their whole cost (today's
    code counted neither: both started in the period before)."""
    from gpucluster.cli.budgets import standing

    (tmp_path / "config.yaml").write_text(f"budget:\n  {period}: 1000\n")
    monkeypatch.setenv("GPUCLUSTER_CONFIG", str(tmp_path / "config.yaml"))
    b = ts(boundary)
    ledger = _ledger(tmp_path, [("r-done", ts(start), b + 7200), ("r-open", b - 3600, None)])
    done = Decimal(ledger.get_run("r-done").run.cost["total"])
    (s,) = standing(ledger, now=ts(now))
    assert s.period == period and s.since == b
    # r-done: 2 h of its life in the period; r-open: billing from the boundary to now, at the same $/h
    done_life = b + 7200 - ts(start)
    want_done = done * Decimal(7200) / Decimal(str(done_life))
    hourly = done / Decimal(str(done_life / 3600))  # the same fleet, the same prices
    want_open = hourly * Decimal(str((ts(now) - b) / 3600))
    assert abs(s.spent - (want_done + want_open)) < Decimal("0.01"), (s.spent, want_done, want_open)
    assert s.spent < done + want_open  # not the whole of r-done


def test_a_cost_stored_without_lifetimes_counts_whole_in_the_period_its_run_started():
    from gpucluster.costing.periods import accrued_between

    old = {"total": "5.00", "lines": [{"cost": "5.00"}]}
    assert accrued_between(old, 100.0, 200.0, started=150.0) == Decimal("5.00")
    assert accrued_between(old, 200.0, 300.0, started=150.0) == 0
