"""Terminal rendering with rich (imported only by commands that print tables or progress)."""

from __future__ import annotations

import datetime as _dt
import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpucluster.domain import UNWITNESSED
from gpucluster.states import JsonMapping, RunStatus, TeardownVerdict

if TYPE_CHECKING:
    from collections.abc import Callable
    from gpucluster.states import JsonObject
    from gpucluster.ledger.records import NodeRow, RunRecord, RunRow, SetupRecord, StageRecord

NODE_STYLES = ["cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta"]


def fmt_time(ts: float | None) -> str:
    if not ts:
        return "-"
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def fmt_secs(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 60:
        return f"{s:.1f}s"
    m, sec = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


_METRIC_FORMATS = (("epoch", "epoch {}"), ("step", "step {}"), ("loss", "loss {:.4f}"), ("accuracy", "acc {:.2%}"),
                   ("samples_per_s", "{:,.0f} samples/s"), ("train_time_s", "train {:.1f}s"),
                   ("world_size", "world size {}"), ("rank", "rank {}"))


def metric_parts(values: JsonMapping, keys: tuple[str, ...] | None = None) -> list[str]:
    """'loss 0.1234', 'acc 98.05%', ... for the metrics present: one format for every display."""
    parts = []
    for key, fmt in _METRIC_FORMATS:
        v = values.get(key)
        if v is None or (keys is not None and key not in keys):
            continue
        try:
            parts.append(fmt.format(v))
        except (ValueError, TypeError):
            parts.append(f"{key} {v}")
    return parts


def fmt_metric(record: JsonObject) -> str:
    kind = record.get("kind")
    keys: tuple[str, ...] = ("epoch", "step", "loss", "accuracy", "samples_per_s", "train_time_s")
    if kind != "epoch":
        keys += ("rank",)
    return "  ".join([kind or "?", *metric_parts(record, keys)])


class RichRunUI:
    """Live logs with node prefixes above a one-line progress status (on a terminal).

    The status line is re-drawn four times a second (`rich.live.Live` asks `_Ticking` for it), so
    its clocks (the phase's and the whole command's) tick in every phase, between events too.
    `watch(phase)`: one line of resource progress in the provision and teardown phases
    (`gpucluster.ledger.progress.ResourceWatch.line`). After `stopping` (the first Ctrl-C, SIGTERM or
    SIGHUP) the nodes' own lines are no longer shown: what the stopping job prints (torchrun's
    tracebacks) stays in the node logs."""

    def __init__(self, console: Console, *, quiet: bool = False, epochs: int | None = None,
                 watch: Callable[[str], str | None] | None = None):
        self.console = console
        self.quiet = quiet
        self.epochs = epochs
        self.watch = watch
        self.phase_name = "prepare"
        self.t0 = time.monotonic()
        self.phase_t0 = self.t0
        self.state: JsonObject = {}
        self.live = None
        self.stopped = False
        if console.is_terminal:
            from rich.live import Live

            self.live = Live(_Ticking(self), console=console, refresh_per_second=4, transient=True)

    def __enter__(self) -> "RichRunUI":
        if self.live:
            self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.live:
            self.live.stop()

    def _status(self) -> Text:
        t = Text()
        t.append(f" {self.phase_name} ", style="bold reverse")
        now = time.monotonic()
        t.append(f" {fmt_clock(now - self.phase_t0)}")
        if self.phase_t0 > self.t0 + 0.5:
            t.append(f" (total {fmt_clock(now - self.t0)})", style="dim")
        s = self.state
        if "epoch" in s:
            total = f"/{self.epochs}" if self.epochs else ""
            t.append(f"  epoch {s['epoch']}{total}")
        for part in metric_parts(s, ("step", "loss", "accuracy", "samples_per_s")):
            t.append("  " + part)
        watched = self.watch(self.phase_name) if self.watch is not None else None
        if watched:
            t.append("  " + watched)
        elif s.get("detail") and "epoch" not in s:
            t.append("  " + s["detail"])
        return t

    def _refresh(self) -> None:
        if self.live:
            self.live.refresh()

    def phase(self, name: str) -> None:
        self.phase_name = name
        self.phase_t0 = time.monotonic()
        self.state.pop("detail", None)
        if not self.live and not self.quiet:
            self.console.print(Text(f"== {name}", style="bold"), highlight=False)
        self._refresh()

    def stopping(self, signal_name: str) -> None:
        """A stop signal. The first (Ctrl-C, SIGTERM, SIGHUP): one line, and from then on the nodes'
        lines go to their logs only. A later one: what the stopping is at (it is never cut short)."""
        what = "Ctrl-C" if signal_name == "SIGINT" else signal_name
        if self.stopped:
            now = self._status().plain.strip()
            self.console.print(Text(f"{what}: still stopping (bounded; it cannot be cut short): {now}",
                                    style="yellow"), highlight=False)
            return
        self.stopped = True
        self.console.print(Text(f"stopping: {what}: stopping the job and tearing down; press Ctrl-C again to see "
                                "what it is waiting for", style="bold yellow"), highlight=False)

    def line(self, node_rank: int, text: str) -> None:
        if self.quiet or self.stopped or text.lstrip().startswith("@gpucluster-metric") or "@gpucluster-metric " in text:
            return
        self._print(node_rank, Text(text))

    def metric(self, node_rank: int | None, record: JsonObject) -> None:
        if record.get("kind") == "text_metric" and node_rank == 0:  # a script's printed loss: the status line too
            self.state.update({k: record[k] for k in ("epoch", "loss", "accuracy") if record.get(k) is not None})
            self._refresh()
        if record.get("kind") in ("epoch", "step"):
            for k in ("epoch", "step", "loss", "accuracy", "samples_per_s"):
                if record.get(k) is not None:
                    self.state[k] = record[k]
            self._refresh()
        if self.quiet or record.get("kind") in ("util", "step", "worker_start", "setup_start", "setup_end",
                                                "reaper_start", "reaper_done", "rdzv_port", "node_exit",
                                                "text_metric", "world", "node_check", "link", "allreduce", "check",
                                                "attempt", "cost_warning", "pg_hook", "pg_join"):
            return  # setup, text_metric, world: read from the node's own lines; the health check: its own message
        if node_rank is None:  # a record of the whole run, not of a node
            self.message(fmt_metric(record))
            return
        if record.get("kind") == "node_lost":
            self._print(node_rank, Text(f"lost ({record.get('cause')}): {record.get('reason')}", style="bold red"))
            return
        if record.get("kind") == "checkpoint" and record.get("node_rank") not in (0, None):
            return  # every node keeps a copy; node 0's says it
        if record.get("kind") == "stage":
            self._print(node_rank, Text(f"data staged: {record.get('files')} file(s), {fmt_bytes(record.get('bytes', 0))}"
                                        f"; sent {fmt_bytes(record.get('sent_bytes', 0))} in "
                                        f"{fmt_secs(record.get('seconds'))}", style="bold"))
            return
        if record.get("kind") == "final" and record.get("rank") not in (0, None):
            return
        self._print(node_rank, Text(fmt_metric(record), style="bold"))

    def _print(self, node_rank: int, body: Text) -> None:
        prefix = Text(f"[node {node_rank}] ", style=NODE_STYLES[node_rank % len(NODE_STYLES)])
        self.console.print(prefix + body, highlight=False, markup=False, soft_wrap=True)

    def message(self, text: str) -> None:
        self.console.print(Text(text, style="yellow"), highlight=False)

    def progress(self, text: str) -> None:
        """Transient progress (waiting for nodes...): on the status line; without a live status
        line only the final "all ... ready" is printed."""
        self.state["detail"] = text
        self._refresh()
        if not self.live and not self.quiet and text.startswith("all "):
            self.console.print(Text(text), highlight=False)


class _Ticking:
    """What `Live` re-draws on each refresh: the status line as of now."""

    def __init__(self, ui: RichRunUI):
        self.ui = ui

    def __rich__(self) -> Text:
        return self.ui._status()


def fmt_clock(s: float) -> str:
    """Elapsed time on the status line: whole seconds, so it visibly ticks once a second."""
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m}:{sec:02d}" if m else f"{sec}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{sec:02d}s"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def phase_rows(record: RunRecord) -> list[tuple[str, float | None, str]]:
    return [(p.name, p.seconds, p.status or "running") for p in record.phases]


_STATUS_STYLES = {RunStatus.SUCCEEDED: "bold green", RunStatus.FAILED: "bold red", RunStatus.INTERRUPTED: "bold yellow",
                  RunStatus.STOPPED: "bold yellow"}


def run_report(console: Console, record: RunRecord) -> None:
    """The report printed at the end of `run`, and by `show`: one step per section."""
    _head_lines(console, record.run)
    resume_lines(console, record)
    _phases_table(console, record)
    if record.staging:
        _staging_line(console, record.staging)
    if record.setup:
        _setup_line(console, record.run, record.setup)
    _result_line(console, record.run.metrics or {})

    from gpucluster.ledger.trained import training_warnings

    for warning in training_warnings(record):  # every world size 1, no process group, no sign of training
        console.print(Text(warning, style="yellow"), highlight=False)
    if record.nodes:
        _nodes_section(console, record.run, record.nodes)
    outputs_lines(console, record)
    teardown_lines(console, record)
    cost = record.cost
    if cost and cost.get("total") is not None:
        from gpucluster.cli.cost import render_run_cost

        render_run_cost(cost, console)
    if record.run.log_dir:
        console.print(f"logs: {record.run.log_dir}", highlight=False)


def _head_lines(console: Console, run: RunRow) -> None:
    """`run <id> STATUS  cloud  cluster  nodes  wall`, and the failure reason."""
    style = _STATUS_STYLES.get(run.status, "bold") if run.status else "bold"
    head = Text()
    head.append(f"run {run.id} ", style="bold")
    head.append(str(run.status).upper(), style=style)
    head.append(f"  {run.cloud}  cluster {run.cluster}  {run.nodes} node(s)  wall {fmt_secs(run.wall_s)}")
    console.print(head, highlight=False)
    if run.failure:
        console.print(Text(f"reason: {run.failure}", style="red"), highlight=False)


def _phases_table(console: Console, record: RunRecord) -> None:
    t = Table(title="phases", show_edge=False, title_justify="left")
    t.add_column("phase")
    t.add_column("time", justify="right")
    t.add_column("status")
    for name, dur, st in phase_rows(record):
        t.add_row(name, fmt_secs(dur), st)
    console.print(t)


def _staging_line(console: Console, staged: list[StageRecord]) -> None:
    """--data: what each node holds, what was sent (and the cache hits), fetched, the slowest node."""
    sent, fetched = sum(r.sent_bytes for r in staged), sum(r.fetched_bytes for r in staged)
    total = sum(r.bytes for r in staged) - fetched  # what went through the cache
    # cache hits only when there were some (a cold cache sends everything, plus tar's headers)
    counted = [r for r in staged if r.sent_files is not None and not r.fetched_bytes]
    files = sum(r.files for r in counted)
    hits = files - sum(r.sent_files or 0 for r in counted)
    console.print(f"data: {staged[0].files} file(s), {fmt_bytes(staged[0].bytes)} on each of "
                  f"{len(staged)} node(s); "
                  + (f"sent {fmt_bytes(sent)}" + (f" ({hits} of {files} file(s) were in the nodes' cache)"
                                                  if hits else "") + ", " if total else "")
                  + (f"{fmt_bytes(fetched)} fetched by the nodes from object storage, " if fetched else "")
                  + f"slowest node {fmt_secs(max(r.seconds for r in staged))}", highlight=False)


def _setup_line(console: Console, run: RunRow, setups: list[SetupRecord]) -> None:
    """--setup: how many nodes succeeded, the slowest, each failure's exit code."""
    ok = [r for r in setups if r.rc == 0]
    console.print(f"setup: {len(ok)} of {run.nodes} node(s) succeeded"
                  + (f", slowest {fmt_secs(max(r.seconds for r in ok))}" if ok else "")
                  + "".join(f"; node {r.node_rank} failed with exit code {r.rc}"
                            for r in setups if r.rc != 0), highlight=False)


def _result_line(console: Console, m: JsonMapping) -> None:
    """`result: ...` from the run's metric summary (none for a script that reports no metrics)."""
    if not m:
        return
    bits = metric_parts(m, ("accuracy", "loss", "samples_per_s", "world_size"))
    if m.get("train_time_s") is not None:
        bits.append(f"training {fmt_secs(m['train_time_s'])}")
    if bits and m.get("metrics_source") == "text":  # read from the job's printed lines (text_metrics)
        names = [repr(m[k]) for k in ("loss_name", "accuracy_name") if m.get(k)]
        bits.append(f"as node {m.get('text_node', 0)} last printed {' and '.join(names)}")
    if bits:  # a script that reports no metrics gets no empty `result:` line
        console.print("result: " + ", ".join(bits), highlight=False)


def _nodes_section(console: Console, run: RunRow, nodes: list[NodeRow]) -> None:
    """The nodes' exit codes, then the last lines of the node the failure names (or the first failed)."""
    n = Table(title="nodes", show_edge=False, title_justify="left")
    n.add_column("node")
    n.add_column("host")
    n.add_column("exit")
    for r in nodes:
        code = r.exit_code
        n.add_row(str(r.node_rank), r.host or "-",
                  Text("killed" if code is None else str(code), style="green" if code == 0 else "red"))
    console.print(n)
    failed = [r for r in nodes if r.exit_code not in (0,)]
    for r in named_node(run.failure, nodes) or failed[:1]:
        _last_lines(console, r)


def _last_lines(console: Console, r: NodeRow) -> None:
    from gpucluster.ledger.node_output import worker_lines

    lines = [ln for ln in worker_lines(r.last_lines or []) if "@gpucluster-metric" not in ln][-10:]
    if lines:
        console.print(Text(f"last lines of node {r.node_rank}:", style="bold"), highlight=False)
        for ln in lines:
            console.print(Text("  " + ln), highlight=False)


def named_node(failure: str | None, nodes: list[NodeRow]) -> list[NodeRow]:
    """The node the failure reason names first ("node 1 (...) exited ...", "setup failed on node 1"):
    its last lines show the cause; a node stopped because of it shows only the consequence."""
    import re

    m = re.search(r"\bnode (\d+)\b", failure or "")
    return [r for r in nodes if m and r.node_rank == int(m.group(1))][:1]


def resume_lines(console: Console, record: RunRecord) -> None:
    """--resume: the run this one continues, and the whole chain (one training job) it belongs to."""
    if record.run.resumed_from:
        console.print(f"resumed from {record.run.resumed_from}", highlight=False)
    laid = record.resume_files
    if laid:
        r = laid[0]
        console.print(f"resumed working folders: {r.get('files', 0)} file(s) from {r.get('from')} ({r.get('why')}) "
                      f"laid back into {len(laid)} node(s)", highlight=False)
    if len(record.chain) > 1:
        shown = " -> ".join(f"{r} (this run)" if r == record.id else r for r in record.chain)
        console.print(f"chain: {shown}", highlight=False)
    if record.attempts:
        attempts_table(console, record)


def attempts_table(console: Console, record: RunRecord) -> None:
    """A recovered chain, attempt by attempt: what interrupted each, the training redone, the cost."""
    t = Table(title="attempts", show_edge=False, title_justify="left")
    for col in ("#", "run", "status", "interrupted by", "redone (epochs)", "cost"):
        t.add_column(col, justify="right" if col in ("#", "redone (epochs)", "cost") else "left")
    for a in record.attempts or []:
        redo = a.get("recomputed_epochs")
        t.add_row(str(a.get("attempt")), str(a.get("run_id")), str(a.get("status")), str(a.get("interruption") or ""),
                  "" if redo is None else f"{redo:g}", "" if a.get("cost") is None else f"${a['cost']}")
    console.print(t)


def outputs_lines(console: Console, record: RunRecord) -> None:
    """Each node's copied-back outputs (files, size, verdict) and where they are."""
    import dataclasses

    from gpucluster.watch.outputs import COMPLETE, fmt_bytes, summary

    outputs = record.outputs
    if not outputs:
        return
    t = Table(title="outputs", show_edge=False, title_justify="left")
    for col in ("node", "files", "size", "copy", "verdict"):
        t.add_column(col, justify="right" if col in ("files", "size", "copy") else "left")
    for o in outputs:
        ok = o.verdict == COMPLETE
        t.add_row(str(o.node_rank), str(o.files or 0), fmt_bytes(o.bytes or 0),
                  fmt_secs(o.seconds), Text(str(o.verdict), style="green" if ok else "red"))
    console.print(t)
    for o in outputs:
        if o.verdict != COMPLETE and o.detail:
            console.print(Text(f"  node {o.node_rank}: {o.detail}", style="red"), highlight=False)
    console.print(f"outputs: {summary([dataclasses.asdict(o) for o in outputs])}", highlight=False)


TAG_SCAN = "every check by tag found nothing"
RUN_MARKS = "everything the run started gone, found by its run id"


def _verified_detail(cloud: str | None) -> str:
    """What a verified teardown rests on: for a backend that creates its machines (or a cloud the registry
    does not know), the tag scan; for machines that exist (local, ssh, kubernetes), the run's own marks:
    its processes, node folders or labelled objects, found by its run id."""
    from gpucluster.errors import UsageError
    from gpucluster.infra.contract import Capability
    from gpucluster.infra.registry import traits

    try:
        if cloud is None:  # a row without a cloud: a cloud the registry does not know
            raise UsageError("no cloud recorded")
        return TAG_SCAN if traits(cloud).can(Capability.PROVISIONS) else RUN_MARKS
    except UsageError:
        return TAG_SCAN


def teardown_lines(console, record: RunRecord) -> None:
    """The run's three-state teardown verdict, saying exactly what it rests on."""
    run = record.run
    verdict = run.teardown
    cluster = run.cluster
    if verdict == TeardownVerdict.VERIFIED:
        what = _verified_detail(run.cloud)
        console.print(Text(f"teardown: verified ({what})", style="green"), highlight=False)
        return
    if verdict in (TeardownVerdict.LEFTOVERS, TeardownVerdict.NOT_VERIFIED):
        style = "bold red"
        head = "LEFTOVERS: still existing" if verdict == TeardownVerdict.LEFTOVERS else "NOT VERIFIED: nothing found, but"
        console.print(Text(f"teardown: {head}" + ("" if verdict == TeardownVerdict.LEFTOVERS else
                                                   f" {len(run.unchecked or [])} check(s) could not run"),
                           style=style), highlight=False)
        for lo in run.leftovers or []:
            console.print(Text(f"  still exists: {lo.get('kind')} {lo.get('id')} {lo.get('region') or ''} "
                               f"{lo.get('detail') or ''}".rstrip(), style="red"), highlight=False)
        for line in run.unchecked or []:
            console.print(Text(f"  not checked: {line}", style="red"), highlight=False)
        console.print(Text(f"  finish or re-check it with: gpucluster down {cluster}", style="red"), highlight=False)
        if any(line.startswith(UNWITNESSED) for line in run.unchecked or []):
            console.print(Text("  a node without a witness: no check finds what the job detached there; look on it "
                               f"yourself, then: gpucluster down {cluster} --ack-unwitnessed", style="red"),
                          highlight=False)
        return
    if verdict == TeardownVerdict.KEPT:
        console.print(f"teardown: cluster kept (--keep); remove it with 'gpucluster down {cluster}'", highlight=False)
        return
    phase = record.phase("teardown")
    detail = phase.detail if phase else None
    console.print(f"teardown: {detail or 'not run'}", highlight=False)
