"""Issue 45 item 3: the ledger must not be a shared-memory map that can fault.

In WAL mode every SQLite connection maps the index file `ledger.sqlite3-shm` into memory
(https://www.sqlite.org/walformat.html, "the wal-index ... is usually a memory-mapped file"). When
that file's pages can no longer be backed, the next access to the map is SIGBUS (mmap(2): "SIGBUS
Attempted access to a page of the buffer that lies beyond the end of the mapped file"), which no
Python code can catch: the campaign saw gpucluster die silently mid-run when the home's file system
turned read-only, with no teardown, its workers re-parented to init and the row `running` for ever.
A file system going read-only cannot be staged here (remounting a file system with files open for
writing is refused, EBUSY), so the fault is the other documented trigger: another process
truncating the -shm file while the run uses it. With the rollback journal the ledger maps nothing,
and the same run ends normally."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

sys.path.insert(0, str(Path(__file__).parent))
from conftest import gpucluster_argv, needs_torch, run_cli  # noqa: E402
from gpucluster.ledger.store import Ledger  # noqa: E402


def _journal_mode(path: Path) -> str:
    db = sqlite3.connect(str(path))
    try:
        return str(db.execute("PRAGMA journal_mode").fetchone()[0]).lower()
    finally:
        db.close()


def _as_wal(path: Path) -> None:
    """The ledger as an older gpucluster left it: WAL, persistent in the file's header."""
    db = sqlite3.connect(str(path))
    db.execute("PRAGMA journal_mode = WAL")
    db.close()


def test_a_new_ledger_uses_a_rollback_journal_and_maps_nothing(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    ledger = Ledger(path)
    ledger.create_run("r1", cloud="local", cluster="c", nodes=1, gpus_per_node=0, command=["x"], spec={})
    assert _journal_mode(path) == "delete"
    assert not Path(f"{path}-shm").exists()
    maps = Path("/proc/self/maps").read_text()
    assert f"{path}-shm" not in maps


def test_a_wal_ledger_is_moved_back_when_alone_and_kept_while_another_holds_it(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    Ledger(path).close()
    _as_wal(path)
    other = sqlite3.connect(str(path))  # an older gpucluster, still running, holds it open in WAL
    other.execute("SELECT 1 FROM runs").fetchall()
    try:
        ledger = Ledger(path)  # must open and work, not fail or wait on the other's WAL
        ledger.create_run("r1", cloud="local", cluster="c", nodes=1, gpus_per_node=0, command=["x"], spec={})
        assert _journal_mode(path) == "wal"
        ledger.close()
    finally:
        other.close()
    Ledger(path).close()  # alone now
    assert _journal_mode(path) == "delete"
    assert not Path(f"{path}-shm").exists() and not Path(f"{path}-wal").exists()
    assert Ledger(path).get_run("r1") is not None


@needs_torch
@pytest.mark.slow
def test_a_run_survives_another_process_truncating_the_ledgers_shared_memory(tmp_path):
    """A real local run through the CLI while a hostile process truncates `ledger.sqlite3-shm`
    whenever it exists. On the WAL ledger (before issue 45 item 3) the CLI died of SIGBUS (exit
    -7) with the row left `running`; now there is no such file and no mapping, and the run ends
    succeeded and verified. The home starts as an older gpucluster left it (WAL)."""
    home = tmp_path / "home"
    env = dict(os.environ, GPUCLUSTER_HOME=str(home), COLUMNS="200")
    assert run_cli("runs", env={"GPUCLUSTER_HOME": str(home)}).returncode == 0
    ledger_path = home / "ledger.sqlite3"
    _as_wal(ledger_path)
    shm = Path(f"{ledger_path}-shm")
    script = "import time\nfor i in range(6):\n    print('step', i, flush=True)\n    time.sleep(1)\n"
    proc = subprocess.Popen(gpucluster_argv("run", "--cloud", "local", "--nodes", "1", "--yes", "--",
                                            sys.executable, "-c", script),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    truncated = mapped = 0
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if shm.exists():
                os.truncate(shm, 0)
                truncated += 1
            try:
                if str(shm) in Path(f"/proc/{proc.pid}/maps").read_text():
                    mapped += 1
            except OSError:
                pass
            time.sleep(0.05)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, (proc.returncode, err[-2000:])
    assert mapped == 0 and truncated == 0, (mapped, truncated)
    runs = Ledger(ledger_path).list_runs()
    assert len(runs) == 1 and runs[0].status == "succeeded" and runs[0].teardown == "verified"
    assert _journal_mode(ledger_path) == "delete"
