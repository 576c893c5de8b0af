"""Parse metric records out of streamed node logs; keep the latest state for progress displays."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gpucluster.workloads.protocol import PREFIX


def parse_line(line: str) -> dict[str, Any] | None:
    """The metric record in a log line, or None. Tolerates prefixes added by launchers/torchrun."""
    i = line.find(PREFIX)
    if i < 0:
        return None
    try:
        record = json.loads(line[i + len(PREFIX):])
    except ValueError:
        return None
    return record if isinstance(record, dict) and "kind" in record else None


@dataclass
class MetricsState:
    """What a progress display and a run report need, updated record by record."""

    epoch: int | None = None
    step: int | None = None
    loss: float | None = None
    accuracy: float | None = None
    samples_per_s: float | None = None
    world_size: int | None = None
    epochs: list[dict[str, Any]] = field(default_factory=list)
    finals: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> final record
    start: dict[str, Any] | None = None
    util: list[dict[str, Any]] = field(default_factory=list)

    def update(self, record: dict[str, Any], node_rank: int | None = None) -> None:
        kind = record.get("kind")
        if kind == "start":
            if self.start is None:
                self.start = record
            self.world_size = record.get("world_size", self.world_size)
        elif kind == "epoch":
            self.epochs.append(record)
            self._take(record)
        elif kind == "step":
            self._take(record)
        elif kind == "final":
            rank = record.get("rank")
            if isinstance(rank, int):
                self.finals[rank] = record
        elif kind == "world":  # a worker's process group size, as its framework printed it
            self.world_size = max(self.world_size or 0, int(record.get("world_size") or 0)) or None
        elif kind == "util":
            rec = dict(record)
            if node_rank is not None:
                rec.setdefault("node_rank", node_rank)
            self.util.append(rec)

    def _take(self, record: dict[str, Any]) -> None:
        for key in ("epoch", "step", "loss", "accuracy", "samples_per_s"):
            if record.get(key) is not None:
                setattr(self, key, record[key])

    def summary(self) -> dict[str, Any]:
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
        }
        return {k: v for k, v in out.items() if v is not None}
