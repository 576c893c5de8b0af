"""Issue 45 item 12: the home is its owner's alone. Under the usual umask (022) the home was made
0755 and the ledger 0644, so on a shared workstation or login node every user read every run's
command line, environment names, job output and cluster names. Now a new home is 0700 and the
ledger (with SQLite's -wal/-shm, which take the database file's mode) 0600 whatever the umask; an
existing home open to others is tightened once with a note; a folder that is not a gpucluster
home (GPUCLUSTER_HOME=/tmp, a project folder) is never changed."""

from __future__ import annotations

import os
import stat

import pytest

from gpucluster import home as home_module
from gpucluster.cli.main import main
from gpucluster.ledger.store import Ledger

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_a_new_home_and_its_ledger_are_private_whatever_the_umask(home, umask022, capsys):
    assert main(["runs"]) == 0
    Ledger.open_default().close()
    assert mode(home) == 0o700
    ledger_files = [p for p in home.iterdir() if p.name.startswith("ledger.sqlite3")]
    assert ledger_files and all(mode(p) == 0o600 for p in ledger_files), [(p.name, oct(mode(p))) for p in ledger_files]
    assert "note:" not in capsys.readouterr().err  # a new home needs no note


def test_an_existing_open_home_is_tightened_once_with_a_note(home, umask022, capsys, monkeypatch):
    monkeypatch.setattr(home_module, "_told", set())
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)
    (home / "ledger.sqlite3").touch()
    os.chmod(home / "ledger.sqlite3", 0o644)
    Ledger.open_default().close()
    assert mode(home) == 0o700 and mode(home / "ledger.sqlite3") == 0o600
    err = capsys.readouterr().err
    assert err.strip() == f"note: gpucluster home {str(home)!r} was readable by other users (mode 0755); it is now " \
                          "0700 (owner only)"
    Ledger.open_default().close()
    assert capsys.readouterr().err == ""  # once


def test_a_folder_that_is_not_a_gpucluster_home_is_left_as_it_is(tmp_path, umask022, monkeypatch):
    shared = tmp_path / "project"
    shared.mkdir()
    os.chmod(shared, 0o775)
    (shared / "train.py").write_text("")
    monkeypatch.setenv("GPUCLUSTER_HOME", str(shared))
    home_module.home_dir()
    assert mode(shared) == 0o775
