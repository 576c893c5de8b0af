"""A recovered chain, attempt by attempt (`show`, `cost report --group-by chain`): for each run of
the chain, its attempt number, status, what interrupted it (its `attempt` or `node_lost` record),
where it resumed from and how far it got (the workload's `start`, `epoch`, `checkpoint` and `step`
records), the training the next attempt had to do again, and its cost.

"Recomputed" is what the interrupted attempt is known to have reached (its last epoch, checkpoint
or step record) minus where the next attempt resumed: a lower bound when the attempt trained on
past its last record (a node that vanished without a word)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpucluster.states import JsonMapping, JsonObject

if TYPE_CHECKING:
    from gpucluster.ledger.chains import ResumeLinks
    from gpucluster.ledger.records import RunRecord
    from gpucluster.ledger.store import Ledger

PROGRESS_KINDS = ("epoch", "checkpoint", "step", "start")


def _progress(records: list[JsonObject]) -> tuple[int | None, int | None, float | None]:
    """(the step it resumed from: 0 for a fresh start, None when it never started; the furthest step
    it is known to have reached; steps per epoch) from its records."""
    per_epoch = None
    for r in records:
        if r.get("kind") in ("epoch", "checkpoint") and isinstance(r.get("step"), int) and \
                isinstance(r.get("epoch"), int) and r["epoch"] > 0 and not r.get("batch"):
            per_epoch = r["step"] / r["epoch"]
            break
    start = next((r for r in records if r.get("kind") == "start" and r.get("rank") in (0, None)), None)
    resumed: int | None = None
    if start is not None:
        if isinstance(start.get("resumed_from_step"), int):
            resumed = start["resumed_from_step"]
        elif isinstance(start.get("resumed_from_epoch"), int):  # an older workload said only the epoch
            resumed = int(start["resumed_from_epoch"] * per_epoch) if per_epoch else None
        else:
            resumed = 0
    steps = [int(r["step"]) for r in records if r.get("kind") in ("epoch", "checkpoint", "step")
             and isinstance(r.get("step"), int)]
    return resumed, max(steps, default=None), per_epoch


def _interruption(attempt: JsonMapping, lost: list[JsonObject], record: RunRecord) -> object:
    """What interrupted the attempt: its own record's word, else the first node it lost (a failed run)."""
    interruption = attempt.get("interruption")
    if interruption is None and lost and record.run.status == "failed":
        interruption = f"node {lost[0].get('node_rank')} ({lost[0].get('host')}) lost: {lost[0].get('reason')}"
    return interruption


def _attempt_row(ledger: Ledger, rid: str, i: int, record: RunRecord) -> JsonObject:
    """One run of the chain as a row (its recomputed work filled in by `_recomputed`)."""
    records = [r for r in ledger.metrics(rid) if r.get("kind") in PROGRESS_KINDS + ("attempt", "node_lost")]
    attempt: JsonObject = next((r for r in records if r.get("kind") == "attempt"), {})
    lost = sorted((r for r in records if r.get("kind") == "node_lost"), key=lambda r: r.get("detected_at") or 0)
    interruption = _interruption(attempt, lost, record)
    resumed, reached, per_epoch = _progress(records)
    cost = (record.cost or {}).get("total")
    wall = (record.run.ended_at - record.run.created_at) if record.run.ended_at and record.run.created_at else None
    return {"run_id": rid, "attempt": attempt.get("attempt", i + 1), "status": record.run.status,
            "interruption": interruption, "cause": attempt.get("cause") or (lost[0].get("cause") if lost else None),
            "spot": attempt.get("spot"), "resumed_from_step": resumed, "reached_step": reached,
            "steps_per_epoch": per_epoch, "recomputed_steps": None, "recomputed_epochs": None,
            "cost": cost, "wall_s": None if wall is None else round(float(wall), 3)}


def _recomputed(prev: JsonObject, nxt: JsonObject) -> None:
    """The steps (and epochs) `prev` reached that `nxt`, resuming, did again."""
    if prev["reached_step"] is not None and nxt["resumed_from_step"] is not None:
        redo = max(0, prev["reached_step"] - nxt["resumed_from_step"])
        prev["recomputed_steps"] = redo
        per_epoch = prev["steps_per_epoch"] or nxt["steps_per_epoch"]
        prev["recomputed_epochs"] = round(redo / per_epoch, 3) if per_epoch else None


def chain_attempts(ledger: Ledger, run_ids: list[str], links: ResumeLinks | None = None) -> list[JsonObject]:
    """One dict per run of the chain, oldest first. `links`: `Ledger.resume_links()`, when the
    caller has read them (a report over many chains reads them once, not once per run)."""
    rows: list[JsonObject] = []
    links = ledger.resume_links() if links is None else links
    for i, rid in enumerate(run_ids):
        record = ledger.get_run(rid, links=links)
        if record is None:
            continue
        rows.append(_attempt_row(ledger, rid, i, record))
    for prev, nxt in zip(rows, rows[1:]):
        _recomputed(prev, nxt)
    return rows
