"""A team's budget kept in the shared state (issue 48, item 3; docs/cost.md "Team budgets";
gpucluster/costing/teambudget.py, infra/pulumi/objects.py).

The same checks on the three kinds of shared state a team budget can live in, each a stand-in that
speaks the real protocol over TCP or the file system:
- `file://`: a folder (a shared file system);
- `s3://`: moto's S3 server (tests/moto_s3.py) through boto3, as a member's machine talks to S3;
- `gs://`: gcp-storage-emulator behind the gate of tests/gcs_emulator.py, which answers as GCS does
  at its worst: list pages of 2 items with nextPageToken (a page "may return fewer",
  https://cloud.google.com/storage/docs/json_api/v1/objects/list) and injected 503s that must be
  retried (https://cloud.google.com/storage/docs/retry-strategy).

Members are separate homes (installation ids) writing to one state. The run clock is scaled: the
records' times are given (`now=`), a finished run's lines carry their billed lives as the report
computes them.
"""

from __future__ import annotations

import sys
import threading
import time
from decimal import Decimal
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from gcs_emulator import gcs_server  # noqa: E402,F401
from moto_s3 import s3_server  # noqa: E402,F401

from gpucluster.errors import UsageError  # noqa: E402

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py): loopback servers

NOW = 1795866466.0  # Saturday 2026-11-28 11:47:46 UTC
MONTH = 1793491200.0  # 2026-11-01 00:00 UTC


@pytest.fixture(params=["file", "s3", "gs"])
def state(request, tmp_path, monkeypatch):
    """A shared state URL of each kind, with what a member's process needs to reach it."""
    if request.param == "file":
        return f"file://{tmp_path / 'shared'}"
    if request.param == "s3":
        s3 = request.getfixturevalue("s3_server")
        for k, v in s3.env.items():
            monkeypatch.setenv(k, v)
        s3.client().create_bucket(Bucket="team-bucket")
        return "s3://team-bucket/gpucluster?region=us-east-1"
    gcs = request.getfixturevalue("gcs_server")
    for k, v in gcs.env.items():
        monkeypatch.setenv(k, v)
    gcs.make_bucket("team-bucket")
    gcs.state.fail_next = 2  # two 503s first: retried
    return "gs://team-bucket/gpucluster"


def _store(url):
    from gpucluster.infra.pulumi.objects import open_store

    return open_store(url)


def _record(run_id, reserve, hourly="10", started=NOW - 600, owner="a" * 16, kind="run", until=None):
    from gpucluster.costing.teambudget import open_record

    return open_record(run_id=run_id, kind=kind, owner=owner, who="alice@laptop", cloud="aws", cluster="c",
                       reserve=Decimal(reserve), hourly=Decimal(hourly), until=until, over_budget=False, now=started)


def test_members_spend_counts_against_the_teams_budget_and_a_run_past_it_is_refused(state):
    """Alice finished a run that billed $300 in November (lines across Oct 31 -> Nov 1: only the
    November part counts) and has one running (estimate $100); Bob's run estimated at $150 would take
    the month past $500: refused in one line, his record gone; $90 fits; --over-budget passes, said."""
    from gpucluster.costing.teambudget import ENDED, OPEN, claim, read_budget, settle, standings, write_budget

    store = _store(state)
    write_budget(store, {"monthly": 500.0}, "alice@laptop", now=NOW)
    assert read_budget(store) == {"monthly": 500.0}
    store.put(f"{OPEN}/r-alice-1.json", __import__("json").dumps(_record("r-alice-1", "400", started=MONTH - 3600))
              .encode())
    # $400 over 4 h: 1 h in October, 3 h in November
    lines = [{"cost": "400", "from": MONTH - 3600, "to": MONTH + 3 * 3600}]
    assert settle(store, "r-alice-1", lines, Decimal("400"), now=MONTH + 3 * 3600)
    assert [n for n, _ in store.list(OPEN)] == [] and [n for n, _ in store.list(ENDED)] == [
        f"{ENDED}/r-alice-1.json"]
    assert claim(store, _record("r-alice-2", "100"), over_budget=False, now=NOW) == []  # 300 + 100 <= 500
    (s,) = standings(store, read_budget(store), NOW)
    assert s.spent == Decimal("400")  # 300 (November's part) + 100 (the running run's estimate)
    with pytest.raises(UsageError) as err:
        claim(store, _record("r-bob-1", "150", owner="b" * 16), over_budget=False, now=NOW)
    assert str(err.value).startswith("the team's monthly budget is $500.00: $400.00 spent since 2026-11-01 00:00 UTC, "
                                     "$100.00 remaining, and this run's estimate is $150.00: not started")
    assert f"{OPEN}/r-bob-1.json" not in [n for n, _ in store.list(OPEN)]  # refused: nothing of it is left
    assert claim(store, _record("r-bob-2", "90", owner="b" * 16), over_budget=False, now=NOW) == []
    said = claim(store, _record("r-bob-3", "150", owner="b" * 16), over_budget=True, now=NOW)
    assert len(said) == 1 and said[0].startswith("over budget (--over-budget): the team's monthly budget is $500.00")


def test_a_run_whose_process_died_counts_at_its_estimate_until_its_nodes_lifetime_and_can_be_forgotten(state):
    from gpucluster.costing.teambudget import claim, forget, read_budget, standings, write_budget

    store = _store(state)
    write_budget(store, {"daily": 50.0}, "bob@desk", now=NOW)
    # started 4 h ago at $10/h with a $20 estimate, its nodes live 3 h: counted $30, not $40 and growing
    claim(store, _record("r-dead", "20", started=NOW - 4 * 3600, until=NOW - 3600), over_budget=False, now=NOW - 4 * 3600)
    (s,) = standings(store, read_budget(store), NOW)
    assert s.spent == Decimal("30")
    forget(store, "r-dead")
    assert standings(store, read_budget(store), NOW)[0].spent == 0
    with pytest.raises(UsageError, match="no open spend record for run 'r-dead'"):
        forget(store, "r-dead")


def test_two_members_starting_at_once_cannot_both_pass_a_budget_they_would_exceed_together(state):
    """Each writes its record, then lists: held at a barrier between the two steps, both lists come
    after both writes (the interleaving that lets a read-then-write check pass both). $60 each against
    $100: at most one starts (here both see the other and both are refused: start one again)."""
    from gpucluster.costing.teambudget import OPEN, claim, write_budget

    store = _store(state)
    write_budget(store, {"weekly": 100.0}, "alice@laptop", now=NOW)
    barrier = threading.Barrier(2, timeout=30)

    class Held:
        def __init__(self, inner):
            self.inner = inner

        def put(self, name, data):
            self.inner.put(name, data)
            if name.startswith(OPEN):
                barrier.wait()

        def __getattr__(self, name):
            return getattr(self.inner, name)

    results = {}

    def member(rid):
        try:
            results[rid] = claim(Held(_store(state)), _record(rid, "60", started=NOW), over_budget=False, now=NOW)
        except UsageError as exc:
            results[rid] = exc

    threads = [threading.Thread(target=member, args=(rid,)) for rid in ("r-a", "r-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    passed = [rid for rid, got in results.items() if not isinstance(got, UsageError)]
    assert len(results) == 2 and len(passed) <= 1, results
    assert sorted(n for n, _ in store.list(OPEN)) == sorted(f"{OPEN}/{rid}.json" for rid in passed)


def test_many_records_are_all_read_through_list_pages(state):
    """Seven members' open records (the GCS gate pages 2 at a time): every one is counted."""
    from gpucluster.costing.teambudget import claim, read_budget, standings, write_budget

    store = _store(state)
    write_budget(store, {"monthly": 1000.0}, "alice@laptop", now=NOW)
    for i in range(7):
        claim(store, _record(f"r-{i}", "10", started=NOW), over_budget=False, now=NOW)
    assert standings(store, read_budget(store), NOW)[0].spent == Decimal("70")


def test_budget_set_show_and_cost_report_with_state(tmp_path):
    """The commands, as a member runs them: one line and exit 2 for bad input, nothing written."""
    from conftest import run_cli

    url = f"file://{tmp_path / 'shared'}"
    env = {"GPUCLUSTER_HOME": str(tmp_path / "home")}
    cp = run_cli("budget", "set", "--state", url, "--monthly", "abc", env=env, timeout=60)
    assert cp.returncode == 2 and cp.stderr.strip() == ("gpucluster: error: --monthly 'abc' is not allowed: US dollars "
                                                        "> 0, e.g. 500") and not (tmp_path / "shared").exists()
    cp = run_cli("budget", "set", "--monthly", "500", env=env, timeout=60)
    assert cp.returncode == 2 and "a team budget lives in a shared state: give --state" in cp.stderr
    cp = run_cli("budget", "set", "--state", "azblob://box", "--daily", "5", env=env, timeout=60)
    assert cp.returncode == 2 and "'azblob://box' is not one it can use" in cp.stderr
    cp = run_cli("budget", "set", "--state", url, "--monthly", "500", "--daily", "$60", env=env, timeout=60)
    assert cp.returncode == 0 and cp.stdout.strip() == "team budget: daily $60.00, monthly $500.00", cp.stderr
    cp = run_cli("budget", "show", "--state", url, "--json", env=env, timeout=60)
    assert cp.returncode == 0 and [b["period"] for b in __import__("json").loads(cp.stdout)["budget"]] == [
        "daily", "monthly"]
    cp = run_cli("cost", "report", "--state", url, env=env, timeout=60)
    assert cp.returncode == 0 and "Team budget (monthly, since " in cp.stdout and "$0.00 spent of $500.00" in cp.stdout


def test_a_run_past_the_teams_budget_creates_nothing_and_a_run_within_it_records_its_cost(tmp_path, monkeypatch):
    """`execute_plan` (the one path of `run` and gpucluster.run) on a planned aws run: past the team's
    budget it is refused before the run starts (no ledger row); within it the run's record is open
    while it runs and ends with the cost lines of its report. The run itself is a stand-in that
    records a fleet of 2 g5.xlarge living half an hour (the scaled clock) and ends."""
    import types

    from gpucluster.lifecycle import recovery
    from gpucluster.api.jobs import Planned, execute_plan
    from gpucluster.infra.registry import plugin
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.prepare import Request, prepare
    from gpucluster.costing.teambudget import ENDED, OPEN, read_budget, standings, write_budget

    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path / "home"))
    url = f"file://{tmp_path / 'shared'}"
    monkeypatch.setenv("GPUCLUSTER_STATE", url)
    store = _store(url)
    plan = prepare(Request(cloud="aws", nodes=2, instance_type="g5.xlarge", max_minutes=60,
                           ssh_cidr="203.0.113.7/32", dry_run=True), plugin("aws"))
    est = Decimal(str(plan.estimate.total))
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    started = []

    def run_plan(plan, *, ledger, **kw):
        rid = str(plan.spec.run_id)
        started.append(rid)
        assert [n for n, _ in store.list(OPEN)] == [f"{OPEN}/{rid}.json"]  # open while it runs
        t0 = time.time() - 1800
        ledger.create_run(rid, cloud="aws", cluster=plan.spec.name, nodes=2, gpus_per_node=1, command=["x"],
                          spec=plan.spec.to_dict(), workload=None, prices=plan.prices, now=t0)
        detail = dict(instance_type="g5.xlarge", node_count=2, spot=False, public_ipv4=1, disk_gb=100, disk_type="gp3")
        ledger.resource_requested(rid, "fleet", "f", region="us-east-1", detail=detail, now=t0)
        ledger.resource_deleted(rid, "fleet", "f", now=t0 + 1800)
        ledger.finish_run(rid, status="succeeded", exit_code=0, teardown="verified")
        final = types.SimpleNamespace(run_id=rid, teardown="verified")
        return types.SimpleNamespace(attempts=[final], final=final)

    monkeypatch.setattr(recovery, "run_plan", run_plan)
    ui = types.SimpleNamespace(message=lambda text: None)
    write_budget(store, {"daily": float(est) / 2}, "alice@laptop")
    with pytest.raises(UsageError, match=r"^the team's daily budget is \$"):
        execute_plan(Planned(plugin("aws"), plan, False), ledger=ledger, ui=ui)
    assert started == [] and ledger.list_runs(limit=None) == [] and store.list(OPEN) == []
    write_budget(store, {"daily": float(est) * 2}, "alice@laptop")
    execute_plan(Planned(plugin("aws"), plan, False), ledger=ledger, ui=ui)
    assert started == [str(plan.spec.run_id)] and store.list(OPEN) == []
    assert [n for n, _ in store.list(ENDED)] == [f"{ENDED}/{plan.spec.run_id}.json"]
    (s,) = standings(store, read_budget(store))
    # the half hour it billed (2 x $1.006/h, disks, addresses: half the hour's estimate), not the estimate; a
    # part may be in yesterday when this test runs just after midnight UTC
    assert 0 < s.spent <= est / 2 + Decimal("0.000001") and (abs(s.spent - est / 2) < Decimal("0.000001")
                                                          or time.gmtime().tm_hour == 0)


def test_a_kept_clusters_record_stays_open_until_down_ends_it_with_the_clusters_cost(tmp_path, monkeypatch):
    """`up` (or `run --keep`) leaves its record open and notes where it is (`remember_team`); `down`,
    once every resource of the cluster is confirmed gone, ends it with the cluster's cost (its fleet's
    two hours), in the state it was written to even when another state is chosen now."""
    from gpucluster.costing import cost
    from gpucluster.cli.budgets import remember_team, settle_kept
    from gpucluster.infra.registry import plugin
    from gpucluster.ledger.store import Ledger
    from gpucluster.spec import ClusterSpec
    from gpucluster.costing.teambudget import ENDED, OPEN, claim, write_budget

    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path / "home"))
    url = f"file://{tmp_path / 'shared'}"
    monkeypatch.setenv("GPUCLUSTER_STATE", url)
    store = _store(url)
    write_budget(store, {"monthly": 500.0}, "alice@laptop")
    t0 = time.time() - 2 * 3600
    claim(store, _record("r-up", "40", hourly="2.04", started=t0, kind="up"), over_budget=False)
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    spec = ClusterSpec(cloud="aws", nodes=2, name="lab", region="us-east-1", instance_type="g5.xlarge", run_id="r-up")
    ledger.create_run("r-up", cloud="aws", cluster="lab", nodes=2, gpus_per_node=1, command=["up"], spec=spec.to_dict(),
                      workload=None, prices=cost.price_snapshot(spec, backend=plugin("aws")), now=t0)
    detail = dict(instance_type="g5.xlarge", node_count=2, spot=False, public_ipv4=1, disk_gb=100, disk_type="gp3")
    ledger.resource_requested("r-up", "fleet", "lab-fleet", region="us-east-1", detail=detail, now=t0)
    ledger.finish_run("r-up", status="succeeded", exit_code=0, teardown="kept")
    remember_team(ledger, "r-up", "r-up")
    monkeypatch.setenv("GPUCLUSTER_STATE", f"file://{tmp_path / 'elsewhere'}")
    ledger.resource_deleted("r-up", "fleet", "lab-fleet", now=t0 + 2 * 3600)  # what `down` confirmed
    settle_kept(ledger, "lab")
    assert store.list(OPEN) == [] and [n for n, _ in store.list(ENDED)] == [f"{ENDED}/r-up.json"]
    ended = __import__("json").loads(store.get(f"{ENDED}/r-up.json"))
    assert Decimal("4.02") < Decimal(ended["total"]) < Decimal("4.2")  # 2 h of 2 x $1.006/h, disks, addresses
    assert all(ln["to"] - ln["from"] == pytest.approx(7200, abs=1) for ln in ended["lines"])
