"""`gpucluster logs`: a run's per-node logs, and --follow until the run ends."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from gpucluster.cli import common
from gpucluster.cli.complete import complete_run_id
from gpucluster.states import RunStatus

if TYPE_CHECKING:
    from gpucluster.api.records import LogLine
    from gpucluster.states import JsonObject


# metric records gpucluster itself adds to a node's log (sampler, announcer), not the job's
# gpucluster's own records, shown only with --metrics: the sampler, the announcer, the node supervisor and shell,
# the process-group hook (gpucluster/node/node_pghook.py)
TOOL_KINDS = frozenset({"util", "worker_start", "reaper_start", "reaper_done", "node_exit", "pg_hook", "pg_join"})
SECRET_FIELDS = frozenset({"key"})  # a node's control key (gpucluster.watch.control): never printed but by --raw
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
    from gpucluster.api.records import reader

    read = reader(run_id, node, ledger=common.ledger())  # the one path: gpucluster.logs's (api/records.py)
    run, log_dir = read.record, read.log_dir
    files = read.files()
    live = follow and run.run.status == RunStatus.RUNNING
    if not files and not live:
        click.echo(f"run {run.id} has no node logs in {log_dir}", err=True)
        return 0
    if not files:
        click.echo(f"run {run.id}: no node log yet (the nodes are being provisioned or started); waiting ...",
                   err=True)
    view = LineView(raw=raw, metrics=metrics, prefix=(run.run.nodes or 1) > 1 and node is None and not raw)

    def echo(batch: list[LogLine], first: bool = False) -> None:
        by_node: dict[int, list[str]] = {}
        for line in batch:
            text = view.show(f"node-{line.node}", line.text)
            if text is not None:
                by_node.setdefault(line.node, []).append(text)
        for shown in by_node.values():
            if first and tail is not None:
                shown = shown[len(shown) - tail:] if tail else []
            for text in shown:
                click.echo(text)

    def orphaned() -> None:
        click.echo(f"run {run.id}: its gpucluster process is gone, yet the record says it is "
                   f"running; close it with: gpucluster down {run.run.cluster}", err=True)

    echo(read.read(whole_lines=follow), first=True)
    if follow:
        try:
            for batch in read.follow(on_orphan=orphaned):
                echo(batch)
        except KeyboardInterrupt:
            pass
    return 0


class LineView:
    """How one log line is shown (`gpucluster logs`, the dashboard): None (hidden), the line, or a metric
    line's summary."""

    def __init__(self, *, raw: bool, metrics: bool, prefix: bool):
        self.raw, self.metrics, self.prefix = raw, metrics, prefix

    def show(self, stem: str, line: str) -> str | None:
        if self.raw:
            return line
        if METRIC_MARK in line:
            from gpucluster.watch.metrics import parse_line

            record = parse_line(line)
            if record is not None:
                if record.get("kind") in TOOL_KINDS and not self.metrics:
                    return None
                line = summarize(record)
        return f"[{stem.replace('-', ' ')}] {line}" if self.prefix else line


def summarize(record: JsonObject) -> str:
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
