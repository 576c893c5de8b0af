"""A lost node, said the same way by every backend.

A launcher that sees a node go (its process killed, its ssh session dropped, its pod deleted or
preempted, a spot interruption notice from its watcher, a failed health check) reports a
`node_lost` metric record through the event contract every launcher already has
(`RunEvents.on_metric`): it lands in the run's metrics in the ledger, where the recovery loop
(gpucluster/lifecycle/recovery.py) reads it, and on the console. The run then fails as any run does (ranks
get SIGTERM, outputs come back, teardown and its check); only the record says the failure was a
lost node and not the job's own.

A node program that watches for notices (infra/aws/node_notice.py) prints a `node_notice` record
on the node's output, with its key (gpucluster/watch/control.py: a job's own copy of the line is not
believed); the supervisor turns the first one into the run's failure and a `node_lost` record
(cause "interruption").
"""

from __future__ import annotations

import signal
import time

from gpucluster.states import JsonMapping, JsonObject

LOST_KIND = "node_lost"
NOTICE_KIND = "node_notice"
# interruption: the cloud said it takes the node back; unreachable: it stopped answering;
# killed: its agent or its process was killed; health: it failed the health check
CAUSES = ("interruption", "unreachable", "killed", "health")
# After a notice the ranks are given the time the notice leaves, less what the outputs copy needs,
# to save (SIGTERM: the built-in workloads write a checkpoint), instead of the usual few seconds.
NOTICE_S = 120.0  # aws: the spot interruption notice comes two minutes before (EC2 User Guide)
OUTPUTS_MARGIN_S = 30.0  # kept back from the notice for copying the outputs home and the teardown


def lost_record(node_rank: int, host: str, cause: str, reason: str, phase: str | None) -> JsonObject:
    return {"kind": LOST_KIND, "node_rank": node_rank, "host": host, "cause": cause, "reason": reason,
            "phase": phase, "detected_at": round(time.time(), 3)}


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def killed_why(code: int | None) -> str | None:
    """Why a node's own process (its agent, or the supervisor above it) ended as a lost node's
    does: killed by a signal (a negative status), or a shell's 128+N for SIGKILL (what the reaper
    reports when its torchrun agent was killed). None for every other status: a job that failed
    ends with torchrun's own exit code, 1."""
    if code is None:
        return None
    if code < 0:
        return f"its process was killed by {signal_name(-code)}"
    if code == 128 + signal.SIGKILL:
        return "its agent was killed by SIGKILL"
    return None


# A node's shell says 137 (128 + SIGKILL) both when its reaper reports that its agent was killed and
# when the reaper itself was killed; a reaper that started and never said `reaper_done` was the one.
REAPER_KILLED = "its reaper (the node's supervisor) was killed by SIGKILL"


def notice_failure(node_rank: int, host: str, record: JsonMapping) -> str:
    """The run's failure line for a node's interruption notice."""
    what = record.get("action") or "terminate"
    when = f" at {record['when']}" if record.get("when") else ""
    src = record.get("source") or "the cloud"
    return f"node {node_rank} ({host}) lost: {src} gave notice: {what}{when}"


def save_grace(record: JsonMapping, usual: float, now: float | None = None) -> float:
    """Seconds the ranks get between SIGTERM and SIGKILL after a node's interruption notice: the
    time left before the node goes (the notice's `when`, else NOTICE_S from now; never more than
    NOTICE_S, whatever a skewed clock says) less OUTPUTS_MARGIN_S, and never less than `usual` (the
    launcher's grace). A rank that has saved and exited ends the wait at once."""
    now = time.time() if now is None else now
    left = NOTICE_S
    when = record.get("when")
    if isinstance(when, str) and when.strip():
        import datetime as dt

        try:
            at = dt.datetime.fromisoformat(when.strip().replace("Z", "+00:00"))
            if at.tzinfo is None:
                at = at.replace(tzinfo=dt.timezone.utc)
            left = min(NOTICE_S, at.timestamp() - now)
        except ValueError:
            pass
    return round(max(float(usual), left - OUTPUTS_MARGIN_S), 1)


def cause_of(reason: str) -> str:
    low = reason.lower()
    if any(w in low for w in ("notice", "preempt", "shutdown", "interruption", "deleted", "evicted", "disrupt",
                              "disappeared")):
        return "interruption"  # the platform took the node (or its pod) back
    if "killed" in low or "signal" in low:
        return "killed"
    return "unreachable"
