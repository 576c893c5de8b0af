"""Why a sweep scaled badly: rules that name a measured cause and cite the numbers.

A size is flagged when its scaling efficiency is below the threshold (default 0.7) or when it
trained slower than a smaller size of the same group (negative scaling, as in seed 003). For the
flagged sizes these rules look for a cause in what the runs measured:

- data-not-sharded: every rank trained the whole data set (per-rank samples_seen from the final
  records, or the global samples, against the start record's train_samples x epochs). Checked for
  every multi-rank run, flagged or not: it is a bug whatever the speed.
- communication-bound: all-reduce time against compute time per step (the epoch records'
  comm_s and compute_s, measured by the workload itself).
- input-bound: waiting for the next batch (data_s) is a large share of step time.
- cpu-starvation: utilisation records show the CPU near 100 % while the GPUs sit mostly idle.
- straggler: one rank's step-time p90 far above the others' (epoch records' step_p90_s).
- fixed-overhead: training is a small part of the wall time (start-up, rendezvous, provisioning),
  so more nodes cannot pay off. Reported when nothing above explains the slowdown.

Every finding carries the numbers it is based on (`numbers`) and a sentence that quotes them.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Sequence

from gpucluster.sweep.runner import RunFacts, SizeResult
from gpucluster.states import JsonObject, RunStatus

DEFAULT_THRESHOLD = 0.7
COMM_SHARE = 0.3  # all-reduce share of step time above which a size is communication-bound
DATA_SHARE = 0.3  # data-wait share of step time above which a size is input-bound
CPU_BUSY = 90.0  # percent
GPU_IDLE = 50.0  # percent
STRAGGLER_RATIO = 1.5  # slowest rank's p90 / median of the others
STRAGGLER_MIN_S = 0.002  # ignore sub-2 ms differences (timer noise)
SHARD_TOLERANCE = 0.9  # a rank seeing >= 90 % of the full data per epoch is not sharded
OVERHEAD_SHARE = 0.3  # training below 30 % of wall time: fixed costs dominate


RULES = ("scaling", "negative-scaling", "data-not-sharded", "communication-bound", "input-bound", "cpu-starvation",
         "straggler", "fixed-overhead", "unexplained")


@dataclass
class Finding:
    rule: str  # one of RULES
    nodes: int | None
    gpus_per_node: int | None
    message: str
    numbers: JsonObject = field(default_factory=dict)
    severity: str = "warning"  # warning, error (a bug, e.g. unsharded data), info

    def to_dict(self) -> JsonObject:
        return asdict(self)


def _s(x: float) -> str:
    return f"{x:.3g} s" if x < 10 else f"{x:.0f} s"


def flagged_sizes(results: Sequence[SizeResult], threshold: float = DEFAULT_THRESHOLD) -> list[tuple[SizeResult, list[Finding]]]:
    """Sizes that scaled badly, with the findings that say how badly."""
    out = []
    for r in results:
        found = []
        if r.efficiency is not None and r.baseline_nodes is not None and r.nodes != r.baseline_nodes \
                and r.efficiency < threshold:
            found.append(Finding(
                "scaling", r.nodes, r.gpus_per_node,
                f"{r.label}: scaling efficiency {r.efficiency:.2f} against {r.baseline_nodes} node(s) "
                f"(below {threshold:g}; by {r.efficiency_basis})",
                {"efficiency": round(r.efficiency, 4), "threshold": threshold, "baseline_nodes": r.baseline_nodes,
                 "basis": r.efficiency_basis}))
        slower = _slower_than_smaller(results, r)
        if slower:
            found.append(slower)
        if found:
            out.append((r, found))
    return out


def _slower_than_smaller(results: Sequence[SizeResult], r: SizeResult) -> Finding | None:
    """More nodes, less done per second: lower global samples/s than a smaller size (or, when the
    workload reports no samples, a longer training time for the same job)."""
    smaller = [s for s in results if s.gpus_per_node == r.gpus_per_node and s.nodes < r.nodes]
    rated = [(s.samples_per_s.median, s) for s in smaller if s.samples_per_s]  # (samples/s, size)
    if r.samples_per_s and smaller and len(rated) == len(smaller):
        worse = _slower_rate(r.samples_per_s.median, rated)
        what = "samples/s"
    else:
        timed = [(s.train_s.median, s) for s in smaller if s.train_s]  # (training seconds, size)
        smaller = [s for _, s in timed]
        worse = _longer_time(r.train_s.median, timed) if r.train_s and smaller else None
        what = "training time"
    if worse is None:
        return None
    ratio, best = worse
    return _negative_scaling(r, best, smaller, ratio, what)


def _slower_rate(rate: float, rated: list[tuple[float, SizeResult]]) -> tuple[float, SizeResult] | None:
    """(how many times slower, the fastest smaller size), when `rate` is under the best of `rated`."""
    best_rate, best = max(rated, key=lambda p: p[0])
    if rate >= best_rate:
        return None
    return best_rate / rate, best


def _longer_time(train_s: float, timed: list[tuple[float, SizeResult]]) -> tuple[float, SizeResult] | None:
    """(how many times longer, the quickest smaller size), when `train_s` is over the best of `timed`."""
    best_time, best = min(timed, key=lambda p: p[0])
    if train_s <= best_time:
        return None
    return train_s / best_time, best


def _negative_scaling(r: SizeResult, best: SizeResult, smaller: list[SizeResult], ratio: float,
                      what: str) -> Finding:
    rows = sorted([*smaller, r], key=lambda s: s.nodes)
    times = ", ".join(f"{s.nodes} node(s) {_s(s.train_s.median)}" for s in rows if s.train_s)
    rates = ", ".join(f"{s.samples_per_s.median:,.0f}" for s in rows if s.samples_per_s)
    tail = f" (global samples/s {rates})" if what == "samples/s" else ""
    return Finding(
        "negative-scaling", r.nodes, r.gpus_per_node,
        f"{r.label} got less done than {best.nodes} node(s): training {times}{tail}; "
        f"{ratio:.2f}x worse by {what}",
        {"by": what, "ratio": round(ratio, 4), "better_nodes": best.nodes,
         "train_s": round(r.train_s.median, 3) if r.train_s else None,
         "better_train_s": round(best.train_s.median, 3) if best.train_s else None,
         "samples_per_s": r.samples_per_s.median if r.samples_per_s else None,
         "better_samples_per_s": best.samples_per_s.median if best.samples_per_s else None},
        severity="error")


def diagnose(results: Sequence[SizeResult], threshold: float = DEFAULT_THRESHOLD) -> list[Finding]:
    """All findings for a summarised sweep: how each bad size scaled, and the measured causes."""
    findings: list[Finding] = []
    for r in results:  # unsharded data is a bug at any speed
        findings += [f for f in (not_sharded(r, x) for x in _ok(r)) if f][:1]
    for r, how in flagged_sizes(results, threshold):
        findings += how
        base = _baseline(results, r)
        causes: list[Finding] = []
        for rule in (communication_bound, input_bound, cpu_starvation, straggler):
            hit = rule(r, base)
            if hit:
                causes.append(hit)
        sharding = [f for f in findings if f.rule == "data-not-sharded" and f.nodes == r.nodes
                    and f.gpus_per_node == r.gpus_per_node]
        if not causes and not sharding:
            causes.append(fixed_overhead(r) or Finding(
                "unexplained", r.nodes, r.gpus_per_node,
                f"{r.label}: none of the measured causes (sharding, communication, input, CPU starvation, "
                "stragglers, fixed overhead) explains the slowdown; the workload may not report timing splits"))
        findings += causes
    findings.sort(key=lambda f: (f.gpus_per_node or 0, f.nodes or 0, RULES.index(f.rule)))
    return findings


def _ok(r: SizeResult) -> list[RunFacts]:
    return [f for f in r.facts if f.status == RunStatus.SUCCEEDED]


def _baseline(results: Sequence[SizeResult], r: SizeResult) -> SizeResult | None:
    return next((s for s in results if s.gpus_per_node == r.gpus_per_node and s.nodes == r.baseline_nodes), None)


def _median(values) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


# -- rules -----------------------------------------------------------------------------------
def not_sharded(r: SizeResult, f: RunFacts) -> Finding | None:
    world = f.world_size or 1
    if world < 2 or not f.train_samples or not f.epochs:
        return None
    full = f.train_samples * f.epochs
    sharded = full // world
    if f.samples_seen:
        rank, most = max(f.samples_seen.items(), key=lambda kv: kv[1])
        if most >= SHARD_TOLERANCE * full:
            return Finding(
                "data-not-sharded", r.nodes, r.gpus_per_node,
                f"{r.label}: data not sharded: rank {rank} trained on {most:,} samples = {most / f.train_samples:.3g} "
                f"x the full {f.train_samples:,}-sample train set over {f.epochs} epoch(s); each of the {world} ranks "
                f"should see about {sharded:,}. Every rank repeats the same epoch, so more nodes add no progress "
                "(use a DistributedSampler or slice the data by rank)",
                {"run_id": f.run_id, "rank": rank, "samples_seen": most, "train_samples": f.train_samples,
                 "epochs": f.epochs, "world_size": world, "expected_per_rank": sharded}, severity="error")
        return None
    if f.reported_samples_per_s and f.train_s:
        total = f.reported_samples_per_s * f.train_s
        if total >= SHARD_TOLERANCE * full * world:
            return Finding(
                "data-not-sharded", r.nodes, r.gpus_per_node,
                f"{r.label}: data not sharded: the {world} ranks processed {total:,.0f} samples in all = {world} x "
                f"the full {f.train_samples:,}-sample set x {f.epochs} epoch(s)",
                {"run_id": f.run_id, "global_samples": round(total), "train_samples": f.train_samples,
                 "epochs": f.epochs, "world_size": world}, severity="error")
    return None


def _splits(r: SizeResult) -> tuple[float, float, float, int] | None:
    ok = [f for f in _ok(r) if f.compute_s is not None]
    if not ok:
        return None
    compute = _median(f.compute_s for f in ok) or 0.0
    comm = _median(f.comm_s for f in ok) or 0.0
    data = _median(f.data_s for f in ok) or 0.0
    steps = int(_median(f.steps for f in ok) or 0)
    return compute, comm, data, steps


def _per_step(x: float, steps: int) -> str:
    return f"{1000 * x / steps:.1f} ms/step" if steps else f"{x:.3g} s"


def communication_bound(r: SizeResult, base: SizeResult | None) -> Finding | None:
    s = _splits(r)
    if not s:
        return None
    compute, comm, data, steps = s
    total = compute + comm + data
    if total <= 0 or comm / total < COMM_SHARE:
        return None
    extra = ""
    nums = {"comm_s": round(comm, 4), "compute_s": round(compute, 4), "comm_share": round(comm / total, 3),
            "steps": steps}
    if base is not None and base is not r and (bs := _splits(base)):
        extra = f"; at {base.nodes} node(s) all-reduce took {_per_step(bs[1], bs[3])}"
        nums["baseline_comm_s"] = round(bs[1], 4)
    return Finding(
        "communication-bound", r.nodes, r.gpus_per_node,
        f"{r.label}: communication-bound: gradient all-reduce {_per_step(comm, steps)} vs compute "
        f"{_per_step(compute, steps)} ({comm / total:.0%} of step time, {comm / compute if compute else float('inf'):.2g}x "
        f"compute){extra}. Raise the per-rank batch or the work per step, or use a faster interconnect",
        nums)


def input_bound(r: SizeResult, base: SizeResult | None) -> Finding | None:
    s = _splits(r)
    if not s:
        return None
    compute, comm, data, steps = s
    total = compute + comm + data
    if total <= 0 or data / total < DATA_SHARE:
        return None
    return Finding(
        "input-bound", r.nodes, r.gpus_per_node,
        f"{r.label}: input-bound: waiting for batches took {_per_step(data, steps)} vs compute "
        f"{_per_step(compute, steps)} ({data / total:.0%} of step time). Load and batch data ahead "
        "(more loader workers, pinned memory, data on the device)",
        {"data_s": round(data, 4), "compute_s": round(compute, 4), "data_share": round(data / total, 3), "steps": steps})


def cpu_starvation(r: SizeResult, base: SizeResult | None) -> Finding | None:
    worst = None
    for f in _ok(r):
        per_node: dict[int, list[dict]] = {}
        for u in f.util:
            per_node.setdefault(int(u.get("node_rank") or 0), []).append(u)
        for node, recs in per_node.items():
            cpu = _median(u.get("cpu_percent") for u in recs)
            gpu = _median(_gpu_mean(u) for u in recs)
            if cpu is None or gpu is None:
                continue
            if cpu >= CPU_BUSY and gpu <= GPU_IDLE and (worst is None or gpu < worst[2]):
                worst = (node, cpu, gpu, len(recs), f.run_id)
    if worst is None:
        return None
    node, cpu, gpu, n, run_id = worst
    return Finding(
        "cpu-starvation", r.nodes, r.gpus_per_node,
        f"{r.label}: CPU starvation on node {node}: CPU {cpu:.0f} % busy while the GPUs averaged {gpu:.0f} % "
        f"(median of {n} samples). Give each GPU more vCPUs (seed 003: n1-standard-4 took 2m34s per epoch, "
        "n1-standard-16 39 s)",
        {"run_id": run_id, "node_rank": node, "cpu_percent": round(cpu, 1), "gpu_util_percent": round(gpu, 1),
         "samples": n})


def _gpu_mean(u: dict) -> float | None:
    vals = [g.get("util") for g in u.get("gpu") or [] if g.get("util") is not None]
    return sum(vals) / len(vals) if vals else None


def straggler(r: SizeResult, base: SizeResult | None) -> Finding | None:
    for f in _ok(r):
        p90 = f.step_p90_s
        if not p90 or len(p90) < 2:
            continue
        slow = max(range(len(p90)), key=lambda i: p90[i])
        others = [v for i, v in enumerate(p90) if i != slow]
        typical = statistics.median(others)
        if typical > 0 and p90[slow] >= STRAGGLER_RATIO * typical and p90[slow] - typical >= STRAGGLER_MIN_S:
            return Finding(
                "straggler", r.nodes, r.gpus_per_node,
                f"{r.label}: straggler: rank {slow}'s step-time p90 is {1000 * p90[slow]:.1f} ms vs "
                f"{1000 * typical:.1f} ms median for the other {len(others)} rank(s) ({p90[slow] / typical:.1f}x); "
                "every all-reduce waits for it. Check that node's load, clocks, thermals or data path",
                {"run_id": f.run_id, "rank": slow, "p90_s": p90[slow], "others_median_s": typical,
                 "step_p90_s": list(p90)})
    return None


def fixed_overhead(r: SizeResult) -> Finding | None:
    if not r.train_s or not r.wall_s or r.wall_s.median <= 0:
        return None
    share = r.train_s.median / r.wall_s.median
    if share >= OVERHEAD_SHARE:
        return None
    parts = ", ".join(f"{p} {_s(st.median)}" for p, st in r.phases.items() if st and p != "train")
    return Finding(
        "fixed-overhead", r.nodes, r.gpus_per_node,
        f"{r.label}: fixed overhead dominates: training took {_s(r.train_s.median)} of {_s(r.wall_s.median)} wall "
        f"({share:.0%}); the rest is {parts}. Train longer (more epochs or data) for the extra nodes to pay off",
        {"train_s": round(r.train_s.median, 3), "wall_s": round(r.wall_s.median, 3), "train_share": round(share, 3)},
        severity="info")
