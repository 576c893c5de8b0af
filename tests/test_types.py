"""The type checker (issue 23, item 9): mypy, configured by pyproject.toml's [tool.mypy], finds no
error in the package: gpucluster/, infra/, cli/ and workloads/, each file under the module name it
is imported by (`.ci/typecheck.py` says why plain `python -m mypy` cannot name them so).

A checkout's first run also reads the types of the SDKs the code uses (torch, Pulumi, ...): minutes;
later runs reuse mypy's cache (.mypy_cache) and take seconds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("gpucluster", "infra", "cli", "workloads")  # [tool.setuptools.package-dir]'s folders


def test_mypy_finds_no_error():
    pytest.importorskip("mypy", reason="mypy is not installed (pip install -e '.[test]')")
    # the code's torch types are torch's own: without torch (`make test-py` on a Python with no CPU
    # torch wheel) every one of them would be an error that says nothing about this code
    pytest.importorskip("torch", reason="torch is not installed: its types cannot be checked")
    cp = subprocess.run([sys.executable, str(ROOT / ".ci" / "typecheck.py")], cwd=ROOT, capture_output=True,
                        text=True, timeout=1800)
    assert cp.returncode == 0, f"mypy found errors (exit {cp.returncode}):\n{cp.stdout}{cp.stderr}"
    files = sum(1 for d in CHECKED for _ in (ROOT / d).rglob("*.py"))
    assert f"no issues found in {files} source files" in cp.stdout, cp.stdout + cp.stderr
