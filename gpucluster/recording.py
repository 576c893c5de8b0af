"""A run's record once its ledger row exists: a ledger write that fails (a full or read-only home,
a locked or damaged ledger) must never cut short what has to finish -- the copy of the outputs,
the provider's delete, the leftover check, the release of ssh sessions. `quietly` remembers the
first such failure on the recorder (`record_error`) instead of raising; the run then ends with
exit 3 and `record_line` (`gpucluster.lifecycle`)."""

from __future__ import annotations

from typing import Any

from gpucluster.ledger import LedgerError


def record_line(error: str, cluster: str) -> str:
    """The one line for a run whose record could not be written (exit 3)."""
    return (f"the run's record could not be written ({error}); teardown still ran: the next "
            f"`gpucluster down {cluster}` that can write closes the record")


def quietly(rec: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """`fn(...)`, where a ledger write that fails is remembered on `rec` instead of raised (None)."""
    try:
        return fn(*args, **kwargs)
    except LedgerError as exc:
        if rec.record_error is None:
            rec.record_error = exc.message
        return None


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
