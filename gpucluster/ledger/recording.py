"""A run's record once its ledger row exists: a ledger write that fails (a full or read-only home,
a locked or damaged ledger) must never cut short what has to finish -- the copy of the outputs,
the provider's delete, the leftover check, the release of ssh sessions. `quietly` remembers the
first such failure on the recorder (`record_error`) instead of raising; the run then ends with
exit 3 and `record_line` (`gpucluster.lifecycle.steps`). While the job runs, `going_on` does the same for
its metric and phase records: a ledger that cannot take them does not stop a healthy job."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ParamSpec, Protocol, TypeVar

from gpucluster import domain
from gpucluster.ledger.store import Ledger, LedgerError
from gpucluster.states import JsonObject


P = ParamSpec("P")
T = TypeVar("T")


class Remembers(Protocol):
    """A run's recorder as `quietly` uses it: where the first failed ledger write is kept."""

    record_error: str | None


class Says(Protocol):
    def message(self, text: str, /) -> None: ...


class RemembersAndSays(Remembers, Protocol):
    """A recorder that also tells the person (`going_on`)."""

    @property
    def ui(self) -> Says: ...


class Spawns(Protocol):
    """A run's recorder as `launcher_rows` reads it: the ledger, the run, the processes the launcher started."""

    @property
    def ledger(self) -> Ledger: ...
    @property
    def run_id(self) -> str: ...
    @property
    def spawned(self) -> list[tuple[str, str]]: ...


def record_line(error: str, cluster: str) -> str:
    """The one line for a run whose record could not be written (exit 3)."""
    return (f"the run's record could not be written ({error}); teardown still ran: the next "
            f"`gpucluster down {cluster}` that can write closes the record")


def kept_line(error: str, cluster: str) -> str:
    """The one line for `up` whose cluster was made but whose record could not be written (exit 3)."""
    return (f"cluster {cluster} is up and kept, but its record could not be written ({error}); it bills until "
            f"`gpucluster down {cluster}`, which also closes the record once the home can be written")


@dataclass(frozen=True)
class Provisioned:
    """What `lifecycle.provision_only` made: the cluster, and why its record could not be written
    (then `up` ends with exit 3 and `kept_line`; the cluster is kept, as asked)."""

    cluster: domain.Cluster
    record_error: str | None = None


def quietly(rec: Remembers, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | None:
    """`fn(...)`, where a ledger write that fails is remembered on `rec` instead of raised (None)."""
    try:
        return fn(*args, **kwargs)
    except LedgerError as exc:
        if rec.record_error is None:
            rec.record_error = exc.message
        return None


def held_line(error: str) -> str:
    """What a person is told, once, when metric records cannot be written while the job runs: the
    real cause (another process's lock, a full disk, ...), and that nothing waits for it."""
    low = error.lower()
    if "locked" in low or "busy" in low:
        cause = ("the ledger is locked by another process (a sqlite3 shell, a backup?): close it; the records "
                 "wait in memory and are written when it lets go")
    else:
        cause = "make room in GPUCLUSTER_HOME (its node logs and outputs go there too)"
    return (f"the run's metric records cannot be written now ({error}): the job goes on and nothing waits for the "
            f"ledger; {cause}. A run whose records are never written ends with exit 3")


def going_on(rec: RemembersAndSays, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | None:
    """`quietly`, for the records written while the job runs (its metrics, its phases): a ledger
    that cannot take them does not stop a healthy job, which goes on; the person is told once, and
    the run ends with exit 3 and `record_line` (its record is incomplete)."""
    first = rec.record_error is None
    out = quietly(rec, fn, *args, **kwargs)
    if first and rec.record_error is not None:
        rec.ui.message(f"the run's record cannot be written ({rec.record_error}): the job goes on, its metrics "
                       "kept in memory only; it will end with exit 3. Make room in GPUCLUSTER_HOME (its node "
                       "logs and outputs go there too)")
    return out


class Quiet:
    """The recorder for the paths that must finish (outputs, teardown, its check): every call made
    through it goes through `quietly`, so a failing ledger write cannot cut them short."""

    def __init__(self, rec: Remembers):
        self._rec = rec

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._rec, name)
        if not callable(attr):
            return attr
        return lambda *a, **kw: quietly(self._rec, attr, *a, **kw)

    @property
    def rec(self) -> Remembers:
        return self._rec


def launcher_rows(rec: Spawns) -> list[tuple[str, str]]:
    """What a verified teardown closes besides the cloud's own rows: the processes the launcher
    started, and any other row a launcher wrote that is still open (a GKE job's Kubernetes objects
    whose delete failed went with the cluster the check has just found gone)."""
    rows = list(rec.spawned)
    try:
        run = rec.ledger.get_run(rec.run_id)
    except Exception:  # noqa: BLE001 - the spawned rows are still closed
        run = None
    for r in run.resources if run is not None else ():
        if r.kind in domain.LAUNCHER_KINDS and not r.confirmed_gone and (r.kind, r.name) not in rows:
            rows.append((r.kind, r.name))
    return rows


class MetricBuffer:
    """A run's metric records on their way to the ledger, never waiting on another process's lock.

    A write waits at most BUSY_S for a lock another process holds (a sqlite3 shell, a backup): the
    node log readers and the time limit run on the threads that report metrics, and a ledger held
    for minutes made each record wait out SQLite's 30 s (issue 45 item 2: a --max-minutes 1 run
    lasted 265 s). Records that could not be written wait in memory (at most KEEP), are tried again
    with the next record once RETRY_S has passed, and once more, with the usual patience, when the
    job has ended (`flush`)."""

    BUSY_S = 0.2
    RETRY_S = 5.0
    KEEP = 200_000

    def __init__(self, ledger: Ledger, run_id: str):
        import threading

        self.ledger, self.run_id = ledger, run_id
        self.pending: list[tuple[int | None, JsonObject]] = []
        self.dropped = 0
        self.why: str | None = None  # the first write that failed, said once
        self._retry_at = 0.0
        self._lock = threading.Lock()

    @property
    def held(self) -> bool:
        return bool(self.pending or self.dropped)

    def add(self, node_rank: int | None, record: JsonObject, say: Callable[[str], None] | None = None) -> None:
        """Write the record (and any kept in memory). When it could not (they stay kept): `say` the
        cause once (`held_line`), or, without `say`, LedgerError."""
        try:
            self._add(node_rank, record)
        except LedgerError as exc:
            if say is None:
                raise
            if self.why is None:
                self.why = exc.message
                say(held_line(exc.message))

    def _add(self, node_rank: int | None, record: JsonObject) -> None:
        import time

        with self._lock:
            if len(self.pending) < self.KEEP:
                self.pending.append((node_rank, record))
            else:
                self.dropped += 1
            if time.monotonic() < self._retry_at:
                return
            batch, self.pending = self.pending, []
            try:
                self.ledger.add_metrics(self.run_id, batch, busy_s=self.BUSY_S)
            except LedgerError:
                self.pending = batch + self.pending
                self._retry_at = time.monotonic() + self.RETRY_S
                raise
            self._retry_at = 0.0

    def flush(self, say: Callable[[str], None] | None = None) -> None:
        """The records kept in memory, written with the usual patience (LedgerError when they cannot be)."""
        with self._lock:
            if not self.held:
                return
            if self.pending:
                self.ledger.add_metrics(self.run_id, self.pending)
                self.pending = []
            if say is not None and self.why and not self.dropped:
                say("the ledger took the metric records kept in memory (no record of the job's is missing)")
            if self.dropped:
                raise LedgerError(f"{self.dropped} metric record(s) over the {self.KEEP} kept in memory while "
                                  "the ledger could not be written were dropped")
