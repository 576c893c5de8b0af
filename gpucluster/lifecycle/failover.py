"""Failover down a placement's ranking (docs/placement.md): the chosen candidate runs; when its
cluster could not be created for want of capacity or quota (the `cause` of the backend's
`ProvisionError`, kept with the run's outcome), and its teardown was verified, the next candidate runs,
linked to the last as a chain (`show`, `cost report --group-by chain`). Each attempt's ledger row
carries a `placement` record: where it ran, at what price, and why it ended. Anything else ends the
loop: success, a failure placement cannot fix, Ctrl-C (an interrupted run is torn down by the run
itself and no next attempt starts), a teardown not verified, or the last candidate.

Cloud-agnostic: the cause comes with the failed attempt (`ProvisionError.cause`, `RunOutcome.cause`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol, TypeVar

from gpucluster.errors import GpuclusterError, ProvisionError
from gpucluster.lifecycle.recovery import ATTEMPT_KIND, ChainOutcome
from gpucluster.states import JsonObject, PhaseStatus, RunStatus, TeardownVerdict

if TYPE_CHECKING:
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.steps import RunOutcome
    from gpucluster.plan.placement import Candidate, Placement

PLACEMENT_KIND = "placement"
VERIFIED = TeardownVerdict.VERIFIED
_Made = TypeVar("_Made")  # what `up_placed`'s provision_one gives for the candidate that is up


class Says(Protocol):
    """Where failover says that it moves to the next candidate (the command's UI)."""

    def message(self, text: str) -> None: ...


def failover_cause(ledger: Ledger, outcome: RunOutcome) -> str | None:
    """"capacity" or "quota" when `outcome` is a run whose provisioning failed for that reason, else None."""
    if outcome.status != RunStatus.FAILED or outcome.cause is None:
        return None
    try:
        record = ledger.get_run(outcome.run_id)
    except GpuclusterError:
        return None
    provision = record.phase("provision") if record is not None else None
    if provision is None or provision.status != PhaseStatus.FAILED:
        return None
    return outcome.cause


def up_placed(placement: Placement, *, ledger: Ledger, ui: Says,
              provision_one: Callable[[Candidate], _Made]) -> tuple[Candidate, _Made]:
    """`up` down the ranking: `provision_one(candidate)` (the cluster made and kept, or the error it
    raised once what it made was torn down and checked) for each of `placement.tried` until one is up;
    a capacity or quota error whose attempt's teardown the ledger holds as verified moves to the next,
    anything else is raised as it came. Each attempt's
    row gets a `placement` record. Returns (the candidate that is up, what `provision_one` gave)."""
    from gpucluster.errors import TeardownIncomplete

    tried = placement.tried
    first: str | None = None
    for n, cand in enumerate(tried, 1):
        rid = str(cand.plan.spec.run_id)
        first = first or rid
        try:
            made = provision_one(cand)
        except TeardownIncomplete:  # not verified: nothing more is created while that may still exist
            raise
        except GpuclusterError as exc:
            cause = exc.cause if isinstance(exc, ProvisionError) else None
            why = None if cause is None else f"no {cause} at {cand.where}: {exc.message[:300]}"
            teardown = _teardown_of(ledger, rid)  # as the attempt's own check recorded it, never assumed
            _place_record(ledger, rid, {"kind": PLACEMENT_KIND, "attempt": n, "of": len(tried), "chain": first,
                                        **cand.to_dict(), "cause": cause, "failure": why, "teardown": teardown})
            if cause is None or teardown != VERIFIED or n == len(tried):
                raise
            nxt = tried[n]
            ui.message(f"no {cause} at {cand.where}: failing over to candidate {n + 1} of {len(tried)}, {nxt.where} "
                       f"{nxt.instance_type or ''} (${nxt.hourly:.2f}/h)")
            continue
        _place_record(ledger, rid, {"kind": PLACEMENT_KIND, "attempt": n, "of": len(tried), "chain": first,
                                    **cand.to_dict(), "cause": None, "failure": None, "teardown": TeardownVerdict.KEPT})
        return cand, made
    raise GpuclusterError("no candidate to create the cluster at")  # never: a placement has one at least


def _teardown_of(ledger: Ledger, run_id: str) -> str | None:
    try:
        record = ledger.get_run(run_id)
    except GpuclusterError:
        return None
    return None if record is None else record.run.teardown


def _place_record(ledger: Ledger, run_id: str, record: JsonObject) -> None:
    try:
        ledger.add_metrics(run_id, [(None, record)])
    except GpuclusterError:  # the attempt's own row says how it ended; the placement record is extra
        pass


def run_placed(placement: Placement, *, ledger: Ledger, ui: Says | None,
               run_one: Callable[[Candidate, str | None], ChainOutcome]) -> ChainOutcome:
    """Each of `placement.tried` in turn, `run_one(candidate, the last attempt's run id or None)` (the
    run and its own recovery), until one ends for another reason than capacity or quota."""
    chain = ChainOutcome()
    tried = placement.tried
    first: str | None = None
    last: str | None = None
    for n, cand in enumerate(tried, 1):
        result = run_one(cand, last)
        chain.attempts.extend(result.attempts)
        chain.stopped = result.stopped
        outcome = result.final
        first, last = first or result.attempts[0].run_id, outcome.run_id
        cause = failover_cause(ledger, outcome)
        why = None if cause is None else f"no {cause} at {cand.where}: {(outcome.failure or '')[:300]}"
        records: list[tuple[int | None, JsonObject]] = [(None, {
            "kind": PLACEMENT_KIND, "attempt": n, "of": len(tried), "chain": first, **cand.to_dict(),
            "cause": cause, "failure": why, "teardown": outcome.teardown})]
        if len(result.attempts) == 1 and (n > 1 or cause is not None):
            # the chain's attempt, as `show` and `cost report --group-by chain` read them (a run with
            # recovery of its own has written its attempts already)
            records.append((None, {"kind": ATTEMPT_KIND, "attempt": n, "chain": first, "interruption": why,
                                   "cause": cause, "spot": bool(cand.plan.spec.spot), "placement": cand.where}))
        try:
            ledger.add_metrics(outcome.run_id, records)
        except GpuclusterError as exc:
            chain.stopped = f"not failing over: the attempt could not be recorded ({exc.message})" if cause else None
            break
        if cause is None:
            break
        if outcome.teardown != VERIFIED:
            chain.stopped = (f"{why}; not failing over: the attempt's teardown is {outcome.teardown} (finish it "
                             f"with `gpucluster down {cand.plan.spec.name}`)")
            break
        if n == len(tried):
            left = len(placement.ranked) - len(tried)
            chain.stopped = (f"{why}; every candidate tried ({n}"
                             + (f"; {left} more left out by --max-attempts {placement.max_attempts})" if left else ")"))
            break
        nxt = tried[n]
        if ui is not None:  # a run without a console (the Python API's quiet run) fails over silently
            ui.message(f"no {cause} at {cand.where}: failing over to candidate {n + 1} of {len(tried)}, {nxt.where} "
                       f"{nxt.instance_type or ''} (${nxt.hourly:.2f}/h)")
    return chain
