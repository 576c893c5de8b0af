"""Which Python a local node runs (issue 28 item 6, and issue 27's user install): a user's command
runs on the `python` on the user's PATH (their active environment) or --python; a built-in
workload is gpucluster's own code, so without --python it runs on gpucluster's own interpreter.
Installed with pipx, that interpreter is the only one that has gpucluster (and, with the `local`
extra, torch): `python -m gpucluster.workloads.digits` on the user's `python` failed with "No
module named torch" (README, "Installing it as a tool")."""

from __future__ import annotations

import sys

import pytest

from gpucluster.infra.local.launch import LocalLauncher
from gpucluster.watch.launch import JobSpec

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def _env_python(tmp_path, monkeypatch):
    bin_dir = tmp_path / "env" / "bin"
    bin_dir.mkdir(parents=True)
    py = bin_dir / "python"
    # the user's active environment (its own path; it runs this interpreter, which has torch, so the
    # check that the nodes' Python can find torch passes)
    py.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return str(py)


def test_a_users_command_runs_on_the_python_on_path_a_workload_on_gpuclusters_own(tmp_path, monkeypatch):
    users = _env_python(tmp_path, monkeypatch)
    launcher = LocalLauncher()
    script, digits = JobSpec("r", command=("python", "train.py")), JobSpec("r", workload="digits")
    assert launcher.python_for(script) == users
    assert launcher.python_for(digits) == sys.executable
    assert f"python: {sys.executable}" in launcher.describe(None, digits)
    assert f"python: {users}" in launcher.describe(None, script)


def test_python_given_is_used_for_both(tmp_path, monkeypatch):
    users = _env_python(tmp_path, monkeypatch)
    launcher = LocalLauncher(python=users)
    assert launcher.python_for(JobSpec("r", workload="digits")) == users
    assert launcher.python_for(JobSpec("r", command=("python", "t.py"))) == users


def _fake(tmp_path, name: str, body: str) -> str:
    p = tmp_path / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)
    return str(p)


def test_a_python_that_cannot_run_or_has_no_torch_is_refused_before_anything_starts(tmp_path, home, capsys):
    """Issue 45 item 10: `--python /bin/false` and a Python without torch started every node, each
    failing in `rendezvous`. Now: one line, exit 2, no ledger."""
    from gpucluster.cli.main import main

    no_torch = _fake(tmp_path, "python-no-torch", f'exec {sys.executable} -S -c "import sys; sys.exit(3)"')
    for python, said in (("/bin/false", "--python '/bin/false' is not a working Python (asked to run a small "
                          "Python program it ended with exit code 1); give a Python with torch"),
                         (no_torch, f"--python {no_torch!r} has no torch (torchrun and the ranks need it): install "
                          "torch there (pip install torch) or give a Python that has it")):
        assert main(["run", "--cloud", "local", "--nodes", "1", "--python", python, "--yes"]) == 2
        assert capsys.readouterr().err.strip() == f"gpucluster: error: {said}"
    assert not (home / "ledger.sqlite3").exists()


def test_a_script_with_a_syntax_error_is_refused_naming_its_line(tmp_path, home, capsys, monkeypatch):
    from gpucluster.cli.main import main

    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("import os\n\ndef main(:\n    pass\n")
    monkeypatch.chdir(project)
    assert main(["run", "--cloud", "local", "--nodes", "2", "--yes", "--", "python", "train.py"]) == 2
    assert capsys.readouterr().err.strip() == ("gpucluster: error: train.py, line 3: invalid syntax (a syntax "
                                               "error: fix the script; nothing was started)")
    assert not (home / "ledger.sqlite3").exists() and not list(project.rglob("*.pyc"))  # nothing written there
