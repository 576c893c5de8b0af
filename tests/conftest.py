"""Shared fixtures, and the test tiers.

TEST TIERS. Every tests/test_*.py file names its tier at its top, after the imports, with a
module-level `pytestmark` (tests/test_tiers.py fails for a file that does not):

    unit         in-process only: no torchrun, no sshd, no fake cloud server, no CLI subprocess that
                 runs a job. `make test-fast` runs this tier (about a minute; run it after each change).
    integration  starts real processes or servers: the CLI in a subprocess, the fake Pulumi CLI,
                 moto's server, the fake Kubernetes API and its pods, the GCS emulator, the reaper,
                 torchrun without a training job.
    slow         real multi-process training runs under torchrun (seconds each).
    sshd         real OpenSSH servers on loopback (usually with `slow` too).
    alone        reads machine-wide state; `make test` runs these last, with nothing else running.

A test in a `unit` file that is heavier carries its own marker (`@pytest.mark.integration`,
`@pytest.mark.slow`): the heavier marker wins, because `make test-fast` selects by exclusion
(FAST_TIER below; the Makefile's `-m` says the same). `make test` runs every tier. A new test
file: start from the tier of what it does, and measure (`pytest --durations=0 tests/test_x.py`):
a unit file whose tests take more than a second or two each belongs in `integration`.
Where the tiers and the commands are explained for people: docs/testing.md.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The markers that take a test out of the unit tier (`make test-fast`), lightest first; `unit` is
# the rest. tests/test_tiers.py checks that every file declares one of TIERS and that the
# Makefile's test-fast expression is FAST_TIER.
HEAVY_TIERS = ("integration", "slow", "sshd", "alone")
TIERS = ("unit", *HEAVY_TIERS)
FAST_TIER = " and ".join(f"not {m}" for m in HEAVY_TIERS)
FIXTURES = Path(__file__).resolve().parent / "fixtures"
# The tests run as a user with this environment active: its `python` (with torch) first on PATH,
# which is what a local node runs by default (`--python`; infra/local/launch.py node_python).
os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
# Folders and files the tests make for a home are private, as gpucluster makes its own (gpucluster/home.py
# make_private): a home a test made 0755 by hand would be tightened with a note on stderr, in the
# middle of the one-line errors the tests read. tests/test_home_private.py sets the usual 022 itself.
os.umask(0o077)
# No user config file and no GPUCLUSTER_* defaults of the person running the tests (gpucluster/plan/userconfig.py);
# a test about them sets its own.
os.environ["GPUCLUSTER_CONFIG"] = ""
for _var in ("GPUCLUSTER_CLOUD", "GPUCLUSTER_REGION", "GPUCLUSTER_ZONE", "GPUCLUSTER_SSH_CIDR", "GPUCLUSTER_PROJECT",
             "GPUCLUSTER_STATE"):
    os.environ.pop(_var, None)
# Ctrl-C is part of what is tested (real SIGINT to the CLI, a tunnel, torchrun). A shell starts a
# background command (`make test &`, nohup, CI runners without job control) with SIGINT ignored
# (bash(1), "background commands ignore SIGINT and SIGQUIT"), and a process started with SIGINT
# ignored keeps it ignored: Python installs no KeyboardInterrupt handler, OpenSSH's ssh keeps it
# ignored (clientloop.c). Every CLI, ssh and torchrun the tests start would then ignore Ctrl-C, and
# they hung. A handler here (not SIG_IGN) is reset to the default in every child at exec.
import signal as _signal  # noqa: E402

if _signal.getsignal(_signal.SIGINT) is _signal.SIG_IGN:
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)


# Seconds each of the slowest test files took, all its tests in one pytest-xdist worker, in the parallel
# step of `make test` (five workers) on b716927, 2026-11-29 (a per-test timeline, docs/testing.md).
# `make test` hands whole files to its workers (--dist loadfile) in collection order
# (--no-loadscope-reorder); xdist's own order, most tests first, left files with few long tests to the
# end, where one worker ran them while the others had nothing left. Heaviest first, the rest after in
# their usual order. Files of under 20 s are not listed.
HEAVY_FILES = {
    "test_fault_matrix.py": 991,
    "test_recovery_ssh.py": 473,
    "test_recovery.py": 279,
    "test_recovery_cloud.py": 245,
    "test_ssh_outputs.py": 216,
    "test_workdir.py": 195,
    "test_ssh_workdir.py": 186,
    "test_bad_input.py": 173,
    "test_local_store_phases.py": 170,
    "test_shared_account.py": 153,
    "test_aws_s3_run.py": 149,
    "test_kept.py": 148,
    "test_local_runs.py": 134,
    "test_cloud_run.py": 131,
    "test_ssh_sshd.py": 129,
    "test_reaper.py": 107,
    "test_ssh_faults.py": 102,
    "test_ssh_frozen.py": 95,
    "test_shapes_ssh.py": 94,
    "test_held_ssh.py": 90,
    "test_shapes_local.py": 90,
    "test_shared_hosts.py": 84,
    "test_outputs.py": 82,
    "test_kube_backend.py": 82,
    "test_recovery_gcp.py": 78,
    "test_console_tty.py": 76,
    "test_aws_preflight.py": 76,
    "test_wheel.py": 71,
    "test_ssh_down.py": 71,
    "test_ssh_data.py": 70,
    "test_resume.py": 66,
    "test_health_ssh.py": 64,
    "test_k8s_workdir.py": 59,
    "test_aws_teardown.py": 58,
    "test_money_guards.py": 58,
    "test_ssh_resume.py": 54,
    "test_local_setup_data.py": 49,
    "test_secrets.py": 46,
    "test_aws_efa_public_ip.py": 43,
    "test_kept_gcp.py": 43,
    "test_gcp_ssh.py": 41,
    "test_ssh_digits.py": 41,
    "test_kube_gpu.py": 40,
    "test_pghook_ssh.py": 39,
    "test_sweep.py": 39,
    "test_kube_kept.py": 36,
    "test_k8s_resilience.py": 35,
    "test_k8s_launcher.py": 34,
    "test_k8s_check.py": 33,
    "test_gcp_idle.py": 33,
    "test_api_local.py": 32,
    "test_layout.py": 31,
    "test_automation.py": 30,
    "test_health.py": 27,
    "test_k8s_outputs.py": 26,
    "test_aws_cli.py": 23,
    "test_ssh_rdzv_port.py": 23,
    "test_pghook_local.py": 22,
    "test_aws_s3.py": 21,
    "test_local_rdzv_port.py": 21,
    "test_failover.py": 21,
    "test_placement.py": 20,
}


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: -HEAVY_FILES.get(item.path.name, 0))  # stable: each file's own order kept


@pytest.fixture(autouse=True)
def no_inherited_terminal_size(monkeypatch):
    """pytest-xdist's workers run with COLUMNS=80 and LINES=24 set; the CLI reads COLUMNS for
    output that is not a terminal. Each test starts without them, as a serial run does (a test
    about COLUMNS sets it itself)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


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


def write_old_ledger(path: Path, version: int = 3) -> None:
    """A ledger as gpucluster wrote it at schema `version` (its migrations up to there), holding one
    finished local run, 'old'."""
    import sqlite3

    from gpucluster.ledger.schema import MIGRATIONS

    db = sqlite3.connect(path)
    for _, script in MIGRATIONS[:version]:
        for stmt in script.split(";"):
            if stmt.strip():
                db.execute(stmt)
    db.execute(f"PRAGMA user_version = {int(version)}")
    db.execute("INSERT INTO runs (id, created_at, status, cloud, cluster, nodes, command, spec) "
               "VALUES ('old', 1, 'succeeded', 'local', 'c', 2, '[]', '{}')")
    db.commit()
    db.close()


def have_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


needs_torch = pytest.mark.skipif(not have_torch(), reason="torch is not installed (pip install torch==2.13.0)")



_NO_PLACEMENT_GROUPS = (
    '<DescribePlacementGroupsResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
    "<requestId>00000000-0000-0000-0000-000000000000</requestId><placementGroupSet/>"
    "</DescribePlacementGroupsResponse>"
)


@pytest.fixture(autouse=True)
def moto_answers_placement_groups(monkeypatch):
    """moto 5.2.5 implements neither CreatePlacementGroup nor DescribePlacementGroups, so under moto
    the leftover check's placement-group look can never run (and the verdict is honestly "not
    verified"). Since moto cannot create one, "there are none" is the true answer: this makes moto
    answer DescribePlacementGroups the way EC2 does for a region without placement groups (an empty
    placementGroupSet; https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribePlacementGroups.html).
    A test about a check that cannot run removes it again (`monkeypatch.delattr`)."""
    try:
        from moto.ec2.responses import EC2Response
    except ImportError:
        return
    monkeypatch.setattr(EC2Response, "describe_placement_groups", lambda self: _NO_PLACEMENT_GROUPS, raising=False)
