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
from gpucluster.launch import JobSpec

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def _env_python(tmp_path, monkeypatch):
    bin_dir = tmp_path / "env" / "bin"
    bin_dir.mkdir(parents=True)
    py = bin_dir / "python"
    py.write_text("#!/bin/sh\nexit 1\n")  # the user's active environment, without gpucluster
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
