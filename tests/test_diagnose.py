"""Scaling efficiency and every diagnosis rule, on fixture runs written to a real Ledger.

Includes a reconstruction of seed 003 (the Kubeflow MNIST example on GKE: 1 node 57 s, 2 nodes
97 s, 4 nodes 103 s, every rank training the full data set).
"""

from decimal import Decimal

import pytest

from gpucluster.sweep.diagnose import diagnose, flagged_sizes
from gpucluster.infra.registry import plugin
from gpucluster.ledger.store import Ledger
from gpucluster.sweep.runner import compare_cpu_gpu, load_sweep, summarize

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

T0 = 1_790_000_000.0


class Fixture:
    """Writes runs the way lifecycle.execute does: row, phases, metric records, finish, cost."""

    def __init__(self, tmp_path, sweep_id="s-test"):
        self.ledger = Ledger(tmp_path / "ledger.sqlite3")
        self.sweep_id = sweep_id
        self.t = T0
        self.n = 0

    def run(self, nodes, *, gpn=0, train_s, world=None, sps=None, epochs=2, accuracy=None, loss=0.5,
            train_samples=None, seen=None, epoch_splits=None, p90=None, util=(), cost=None, cloud="local",
            status="succeeded", overhead=(1.0, 0.5, 2.0, 0.5)):
        self.n += 1
        rid = f"r-{self.n:03d}-{nodes}n"
        world = world or nodes * max(1, gpn)
        led, t = self.ledger, self.t
        led.create_run(rid, cloud=cloud, cluster="c", nodes=nodes, gpus_per_node=gpn, command=["x"], spec={},
                       workload="fixture", sweep_id=self.sweep_id, now=t)
        provision, ready, rendezvous, teardown = overhead
        for name, dur in (("prepare", 0.01), ("provision", provision), ("ready", ready), ("rendezvous", rendezvous),
                          ("train", train_s + 0.5), ("teardown", teardown)):
            led.phase_start(rid, name, now=t)
            t += dur
            led.phase_end(rid, name, "ok", now=t)
        recs = [(0, {"kind": "start", "rank": 0, "time": t, "world_size": world,
                     **({"train_samples": train_samples} if train_samples else {})})]
        for e in range(1, epochs + 1):
            rec = {"kind": "epoch", "rank": 0, "time": t, "epoch": e, "step": e * 10, "loss": loss}
            if sps:
                rec["samples_per_s"] = sps
            if epoch_splits:
                compute, comm, data = epoch_splits
                rec.update(compute_s=compute / epochs, comm_s=comm / epochs, data_s=data / epochs)
            if p90:
                rec["step_p90_s"] = list(p90)
            recs.append((0, rec))
        for u in util:
            recs.append((u.get("node_rank", 0), {"kind": "util", "time": t, **u}))
        for rank in range(world):
            fin = {"kind": "final", "rank": rank, "time": t, "epochs": epochs, "loss": loss, "train_time_s": train_s}
            if sps:
                fin["samples_per_s"] = sps
            if accuracy is not None:
                fin["accuracy"] = accuracy
            if seen is not None:
                fin["samples_seen"] = seen
            recs.append((rank // max(1, world // nodes), fin))
        led.add_metrics(rid, recs)
        summary = {"epochs": epochs, "loss": loss, "train_time_s": train_s, "world_size": world}
        if sps:
            summary["samples_per_s"] = sps
        if accuracy is not None:
            summary["accuracy"] = accuracy
        led.finish_run(rid, status=status, exit_code=0 if status == "succeeded" else 1, metrics=summary,
                       teardown="verified", now=t)
        if cost is not None:
            # what a real cloud run records: one instance of type `cost` per node, alive from the
            # provision to the end of teardown, priced by the real cost engine
            from gpucluster.costing.cost import run_cost

            for node in range(nodes):
                where = "us-east-1" if cloud == "aws" else "us-central1-a"
                led.resource_requested(rid, "instance", f"node-{node}", region=where,
                                       detail={"instance_type": cost, "gpus": gpn}, now=self.t)
                led.resource_created(rid, "instance", f"node-{node}", f"i-{node}", now=self.t + 1)
                led.resource_deleted(rid, "instance", f"node-{node}", now=t)
            led.set_cost(rid, run_cost(led.get_run(rid), backend=plugin(cloud), now=t))
        self.t = t + 10
        return rid

    def summary(self):
        return summarize(load_sweep(self.ledger, self.sweep_id), {c: plugin(c) for c in ("local", "aws")})


def by_nodes(summary, gpn=None):
    return {r.nodes: r for r in summary if gpn is None or r.gpus_per_node == gpn}


def rules(findings, nodes=None):
    return {f.rule for f in findings if nodes is None or f.nodes == nodes}


# -- efficiency --------------------------------------------------------------------------------
def test_efficiency_against_one_node(tmp_path):
    fx = Fixture(tmp_path)
    fx.run(1, train_s=10.0, sps=1000.0)
    fx.run(2, train_s=5.5, sps=1800.0)
    fx.run(4, train_s=3.3, sps=3000.0)
    s = by_nodes(fx.summary())
    assert s[1].efficiency == pytest.approx(1.0)
    assert s[2].efficiency == pytest.approx(0.9)
    assert s[4].efficiency == pytest.approx(0.75)
    assert s[4].efficiency_basis == "samples/s" and s[4].baseline_nodes == 1
    assert s[4].speedup == pytest.approx(3.0)  # throughput ratio
    assert s[2].phases["provision"].median == pytest.approx(1.0)
    assert s[2].wall_s.median == pytest.approx(0.01 + 1.0 + 0.5 + 2.0 + 6.0 + 0.5)
    assert s[1].cost_usd.median == Decimal("0")  # local runs cost nothing


def test_repeats_give_median_and_spread(tmp_path):
    fx = Fixture(tmp_path)
    for sps in (900.0, 1000.0, 1100.0):
        fx.run(1, train_s=10.0, sps=sps)
    for sps in (1500.0, 1600.0, 1900.0):
        fx.run(2, train_s=6.0, sps=sps)
    s = by_nodes(fx.summary())
    assert s[1].samples_per_s.median == 1000.0 and s[1].samples_per_s.n == 3
    assert (s[2].samples_per_s.min, s[2].samples_per_s.max) == (1500.0, 1900.0)
    assert s[2].efficiency == pytest.approx(0.8)
    assert s[2].efficiency_range == pytest.approx((0.75, 0.95))


def test_no_one_node_run_uses_the_smallest(tmp_path):
    fx = Fixture(tmp_path)
    fx.run(2, train_s=10.0, sps=2000.0)
    fx.run(4, train_s=6.0, sps=3000.0)
    s = by_nodes(fx.summary())
    assert s[4].baseline_nodes == 2
    assert s[4].efficiency == pytest.approx(3000 / (2 * 2000))


def test_time_basis_when_no_samples_reported(tmp_path):
    fx = Fixture(tmp_path)
    fx.run(1, train_s=60.0)
    fx.run(2, train_s=40.0)
    s = by_nodes(fx.summary())
    assert s[2].efficiency_basis == "time"
    assert s[2].efficiency == pytest.approx(60 / (2 * 40))


def test_failed_runs_are_counted_not_averaged(tmp_path):
    fx = Fixture(tmp_path)
    fx.run(1, train_s=10.0, sps=1000.0)
    fx.run(2, train_s=5.0, sps=2000.0)
    bad = fx.run(2, train_s=99.0, sps=10.0, status="failed")
    s = by_nodes(fx.summary())
    assert s[2].failed == [bad] and len(s[2].runs) == 2
    assert s[2].samples_per_s.median == 2000.0 and s[2].samples_per_s.n == 1


def test_good_scaling_has_no_findings(tmp_path):
    fx = Fixture(tmp_path)
    fx.run(1, train_s=10.0, sps=1000.0, epoch_splits=(9.0, 0.5, 0.5), p90=[0.1])
    fx.run(2, train_s=5.2, sps=1900.0, epoch_splits=(4.5, 0.6, 0.1), p90=[0.1, 0.105])
    assert diagnose(fx.summary()) == []


# -- seed 003 ---------------------------------------------------------------------------------
def seed_003(tmp_path):
    """1 node x 4 V100 (2 pods x 2 GPUs) 57.146 s; 2 nodes x 4 96.533 s; 4 nodes x 4 102.795 s;
    MNIST 60,000 training images, 8 epochs, batch 128, no DistributedSampler: every rank sees all
    60,000 images per epoch. Cost: n1-standard-16 + 4 x V100 per node, priced by the cost engine
    from the shipped catalog (us-central1 on-demand, FACTS.md)."""
    fx = Fixture(tmp_path, sweep_id="seed-003")
    for nodes, secs, acc, loss in ((1, 57.146, 0.8470, 0.4273), (2, 96.533, 0.8473, 0.4280),
                                   (4, 102.795, 0.8502, 0.4259)):
        world = 4 * nodes
        cost = "n1-standard-16"
        fx.run(nodes, gpn=4, world=world, train_s=secs, epochs=8, accuracy=acc, loss=loss, cloud="gcp",
               train_samples=60000, seen=60000 * 8, sps=round(world * 60000 * 8 / secs, 2), cost=cost)
    return fx


def test_seed_003_negative_scaling_is_flagged_with_its_cause(tmp_path):
    fx = seed_003(tmp_path)
    summary = fx.summary()
    s = by_nodes(summary)
    # Useful throughput: redundant copies of the same epoch are not counted.
    assert s[1].samples_per_s.median == pytest.approx(480000 / 57.146)
    assert s[4].efficiency == pytest.approx(57.146 / (4 * 102.795))
    assert s[4].efficiency < 0.2
    assert s[4].cost_usd.median > s[2].cost_usd.median > s[1].cost_usd.median
    assert s[4].cost_per_epoch_usd.median == s[4].cost_usd.median / 8
    assert s[2].accuracy.median == pytest.approx(0.8473)

    findings = diagnose(summary)
    assert rules(findings, 2) >= {"scaling", "negative-scaling", "data-not-sharded"}
    assert rules(findings, 4) >= {"scaling", "negative-scaling", "data-not-sharded"}
    assert "data-not-sharded" in rules(findings, 1)  # 4 ranks on 1 node: unsharded too
    assert not {"scaling", "negative-scaling"} & rules(findings, 1)
    neg4 = next(f for f in findings if f.rule == "negative-scaling" and f.nodes == 4)
    assert "1 node(s) 57 s" in neg4.message and "4 node(s) 103 s" in neg4.message
    assert "2 node(s) 97 s" in neg4.message
    assert "8,400, 4,972, 4,669" in neg4.message  # useful global samples/s
    assert neg4.numbers["better_nodes"] == 1 and neg4.numbers["ratio"] == pytest.approx(102.795 / 57.146, abs=1e-3)
    shard = next(f for f in findings if f.rule == "data-not-sharded" and f.nodes == 4)
    assert shard.numbers["samples_seen"] == 480000 and shard.numbers["train_samples"] == 60000
    assert shard.numbers["expected_per_rank"] == 30000 and shard.severity == "error"
    assert "480,000" in shard.message and "60,000" in shard.message


def test_unsharded_data_found_from_global_samples_without_per_rank_records(tmp_path):
    fx = Fixture(tmp_path)
    fx.run(1, train_s=10.0, sps=1000.0, train_samples=5000, epochs=2)
    # 2 ranks, no samples_seen: the reported global rate x time = 2 x the full set x epochs
    fx.run(2, train_s=10.0, sps=2000.0, train_samples=5000, epochs=2)
    f = [x for x in diagnose(fx.summary()) if x.rule == "data-not-sharded"]
    assert len(f) == 1 and f[0].nodes == 2 and f[0].numbers["global_samples"] == 20000


def test_sharded_data_is_not_flagged(tmp_path):
    fx = Fixture(tmp_path)
    fx.run(1, train_s=10.0, train_samples=6000, seen=12000, epochs=2, sps=1200.0)
    fx.run(2, train_s=5.0, train_samples=6000, seen=6000, epochs=2, sps=2400.0)
    assert "data-not-sharded" not in rules(diagnose(fx.summary()))


# -- the other causes -------------------------------------------------------------------------
def test_communication_bound(tmp_path):
    fx = Fixture(tmp_path)
    fx.run(1, train_s=10.0, sps=1000.0, epoch_splits=(9.8, 0.0, 0.2))
    fx.run(2, train_s=9.0, sps=1100.0, epoch_splits=(5.0, 3.8, 0.2))
    findings = diagnose(fx.summary())
    f = next(x for x in findings if x.rule == "communication-bound")
    assert f.nodes == 2 and f.numbers["comm_share"] == pytest.approx(3.8 / 9.0, abs=1e-3)
    assert "190.0 ms/step" in f.message and "250.0 ms/step" in f.message  # 20 steps
    assert "scaling" in rules(findings, 2)
    assert "input-bound" not in rules(findings)


def test_input_bound(tmp_path):
    fx = Fixture(tmp_path)
    fx.run(1, train_s=10.0, sps=1000.0, epoch_splits=(6.0, 0.0, 4.0))
    fx.run(2, train_s=9.0, sps=1100.0, epoch_splits=(3.0, 0.5, 5.5))
    f = next(x for x in diagnose(fx.summary()) if x.rule == "input-bound")
    assert f.nodes == 2 and f.numbers["data_share"] == pytest.approx(5.5 / 9.0, abs=1e-3)


def util(node, cpu, gpu_util):
    return {"node_rank": node, "cpu_percent": cpu,
            "gpu": [{"index": i, "util": gpu_util, "mem_used_mib": 1000.0, "mem_total_mib": 16000.0,
                     "power_w": 60.0} for i in range(4)]}


def test_cpu_starvation(tmp_path):
    fx = Fixture(tmp_path)
    fx.run(1, gpn=4, train_s=10.0, sps=1000.0, util=[util(0, 60.0, 90.0)] * 3)
    fx.run(2, gpn=4, train_s=12.0, sps=900.0,
           util=[util(0, 70.0, 85.0)] * 3 + [util(1, 99.0, 18.0), util(1, 100.0, 22.0), util(1, 98.0, 20.0)])
    findings = diagnose(fx.summary())
    f = next(x for x in findings if x.rule == "cpu-starvation")
    assert f.nodes == 2 and f.numbers["node_rank"] == 1
    assert f.numbers["cpu_percent"] == 99.0 and f.numbers["gpu_util_percent"] == 20.0
    assert "negative-scaling" in rules(findings, 2)


def test_busy_cpu_without_gpu_readings_is_not_starvation(tmp_path):
    fx = Fixture(tmp_path)
    fx.run(1, train_s=10.0, sps=1000.0)
    fx.run(2, train_s=12.0, sps=1000.0, util=[{"node_rank": 0, "cpu_percent": 100.0, "gpu": []}] * 3)
    assert "cpu-starvation" not in rules(diagnose(fx.summary()))


def test_straggler(tmp_path):
    fx = Fixture(tmp_path)
    fx.run(1, train_s=10.0, sps=1000.0, p90=[0.10])
    fx.run(4, train_s=6.0, sps=2000.0, p90=[0.10, 0.11, 0.31, 0.10])
    f = next(x for x in diagnose(fx.summary()) if x.rule == "straggler")
    assert f.nodes == 4 and f.numbers["rank"] == 2 and f.numbers["others_median_s"] == pytest.approx(0.10)
    assert "310.0 ms" in f.message


def test_even_ranks_are_not_stragglers(tmp_path):
    fx = Fixture(tmp_path)
    fx.run(1, train_s=10.0, sps=1000.0, p90=[0.10])
    fx.run(2, train_s=9.0, sps=1100.0, p90=[0.10, 0.12])
    assert "straggler" not in rules(diagnose(fx.summary()))


def test_fixed_overhead_when_nothing_else_explains(tmp_path):
    fx = Fixture(tmp_path)
    fx.run(1, train_s=1.0, sps=1000.0, overhead=(0.1, 0.1, 6.0, 0.1))
    fx.run(2, train_s=1.2, sps=900.0, overhead=(0.1, 0.1, 12.0, 0.1))
    findings = diagnose(fx.summary())
    f = next(x for x in findings if x.rule == "fixed-overhead")
    assert f.nodes == 2 and f.numbers["train_share"] < 0.3 and "rendezvous 12 s" in f.message


def test_weak_scaling_same_time_more_samples_is_not_negative(tmp_path):
    fx = Fixture(tmp_path)
    fx.run(1, train_s=10.0, sps=1000.0)  # fixed steps per rank: time stays, throughput grows
    fx.run(2, train_s=11.0, sps=1820.0)
    assert diagnose(fx.summary()) == []


def test_negative_scaling_by_time_without_samples(tmp_path):
    fx = Fixture(tmp_path)
    fx.run(1, train_s=57.0)
    fx.run(2, train_s=97.0)
    (neg,) = [f for f in diagnose(fx.summary()) if f.rule == "negative-scaling"]
    assert neg.numbers["by"] == "training time" and neg.numbers["ratio"] == pytest.approx(97 / 57, abs=1e-3)


def test_unexplained_says_so(tmp_path):
    fx = Fixture(tmp_path)
    fx.run(1, train_s=10.0, sps=1000.0)
    fx.run(2, train_s=12.0, sps=1000.0)
    assert "unexplained" in rules(diagnose(fx.summary()), 2)


def test_threshold_is_respected(tmp_path):
    fx = Fixture(tmp_path)
    fx.run(1, train_s=10.0, sps=1000.0)
    fx.run(2, train_s=6.5, sps=1600.0)  # efficiency 0.8
    assert flagged_sizes(fx.summary(), 0.7) == []
    assert [r.nodes for r, _ in flagged_sizes(fx.summary(), 0.9)] == [2]


def test_cloud_sweep_shows_cost_per_run_and_per_epoch_from_the_cost_engine(tmp_path):
    fx = Fixture(tmp_path)
    one = fx.run(1, gpn=1, train_s=600.0, sps=100.0, epochs=4, cost="g5.xlarge", cloud="aws")
    two = fx.run(2, gpn=1, train_s=330.0, sps=180.0, epochs=4, cost="g5.xlarge", cloud="aws")
    rows = by_nodes(fx.summary())
    for nodes, rid in ((1, one), (2, two)):
        stored = fx.ledger.get_run(rid).to_dict()["cost"]
        assert set(stored) >= {"total", "lines"} and "total_usd" not in stored  # the engine's shape
        assert rows[nodes].cost_usd.median == Decimal(stored["total"]) > 0
        assert rows[nodes].cost_per_epoch_usd.median == Decimal(stored["total"]) / 4


def test_cpu_vs_gpu_comparison(tmp_path):
    fx = Fixture(tmp_path)
    cpu = fx.run(1, gpn=0, train_s=420.0 * 60, sps=10.0, cost="g5.xlarge", cloud="aws")
    gpu = fx.run(1, gpn=1, train_s=17.0 * 60, sps=250.0, cost="g5.xlarge", cloud="aws")
    summary = fx.summary()
    (c,) = compare_cpu_gpu(summary)
    # the engine's totals: g5.xlarge $1.006/h for 17 min + overhead (~4 s) -> about $0.29
    gpu_total = Decimal(fx.ledger.get_run(gpu).to_dict()["cost"]["total"])
    assert c.speedup == pytest.approx(25.0) and c.gpu_cost_usd == gpu_total
    assert Decimal("0.28") < gpu_total < Decimal("0.30")
    assert c.cpu_cost_usd == Decimal(fx.ledger.get_run(cpu).to_dict()["cost"]["total"]) > Decimal("7")
    # CPU and GPU sizes are separate groups: each is its own efficiency baseline
    assert all(r.efficiency == pytest.approx(1.0) for r in summary)
    assert c.verdict == "25.0x faster on 1 GPU/node"


def test_a_gpu_slower_than_the_cpu_is_called_slower_not_0_9x_faster(tmp_path):
    """On an H200 (benchmarks/gpu_check.py, 2026-11-28) `sweep --compare-cpu --workload digits` said
    "(0.9x faster on 1 GPU/node)": the GPU ran at 0.88x the CPU's samples/s (batch 32 of 8x8 images)."""
    fx = Fixture(tmp_path)
    fx.run(1, gpn=0, train_s=1.08, sps=6500.0)
    fx.run(1, gpn=1, train_s=1.23, sps=5740.0)
    (c,) = compare_cpu_gpu(fx.summary())
    assert c.speedup == pytest.approx(0.883, abs=1e-3)
    assert c.verdict.startswith("1.1x SLOWER on 1 GPU/node: each step is too small to keep a GPU busy")
    assert "faster" not in c.verdict
