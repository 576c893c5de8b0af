"""Issue 45 item 2: a ledger another process holds (a `sqlite3` shell in a transaction, a backup)
must not stall the run. Each metric record used to wait out SQLite's 30 s busy timeout on the thread
that also reads the node logs and enforces --max-minutes (a --max-minutes 1 run lasted 265 s with
a lock held 240 s), and a 60 s lock made a finished run exit 3 "could not be written" although
every record was written in the end. The lock here is real: a second SQLite connection holding
BEGIN EXCLUSIVE (https://www.sqlite.org/lang_transaction.html: no other connection may read or
write; in WAL mode writers are blocked), released by the test."""

from __future__ import annotations

import sqlite3
import time

import pytest

from gpucluster.ledger.store import Ledger, LedgerError
from gpucluster.lifecycle.steps import RunLedger
from gpucluster.ledger.recording import MetricBuffer, held_line

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

RID = "r20261128-000000-abcdef"


def _book(home) -> tuple[Ledger, RunLedger]:
    ledger = Ledger(home / "ledger.sqlite3")
    ledger.create_run(RID, cloud="local", cluster="c", nodes=1, gpus_per_node=0, command=["x"], spec={})
    return ledger, RunLedger(ledger, RID, None)


def test_metrics_never_wait_on_another_process_lock_and_are_written_once_it_lets_go(home):
    ledger, book = _book(home)
    other = sqlite3.connect(str(home / "ledger.sqlite3"), isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        start = time.monotonic()
        with pytest.raises(LedgerError, match="locked"):
            book.metrics.add(0, {"kind": "step", "time": 1.0, "step": 1})
        for i in range(2, 51):  # within METRIC_RETRY_S: not even tried, kept
            book.metrics.add(0, {"kind": "step", "time": float(i), "step": i})
        took = time.monotonic() - start
        assert took < 2.0, f"50 records took {took:.1f} s while the ledger was locked (each used to wait 30 s)"
        assert len(book.metrics.pending) == 50
    finally:
        other.execute("COMMIT")
        other.close()
    book.metrics.flush()  # the job has ended: the usual patience, and the lock is gone
    assert [r["step"] for r in ledger.metrics(RID, kind="step")] == list(range(1, 50 + 1))
    assert book.metrics.pending == []


def test_a_retry_after_the_lock_writes_what_was_kept(home, monkeypatch):
    ledger, book = _book(home)
    monkeypatch.setattr(MetricBuffer, "RETRY_S", 0.0)
    other = sqlite3.connect(str(home / "ledger.sqlite3"), isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    with pytest.raises(LedgerError):
        book.metrics.add(0, {"kind": "step", "time": 1.0, "step": 1})
    other.execute("COMMIT")
    other.close()
    book.metrics.add(0, {"kind": "step", "time": 2.0, "step": 2})  # the next record carries the kept one
    assert [r["step"] for r in ledger.metrics(RID, kind="step")] == [1, 2] and book.metrics.pending == []


def test_the_warning_names_the_cause():
    locked = held_line("ledger '/h/ledger.sqlite3' is locked by another process for too long (database is locked)")
    assert "the ledger is locked by another process (a sqlite3 shell, a backup?)" in locked
    assert "make room" not in locked and "nothing waits for the ledger" in locked
    full = held_line("ledger '/h/ledger.sqlite3' cannot be used: database or disk is full")
    assert "make room in GPUCLUSTER_HOME" in full
