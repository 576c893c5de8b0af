"""Watching a Kubernetes run's pods for the launcher (`infra.kubernetes.launcher`): `_Pods` lists the job's pods,
attaches each app container's log stream to the supervisor, and turns pod and container states into
node exit codes and reasons (init containers included: an image that cannot be pulled, a crash loop or
a failed init container ends the run at once, naming the pod, the container, the reason and message,
and the init container's last log lines); `_PodHandle` is one node's Popen-like view for
`NodeSupervisor.run`.

The control plane of a zonal cluster goes away for minutes while GKE upgrades or repairs it, and
every connection to it is cut then. So a failed listing is retried with backoff for up to
`Retry.bound_s` (`api`), and a log stream that breaks is reattached: it is read with
`timestamps=true` (each line starts with its RFC3339Nano time, as the kubelet keeps it) and
reattached with `sinceSeconds` covering the time since its last line (the python client has no
`sinceTime`), the lines already given (same or earlier time; at the same time, as many as were given)
dropped, so no line is lost or repeated (Kubernetes API, PodLogOptions: `timestamps`, `sinceSeconds`).
A node's exit code also comes from its training container's status (it ends with torchrun's code;
the keeper container keeps the pod running for the outputs copy), so a lost log never stalls it.
"""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Generator, Iterable, Iterator

from gpucluster.errors import LaunchError
from gpucluster.watch.supervisor import NodeSupervisor

from .api import KubeApi, KubeObject, Retry, _is_api_error, _status, backoff, transient
from .manifests import rank_of
from .plan import JOB_END_KIND, Plan

if TYPE_CHECKING:
    from .notices import NodeNotices

SINCE_MARGIN_S = 10  # added to sinceSeconds on a reattach: the API server's clock and ours differ
# Container waiting reasons that will not fix themselves: fail now rather than at the deadline.
# The image is pulled for the first container that starts, the init container when there is one, so
# these show in `initContainerStatuses` while the app container waits in PodInitializing (Kubernetes
# docs, "Init Containers"); both lists are read.
FATAL_WAITING = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                 "CreateContainerError", "CrashLoopBackOff", "RunContainerError")
INIT_LOG_LINES = 10  # an init container's last log lines, in the failure of a pod it stopped
# A pod that ends for its node's sake, not its job's: the kubelet's graceful node shutdown marks it
# Failed with reason Terminated (Kubernetes docs, "Node Shutdowns"; GKE docs call it Shutdown for a
# preempted Spot/preemptible node), node-pressure eviction says Evicted; and since Kubernetes 1.26 a
# DisruptionTarget condition says why a pod is being disrupted (Kubernetes docs, "Pod disruption
# conditions": PreemptionByScheduler, DeletionByTaintManager, EvictionByEvictionAPI,
# TerminationByKubelet, ...).
NODE_LOST_REASONS = ("Terminated", "Shutdown", "NodeShutdown", "Evicted", "Preempting")


def _job_end(line: bytes) -> int | None:
    """The exit code in the entry script's `job_end` record, or None for any other line."""
    from gpucluster.workloads.protocol import PREFIX

    text = line.decode("utf-8", "replace").strip()
    if not text.startswith(PREFIX) or JOB_END_KIND not in text:
        return None
    import json

    try:
        record = json.loads(text[len(PREFIX):])
        return int(record["exit_code"]) if record.get("kind") == JOB_END_KIND else None
    except (ValueError, KeyError, TypeError):
        return None


def _lines(response: KubeObject, broken: list[BaseException] | None = None) -> Iterator[bytes]:
    """Whole lines (with their newline) from a streamed log response that yields byte chunks. A stream
    that breaks (the pod deleted, the API server gone) simply ends; why goes into `broken`, and then an
    unfinished last line is not given (the stream is read again from its last whole line)."""
    buffer = b""
    try:
        try:
            for chunk in response.stream():
                if isinstance(chunk, str):
                    chunk = chunk.encode()
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                for line in complete:
                    yield line + b"\n"
        except Exception as exc:  # noqa: BLE001 - urllib3's ProtocolError and its kin: the stream ended
            if broken is None:
                broken = []
            broken.append(exc)
        if buffer and not broken:
            yield buffer
    finally:
        for method in ("release_conn", "close"):
            try:
                getattr(response, method)()
            except Exception:
                pass


def _node_gone(pod: KubeObject) -> str | None:
    """Why a pod is gone or going for its node's sake (deleted, preempted, evicted), or None."""
    status, name = pod.status, pod.metadata.name
    disruption = next((c for c in getattr(status, "conditions", None) or []
                       if c.type == "DisruptionTarget" and c.status == "True"), None)
    reason = getattr(status, "reason", None)
    if getattr(status, "phase", None) == "Failed" and (reason in NODE_LOST_REASONS or disruption is not None):
        why = getattr(status, "message", None) or getattr(disruption, "message", None) or ""
        lost = reason or getattr(disruption, "reason", None)
        return (f"pod {name} failed ({lost})" + (f": {why}" if why else "")).rstrip()
    if disruption is not None:
        return f"pod {name} is being disrupted ({disruption.reason}): {disruption.message or ''}".rstrip(": ")
    if getattr(pod.metadata, "deletion_timestamp", None):
        return f"pod {name} is being deleted (since {pod.metadata.deletion_timestamp})"
    return None


def _initialising(pod: KubeObject) -> tuple[str, str] | None:
    """(init container, `Init:N/M`) for a placed pod whose init container runs, or None."""
    statuses = getattr(pod.status, "init_container_statuses", None) or []
    for i, cs in enumerate(statuses):
        if getattr(cs.state, "running", None) is not None:
            return cs.name, f"Init:{i}/{len(statuses)}"
    return None


class PodState(enum.Enum):
    """Where a node's pod stands, as one listing shows it (`_Pods._pod_state`: the first that holds)."""

    DECIDED = "decided"  # its exit code is known already
    NODE_LOST = "node lost"  # deleted or disrupted: its node is gone or going
    ENDED = "ended"  # torchrun ended (the entry script's job_end record)
    INIT_FAILED = "init failed"  # an init container will not complete
    AWAITING_RECORD = "awaiting record"  # a TrainJob's container exited 0: its job_end record says the code
    EXITED = "exited"  # the training container ended
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # ended with no container status (evicted, the node lost)
    CANNOT_START = "cannot start"  # the training container waits for what will not come (FATAL_WAITING)
    STARTING = "starting"  # nothing to decide yet


class StartState(enum.Enum):
    """Where the job's pod set stands against the start deadline (`_Pods._start_state`)."""

    IN_TIME = "in time"  # the deadline has not passed (or the Job is not created yet)
    UNPLACED = "unplaced"  # past it, some pods are not placed: they fail first, with the scheduler's reason
    INITIALISING = "initialising"  # past it, every pod not running is placed, in an init container: they fail
    STARTED = "started"  # past it, every container runs or has ended


@dataclass
class _Look:
    """One listing's view of a node's pod, and what `_Pods._pod_state` found on the way."""

    rank: int
    pod: KubeObject
    container: KubeObject | None  # the training container's state (V1ContainerState)
    gone: str | None = None  # why its node is gone or going
    init: tuple[int, str] | None = None  # an init container's failure: (exit code, why)

    @property
    def terminated(self) -> KubeObject | None:
        return self.container.terminated if self.container is not None else None

    @property
    def waiting(self) -> KubeObject | None:
        return self.container.waiting if self.container is not None else None


class _Pods:
    """The job's pods by node rank, refreshed at most every `poll_interval` seconds."""

    def __init__(self, api: KubeApi, plan: Plan, supervisor: NodeSupervisor, poll_interval: float,
                 retry: Retry | None = None):
        self.api, self.plan, self.supervisor = api, plan, supervisor
        self.poll_interval = poll_interval
        self.retry = retry or Retry()
        self.exit_codes: dict[int, int] = {}
        self.ended: dict[int, int] = {}  # rank -> torchrun's exit code (the entry script's job_end record)
        self.log_ended: set[int] = set()  # ranks whose log was read to its end (or to job_end)
        self.reasons: dict[int, str] = {}
        self.pod_names: dict[int, str] = {}
        self.attached: set[int] = set()
        self.failing_since: float | None = None  # the first of the listings failing now
        self.failures = 0
        self.pending: dict[int, str] = {}  # rank -> why its pod is not scheduled (no GPU node free, ...)
        self.lost: dict[int, str] = {}  # rank -> why its pod went for its node's sake (gpucluster/watch/nodeloss.py)
        self.ips: dict[int, str] = {}  # rank -> its pod's address (status.podIP: empty until one is allocated)
        self.nodes: dict[int, str] = {}  # rank -> the node its pod was bound to (spec.nodeName)
        self.notices: NodeNotices | None = None  # the provider's notice that it takes a node back
        self._last = float("-inf")
        self._next = float("-inf")  # no listing before this (backing off while the API fails)
        self.started_at: float | None = None  # when the Job was created (the start deadline counts from it)
        self.closed = False  # the run is over: log streams are no longer reattached

    def close(self) -> None:
        self.closed = True

    def refresh(self) -> None:
        now = time.monotonic()
        if now - self._last < self.poll_interval or now < self._next:
            return
        self._last = now
        pods = self._list_pods(now)
        if pods is None:
            return
        self.failing_since, self.failures = None, 0
        current = self._by_rank(pods)
        for rank, pod in current.items():
            if rank in self.lost and self.pod_names.get(rank) not in (None, pod.metadata.name):
                continue  # a Job controller's replacement for a lost pod (a TrainJob's child Job retries): not ours
            self.pod_names[rank] = pod.metadata.name
            self._observe(rank, pod)
        self._check_start_deadline(current, now)
        self._poll_notices()
        self._mark_disappeared(current)

    def _list_pods(self, now: float) -> list[KubeObject] | None:
        """The job's pods; None while the API fails for a while (backing off)."""
        try:
            items: list[KubeObject] = self.api.core.list_namespaced_pod(
                self.plan.namespace, label_selector=self.plan.selector).items
            return items
        except Exception as exc:
            if not _is_api_error(exc):
                raise
            # A control-plane upgrade or repair (minutes on a zonal cluster) is not a failed run; only
            # a failure that lasts past the bound, or one that will not fix itself, is.
            self.failing_since = self.failing_since if self.failing_since is not None else now
            self.failures += 1
            if not transient(exc) or now - self.failing_since > self.retry.bound_s:
                lasted = f" for {now - self.failing_since:.0f} s" if transient(exc) else ""
                raise LaunchError(f"lost the Kubernetes API while watching the job's pods{lasted}: {exc}") from None
            self._next = now + backoff(self.failures)
            return None

    def _by_rank(self, pods: list[KubeObject]) -> dict[int, KubeObject]:
        current: dict[int, KubeObject] = {}
        for pod in pods:
            rank = rank_of(pod, self.plan)
            if rank is not None and 0 <= rank < self.plan.nodes:
                current[rank] = pod
        return current

    def _poll_notices(self) -> None:
        """A node the provider takes back (GKE: host maintenance): as a spot notice."""
        if self.notices is None:
            return
        notice = self.notices.poll({r: n for r, n in self.nodes.items()
                                    if r in self.attached and r not in self.exit_codes})
        if notice is not None:
            self.supervisor.notify(*notice)

    def _mark_disappeared(self, current: dict[int, KubeObject]) -> None:
        for rank in set(self.pod_names) - set(current):
            if rank not in self.exit_codes:
                self.exit_codes[rank] = -1
                self.reasons[rank] = self.lost[rank] = (f"pod {self.pod_names[rank]} disappeared (deleted, evicted, "
                                                        "or its node was preempted)")

    def _observe(self, rank: int, pod: KubeObject) -> None:
        """One listing's view of `rank`'s pod: where it runs, its log attached once it runs, why it is
        not scheduled; then its state (`PodState`) and that state's step."""
        container = self._note_pod(rank, pod)
        look = _Look(rank, pod, container)
        _ON_STATE[self._pod_state(look)](self, look)

    def _note_pod(self, rank: int, pod: KubeObject) -> KubeObject | None:
        """The node, the address, the log stream and the scheduling of `rank`'s pod noted; the state of
        its training container (None before it has one)."""
        status = pod.status
        phase = getattr(status, "phase", None)
        node = getattr(getattr(pod, "spec", None), "node_name", None)
        if node:
            self.nodes[rank] = str(node)
        ip = getattr(status, "pod_ip", None)
        if ip:
            self.ips[rank] = str(ip)
        state = None
        for cs in getattr(status, "container_statuses", None) or []:
            if cs.name == self.plan.app_container:
                state = cs.state
        running = state is not None and (state.running is not None or state.terminated is not None)
        if rank not in self.attached and rank not in self.exit_codes and (
                running or (phase in ("Running", "Succeeded", "Failed") and self._init_failure(pod) is None)):
            self.attached.add(rank)
            self.supervisor.attach(rank, self._log_stream(pod.metadata.name, rank))
        self.pending.pop(rank, None)
        for cond in getattr(status, "conditions", None) or []:
            if cond.type == "PodScheduled" and cond.status == "False":
                self.pending[rank] = f"pod {pod.metadata.name} not scheduled: {cond.reason}: {cond.message}"
        return state

    def _pod_state(self, look: _Look) -> PodState:
        """Where the pod stands, the rules in order (the first that holds)."""
        rank, pod = look.rank, look.pod
        if rank in self.exit_codes:
            return PodState.DECIDED
        look.gone = _node_gone(pod)
        if look.gone is not None:
            return PodState.NODE_LOST
        if rank in self.ended:
            return PodState.ENDED
        look.init = self._init_failure(pod)
        if look.init is not None:
            return PodState.INIT_FAILED
        terminated, waiting = look.terminated, look.waiting
        if terminated is not None and terminated.exit_code == 0 and self.plan.mode == "trainjob" and \
                rank not in self.log_ended:
            return PodState.AWAITING_RECORD
        if terminated is not None:
            return PodState.EXITED
        phase = getattr(pod.status, "phase", None)
        if phase == "Succeeded":
            return PodState.SUCCEEDED
        if phase == "Failed":
            return PodState.FAILED
        if waiting is not None and waiting.reason in FATAL_WAITING:
            return PodState.CANNOT_START
        return PodState.STARTING

    def _unchanged(self, look: _Look) -> None:
        """DECIDED, AWAITING_RECORD (a TrainJob's container exits 0 whatever torchrun did, pod_entry.py: its
        job_end record, read first, says), STARTING: nothing to note."""

    def _on_node_lost(self, look: _Look) -> None:
        """Deleted or disrupted: its node is gone or going (a preempted node)."""
        assert look.gone is not None
        self.exit_codes[look.rank], self.reasons[look.rank] = -1, look.gone
        self.lost[look.rank] = look.gone

    def _on_ended(self, look: _Look) -> None:
        """torchrun ended (job_end); the pod may still run for its outputs copy."""
        self.exit_codes[look.rank] = self.ended[look.rank]

    def _on_init_failed(self, look: _Look) -> None:
        assert look.init is not None
        self.exit_codes[look.rank], self.reasons[look.rank] = look.init

    def _on_exited(self, look: _Look) -> None:
        """The training container ended (the keeper may keep the pod Running)."""
        terminated = look.terminated
        assert terminated is not None
        code = terminated.exit_code if terminated.exit_code is not None else 1
        self.exit_codes[look.rank] = code
        if code != 0:
            self.reasons[look.rank] = (
                f"pod {look.pod.metadata.name} container {self.plan.app_container} ended with exit code {code}"
                + (f" ({terminated.reason})" if terminated.reason else "")
                + (f": {terminated.message}" if getattr(terminated, "message", None) else ""))

    def _on_succeeded(self, look: _Look) -> None:
        self.exit_codes[look.rank] = 0

    def _on_failed(self, look: _Look) -> None:
        """Ended with no container status (evicted, the node lost)."""
        status = look.pod.status
        self.exit_codes[look.rank] = 1
        reason, message = getattr(status, "reason", None), getattr(status, "message", None)
        self.reasons[look.rank] = (f"pod {look.pod.metadata.name} failed" + (f" ({reason})" if reason else "")
                                   + (f": {message}" if message else ""))

    def _on_cannot_start(self, look: _Look) -> None:
        waiting = look.waiting
        assert waiting is not None
        self.exit_codes[look.rank] = -1
        self.reasons[look.rank] = (f"pod {look.pod.metadata.name} container {self.plan.app_container} cannot start: "
                                   f"{waiting.reason}: {waiting.message or ''}").rstrip(": ")

    def _init_failure(self, pod: KubeObject) -> tuple[int, str] | None:
        """(exit code, why) when an init container will not complete: its image cannot be pulled, it
        crash-loops, or it failed (restartPolicy Never fails the pod); with its last log lines."""
        for cs in getattr(pod.status, "init_container_statuses", None) or []:
            state = cs.state
            waiting, terminated = getattr(state, "waiting", None), getattr(state, "terminated", None)
            if waiting is not None and waiting.reason in FATAL_WAITING:
                code, what = -1, f"{waiting.reason}: {waiting.message or ''}".rstrip(": ")
            elif terminated is not None and terminated.exit_code not in (0, None):
                code = int(terminated.exit_code)
                what = f"{terminated.reason or 'Error'}: exit code {code}" + (
                    f": {terminated.message}" if getattr(terminated, "message", None) else "")
            else:
                continue
            tail = self._init_log(pod.metadata.name, cs.name) if waiting is None or "Image" not in waiting.reason \
                else ""
            return code, (f"pod {pod.metadata.name} init container {cs.name} {what}"
                          + (f"; its last log lines:\n{tail}" if tail else ""))
        return None

    def _init_log(self, pod_name: str, container: str) -> str:
        try:
            text = self.api.core.read_namespaced_pod_log(pod_name, self.plan.namespace, container=container,
                                                         tail_lines=INIT_LOG_LINES)
        except Exception as exc:
            if not _is_api_error(exc):
                raise
            return ""
        text = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text or "")
        return "\n".join(text.strip().splitlines()[-INIT_LOG_LINES:])

    def _check_start_deadline(self, current: dict[int, KubeObject], now: float) -> None:
        """Past the start deadline, the ranks whose container is not running fail: first those whose pod
        is not placed (with the scheduler's reason, read from its pod's events: FailedScheduling,
        NotTriggerScaleUp, ...), since the others' init containers wait for their DNS records; when every
        pod is placed, those still in an init container (with its last log lines)."""
        state, ranks = self._start_state(current, now)
        if state in (StartState.IN_TIME, StartState.STARTED):
            return
        for rank in ranks:  # UNPLACED or INITIALISING: these fail
            pod = current.get(rank)
            name = pod.metadata.name if pod is not None else None
            why = self._stuck_reason(pod) or self.pending.get(rank) or "no reason reported"
            self.exit_codes[rank] = -1
            self.reasons[rank] = (f"pod {name or f'rank {rank}'} not running after the {self.plan.start_deadline_s} s "
                                  f"start deadline: {why}")

    def _start_state(self, current: dict[int, KubeObject], now: float) -> tuple[StartState, list[int]]:
        """Where the pod set stands against the start deadline, and the ranks that fail in that state."""
        if self.started_at is None or now - self.started_at < self.plan.start_deadline_s:
            return StartState.IN_TIME, []
        stuck = [r for r in range(self.plan.nodes) if r not in self.attached and r not in self.exit_codes]
        unplaced = [r for r in stuck if r in self.pending or current.get(r) is None
                    or not _initialising(current[r])]
        if unplaced:
            return StartState.UNPLACED, unplaced
        return (StartState.INITIALISING, stuck) if stuck else (StartState.STARTED, [])

    def _stuck_reason(self, pod: KubeObject | None) -> str | None:
        """Why a pod is not running: its init container's wait (with its last log lines), else the
        scheduler's reason from its events."""
        if pod is None:
            return "the Job made no pod for it"
        init = _initialising(pod)
        if init is not None:
            tail = self._init_log(pod.metadata.name, init[0])
            return f"init container {init[0]} has not completed ({init[1]})" + (
                f"; its last log lines:\n{tail}" if tail else "")
        name = pod.metadata.name
        return self._events_reason(name) if name else "the Job made no pod for it"

    def _events_reason(self, pod_name: str) -> str | None:
        try:
            events = self.api.core.list_namespaced_event(
                self.plan.namespace, field_selector=f"involvedObject.name={pod_name}").items
        except Exception as exc:
            if not _is_api_error(exc):
                raise
            return None
        warnings = [e for e in events if getattr(e, "type", None) == "Warning"] or list(events)
        if not warnings:
            return None
        last = max(warnings, key=lambda e: str(getattr(e, "last_timestamp", None) or getattr(e, "event_time", None)
                                                or ""))
        return f"{last.reason}: {last.message}"

    def _log_stream(self, pod_name: str, rank: int) -> Iterable[bytes]:
        stream = self._follow(pod_name, rank)
        return self._until_job_end(stream, rank) if self.plan.collects or self.plan.mode == "trainjob" else stream

    def _done(self, rank: int) -> bool:
        return rank in self.exit_codes or rank in self.ended or self.closed

    def _follow(self, pod_name: str, rank: int) -> Generator[bytes, None, None]:
        """The app container's log, every line once, reattached when the stream breaks while the
        container runs (see the module docstring); gives up after `retry.bound_s` without progress.
        Each read ends in a `LogNext`: the stream is over, read once more, lost, or read again after a wait."""
        cursor = _LogCursor()
        while True:
            response, refused = self._open_log(pod_name, cursor)
            if refused is not None:
                yield refused
                return
            broken: list[BaseException] = []
            if response is not None:
                yield from _new_lines(response, cursor, broken)
            step = self._next_read(rank, response is not None and not broken, cursor)
            if step is LogNext.END:
                return
            if step is LogNext.LOST:
                yield (f"[gpucluster] lost the log of pod {pod_name} for {cursor.lost_s:.0f} s "
                       f"({cursor.why}); its exit code comes from its container status\n").encode()
                return
            if step is LogNext.WAIT:
                cursor.attempt += 1
                end = time.monotonic() + backoff(cursor.attempt)
                while time.monotonic() < end and not self._done(rank):
                    time.sleep(0.05)

    def _open_log(self, pod_name: str, cursor: _LogCursor) -> tuple[KubeObject | None, bytes | None]:
        """(the log stream from where the cursor is, or None while it cannot be read; the line that ends
        the log when it never will be)."""
        kw: dict[str, int] = {}
        if cursor.got_at is not None:
            kw["since_seconds"] = max(1, math.ceil(time.monotonic() - cursor.got_at) + SINCE_MARGIN_S)
        try:
            return self.api.core.read_namespaced_pod_log(
                pod_name, self.plan.namespace, container=self.plan.app_container, follow=True, timestamps=True,
                _preload_content=False, **kw), None
        except Exception as exc:  # noqa: BLE001 - ApiException, connection errors: retried or said
            cursor.why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if not (transient(exc) or _status(exc) == 400):  # 400: the container is not running (yet/now)
                return None, f"[gpucluster] no log for pod {pod_name}: {cursor.why}\n".encode()
            return None, None

    def _next_read(self, rank: int, whole: bool, cursor: _LogCursor) -> LogNext:
        """What follows a read (`whole`: a stream that ended by itself, unbroken)."""
        if self.closed or rank in self.ended:
            return LogNext.END
        if rank in self.exit_codes:  # the container ended: a stream that ended by itself had it all
            if whole or cursor.final:
                return LogNext.END
            cursor.final = True
            return LogNext.FINAL
        now = time.monotonic()
        cursor.stalled = cursor.stalled if cursor.stalled is not None else now
        if now - cursor.stalled > self.retry.bound_s:
            cursor.lost_s = now - cursor.stalled
            return LogNext.LOST
        return LogNext.WAIT

    def _until_job_end(self, lines: Generator[bytes, None, None], rank: int) -> Iterator[bytes]:
        """The log up to the entry script's job_end record, which gives the node's exit code; the
        stream is closed there (the container keeps running until its outputs are copied)."""
        try:
            for line in lines:
                code = _job_end(line)
                if code is not None:
                    self.ended[rank] = code
                    return
                yield line
        finally:
            self.log_ended.add(rank)
            lines.close()


# Each pod state's step (`_Pods._observe` dispatches to it).
_ON_STATE: dict[PodState, Callable[[_Pods, _Look], None]] = {
    PodState.DECIDED: _Pods._unchanged,
    PodState.NODE_LOST: _Pods._on_node_lost,
    PodState.ENDED: _Pods._on_ended,
    PodState.INIT_FAILED: _Pods._on_init_failed,
    PodState.AWAITING_RECORD: _Pods._unchanged,
    PodState.EXITED: _Pods._on_exited,
    PodState.SUCCEEDED: _Pods._on_succeeded,
    PodState.FAILED: _Pods._on_failed,
    PodState.CANNOT_START: _Pods._on_cannot_start,
    PodState.STARTING: _Pods._unchanged,
}


def _stamp(text: bytes) -> tuple[str, str] | None:
    """An RFC3339(Nano) UTC time as a sortable key: (date and time, the fraction to 9 digits). The
    kubelet's times drop trailing zeros of the fraction, so they do not sort as text."""
    t = text.decode("ascii", "replace")
    if len(t) < 20 or t[4] != "-" or t[10] != "T" or not t.endswith("Z"):
        return None
    main, _, frac = t[:-1].partition(".")
    return (main, frac.ljust(9, "0")) if frac.isdigit() or not frac else None


class LogNext(enum.Enum):
    """What follows one read of a pod's log stream (`_Pods._follow`)."""

    END = "end"  # the run is over, torchrun ended, or the container ended and its log was read to the end
    FINAL = "final"  # the container ended while the stream was broken: one last read for what it printed
    LOST = "lost"  # no line for `retry.bound_s`: given up (the exit code comes from the container status)
    WAIT = "wait"  # read again after a backoff


@dataclass
class _LogCursor:
    """How far a pod's log was given, for a reattach to drop what was given already."""

    last: tuple[str, str] | None = None  # the time of the last line given
    at_last: int = 0  # how many lines were given with that time
    got_at: float | None = None  # when (here) the last line came
    stalled: float | None = None  # since when no line came while the container runs
    attempt: int = 0
    why: str = ""
    final: bool = False  # the container ended while its stream was broken: one last read for what it printed
    lost_s: float = 0.0  # how long no line came, when given up


def _new_lines(response: KubeObject, cursor: _LogCursor, broken: list[BaseException]) -> Iterator[bytes]:
    """The lines of one log stream not given yet (a line without a time is given as it is); the cursor
    moved past each, and why the stream ended in `cursor.why`."""
    skip = cursor.at_last if cursor.last is not None else 0
    for raw in _lines(response, broken):
        stamp, sep, text = raw.partition(b" ")
        key = _stamp(stamp) if sep else None
        if key is None:  # not a time: given as it is
            yield raw
            continue
        if cursor.last is not None and key < cursor.last:
            continue
        if key == cursor.last and skip:
            skip -= 1
            continue
        cursor.at_last = cursor.at_last + 1 if key == cursor.last else 1
        cursor.last, cursor.got_at, cursor.stalled, cursor.attempt = key, time.monotonic(), None, 0
        yield text
    cursor.why = f"the stream broke: {broken[0]}" if broken else "the stream ended"


class _PodHandle:
    """Popen-like view of one node's pod, for NodeSupervisor.run."""

    def __init__(self, pods: _Pods, rank: int):
        self.pods, self.rank = pods, rank

    def poll(self) -> int | None:
        if self.rank not in self.pods.exit_codes and self.rank in self.pods.ended:
            self.pods.exit_codes[self.rank] = self.pods.ended[self.rank]
        self.pods.refresh()
        return self.pods.exit_codes.get(self.rank)

    @property
    def returncode(self) -> int | None:
        return self.pods.exit_codes.get(self.rank)
