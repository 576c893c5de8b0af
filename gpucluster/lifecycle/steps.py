"""The run lifecycle, shared by every backend:
    validate -> plan -> ledger row -> provision -> ready -> rendezvous/train -> teardown -> verify -> cost

`execute()` writes the run row before anything is created, records every phase, resource, node exit
code and metric as it happens, and tears down in a `finally` that also runs on Ctrl-C, SIGTERM,
SIGHUP and exceptions; after the first signal, or once teardown began, no signal cuts the stopping of
processes, the teardown or its check short. Verdicts: verified / leftovers / not verified (exit 3)."""

from __future__ import annotations

import contextlib
import signal
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from gpucluster.domain import VERIFIED, Check, Provider
from gpucluster.errors import ClusterBusy, ExitCode, GpuclusterError, ProvisionError, TeardownIncomplete
from gpucluster.ledger import recording
from gpucluster.events import Phase
from gpucluster.watch.launch import JobResult, JobSpec, Launcher
from gpucluster.ledger.store import Ledger, LedgerError
from gpucluster.ledger.records import UP_COMMAND
from gpucluster.ledger.recording import MetricBuffer, Provisioned, Quiet as _Quiet, going_on as _going_on, quietly as _quietly
from gpucluster.ledger.recording import record_line
from gpucluster.lifecycle.owner import owner_lock
from gpucluster.costing.guards import ProvisionWatch, accrued_of, store_cost
from gpucluster.spec import ClusterSpec
from gpucluster.states import PhaseStatus, RunStatus, TeardownVerdict

if TYPE_CHECKING:
    from gpucluster.ledger.records import JsonObject
    from gpucluster.infra.contract import Plugin


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (the terminal closed), delivered to the main thread like Ctrl-C."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class RunUI(Protocol):
    """What a run shows: the phase, each node's lines and metric records, messages (kept in the
    log) and transient progress (a status line)."""

    def phase(self, name: str) -> None: ...
    def line(self, node_rank: int, text: str) -> None: ...
    def metric(self, node_rank: int | None, record: JsonObject) -> None: ...
    def message(self, text: str) -> None: ...
    def progress(self, text: str) -> None: ...
    def stopping(self, signal_name: str) -> None: ...  # a stop signal: the first one, or a later one


class QuietUI:
    """Shows nothing (a run driven by a script or a test)."""

    def phase(self, name: str) -> None: ...
    def line(self, node_rank: int, text: str) -> None: ...
    def metric(self, node_rank: int | None, record: JsonObject) -> None: ...
    def message(self, text: str) -> None: ...
    def progress(self, text: str) -> None: ...
    def stopping(self, signal_name: str) -> None: ...


@dataclass
class RunOutcome:
    run_id: str
    status: RunStatus
    exit_code: ExitCode
    failure: str | None
    result: JobResult | None
    teardown: TeardownVerdict | None  # None: nothing to check
    leftovers: list[JsonObject] = field(default_factory=list)
    log_dir: str | None = None
    unchecked: list[str] = field(default_factory=list)
    record_error: str | None = None  # the run's record could not be written (then exit 3)
    # "capacity" or "quota": the create failed for want of it (`ProvisionError.cause`; failover and recovery)
    cause: str | None = None

    @property
    def teardown_verified(self) -> bool | None:
        return None if self.teardown in (None, TeardownVerdict.KEPT) else self.teardown is VERIFIED


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class RunSignals:
    """Ctrl-C, SIGTERM and SIGHUP for the whole of a run.

    The first one interrupts the run: it raises in the main thread (KeyboardInterrupt, or
    `Terminated` for SIGTERM/SIGHUP) and from that moment, or from the start of teardown, every later
    signal is noted and never obeyed, so that neither the launcher's stopping of processes (which
    ends in SIGKILL after its grace period, so it stays bounded) nor the teardown and its check can be
    cut short by a second Ctrl-C. Outside the main thread (tests) it does nothing."""

    def __init__(self, ui: "RunUI"):
        self.ui = ui
        self.received: int | None = None
        self.shielded = False
        self._old: dict[int, Callable[[int, FrameType | None], object] | int | None] | None = None

    def __enter__(self) -> "RunSignals":
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handler) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        if self._old:
            for s, old in self._old.items():
                signal.signal(s, old)

    def shield(self) -> None:
        self.shielded = True

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.ui.stopping(signal.Signals(signum).name)  # the first: one line; a later one: what it waits for
        if self.shielded or self.received is not None:
            return
        self.received = signum
        self.shielded = True
        raise KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


class LedgerEvents:
    """ProvisionEvents -> ledger rows: the one adapter from a provider's events to the ledger.

    With a `run_id` (a run, `up`), requests, creations and deletions are that run's rows; without
    one (`down`), a deletion closes every open row of `cluster` with that kind and name (or id)."""

    def __init__(self, ledger: Ledger, cluster: str | None, run_id: str | None = None, region: str | None = None,
                 say: Callable[[str], None] | None = None):
        self.ledger, self.cluster, self.run_id, self.region = ledger, cluster, run_id, region
        self.say = say or (lambda text: None)

    def resource_requested(self, kind: str, name: str, **detail: Any) -> None:  # Any: JSON detail
        if self.run_id:
            self.ledger.resource_requested(self.run_id, kind, name, region=detail.pop("region", self.region),
                                           detail=detail or None)

    def resource_created(self, kind: str, name: str, cloud_id: str | None = None, **detail: Any) -> None:  # Any: JSON detail
        if self.run_id:
            self.ledger.resource_created(self.run_id, kind, name, cloud_id)

    def resource_deleted(self, kind: str, name: str, cloud_id: str | None = None) -> None:
        if self.run_id:
            self.ledger.resource_deleted(self.run_id, kind, name)
            return
        for row in self.ledger.open_resources(self.cluster):
            if row["kind"] == kind and (row["name"] == name or (cloud_id and row.get("cloud_id") == cloud_id)):
                self.ledger.resource_deleted(row["run_id"], row["kind"], row["name"])

    def message(self, text: str) -> None:
        self.say(text)


class RunLedger(LedgerEvents):
    """One run's ledger writer: its resource rows (as `LedgerEvents`), its phases, its metric
    records and the processes its launcher started. It writes; it shows nothing."""
    run_id: str  # never None here: a run's writer (LedgerEvents' is None for `down`)

    def __init__(self, ledger: Ledger, run_id: str, region: str | None):
        super().__init__(ledger, None, run_id, region)
        self.current_phase: Phase | None = None
        self.spawned: list[tuple[str, str]] = []
        self.metrics = MetricBuffer(ledger, run_id)  # never waits on another process's lock (recording.py)

    def start_phase(self, phase: Phase) -> None:
        """End the current phase ("ok") and start `phase`."""
        if self.current_phase:
            self.ledger.phase_end(self.run_id, self.current_phase.value, PhaseStatus.OK)
        self.current_phase = phase
        self.ledger.phase_start(self.run_id, phase.value)

    def end_phase(self, status: PhaseStatus, detail: str | None = None) -> None:
        if self.current_phase:
            self.ledger.phase_end(self.run_id, self.current_phase.value, status, detail)
            self.current_phase = None

    def add_metric(self, node_rank: int, record: JsonObject) -> None:
        self.metrics.add(node_rank, record)

    def spawn(self, node_rank: int, kind: str, ident: str) -> None:
        """A node's process: a resource row, requested and created at once, closed by a verified teardown."""
        name = f"node-{node_rank}"
        self.ledger.resource_requested(self.run_id, kind, name, detail={"pid": ident})
        self.ledger.resource_created(self.run_id, kind, name, ident)
        self.spawned.append((kind, name))


class _Recorder:
    """The run's event sink (`RunEvents`, what providers and launchers report): each event goes to
    the run's ledger writer (`RunLedger`), then to the `RunUI`. It holds no state of its own."""

    record_error: str | None = None  # the first ledger write that failed once the row existed

    def __init__(self, ledger: Ledger, run_id: str, ui: RunUI, region: str | None, backend: Plugin | None = None,
                 priced: str | None = None):
        self.book = RunLedger(ledger, run_id, region)
        self.ui = ui
        self.accrued_cost = accrued_of(ledger, priced or run_id, backend)  # RunEvents: cost so far (guards.py)

    @property
    def ledger(self) -> Ledger:
        return self.book.ledger

    @property
    def run_id(self) -> str:
        return self.book.run_id

    @property
    def spawned(self) -> list[tuple[str, str]]:
        return self.book.spawned

    # the lifecycle's own phases
    def start_phase(self, phase: Phase) -> None:
        self.book.start_phase(Phase(phase))
        self.ui.phase(str(phase))

    def end_phase(self, status: PhaseStatus, detail: str | None = None) -> None:
        self.book.end_phase(status, detail)

    # ProvisionEvents
    def resource_requested(self, kind: str, name: str, **detail: Any) -> None:  # Any: JSON detail
        self.book.resource_requested(kind, name, **detail)

    def resource_created(self, kind: str, name: str, cloud_id: str | None = None, **detail: Any) -> None:  # Any: JSON detail
        self.book.resource_created(kind, name, cloud_id, **detail)

    def resource_deleted(self, kind: str, name: str, cloud_id: str | None = None) -> None:
        self.book.resource_deleted(kind, name, cloud_id)

    def message(self, text: str) -> None:
        self.ui.message(text)

    # RunEvents
    def progress(self, text: str) -> None:
        """A transient status (e.g. waiting for nodes): the status line, not the log."""
        self.ui.progress(text)

    def on_line(self, node_rank: int, line: str) -> None:
        self.ui.line(node_rank, line)

    def on_metric(self, node_rank: int | None, record: JsonObject) -> None:
        self.book.metrics.add(node_rank, record, self.ui.message)  # waits on no lock; a full home: the job goes on
        self.ui.metric(node_rank, record)

    def on_phase(self, phase: Phase) -> None:
        if phase != self.book.current_phase:
            _going_on(self, self.start_phase, phase)

    def on_spawn(self, node_rank: int, kind: str, ident: str) -> None:
        self.book.spawn(node_rank, kind, ident)


def execute(
    spec: ClusterSpec,
    job: JobSpec,
    *,
    ledger: Ledger,
    provider: Provider,
    launcher: Launcher,
    backend: Plugin,  # the plugin of spec.cloud, given by the caller: its pricing costs the run at the end
    ui: RunUI | None = None,
    keep: bool = False,
    prices: JsonObject | None = None,
    sweep_id: str | None = None,
    log_dir: Path | str | None = None,
    workload: str | None = None,
    resumed_from: str | None = None,
) -> RunOutcome:
    """Run one job on one cluster, end to end. Never raises for run failures: returns the outcome."""
    from gpucluster.home import runs_dir
    from gpucluster.watch.procs import raise_open_files

    raise_open_files()  # a file or socket per node: 64 nodes would pass macOS's default of 256
    ui = ui or QuietUI()
    run_id = job.run_id
    log_dir = Path(log_dir) if log_dir else runs_dir(run_id)
    if job.output_dir is None and launcher.collects_outputs:  # default: $GPUCLUSTER_HOME/runs/RUN_ID/outputs
        job = replace(job, output_dir=str(runs_dir(run_id) / "outputs"))
    # The owner lock (kernel-released when this process dies) is held from before the ledger row to the end of the
    # teardown check: `down` refuses a live run. A cluster another live process owns is refused before any record.
    recorded = False
    try:
        with owner_lock(spec.name, "run", run_id=run_id), RunSignals(ui) as signals:
            ledger.create_run(
                run_id, cloud=spec.cloud, cluster=spec.name, nodes=spec.nodes, gpus_per_node=spec.gpus_per_node,
                command=list(job.command) or [f"workload:{job.workload}", *job.workload_args], spec=spec.to_dict(),
                workload=workload or job.workload, prices=prices, sweep_id=sweep_id, log_dir=str(log_dir),
                resumed_from=resumed_from)
            recorded = True
            return _run(spec, job, ledger, provider, launcher, backend, ui, keep, log_dir, signals)
    finally:
        if not recorded:  # refused before the row (a busy cluster, an unusable lock): nothing left behind
            with contextlib.suppress(OSError):
                Path(log_dir).rmdir()  # only when empty


@dataclass
class _Ending:
    """How a run's job ended, as `_run` records it (failed until it is known otherwise)."""

    status: RunStatus = RunStatus.FAILED
    failure: str | None = None
    exit_code: ExitCode = ExitCode.FAILURE
    result: JobResult | None = None
    busy: bool = False  # the cluster was busy (another process's): nothing of it is torn down
    cause: str | None = None  # a failed create's `ProvisionError.cause` ("capacity", "quota")


def _run(spec: ClusterSpec, job: JobSpec, ledger: Ledger, provider: Provider, launcher: Launcher, backend: Plugin,
         ui: RunUI, keep: bool, log_dir: Path, signals: RunSignals) -> RunOutcome:
    run_id = job.run_id
    rec = _Recorder(ledger, run_id, ui, spec.region, backend, job.cost_of)
    end = _Ending()
    capped = ProvisionWatch(job, rec)  # --max-cost while the cluster is created (guards.py)
    try:
        _launch_and_watch(spec, job, ledger, provider, launcher, rec, log_dir, capped, end)
    finally:
        signals.shield()  # from here on no signal can cut the copy, the teardown or its check short
        # From here on a ledger write that fails (a full or read-only home) is remembered, never
        # raised: the outputs, the provider's down, the leftover check and the release of sessions
        # all still run.
        quiet = _Quiet(rec)
        problems = _collect_outputs(launcher, job, quiet)  # before teardown: it removes the node folders
        check = _teardown(spec, run_id, provider, quiet, keep=keep, busy=end.busy,
                          unwitnessed=end.result.unwitnessed if end.result else ())
    if problems:  # outputs that did not all come back: the run did not succeed, whatever else happened
        if end.status is RunStatus.SUCCEEDED:
            end.status, end.exit_code = RunStatus.FAILED, ExitCode.FAILURE
        end.failure = "; ".join(([end.failure] if end.failure else []) + problems)
    teardown, leftovers, unchecked = _teardown_verdict(end, check, keep)
    teardown, unchecked = _launcher_cleanup(end, launcher, teardown, unchecked)
    _quietly(rec, rec.book.metrics.flush, rec.ui.message)  # what waited in memory for a locked ledger
    result = end.result
    _quietly(rec, ledger.finish_run, run_id, status=end.status, exit_code=int(end.exit_code), failure=end.failure,
             metrics=result.metrics.summary() if result else None,
             teardown=teardown, leftovers=leftovers, unchecked=unchecked)
    _quietly(rec, store_cost, ledger, run_id, backend)
    if rec.record_error:  # the ledger does not say what happened: never a clean exit
        end.exit_code = ExitCode.LEFTOVERS
    return RunOutcome(run_id, end.status, end.exit_code, end.failure, result, teardown, leftovers, str(log_dir),
                      unchecked, record_error=rec.record_error, cause=end.cause)


def _launch_and_watch(spec: ClusterSpec, job: JobSpec, ledger: Ledger, provider: Provider, launcher: Launcher,
                      rec: _Recorder, log_dir: Path, capped: ProvisionWatch, end: _Ending) -> None:
    """The cluster is made (under `capped`) and the job run on it; how it ended goes into `end` (an
    interrupt, a gpucluster error and a bug in the tool included: the teardown still follows)."""
    try:
        rec.start_phase(Phase.PREPARE)
        rec.start_phase(Phase.PROVISION)
        with capped:
            cluster = provider.up(spec, rec)
        rec.start_phase(Phase.READY)  # the launcher waits for the nodes (ssh, pods) inside launch
        end.result = result = launcher.launch(cluster, job, rec, log_dir)
        for node in result.nodes:
            _quietly(rec, ledger.record_node, job.run_id, node.node_rank, node.host, node.exit_code, node.last_lines)
        if result.ok:
            end.status, end.exit_code = RunStatus.SUCCEEDED, ExitCode.OK
            _quietly(rec, rec.end_phase, PhaseStatus.OK)
        else:
            end.failure = result.failure
            if result.stopped_by == "cost":  # the cap stopped it: its own status and exit code
                end.status, end.exit_code = RunStatus.STOPPED, ExitCode.COST_CAP
            _quietly(rec, rec.end_phase, PhaseStatus.FAILED, end.failure)
    except KeyboardInterrupt as exc:
        end.status, end.exit_code = ((RunStatus.STOPPED, ExitCode.COST_CAP) if capped.reason
                                     else (RunStatus.INTERRUPTED, ExitCode.INTERRUPTED))
        end.failure = capped.reason or (f"stopped by {exc.args[0]}" if isinstance(exc, Terminated)
                                        else "stopped by Ctrl-C")
        _quietly(rec, rec.end_phase, PhaseStatus.INTERRUPTED, end.failure)
    except GpuclusterError as exc:
        end.busy = isinstance(exc, ClusterBusy)
        if isinstance(exc, LedgerError):  # the record cannot be written: stop, tear down, exit 3
            rec.record_error = rec.record_error or exc.message
        end.failure = exc.message
        end.cause = exc.cause if isinstance(exc, ProvisionError) else None
        end.exit_code = exc.exit_code if exc.exit_code != ExitCode.USAGE else ExitCode.FAILURE
        _quietly(rec, rec.end_phase, PhaseStatus.FAILED, end.failure)
    except Exception as exc:  # a bug in the tool: still tear down, still record
        end.failure = f"internal error: {type(exc).__name__}: {exc}"
        _quietly(rec, rec.end_phase, PhaseStatus.FAILED, end.failure)


def _teardown_verdict(end: _Ending, check: Check | None,
                      keep: bool) -> tuple[TeardownVerdict | None, list[JsonObject], list[str]]:
    """The run's teardown verdict, leftovers and unchecked lines; a check not verified makes the
    exit code 3 (something may still exist and bill: that outranks every other outcome)."""
    if check is None:
        return (TeardownVerdict.KEPT if keep and not end.busy else None), [], []
    if not check.verified:
        end.exit_code = ExitCode.LEFTOVERS
    return check.verdict, check.to_dict()["leftovers"], list(check.unchecked)


def _launcher_cleanup(end: _Ending, launcher: Launcher, teardown: TeardownVerdict | None,
                      unchecked: list[str]) -> tuple[TeardownVerdict | None, list[str]]:
    """What the launcher could not delete: on a cluster that stays, the teardown is not verified
    (exit 3); on one deleted (with what the launcher made on it), still said in the failure."""
    cleanup = [f"the launcher could not delete {e}" for e in launcher.cleanup_errors]
    if cleanup and teardown in (TeardownVerdict.KEPT, None):  # the cluster stays: what the launcher left on it is not verified gone
        end.exit_code = ExitCode.LEFTOVERS
        return TeardownVerdict.NOT_VERIFIED, unchecked + cleanup
    if cleanup:  # the cluster was deleted, and what the launcher made on it with it; still said
        end.failure = "; ".join(([end.failure] if end.failure else []) + cleanup)
    return teardown, unchecked


def provision_only(spec: ClusterSpec, *, ledger: Ledger, provider: Provider, backend: Plugin,
                   ui: RunUI | None = None, prices: JsonObject | None = None) -> Provisioned:
    """`gpucluster up`: the run's bookkeeping without a job. Under the owner lock (a cluster another live process
    owns is refused before anything is recorded): the ledger row, the provision phase and, on success, the row
    finished as "kept". On a failure or an interrupt, the same teardown and independent check as `execute`, its
    cost priced by `backend` (the plugin of `spec.cloud`); then the error is raised again (a check that is not
    verified raises `TeardownIncomplete` instead, exit 3). Returns `Provisioned` (cluster, record error)."""
    ui = ui or QuietUI()
    run_id = spec.run_id
    if run_id is None:
        raise ValueError("provision_only: the spec has no run id (prepare gives every planned spec one)")
    with owner_lock(spec.name, "up", run_id=run_id), RunSignals(ui) as signals:
        ledger.create_run(run_id, cloud=spec.cloud, cluster=spec.name, nodes=spec.nodes,
                          gpus_per_node=spec.gpus_per_node, command=list(UP_COMMAND), spec=spec.to_dict(),
                          workload=None, prices=prices)
        rec = _Recorder(ledger, run_id, ui, spec.region)
        try:
            rec.start_phase(Phase.PROVISION)
            cluster = provider.up(spec, rec)
        except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - whatever stopped `up`, teardown and its check run
            if isinstance(exc, KeyboardInterrupt):
                status, exit_code = RunStatus.INTERRUPTED, ExitCode.INTERRUPTED
                failure = f"stopped by {exc.args[0]}" if isinstance(exc, Terminated) else "stopped by Ctrl-C"
            elif isinstance(exc, GpuclusterError):
                status, exit_code, failure = RunStatus.FAILED, exc.exit_code, exc.message
            else:
                status, exit_code = RunStatus.FAILED, ExitCode.FAILURE
                failure = f"internal error: {type(exc).__name__}: {exc}"
            if isinstance(exc, LedgerError):
                rec.record_error = exc.message
            _quietly(rec, rec.end_phase, PhaseStatus(status), failure)  # failed or interrupted, as the run
            signals.shield()  # from here on no signal can cut the teardown or its check short
            check = _teardown(spec, run_id, provider, _Quiet(rec), keep=False, busy=isinstance(exc, ClusterBusy))
            teardown = None if check is None else check.verdict
            _quietly(rec, ledger.finish_run, run_id, status=status, exit_code=int(exit_code), failure=failure,
                     teardown=teardown, leftovers=[] if check is None else check.to_dict()["leftovers"],
                     unchecked=[] if check is None else list(check.unchecked))
            _quietly(rec, store_cost, ledger, run_id, backend)
            if check is not None and not check.verified:
                raise TeardownIncomplete(f"{failure}; teardown {check.summary()}",
                                         hint=f"finish it with: gpucluster down {spec.name}") from exc
            if rec.record_error:
                raise TeardownIncomplete(record_line(rec.record_error, spec.name)) from exc
            raise
        _quietly(rec, rec.end_phase, PhaseStatus.OK)  # the cluster exists: a failing record must not say "exit 2"
        _quietly(rec, ledger.finish_run, run_id, status=RunStatus.SUCCEEDED, exit_code=0, teardown=TeardownVerdict.KEPT)
        return Provisioned(cluster, rec.record_error)


def _collect_outputs(launcher: Launcher, job: JobSpec, rec: _Recorder | _Quiet) -> list[str]:
    """The "outputs" phase: the launcher copies every node's output folder to `job.output_dir`
    (`Launcher.collect_outputs`); each node's verdict goes to the ledger. Returns one problem line
    per node whose copy is not complete (or why nothing could be collected)."""
    if not job.output_dir:
        return []
    try:
        rec.start_phase(Phase.OUTPUTS)
        got = launcher.collect_outputs(job, rec)
        if got is None:
            rec.end_phase(PhaseStatus.OK, "not supported by this backend's launcher: nothing copied back")
            return []
        rows = [o.to_dict() for o in got]
        _quietly(rec.rec if isinstance(rec, _Quiet) else rec, rec.ledger.record_outputs, rec.run_id, rows)
        problems = [p for p in (o.problem() for o in got) if p]
        from gpucluster.watch.outputs import summary
        rec.end_phase(PhaseStatus.FAILED if problems else PhaseStatus.OK, "; ".join(problems) if problems else summary(rows))
        return problems
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - whatever broke, teardown still runs
        problem = f"outputs not collected: {_describe(exc)}"
        with contextlib.suppress(Exception):  # a ledger that cannot take the phase row must not stop teardown
            rec.end_phase(PhaseStatus.FAILED, problem)
        return [problem]


def _teardown(spec: ClusterSpec, run_id: str, provider: Provider, rec: _Recorder | _Quiet, *, keep: bool,
              busy: bool = False, unwitnessed: Sequence[str] = ()) -> Check | None:
    """Delete what the run created and check, independently of local state, what is left.

    Returns the three-state `Check`, or None when nothing is checked (the cluster was kept on
    purpose, or another live run owns it and this run created nothing). Processes (local and ssh
    backends) are never kept: the launcher has stopped them already and this checks that none
    survived. A failing delete does not skip the check, and it is never forgotten: unless the
    provider's check sees everything the delete was meant to remove (`check_is_complete`: the
    local and ssh process scans), it makes the verdict at best "not verified". So does a node
    whose reaper did not finish its final pass (`unwitnessed`, from the launcher's `JobResult`).
    """
    rec.start_phase(Phase.TEARDOWN)
    if keep:  # the caller keeps only clusters gpucluster creates: processes (local, ssh) never are
        rec.end_phase(PhaseStatus.OK, "cluster kept (--keep)")
        return None
    if busy:  # another live run owns the cluster: this run created nothing and may delete nothing
        rec.end_phase(PhaseStatus.OK, "nothing created: the cluster belongs to another live gpucluster run")
        return None
    not_run: list[str] = []
    try:
        provider.down(spec.name, rec)
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - whatever broke, the check still runs
        not_run.append(f"delete: {_describe(exc)}")
    try:
        check = Check.of(provider.leftovers(spec.name, run_id))
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - a check that cannot run is "not verified", never a crash
        check = Check(unchecked=(f"leftover check: could not run ({_describe(exc)})",))
    check = check.with_unchecked(*unwitnessed)  # nodes whose reaper could not vouch for their end
    if not provider.check_is_complete:
        # the check cannot see everything a failed delete may have left (a tag sweep misses
        # untagged resources still in the stack): the failure itself leaves the verdict open
        check = check.with_unchecked(*not_run)
    if check.verified:
        for kind, name in recording.launcher_rows(rec):
            rec.resource_deleted(kind, name)
        note = "".join(f"; {n.replace('delete:', 'delete failed:', 1)}" for n in not_run)
        rec.end_phase(PhaseStatus.OK, "verified: every check ran and found nothing" + note)
    else:
        rec.ui.message("teardown " + check.summary())
        rec.end_phase(PhaseStatus.FAILED, check.summary())
    return check


def _describe(exc: BaseException) -> str:
    return exc.message if isinstance(exc, GpuclusterError) else f"{type(exc).__name__}: {exc}"


