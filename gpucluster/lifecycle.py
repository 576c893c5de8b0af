"""The run lifecycle, shared by every backend:

    validate -> plan -> ledger row -> provision -> ready -> rendezvous/train -> teardown -> verify -> cost

`execute()` writes the run row before anything is created, records every phase, resource, node
exit code and metric as it happens, and tears down in a `finally` that also runs on Ctrl-C,
SIGTERM and exceptions. A second Ctrl-C during teardown does not stop the teardown.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol

from .errors import ClusterBusy, ExitCode, GpuclusterError
from .launch import JobResult, JobSpec
from .ledger import Ledger


class Terminated(KeyboardInterrupt):
    """SIGTERM, delivered to the main thread the same way as Ctrl-C."""


class RunUI(Protocol):
    def phase(self, name: str) -> None: ...

    def line(self, node_rank: int, text: str) -> None: ...

    def metric(self, node_rank: int, record: dict[str, Any]) -> None: ...

    def message(self, text: str) -> None: ...


class QuietUI:
    def phase(self, name: str) -> None:
        pass

    def line(self, node_rank: int, text: str) -> None:
        pass

    def metric(self, node_rank: int, record: dict[str, Any]) -> None:
        pass

    def message(self, text: str) -> None:
        pass


@dataclass
class RunOutcome:
    run_id: str
    status: str  # succeeded, failed, interrupted
    exit_code: ExitCode
    failure: str | None
    result: JobResult | None
    teardown_verified: bool | None
    leftovers: list[dict[str, Any]] = field(default_factory=list)
    log_dir: str | None = None


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises `Terminated` (a KeyboardInterrupt) in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated()

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def shielded(ui: RunUI) -> Iterator[None]:
    """Teardown must finish: Ctrl-C and SIGTERM are noted, not obeyed, until it has."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        ui.message("teardown in progress: it will finish before gpucluster exits")

    old_int = signal.signal(signal.SIGINT, handler)
    old_term = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


class _Recorder:
    """Provision and launch events -> ledger + UI."""

    def __init__(self, ledger: Ledger, run_id: str, ui: RunUI, region: str | None):
        self.ledger, self.run_id, self.ui, self.region = ledger, run_id, ui, region
        self.current_phase: str | None = None
        self.spawned: list[tuple[str, str]] = []

    # phases
    def start_phase(self, name: str) -> None:
        if self.current_phase:
            self.ledger.phase_end(self.run_id, self.current_phase, "ok")
        self.current_phase = name
        self.ledger.phase_start(self.run_id, name)
        self.ui.phase(name)

    def end_phase(self, status: str, detail: str | None = None) -> None:
        if self.current_phase:
            self.ledger.phase_end(self.run_id, self.current_phase, status, detail)
            self.current_phase = None

    # ProvisionEvents
    def resource_requested(self, kind: str, name: str, **detail: Any) -> None:
        self.ledger.resource_requested(self.run_id, kind, name, region=detail.pop("region", self.region),
                                       detail=detail or None)

    def resource_created(self, kind: str, name: str, cloud_id: str | None = None, **detail: Any) -> None:
        self.ledger.resource_created(self.run_id, kind, name, cloud_id)

    def resource_deleted(self, kind: str, name: str, cloud_id: str | None = None) -> None:
        self.ledger.resource_deleted(self.run_id, kind, name)

    def message(self, text: str) -> None:
        self.ui.message(text)

    def progress(self, text: str) -> None:
        """A transient status (e.g. waiting for nodes): the status line, not the log."""
        show = getattr(self.ui, "progress", None)
        if show:
            show(text)

    # LaunchEvents
    def on_line(self, node_rank: int, line: str) -> None:
        self.ui.line(node_rank, line)

    def on_metric(self, node_rank: int, record: dict[str, Any]) -> None:
        self.ledger.add_metrics(self.run_id, [(node_rank, record)])
        self.ui.metric(node_rank, record)

    def on_phase(self, phase: str) -> None:
        if phase != self.current_phase:
            self.start_phase(phase)

    def on_spawn(self, node_rank: int, kind: str, ident: str) -> None:
        name = f"node-{node_rank}"
        self.ledger.resource_requested(self.run_id, kind, name, detail={"pid": ident})
        self.ledger.resource_created(self.run_id, kind, name, ident)
        self.spawned.append((kind, name))


def execute(
    spec: Any,
    job: JobSpec,
    *,
    ledger: Ledger,
    provider: Any,
    launcher: Any,
    ui: RunUI | None = None,
    keep: bool = False,
    prices: dict[str, Any] | None = None,
    sweep_id: str | None = None,
    log_dir: Any = None,
    workload: str | None = None,
) -> RunOutcome:
    """Run one job on one cluster, end to end. Never raises for run failures: returns the outcome."""
    from .home import runs_dir

    ui = ui or QuietUI()
    run_id = job.run_id
    log_dir = log_dir or runs_dir(run_id)
    ledger.create_run(
        run_id, cloud=spec.cloud, cluster=spec.name, nodes=spec.nodes, gpus_per_node=spec.gpus_per_node,
        command=list(job.command) or [f"workload:{job.workload}", *job.workload_args], spec=spec.to_dict(),
        workload=workload or job.workload, prices=prices, sweep_id=sweep_id, log_dir=str(log_dir),
    )
    rec = _Recorder(ledger, run_id, ui, spec.region)
    status, failure, exit_code = "failed", None, ExitCode.FAILURE
    result: JobResult | None = None
    cluster = None
    busy = False
    try:
        with sigterm_as_interrupt():
            rec.start_phase("prepare")
            prepare = getattr(launcher, "prepare", None)
            if prepare:
                prepare(job)
            rec.start_phase("provision")
            cluster = provider.up(spec, rec)
            rec.start_phase("ready")
            ready = getattr(launcher, "ready", None)
            if ready:
                ready(cluster, job)
            result = launcher.launch(cluster, job, rec, log_dir)
            for node in result.nodes:
                ledger.record_node(run_id, node.node_rank, node.host, node.exit_code, node.last_lines)
            if result.ok:
                status, exit_code = "succeeded", ExitCode.OK
                rec.end_phase("ok")
            else:
                failure = result.failure
                rec.end_phase("failed", failure)
    except KeyboardInterrupt as exc:
        status, exit_code = "interrupted", ExitCode.INTERRUPTED
        failure = "stopped by SIGTERM" if isinstance(exc, Terminated) else "stopped by Ctrl-C"
        rec.end_phase("interrupted", failure)
    except GpuclusterError as exc:
        busy = isinstance(exc, ClusterBusy)
        failure = exc.message
        exit_code = exc.exit_code if exc.exit_code != ExitCode.USAGE else ExitCode.FAILURE
        rec.end_phase("failed", failure)
    except Exception as exc:  # a bug in the tool: still tear down, still record
        failure = f"internal error: {type(exc).__name__}: {exc}"
        rec.end_phase("failed", failure)
    finally:
        with shielded(ui):
            verified, leftovers = _teardown(spec, run_id, provider, rec, keep=keep, busy=busy)
    leftover_dicts = [lo.__dict__ for lo in leftovers]
    if verified is False and status == "succeeded":
        exit_code = ExitCode.LEFTOVERS
    ledger.finish_run(run_id, status=status, exit_code=int(exit_code), failure=failure,
                      metrics=result.metrics.summary() if result else None,
                      teardown_verified=verified, leftovers=leftover_dicts)
    _record_cost(ledger, run_id)
    return RunOutcome(run_id, status, exit_code, failure, result, verified, leftover_dicts, str(log_dir))


def _teardown(spec: Any, run_id: str, provider: Any, rec: _Recorder, *, keep: bool, busy: bool = False):
    """Delete what the run created and check, independently of local state, that it is gone.

    Returns (verified, leftovers): verified is None when the cluster was kept on purpose.
    Processes (local and ssh backends) are never kept: the launcher has stopped them already and
    this checks that none survived. A failing delete does not skip the check: the check decides.
    """
    rec.start_phase("teardown")
    if keep and spec.cloud not in ("local", "ssh"):
        rec.end_phase("ok", "cluster kept (--keep)")
        return None, []
    if busy:  # another live run owns the cluster: this run created nothing and may delete nothing
        rec.end_phase("ok", "nothing created: the cluster belongs to another live gpucluster run")
        return None, []
    problems = []
    try:
        provider.down(spec.name, rec)
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - whatever broke, the check still runs
        problems.append(f"delete failed: {_describe(exc)}")
    try:
        leftovers = provider.leftovers(spec.name, run_id)
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001
        problems.append(f"leftover check failed: {_describe(exc)}")
        rec.end_phase("failed", "; ".join(problems))
        rec.ui.message(f"teardown could not be verified: {'; '.join(problems)}")
        return False, []
    for kind, name in rec.spawned:
        if not any(lo.kind == kind for lo in leftovers):
            rec.resource_deleted(kind, name)
    verified = not leftovers
    if leftovers:
        problems.append(f"{len(leftovers)} resource(s) left")
    if problems:
        rec.ui.message("teardown: " + "; ".join(problems))
    rec.end_phase("ok" if verified else "failed", "; ".join(problems) or None)
    return verified, leftovers


def _describe(exc: BaseException) -> str:
    return exc.message if isinstance(exc, GpuclusterError) else f"{type(exc).__name__}: {exc}"


def _record_cost(ledger: Ledger, run_id: str) -> None:
    try:
        from . import cost
    except ImportError:
        return
    run = ledger.get_run(run_id)
    if run is not None and hasattr(cost, "run_cost"):
        try:
            ledger.set_cost(run_id, cost.run_cost(run))
        except GpuclusterError:
            pass
