"""Loss and accuracy read from a job's own printed lines, for scripts that do not speak the metric
protocol: "loss=0.31", "loss: 0.3120", "Epoch 3 | loss 0.21 | acc 91.2%", Keras' "loss: 0.3120 -
accuracy: 0.9120", PyTorch Lightning's progress bar ("... 90.1it/s, v_num=0, train_loss=0.310,
val_acc=0.910]"). What is found becomes a `text_metric` record (checked like any metric record,
marked `source: text`) that the run's summary uses only when the job reported no metric records
of its own, so `result:` shows something for an unmodified script.

It is a reading of free text, never trusted further: a value is taken only right after a name
that is exactly loss / acc / accuracy (optionally with a train/val/test/eval prefix), at most the
last LINE_CAP bytes of a line are looked at, and a node sends at most one such line a second to
the supervisor (the newest; the last one is sent when the node's output ends)."""

from __future__ import annotations

import math
import re
import time
from typing import Callable

from gpucluster.states import JsonObject
from gpucluster.watch.metrics import check_record

TEXT_KIND = "text_metric"
LINE_CAP = 4096  # bytes of a line looked at (its end: a progress bar's newest state)
EVERY_S = 1.0  # at most one text metric line per node stream per this many seconds
MAX_WORLD_LINES = 64  # framework start lines passed on per stream (one per rank is enough)

_PREFIX = r"(?:(train|training|val|valid|validation|test|eval)[_/ ]?)?"
_NAME = r"(loss|acc|accuracy)"
_NUMBER = r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)"
# name, then '=', ':' or blanks, then a number (a '%' after it makes it a percentage)
_PAIR = re.compile(r"(?<![A-Za-z0-9_])" + _PREFIX + _NAME + r"(?![A-Za-z0-9_])\s{0,3}[=:]?\s{0,3}"
                   + _NUMBER + r"(?![A-Za-z0-9_.])(\s?%)?", re.IGNORECASE)
_EPOCH = re.compile(r"(?<![A-Za-z0-9_])epoch(?![A-Za-z0-9_])\s{0,3}[=:\[#]?\s{0,3}(\d{1,9})(?!\d)", re.IGNORECASE)
_WORLD_HINT = b"Initializing distributed"
_METRIC_PREFIX = b"@gpucluster-metric "
_EVAL = {"val", "valid", "validation", "test", "eval"}


def _hinted(data: bytes) -> bool:
    """Whether `data` may hold a figure: "loss" or "acc" in any case (plain byte searches; a
    case-blind regex search is ten times slower on output that holds neither)."""
    low = data.lower()
    return b"loss" in low or b"acc" in low


def text_record(line: str) -> JsonObject | None:
    """A `text_metric` record from one printed line, or None when the line holds no loss or
    accuracy value. Training loss is preferred to a validation loss; for accuracy the
    validation/test figure is preferred. Accuracy is a fraction: "91.2%" and "acc 91.2" give 0.912."""
    text = line[-LINE_CAP:]
    if "\r" in text:  # a progress bar redrawn in place: its newest state
        text = next((seg for seg in reversed(text.split("\r")) if seg.strip()), "")
    found: dict[str, tuple[int, float, str]] = {}  # field -> (preference, value, name as printed)
    for n, m in enumerate(_PAIR.finditer(text)):
        if n >= 16:
            break
        figure = _figure((m.group(1) or "").lower(), m.group(2).lower(), float(m.group(3)), bool(m.group(4)))
        if figure is None:
            continue
        field, rank, value = figure
        if field not in found or rank <= found[field][0]:  # the preferred name; among equals the last
            found[field] = (rank, value, text[m.start():m.end(2)])
    if not found:
        return None
    record: JsonObject = {"kind": TEXT_KIND, "source": "text", "time": time.time()}
    for field, (_, value, printed) in found.items():
        record[field] = value
        record[f"{field}_name"] = printed[:40]
    epoch = _EPOCH.search(text)
    if epoch:
        record["epoch"] = int(epoch.group(1))
    return record if check_record(record) is None else None


def _figure(prefix: str, name: str, value: float, percent: bool) -> tuple[str, int, float] | None:
    """(field, preference: lower is preferred, value) of one name and number found in a line; None
    when the figure is not believable (a loss in percent, an accuracy negative, not finite or over 100 %)."""
    if name == "loss":
        if percent:
            return None
        return "loss", 0 if prefix not in _EVAL else 1, value
    if not math.isfinite(value) or value < 0:
        return None
    if percent or value > 1:
        if value > 100:
            return None
        value /= 100
    return "accuracy", 0 if prefix in _EVAL else 1, value


class TextScan:
    """One node stream's lines worth handing to the supervisor, picked in that stream's reader
    thread: a framework's start line (Lightning's "Initializing distributed: ... MEMBER: r/N"), and
    the newest line with a loss or accuracy at most once per `every` seconds. Cheap when nothing
    matches: a read without "loss" or "acc" in it is never split into lines."""

    def __init__(self, every: float = EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self.clock = clock
        self.pending: str | None = None
        self.sent_at: float | None = None
        self.worlds = 0

    def lines(self, run: bytes) -> list[str]:
        out: list[str] = []
        if _WORLD_HINT in run:
            for raw in run.split(b"\n"):
                if _WORLD_HINT in raw and _METRIC_PREFIX not in raw and self.worlds < MAX_WORLD_LINES:
                    self.worlds += 1
                    out.append(raw[-LINE_CAP:].decode("utf-8", "replace").rstrip("\r"))
        if _hinted(run):
            for raw in reversed(run.split(b"\n")):  # the newest line that holds a figure is all we keep
                if _METRIC_PREFIX in raw or _WORLD_HINT in raw or not _hinted(raw):
                    continue
                line = raw[-LINE_CAP:].decode("utf-8", "replace")
                if text_record(line) is not None:
                    self.pending = line
                    break
        now = self.clock()
        if self.pending is not None and (self.sent_at is None or now - self.sent_at >= self.every):
            out.append(self.pending)
            self.pending, self.sent_at = None, now
        return out

    def close(self) -> list[str]:
        """The newest line not yet handed over (the job's last figures), when the stream ends."""
        rest, self.pending = self.pending, None
        return [rest] if rest is not None else []


# PyTorch Lightning, when its process group is up: "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2"
_LIGHTNING_WORLD = re.compile(r"Initializing distributed: GLOBAL_RANK: (\d+), MEMBER: \d+/(\d+)")


def world_record(line: str) -> JsonObject | None:
    """A `world` record (a worker's process-group size) from a framework's own start line, so a
    multi-node run whose ranks never formed one group (every world size 1) can be warned about."""
    m = _LIGHTNING_WORLD.search(line)
    return {"kind": "world", "rank": int(m.group(1)), "world_size": int(m.group(2)), "source": "lightning"} if m else None
