"""Whether a succeeded run of a user's script shows any sign of having trained (issue 46 item 2).

pytorch/examples' minGPT-ddp exits 0 when a node has fewer than 2 GPUs (on CPU, and on a 1-GPU
machine shape), after one line: nothing joined a process group, no metric, no progress. Such a run
stays SUCCEEDED (the script said so), but the report and `show` ask whether it trained when, on
every node, the script reported no metric (JSON or a printed loss/accuracy), wrote no file (output
folder or working folder) and printed at most a few lines after its workers started.
"""

from __future__ import annotations

from typing import Any

from gpucluster.states import RunStatus

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


def no_training_warning(record: Any) -> str | None:
    """The warning line for a succeeded user-script run without a sign of training, or None."""
    run = record.run
    if run.status != RunStatus.SUCCEEDED or not run.command or not record.nodes:
        return None
    m = run.metrics or {}
    if any(m.get(k) is not None for k in PROGRESS_KEYS) or m.get("metrics_source") == "text" \
            or (m.get("world_size") or 0) > 1:
        return None
    if any((o.files or 0) or (o.workdir_files or 0) for o in record.outputs):
        return None
    printed: dict[int, list[str]] = {}
    for node in record.nodes:
        after = lines_after_start(node.last_lines or [])
        if after is None or len(after) > FEW_LINES:
            return None
        printed[node.node_rank] = after
    last = next(((r, ls[-1]) for r, ls in sorted(printed.items()) if ls), None)
    said = f"; node {last[0]} last printed {last[1][:160]!r}" if last else "; no rank printed anything"
    return (f"warning: no sign of training: no rank reported a metric or a loss, no node wrote a file, and at most "
            f"{FEW_LINES} line(s) were printed after start-up{said}. Did the script train? (A script that needs "
            "more GPUs per node than it found may exit 0 without joining a process group.)")
