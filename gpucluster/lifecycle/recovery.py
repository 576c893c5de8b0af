"""Automatic recovery: a run whose node is lost is provisioned again and resumed from its last
checkpoint, up to N times (docs/recovery.md).

The loop lives here, beside `lifecycle.execute`, and calls it once per attempt: each attempt is a
whole run (its own ledger row, provision, check, train, outputs, teardown and verdict), linked to
the one before by `resumed_from`, so a chain is the existing resume chain. Nothing here knows a
cloud: an attempt was interrupted when its ledger holds a `node_lost` record (what every launcher
reports, gpucluster/watch/nodeloss.py) or when it failed while provisioning with an error the backend
calls a capacity error (`ProvisionError.cause`, kept as the outcome's `cause`).

The next attempt resumes from the newest attempt of the chain whose outputs came back with
something to resume from (the `--resume` machinery: gpucluster/plan/resume.py), or, when none has,
from what the first attempt resumed from (or from nothing). The loop stops, and says why, when an
attempt succeeded, was stopped by the user, failed on its own (the job's error), left a teardown
that is not verified (nothing is provisioned on top of what may still bill), failed its health
check on machines that would come back the same (`Policy.replace_bad_nodes` False), or when no
attempts are left.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

from gpucluster.errors import ExitCode, GpuclusterError, UsageError, not_allowed
from gpucluster.watch.launch import JobSpec
from gpucluster.watch.nodeloss import LOST_KIND
from gpucluster.states import PhaseStatus, RunStatus, TeardownVerdict

if TYPE_CHECKING:
    from gpucluster.ledger.records import JsonObject
    from gpucluster.domain import Provider
    from gpucluster.watch.staging import DataMount
    from gpucluster.infra.contract import Plugin
    from gpucluster.watch.launch import Launcher
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.steps import RunOutcome, RunUI
    from gpucluster.lifecycle.prepare import Prepared, Request
    from gpucluster.spec import ClusterSpec
    from gpucluster.ownership import Ownership

ATTEMPT_KIND = "attempt"
DEFAULT_SPOT_RECOVERIES = 3
DEFAULT_FALLBACK_AFTER = 2
FALLBACKS = ("on-demand",)


@dataclass(frozen=True)
class Policy:
    """`retries`: attempts after the first (--recover N); `fallback_after`: with --fallback
    on-demand, after this many spot attempts ended by an interruption or no capacity, the rest run
    on on-demand capacity (None: never); `replace_bad_nodes`: provisioning again makes new machines
    (a failed health check is worth another attempt)."""

    retries: int = 0
    fallback_after: int | None = None
    replace_bad_nodes: bool = False


@dataclass
class Attempt:
    run_id: str
    outcome: "RunOutcome"
    spot: bool
    interruption: str | None = None  # why it counts as interrupted (the lost node, no capacity)
    cause: str | None = None  # nodeloss.CAUSES, or "capacity"
    detected_at: float | None = None
    ended_at: float = 0.0


@dataclass
class ChainOutcome:
    attempts: list[Attempt] = field(default_factory=list)
    stopped: str | None = None  # why the loop stopped while the last attempt had not succeeded

    @property
    def final(self) -> "RunOutcome":
        return self.attempts[-1].outcome

    @property
    def exit_code(self) -> ExitCode:
        """The last attempt's, unless an earlier one may have left something billing (exit 3)."""
        if any(a.outcome.exit_code == ExitCode.LEFTOVERS for a in self.attempts):
            return ExitCode.LEFTOVERS
        return self.final.exit_code


def policy(req: Request, backend: Plugin, spec: ClusterSpec) -> Policy:
    """The run's recovery policy from its flags (`prepare.Request`), checked (UsageError, exit 2):
    --recover N (default: 3 with --spot, else 0), --fallback on-demand (only with --spot) after
    --fallback-after K spot attempts (default 2)."""
    from gpucluster.infra.contract import Capability

    if req.fallback is not None and req.fallback not in FALLBACKS:
        raise UsageError(not_allowed("--fallback", req.fallback, FALLBACKS))
    if req.fallback is not None and not spec.spot:
        raise UsageError("--fallback on-demand is for --spot runs: it is where an interrupted spot run goes next")
    if req.fallback_after is not None and req.fallback is None:
        raise UsageError("--fallback-after needs --fallback on-demand")
    retries = req.recover if req.recover is not None else (DEFAULT_SPOT_RECOVERIES if spec.spot else 0)
    if req.fallback is not None and not retries:
        raise UsageError("--fallback on-demand needs --recover N (N > 0): a fallback is a later attempt")
    return Policy(retries=int(retries),
                  fallback_after=(req.fallback_after or DEFAULT_FALLBACK_AFTER) if req.fallback else None,
                  replace_bad_nodes=backend.can(Capability.PROVISIONS))


def checkpoint_args(every: int | None, command: tuple[str, ...]) -> list[str]:
    """--checkpoint-every STEPS as the built-in workloads' own argument."""
    if every is None:
        return []
    if command:
        raise UsageError("--checkpoint-every is for built-in workloads (--workload); a script after -- saves when "
                         "it chooses (to $GPUCLUSTER_OUTPUT_DIR, read back from $GPUCLUSTER_RESUME_DIR)")
    return ["--checkpoint-every", str(int(every))]


def interruption_of(ledger: Ledger, outcome: "RunOutcome") -> tuple[str | None, str | None, float | None]:
    """(reason, cause, when detected) when the attempt was interrupted by a lost node or by no
    capacity; (None, None, None) for every other ending."""
    if outcome.status != RunStatus.FAILED:
        return None, None, None
    lost = sorted(ledger.metrics(outcome.run_id, kind=LOST_KIND), key=lambda r: r.get("detected_at") or 0)
    if lost:
        first = lost[0]
        who = f"node {first.get('node_rank')} ({first.get('host')})"
        return f"{who} lost: {first.get('reason')}", str(first.get("cause") or "unreachable"), first.get("detected_at")
    record = ledger.get_run(outcome.run_id)
    provision = record.phase("provision") if record is not None else None
    text = outcome.failure or ""
    if provision is not None and provision.status == PhaseStatus.FAILED and outcome.cause == "capacity":
        return f"no capacity: {text[:300]}", "capacity", provision.ended_at
    return None, None, None


def resume_point(ledger: Ledger, chain: list[str], store: Plugin,
                 workload: str | None) -> tuple[str, DataMount, tuple[str, str] | None] | None:
    """(run id, mount, working-folder files) of the newest run of the chain that can be resumed:
    its outputs came back, and, for a built-in workload, hold a checkpoint."""
    from gpucluster.plan.resume import resume_files, resume_source

    for rid in reversed(chain):
        try:
            rid, mount = resume_source(ledger, rid, store)
        except GpuclusterError:
            continue
        if workload and "://" not in mount.src and not _has_checkpoint(mount.src):
            continue
        return rid, mount, resume_files(ledger, rid, mount)
    return None


def _has_checkpoint(folder: str) -> bool:
    try:
        nodes = [d for d in os.listdir(folder) if d.startswith("node-")]
    except OSError:
        return False
    return any(os.path.isfile(os.path.join(folder, d, "checkpoint.pt")) for d in nodes) or \
        os.path.isfile(os.path.join(folder, "checkpoint.pt"))


def finish_teardown(spec: ClusterSpec, ledger: Ledger, provider: Provider, store: Plugin, outcome: RunOutcome,
                    ui: RunUI) -> str | None:
    """Before another attempt, what the interrupted one may have left is dealt with now that its
    node may be back: its rows not confirmed gone (a run folder on a node that was unreachable
    when it was removed) are taken down as `gpucluster down` does (gpucluster/lifecycle/teardown.py), and a
    teardown check that could not run is run again (the provider's own, by the run's id). None
    when nothing is left (the attempt's row then says verified); else the verdict."""
    from gpucluster.domain import Check

    rid = outcome.run_id
    if any(r.get("run_id") == rid for r in ledger.open_resources(spec.name)):
        if store is None:
            return TeardownVerdict.NOT_VERIFIED
        from gpucluster.lifecycle.teardown import take_down

        from gpucluster.domain import UNWITNESSED

        from gpucluster.infra.contract import Capability

        ui.message(f"finishing the teardown of {rid} before the next attempt")
        lost = {r.get("node_rank") for r in ledger.metrics(rid, kind="node_lost")}

        def of_lost_node(line: str) -> bool:  # a lost node's reaper could not report the node's end
            return any(line.startswith(f"{UNWITNESSED}node {n} (") for n in lost)

        # Where gpucluster made the machine, the lost node's instance is destroyed and checked gone by
        # tag, so nothing of the run can outlive it: its missing witness is answered. A machine that
        # exists (ssh, local) may only have been cut off and still hold a process the job detached:
        # nothing can check that, so the attempt's verdict stays "not verified", naming the node.
        created = store.can(Capability.PROVISIONS)
        def run_provider(cloud: str, *, ownership: Ownership | None = None, project: str | None = None) -> Provider:
            return provider  # the attempt's own, which made the cluster (and holds where it is)

        downed = take_down(spec.name, spec.cloud, ledger=ledger, provider_for=run_provider, backend=store,
                           say=ui.message, ack_unwitnessed=of_lost_node if created else False)
        if downed.exit_code != ExitCode.OK:
            check = downed.check
            if created or check is None or check.leftovers or not all(of_lost_node(u) for u in check.unchecked):
                return str(downed.verdict.get("verdict") or TeardownVerdict.NOT_VERIFIED)
            ui.message(f"the teardown of {rid} stays not verified: {'; '.join(check.unchecked)}; check that node "
                       f"by hand, then `gpucluster down {spec.name} --ack-unwitnessed`; going on with the next attempt")
            return None
    if outcome.teardown in (TeardownVerdict.VERIFIED, TeardownVerdict.KEPT, None):
        return None
    try:
        check = Check.of(provider.leftovers(spec.name, rid))
    except Exception as exc:  # noqa: BLE001 - a check that cannot run leaves the verdict open, never crashes
        return f"not verified ({type(exc).__name__}: {exc})"
    if not check.verified:
        return check.verdict
    ledger.set_teardown(rid, TeardownVerdict.VERIFIED, [])
    outcome.teardown, outcome.leftovers, outcome.unchecked = TeardownVerdict.VERIFIED, [], []
    if outcome.exit_code == ExitCode.LEFTOVERS and not outcome.record_error:
        outcome.exit_code = ExitCode.FAILURE
    return None


def run_chain(spec: ClusterSpec, job: JobSpec, *, policy: Policy, ledger: Ledger, provider: Provider,
              launcher: Launcher,
              ui: "RunUI | None" = None, keep: bool = False, prices: JsonObject | None = None,
              workload: str | None = None, resumed_from: str | None = None, backend: Plugin,
              reprice: Callable[[ClusterSpec], JsonObject | None] | None = None,
              new_run_id: Callable[[], str] | None = None) -> ChainOutcome:
    """Run `job` on `spec`, and again (resumed) after each interruption, up to `policy.retries`
    more times. `backend`: the plugin of `spec.cloud` (each attempt's cost, the teardown of what an
    attempt left, resuming from object storage); `reprice(spec)`: the price snapshot of a changed
    spec (the on-demand fallback)."""
    store = backend
    from gpucluster.lifecycle.steps import QuietUI, execute
    from gpucluster.spec import new_run_id as default_id

    ui = ui or QuietUI()
    new_run_id = new_run_id or default_id
    chain = ChainOutcome()
    ids: list[str] = []
    first_resume = (job.resume, job.resume_files, resumed_from)
    spot_lost = 0
    after: str | None = None
    source: str | None = resumed_from
    while True:
        n = len(chain.attempts) + 1
        outcome = execute(spec, job, ledger=ledger, provider=provider, launcher=launcher, backend=backend, ui=ui,
                          keep=keep, prices=prices, workload=workload, resumed_from=resumed_from)
        ids.append(outcome.run_id)
        attempt = _recorded_attempt(ledger, outcome, policy, spec, chain, ids, after, source)
        if attempt is None or attempt.interruption is None:
            break
        reason, cause = attempt.interruption, attempt.cause
        if n > policy.retries:
            chain.stopped = (f"{reason}; no recovery left (--recover {policy.retries})" if policy.retries
                             else None)
            break
        chain.stopped = _not_recovering(spec, ledger, provider, store, outcome, ui, policy, reason, cause)
        if chain.stopped:
            break
        if spec.spot and cause in ("interruption", "capacity", "unreachable"):
            spot_lost += 1
            if policy.fallback_after is not None and spot_lost >= policy.fallback_after:
                spec, prices = _on_demand(spec, prices, reprice, ui, spot_lost)
        rid = new_run_id()
        job, source = _resumed_job(job, rid, ledger, ids, store, first_resume)
        capped = _chain_capped(job, ledger, ids, reason)
        if isinstance(capped, str):
            chain.stopped = capped
            break
        job = capped
        if job.output_dir and "://" not in job.output_dir:
            job = replace(job, output_dir=None)  # --output DIR holds the first attempt's; later ones: their run folders
        # a port of its own for each attempt: on the same ssh hosts the last attempt's store may still
        # hold its port while the new head binds (+1 is the health check's, so +2)
        job = replace(job, rdzv_port=fresh_port(job.rdzv_port))
        spec = spec.replace(run_id=rid)
        resumed_from, after = outcome.run_id, reason
        # told as it happens (a live webhook: notify.LiveEvents), not only at the chain's end
        ui.metric(None, {"kind": ATTEMPT_KIND, "run_id": outcome.run_id, "recovering": True, "interruption": reason,
                         "next": rid})
        ui.message(f"{reason}: recovering, attempt {n + 1} of {policy.retries + 1}"
                   + (f", resuming from the checkpoint of {source}" if source else ", from the start (no checkpoint)"))
    return chain


def _recorded_attempt(ledger: Ledger, outcome: RunOutcome, policy: Policy, spec: ClusterSpec, chain: ChainOutcome,
                      ids: list[str], after: str | None, source: str | None) -> Attempt | None:
    """The attempt that ended (its interruption, when the ledger says it was one), added to the
    chain and recorded with its run; None when it could not be recorded (the chain stops, saying
    why when the attempt was interrupted)."""
    try:
        reason, cause, detected = interruption_of(ledger, outcome)
    except GpuclusterError:  # the ledger cannot be read: nothing says the attempt was interrupted
        reason, cause, detected = None, None, None
    attempt = Attempt(outcome.run_id, outcome, bool(spec.spot), reason, cause, detected, time.time())
    chain.attempts.append(attempt)
    try:
        ledger.add_metrics(outcome.run_id, [(None, {
            "kind": ATTEMPT_KIND, "attempt": len(chain.attempts), "chain": ids[0], "after": after,
            "resume_from": source, "spot": bool(spec.spot), "interruption": reason, "cause": cause,
            "detected_at": detected, "ended_at": round(attempt.ended_at, 3)})])
    except GpuclusterError as exc:  # the chain cannot be recorded: no attempt is made that the ledger cannot tell
        chain.stopped = f"not recovering: the attempt could not be recorded ({exc.message})" if reason else None
        return None
    return attempt


def _not_recovering(spec: ClusterSpec, ledger: Ledger, provider: Provider, store: Plugin, outcome: RunOutcome,
                    ui: RunUI, policy: Policy, reason: str, cause: str | None) -> str | None:
    """Why an interrupted attempt is not followed by another (its teardown not verified, bad
    machines that would come back the same), or None."""
    left = finish_teardown(spec, ledger, provider, store, outcome, ui)
    if left:
        return (f"{reason}; not recovering: the attempt's teardown is {left} (finish it with "
                f"`gpucluster down {spec.name}`, then resume with --resume {outcome.run_id})")
    if cause == "health" and not policy.replace_bad_nodes:
        return f"{reason}; not recovering: these machines would come back the same"
    return None


def _on_demand(spec: ClusterSpec, prices: JsonObject | None, reprice: Callable[[ClusterSpec], JsonObject | None] | None,
               ui: RunUI, spot_lost: int) -> tuple[ClusterSpec, JsonObject | None]:
    """After `--recover-fallback` spot attempts lost: the next attempts on on-demand capacity (repriced)."""
    spec = spec.replace(spot=False)
    prices = reprice(spec) if reprice is not None else prices
    ui.message(f"{spot_lost} spot attempt(s) lost: the next attempts run on on-demand capacity")
    return spec, prices


def _resumed_job(job: JobSpec, rid: str, ledger: Ledger, ids: list[str], store: Plugin,
                 first_resume: tuple[DataMount | None, tuple[str, str] | None, str | None]) -> tuple[JobSpec, str | None]:
    """The next attempt's job, resumed from the chain's newest checkpoint (else from what the first
    attempt resumed from), and the run it resumes from."""
    point = resume_point(ledger, ids, store, job.workload)
    if point is not None:
        source, mount, files = point
        return replace(job, run_id=rid, resume=mount, resume_files=files), source
    first_mount, first_files, first_source = first_resume
    return replace(job, run_id=rid, resume=first_mount, resume_files=first_files), first_source


def _chain_capped(job: JobSpec, ledger: Ledger, ids: list[str], reason: str) -> JobSpec | str:
    """--max-cost is the chain's: what its attempts cost counts (guards.py). The next attempt's job
    with what they cost, or why the chain stops at its cap."""
    if not job.max_cost:
        return job
    from gpucluster.costing.guards import cap_reason, chain_cost

    spent = chain_cost(ledger, ids)
    if spent >= job.max_cost:
        return f"{reason}; not recovering: {cap_reason(job.max_cost, spent)}"
    return replace(job, cost_before=spent)


def fresh_port(port: int) -> int:
    """The next attempt's rendezvous port: 2 past the last (the health check uses port + 1),
    wrapping within the unprivileged range."""
    return port + 2 if port + 2 <= 65000 else 29400

def run_plan(plan: Prepared, *, ledger: Ledger, ui: RunUI | None, backend: Plugin, keep: bool = False,
             reprice: Callable[[ClusterSpec], JsonObject | None] | None = None) -> ChainOutcome:
    """`gpucluster run`'s job on its prepared plan (`gpucluster.lifecycle.prepare.Prepared`): a chain of attempts
    when the plan's policy replaces lost nodes (docs/recovery.md), else one `execute` (an outcome of
    one attempt, so the caller reads `final`, `exit_code` and `stopped` the same way either way).
    `keep`: leave the cluster up (a cloud gpucluster creates; processes are never kept)."""
    from gpucluster.infra.contract import Capability
    from gpucluster.lifecycle.steps import execute

    job = plan.needs_job()
    if plan.policy is not None and plan.policy.retries:
        return run_chain(plan.spec, job, policy=plan.policy, ledger=ledger, provider=plan.provider,
                         launcher=plan.needs_launcher(), ui=ui, prices=plan.prices, workload=plan.workload,
                         resumed_from=plan.resumed_from, backend=backend, reprice=reprice)
    outcome = execute(plan.spec, job, ledger=ledger, provider=plan.provider, launcher=plan.needs_launcher(), backend=backend,
                      ui=ui, keep=keep and backend.can(Capability.PROVISIONS), prices=plan.prices,
                      workload=plan.workload, resumed_from=plan.resumed_from)
    return ChainOutcome(attempts=[Attempt(run_id=outcome.run_id, outcome=outcome, spot=plan.spec.spot)])
