"""A run's record once its ledger row exists: a ledger write that fails (a full or read-only home,
a locked or damaged ledger) must never cut short what has to finish -- the copy of the outputs,
the provider's delete, the leftover check, the release of ssh sessions. `quietly` remembers the
first such failure on the recorder (`record_error`) instead of raising; the run then ends with
exit 3 and `record_line` (`gpucluster.lifecycle`). While the job runs, `going_on` does the same for
its metric and phase records: a ledger that cannot take them does not stop a healthy job."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpucluster import domain
from gpucluster.ledger import LedgerError


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

    cluster: Any
    record_error: str | None = None


def quietly(rec: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
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


def going_on(rec: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
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

    def __init__(self, rec: Any):
        self._rec = rec

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._rec, name)
        if not callable(attr):
            return attr
        return lambda *a, **kw: quietly(self._rec, attr, *a, **kw)

    @property
    def rec(self) -> Any:
        return self._rec


def launcher_rows(rec: Any) -> list[tuple[str, str]]:
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
