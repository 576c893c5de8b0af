"""`gpucluster logs`: a run's per-node logs, and --follow until the run ends."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from gpucluster.cli import common
from gpucluster.cli.complete import complete_run_id
from gpucluster.errors import UsageError, not_allowed


# metric records gpucluster itself adds to a node's log (sampler, announcer), not the job's
# gpucluster's own records, shown only with --metrics: the sampler, the announcer, the node supervisor and shell
TOOL_KINDS = frozenset({"util", "worker_start", "reaper_start", "reaper_done", "node_exit"})
SECRET_FIELDS = frozenset({"key"})  # a node's control key (gpucluster.control): never printed but by --raw
METRIC_MARK = "@gpucluster-metric"


@click.command()
@click.argument("run_id", shell_complete=complete_run_id)
@click.option("--node", default=None, type=click.IntRange(0, 4096), help="Only this node's log.")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing new lines until the run ends (waits for node logs that do not exist yet).")
@click.option("--tail", "tail", default=None, type=click.IntRange(0, 10_000_000), metavar="N",
              help="Start with only the last N lines of each node's log.")
@click.option("--metrics", "metrics", is_flag=True,
              help="Also show gpucluster's own metric lines (the utilisation sampler, the worker announcer).")
@click.option("--raw", is_flag=True,
              help="Every line as the node wrote it: metric lines as JSON, nothing hidden, no node prefix.")
def logs(run_id, node, follow, tail, metrics, raw):
    """Print a run's per-node logs (node-N.log under the run's log directory).

    Metric lines (`@gpucluster-metric {...}`) are shown as one short summary each ("epoch 2  loss
    0.3120  acc 91.20%"); gpucluster's own ones (the utilisation sampler, the worker announcer) are
    hidden unless --metrics. --raw prints every line as the node wrote it.

    \b
    Examples:
      gpucluster logs r20261122-031500-1a2b3c --node 0
      gpucluster logs r20261122-031500-1a2b3c --follow --tail 20
    """
    ledger = common.ledger()
    run = ledger.get_run(run_id)
    if run is None:
        raise UsageError(f"run {run_id!r} is not in the ledger; list runs with 'gpucluster runs'")
    log_dir = Path(run.run.log_dir or "")
    files = _node_logs(log_dir)
    if node is not None and node >= (run.run.nodes or 0) and not any(p.stem == f"node-{node}" for p in files):
        have = sorted(p.stem for p in files)
        raise UsageError(not_allowed("node", node, ", ".join(have) or "none: the run has no node logs"))
    live = follow and run.run.status == "running"
    if not files and not live:
        click.echo(f"run {run.id} has no node logs in {log_dir}", err=True)
        return 0
    if not files:
        click.echo(f"run {run.id}: no node log yet (the nodes are being provisioned or started); waiting ...",
                   err=True)
    view = _View(raw=raw, metrics=metrics, prefix=(run.run.nodes or 1) > 1 and node is None and not raw)
    offsets: dict[Path, int] = {}

    def pump(first: bool) -> bool:
        grew = False
        for p in _node_logs(log_dir):
            if node is not None and p.stem != f"node-{node}":
                continue
            if not p.is_file():
                raise UsageError(f"node log {str(p)!r} is not a file (a folder?); move it aside to read the others")
            # bytes, not text: the offset counts the bytes read (a line that is not UTF-8 is re-encoded
            # longer by errors="replace", and a text offset then skipped what came after it)
            with open(p, "rb") as fh:
                fh.seek(offsets.get(p, 0))
                data = fh.read()
            if data and not data.endswith(b"\n") and follow:
                data = data[: data.rfind(b"\n") + 1]  # a line still being written: next time
            offsets[p] = offsets.get(p, 0) + len(data)
            chunk = data.decode("utf-8", errors="replace")
            shown = [s for s in (view.show(p.stem, line) for line in chunk.splitlines()) if s is not None]
            if first and tail is not None:
                shown = shown[len(shown) - tail:] if tail else []
            for text in shown:
                click.echo(text)
            grew = grew or bool(chunk)
        return grew

    pump(first=True)
    if follow:
        try:
            while True:
                grew = pump(first=False)
                now = ledger.get_run(run.id)
                if not grew and (now is None or now.run.status != "running"):
                    pump(first=False)  # what was written between the last read and the end
                    break
                if not grew and not _owner_alive(run):
                    pump(first=False)  # what it wrote just before it went
                    click.echo(f"run {run.id}: its gpucluster process is gone, yet the record says it is "
                               f"running; close it with: gpucluster down {run.run.cluster}", err=True)
                    break
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    return 0


def _node_logs(log_dir: Path) -> list[Path]:
    if not log_dir.is_dir():
        return []
    found = [p for p in log_dir.glob("node-*.log") if p.stem.split("-", 1)[1].isdigit()]
    return sorted(found, key=lambda p: int(p.stem.split("-")[1]))


class _View:
    """How one log line is shown: None (hidden), the line, or a metric line's summary."""

    def __init__(self, *, raw: bool, metrics: bool, prefix: bool):
        self.raw, self.metrics, self.prefix = raw, metrics, prefix

    def show(self, stem: str, line: str) -> str | None:
        if self.raw:
            return line
        if METRIC_MARK in line:
            from gpucluster.metrics import parse_line

            record = parse_line(line)
            if record is not None:
                if record.get("kind") in TOOL_KINDS and not self.metrics:
                    return None
                line = summarize(record)
        return f"[{stem.replace('-', ' ')}] {line}" if self.prefix else line


def summarize(record: dict[str, Any]) -> str:
    """One short line for a metric record: the formats of the live console (`render.metric_parts`)."""
    from gpucluster.cli.render import fmt_bytes, fmt_secs, metric_parts

    kind = str(record.get("kind") or "?")
    if kind == "util":
        gpus = record.get("gpu") or []
        parts = [f"cpu {record['cpu_percent']:.0f}%"] if record.get("cpu_percent") is not None else []
        parts += [f"gpu{g.get('index', i)} {g['util']:.0f}%" for i, g in enumerate(gpus) if g.get("util") is not None]
        return "  ".join(["util", *parts])
    if kind == "stage":
        return (f"stage  {record.get('files')} file(s), {fmt_bytes(record.get('bytes') or 0)}; sent "
                f"{fmt_bytes(record.get('sent_bytes') or 0)} in {fmt_secs(record.get('seconds'))}")
    parts = metric_parts(record)
    if not parts:  # a record of the job's own kind: its fields, briefly
        parts = [f"{k} {v}" for k, v in record.items()
                 if k not in ("kind", "time", *SECRET_FIELDS) and not isinstance(v, (dict, list))]
    return "  ".join([kind, *parts])


def _owner_alive(run: Any) -> bool:
    """Whether a live gpucluster process still owns the run (its owner lock, released by the kernel
    when that process dies, names this run)."""
    from gpucluster.owner import owner

    info = owner(run.run.cluster)
    if info is None:
        return False
    return info.get("run_id") in (None, run.id)  # an unreadable lock: assume it is this run's