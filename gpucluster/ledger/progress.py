"""Live progress of provisioning and teardown, read from the ledger's resource rows.

The Pulumi engine's events already become ledger rows as they happen (`infra.pulumi.events` ->
`lifecycle.LedgerEvents`): a row is written when a resource is requested, stamped when it is
created and when it is confirmed deleted. `ResourceWatch` reads those rows (on a connection of its
own, from the console's refresh thread) and says, in one line:

    provision: 9 created, 2 in flight, instance 1 of 2; slowest: instance demo-1 (48s)
    teardown:  7 of 9 deleted; waiting on: instance demo-1, subnet demo-subnet

"of 2" is what the plan said the run creates of a kind (`Pricing.planned_resources`: the priced
kinds, e.g. one instance per node); Pulumi itself announces a resource only when it starts on it,
so no total of every resource is known before the end. The rows of the job's processes (kind
"process") and of a GKE job's Kubernetes objects (`k8s-*`), closed after the launcher's check, are not
cloud resources and are left out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from gpucluster.domain import LAUNCHER_KINDS  # rows the launcher writes (processes, a job's k8s objects)
from gpucluster.states import JsonMapping

if TYPE_CHECKING:
    from gpucluster.ledger.store import Ledger


@dataclass(frozen=True)
class _Row:
    kind: str
    name: str
    requested_at: float
    created_at: float | None
    gone: bool


def _fmt(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s"


def _plural(kind: str, n: int) -> str:
    return kind if n == 1 else f"{kind}s"


class ResourceWatch:
    """`line(phase)` -> one line of progress for "provision" and "teardown" (None otherwise, or
    before anything is known). `rows()` is how the rows are read: the run's rows (`run_id`), or
    for `down` the open rows of `cluster` (any run). It reads at most once every `every` seconds."""

    def __init__(self, rows: Callable[[], list[_Row]], *, planned: Mapping[str, int] | None = None,
                 clock: Callable[[], float] = time.time, every: float = 1.0):
        self._rows = rows
        self.planned = dict(planned or {})
        self.clock = clock
        self.every = every
        self._at = -1e18
        self._cached: list[_Row] = []
        self._teardown_from: set[tuple[str, str]] | None = None  # what was open when teardown began

    # -- constructors ---------------------------------------------------------------------------
    @classmethod
    def for_run(cls, ledger_path: Path | str, run_id: str, planned: Mapping[str, int] | None = None) -> "ResourceWatch":
        """The rows of one run (`run`, `up`, `exec`), read on a connection of its own."""
        reader = _Reader(ledger_path)

        def rows() -> list[_Row]:
            return [r for r in reader.run_rows(run_id) if r.kind not in LAUNCHER_KINDS]

        return cls(rows, planned=planned)

    @classmethod
    def for_cluster(cls, ledger_path: Path | str, cluster: str) -> "ResourceWatch":
        """`down`: the cluster's open rows of every run; a row that closes is a deletion done."""
        reader = _Reader(ledger_path)
        seen: dict[tuple[str, str], _Row] = {}

        def rows() -> list[_Row]:
            now_open = {(r.kind, r.name): r for r in reader.cluster_rows(cluster) if r.kind not in LAUNCHER_KINDS}
            for key, row in now_open.items():
                seen.setdefault(key, row)
            return [now_open.get(k) or _Row(r.kind, r.name, r.requested_at, r.created_at, True)
                    for k, r in seen.items()]

        return cls(rows)

    # -- reading ----------------------------------------------------------------------------------
    def _current(self) -> list[_Row]:
        now = self.clock()
        if now - self._at >= self.every:
            try:
                self._cached = self._rows()
            except Exception:  # noqa: BLE001 - progress is a display: a busy or locked ledger shows the last read
                pass
            self._at = now
        return self._cached

    def line(self, phase: str) -> str | None:
        if phase == "provision":
            return self._provision(self._current())
        if phase == "teardown":
            return self._teardown(self._current())
        return None

    def _provision(self, rows: list[_Row]) -> str | None:
        if not rows and not self.planned:
            return None
        now = self.clock()
        done = [r for r in rows if r.created_at is not None]
        flying = sorted((r for r in rows if r.created_at is None and not r.gone), key=lambda r: r.requested_at)
        parts = [f"{len(done)} created"] if rows else ["waiting for the first resource"]
        if flying:
            parts[0] += f", {len(flying)} in flight"
        for kind, want in sorted(self.planned.items()):
            got = sum(1 for r in done if r.kind == kind)
            parts[0] += f", {kind} {got} of {want}"
        if flying:
            slow = flying[0]
            parts.append(f"slowest: {slow.kind} {slow.name} ({_fmt(now - slow.requested_at)})")
        return "; ".join(parts)

    def _teardown(self, rows: list[_Row]) -> str | None:
        if self._teardown_from is None:
            self._teardown_from = {(r.kind, r.name) for r in rows if not r.gone}
        todo = [r for r in rows if (r.kind, r.name) in self._teardown_from]
        if not todo:
            return None
        left = [r for r in todo if not r.gone]
        text = f"{len(todo) - len(left)} of {len(todo)} deleted"
        if left:
            shown = ", ".join(f"{r.kind} {r.name}" for r in left[:3])
            more = f" and {len(left) - 3} more" if len(left) > 3 else ""
            text += f"; waiting on: {shown}{more}"
        return text


def planned_counts(rows: Sequence[JsonMapping]) -> dict[str, int]:
    """{kind: how many} of a plan's resource rows (`Pricing.planned_resources`)."""
    out: dict[str, int] = {}
    for r in rows:
        out[str(r["kind"])] = out.get(str(r["kind"]), 0) + 1
    return out


class _Reader:
    """The ledger's resource rows through a `Ledger` of this watch's own (it is read from the
    console's refresh thread while the run writes through its own). Opened at the first read."""

    def __init__(self, path: Path | str):
        self.path = path
        self._ledger: Ledger | None = None

    def _open(self) -> Ledger:
        if self._ledger is None:
            from gpucluster.ledger.store import Ledger

            self._ledger = Ledger(self.path)
        return self._ledger

    def run_rows(self, run_id: str) -> list[_Row]:
        record = self._open().get_run(run_id)
        return [] if record is None else [
            _Row(r.kind, r.name, float(r.requested_at or 0), r.created_at, bool(r.confirmed_gone))
            for r in record.resources]

    def cluster_rows(self, cluster: str) -> list[_Row]:
        return [_Row(r["kind"], r["name"], float(r["requested_at"] or 0), r["created_at"], False)
                for r in reversed(self._open().open_resources(cluster))]
