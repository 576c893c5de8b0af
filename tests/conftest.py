import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh GPUCLUSTER_HOME for the test (ledger, logs)."""
    h = tmp_path / "home"
    monkeypatch.setenv("GPUCLUSTER_HOME", str(h))
    return h


def gpucluster_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpucluster.cli.main", *args]


def run_cli(*args: str, env: dict | None = None, cwd=None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (as a user would), capture its output."""
    full_env = dict(os.environ, COLUMNS="200")
    full_env.update(env or {})
    return subprocess.run(gpucluster_argv(*args), capture_output=True, text=True, env=full_env,
                          cwd=cwd or ROOT, timeout=timeout)


def have_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


needs_torch = pytest.mark.skipif(not have_torch(), reason="torch is not installed (pip install torch==2.13.0)")

