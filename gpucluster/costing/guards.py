"""Money guards (docs/cost.md, "Money guards"): a run that stops itself at a dollar cap
(`--max-cost`), and a job that has stalled (`--stall-minutes`).

Decided before anything exists (`plan_guards`, from the plan's estimate):
- a cap is allowed only where gpucluster prices the run (aws, gcp); refused (exit 2) when the
  estimate for the job's `--max-minutes` already exceeds it, or when it is below the cluster's
  first minute (the least EC2 and GCE bill a machine);
- without `--max-minutes`, the nodes' own lifetime (the aws dead-man switch, the GKE Job's
  deadline) is shortened to what the cap buys at the plan's hourly price, when that is shorter,
  so the cap holds even when the machine running gpucluster is gone.

While the job runs (`Guard`, polled by the node supervisor's loop):
- cost: the accrued cost (the ledger's resource lifetimes priced as the report prices them, plus
  the earlier attempts of a recovery chain, `JobSpec.cost_before`) is read every COST_EVERY_S;
  at WARN_AT of the cap one warning line; at the cap the job is stopped as on a spot notice
  (SIGTERM, then the notice's grace to save a checkpoint), its outputs copied, the cluster torn
  down; the run's status is "stopped", exit code 4 (`ExitCode.COST_CAP`);
- stall: a job none of whose nodes has printed a line, reported a metric, or kept its GPUs (or,
  without GPUs, its CPUs) busy for the stall time is stopped the same way; status "failed".
  "Busy": a utilisation record of the node's sampler with a GPU at GPU_BUSY_PCT % or more, or
  (no GPU) the node's processes using CPU_BUSY_CORES cores or more (CPU_BUSY_PCT % of the
  machine where the sampler measures the whole machine). The clock starts when the job's first
  worker starts (the train phase), not during staging, --setup or torchrun's rendezvous (which has
  its own timeout).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from gpucluster.errors import UsageError, not_allowed
from gpucluster.states import JsonMapping, JsonObject

if TYPE_CHECKING:
    from gpucluster.infra.contract import Plugin
    from gpucluster.ledger.store import Ledger

WARN_AT = 0.8  # the share of the cap at which one warning line is said
COST_EVERY_S = 10.0  # how often the accrued cost is read from the ledger while the job runs
DEFAULT_STALL_MINUTES = 30  # cloud backends (gpucluster creates the machines); local/ssh: off unless given
GPU_BUSY_PCT = 5.0
CPU_BUSY_CORES = 0.1
CPU_BUSY_PCT = 5.0
MAX_COST = 1_000_000.0
COST_KIND, STALL_KIND = "cost", "stall"
WARNING_KIND = "cost_warning"  # the metric record of the warning at WARN_AT


def parse_cost(value: object, flag: str = "--max-cost") -> float:
    """A cap in US dollars: a number > 0 (a leading '$' is taken); UsageError naming the value."""
    text = str(value).strip().lstrip("$").strip() if value is not None else ""
    try:
        number = float(text)
    except ValueError:
        number = float("nan")
    if not (0 < number <= MAX_COST) or not math.isfinite(number):
        raise UsageError(not_allowed(flag, value, f"an amount in US dollars > 0 and at most {MAX_COST:,.0f}, "
                                                  "e.g. 25 or 7.50"))
    return number


def parse_stall(value: object, flag: str = "--stall-minutes") -> float:
    """Minutes without a sign of life before the job is stopped: 0 (off) or a number > 0."""
    try:
        number = float(str(value).strip())
    except ValueError:
        number = float("nan")
    if not (0 <= number <= 7 * 24 * 60) or not math.isfinite(number):
        raise UsageError(not_allowed(flag, value, "a number of minutes >= 0 (0: off), e.g. 30"))
    return number


def money(value: float | Decimal) -> str:
    """$ with cents (and more digits under a cent, so a small accrued cost is not shown as $0.00)."""
    v = float(value)
    return f"${v:,.2f}" if v >= 1 or v == 0 else f"${v:.4f}"


def cap_reason(cap: float, accrued: float) -> str:
    return f"cost cap {money(cap)} reached (accrued {money(accrued)})"


@dataclass
class GuardPlan:
    """What the plan says of the guards, and what the job and the spec get."""

    max_cost: float | None = None
    stall_s: float | None = None
    lifetime: int | None = None  # the nodes' lifetime (minutes) shortened to what the cap buys, when it is
    lines: tuple[str, ...] = ()


def plan_guards(*, max_cost: float | None, stall_minutes: float | None, hourly: Decimal | None,
                estimate_total: Decimal | None, max_minutes: float | None, lifetime: int | None,
                cloud: str, priced: bool, provisions: bool, job: bool) -> GuardPlan:
    """The guards of a run (`job`) or a kept cluster: checked against the plan's estimate; a
    UsageError (exit 2, nothing created) for a cap that cannot hold."""
    out = GuardPlan()
    lines: list[str] = []
    if max_cost is not None:
        if not priced or hourly is None:
            raise UsageError(f"--max-cost is not allowed with --cloud {cloud}: gpucluster does not price its "
                             "machines; allowed with the clouds it rents (aws, gcp)")
        least_cost = float(hourly) / 60  # EC2 and GCE bill at least one minute of a machine
        if max_cost < least_cost:
            raise UsageError(f"--max-cost {max_cost:g} is not allowed: at {money(hourly)}/h the cluster's first "
                             f"minute (the least the cloud bills) costs {money(least_cost)}; allowed: "
                             f"{money(least_cost)} or more")
        if job and max_minutes is not None and estimate_total is not None and float(estimate_total) > max_cost:
            buys = max_cost / float(hourly) * 60
            raise UsageError(f"--max-cost {max_cost:g} is not allowed with --max-minutes {max_minutes:g}: the "
                             f"estimate for that limit is {money(estimate_total)} ({money(hourly)}/h); allowed: "
                             f"--max-cost {money(estimate_total)} or more, or --max-minutes {math.floor(buys)} or "
                             "less")
        out.max_cost = max_cost
        buys_min = int(max_cost / float(hourly) * 60)
        lines.append(f"cost cap {money(max_cost)} (--max-cost): a warning at {WARN_AT:.0%}, stopped at the cap "
                     f"(about {buys_min} min at {money(hourly)}/h), checkpoint grace, outputs home, teardown")
        if lifetime is not None and buys_min < lifetime:
            out.lifetime = max(buys_min, 5)
            lines.append(f"the nodes power themselves off {out.lifetime} min after boot: what the cap buys, "
                         f"shorter than their lifetime of {lifetime} min (holds if this machine is gone)")
    if stall_minutes is None and job and provisions:
        stall_minutes = DEFAULT_STALL_MINUTES
        shown = f"default for --cloud {cloud}; --stall-minutes 0 turns it off"
    else:
        shown = "--stall-minutes"
    if stall_minutes and job:
        out.stall_s = float(stall_minutes) * 60
        lines.append(f"stalled after {stall_minutes:g} min ({shown}): stopped when no node prints a line, reports a "
                     "metric or keeps its GPUs (CPUs) busy for that long")
    out.lines = tuple(lines)
    return out


def chain_cost(ledger: Ledger, run_ids: list[str]) -> float:
    """What earlier attempts of a chain cost (their stored cost; 0 for one without)."""
    total = 0.0
    for rid in run_ids:
        run = ledger.get_run(rid)
        cost = (run.run.cost if run is not None else None) or {}
        try:
            total += float(cost.get("total") or 0)
        except (TypeError, ValueError):
            pass
    return total


@dataclass
class Stop:
    kind: str  # COST_KIND or STALL_KIND
    reason: str


class Guard:
    """The running job's money guards, polled by the node supervisor (`poll`, its own thread).
    `accrued()`: the run's accrued cost so far (None where it cannot be read); the job's
    `cost_before` (earlier attempts) is added. `clock`: monotonic seconds (scaled in tests)."""

    def __init__(self, *, max_cost: float | None, stall_s: float | None, cost_before: float = 0.0,
                 accrued: Callable[[], float | None] | None = None, say: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, every: float = COST_EVERY_S,
                 record: Callable[[JsonObject], None] | None = None):
        self.max_cost, self.stall_s, self.cost_before = max_cost, stall_s, cost_before
        self.record = record  # the warning as a metric record (the ledger; a live webhook, notify.LiveEvents)
        self.accrued, self.say, self.clock, self.every = accrued, say or (lambda _t: None), clock, every
        self._lock = threading.Lock()
        self._seen: dict[int, float] = {}  # node -> when it last showed a sign of life
        self._busy: dict[int, str] = {}  # node -> its last utilisation, in words
        self._started: float | None = None
        self._next_cost = 0.0
        self._warned = False
        self.last_accrued: float | None = None

    @property
    def active(self) -> bool:
        return bool(self.max_cost) or bool(self.stall_s)

    def start(self) -> None:
        """The job's first worker started: the stall clock runs from here."""
        with self._lock:
            if self._started is None:
                self._started = self.clock()

    def alive(self, node: int) -> None:
        """A line or a metric from `node` (called from the log threads)."""
        now = self.clock()
        with self._lock:
            self._seen[node] = now

    def utilisation(self, node: int, record: JsonMapping) -> None:
        """A sampler's record: a sign of life when the node's GPUs (else CPUs) are busy."""
        gpus = [float(g["util"]) for g in record.get("gpu") or [] if isinstance(g, Mapping)
                and isinstance(g.get("util"), (int, float))]
        if gpus:
            busy, said = max(gpus) >= GPU_BUSY_PCT, f"GPU {max(gpus):g} %"
        elif isinstance(record.get("cpu_cores"), (int, float)):
            busy, said = record["cpu_cores"] >= CPU_BUSY_CORES, f"CPU {record['cpu_cores']:.2f} cores"
        elif isinstance(record.get("cpu_percent"), (int, float)):
            busy, said = record["cpu_percent"] >= CPU_BUSY_PCT, f"CPU {record['cpu_percent']:g} % of the machine"
        else:
            return
        with self._lock:
            self._busy[node] = said
        if busy:
            self.alive(node)

    def poll(self) -> Stop | None:
        """A reason to stop the job now, or None; says the cost warning once."""
        now = self.clock()
        if self.stall_s and self._started is not None:
            with self._lock:
                last = max([self._started, *self._seen.values()])
                busy = dict(self._busy)
            if now - last >= self.stall_s:
                minutes = self.stall_s / 60
                each = "; ".join(f"node {n}: last utilisation {busy[n]}" for n in sorted(busy))
                return Stop(STALL_KIND, f"stalled for {minutes:g} min: no node printed a line, reported a metric or "
                                        f"kept its GPUs/CPUs busy" + (f" ({each})" if each else ""))
        if self.max_cost and self.accrued is not None and now >= self._next_cost:
            self._next_cost = now + self.every
            got = self.accrued()
            if got is not None:
                total = got + self.cost_before
                self.last_accrued = total
                if total >= self.max_cost:
                    return Stop(COST_KIND, cap_reason(self.max_cost, total))
                if total >= WARN_AT * self.max_cost and not self._warned:
                    self._warned = True
                    self.say(f"warning: the run has cost {money(total)}, {total / self.max_cost:.0%} of its cap "
                             f"{money(self.max_cost)} (--max-cost): it is stopped at the cap")
                    if self.record is not None:
                        self.record({"kind": WARNING_KIND, "accrued": round(total, 4), "cap": self.max_cost})
        return None


def wall() -> float:
    """The time the accrued cost is computed at (time.time; a test scales it)."""
    return time.time()


def accrued_of(ledger: Ledger, run_id: str, backend: Plugin | None) -> Callable[[], float | None]:
    """The run's accrued cost so far, read from its ledger record and priced as the report prices
    it (`cost.run_cost`); None when it cannot be read or priced."""
    def accrued() -> float | None:
        from gpucluster.costing.runcost import run_cost
        from gpucluster.errors import GpuclusterError

        try:
            record = ledger.get_run(run_id)
            return None if record is None else float(run_cost(record, backend=backend, now=wall())["total"])
        except (GpuclusterError, ValueError, TypeError, KeyError):
            return None

    return accrued


def store_cost(ledger: Ledger, run_id: str, backend: Plugin | None) -> None:
    """The run's cost computed and stored with it (`runs.cost`); a price that cannot be found is
    left out quietly (the report says so when asked)."""
    from gpucluster.costing.runcost import run_cost
    from gpucluster.errors import GpuclusterError

    run = ledger.get_run(run_id)
    if run is not None:
        try:
            ledger.set_cost(run_id, run_cost(run, backend=backend))
        except GpuclusterError:
            pass


class CappedJob(Protocol):
    """What the provisioning watch reads of the job (`watch.launch.JobSpec`, above this package)."""

    @property
    def max_cost(self) -> float | None: ...

    @property
    def cost_before(self) -> float: ...


class AccruesCost(Protocol):
    """Where the watch reads the cost accrued so far (the run's recorder)."""

    def accrued_cost(self) -> float | None: ...


class ProvisionWatch:
    """`--max-cost` while the cluster is being created (no node supervisor yet): a thread reads the
    accrued cost (earlier attempts included) and, at the cap, interrupts the main thread as Ctrl-C
    does, so the same teardown runs; `reason` then says why. Only where the run is driven from the
    main thread (the CLI); elsewhere the cap is checked once the job starts."""

    def __init__(self, job: CappedJob | None, events: AccruesCost, every: float | None = None):
        self.cap = job.max_cost if job is not None else None
        self.before = float(job.cost_before or 0.0) if job is not None else 0.0
        self.events, self.every = events, every
        self.reason: str | None = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "ProvisionWatch":
        if self.cap and threading.current_thread() is threading.main_thread():
            self._thread = threading.Thread(target=self._watch, name="cost-cap-provision", daemon=True)
            self._thread.start()
        return self

    def _watch(self) -> None:
        import _thread

        every = COST_EVERY_S if self.every is None else self.every
        while not self._done.wait(every):
            got = self.events.accrued_cost()
            if got is not None and self.cap and got + self.before >= self.cap:
                self.reason = cap_reason(self.cap, got + self.before) + " while the cluster was being created"
                _thread.interrupt_main()
                return

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def apply_guards(plan: Any, req: Any, backend: Any) -> bool:
    """`prepare`'s step: --max-cost and --stall-minutes checked against the plan's estimate, the
    job given its guards, the plan's lines; True when the nodes' lifetime was shortened to what the
    cap buys (the caller prices the plan again)."""
    from dataclasses import replace

    from gpucluster.infra.contract import Capability

    est, provisions = plan.estimate, backend.can(Capability.PROVISIONS)
    out = plan_guards(max_cost=req.max_cost, stall_minutes=req.stall_minutes, hourly=plan.hourly,
                      estimate_total=None if est is None else est.total, max_minutes=req.max_minutes if req.job else None,
                      lifetime=plan.spec.max_lifetime_minutes if provisions else None,
                      cloud=req.cloud, priced=backend.can(Capability.PRICED), provisions=provisions, job=req.job)
    if plan.job is not None:
        plan.job = replace(plan.job, max_cost=out.max_cost, stall_s=out.stall_s)
    plan.bounds = [*plan.bounds, *out.lines]
    if out.lifetime is not None and (req.max_minutes is None or not req.job):
        plan.spec = plan.spec.replace(max_lifetime_minutes=out.lifetime)
        # the lifetime's own line and warning named the longer lifetime: the cap's line says it now
        plan.bounds = [b for b in plan.bounds if not b.startswith("nodes power themselves off")]
        plan.notes = [n if "the nodes power off" not in n else
                      f"no --max-minutes: the nodes power off {out.lifetime} min after their first boot (what "
                      "--max-cost buys) whatever the job is doing; give the job a --max-minutes to stop it, with "
                      "its outputs, before then" for n in plan.notes]
        return True
    return False


CAP_KIND = "cost_cap"  # a kept cluster's --max-cost, recorded with the run that created it


def kept_cap(ledger: Ledger, origin_id: str) -> float | None:
    """The --max-cost a kept cluster was created with (`up --max-cost`), or None."""
    for rec in ledger.metrics(origin_id, kind=CAP_KIND):
        if isinstance(rec.get("max_cost"), (int, float)):
            return float(rec["max_cost"])
    return None


def exec_guard(ledger: Ledger, kept_name: str, origin_id: str, backend: Any, job: Any) -> Any:
    """`exec` on a kept cluster with a cap: refused when the cluster has reached it (a GpuclusterError,
    exit 4; nothing started), else the job watched against it (the cluster's own cost)."""
    from dataclasses import replace

    from gpucluster.errors import CostCapReached

    cap = kept_cap(ledger, origin_id)
    if cap is None:
        return job
    spent = accrued_of(ledger, origin_id, backend)()
    if spent is not None and spent >= cap:
        raise CostCapReached(f"cluster {kept_name!r} has reached its cost cap: {cap_reason(cap, spent)}; no job "
                             f"started", hint=f"remove it with: gpucluster down {kept_name}")
    return replace(job, max_cost=min(cap, job.max_cost or cap), cost_of=origin_id)
