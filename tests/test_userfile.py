"""Issue 45 item 4: every file gpucluster reads from the user or from its home goes through one
bounded reader (gpucluster/userfile.py). Before, `--env-file /dev/zero` or a FIFO, a task file's
`env_file: /dev/zero`, the home's installation-id or settings file as a link to /dev/zero or a FIFO,
and a .gitignore that is a FIFO or /dev/zero hung for ever (a FIFO blocks in open() until a writer
comes: fifo(7)) or ended in MemoryError (/dev/zero never ends: null(4)). Each case here runs in a
thread with a deadline, so a hang fails the test instead of stalling the suite."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gpucluster.cli.main import main
from gpucluster.errors import ConfigError, UsageError
from gpucluster.userfile import read_bounded

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def within(seconds: float, fn, *args):
    """fn(*args) in a daemon thread: its result or exception, or a failure when it does not end."""
    out: dict = {}

    def go():
        try:
            out["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{getattr(fn, '__name__', fn)} did not return within {seconds} s (it blocks)"
    if "error" in out:
        raise out["error"]
    return out["value"]


def hostile(path: Path, kind: str) -> Path:
    if kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "huge":
        path.write_bytes(b"A=1\n" * (1 << 20))
    return path


def test_the_reader_reads_regular_files_only_and_at_most_its_bound(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"x" * 10)
    assert read_bounded(f, "thing", 10) == b"x" * 10
    (tmp_path / "link").symlink_to(f)
    assert read_bounded(tmp_path / "link", "thing", 10) == b"x" * 10  # links are followed
    with pytest.raises(UsageError, match=r"^thing '.*/f' is over 9 bytes; at most 9 bytes are read$"):
        read_bounded(f, "thing", 9)
    with pytest.raises(FileNotFoundError):
        read_bounded(tmp_path / "missing", "thing", 9)
    for kind, said in (("dev-zero", "a device, pipe or socket"), ("fifo", "a device, pipe or socket"),
                       ("folder", "a folder")):
        with pytest.raises(ConfigError, match=f"^thing '.*' is {said}, not a file; give a list$"):
            within(10, lambda p=hostile(tmp_path / kind, kind): read_bounded(p, "thing", 100, hint="a list",
                                                                              error=ConfigError))


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "folder", "huge"])
def test_env_files_that_are_not_files_are_refused_in_one_line(kind, home, tmp_path, capsys):
    env = hostile(tmp_path / "env", kind)
    assert within(30, main, ["run", "--cloud", "local", "--nodes", "1", "--env-file", str(env), "--yes"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"gpucluster: error: --env-file {str(env)!r} is ") and len(err.splitlines()) == 1, err
    assert not (home / "ledger.sqlite3").exists()
    task = tmp_path / "task.yaml"
    task.write_text(f"env_file: {env}\n")
    assert within(30, main, ["run", "--cloud", "local", str(task), "--yes"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"gpucluster: error: task file {str(task)!r}, line 1: env_file: --env-file "), err


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_home_files_that_are_not_files_are_refused_in_one_line(kind, home, capsys):
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    hostile(home / "installation-id", kind)
    assert within(30, main, ["run", "--cloud", "local", "--nodes", "1", "--yes"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"gpucluster: error: installation id file {str(home / 'installation-id')!r} is a device, pipe "
                   "or socket, not a file; give a file of 16 hex digits; fix or move it aside"), err
    (home / "installation-id").unlink()
    hostile(home / "config.json", kind)
    assert within(30, main, ["status"]) == 2
    err = capsys.readouterr().err.strip()
    assert "settings file" in err and "is a device, pipe or socket, not a file" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_an_ignore_file_that_is_not_a_file_is_refused(kind, tmp_path):
    from gpucluster.plan.shipping import shipment

    (tmp_path / "train.py").write_text("print(1)\n")
    hostile(tmp_path / ".gitignore", kind)
    with pytest.raises(UsageError, match=r"^ignore file '.*\.gitignore' is a device, pipe or socket, not a file"):
        within(30, shipment, tmp_path)
