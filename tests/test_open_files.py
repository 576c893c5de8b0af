"""A run raises its soft limit on open files (issue 31 item 4): the launchers hold a file or socket
per node (ssh: about 4 at the staging peak, 135 with 32 hosts in benchmarks/scale_ssh.py; Kubernetes:
the log stream and the log file), so 64 nodes would exhaust the soft limit of 256 a process starts
with on macOS (`ulimit -n`; launchctl's default maxfiles soft limit is 256). The hard limit is left
alone; the soft one is raised to OPEN_FILES_WANTED or the hard limit, whichever is lower, never
lowered. Each case runs in a process of its own started with a soft limit of 256."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import ROOT, gpucluster_argv, needs_torch  # noqa: E402
from gpucluster.watch.procs import OPEN_FILES_WANTED  # noqa: E402

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

SOFT, HARD = resource.getrlimit(resource.RLIMIT_NOFILE)
START = 256  # macOS's default soft limit


def _as_mac():
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(START, SOFT), HARD))


def _expected() -> int:
    return OPEN_FILES_WANTED if HARD == resource.RLIM_INFINITY else min(OPEN_FILES_WANTED, HARD)


def test_the_soft_limit_is_raised_to_what_a_run_needs_never_lowered():
    code = ("import resource; from gpucluster.watch.procs import raise_open_files as r; "
            "print(r()); print(r()); print(r(16)); print(resource.getrlimit(resource.RLIMIT_NOFILE))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=_as_mac,
                         check=True).stdout.split("\n")
    start = min(START, SOFT)
    assert out[0] == str((start, max(start, _expected())))
    assert out[1] == str((max(start, _expected()),) * 2)  # already raised: unchanged
    assert out[2] == str((max(start, _expected()),) * 2)  # a smaller wish never lowers it
    assert out[3] == str((max(start, _expected()), HARD))  # the hard limit is left as it was


@needs_torch
def test_a_run_starts_with_the_raised_limit(tmp_path):
    """Through the CLI (local backend, 1 node): the job's processes inherit the raised limit, so the
    run itself (this process's parent) had it while its launcher held the nodes' files."""
    script = tmp_path / "job" / "limits.py"
    script.parent.mkdir()
    script.write_text("import resource\nprint('NOFILE', resource.getrlimit(resource.RLIMIT_NOFILE)[0], flush=True)\n")
    home = tmp_path / "home"
    env = dict(os.environ, GPUCLUSTER_HOME=str(home), COLUMNS="200")
    p = subprocess.run(gpucluster_argv("run", "--cloud", "local", "--nodes", "1", "--yes", "--quiet", "--",
                                       "python", str(script)),
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, preexec_fn=_as_mac)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    logs = "".join(f.read_text() for f in home.glob("runs/*/node-0.log"))
    assert f"NOFILE {max(min(START, SOFT), _expected())}" in logs, logs[-2000:]
