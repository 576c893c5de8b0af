"""A fault injected at each phase of a run, for each kind of fault: the run must end with zero
leftover processes/resources and a ledger row that tells the truth.

Faults: Ctrl-C (KeyboardInterrupt), SIGTERM (lifecycle.Terminated), a crash inside the tool
(RuntimeError) and a domain error (GpuclusterError). They are raised from wrappers around the real
provider and launcher (local: real torchrun agents and workers; ssh: real sshd hosts, see
test_ssh_faults in the ssh tests) at the moment each phase is under way.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import needs_torch  # noqa: E402
from gpucluster.errors import ExitCode, ProvisionError  # noqa: E402
from gpucluster.launch import JobSpec
from gpucluster.ledger import Ledger
from gpucluster.lifecycle import Terminated, execute
from gpucluster.procs import run_processes
from gpucluster.spec import ClusterSpec, new_run_id

PHASES = ["prepare", "provision", "ready", "rendezvous", "train", "teardown"]
FAULTS = {
    "ctrl-c": (KeyboardInterrupt, "interrupted", ExitCode.INTERRUPTED),
    "sigterm": (Terminated, "interrupted", ExitCode.INTERRUPTED),
    "crash": (lambda: RuntimeError("injected bug"), "failed", ExitCode.FAILURE),
    "error": (lambda: ProvisionError("injected cloud error"), "failed", ExitCode.FAILURE),
}
FAILURE_TEXT = {
    "ctrl-c": "stopped by Ctrl-C",
    "sigterm": "stopped by SIGTERM",
    "crash": "internal error: RuntimeError: injected bug",
    "error": "injected cloud error",
}


class FaultyEvents:
    def __init__(self, inner, phase, fault):
        self.inner, self.phase, self.fault = inner, phase, fault

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def on_phase(self, phase):
        self.inner.on_phase(phase)
        if phase == self.phase == "rendezvous":
            raise self.fault()

    def on_metric(self, node_rank, record):
        self.inner.on_metric(node_rank, record)
        if self.phase == "train" and record.get("kind") == "epoch":
            raise self.fault()  # mid-training: processes are up and all-reducing


class FaultyLauncher:
    def __init__(self, inner, phase, fault):
        self.inner, self.phase, self.fault = inner, phase, fault

    def prepare(self, job):
        if self.phase == "prepare":
            raise self.fault()

    def ready(self, cluster, job):
        if self.phase == "ready":
            raise self.fault()

    def launch(self, cluster, job, events, log_dir):
        return self.inner.launch(cluster, job, FaultyEvents(events, self.phase, self.fault), log_dir)


class FaultyProvider:
    def __init__(self, inner, phase, fault):
        self.inner, self.phase, self.fault = inner, phase, fault
        self.cloud = inner.cloud
        self.check_is_complete = inner.check_is_complete

    def up(self, spec, events):
        if self.phase == "provision":
            raise self.fault()
        return self.inner.up(spec, events)

    def down(self, name, events):
        if self.phase == "teardown":
            raise self.fault()
        return self.inner.down(name, events)

    def leftovers(self, name, run_id=None):
        return self.inner.leftovers(name, run_id)

    def status(self, name):
        return None


def _local_backend():
    from gpucluster.infra.local import LocalProvider
    from gpucluster.local import LocalLauncher

    return LocalProvider(), LocalLauncher(grace=2.0)


JOB_ARGS = ("--epochs", "50", "--steps", "3", "--width", "64", "--batch-size", "16")


def _run_with_fault(home, spec, provider, launcher, phase, fault_name):
    fault, status, code = FAULTS[fault_name]
    ledger = Ledger(home / "ledger.sqlite3")
    job = JobSpec(run_id=spec.run_id, workload="synthetic", workload_args=JOB_ARGS, threads_per_proc=1,
                  max_seconds=120)
    outcome = execute(spec, job, ledger=ledger, provider=FaultyProvider(provider, phase, fault),
                      launcher=FaultyLauncher(launcher, phase, fault))
    # nothing left: no process on this machine (every "host" is this machine) carries the run id
    assert run_processes(spec.run_id) == []
    run = ledger.get_run(spec.run_id)
    assert run["ended_at"] is not None
    assert run["teardown"] == "verified" and run["leftovers"] == []
    assert all(r["confirmed_gone"] for r in run["resources"])
    phases = {p["name"]: p for p in run["phases"]}
    assert all(p["ended_at"] for p in phases.values())
    if phase == "teardown":
        # the run itself succeeded; the failing delete is recorded, the check still proved nothing is left
        assert run["status"] == "succeeded" and outcome.exit_code == ExitCode.OK, (
            run["failure"], [n["last_lines"][-8:] for n in run["node_results"]])
        assert "delete failed" in (phases["teardown"]["detail"] or "")
    else:
        assert run["status"] == status and outcome.exit_code == code
        assert run["failure"] == FAILURE_TEXT[fault_name]
        assert phases[phase]["status"] in ("failed", "interrupted")
        assert list(phases)[-2] == phase  # nothing after the faulty phase but teardown
    assert phases["teardown"]["status"] == "ok"
    return run


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize("fault_name", list(FAULTS))
@pytest.mark.parametrize("phase", PHASES)
def test_local_fault(home, phase, fault_name):
    provider, launcher = _local_backend()
    spec = ClusterSpec(cloud="local", nodes=2, name="fm", gpus_per_node=0, run_id=new_run_id())
    _run_with_fault(home, spec, provider, launcher, phase, fault_name)


@pytest.fixture(scope="module")
def ssh_hosts(tmp_path_factory):
    import sshd

    reason = sshd.missing_reason()
    if reason:
        pytest.skip(reason)
    h = sshd.SshdHosts.start(tmp_path_factory.mktemp("sshd"), 2)
    yield h
    h.stop()


@needs_torch
@pytest.mark.slow
@pytest.mark.sshd
@pytest.mark.parametrize("fault_name", list(FAULTS))
@pytest.mark.parametrize("phase", PHASES)
def test_ssh_fault(home, tmp_path, ssh_hosts, phase, fault_name):
    import sshd
    from gpucluster.infra.ssh import SshProvider

    remote_dir = tmp_path / "remote"
    launcher = sshd.make_launcher(ssh_hosts, remote_dir)
    provider = SshProvider(launcher=launcher)
    spec = ClusterSpec(cloud="ssh", nodes=2, name="fm", gpus_per_node=0, run_id=new_run_id(),
                       hosts=tuple(ssh_hosts.hosts[:2]))
    _run_with_fault(home, spec, provider, launcher, phase, fault_name)
    assert not (remote_dir / spec.run_id).exists()
    assert sshd.leaked_ssh_masters() == []
