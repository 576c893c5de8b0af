"""Scaling sweeps: the same job at several cluster sizes, one ledger sweep id, one summary.

`run_sweep()` runs the job once per (GPUs per node, nodes, repeat) through the ordinary run
lifecycle (`lifecycle.execute`), so every run is a complete ledger row with phases, metrics,
teardown verdict and cost, tagged with the sweep's id. `summarize()` turns those rows into one
`SizeResult` per size: wall time per phase, training time, global samples/s, scaling efficiency
against the 1-node run (or the smallest size run), accuracy, loss, cost per run and per epoch;
with `repeat > 1` the median and the spread (min, max).

Efficiency at N nodes = samples/s at N / (N / N_base x samples/s at N_base), within one "GPUs per
node" group. Samples/s is the useful global rate: when every rank trained the full data set (no
sharding), the redundant copies are not counted (they do no extra work for the model). Runs that
report no samples (unmodified user scripts) are compared on training time instead, assuming the
same total work at every size (strong scaling): T_base x N_base / (N x T_N).

Provisioning: every size gets a cluster of its own (for `local`, N fresh torchrun agents). A cloud
provider whose `up(spec)` is idempotent per cluster name (the Pulumi backends) could instead keep
the cluster between sizes and let the next `up` resize it in place; that is where `run_sweep`
would pass `keep=True` for all but the last run (not done yet: teardown stays per run, which is
the safe default when a sweep is stopped half way).
"""

from __future__ import annotations

import dataclasses
import secrets
import statistics
import time
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Callable, Generic, Iterable, Mapping, Sequence, TypeVar

from gpucluster.errors import GpuclusterError, UsageError
from gpucluster.ledger.store import Ledger, LedgerError
from gpucluster.ledger.schema import PHASES
from gpucluster.ledger.records import RunRecord
from gpucluster.states import JsonObject, RunStatus, TeardownVerdict

if TYPE_CHECKING:
    from gpucluster.domain import Provider
    from gpucluster.infra.contract import Plugin
    from gpucluster.lifecycle.steps import RunUI
    from gpucluster.spec import ClusterSpec
    from gpucluster.watch.launch import JobSpec, Launcher



def new_sweep_id() -> str:
    return time.strftime("s%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


# -- running ---------------------------------------------------------------------------------
@dataclass
class SweepRun:
    nodes: int
    gpus_per_node: int
    repeat: int  # 1-based
    run_id: str
    status: str
    failure: str | None = None
    exit_code: int = 0  # the run's own exit code (3: teardown not verified, or its record not written)
    teardown: str | None = None  # verified | leftovers | not verified | kept | None
    record_error: str | None = None  # the run's record could not be written (the sweep stops there)
    cluster: str = ""

    @property
    def doubt(self) -> str | None:
        """Why this run's end is not proven (a teardown not verified, a record not written), or None."""
        if self.record_error:
            from gpucluster.ledger.recording import record_line

            return f"run {self.run_id}: {record_line(self.record_error, self.cluster)}"
        if self.teardown in (TeardownVerdict.LEFTOVERS, TeardownVerdict.NOT_VERIFIED):
            return (f"run {self.run_id}: teardown {self.teardown.upper()}; finish it with: "
                    f"gpucluster down {self.cluster}")
        return None


@dataclass
class Sweep:
    sweep_id: str
    runs: list[SweepRun] = field(default_factory=list)
    interrupted: bool = False
    record_error: str | None = None  # the ledger failed: the sweep stopped (no further run can be recorded)
    capped: str | None = None  # --max-cost: why the sweep stopped at its cost cap

    @property
    def ok(self) -> bool:
        return not self.interrupted and not self.capped and all(r.status == RunStatus.SUCCEEDED for r in self.runs)

    @property
    def doubts(self) -> list[str]:
        """One line per run whose teardown is not verified or whose record was not written (exit 3)."""
        lines = [d for d in (r.doubt for r in self.runs) if d]
        if self.record_error and not any(r.record_error for r in self.runs):
            lines.append(f"the next run could not be recorded ({self.record_error}); the sweep stopped there")
        return lines


def plan_sizes(node_counts: Sequence[int], gpus_per_node_list: Sequence[int | None], repeat: int) -> list[tuple[int, int | None, int]]:
    """(nodes, gpus per node, repeat) in run order: repeats interleaved so drift hits every size."""
    return [(n, g, r) for r in range(1, repeat + 1) for g in gpus_per_node_list for n in node_counts]


def known_gpus(backend: Plugin) -> int | None:
    """The GPUs a backend knows before anything exists (`Capability.SHARES_GPUS`; local: this machine's): what
    its `SpecRules.prepare` gives a spec of one node; None for the others (nothing is asked of them)."""
    from gpucluster.infra.contract import Capability
    from gpucluster.spec import ClusterSpec

    if not backend.can(Capability.SHARES_GPUS):
        return None
    spec, _ = backend.spec.prepare(ClusterSpec(cloud=backend.name, nodes=1))
    return int(spec.gpus_per_node or 0)


def gpu_sizes(asked: list[int] | None, compare_cpu: bool, present: int | None,
              node_counts: Sequence[int]) -> list[int | None]:
    """The GPUs-per-node values a sweep runs (None: what the nodes have). `present`: the GPUs the
    backend knows before anything exists (local: this machine's), else None."""
    gpn_list: list[int | None] = list(asked) if asked is not None else [None]
    wants_gpu = compare_cpu or any(g for g in gpn_list if g)
    if present is not None:
        if wants_gpu and present == 0:
            raise UsageError("there is no GPU to compare against: this machine has no NVIDIA GPU (nvidia-smi finds "
                             "none), so --compare-cpu / GPUs per node > 0 cannot run here; run the sweep on a machine "
                             "or cloud with GPUs, or sweep CPU nodes only")
        if compare_cpu:
            return list(sorted({0, *[g if g is not None else max(1, present // max(node_counts)) for g in gpn_list]}))
        if gpn_list == [None]:
            return [present // max(node_counts) if present else 0]
        return gpn_list
    if compare_cpu:
        cpu_and_asked: list[int | None] = list(sorted({0, *[g for g in gpn_list if g is not None]}))
        return cpu_and_asked if cpu_and_asked != [0] else [0, None]
    return gpn_list


def run_sweep(base_spec: ClusterSpec, job_template: JobSpec, node_counts: Sequence[int],
              gpus_per_node_list: Sequence[int | None], repeat: int, ledger: Ledger,
              backend: tuple[Provider, Launcher], ui: RunUI | None = None,
              *, sweep_id: str | None = None, prices: JsonObject | None = None, workload: str | None = None,
              new_run_id: Callable[[], str] | None = None, plugin: Plugin,
              on_run: Callable[[int, int, SweepRun | None, tuple[int, int | None, int]], None] | None = None) -> Sweep:
    """Run `job_template` at every size; returns the sweep (its runs are in the ledger).

    `backend` is the (provider, launcher) pair of `plugin`'s `Transport.make`; `plugin` also checks
    every size's spec. A gpus-per-node value of
    None keeps the base spec's (what is present); a positive value also sets processes per node.
    Every size's spec is validated before the first run starts. A failed run does not stop the
    sweep; Ctrl-C / SIGTERM does (the interrupted run is torn down by the lifecycle as usual), and so
    does a ledger that cannot be written (a full home): no further run could be recorded.
    `on_run(index, total, finished_run_or_None, size)` is called before (None) and after each run.
    """
    from gpucluster.lifecycle.steps import execute
    from gpucluster.spec import new_run_id as default_run_id, validate

    if repeat < 1:
        raise UsageError(f"repeat {repeat!r} is not allowed: an integer >= 1")
    if not node_counts:
        raise UsageError("a sweep needs at least one node count")
    provider, launcher = backend
    sweep_id = sweep_id or new_sweep_id()
    make_id = new_run_id or default_run_id
    plan = plan_sizes(node_counts, gpus_per_node_list or [None], repeat)
    for n, g, _ in plan:  # fail before anything runs
        validate(_size_spec(base_spec, n, g, None), plugin)
    sweep = Sweep(sweep_id)
    for i, size in enumerate(plan):
        n, g, r = size
        if on_run:
            on_run(i, len(plan), None, size)
        run_id = make_id()
        spec = _size_spec(base_spec, n, g, run_id)
        job = _size_job(job_template, run_id, g, ledger, sweep)
        try:
            outcome = execute(spec, job, ledger=ledger, provider=provider, launcher=launcher, backend=plugin, ui=ui,
                              prices=prices, sweep_id=sweep_id, workload=workload or job.workload)
        except LedgerError as exc:  # its row could not be written: nothing of this run started
            if not sweep.runs:
                raise  # nothing ran at all: bad input, exit 2
            sweep.record_error = exc.message
            break
        done = SweepRun(n, spec.gpus_per_node or 0, r, outcome.run_id, outcome.status, outcome.failure,
                        int(outcome.exit_code), outcome.teardown, outcome.record_error, spec.name)
        sweep.runs.append(done)
        if on_run:
            on_run(i, len(plan), done, size)
        if _stops(sweep, outcome.record_error, outcome.status, outcome.failure):
            break
    return sweep


def _size_job(job_template: JobSpec, run_id: str, gpus_per_node: int | None, ledger: Ledger, sweep: Sweep) -> JobSpec:
    """The sweep's job for one size's run: its run id, a process per GPU (when GPUs per node are
    given), and under --max-cost what the sweep's runs so far cost."""
    from gpucluster.costing.guards import chain_cost

    job = replace(job_template, run_id=run_id)
    if gpus_per_node:
        job = replace(job, nproc_per_node=gpus_per_node)
    if job.max_cost:  # --max-cost is the whole sweep's: what its runs so far cost counts (guards.py)
        job = replace(job, cost_before=chain_cost(ledger, [d.run_id for d in sweep.runs]))
    return job


def _stops(sweep: Sweep, record_error: str | None, status: str, failure: str | None) -> bool:
    """Whether a run's end stops the sweep (its record not written, the cost cap, an interrupt);
    the sweep says why."""
    if record_error:
        sweep.record_error = record_error
        return True
    if status == RunStatus.STOPPED:  # at the sweep's cost cap: no further run starts
        sweep.capped = failure
        return True
    if status == RunStatus.INTERRUPTED:
        sweep.interrupted = True
        return True
    return False


def _size_spec(base_spec: ClusterSpec, nodes: int, gpus_per_node: int | None, run_id: str | None) -> ClusterSpec:
    if gpus_per_node is None:
        return base_spec.replace(nodes=nodes, run_id=run_id)
    return base_spec.replace(nodes=nodes, run_id=run_id, gpus_per_node=gpus_per_node)


def load_sweep(ledger: Ledger, sweep_id: str) -> list[RunRecord]:
    """Every run of a sweep with its metric records, oldest first."""
    rows = ledger.list_runs(limit=None, sweep_id=sweep_id)
    runs = [ledger.get_run(r.id, with_metrics=True) for r in reversed(rows) if r.id is not None]
    return [r for r in runs if r is not None]


# -- summarising -----------------------------------------------------------------------------
# a figure a sweep summarises: seconds, rates, accuracies and counts (float), or dollars (Decimal)
_Num = TypeVar("_Num", float, Decimal)


@dataclass
class Stat(Generic[_Num]):
    """Median and spread of one figure over a size's repeats."""

    median: _Num
    min: _Num
    max: _Num
    n: int

    @classmethod
    def of(cls, values: Iterable[_Num | None]) -> "Stat[_Num] | None":
        vals = [v for v in values if v is not None]
        if not vals:
            return None
        return cls(statistics.median(vals), min(vals), max(vals), len(vals))

    def to_dict(self) -> JsonObject:
        conv = (lambda v: str(v)) if isinstance(self.median, Decimal) else (lambda v: v)
        return {"median": conv(self.median), "min": conv(self.min), "max": conv(self.max), "n": self.n}


@dataclass
class RunFacts:
    """What one run measured, as the summary and the diagnosis need it."""

    run_id: str
    status: str
    nodes: int
    gpus_per_node: int
    world_size: int | None
    wall_s: float | None
    phases: dict[str, float]
    train_s: float | None
    samples_per_s: float | None  # useful global rate (redundant unsharded copies not counted)
    reported_samples_per_s: float | None  # what the workload reported
    accuracy: float | None
    loss: float | None
    epochs: int | None
    cost_usd: Decimal | None
    train_samples: int | None  # the data set size from the start record
    samples_seen: dict[int, int]  # rank -> samples that rank trained on (final records)
    compute_s: float | None  # summed over epochs, rank 0
    comm_s: float | None
    data_s: float | None
    steps: int | None
    step_p90_s: list[float] | None  # per rank: median over epochs of each epoch's p90
    util: list[JsonObject]


def run_facts(record: RunRecord, backends: Mapping[str, Plugin]) -> RunFacts:
    """What one run of a sweep measured; `backends`: the plugins of the runs' clouds (its cost)."""
    run = record.run
    if run.id is None or run.status is None or run.nodes is None:  # only an estimate's imagined run
        raise ValueError("run_facts: not a run the ledger holds (no id, status or node count)")
    records = record.metric_records or []  # the nodes' JSON metric records
    metrics = run.metrics or {}
    start = next((m for m in records if m.get("kind") == "start"), {})
    epochs = _of_kind(records, "epoch")
    finals = _finals(records)
    phases = _phase_seconds(record)
    train_s = _first_known(metrics.get("train_time_s"), (finals.get(0) or {}).get("train_time_s"),
                           phases.get("train"))
    world = metrics.get("world_size") or start.get("world_size") or (len(finals) or None)
    n_epochs = metrics.get("epochs") or (epochs[-1].get("epoch") if epochs else None)
    seen = _samples_seen(finals)
    train_samples = start.get("train_samples")
    sums = _epoch_sums(epochs)
    return RunFacts(
        run_id=run.id, status=run.status, nodes=run.nodes, gpus_per_node=int(run.gpus_per_node or 0), world_size=world,
        wall_s=run.wall_s, phases=phases, train_s=train_s,
        samples_per_s=_useful_rate(metrics.get("samples_per_s"), train_samples, n_epochs, seen, train_s, world),
        reported_samples_per_s=metrics.get("samples_per_s"),
        accuracy=metrics.get("accuracy"), loss=metrics.get("loss"), epochs=n_epochs,
        cost_usd=run_cost_usd(record, backends), train_samples=int(train_samples) if train_samples else None,
        samples_seen=seen,
        compute_s=sums["compute_s"], comm_s=sums["comm_s"], data_s=sums["data_s"],
        steps=epochs[-1].get("step") if epochs else None, step_p90_s=_p90_per_rank(epochs),
        util=_of_kind(records, "util"),
    )


def _of_kind(records: list[JsonObject], kind: str) -> list[JsonObject]:
    return [m for m in records if m.get("kind") == kind]


def _phase_seconds(record: RunRecord) -> dict[str, float]:
    """The run's phases that ended, with their seconds."""
    return {p.name: p.seconds for p in record.phases if p.seconds is not None}


def _finals(records: list[JsonObject]) -> dict[int, JsonObject]:
    """The final record of each rank that wrote one, by rank."""
    return {m["rank"]: m for m in records if m.get("kind") == "final" and isinstance(m.get("rank"), int)}


def _samples_seen(finals: Mapping[int, JsonObject]) -> dict[int, int]:
    """Rank -> the samples that rank trained on, as its final record says."""
    return {r: int(f["samples_seen"]) for r, f in finals.items() if f.get("samples_seen") is not None}


def _epoch_sums(epochs: list[JsonObject]) -> dict[str, float | None]:
    """Compute, communication and data seconds summed over the epochs (None: no epoch said)."""
    return {k: (sum(e.get(k) or 0.0 for e in epochs) if any(k in e for e in epochs) else None)
            for k in ("compute_s", "comm_s", "data_s")}


_T = TypeVar("_T")


def _first_known(*values: _T | None) -> _T | None:
    return next((v for v in values if v is not None), None)


def _useful_rate(reported: float | None, train_samples: float | None, n_epochs: int | None, seen: dict[int, int],
                 train_s: float | None, world: int | None) -> float | None:
    """Samples of the data set trained per second: what the ranks saw, at most the data set once per
    epoch (a rank that repeats samples does not count twice); the reported rate when unknown."""
    if not (train_samples and n_epochs and seen and train_s):
        return reported
    total = sum(seen.values()) if len(seen) == (world or len(seen)) else max(seen.values()) * (world or 1)
    return min(total, int(train_samples) * int(n_epochs)) / train_s


def _p90_per_rank(epochs: list[JsonObject]) -> list[float] | None:
    """Per rank: the median over epochs of each epoch's p90 step time."""
    per_epoch = [e["step_p90_s"] for e in epochs if isinstance(e.get("step_p90_s"), list) and e["step_p90_s"]]
    if not per_epoch:
        return None
    width = max(len(x) for x in per_epoch)
    return [statistics.median([x[i] for x in per_epoch if i < len(x) and x[i] is not None]) for i in range(width)]


def run_cost_usd(record: RunRecord, backends: Mapping[str, Plugin]) -> Decimal | None:
    """The run's total cost: the ledger's, else priced now by gpucluster.costing.cost; $0 for machines
    gpucluster does not rent (backends that provision nothing: local, ssh); None when unknown.
    `backends`: the plugins of the runs' clouds, by name (given by the caller)."""
    backend = backends.get(record.run.cloud or "")
    cost = record.cost or {}
    if cost.get("total") is None:  # the cost engine's key (gpucluster.costing.cost.run_cost)
        from gpucluster.costing import cost as cost_mod

        try:
            cost = cost_mod.run_cost(record, backend=backend) or {}
        except (GpuclusterError, ValueError):  # no price known / not a full record: the cost is unknown
            cost = {}
    if cost.get("total") is not None:
        try:
            return Decimal(str(cost["total"]))
        except InvalidOperation:
            return None
    from gpucluster.costing.plan import is_free

    if is_free(backend):  # machines gpucluster does not rent: the cost engine's own rule
        return Decimal("0")
    return None


@dataclass
class SizeResult:
    nodes: int
    gpus_per_node: int
    world_size: int | None
    runs: list[str]
    failed: list[str]
    wall_s: Stat[float] | None
    phases: dict[str, Stat[float]]
    train_s: Stat[float] | None
    samples_per_s: Stat[float] | None
    accuracy: Stat[float] | None
    loss: Stat[float] | None
    epochs: int | None
    cost_usd: Stat[Decimal] | None
    cost_per_epoch_usd: Stat[Decimal] | None
    baseline_nodes: int | None = None
    efficiency: float | None = None
    efficiency_range: tuple[float, float] | None = None
    efficiency_basis: str | None = None  # "samples/s" or "time"
    speedup: float | None = None  # samples/s here / at the baseline (training time ratio without samples/s)
    facts: list[RunFacts] = field(default_factory=list, repr=False)

    @property
    def label(self) -> str:
        return f"{self.nodes} node(s) x {self.gpus_per_node} GPU" if self.gpus_per_node else f"{self.nodes} node(s), CPU"

    def to_dict(self) -> JsonObject:
        d: JsonObject = {}
        for f in dataclasses.fields(self):
            if f.name == "facts":
                continue
            v = getattr(self, f.name)
            if isinstance(v, Stat):
                v = v.to_dict()
            elif f.name == "phases":
                v = {k: s.to_dict() for k, s in v.items()}
            d[f.name] = v
        return d


def summarize(runs: Sequence[RunRecord], backends: Mapping[str, Plugin]) -> list[SizeResult]:
    """One SizeResult per (GPUs per node, nodes), sorted; runs are ledger records with metric_records.
    `backends`: the plugins of the runs' clouds, by name (for the costs the ledger does not hold)."""
    groups: dict[tuple[int, int], list[RunFacts]] = {}
    for run in runs:
        f = run_facts(run, backends)
        groups.setdefault((f.gpus_per_node, f.nodes), []).append(f)
    results = [_size_result(gpn, nodes, facts) for (gpn, nodes), facts in sorted(groups.items())]
    _add_efficiency(results)
    return results


def _size_result(gpn: int, nodes: int, facts: list[RunFacts]) -> SizeResult:
    """One size's figures over its succeeded runs (its failed ones are named)."""
    ok = [f for f in facts if f.status == RunStatus.SUCCEEDED]
    epochs = Stat.of(f.epochs for f in ok)
    return SizeResult(
        nodes=nodes, gpus_per_node=gpn, world_size=next((f.world_size for f in ok if f.world_size), None),
        runs=[f.run_id for f in facts], failed=[f.run_id for f in facts if f.status != RunStatus.SUCCEEDED],
        wall_s=Stat.of(f.wall_s for f in ok),
        phases=_phase_stats(ok),
        train_s=Stat.of(f.train_s for f in ok), samples_per_s=Stat.of(f.samples_per_s for f in ok),
        accuracy=Stat.of(f.accuracy for f in ok), loss=Stat.of(f.loss for f in ok),
        epochs=int(epochs.median) if epochs else None, cost_usd=Stat.of(f.cost_usd for f in ok),
        cost_per_epoch_usd=Stat.of(f.cost_usd / f.epochs for f in ok if f.cost_usd is not None and f.epochs),
        facts=facts,
    )


def _phase_stats(ok: list[RunFacts]) -> dict[str, Stat[float]]:
    """Each phase's seconds over the runs that went through it, in the phases' order."""
    phase_names = [p for p in PHASES if any(p in f.phases for f in ok)]
    return {p: st for p in phase_names if (st := Stat.of(f.phases.get(p) for f in ok))}


def _add_efficiency(results: list[SizeResult]) -> None:
    by_gpn: dict[int, list[SizeResult]] = {}
    for r in results:
        by_gpn.setdefault(r.gpus_per_node, []).append(r)
    for group in by_gpn.values():
        usable = [r for r in group if r.train_s or r.samples_per_s]
        if not usable:
            continue
        base = min(usable, key=lambda r: r.nodes)  # the 1-node run when there is one
        use_sps = all(r.samples_per_s for r in usable)
        for r in usable:
            r.baseline_nodes = base.nodes
            ratio = r.nodes / base.nodes
            s, bs = r.samples_per_s, base.samples_per_s
            if use_sps and s and bs:  # use_sps: every usable size (the base too) has samples/s
                r.speedup = s.median / bs.median
                b = bs.median
                r.efficiency = s.median / (ratio * b)
                r.efficiency_range = (s.min / (ratio * b), s.max / (ratio * b))
                r.efficiency_basis = "samples/s"
            elif r.train_s and base.train_s:
                r.speedup = base.train_s.median / r.train_s.median
                t, b = r.train_s, base.train_s.median
                r.efficiency = b / (ratio * t.median)
                r.efficiency_range = (b / (ratio * t.max), b / (ratio * t.min))
                r.efficiency_basis = "time"


@dataclass
class Comparison:
    """CPU baseline vs a GPU size at the same node count."""

    nodes: int
    gpus_per_node: int
    cpu_train_s: float
    gpu_train_s: float
    speedup: float  # GPU samples/s / CPU samples/s (training time ratio when samples/s is unknown)
    cpu_cost_usd: Decimal | None
    gpu_cost_usd: Decimal | None

    @property
    def verdict(self) -> str:
        """'12.3x faster on 1 GPU/node', or, where the GPU lost (a job too small to fill one: on an
        H200 the digits workload, batch 32, ran 0.88x the CPU's speed), how much slower and why."""
        if self.speedup >= 1:
            return f"{self.speedup:.1f}x faster on {self.gpus_per_node} GPU/node"
        return (f"{1 / self.speedup:.1f}x SLOWER on {self.gpus_per_node} GPU/node: each step is too small to keep "
                "a GPU busy (kernel launches and copies cost more than the arithmetic); a larger batch or model "
                "would use it")

    def to_dict(self) -> JsonObject:
        d = dataclasses.asdict(self)
        for k in ("cpu_cost_usd", "gpu_cost_usd"):
            d[k] = None if d[k] is None else str(d[k])
        return d


def compare_cpu_gpu(results: Sequence[SizeResult]) -> list[Comparison]:
    cpu = {r.nodes: r for r in results if r.gpus_per_node == 0 and r.train_s}
    out = []
    for r in results:
        base = cpu.get(r.nodes)
        if r.gpus_per_node and base and base.train_s and r.train_s:  # base.train_s: every cpu size has one
            if r.samples_per_s and base.samples_per_s:
                speedup = r.samples_per_s.median / base.samples_per_s.median
            else:
                speedup = base.train_s.median / r.train_s.median
            out.append(Comparison(
                r.nodes, r.gpus_per_node, base.train_s.median, r.train_s.median, speedup,
                base.cost_usd.median if base.cost_usd else None, r.cost_usd.median if r.cost_usd else None))
    return out
