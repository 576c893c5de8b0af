"""Failover down the placement ranking (issue 43 item 3, docs/placement.md) on the existing stand-ins:
the real Automation API driver (infra/pulumi) on the fake Pulumi CLI (tests/pulumi_fake.py), the
real lifecycle, ledger and teardown check; the tag scan and the launcher are stubs (no nodes boot).

What the stand-ins answer, at their worst:
- GKE out of GPUs in a zone: the node pool's create fails with GCE's ZONE_RESOURCE_POOL_EXHAUSTED
  ("The zone ... does not have enough resources available to fulfill the request. Try a different
  zone, or try again later."; https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-resource-availability),
  after the cluster itself was created (so there is something to tear down and price).
- EC2 out of capacity in every zone of a region: RunInstances' InsufficientInstanceCapacity
  (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/troubleshooting-launch.html#troubleshooting-launch-capacity),
  as tests/test_automation.py's zone failover inside a region sees it, in each zone the provider tries.
- a quota met only at create time: EC2's VcpuLimitExceeded
  (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-resource-limits.html).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

sys.path.insert(0, str(Path(__file__).parent))
pytest.importorskip("pulumi.automation")
from pulumi_fake import FakePulumiCommand  # noqa: E402

GKE_STOCKOUT = ("error: 1 error occurred:\n\t* error creating NodePool: googleapi: Error 400: The zone "
                "'projects/p/zones/{zone}' does not have enough resources available to fulfill the request. Try a "
                "different zone, or try again later. (ZONE_RESOURCE_POOL_EXHAUSTED)")
EC2_CAPACITY = ("creating EC2 Fleet: InsufficientInstanceCapacity: We currently do not have sufficient g6.xlarge "
                "capacity in the Availability Zone you requested ({zone}). Our system will be working on "
                "provisioning additional capacity.")
EC2_QUOTA = ("creating EC2 Fleet: VcpuLimitExceeded: You have requested more vCPU capacity than your current vCPU "
             "limit of 0 allows for the instance bucket that the specified instance type belongs to.")
GKE_RESOURCES = [("gcp:container/cluster:Cluster", "c", "projects/p/locations/z/clusters/c"),
                 ("gcp:container/nodePool:NodePool", "c-gpu", "pool-id")]


from gpucluster.watch.launch import JobResult, Launcher, NodeResult  # noqa: E402
from gpucluster.watch.metrics import MetricsState  # noqa: E402


class StubLauncher(Launcher):
    """Every node exits 0 (nothing boots: the test is about what happens before and between runs)."""

    def launch(self, cluster, job, events, log_dir):
        return JobResult(ok=True, nodes=[NodeResult(n.rank, n.host, 0) for n in cluster.nodes], metrics=MetricsState())


def _provider(cloud: str, fake: FakePulumiCommand):
    from gpucluster.infra.pulumi.engine import PulumiDriver
    from gpucluster.infra.pulumi.provider import PulumiProvider
    from gpucluster.infra.registry import plugin

    return PulumiProvider(plugin(cloud), driver=PulumiDriver(pulumi_command=fake, program_runner=lambda s: None),
                          find=lambda *a, **kw: [], delete=lambda items: [],
                          credentials=lambda region=None: [{"check": f"{cloud} credentials", "ok": True, "detail": "ok"}],
                          cloud_checks=lambda spec: None)


def _placed(nodes: int = 4, **kw):
    """The real ranking of 4 × L4 nodes on aws and gcp (gcp first: its fixed fees spread over 4 nodes)."""
    from gpucluster.infra.registry import plugin
    from gpucluster.plan.placement import place
    from gpucluster.lifecycle.prepare import Request, prepare

    req = Request(cloud="aws,gcp", gpu="L4", nodes=nodes, dry_run=True, max_minutes=10, **kw)
    # the cheapest machine of each place comes first (the larger g2/g6 machines rank after these 8), so
    # --max-attempts 8 walks zone -> region -> cloud; tests/test_placement_data.py covers the machines
    return place(req, {c: plugin(c) for c in ("aws", "gcp")}, prepare=prepare, preflight=None, max_attempts=8)


def _run(placement, fakes, home):
    from gpucluster.lifecycle.failover import run_placed
    from gpucluster.infra.registry import plugin
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.steps import QuietUI
    from gpucluster.lifecycle.recovery import run_plan

    ledger = Ledger(home / "ledger.sqlite3")
    messages: list[str] = []
    ui = QuietUI()
    ui.message = messages.append
    requested: list[tuple[str, float]] = []

    def one(cand, after):
        plan = cand.plan
        fake = fakes[cand.where] if cand.where in fakes else fakes[(cand.cloud, cand.region)]  # a zone's, or its region's
        plan.provider, plan.launcher = _provider(cand.cloud, fake), StubLauncher()
        plan.resumed_from = after
        requested.append((cand.where, time.monotonic()))
        return run_plan(plan, ledger=ledger, ui=ui, backend=plugin(cand.cloud))

    return run_placed(placement, ledger=ledger, ui=ui, run_one=one), ledger, messages, requested


def test_capacity_fails_over_zone_then_region_then_cloud_each_attempt_torn_down_and_recorded(home):
    placement = _placed()
    where = [c.where for c in placement.tried]
    gke = [f"gcp {r} ({r}-{z})" for r in ("us-central1", "europe-west4") for z in "abc"]
    assert where == [*gke, "aws us-east-1", "aws us-west-2"]  # a GKE cluster is zonal: each zone a candidate
    fakes = {("gcp", r): FakePulumiCommand(resources=GKE_RESOURCES, fail_up_after=1,  # every zone stocked out
                                           fail_text=GKE_STOCKOUT.format(zone=f"{r}-a"))
             for r in ("us-central1", "europe-west4")}
    # every zone the aws provider tries in us-east-1 is out too ... then us-west-2 has it
    fakes[("aws", "us-east-1")] = FakePulumiCommand(fail_up_after=4, fail_text=EC2_CAPACITY.format(zone="us-east-1a"))
    fakes[("aws", "us-west-2")] = FakePulumiCommand()
    chain, ledger, messages, requested = _run(placement, fakes, home)
    assert [w for w, _ in requested] == where
    assert chain.final.status == "succeeded" and chain.stopped is None
    # the aws provider moved through us-east-1's zones itself before the region was given up
    assert fakes[("aws", "us-east-1")].verbs().count("up") == 3
    failed, last = chain.attempts[:-1], chain.attempts[-1]
    assert len(failed) == 7
    for n, a in enumerate(failed, 1):
        run = ledger.get_run(a.run_id)
        assert run.run.teardown == "verified" and run.phase("provision").status == "failed"
        (rec,) = ledger.metrics(a.run_id, kind="placement")
        assert rec["attempt"] == n and rec["cause"] == "capacity" and rec["of"] == 8
        assert rec["failure"].startswith(f"no capacity at {where[n - 1]}")
        (att,) = ledger.metrics(a.run_id, kind="attempt")
        assert att["cause"] == "capacity" and att["chain"] == chain.attempts[0].run_id
        assert float(run.cost["total"]) > 0  # what the attempt created was requested: priced
    assert ledger.get_run(failed[0].run_id).run.spec["zone"] == "us-central1-a"
    assert ledger.get_run(failed[1].run_id).run.spec["zone"] == "us-central1-b"
    for fake in fakes.values():
        assert fake.stacks == {}  # every failed attempt's stack destroyed
    # `show` and `cost report --group-by chain` follow the chain the attempts make
    from gpucluster.ledger.attempts import chain_attempts

    chain_ids = ledger.get_run(last.run_id).chain
    assert chain_ids == [a.run_id for a in chain.attempts]
    rows = chain_attempts(ledger, chain_ids)
    assert [r["cause"] for r in rows] == ["capacity"] * 7 + [None]
    assert any("failing over to candidate 2 of 8, gcp us-central1 (us-central1-b)" in m for m in messages)
    assert any("failing over to candidate 4 of 8, gcp europe-west4 (europe-west4-a)" in m for m in messages)
    assert any("failing over to candidate 7 of 8, aws us-east-1" in m for m in messages)
    # the benchmark's figure, on the stand-ins: capacity error -> next create request
    gaps = [b - a for (_, a), (_, b) in zip(requested, requested[1:])]
    assert max(gaps) < 60


def test_a_quota_error_at_create_time_fails_over_and_max_attempts_stops_the_list(home):
    placement = _placed(nodes=1)
    placement.max_attempts = 2
    first, second = placement.tried
    fakes = {(first.cloud, first.region): FakePulumiCommand(fail_up_after=1, fail_text=EC2_QUOTA),
             (second.cloud, second.region): FakePulumiCommand(
                 resources=GKE_RESOURCES, fail_up_after=1, fail_text=GKE_STOCKOUT.format(zone=second.zones[0]))}
    assert first.cloud == "aws"
    chain, ledger, messages, requested = _run(placement, fakes, home)
    assert len(requested) == 2 and chain.final.status == "failed"
    causes = [ledger.metrics(a.run_id, kind="placement")[0]["cause"] for a in chain.attempts]
    assert causes == ["quota", "capacity"]
    left = len(placement.ranked) - 2
    assert f"every candidate tried (2; {left} more left out by --max-attempts 2)" in chain.stopped


def test_a_failure_placement_cannot_fix_does_not_fail_over(home):
    placement = _placed()
    first = placement.chosen
    fakes = {(first.cloud, first.region): FakePulumiCommand(
        resources=GKE_RESOURCES, fail_up_after=1, fail_text="error: googleapi: Error 403: Permission denied")}
    chain, ledger, messages, requested = _run(placement, fakes, home)
    assert len(requested) == 1 and chain.final.status == "failed"
    assert ledger.metrics(chain.final.run_id, kind="placement")[0]["cause"] is None


def test_ctrl_c_during_failover_tears_down_the_current_attempt_and_starts_no_next(home):
    placement = _placed()
    first, second = placement.tried[:2]
    fakes = {first.where: FakePulumiCommand(
        resources=GKE_RESOURCES, fail_up_after=1, fail_text=GKE_STOCKOUT.format(zone=first.zones[0])),
        # Ctrl-C while the second candidate's cluster (the next zone's) is being created
        second.where: FakePulumiCommand(resources=GKE_RESOURCES, interrupt_up_after=1)}
    chain, ledger, messages, requested = _run(placement, fakes, home)
    assert len(requested) == 2
    assert chain.final.status == "interrupted"
    run = ledger.get_run(chain.final.run_id)
    assert run.run.teardown == "verified" and fakes[second.where].stacks == {}
    assert ledger.metrics(chain.final.run_id, kind="placement")[0]["cause"] is None


def test_run_cloud_auto_through_the_cli_fails_over_and_reports_every_attempt(home, monkeypatch, capsys, tmp_path):
    """`gpucluster run --cloud aws,gcp` end to end in-process: the ranking, each candidate's preflight,
    the failover and the report; each candidate's provider is the stand-in of its (cloud, region)."""
    import json

    import gpucluster.lifecycle.prepare as prepare_mod
    from gpucluster.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('trained')\n")
    fakes: dict = {}

    def fake_for(spec):
        if (spec.cloud, spec.region) not in fakes:
            fakes[(spec.cloud, spec.region)] = FakePulumiCommand(
                resources=GKE_RESOURCES, fail_up_after=1, fail_text=GKE_STOCKOUT.format(zone=spec.zone)) \
                if spec.cloud == "gcp" else FakePulumiCommand()
        return fakes[(spec.cloud, spec.region)]

    monkeypatch.setattr(prepare_mod, "_make", lambda req, backend, spec, provider, ready: (
        _provider(spec.cloud, fake_for(spec)), StubLauncher()))
    code = main(["run", "--cloud", "aws,gcp", "--gpu", "L4", "--nodes", "4", "--project", "my-project-1", "--ssh-cidr",
                 "203.0.113.7/32", "--max-minutes", "10", "--max-attempts", "8", "--no-check", "--yes", "--json", "--", "python", "train.py"])
    out, err = capsys.readouterr()
    assert code == 0, err
    record = json.loads(out)
    assert record["cloud"] == "aws" and record["status"] == "succeeded" and record["teardown"] == "verified"
    assert "at most 8 tried" in err and "failing over to candidate 7 of 8, aws us-east-1" in err
    attempts = record["attempts"]
    assert [a["cause"] for a in attempts] == ["capacity"] * 6 + [None]
    assert all("ZONE_RESOURCE_POOL_EXHAUSTED" in a["interruption"] for a in attempts[:6])
    assert all(a["cost"] is not None for a in attempts)


def test_up_fails_over_too_and_keeps_the_first_candidate_that_comes_up(home):
    """`up --cloud aws,gcp` (issue 43 item 3 for `up`): GKE is out of L4s in every zone, so each
    zone's attempt is torn down (verified) and the next tried; aws us-east-1 comes up and is kept.
    The cluster `up` shows and records is that candidate's."""
    from gpucluster.api.clusters import provision
    from gpucluster.api.jobs import Planned
    from gpucluster.infra.registry import plugin
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.steps import QuietUI

    placement = _placed()
    fakes = {("gcp", r): FakePulumiCommand(resources=GKE_RESOURCES, fail_up_after=1,
                                           fail_text=GKE_STOCKOUT.format(zone=f"{r}-a"))
             for r in ("us-central1", "europe-west4")}
    fakes[("aws", "us-east-1")] = FakePulumiCommand()
    fakes[("aws", "us-west-2")] = FakePulumiCommand()  # never reached
    for cand in placement.tried:
        cand.plan.provider = _provider(cand.cloud, fakes[(cand.cloud, cand.region)])
    ledger = Ledger(home / "ledger.sqlite3")
    messages: list[str] = []
    ui = QuietUI()
    ui.message = messages.append
    first = placement.tried[0]
    planned = Planned(plugin(first.cloud), first.plan, keep=True, placement=placement)
    made = provision(planned, ledger=ledger, ui=ui)
    assert planned.backend.name == "aws" and planned.plan.spec.region == "us-east-1"
    assert made.cluster.nodes  # the fake's scripted outputs: the nodes of the cluster that is up
    runs = ledger.list_runs(limit=None)
    kept = [r for r in runs if r.teardown == "kept"]  # `up`'s row: succeeded, its cluster kept
    failed = [r for r in runs if r.teardown != "kept"]
    assert len(kept) == 1 and kept[0].id == planned.plan.spec.run_id and len(failed) == 6
    for run in failed:
        assert ledger.get_run(run.id).run.teardown == "verified"
        (rec,) = ledger.metrics(run.id, kind="placement")
        assert rec["cause"] == "capacity" and rec["failure"].startswith("no capacity at gcp ")
    (rec,) = ledger.metrics(kept[0].id, kind="placement")
    assert rec["attempt"] == 7 and rec["cause"] is None and rec["teardown"] == "kept"
    assert all(fakes[("gcp", r)].stacks == {} for r in ("us-central1", "europe-west4"))
    assert fakes[("aws", "us-east-1")].stacks  # the one kept
    assert any("failing over to candidate 7 of 8, aws us-east-1" in m for m in messages)


def test_up_does_not_fail_over_on_an_error_placement_cannot_fix(home):
    from gpucluster.api.clusters import provision
    from gpucluster.api.jobs import Planned
    from gpucluster.errors import GpuclusterError
    from gpucluster.infra.registry import plugin
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.steps import QuietUI

    placement = _placed()
    denied = FakePulumiCommand(resources=GKE_RESOURCES, fail_up_after=1,
                               fail_text="error creating NodePool: googleapi: Error 403: Permission denied")
    for cand in placement.tried:
        cand.plan.provider = _provider(cand.cloud, denied if cand.cloud == "gcp" else FakePulumiCommand())
    first = placement.tried[0]
    with pytest.raises(GpuclusterError, match="Permission denied"):
        provision(Planned(plugin(first.cloud), first.plan, keep=True, placement=placement),
                  ledger=Ledger(home / "ledger.sqlite3"), ui=QuietUI())
    assert len(Ledger(home / "ledger.sqlite3").list_runs(limit=None)) == 1  # no second attempt


def test_ctrl_c_during_up_failover_tears_down_the_current_attempt_and_starts_no_next(home):
    """`up --cloud aws,gcp`: the first zone is stocked out, Ctrl-C comes while the next zone's cluster is
    being created; that attempt is torn down (verified) and no third candidate is created."""
    from gpucluster.api.clusters import provision
    from gpucluster.api.jobs import Planned
    from gpucluster.infra.registry import plugin
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.steps import QuietUI

    placement = _placed()
    first, second = placement.tried[:2]
    fakes = {first.where: FakePulumiCommand(resources=GKE_RESOURCES, fail_up_after=1,
                                            fail_text=GKE_STOCKOUT.format(zone=first.zones[0])),
             second.where: FakePulumiCommand(resources=GKE_RESOURCES, interrupt_up_after=1)}
    untouched = FakePulumiCommand()
    for cand in placement.tried:
        cand.plan.provider = _provider(cand.cloud, fakes.get(cand.where, untouched))
    ledger = Ledger(home / "ledger.sqlite3")
    with pytest.raises(KeyboardInterrupt):  # `up` ends as Ctrl-C ends it (exit 130), after the teardown
        provision(Planned(plugin(first.cloud), first.plan, keep=True, placement=placement), ledger=ledger,
                  ui=QuietUI())
    runs = ledger.list_runs(limit=None)
    assert len(runs) == 2  # the stocked-out zone and the interrupted one: no third attempt
    assert all(ledger.get_run(r.id).run.teardown == "verified" for r in runs)
    assert fakes[second.where].stacks == {} and untouched.verbs() == []
