"""Parse metric records out of streamed node logs; keep the latest state for progress displays.

A metric line comes from the user's script: it is data, never trusted. A record whose fields have
the wrong type or an out-of-range value is refused (`check_record` says why) and counted, never
acted on; the world size and the ranks that must report are what gpucluster launched."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

from gpucluster.states import JsonObject
from gpucluster.workloads.protocol import PREFIX


MAX_COUNT = 1 << 53  # integers (epochs, steps, ranks, sizes) above this are not believable counts
MAX_RANKS = 1 << 20  # ranks and world sizes: far beyond any torchrun job
MAX_KEYS = 256
# field -> the most it may be: whole numbers >= 0
_COUNTS = {"rank": MAX_RANKS, "world_size": MAX_RANKS, "node_rank": MAX_RANKS, "local_rank": MAX_RANKS,
           "epoch": MAX_COUNT, "step": MAX_COUNT, "epochs": MAX_COUNT, "samples_seen": MAX_COUNT,
           "global_batch": MAX_COUNT, "bytes": MAX_COUNT, "resumed_from_epoch": MAX_COUNT}
# fields that must be numbers (a diverged loss may be NaN or infinite: that is a value, not an attack)
_FIGURES = ("time", "loss", "accuracy", "samples_per_s", "train_time_s", "epoch_time_s", "compute_s", "comm_s",
            "data_s", "seconds", "cpu_percent", "lr")


def check_record(record: object) -> str | None:
    """Why a metric record cannot be used (a one-line reason), or None when it can."""
    if not isinstance(record, dict):
        return f"not a JSON object ({type(record).__name__})"
    kind = record.get("kind")
    if not isinstance(kind, str) or not 0 < len(kind) <= 64:
        return "'kind' is not a short string"
    if len(record) > MAX_KEYS:
        return f"{len(record)} fields (at most {MAX_KEYS})"
    for key, most in _COUNTS.items():
        value = record.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{key!r} is {type(value).__name__} {_short(value)}, not a whole number"
        if not 0 <= value <= most:
            return f"{key!r} is {_short(value)}, outside 0..{most}"
    for key in _FIGURES:
        value = record.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return f"{key!r} is {type(value).__name__} {_short(value)}, not a number"
        if isinstance(value, int) and abs(value) > MAX_COUNT:
            return f"{key!r} is {_short(value)}, out of range"
    return None


KEEP = 2000  # the most epoch / util records kept in memory (the ledger has them all)


def _bound(records: list[JsonObject]) -> None:
    if len(records) > 2 * KEEP:
        del records[:-KEEP]


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_line(line: str) -> JsonObject | str | None:
    """The metric record in a log line (a dict); why the line's record was refused (a str); or None
    when the line carries no metric. Tolerates prefixes added by launchers/torchrun."""
    i = line.find(PREFIX)
    if i < 0:
        return None
    try:
        record = json.loads(line[i + len(PREFIX):])
    except (ValueError, RecursionError) as exc:
        return f"not JSON ({str(exc).splitlines()[0][:60] if str(exc) else type(exc).__name__})"
    problem = check_record(record)
    return problem if problem else record


def parse_line(line: str) -> JsonObject | None:
    """The metric record in a log line, or None (no metric, or one `check_record` refuses)."""
    got = read_line(line)
    return got if isinstance(got, dict) else None


@dataclass
class MetricsState:
    """What a progress display and a run report need, updated record by record."""

    epoch: int | None = None
    step: int | None = None
    loss: float | None = None
    accuracy: float | None = None
    samples_per_s: float | None = None
    world_size: int | None = None
    epochs: list[JsonObject] = field(default_factory=list)
    finals: dict[int, JsonObject] = field(default_factory=dict)  # rank -> final record
    start: JsonObject | None = None
    util: list[JsonObject] = field(default_factory=list)
    launched_world: int | None = None  # the ranks gpucluster started: what the script says never overrides it
    text: dict[int, JsonObject] = field(default_factory=dict)  # node -> its newest loss/accuracy line (text_metrics)
    refused: int = 0  # metric lines refused (bad JSON, wrong types, values out of range)
    first_refusal: str | None = None
    # the process-group hook (gpucluster/node/node_pghook.py): the ranks whose Python loaded it, those that joined a group
    pg_hooked: set[int] = field(default_factory=set)
    pg_joined: dict[int, JsonObject] = field(default_factory=dict)

    def refuse(self, why: str) -> None:
        self.refused += 1
        if self.first_refusal is None:
            self.first_refusal = why

    def update(self, record: JsonObject, node_rank: int | None = None) -> None:
        problem = check_record(record) or self._beyond_launched(record)
        if problem is not None:
            self.refuse(problem)
            return
        take = _KINDS.get(record["kind"])  # check_record: the kind is a string
        if take is not None:
            take(self, record, node_rank)

    def _beyond_launched(self, record: JsonObject) -> str | None:
        """Why a record names more ranks than gpucluster launched (a rank, a world size), or None."""
        if self.launched_world is None:
            return None
        if isinstance(record.get("rank"), int) and record["rank"] >= self.launched_world:
            return f"'rank' is {record['rank']}, but the job has {self.launched_world} ranks"
        if record.get("kind") == "world" and isinstance(record.get("world_size"), int) \
                and record["world_size"] > self.launched_world:
            return f"'world_size' is {record['world_size']}, but the job has {self.launched_world} ranks"
        return None

    def _on_start(self, record: JsonObject, node_rank: int | None) -> None:
        if self.start is None:
            self.start = record
        if self.launched_world is not None:
            self.world_size = self.launched_world
        else:
            self.world_size = record.get("world_size", self.world_size)

    def _on_epoch(self, record: JsonObject, node_rank: int | None) -> None:
        self.epochs.append(record)
        _bound(self.epochs)
        self._take(record)

    def _on_step(self, record: JsonObject, node_rank: int | None) -> None:
        self._take(record)

    def _on_final(self, record: JsonObject, node_rank: int | None) -> None:
        rank = record.get("rank")
        if isinstance(rank, int):
            self.finals[rank] = record

    def _on_world(self, record: JsonObject, node_rank: int | None) -> None:
        """A worker's process group size, as its framework printed it."""
        self.world_size = max(self.world_size or 0, int(record.get("world_size") or 0)) or None

    def _on_pg_join(self, record: JsonObject, node_rank: int | None) -> None:
        if isinstance(record.get("rank"), int):  # the hook: the rank joined a process group
            self.pg_joined.setdefault(record["rank"], record)

    def _on_pg_hook(self, record: JsonObject, node_rank: int | None) -> None:
        if isinstance(record.get("rank"), int):
            self.pg_hooked.add(record["rank"])

    def _on_text_metric(self, record: JsonObject, node_rank: int | None) -> None:
        if node_rank is not None:  # read from a printed line (text_metrics)
            self.text[node_rank] = record

    def _on_util(self, record: JsonObject, node_rank: int | None) -> None:
        rec = dict(record)
        if node_rank is not None:
            rec.setdefault("node_rank", node_rank)
        self.util.append(rec)
        _bound(self.util)

    def _take(self, record: JsonObject) -> None:
        for key in ("epoch", "step", "loss", "accuracy", "samples_per_s"):
            if record.get(key) is not None:
                setattr(self, key, record[key])

    def summary(self) -> JsonObject:
        """Final figures: from rank 0's final record when present, else the last epoch."""
        final = self.finals.get(0) or {}
        last = self.epochs[-1] if self.epochs else {}
        out = {
            "epochs": final.get("epochs", last.get("epoch")),
            "loss": final.get("loss", last.get("loss")),
            "accuracy": final.get("accuracy", last.get("accuracy")),
            "samples_per_s": final.get("samples_per_s", last.get("samples_per_s")),
            "train_time_s": final.get("train_time_s"),
            "world_size": self.world_size,
            "final_records": len(self.finals),
            "refused_metric_lines": self.refused or None,
            # ranks that joined a process group; 0 only when every rank launched loaded the hook (else not known)
            "pg_ranks": len(self.pg_joined) if self.pg_joined else 0 if self.launched_world and
            len(self.pg_hooked) >= self.launched_world else None,
            "pg_hooked": len(self.pg_hooked) or None,
            # the largest group a rank joined (1 on every rank of a multi-node run: each node trained alone)
            "pg_world_size": max((r.get("world_size") or 0 for r in self.pg_joined.values()), default=0) or None,
        }
        if not self.finals and not self.epochs and self.text:
            # the job reported no metric records: the newest loss/accuracy it printed (lowest node)
            node = min(self.text)
            said = self.text[node]
            out.update({k: said.get(k) for k in ("loss", "accuracy", "loss_name", "accuracy_name")})
            out.update(metrics_source="text", text_node=node)
        return {k: v for k, v in out.items() if v is not None}


# what each kind of record does to the state (`MetricsState.update`); other kinds are kept by the ledger only
_KINDS: dict[str, Callable[[MetricsState, JsonObject, int | None], None]] = {
    "start": MetricsState._on_start, "epoch": MetricsState._on_epoch, "step": MetricsState._on_step,
    "final": MetricsState._on_final, "world": MetricsState._on_world, "pg_join": MetricsState._on_pg_join,
    "pg_hook": MetricsState._on_pg_hook, "text_metric": MetricsState._on_text_metric, "util": MetricsState._on_util,
}
