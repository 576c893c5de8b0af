"""Whether a succeeded run of a user's script shows any sign of having trained (issue 46 item 2).

pytorch/examples' minGPT-ddp exits 0 when a node has fewer than 2 GPUs (on CPU, and on a 1-GPU
machine shape), after one line: nothing joined a process group, no metric, no progress. Such a run
stays SUCCEEDED (the script said so), but the report and `show` ask whether it trained when, on
every node, the script reported no metric (JSON or a printed loss/accuracy), wrote no file (output
folder or working folder) and printed at most a few lines after its workers started; and, on a run of
more than one rank, when no rank joined a process group: the workers' Python loads a hook
(gpucluster/node/node_pghook.py) that says so (`pg_hook` once per rank, `pg_join` when its
`init_process_group` returned; the run's metrics keep `pg_ranks`). Whether a rank joined is known
only when every rank loaded the hook (a Python started with -S, -I or -E, or a wrapper that replaces
PYTHONPATH, does not): otherwise nothing is said.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpucluster.states import JsonMapping, RunStatus

if TYPE_CHECKING:
    from gpucluster.ledger.records import RunRecord

METRIC_MARK = "@gpucluster-metric "
START_MARK = '"kind": "worker_start"'
PROGRESS_KEYS = ("loss", "accuracy", "epoch", "step", "samples_per_s")
FEW_LINES = 3  # at most this many lines after start-up on every node: no progress was printed


def lines_after_start(last_lines: list[str]) -> list[str] | None:
    """A node's printed lines after its last worker's start (metric lines left out); None when the
    start is not among the kept last lines (it scrolled out: the job printed plenty)."""
    starts = [i for i, ln in enumerate(last_lines) if ln.startswith(METRIC_MARK) and START_MARK in ln]
    if not starts:
        return None
    return [ln for ln in last_lines[starts[0] + 1:] if ln.strip() and not ln.startswith(METRIC_MARK)]


PG_NOTE = "(A script that needs more GPUs per node than it found may exit 0 without joining a process group.)"


def no_group_warning(record: RunRecord) -> str | None:
    """The warning line for a succeeded user-script run of more than one rank where every rank loaded
    the process-group hook and none joined a process group, or None (also when that is not known)."""
    run = record.run
    m = run.metrics or {}
    if run.status != RunStatus.SUCCEEDED or not run.command or m.get("pg_ranks") != 0 or (m.get("pg_hooked") or 0) < 2 \
            or (m.get("world_size") or 0) > 1:  # a framework printed a group of more than one
        return None
    facts = _untrained(record)
    return (f"warning: no rank joined the process group: did the script train? None of its {m['pg_hooked']} ranks "
            "called torch.distributed.init_process_group" + (f"; {facts}" if facts else "") + f". {PG_NOTE}")


def no_training_warning(record: RunRecord) -> str | None:
    """The warning line for a succeeded user-script run without a sign of training, or None."""
    facts = _untrained(record)
    return f"warning: no sign of training: {facts}. Did the script train? {PG_NOTE}" if facts else None


def training_warnings(record: RunRecord) -> list[str]:
    """The report's (and `show --json`'s "warnings") lines on whether a run trained: every worker's world
    size 1 on a multi-node run; no rank joined a process group (with the signs of training it lacks too),
    or else no sign of training."""
    run = record.run
    m = run.metrics or {}
    out = []
    if (m.get("world_size") or m.get("pg_world_size")) == 1 and (run.nodes or 1) > 1:
        out.append(f"warning: every worker's world size was 1 on a {run.nodes}-node run: the ranks never formed one "
                   "group, each node trained alone (Lightning: Trainer(num_nodes=N) / --trainer.num_nodes N; plain "
                   "torch: init_process_group() with the default env://)")
    return out + [w for w in (no_group_warning(record) or no_training_warning(record),) if w]


def _reported_progress(m: JsonMapping) -> bool:
    """A metric, a printed loss or accuracy, or a process group of more than one."""
    return any(m.get(k) is not None for k in PROGRESS_KEYS) or m.get("metrics_source") == "text" \
        or (m.get("world_size") or 0) > 1 or (m.get("pg_world_size") or 0) > 1  # a group of more than one


def _printed_after_start(record: RunRecord) -> dict[int, list[str]] | None:
    """Each node's lines after start-up; None when a node printed more than a few (or its start scrolled out)."""
    printed: dict[int, list[str]] = {}
    for node in record.nodes:
        after = lines_after_start(node.last_lines or [])
        if after is None or len(after) > FEW_LINES:
            return None
        printed[node.node_rank] = after
    return printed


def _untrained(record: RunRecord) -> str | None:
    """What a succeeded user-script run without a sign of training lacks (one clause), or None."""
    run = record.run
    if run.status != RunStatus.SUCCEEDED or not run.command or not record.nodes:
        return None
    if _reported_progress(run.metrics or {}):
        return None
    if any((o.files or 0) or (o.workdir_files or 0) for o in record.outputs):
        return None
    printed = _printed_after_start(record)
    if printed is None:
        return None
    last = next(((r, ls[-1]) for r, ls in sorted(printed.items()) if ls), None)
    said = f"; node {last[0]} last printed {last[1][:160]!r}" if last else "; no rank printed anything"
    return (f"no rank reported a metric or a loss, no node wrote a file, and at most {FEW_LINES} line(s) were "
            f"printed after start-up{said}")
