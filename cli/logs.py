"""`gpucluster logs`: a run's per-node logs, and --follow until the run ends."""

from __future__ import annotations

import time

import click

from gpucluster.cli import common
from gpucluster.errors import UsageError, not_allowed


@click.command()
@click.argument("run_id")
@click.option("--node", default=None, type=click.IntRange(0, 4096), help="Only this node's log.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the run ends.")
def logs(run_id, node, follow):
    """Print a run's per-node logs (node-N.log under the run's log directory).

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
    prefix = len(files) > 1
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
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    return 0
