"""Issue 45 item 11 beyond `run`: a ledger deleted while `exec` or `sweep` writes into it. SQLite
goes on writing into the unlinked file, so each command "succeeded", exit 0, and its records were
gone with the file. Each command now checks, before it exits, that the ledger is still the file
it opened, and says so last, exit 3. The job waits until the test has deleted the ledger, so the
deletion is mid-job every time."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

sys.path.insert(0, str(Path(__file__).parent))
from conftest import gpucluster_argv, needs_torch, run_cli  # noqa: E402


def _waiting_job(tmp_path: Path) -> tuple[Path, Path]:
    go = tmp_path / "go"
    script = tmp_path / "wait.py"
    script.write_text(f"import os, time\nend = time.time() + 60\nwhile not os.path.exists({str(go)!r}) and "
                      "time.time() < end:\n    time.sleep(0.1)\n")
    return go, script


def _delete_ledger_mid_job(home: Path, go: Path, proc: subprocess.Popen) -> tuple[str, str]:
    deadline = time.monotonic() + 90
    while not list(home.glob("runs/*/node-0.log")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    for f in home.glob("ledger.sqlite3*"):
        f.unlink()
    go.touch()
    return proc.communicate(timeout=180)


def _start(tmp_path: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(gpucluster_argv(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, COLUMNS="200"), cwd=tmp_path)


@needs_torch
def test_a_ledger_deleted_mid_sweep_is_said_last_with_exit_3(home, tmp_path):
    go, script = _waiting_job(tmp_path)
    proc = _start(tmp_path, "sweep", "--cloud", "local", "--nodes", "1", "--yes", "--", "python", str(script))
    out, err = _delete_ledger_mid_job(home, go, proc)
    assert proc.returncode == 3, (out, err)
    last = err.strip().splitlines()[-1]
    assert last == (f"gpucluster: error: the ledger {str(home / 'ledger.sqlite3')!r} was deleted during the sweep: "
                    "its records went with the old file; the report above is all that is left of its runs")


@needs_torch
def test_a_ledger_deleted_mid_exec_is_said_last_with_exit_3(home, tmp_path):
    up = run_cli("up", "--cloud", "local", "--nodes", "1", "--name", "lab", "--yes", cwd=tmp_path, timeout=120)
    assert up.returncode == 0, up.stderr
    go, script = _waiting_job(tmp_path)
    proc = _start(tmp_path, "exec", "lab", "--", "python", str(script))
    out, err = _delete_ledger_mid_job(home, go, proc)
    assert proc.returncode == 3, (out, err)
    last = err.strip().splitlines()[-1]
    assert last == (f"gpucluster: error: the ledger {str(home / 'ledger.sqlite3')!r} was deleted during the exec: "
                    "its records went with the old file; the job's outputs and report above are all that is left "
                    "of it")


def test_an_undisturbed_ledger_changes_no_exit_code(home, tmp_path):
    from gpucluster.cli.common import ledger_kept_true
    from gpucluster.ledger.store import Ledger

    ledger = Ledger(home / "ledger.sqlite3")
    assert [ledger_kept_true(ledger, c, "sweep") for c in (0, 1, 3, 130)] == [0, 1, 3, 130]
    (home / "ledger.sqlite3").unlink()
    assert [ledger_kept_true(ledger, c, "sweep") for c in (0, 1, 3, 130)] == [3, 3, 3, 130]


@pytest.mark.parametrize("moved", [False, True])
def test_up_of_machines_that_exist_with_a_moved_ledger_says_nothing_bills(home, tmp_path, monkeypatch, capsys, moved):
    """`up --cloud local` records a kept cluster of machines that exist and creates nothing: a ledger
    moved meanwhile loses only the record, and the last line says so, never "up and billing" nor a
    `gc --cloud local` that does not exist. (The move is made to be seen by the check itself:
    `up` of existing machines is over before a test could delete the file mid-command.)"""
    import gpucluster.home
    from gpucluster.cli.main import main

    if moved:
        monkeypatch.setattr(gpucluster.home, "ledger_moved",
                            lambda path, identity, what: f"the ledger {str(path)!r} was deleted during the {what}")
    try:
        code = main(["up", "--cloud", "local", "--nodes", "1", "--name", "lab", "--yes"])
        err = capsys.readouterr().err
        assert code == (3 if moved else 0), err
        if moved:
            assert err.strip().splitlines()[-1] == (
                f"gpucluster: error: the ledger {str(home / 'ledger.sqlite3')!r} was deleted during the up; cluster "
                "lab is no longer recorded (gpucluster created nothing that bills for it: it runs on what exists); run `gpucluster up` again to "
                "record it"), err
        else:
            assert "no longer recorded" not in err
    finally:
        monkeypatch.undo()
        main(["down", "lab", "--yes"])
