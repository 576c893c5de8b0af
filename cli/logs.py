"""`gpucluster logs`: a run's per-node logs, and --follow until the run ends."""

from __future__ import annotations

import time
from typing import Any

import click

from gpucluster.cli import common
from gpucluster.errors import UsageError, not_allowed


# metric records gpucluster itself adds to a node's log (sampler, announcer), not the job's
TOOL_KINDS = frozenset({"util", "worker_start"})


@click.command()
@click.argument("run_id")
@click.option("--node", default=None, type=click.IntRange(0, 4096), help="Only this node's log.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the run ends.")
@click.option("--metrics", "metrics", is_flag=True,
              help="Also show gpucluster's own metric lines (the utilisation sampler, the worker announcer).")
@click.option("--raw", is_flag=True, help="Every line as the node wrote it: nothing hidden, no node prefix.")
def logs(run_id, node, follow, metrics, raw):
    """Print a run's per-node logs (node-N.log under the run's log directory).

    gpucluster's own metric lines (`@gpucluster-metric` records of the utilisation sampler and the
    worker announcer) are hidden unless --metrics or --raw.

    \b
    Examples:
      gpucluster logs r20261122-031500-1a2b3c --node 0
      gpucluster logs r20261122-031500-1a2b3c --follow
    """
    from pathlib import Path

    ledger = common.ledger()
    run = ledger.get_run(run_id)
    if run is None:
        raise UsageError(f"run {run_id!r} is not in the ledger; list runs with 'gpucluster runs'")
    log_dir = Path(run.run.log_dir or "")
    files = sorted(log_dir.glob("node-*.log"), key=lambda p: int(p.stem.split("-")[1])) if log_dir.is_dir() else []
    if node is not None:
        files = [p for p in files if p.stem == f"node-{node}"]
        if not files:
            have = sorted(p.stem for p in log_dir.glob("node-*.log")) if log_dir.is_dir() else []
            raise UsageError(not_allowed("node", node, ", ".join(have) or "none: the run has no node logs"))
    if not files:
        click.echo(f"run {run.id} has no node logs in {log_dir}", err=True)
        return 0
    odd = next((p for p in files if not p.is_file()), None)
    if odd is not None:
        raise UsageError(f"node log {str(odd)!r} is not a file (a folder?); move it aside to read the others")
    prefix = len(files) > 1 and not raw
    from gpucluster.metrics import parse_line

    def shown(line: str) -> bool:
        if raw or metrics or "@gpucluster-metric" not in line:
            return True
        record = parse_line(line)
        return record is None or record.get("kind") not in TOOL_KINDS

    offsets = {p: 0 for p in files}

    def pump() -> bool:
        grew = False
        for p in files:
            with open(p, "r", encoding="utf-8", errors="replace") as fh:
                fh.seek(offsets[p])
                chunk = fh.read()
                if chunk and not chunk.endswith("\n") and follow:
                    chunk = chunk[: chunk.rfind("\n") + 1]
                offsets[p] += len(chunk.encode("utf-8", errors="replace"))
            for line in chunk.splitlines():
                if not shown(line):
                    continue
                click.echo(f"[{p.stem.replace('-', ' ')}] {line}" if prefix else line)
            grew = grew or bool(chunk)
        return grew

    pump()
    if follow:
        try:
            while True:
                grew = pump()
                now = ledger.get_run(run.id)
                if not grew and (now is None or now.run.status != "running"):
                    break
                if not grew and not _owner_alive(run):
                    pump()  # what it wrote just before it went
                    click.echo(f"run {run.id}: its gpucluster process is gone, yet the record says it is "
                               f"running; close it with: gpucluster down {run.run.cluster}", err=True)
                    break
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    return 0


def _owner_alive(run: Any) -> bool:
    """Whether a live gpucluster process still owns the run (its owner lock, released by the kernel
    when that process dies, names this run)."""
    from gpucluster.owner import owner

    info = owner(run.run.cluster)
    if info is None:
        return False
    return info.get("run_id") in (None, run.id)  # an unreadable lock: assume it is this run's
