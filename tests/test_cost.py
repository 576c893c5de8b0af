"""Billing rules, estimates, the cost of finished/failed runs from a real ledger, what-if
projections and reports, each checked against hand-computed figures."""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpucluster.costing import cost as C
from gpucluster.catalog.prices import load_catalog
from gpucluster.errors import UsageError
from gpucluster.infra.registry import NAMES, plugin
from gpucluster.ledger.store import Ledger
from gpucluster.ledger.records import RunRecord
from gpucluster.spec import ClusterSpec

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

FIXTURES = Path(__file__).parent / "fixtures" / "cost"
T0 = 1_795_000_000.0  # 2026-11-18 UTC
# what a command looks up in the registry and gives the cost engine (it never looks a backend up itself)
BACKENDS = {name: plugin(name) for name in NAMES}
MAX_NODES = max(b.traits.max_nodes for b in BACKENDS.values())


def backend(of):
    """The plugin of a spec's, a run dict's or a run record's cloud."""
    return plugin(of["cloud"] if isinstance(of, dict) else of.cloud if isinstance(of, ClusterSpec) else of.run.cloud)


@pytest.fixture()
def catalog():
    return load_catalog(False)


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


# -- billing rules ----------------------------------------------------------------------------
def test_per_second_with_60s_minimum():
    assert C.billed_seconds(59) == 60
    assert C.billed_seconds(0.5) == 60
    assert C.billed_seconds(60) == 60
    assert C.billed_seconds(61.2) == 62
    assert C.billed_seconds(0) == 0
    # 59 s of a g5.xlarge is billed as 60 s: 1.006 / 60 = 0.016766667 (to the nano-dollar)
    billed, cost = C.time_cost(Decimal("1.006"), 59)
    assert billed == 60 and cost == Decimal("0.016766667")
    # disks have no minimum: 200 GB gp3 for 59 s = 200 * 0.08 * 59 / (730 * 3600)
    billed, cost = C.disk_cost(Decimal("0.08"), 200, 59)
    assert billed == 59 and cost == (Decimal(16) * 59 / 2628000).quantize(C.NANO)


def test_59_seconds_of_an_instance_from_the_ledger_is_billed_60(catalog):
    spec = ClusterSpec(cloud="aws", nodes=1, instance_type="g5.xlarge")
    run = {"id": "r1", "cloud": "aws", "prices": C.price_snapshot(spec, catalog, backend=backend(spec)), "resources": [
        {"kind": "instance", "name": "n0", "region": "us-east-1", "requested_at": T0, "created_at": T0 + 5,
         "deleted_at": T0 + 59, "confirmed_gone": True, "detail": {"instance_type": "g5.xlarge", "spot": False}}]}
    out = C.run_cost(RunRecord.from_dict(run), now=T0 + 1000, catalog=catalog, backend=backend(run))
    (line,) = out["lines"]
    assert line["billed_seconds"] == 60 and Decimal(out["total"]) == Decimal("0.016766667")
    assert out["still_billing"] == []


def test_two_g5_12xlarge_for_3h_with_200gb_gp3(catalog):
    spec = ClusterSpec(cloud="aws", nodes=2, instance_type="g5.12xlarge", disk_gb=200, region="us-east-1")
    est = C.estimate(spec, 3, catalog=catalog, backend=backend(spec))
    lines = {ln["category"]: ln for ln in est.lines}
    # 2 x 5.672 $/h x 3 h = 34.032; disks 2 x 200 GB x 0.08 $/GB-month x 3 h / 730 h = 0.131506849...
    assert Decimal(lines["instances"]["total"]) == Decimal("34.032")
    assert abs(Decimal(lines["disks"]["total"]) - Decimal(96) / 730) < Decimal("0.000000002")
    assert lines["gpus"]["description"] == "8 x A10G" and Decimal(lines["gpus"]["total"]) == 0
    # each node's public IPv4 address: 2 x 0.005 $/h x 3 h (AWS bills every public IPv4 since 2024-02-01)
    assert lines["public IPv4"]["description"] == "2 public IPv4 addresses"  # the fleet's two nodes
    assert Decimal(lines["public IPv4"]["total"]) == Decimal("0.03")
    assert est.total.quantize(C.CENT) == Decimal("34.19")
    assert est.hourly.quantize(Decimal("0.0001")) == Decimal("11.3978")  # 11.344 + 400*0.08/730 + 0.01
    assert est.per_gpu_hour == Decimal("1.418") and est.gpus == 8
    assert est.price_date == "2026-11-22"


def test_gke_two_n1_standard_16_with_4_v100_for_90_min(catalog):
    spec = ClusterSpec(cloud="gcp", nodes=2, instance_type="n1-standard-16", gpus_per_node=4,
                       accelerator="nvidia-tesla-v100", zone="us-central1-a", disk_gb=100, disk_type="pd-balanced")
    # by hand: VMs 2 x 0.76 x 1.5 = 2.28; GPUs 8 x 2.48 x 1.5 = 29.76; disks 200 GB x 0.10 x 1.5/730 = 0.041095890;
    # GKE fee 0.10 x 1.5 = 0.15; system pool n1-standard-2 (2 x 0.031612 + 7.5 x 0.0042368 = 0.095/h) x 1.5 =
    # 0.1425 and its 50 GB pd-balanced x 0.10 x 1.5/730 = 0.010273973; each node's external IPv4
    # (issue 26) 0.005 x 1.5: 2 x 0.0075 = 0.015 for the GPU nodes, 0.0075 for the system node
    paid = C.estimate(spec, "1.5", catalog=catalog, backend=backend(spec))
    by: dict = {}
    for ln in paid.lines:
        key = (ln["category"], ln["description"].startswith("system pool"))
        by[key] = by.get(key, Decimal(0)) + Decimal(ln["total"])
    assert by == {("instances", False): Decimal("2.295"), ("gpus", False): Decimal("29.76"),
                  ("disks", False): Decimal("0.041095890"), ("cluster fee", False): Decimal("0.15"),
                  ("instances", True): Decimal("0.15"), ("disks", True): Decimal("0.010273973")}
    assert "2 x external IPv4 (on-demand)" in {ln["description"] for ln in paid.lines}
    assert paid.total == Decimal("32.406369863")
    # 1.52 + 0.01 + 19.84 + 0.10 + 0.0274 + 0.0950 + 0.005 + 0.0068
    assert paid.hourly.quantize(Decimal("0.00001")) == Decimal("21.60425")
    free = C.estimate(spec, "1.5", catalog=catalog, free_tier=True, backend=backend(spec))
    by_free = {ln["category"]: Decimal(ln["total"]) for ln in free.lines}
    assert by_free["cluster fee"] == 0 and free.total == Decimal("32.256369863")
    # the component always makes a zonal cluster: a region alone gets its first V100 zone, so the
    # free tier covers it too
    by_region = C.estimate(spec.replace(zone=None, region="us-central1"), "1.5", catalog=catalog, free_tier=True,
                           backend=backend(spec))
    assert by_region.total == free.total


def test_default_two_node_gcp_run_is_priced_as_the_component_declares_it(catalog):
    # issue 13: the component's default is n1-standard-4 with 1 V100 per node:
    # 2 x (0.19 + 2.48) + 0.10 = $5.44/h, plus disks (2 x 100 GB pd-balanced), plus the system pool
    est = C.estimate(ClusterSpec(cloud="gcp", nodes=2), 1, catalog=catalog, backend=plugin("gcp"))
    hourly = {ln["description"]: Decimal(ln["hourly"]) for ln in est.lines}
    gpu_pool_and_fee = (hourly["2 x n1-standard-4 (on-demand)"] + hourly["2 x V100 (on-demand)"]
                        + hourly["GKE cluster fee (zonal)"])
    assert gpu_pool_and_fee == Decimal("5.44")
    assert hourly["200 GB pd-balanced"] == (Decimal("200") * Decimal("0.10") / 730).quantize(C.NANO)
    assert hourly["system pool: 1 x n1-standard-2 (on-demand)"] == Decimal("0.095")
    assert hourly["system pool: 50 GB pd-balanced"] == (Decimal("50") * Decimal("0.10") / 730).quantize(C.NANO)
    assert est.hourly == sum(hourly.values())
    assert est.gpus == 2 and not any("--gpus " in n or "no GPUs" in n for n in est.notes)
    # what keeps billing after the dead-man switch: fee + system pool + its disk + its external IPv4
    (after,) = [n for n in est.notes if "after the max lifetime" in n]
    assert "$0.21/h (0.2068)" in after and "scales to zero" in after
    assert hourly["2 x external IPv4 (on-demand)"] == Decimal("0.01")


def test_other_n1_shapes_are_priced_from_unit_prices(catalog):
    spec = ClusterSpec(cloud="gcp", nodes=1, instance_type="n1-highmem-8", gpus_per_node=1, region="us-central1")
    est = C.estimate(spec, 1, catalog=catalog, backend=backend(spec))
    inst = next(ln for ln in est.lines if ln["category"] == "instances")
    assert Decimal(inst["unit_price"]) == Decimal("0.031612") * 8 + Decimal("0.0042368") * 52
    assert inst["source"].startswith("derived")


@pytest.mark.parametrize("spec, hours, message", [
    (dict(cloud="aws", nodes=1, instance_type="g5.12xlarg"), 1, 'did you mean "g5.12xlarge"'),
    (dict(cloud="aws", nodes=1, instance_type="g5.xlarge", region="us-east-2"), 1, "region 'us-east-2'"),
    (dict(cloud="aws", nodes=0), 1, "nodes 0 is not allowed"),
    (dict(cloud="aws", nodes=-2), 1, "nodes -2 is not allowed"),
    (dict(cloud="aws", nodes=1), 0, "hours 0 is not allowed"),
    (dict(cloud="aws", nodes=1), "-3", "hours '-3' is not allowed"),
    (dict(cloud="aws", nodes=1), "soon", "hours 'soon'"),
    (dict(cloud="aws", nodes=1, instance_type="g5.xlarge", gpus_per_node=4), 1, "g5.12xlarge, g5.24xlarge"),
    (dict(cloud="gcp", nodes=1, gpus_per_node=3), 1, "V100 count per node 3"),
    (dict(cloud="gcp", nodes=1, instance_type="n1-standard-64", gpus_per_node=4), 1, "at most 48 vCPU"),
    (dict(cloud="gcp", nodes=1, instance_type="n2-standard-16"), 1, 'did you mean "n1-standard-16"'),
    (dict(cloud="gcp", nodes=1, disk_type="pd-sdd"), 1, 'did you mean "pd-ssd"'),
    (dict(cloud="aws", nodes=1, instance_type="g5.xlarge", region="eu-west-1", spot=True), 1,
     "no spot price for g5.xlarge in eu-west-1"),
])
def test_bad_input_is_one_clear_usage_error(catalog, spec, hours, message):
    with pytest.raises(UsageError) as info:
        C.estimate(ClusterSpec(**spec), hours, catalog=catalog, backend=backend(spec))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_local_runs_cost_nothing_and_say_so(catalog):
    est = C.estimate(ClusterSpec(cloud="local", nodes=4), 1, catalog=catalog, backend=plugin("local"))
    assert est.total == 0 and "$0" in est.notes[0]
    out = C.run_cost(RunRecord.from_dict({"id": "l1", "cloud": "local", "resources": [
        {"kind": "process", "name": "agent-0", "requested_at": T0, "deleted_at": None, "confirmed_gone": False}]}),
        backend=plugin("local"))
    assert out["total"] == "0" and out["local"] and "$0" in out["notes"][0]


# -- runs from a real ledger --------------------------------------------------------------------
def _ledger(tmp_path) -> Ledger:
    return Ledger(tmp_path / "ledger.sqlite3")


def _record(ledger, run_id, resources):
    for kind, name, region, detail, req, created, deleted in resources:
        ledger.resource_requested(run_id, kind, name, region=region, detail=detail, now=req)
        if created is not None:
            ledger.resource_created(run_id, kind, name, cloud_id=f"id-{name}", now=created)
        if deleted is not None:
            ledger.resource_deleted(run_id, kind, name, now=deleted)


def test_estimate_equals_reported_cost_when_durations_match(tmp_path, catalog):
    for spec in (ClusterSpec(cloud="aws", nodes=2, instance_type="g5.12xlarge", disk_gb=200, name="est-aws"),
                 ClusterSpec(cloud="gcp", nodes=2, instance_type="n1-standard-16", gpus_per_node=4,
                             zone="us-central1-a", disk_gb=150, name="est-gcp", spot=True)):
        ledger = _ledger(tmp_path / spec.name)
        est = C.estimate(spec, "2.75", catalog=catalog, backend=backend(spec))
        ledger.create_run("r-" + spec.name, cloud=spec.cloud, cluster=spec.name, nodes=spec.nodes,
                          gpus_per_node=spec.gpus_per_node, command=["train"], spec=spec.to_dict(),
                          prices=C.price_snapshot(spec, catalog, backend=backend(spec)), now=T0)
        seconds = 2.75 * 3600
        if spec.cloud == "aws":  # what a run records: one instant fleet of both nodes (issue 25)
            res = [("fleet", "est-aws-fleet", "us-east-1", {"instance_type": "g5.12xlarge", "node_count": 2,
                                                           "spot": False, "disk_gb": 200, "disk_type": "gp3",
                                                           "public_ipv4": 1},
                    T0 + 10, T0 + 40, T0 + 10 + seconds)]
        else:
            pool = {"machine_type": "n1-standard-16", "node_count": 2, "gpus_per_node": 4, "spot": True,
                    "accelerator": "nvidia-tesla-v100", "disk_gb": 150, "disk_type": "pd-balanced",
                    "external_ipv4": 1}
            system = {"machine_type": "n1-standard-2", "node_count": 1, "gpus_per_node": 0, "spot": False,
                      "disk_gb": 50, "disk_type": "pd-balanced", "external_ipv4": 1}
            res = [("gke-cluster", "c", "us-central1-a", {"zonal": True}, T0, T0 + 300, T0 + seconds),
                   ("node-pool", "p", "us-central1-a", pool, T0 + 5, T0 + 400, T0 + 5 + seconds),
                   ("node-pool", "est-gcp-system", "us-central1-a", system, T0 + 5, T0 + 400, T0 + 5 + seconds),
                   ("firewall", "fw", "us-central1", {}, T0, T0 + 1, T0 + 20)]
        _record(ledger, "r-" + spec.name, res)
        out = C.run_cost(ledger.get_run("r-" + spec.name), now=T0 + 99999, backend=backend(spec))
        assert Decimal(out["total"]) == est.total
        for cat in ("instances", "gpus", "disks", "public IPv4", "cluster fee"):
            assert Decimal(out["by_category"][cat]) == sum(
                (Decimal(ln["total"]) for ln in est.lines if ln["category"] == cat), Decimal(0))


def test_failed_run_is_billed_for_what_existed(tmp_path, catalog):
    ledger = _ledger(tmp_path)
    spec = ClusterSpec(cloud="aws", nodes=3, instance_type="g5.xlarge", disk_gb=100, name="boom")
    ledger.create_run("rf", cloud="aws", cluster="boom", nodes=3, gpus_per_node=1, command=["x"],
                      spec=spec.to_dict(), prices=C.price_snapshot(spec, catalog, backend=backend(spec)), now=T0)
    det = {"instance_type": "g5.xlarge", "spot": False, "disk_gb": 100, "disk_type": "gp3"}
    _record(ledger, "rf", [
        # created, ran 10 minutes, then the launch failed and it was deleted
        ("instance", "n0", "us-east-1", det, T0, T0 + 30, T0 + 600),
        # creation refused after 20 s (never confirmed created) but the request is billed as an upper bound
        ("instance", "n1", "us-east-1", det, T0, None, T0 + 20),
        # left behind: never confirmed deleted -> billed up to now and flagged
        ("instance", "n2", "us-east-1", det, T0, T0 + 30, None),
        ("security-group", "sg", "us-east-1", {}, T0, T0 + 1, T0 + 700),
    ])
    ledger.finish_run("rf", status="failed", exit_code=1, failure="rank 1 failed", now=T0 + 700)
    now = T0 + 3600
    out = C.run_cost(ledger.get_run("rf"), now=now, backend=backend(spec))
    price, gb = Decimal("1.006"), Decimal("0.08") * 100
    expect = (price * 600 / 3600 + price * 60 / 3600 + price * 3600 / 3600  # n1: 20 s billed as 60 s
              + gb * (600 + 20 + 3600) / 2628000)
    assert abs(Decimal(out["total"]) - expect) < Decimal("0.00000001")
    assert out["still_billing"] == ["n2"] and any("still billing" in n for n in out["notes"])
    n1 = next(ln for ln in out["lines"] if ln["resource"] == "n1" and ln["category"] == "instances")
    assert n1["billed_seconds"] == 60 and "never confirmed" in n1["note"]
    assert any(ln["category"] == "no charge" for ln in out["lines"])
    stored = C.record_run_cost(ledger, "rf", backend=backend(spec), now=now)
    assert ledger.get_run("rf").to_dict()["cost"]["total"] == stored["total"] == out["total"]


def test_prices_come_from_the_launch_snapshot_not_today(tmp_path, catalog):
    spec = ClusterSpec(cloud="aws", nodes=1, instance_type="g5.xlarge", disk_gb=100)
    snap = C.price_snapshot(spec, catalog, backend=backend(spec))
    snap["prices"]["instance/g5.xlarge/on-demand"]["price"] = "2.000"  # the price at launch
    run = {"id": "r", "cloud": "aws", "prices": snap, "resources": [
        {"kind": "instance", "name": "n0", "region": "us-east-1", "requested_at": T0, "created_at": T0,
         "deleted_at": T0 + 3600, "confirmed_gone": True, "detail": {"instance_type": "g5.xlarge"}}]}
    assert Decimal(C.run_cost(RunRecord.from_dict(run), catalog=catalog, backend=backend(run))["total"]) == Decimal("2")
    run["prices"] = None  # no snapshot: today's catalog, and the cost says so
    out = C.run_cost(RunRecord.from_dict(run), catalog=catalog, backend=backend(run))
    assert Decimal(out["total"]) == Decimal("1.006") and "today's catalog" in out["notes"][0]


# -- what-if ----------------------------------------------------------------------------------
SEED003 = [(1, 57.0, "w1"), (2, 97.0, "w2"), (4, 103.0, "w4")]  # nodes, s for 8 epochs (FACTS.md, seed 003)


def _whatif_ledger(tmp_path) -> Ledger:
    ledger = _ledger(tmp_path)
    for i, (nodes, train_s, rid) in enumerate(SEED003):
        spec = ClusterSpec(cloud="gcp", nodes=nodes, instance_type="n1-standard-16", gpus_per_node=4,
                           accelerator="nvidia-tesla-v100", zone="us-central1-a", name="seed003")
        start = T0 + i * 10000
        ledger.create_run(rid, cloud="gcp", cluster="seed003", nodes=nodes, gpus_per_node=4, command=["t"],
                          spec=spec.to_dict(), workload="mnist", prices=C.price_snapshot(spec, backend=backend(spec)),
                          now=start)
        ledger.finish_run(rid, status="succeeded", exit_code=0, now=start + 400 + train_s,
                          metrics={"train_time_s": train_s, "epochs": 8, "samples_per_s": 480000 / train_s,
                                   "accuracy": 0.98, "loss": 0.05})
    # ignored: a failed run, another workload, another shape
    ledger.create_run("bad", cloud="gcp", cluster="x", nodes=8, gpus_per_node=4, command=["t"], workload="mnist",
                      spec={"cloud": "gcp", "nodes": 8, "instance_type": "n1-standard-16"}, now=T0 + 90000)
    ledger.finish_run("bad", status="failed", exit_code=1, metrics={"train_time_s": 5, "epochs": 8},
                      now=T0 + 90100)
    ledger.create_run("other", cloud="local", cluster="l", nodes=1, gpus_per_node=0, command=["t"],
                      workload="digits", spec={"cloud": "local", "nodes": 1}, now=T0 + 95000)
    ledger.finish_run("other", status="succeeded", exit_code=0, metrics={"train_time_s": 2, "epochs": 1},
                      now=T0 + 95010)
    return ledger


def test_what_if_shows_seed_003_more_nodes_longer_and_dearer(tmp_path, catalog):
    ledger = _whatif_ledger(tmp_path)
    out = C.what_if(ledger.list_runs(limit=None), [1, 2, 4, 8], "mnist", 8, catalog=catalog, backends=BACKENDS,
                    max_nodes=MAX_NODES)
    assert sorted(out["runs_used"]) == ["w1", "w2", "w4"]
    assert out["shape"] == "gcp n1-standard-16 4 x V100"
    p = {row["nodes"]: row for row in out["projection"]}
    assert [p[n]["basis"] for n in (1, 2, 4, 8)] == ["measured", "measured", "measured", "extrapolated"]
    assert p[1]["train_s"] == 57.0 and p[2]["train_s"] == 97.0 and p[4]["train_s"] == 103.0
    assert p[1]["wall_s"] == 457.0  # 57 s training + 400 s measured set-up/tear-down
    walls = [p[n]["wall_s"] for n in (1, 2, 4, 8)]
    costs = [Decimal(p[n]["cost"]) for n in (1, 2, 4, 8)]
    assert walls == sorted(walls) and costs == sorted(costs) and len(set(costs)) == 4  # longer AND dearer
    # measured efficiency, not linear: 57 / (2 x 97) on 2 nodes
    assert p[2]["efficiency"] == round(57 / (2 * 97), 4)
    assert out["fit"]["exponent"] > 0  # more nodes -> slower epochs
    # the 1-node cost is the estimate for that spec over the projected wall time
    spec1 = ClusterSpec(cloud="gcp", nodes=1, instance_type="n1-standard-16", gpus_per_node=4,
                        accelerator="nvidia-tesla-v100", zone="us-central1-a", name="seed003")
    assert Decimal(p[1]["cost"]) == C.estimate(spec1, Decimal("457") / 3600, catalog=catalog,
                                               backend=backend(spec1)).total


def test_what_if_refuses_without_runs_and_does_not_guess_scaling(tmp_path, catalog):
    ledger = _whatif_ledger(tmp_path)
    runs = ledger.list_runs(limit=None)
    with pytest.raises(UsageError, match="no run of this workload"):
        C.what_if(runs, [1, 2], "cifar", 4, catalog=catalog, backends=BACKENDS, max_nodes=MAX_NODES)
    with pytest.raises(UsageError, match="no succeeded run"):
        C.what_if(runs, [1, 2], "mnist", 4, cloud="aws", catalog=catalog, backends=BACKENDS, max_nodes=MAX_NODES)
    one = [r for r in runs if r.id in ("w1", "other")]
    out = C.what_if(one, [1, 4], "mnist", 4, catalog=catalog, backends=BACKENDS, max_nodes=MAX_NODES)
    p = {row["nodes"]: row for row in out["projection"]}
    assert p[1]["basis"] == "measured" and p[4]["basis"] is None and "not measured" in p[4]["note"]
    local = C.what_if(runs, [1], "digits", 3, catalog=catalog, backends=BACKENDS, max_nodes=MAX_NODES)
    assert local["projection"][0]["cost"] == "0"


# -- reports ----------------------------------------------------------------------------------
def test_report_json_and_csv_parse_back_to_the_same_numbers(tmp_path, catalog):
    ledger = _whatif_ledger(tmp_path)
    for rid in ("w1", "w2"):
        run = ledger.get_run(rid).to_dict()
        _record(ledger, rid, [("node-pool", "p", "us-central1-a",
                               {"machine_type": "n1-standard-16", "node_count": run["nodes"], "gpus_per_node": 4,
                                "disk_gb": 100, "disk_type": "pd-balanced"},
                               run["created_at"] + 10, run["created_at"] + 50, run["ended_at"])])
    runs = [ledger.get_run(r.id) for r in ledger.list_runs(limit=None)]
    rep = C.report(runs, group_by="cloud", now=T0 + 200000, catalog=catalog, backends=BACKENDS)
    assert len(rep["runs"]) == 5
    back = json.loads(json.dumps(rep))
    rows = list(csv.DictReader(io.StringIO(C.report_csv(rep))))
    assert [Decimal(r["cost"]) for r in rows] == [Decimal(r["cost"]) for r in back["runs"]]
    assert sum(Decimal(r["cost"]) for r in rows) == Decimal(back["total"]) > 0
    groups = {g["cloud"]: Decimal(g["cost"]) for g in back["groups"]}
    assert groups["gcp"] == Decimal(back["total"]) and groups["local"] == 0
    local = next(r for r in rows if r["cloud"] == "local")
    assert "$0" in local["note"]
    by_day = C.report(runs, group_by="day", now=T0 + 200000, catalog=catalog, backends=BACKENDS)
    assert sum(Decimal(g["cost"]) for g in by_day["groups"]) == Decimal(rep["total"])
    with pytest.raises(UsageError, match="group-by 'week'"):
        C.report(runs, group_by="week", backends=BACKENDS)


def test_parse_since():
    assert C.parse_since("2026-11-22") == 1795305600.0
    with pytest.raises(UsageError, match="date '22/11/2026'"):
        C.parse_since("22/11/2026")


# -- CLI ----------------------------------------------------------------------------------------
def test_cli_help_for_every_command():
    from gpucluster.cli.cost import cost, prices

    runner = CliRunner()
    for group, args in ((prices, []), (prices, ["refresh"]), (cost, []), (cost, ["estimate"]), (cost, ["report"])):
        res = runner.invoke(group, args + ["--help"])
        assert res.exit_code == 0 and "Usage" in res.output


def test_cli_estimate_json_and_stack(monkeypatch):
    pytest.importorskip("yaml")
    from gpucluster.cli.cost import cost

    runner = CliRunner()
    res = runner.invoke(cost, ["estimate", "--cloud", "aws", "--instance-type", "g5.12xlarge", "--nodes", "2",
                               "--hours", "3", "--disk-gb", "200", "--json"])
    assert res.exit_code == 0, res.output
    flags = json.loads(res.stdout)
    res = runner.invoke(cost, ["estimate", "--stack", str(FIXTURES / "Pulumi.aws-g5.yaml"), "--hours", "3", "--json"])
    assert res.exit_code == 0, res.output
    stacked = json.loads(res.stdout)
    # with 2 public IPv4 addresses; one fleet row of 2 nodes, rounded to the nano-dollar once
    assert stacked["total"] == flags["total"] == "34.193506849"
    res = runner.invoke(cost, ["estimate", "--stack", str(FIXTURES / "Pulumi.aws-g5.yaml"), "--hours", "3",
                               "--nodes", "1"])
    assert res.exit_code == 0 and "$17.10" in res.stdout  # 5.672 x 3 + 0.0658 + 0.015 (its public IPv4)
    monkeypatch.chdir(FIXTURES.parent.parent.parent)
    res = runner.invoke(cost, ["estimate", "--stack", "no-such-stack"])
    assert res.exit_code == 2 and "stacks/Pulumi.no-such-stack.yaml" in res.stderr


@pytest.mark.parametrize("args, message", [
    (["estimate", "--cloud", "aws", "--instance-type", "g5.12xlarg"], 'did you mean "g5.12xlarge"'),
    (["estimate", "--cloud", "aws", "--hours", "0"], "hours '0'"),
    (["estimate", "--cloud", "aws", "--nodes", "-1"], "nodes '-1'"),
    (["estimate", "--cloud", "aws", "--region", "us-est-1"], 'did you mean "us-east-1"'),
    (["estimate", "--cloud", "gcp", "--gpus", "5"], "V100 count per node 5"),
    (["estimate", "--nodes", "1,2"], "needs --workload"),
    (["estimate"], "give --cloud"),
    (["report", "--since", "yesterday"], "date 'yesterday'"),
    (["report", "--group-by", "month"], "group-by 'month'"),
    (["report", "--cloud", "azure"], "cloud 'azure'"),
])
def test_cli_bad_input_exits_2_with_one_line(home, args, message):
    from gpucluster.cli.cost import cost

    res = CliRunner().invoke(cost, args)
    assert res.exit_code == 2, res.output
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_cli_what_if_and_report_from_the_ledger(home, tmp_path):
    from gpucluster.cli.cost import cost

    home.mkdir(parents=True)
    _whatif_ledger(tmp_path).close()
    (tmp_path / "ledger.sqlite3").rename(home / "ledger.sqlite3")
    runner = CliRunner()
    res = runner.invoke(cost, ["estimate", "--nodes", "1,2,4,8", "--workload", "mnist", "--epochs", "8"])
    assert res.exit_code == 0, res.output
    assert "w1" in res.stdout and "extrapolated" in res.stdout and "nodes^" in res.stdout
    res = runner.invoke(cost, ["estimate", "--nodes", "1,2", "--workload", "resnet", "--epochs", "8"])
    assert res.exit_code == 2 and "no run of this workload" in res.stderr
    res = runner.invoke(cost, ["report", "--csv", "--since", "2026-01-01"])
    assert res.exit_code == 0 and len(list(csv.DictReader(io.StringIO(res.stdout)))) == 5
    res = runner.invoke(cost, ["report", "--cloud", "local", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["total"] == "0"
    res = runner.invoke(cost, ["report", "--group-by", "cluster"])
    assert res.exit_code == 0 and "By cluster" in res.stdout and "seed003" in res.stdout


def test_cli_report_plot(home, tmp_path):
    pytest.importorskip("matplotlib")
    from gpucluster.cli.cost import cost

    home.mkdir(parents=True)
    _whatif_ledger(tmp_path).close()
    (tmp_path / "ledger.sqlite3").rename(home / "ledger.sqlite3")
    png = tmp_path / "cost.png"
    res = CliRunner().invoke(cost, ["report", "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fallback_disk_price_is_noted_once_and_kept_in_the_snapshot(catalog):
    spec = ClusterSpec(cloud="gcp", nodes=1, region="europe-west4", gpus_per_node=2, disk_gb=100)
    est = C.estimate(spec, 1, catalog=catalog, backend=backend(spec))
    disk = next(ln for ln in est.lines if ln["category"] == "disks")
    assert disk["note"] == "" and any("used us-central1's" in n for n in est.notes)
    snap = est.snapshot["prices"]["disk/pd-balanced/on-demand"]
    assert (snap["region"], snap["priced_in"]) == ("europe-west4", "us-central1")


def test_unpriced_system_pool_is_said_not_hidden(catalog):
    spec = ClusterSpec(cloud="gcp", nodes=1, instance_type="n1-standard-16", gpus_per_node=4,
                       zone="us-central1-a", options=(("systemMachineType", "e2-standard-2"),))
    est = C.estimate(spec, 1, catalog=catalog, backend=backend(spec))
    assert any("e2-standard-2" in n for n in est.notes)
    run = {"id": "r", "cloud": "gcp", "prices": est.snapshot, "resources": [
        {"kind": "node-pool", "name": "system", "region": "us-central1-a", "requested_at": T0, "created_at": T0,
         "deleted_at": T0 + 600, "confirmed_gone": True, "detail": {"machine_type": "e2-standard-2",
                                                                    "node_count": 1}}]}
    out = C.run_cost(RunRecord.from_dict(run), catalog=catalog, backend=backend(run))
    assert out["lines"][0]["category"] == "unpriced" and out["total"] == "0"
    assert "e2-standard-2" in out["notes"][0] and "leaves it out" in out["notes"][0]


def test_render_run_cost_flags_still_billing(tmp_path, catalog):
    from rich.console import Console

    from gpucluster.cli.cost import render_run_cost

    run = {"id": "r9", "cloud": "aws", "prices": None, "resources": [
        {"kind": "instance", "name": "n0", "region": "us-east-1", "requested_at": T0, "created_at": T0,
         "deleted_at": None, "confirmed_gone": False, "detail": {"instance_type": "g5.xlarge"}}]}
    console = Console(record=True, width=200)
    render_run_cost(C.run_cost(RunRecord.from_dict(run), now=T0 + 3600, catalog=catalog, backend=backend(run)), console)
    text = console.export_text()
    assert "STILL BILLING" in text and "$1.01" in text


def test_render_line_for_the_run_plan(catalog):
    spec = ClusterSpec(cloud="gcp", nodes=2, instance_type="n1-standard-16", gpus_per_node=4, zone="us-central1-a")
    line = C.estimate(spec, 1, catalog=catalog, backend=backend(spec)).render_line()
    assert line.startswith("$21.60 for 1 h at $21.60/h (instances $1.53/h, gpus $19.84/h, disks $0.03/h, "
                           "cluster fee $0.10/h, system pool $0.11/h, $2.67/GPU-hour; on-demand prices read "
                           "2026-11-22)")
    assert "\n" not in line
    assert "$0" in C.estimate(ClusterSpec(cloud="local", nodes=2), 1, backend=plugin("local")).render_line()


def test_hourly_says_no_price_only_for_a_price_it_cannot_know(monkeypatch):
    # issue 23 item 8: a bug in the cost code is not shown as "no price known"
    from gpucluster.cli import common

    spec = ClusterSpec(cloud="aws", nodes=1, instance_type="g5.xlarge")
    assert common.hourly(spec) == C.estimate(spec, 1, backend=backend(spec)).hourly > 0

    def unknown(spec, hours, backend):
        raise UsageError("instance type 'x' is not in the price catalog")

    monkeypatch.setattr(C, "estimate", unknown)
    assert common.hourly(spec) is None

    def buggy(spec, hours, backend):
        return {}.missing  # AttributeError: a bug

    monkeypatch.setattr(C, "estimate", buggy)
    with pytest.raises(AttributeError):
        common.hourly(spec)


def test_spot_is_priced_at_the_zone_it_ran_in_where_known_and_says_which(tmp_path, catalog):
    """Spot is a per-zone point-in-time price (FACTS.md). A catalog refreshed from the price history
    keeps each zone's price (infra/aws/prices.parse_aws_spot_history); the shipped one has only the
    region's highest, and the cost line says so."""
    import dataclasses

    spec = ClusterSpec(cloud="aws", nodes=1, instance_type="g5.xlarge", region="us-east-1", spot=True, name="sz")
    row = catalog.get("aws", "us-east-1", "instance", "g5.xlarge", "spot")
    detail = {"instance_type": "g5.xlarge", "spot": True, "availability_zone": "us-east-1b", "public_ipv4": 0}

    def cost_with(cat):
        where = tmp_path / f"l{len(list(tmp_path.iterdir()))}"
        where.mkdir()
        ledger = _ledger(where)
        ledger.create_run("r-sz", cloud="aws", cluster="sz", nodes=1, gpus_per_node=1, command=["x"],
                          spec=spec.to_dict(), prices=C.price_snapshot(spec, cat, backend=backend(spec)), now=T0)
        _record(ledger, "r-sz", [("instance", "n0", "us-east-1", detail, T0, T0, T0 + 3600)])
        (line,) = [ln for ln in C.run_cost(ledger.get_run("r-sz"), now=T0 + 9999, backend=backend(spec))["lines"]
                   if ln["category"] == "instances"]
        return line

    shipped = cost_with(catalog)
    assert Decimal(shipped["unit_price"]) == row.price == Decimal("0.4507")  # the region's highest
    assert "spot price for the region (the price of us-east-1b is not known" in shipped["note"]
    assert "gpucluster prices refresh --cloud aws --region us-east-1" in shipped["note"]
    refreshed = dataclasses.replace(row, extra={**row.extra, "zones": {"us-east-1a": "0.4507", "us-east-1b": "0.4246"}})
    catalog.rows[refreshed.key] = refreshed
    zoned = cost_with(catalog)
    assert Decimal(zoned["unit_price"]) == Decimal("0.4246") and zoned["note"] == "spot price of us-east-1b"
    assert Decimal(zoned["cost"]) == Decimal("0.4246")


def test_the_estimate_follows_the_gpu_pools_autoscaling_setting(catalog):
    """issue 26: with `autoscale=false` the GPU pool keeps its nodes after the Job's deadline, so they
    keep billing until `down` (the gcp-v100 example: 8 V100); with `minNodes` its minimum does."""
    base = ClusterSpec(cloud="gcp", nodes=2, instance_type="n1-standard-16", gpus_per_node=4, zone="us-central1-a")
    (scaled,) = [n for n in C.estimate(base, 1, catalog=catalog, backend=backend(base)).notes
                 if "after the max lifetime" in n]
    assert "scales to zero" in scaled and "(0.2068)" in scaled
    fixed = C.estimate(base.replace(options=(("autoscale", "false"),)), 1, catalog=catalog, backend=backend(base))
    (after,) = [n for n in fixed.notes if "after the max lifetime" in n]
    assert "scales to zero" not in after and "all 2 GPU node(s)" in after
    assert f"({fixed.hourly.quantize(Decimal('0.0001'))})" in after  # everything keeps billing: 21.6043
    floor = C.estimate(base.replace(options=(("minNodes", "1"),)), 1, catalog=catalog, backend=backend(base))
    (kept,) = [n for n in floor.notes if "after the max lifetime" in n]
    one_node = (floor.hourly - Decimal("0.2068")) / 2
    assert "scales down to 1 node(s)" in kept
    assert f"({(Decimal('0.2068') + one_node).quantize(Decimal('0.0001'))})" in kept


@pytest.mark.integration  # a real process or server: not in `make test-fast`
def test_the_gke_free_tier_follows_the_setting_and_is_off_by_default(catalog, home, tmp_path):
    """issue 26 item 9: the GKE free-tier credit covers one zonal cluster per billing account, which
    gpucluster cannot see, so it is applied only when asked: the spec option `gke_free_tier`
    (`--option gke_free_tier=true` on run/up) or `cost estimate --free-tier`; a value that is not a
    boolean is refused by name (exit 2, one line), before anything is created."""
    from gpucluster.cli.cost import cost
    from gpucluster.errors import SpecError

    base = ClusterSpec(cloud="gcp", nodes=2, instance_type="n1-standard-4", gpus_per_node=1, zone="us-central1-a")

    def fee(spec):
        est = C.estimate(spec, "2", catalog=catalog, backend=backend(spec))
        return sum((Decimal(ln["total"]) for ln in est.lines if ln["category"] == "cluster fee"), Decimal(0)), est

    default, paid = fee(base)
    assert default == Decimal("0.20")  # $0.10/h x 2 h: not applied unless asked
    for on in ("true", "yes", "1"):
        covered, free = fee(base.replace(options=(("gke_free_tier", on),)))
        assert covered == 0 and paid.total - free.total == Decimal("0.20"), on
    assert fee(base.replace(options=(("gke_free_tier", "false"),)))[0] == Decimal("0.20")
    with pytest.raises(SpecError, match="option gke_free_tier 'maybe'.*true or false"):
        fee(base.replace(options=(("gke_free_tier", "maybe"),)))

    pytest.importorskip("pulumi_gcp")
    # the command line: `cost estimate --free-tier`, and `run --option gke_free_tier=...` (a dry run: no credentials)
    args = ["estimate", "--cloud", "gcp", "--nodes", "2", "--zone", "us-central1-a", "--hours", "2", "--json"]
    plain, credited = (json.loads(CliRunner().invoke(cost, a).stdout) for a in (args, args + ["--free-tier"]))
    assert Decimal(plain["total"]) - Decimal(credited["total"]) == Decimal("0.20")
    import subprocess
    import sys

    def dry_run(*extra):
        return subprocess.run([sys.executable, "-m", "gpucluster.cli.main", "run", "--cloud", "gcp", "--nodes", "2",
                               "--project", "my-proj-42", "--dry-run", *extra], capture_output=True, text=True,
                              timeout=300, stdin=subprocess.DEVNULL,
                              env={**__import__("os").environ, "GPUCLUSTER_HOME": str(tmp_path / "h")})

    off, on = dry_run("--json"), dry_run("--json", "--option", "gke_free_tier=true")
    assert off.returncode == 0 and on.returncode == 0, off.stderr + on.stderr
    assert "$5.58/h" in json.loads(off.stdout)["estimate_line"]
    assert "$5.48/h" in json.loads(on.stdout)["estimate_line"]  # the $0.10/h fee covered
    bad = dry_run("--option", "gke_free_tier=maybe")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "gke_free_tier 'maybe'" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert not (tmp_path / "h").exists()  # nothing recorded or created
