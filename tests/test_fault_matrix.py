"""A fault at each phase of a run, of each kind: the run must end with zero leftover processes
(found by the run id *and* by a marker in the user script's command line) and a ledger row that
tells the truth, verdict included.

Every fault is injected where production code really passes at that moment, never through a hook
only a test implements:
- prepare, ready: the ledger write that opens the phase (`Ledger.phase_start`, called by the lifecycle);
- provision / teardown: the provider's `up` / `down`, called by the lifecycle;
- rendezvous: the launcher's phase event; train: the first epoch metric the workers report.
Kinds:
- ctrl-c, sigterm, sighup: a real signal sent to this process (`os.kill`), handled by the run's own
  signal handlers (`lifecycle.RunSignals`), as a terminal (Ctrl-C, closing it) or a supervisor would;
- double-ctrl-c: SIGINT, then a second SIGINT 0.3 s later, while every rank of the user script
  ignores SIGTERM and SIGINT (issue 10 item 8): teardown must not be cut short, SIGKILL ends it;
- crash: a RuntimeError (a bug in the tool); error: a ProvisionError (a cloud or API error).
A signal during teardown is noted, not obeyed: that run still succeeds, with teardown verified.
Backends: local (real torchrun agents and workers) and ssh (real sshd on loopback, see tests/sshd.py).
"""

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

sys.path.insert(0, str(Path(__file__).parent))
from conftest import FIXTURES, needs_torch  # noqa: E402
from gpucluster.infra.registry import plugin as backend_of  # noqa: E402
from gpucluster.errors import ExitCode, ProvisionError  # noqa: E402
from gpucluster.domain import Provider
from gpucluster.watch.launch import JobSpec, Launcher
from gpucluster.ledger.store import Ledger
from gpucluster.lifecycle.steps import execute
from gpucluster.watch.procs import run_processes
from gpucluster.spec import ClusterSpec, new_run_id

psutil = pytest.importorskip("psutil")

PHASES = ["prepare", "provision", "ready", "rendezvous", "train", "outputs", "teardown"]
SIGNALS = {"ctrl-c": signal.SIGINT, "sigterm": signal.SIGTERM, "sighup": signal.SIGHUP,
           "double-ctrl-c": signal.SIGINT}
RAISED = {"crash": lambda: RuntimeError("injected bug"), "error": lambda: ProvisionError("injected cloud error")}
FAULTS = list(SIGNALS) + list(RAISED)
# every kind at every phase, except SIGHUP and the double Ctrl-C, which behave like the faults
# before them until the processes run: those strike mid-training and during teardown only
CASES = [(phase, fault) for phase in PHASES for fault in FAULTS
         if fault not in ("sighup", "double-ctrl-c") or phase in ("train", "outputs", "teardown")]
OUTCOME = {  # fault -> (run status, exit code, failure text) when it strikes before teardown
    "ctrl-c": ("interrupted", ExitCode.INTERRUPTED, "stopped by Ctrl-C"),
    "double-ctrl-c": ("interrupted", ExitCode.INTERRUPTED, "stopped by Ctrl-C"),
    "sigterm": ("interrupted", ExitCode.INTERRUPTED, "stopped by SIGTERM"),
    "sighup": ("interrupted", ExitCode.INTERRUPTED, "stopped by SIGHUP"),
    "crash": ("failed", ExitCode.FAILURE, "internal error: RuntimeError: injected bug"),
    "error": ("failed", ExitCode.FAILURE, "injected cloud error"),
}
JOB_ARGS = ("--epochs", "50", "--steps", "3", "--width", "64", "--batch-size", "16")
# Where the fault strikes before the workers compute (rendezvous) or after they are done (outputs,
# teardown), the job is plain_job.py: real torchrun agents and worker processes, no torch import
# in the workers (about 1.6 CPU-seconds each on the 2-core test machine). Mid-training faults
# (train) keep the real all-reducing job.
PLAIN_PHASES = ("rendezvous", "outputs", "teardown")


class Fault:
    """Fires once: a real signal to this process, or an exception raised at the call site."""

    def __init__(self, name: str):
        self.name, self.fired, self.timer = name, False, None

    def __call__(self) -> None:
        if self.fired:
            return
        self.fired = True
        if self.name in RAISED:
            raise RAISED[self.name]()
        os.kill(os.getpid(), SIGNALS[self.name])
        if self.name == "double-ctrl-c":
            self.timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
            self.timer.start()

    def finish(self) -> None:
        """After the run: a second Ctrl-C not sent yet (the run ended within 0.3 s) is not sent."""
        if self.timer:
            self.timer.cancel()
            self.timer.join()


class FaultyLedger(Ledger):
    """The real ledger; the fault strikes right after the lifecycle opens the chosen phase."""

    def __init__(self, path, phase, fault):
        super().__init__(path)
        self.phase, self.fault = phase, fault

    def phase_start(self, run_id, name, *a, **kw):
        out = super().phase_start(run_id, name, *a, **kw)
        if name == self.phase and name in ("prepare", "ready"):
            self.fault()
        return out


class FaultyEvents:
    """The lifecycle's own events object, passed to the real launcher; the fault strikes when the
    launcher reports the rendezvous phase or the first epoch metric."""

    def __init__(self, inner, phase, fault):
        self.inner, self.phase, self.fault = inner, phase, fault

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def on_phase(self, phase):
        self.inner.on_phase(phase)
        if phase == self.phase == "rendezvous":
            self.fault()

    def on_metric(self, node_rank, record):
        self.inner.on_metric(node_rank, record)
        if self.phase == "train" and record.get("kind") == "epoch":
            self.fault()  # mid-training: processes are up and all-reducing


class FaultyLauncher(Launcher):
    """The real launcher, handed the events wrapper above (no hook of its own)."""

    def __init__(self, inner, phase, fault):
        self.inner, self.phase, self.fault = inner, phase, fault

    collects_outputs = True

    def launch(self, cluster, job, events, log_dir):
        return self.inner.launch(cluster, job, FaultyEvents(events, self.phase, self.fault), log_dir)

    def collect_outputs(self, job, events):
        """The fault strikes as the copy starts; the real copy (and, on ssh, the removal of the run
        folders it holds for it) happens all the same."""
        try:
            if self.phase == "outputs":
                self.fault()
        finally:
            got = self.inner.collect_outputs(job, events)
        return got


class FaultyProvider(Provider):
    """The real provider; the fault strikes as the lifecycle calls `up` (provision) or `down` (teardown)."""

    def __init__(self, inner, phase, fault):
        self.inner, self.phase, self.fault = inner, phase, fault
        self.cloud = inner.cloud
        self.check_is_complete = inner.check_is_complete

    def up(self, spec, events):
        if self.phase == "provision":
            self.fault()
        return self.inner.up(spec, events)

    def down(self, name, events):
        if self.phase == "teardown":
            self.fault()
        return self.inner.down(name, events)

    def leftovers(self, name, run_id=None):
        return self.inner.leftovers(name, run_id)


def _local_backend():
    from gpucluster.infra.local.provider import LocalProvider
    from gpucluster.infra.local.launch import LocalLauncher

    return LocalProvider(), LocalLauncher(grace=2.0)


def marked(marker: str) -> list:
    """Every live process on this machine whose command line carries the marker."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(p.info["cmdline"] or ()):
                found.append(p)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def job_dir(tmp_path, monkeypatch):
    """The user's project folder (shipped to ssh hosts): the stubborn-capable synthetic script and the torch-free plain job."""
    d = tmp_path / "job"
    d.mkdir()
    shutil.copy(FIXTURES / "stubborn.py", d / "stubborn.py")
    shutil.copy(FIXTURES / "plain_job.py", d / "plain_job.py")
    monkeypatch.chdir(d)
    return d


def _run_with_fault(home, spec, provider, launcher, phase, fault_name):
    marker = f"fault-marker-{spec.run_id}"
    fault = Fault(fault_name)
    ledger = FaultyLedger(home / "ledger.sqlite3", phase, fault)
    script = ("plain_job.py",) if phase in PLAIN_PHASES else ("stubborn.py", *JOB_ARGS)
    job = JobSpec(run_id=spec.run_id, command=(sys.executable, "-X", f"marker={marker}", *script),
                  threads_per_proc=1, max_seconds=120,
                  env=(("IGNORE_STOP", "1"),) if fault_name == "double-ctrl-c" else ())
    # A signal that arrives once the run has restored the handlers must not hit pytest itself
    late = signal.signal(signal.SIGINT, lambda *_: None)
    try:
        outcome = execute(spec, job, backend=backend_of(spec.cloud),
                          ledger=ledger, provider=FaultyProvider(provider, phase, fault),
                          launcher=FaultyLauncher(launcher, phase, fault))
    finally:
        fault.finish()
        signal.signal(signal.SIGINT, late)
        leaked = marked(marker)
        for p in leaked:  # whatever the outcome, leave nothing for the next test ...
            p.kill()
    assert leaked == [], "processes left behind (by marker)"  # ... and say so
    assert fault.fired, (f"the {phase} fault point was never reached", outcome.failure,
                         [n["last_lines"][-6:] for n in ledger.get_run(spec.run_id).to_dict()["node_results"]])
    # nothing left: no process on this machine (every "host" is this machine) carries the run id
    assert run_processes(spec.run_id) == []
    run = ledger.get_run(spec.run_id).to_dict()
    assert run["ended_at"] is not None
    assert run["teardown"] == "verified" and run["leftovers"] == [] and run["unchecked"] == []
    assert all(r["confirmed_gone"] for r in run["resources"])
    phases = {p["name"]: p for p in run["phases"]}
    assert all(p["ended_at"] for p in phases.values())
    if phase == "outputs" and fault_name in RAISED:
        # a bug while copying the outputs back: named, the run fails, the teardown still runs
        assert run["status"] == "failed" and run["failure"].startswith("outputs not collected: "), run["failure"]
        assert phases["outputs"]["status"] == "failed"
    elif phase in ("outputs", "teardown"):
        # the run itself succeeded; a failing delete is recorded, the check still proved nothing is
        # left; a signal while the outputs are copied or during teardown is noted, not obeyed
        assert run["status"] == "succeeded" and outcome.exit_code == ExitCode.OK, (
            run["failure"], [n["last_lines"][-8:] for n in run["node_results"]])
        if fault_name in RAISED:
            assert "delete failed" in (phases["teardown"]["detail"] or "")
        assert [o["verdict"] for o in run["outputs"]] == ["complete", "complete"]
    else:
        status, code, text = OUTCOME[fault_name]
        assert run["status"] == status and outcome.exit_code == code, (run["status"], run["failure"])
        assert run["failure"] == text
        assert phases[phase]["status"] in ("failed", "interrupted")
        assert list(phases)[-3:] == [phase, "outputs", "teardown"]  # nothing after the faulty phase but those
        if phase in ("rendezvous", "train"):  # the job started on every node: what it wrote came back
            assert [o["verdict"] for o in run["outputs"]] == ["complete", "complete"]
    assert phases["teardown"]["status"] == "ok"
    return run


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize("phase,fault_name", CASES)
def test_local_fault(home, job_dir, phase, fault_name):
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
@pytest.mark.parametrize("phase,fault_name", CASES)
def test_ssh_fault(home, tmp_path, job_dir, ssh_hosts, phase, fault_name):
    import sshd
    from gpucluster.infra.ssh.provider import SshProvider

    remote_dir = tmp_path / "remote"
    launcher = sshd.make_launcher(ssh_hosts, remote_dir)
    provider = SshProvider(launcher=launcher)
    spec = ClusterSpec(cloud="ssh", nodes=2, name="fm", gpus_per_node=0, run_id=new_run_id(),
                       hosts=tuple(ssh_hosts.hosts[:2]))
    _run_with_fault(home, spec, provider, launcher, phase, fault_name)
    assert not (remote_dir / spec.run_id).exists()
    assert sshd.leaked_ssh_masters() == []


# -- storage faults (issue 32 item 1) ------------------------------------------------------------
# The home ($GPUCLUSTER_HOME: the ledger, node logs, locks) is a real 8 MiB tmpfs. At the phase's
# fault point it fills up (a file written until the kernel says ENOSPC, as a full disk does). (A
# tmpfs with files open for writing cannot be remounted read-only (EBUSY): the read-only home is
# tried before a run, in test_read_only_home_is_refused_before_anything_starts.) Node logs that cannot be written must not stop the draining of the
# job's output; ledger writes that fail must not skip the outputs, the delete, the leftover check
# or the release of ssh sessions. The run ends (never hangs), never with exit 2, with exit 3 and
# `record_error` when its record could not be written; once the disk has room again, `down`
# closes the record.
STORAGE_CASES = [(phase, "enospc") for phase in PHASES]


class StorageFault(Fault):
    def __init__(self, name: str, home: Path):
        super().__init__(name)
        self.home = home

    def __call__(self) -> None:
        if self.fired:
            return
        self.fired = True
        with open(self.home / "filler", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 16))
                    f.flush()
            except OSError:
                pass

    def clear(self) -> None:
        (self.home / "filler").unlink(missing_ok=True)


@pytest.fixture
def small_home(tmp_path, monkeypatch):
    h = tmp_path / "small-home"
    h.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(h)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs as the home")
    monkeypatch.setenv("GPUCLUSTER_HOME", str(h))
    yield h
    subprocess.run(["umount", "-l", str(h)], capture_output=True)


def _run_with_storage_fault(home, spec, provider, launcher, phase, fault_name):
    marker = f"fault-marker-{spec.run_id}"
    fault = StorageFault(fault_name, home)
    ledger = FaultyLedger(home / "ledger.sqlite3", phase, fault)
    script = ("plain_job.py",) if phase in PLAIN_PHASES else ("stubborn.py", *JOB_ARGS)
    from gpucluster.ownership import installation_id

    owner = installation_id(home)  # made at the first command in a home, as `run`'s prepare step makes it
    job = JobSpec(run_id=spec.run_id, command=(sys.executable, "-X", f"marker={marker}", *script),
                  threads_per_proc=1, max_seconds=120, owner=owner)
    done: list = []

    def target():
        try:
            done.append(execute(spec, job, backend=backend_of(spec.cloud),
                                ledger=ledger, provider=FaultyProvider(provider, phase, fault),
                                launcher=FaultyLauncher(launcher, phase, fault)))
        except BaseException as exc:  # noqa: BLE001 - execute must return an outcome, whatever broke
            done.append(exc)

    runner = threading.Thread(target=target, daemon=True)
    try:
        runner.start()
        runner.join(150)  # the job's own limit is 120 s: longer is a hang
    finally:
        leaked = marked(marker)
        for p in leaked:
            p.kill()
        hung = runner.is_alive()
        fault.clear()
    assert not hung, "the run hangs on a full or read-only home"
    assert leaked == [], "processes left behind (by marker)"
    assert fault.fired, f"the {phase} fault point was never reached"
    assert run_processes(spec.run_id) == []
    outcome = done[0]
    assert not isinstance(outcome, BaseException), f"execute raised {outcome!r}"
    assert outcome.exit_code != ExitCode.USAGE
    assert outcome.teardown == "verified", (outcome.teardown, outcome.unchecked, outcome.failure)
    if outcome.record_error:
        assert outcome.exit_code == ExitCode.LEFTOVERS, outcome.exit_code
    # the next command that can write closes the record
    from conftest import run_cli

    ledger = Ledger(home / "ledger.sqlite3")
    if ledger.get_run(spec.run_id).run.ended_at is None:
        assert outcome.record_error, "the row was left open but the run did not say so"
        done_down = run_cli("down", spec.name, "--yes", env={"GPUCLUSTER_HOME": str(home)}, timeout=120)
        assert done_down.returncode == 0, done_down.stderr
    run = Ledger(home / "ledger.sqlite3").get_run(spec.run_id).to_dict()
    assert run["ended_at"] is not None and run["teardown"] == "verified"
    return outcome


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize("phase,fault_name", STORAGE_CASES)
def test_local_storage_fault(small_home, job_dir, phase, fault_name):
    provider, launcher = _local_backend()
    spec = ClusterSpec(cloud="local", nodes=2, name="fm", gpus_per_node=0, run_id=new_run_id())
    _run_with_storage_fault(small_home, spec, provider, launcher, phase, fault_name)


@needs_torch
@pytest.mark.slow
@pytest.mark.sshd
@pytest.mark.parametrize("phase,fault_name", STORAGE_CASES)
def test_ssh_storage_fault(small_home, tmp_path, job_dir, ssh_hosts, phase, fault_name):
    import sshd
    from gpucluster.infra.ssh.provider import SshProvider

    remote_dir = tmp_path / "remote"
    launcher = sshd.make_launcher(ssh_hosts, remote_dir)
    provider = SshProvider(launcher=launcher)
    spec = ClusterSpec(cloud="ssh", nodes=2, name="fm", gpus_per_node=0, run_id=new_run_id(),
                       hosts=tuple(ssh_hosts.hosts[:2]))
    _run_with_storage_fault(small_home, spec, provider, launcher, phase, fault_name)
    assert not (remote_dir / spec.run_id).exists()
    assert sshd.leaked_ssh_masters() == []


def test_read_only_home_is_refused_before_anything_starts(small_home):
    """A home on a read-only file system (EROFS): one line, exit 2, nothing recorded or started."""
    from conftest import run_cli

    env = {"GPUCLUSTER_HOME": str(small_home)}
    assert run_cli("runs", env=env).returncode == 0  # a ledger exists
    subprocess.run(["mount", "-o", "remount,ro", str(small_home)], check=True)
    try:
        marker = f"ro-marker-{os.getpid()}"
        done = run_cli("run", "--cloud", "local", "--nodes", "1", "--", sys.executable, "-X", f"marker={marker}",
                       "-c", "pass", env=env, timeout=120)
        assert done.returncode == 2, (done.returncode, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "Read-only file system" in lines[0], done.stderr
        assert marked(marker) == []
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_home)], check=True)
    assert Ledger(small_home / "ledger.sqlite3").list_runs() == []


FILL_HOME = (  # fills the home until ENOSPC, and survives it
    "fd = os.open(os.path.join(os.environ['FILL_DIR'], 'filler'), os.O_WRONLY | os.O_CREAT)\n"
    "try:  # unbuffered: a buffered file's close would retry the partial write and raise ENOSPC\n"
    "    while True:\n"
    "        os.write(fd, b'\\0' * 65536)\n"
    "except OSError:\n"
    "    pass\n"
    "os.close(fd)\n")


@needs_torch
@pytest.mark.slow
def test_home_filled_by_the_job_itself_cli(small_home, tmp_path):
    """Through the CLI: the job fills $GPUCLUSTER_HOME (a real 8 MiB tmpfs) until ENOSPC, then
    reports its metrics and exits 0. gpucluster cannot write its record any more: the run must
    end, tear down and check all the same, exit 3 (never 2) with one line saying the record
    could not be written, and no traceback; `down`, once there is room, closes the row."""
    from conftest import run_cli

    script = tmp_path / "fill.py"
    script.write_text(
        "import os\n" + FILL_HOME +
        "for i in range(50):\n"
        "    print('@gpucluster-metric {\"kind\": \"step\", \"step\": %d, \"loss\": 0.5}' % i, flush=True)\n")
    env = {"GPUCLUSTER_HOME": str(small_home), "FILL_DIR": str(small_home)}
    r = run_cli("run", "--cloud", "local", "--nodes", "1", "--", "python", str(script), env=env, timeout=180)
    (small_home / "filler").unlink(missing_ok=True)
    # gpucluster's own output (the node's lines, torchrun's included, are the job's)
    ours = [ln for ln in (r.stdout + r.stderr).splitlines() if not ln.startswith("[node ")]
    assert not any("Traceback" in ln for ln in ours), r.stderr[-3000:]
    assert r.returncode == 3, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("gpucluster: error:")]
    assert len(errors) == 1 and "record could not be written" in errors[0], r.stderr
    ledger = Ledger(small_home / "ledger.sqlite3")
    (run,) = ledger.list_runs()
    assert run_processes(run.id) == []
    down = run_cli("down", run.cluster, "--yes", env=env, timeout=120)  # the default name carries the owner id
    assert down.returncode == 0, down.stderr
    run = Ledger(small_home / "ledger.sqlite3").get_run(run.id).to_dict()
    assert run["ended_at"] is not None and run["status"] != "running" and run["teardown"] == "verified"


# -- a full home meets the run's other ends, `up` and `sweep` (issue 32 items 1, 11) ---------------
FILL_THEN_WAIT = (
    "import os, sys, time\n" + FILL_HOME +
    "print('the home is full', flush=True)\n"
    "time.sleep(600)  # quiet: only the utilisation sampler writes the ledger now\n")


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize("end", ["max-minutes", "ctrl-c"])
def test_full_home_then_the_time_limit_or_ctrl_c_cli(small_home, tmp_path, end):
    """The job fills $GPUCLUSTER_HOME (a real 8 MiB tmpfs) and then goes on quietly. Its record can
    no longer be written, which does not stop a healthy job (it goes on, said once); the run then
    ends by --max-minutes or a real Ctrl-C: exit 3 (never 2, never a hang) with one line saying the
    record could not be written, no traceback of gpucluster's, nothing left; `down` closes the row."""
    import time

    from conftest import gpucluster_argv

    marker = f"full-{end}-{os.getpid()}"
    script = tmp_path / "fill_wait.py"
    script.write_text(FILL_THEN_WAIT)
    env = dict(os.environ, GPUCLUSTER_HOME=str(small_home), FILL_DIR=str(small_home), COLUMNS="200")
    limit = ["--max-minutes", "0.5"] if end == "max-minutes" else []
    t0 = time.monotonic()
    proc = subprocess.Popen(gpucluster_argv("run", "--cloud", "local", "--nodes", "1", *limit, "--", "python", "-X",
                                            f"marker={marker}", str(script)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        if end == "ctrl-c":
            while not (small_home / "filler").exists() or os.statvfs(small_home).f_bavail > 0:
                assert proc.poll() is None and time.monotonic() - t0 < 120, "the home never filled"
                time.sleep(0.2)
            time.sleep(6)  # the sampler's records have failed to be written by now; the job goes on
            assert proc.poll() is None, "a full home stopped the job"
            os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        leaked = marked(marker)
        for p in leaked:
            p.kill()
        (small_home / "filler").unlink(missing_ok=True)
    took = time.monotonic() - t0
    assert leaked == [], "processes left behind (by marker)"
    ours = [ln for ln in (out + err).splitlines() if not ln.startswith("[node ")]
    assert not any("Traceback" in ln for ln in ours), err[-3000:]
    assert proc.returncode == 3, (proc.returncode, out[-2000:], err[-2000:])
    errors = [ln for ln in err.splitlines() if ln.startswith("gpucluster: error:")]
    assert len(errors) == 1 and "record could not be written" in errors[0], err
    assert "the job goes on" in " ".join((out + err).split())  # said once (the console may wrap it)
    if end == "max-minutes":
        assert took >= 30, took  # the limit ended it, not the full home
    (run,) = Ledger(small_home / "ledger.sqlite3").list_runs()
    assert run_processes(run.id) == []
    down = run_cli_home(small_home, "down", run.cluster, "--yes")  # the default name carries the owner id
    assert down.returncode == 0, down.stderr
    run = Ledger(small_home / "ledger.sqlite3").get_run(run.id).to_dict()
    assert run["ended_at"] is not None and run["status"] != "running" and run["teardown"] == "verified"


def run_cli_home(home, *args):
    from conftest import run_cli

    return run_cli(*args, env={"GPUCLUSTER_HOME": str(home)}, timeout=120)


@needs_torch
@pytest.mark.slow
def test_sweep_whose_home_fills_stops_with_exit_3_cli(small_home, tmp_path):
    """A sweep over 1 and 2 nodes whose first job fills the home: that run still ends, tears down
    and checks; the sweep does not start the next size (it could not be recorded) and ends with
    exit 3 and the one line (it returned 0 or 1, or 2 from the next size's row, before)."""
    script = tmp_path / "fill.py"
    script.write_text(FILL_THEN_WAIT.replace("time.sleep(600)", "time.sleep(1)"))
    from conftest import run_cli

    r = run_cli("sweep", "--cloud", "local", "--nodes", "1,2", "--", "python", str(script),
                env={"GPUCLUSTER_HOME": str(small_home), "FILL_DIR": str(small_home)}, timeout=240)
    (small_home / "filler").unlink(missing_ok=True)
    ours = [ln for ln in (r.stdout + r.stderr).splitlines() if not ln.startswith("[node ")]
    assert not any("Traceback" in ln for ln in ours), r.stderr[-3000:]
    assert r.returncode == 3, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("gpucluster: error:")]
    assert len(errors) == 1 and "record could not be written" in errors[0], r.stderr
    runs = Ledger(small_home / "ledger.sqlite3").list_runs()
    assert [x.nodes for x in runs] == [1], [x.nodes for x in runs]  # the 2-node size never started
    assert run_processes(runs[0].id) == []


def test_up_whose_home_fills_as_the_cluster_comes_up(small_home, monkeypatch, capsys):
    """`up --cloud aws` (the fake Pulumi CLI, tests/pulumi_fake.py): the home fills (ENOSPC) just
    as the cluster is up, so the success cannot be recorded. The cluster exists and bills: `up`
    shows it, keeps it (no destroy) and ends with exit 3 and the one line; it raised LedgerError
    before (exit 2, "bad input, nothing was started"). `down`, with room again, removes it."""
    pytest.importorskip("pulumi.automation")
    from pulumi_fake import FakePulumiCommand
    from test_automation import provider

    from gpucluster.cli import common, down, up
    from gpucluster.errors import TeardownIncomplete

    fake = FakePulumiCommand()
    fault = StorageFault("enospc", small_home)

    class FillsAfterUp:
        """The real provider; the disk fills as its `up` returns."""

        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def up(self, spec, events):
            cluster = self.inner.up(spec, events)
            fault()
            return cluster

    monkeypatch.setattr(common, "provider_for", lambda cloud, **scope: FillsAfterUp(provider(fake).scoped(**scope)))
    try:
        with pytest.raises(TeardownIncomplete) as done:
            up.up.main(["--cloud", "aws", "--name", "demo", "--nodes", "2", "--ssh-cidr", "203.0.113.7/32", "--yes"],
                       prog_name="gpucluster up", standalone_mode=False)
    finally:
        fault.clear()
    assert done.value.exit_code == ExitCode.LEFTOVERS and "demo is up and kept" in done.value.message
    assert "record could not be written" in done.value.message and "gpucluster down demo" in done.value.message
    assert "203.0.113.10" in capsys.readouterr().out  # the cluster is shown
    assert "destroy" not in fake.verbs()
    assert down.down.main(["demo", "--yes"], prog_name="gpucluster down", standalone_mode=False) == 0
    assert fake.verbs()[-1] == "destroy" or "destroy" in fake.verbs()
    (run,) = Ledger(small_home / "ledger.sqlite3").list_runs()
    assert run.status != "running" and run.teardown == "verified"
