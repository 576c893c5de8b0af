"""The launch sequence written once (gpucluster/watch/sequence.py, issue 39 item 5): a fake
transport records each step; the order, stop and release on an exception (Ctrl-C included) in each
step, the rendezvous port retried once and only once, the run held for collect_outputs."""

from __future__ import annotations

import pytest

from gpucluster.events import NullEvents, Phase
from gpucluster.watch.launch import JobResult, JobSpec, NodeResult
from gpucluster.watch.metrics import MetricsState
from gpucluster.watch.sequence import PortRetry, Runs, Transport, launch_sequence, port_taken

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

TAKEN = "DistNetworkError: ... port: 29400, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"


class Events(NullEvents):
    def __init__(self) -> None:
        self.phases: list[Phase] = []
        self.messages: list[str] = []
        self.metrics: list[tuple[int, dict]] = []

    def on_phase(self, phase: Phase) -> None:
        self.phases.append(phase)

    def message(self, text: str) -> None:
        self.messages.append(text)

    def on_metric(self, node_rank: int, record: dict) -> None:
        self.metrics.append((node_rank, record))


def _result(ok: bool = True, taken: bool = False) -> JobResult:
    return JobResult(ok=ok, nodes=[NodeResult(0, "n0", 0 if ok else 1, [TAKEN] if taken else [])],
                     metrics=MetricsState(), failure=None if ok else "node 0 failed")


class Fake(Transport):
    """Every step recorded; `fail` raises `exc` in that step; `results` are the attempts' results."""

    ready_phase = checks_first = True
    port_retry = PortRetry("n0", "after it was found free", "after the check")

    def __init__(self, fail: str | None = None, exc: BaseException | None = None, results=(), staged=True,
                 started=True):
        self.calls: list[str] = []
        self.fail, self.exc = fail, exc or RuntimeError("boom")
        self.results = list(results) or [_result()]
        self.staged, self.did_start = staged, started
        self.ports = iter([30001, 30002, 30003])
        self.jobs: list[JobSpec] = []

    def _step(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail:
            raise self.exc

    def open(self): self._step("open")
    def wait_ready(self): self._step("wait_ready")
    def ship(self, job): self._step("ship")
    def check(self, job): self._step("check")

    def lay_work(self, job):
        self._step("lay_work")
        return job

    def stages(self, job): return self.staged
    def stage(self, job): self._step("stage")

    def rendezvous(self, job):
        self._step("rendezvous")
        return job

    def another_port(self, taken):
        self._step("another_port")
        return next(self.ports)

    def again(self, job):
        self._step("again")
        return job

    def start(self, job):
        self.jobs.append(job)
        self._step("start")

    def stop(self): self._step("stop")

    def watch(self, job):
        self._step("watch")
        return self.results.pop(0)

    def end_attempt(self, job): self._step("end_attempt")
    def started(self, job): return self.did_start
    def hold(self, job): self._step("hold")
    def clean(self, job): self._step("clean")
    def failed(self, exc): self.calls.append(f"failed:{type(exc).__name__}")
    def release(self): self._step("release")
    def explain(self, result): self._step("explain")


JOB = JobSpec("seq1", command=("python", "train.py"), check=None)
STEPS = ["open", "wait_ready", "ship", "lay_work", "stage", "rendezvous", "start", "watch", "end_attempt"]


def test_the_steps_run_in_order_with_their_phases():
    t, events = Fake(), Events()
    result = launch_sequence(t, JOB, events)
    assert result.ok
    assert t.calls == [*STEPS, "clean", "release", "explain"]
    assert events.phases == [Phase.READY, Phase.STAGE]


def test_the_check_runs_after_shipping_with_its_phase(tmp_path):
    from gpucluster.watch.health import HealthSpec

    t, events = Fake(staged=False), Events()
    launch_sequence(t, JobSpec("seq2", command=("x",), check=HealthSpec()), events)
    assert t.calls[:5] == ["open", "wait_ready", "ship", "check", "lay_work"]
    assert events.phases == [Phase.READY, Phase.CHECK]


def test_a_transport_that_checks_in_its_pods_has_no_check_step():
    from gpucluster.watch.health import HealthSpec

    class Pods(Fake):
        ready_phase = checks_first = False
        port_retry = None

    t, events = Pods(staged=False), Events()
    launch_sequence(t, JobSpec("seq3", command=("x",), check=HealthSpec()), events)
    assert "check" not in t.calls and events.phases == []


@pytest.mark.parametrize("step", ["open", "wait_ready", "ship", "lay_work", "stage", "rendezvous", "start", "watch"])
@pytest.mark.parametrize("exc", [LookupError("boom"), KeyboardInterrupt()])
def test_an_exception_in_any_step_stops_what_started_and_releases(step, exc):
    t = Fake(fail=step, exc=exc, started=False)
    with pytest.raises(type(exc)):
        launch_sequence(t, JOB, Events())
    calls = t.calls
    assert calls[-2:] == [f"failed:{type(exc).__name__}", "release"]  # the connections always go
    assert "explain" not in calls
    if step in ("open", "wait_ready"):  # no run folders yet: nothing to clean
        assert "clean" not in calls
    else:
        assert calls[-3] == "clean"
    if step == "start":
        assert calls[calls.index("start") + 1:calls.index("start") + 3] == ["stop", "end_attempt"]
    if step == "watch":  # the supervisor stopped what runs; the attempt still ends
        assert "stop" not in calls and "end_attempt" in calls


def test_an_exception_after_the_start_holds_what_has_outputs():
    t = Fake(fail="watch", exc=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        launch_sequence(t, JobSpec("seq4", command=("x",), output_dir="/tmp/out"), Events())
    assert t.calls[-2:] == ["hold", "failed:KeyboardInterrupt"] and "release" not in t.calls


def test_a_job_with_an_output_folder_is_held_for_collect_outputs():
    t = Fake()
    launch_sequence(t, JobSpec("seq5", command=("x",), output_dir="/tmp/out"), Events())
    assert t.calls[-2:] == ["hold", "explain"] and "clean" not in t.calls and "release" not in t.calls


def test_nothing_started_nothing_held():
    t = Fake(started=False)
    launch_sequence(t, JobSpec("seq6", command=("x",), output_dir="/tmp/out"), Events())
    assert t.calls[-3:] == ["clean", "release", "explain"]


def test_a_port_taken_at_the_bind_is_retried_once_said_and_recorded():
    t, events = Fake(results=[_result(ok=False, taken=True), _result()]), Events()
    result = launch_sequence(t, JOB, events)
    assert result.ok
    assert t.calls == [*STEPS, "another_port", "again", "start", "watch", "end_attempt", "clean", "release", "explain"]
    assert [j.rdzv_port for j in t.jobs] == [JOB.rdzv_port, 30001]
    assert events.messages == [f"rendezvous port {JOB.rdzv_port} on node 0 (n0) was taken by another process after "
                               "it was found free (EADDRINUSE): starting once more on port 30001"]
    assert events.metrics == [(0, {"kind": "rdzv_port", "port": 30001, "busy_port": JOB.rdzv_port,
                                   "holder": "another process, after the check (EADDRINUSE)"})]


def test_a_port_taken_twice_is_not_retried_again_and_names_both_ports():
    t = Fake(results=[_result(ok=False, taken=True), _result(ok=False, taken=True), _result()])
    result = launch_sequence(t, JOB, Events())
    assert t.calls.count("start") == 2 and t.calls.count("another_port") == 1
    assert not result.ok and f"port {JOB.rdzv_port}, then port 30001, on node 0 (n0)" in result.failure
    assert result.failure.endswith("; node 0 failed")


def test_no_retry_without_port_retry_or_without_eaddrinuse():
    class NoRetry(Fake):
        port_retry = None

    t = NoRetry(results=[_result(ok=False, taken=True)])
    assert not launch_sequence(t, JOB, Events()).ok and t.calls.count("start") == 1
    t = Fake(results=[_result(ok=False)])
    assert not launch_sequence(t, JOB, Events()).ok and t.calls.count("start") == 1


def test_port_taken_only_before_training():
    assert port_taken(_result(ok=False, taken=True))
    late = _result(ok=False, taken=True)
    late.train_started_at = 1.0
    assert not port_taken(late) and not port_taken(_result(taken=True))


def test_the_base_steps_are_no_ops_but_start_and_watch():
    t = Transport()
    assert t.lay_work(JOB) is JOB and t.rendezvous(JOB) is JOB and t.again(JOB) is JOB
    assert not t.stages(JOB) and not t.started(JOB)
    for step in (t.open, t.wait_ready, t.stop, t.release):
        step()
    with pytest.raises(NotImplementedError):
        t.start(JOB)


def test_runs_keeps_one_record_per_run():
    runs: Runs[list[int]] = Runs()
    rec = runs.put("a", [1])
    assert runs.get("a") is rec and runs.take("a") is rec and runs.get("a") is None and runs.take("a") is None
