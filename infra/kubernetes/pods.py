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

import math
import time
from typing import Any, Generator, Iterable, Iterator

from gpucluster.errors import LaunchError
from gpucluster.watch.supervisor import NodeSupervisor

from .api import KubeApi, Retry, _is_api_error, _status, backoff, transient
from .manifests import rank_of
from .plan import JOB_END_KIND, Plan

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


def _lines(response: Any, broken: list[BaseException] | None = None) -> Iterator[bytes]:
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


def _node_gone(pod: Any) -> str | None:
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


def _initialising(pod: Any) -> tuple[str, str] | None:
    """(init container, `Init:N/M`) for a placed pod whose init container runs, or None."""
    statuses = getattr(pod.status, "init_container_statuses", None) or []
    for i, cs in enumerate(statuses):
        if getattr(cs.state, "running", None) is not None:
            return cs.name, f"Init:{i}/{len(statuses)}"
    return None


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
        self.notices: Any = None  # a notices.NodeNotices: the provider's notice that it takes a node back
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
        try:
            pods = self.api.core.list_namespaced_pod(self.plan.namespace, label_selector=self.plan.selector).items
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
            return
        self.failing_since, self.failures = None, 0
        current: dict[int, Any] = {}
        for pod in pods:
            rank = rank_of(pod, self.plan)
            if rank is not None and 0 <= rank < self.plan.nodes:
                current[rank] = pod
        for rank, pod in current.items():
            if rank in self.lost and self.pod_names.get(rank) not in (None, pod.metadata.name):
                continue  # a Job controller's replacement for a lost pod (a TrainJob's child Job retries): not ours
            self.pod_names[rank] = pod.metadata.name
            self._observe(rank, pod)
        self._check_start_deadline(current, now)
        if self.notices is not None:  # a node the provider takes back (GKE: host maintenance): as a spot notice
            notice = self.notices.poll({r: n for r, n in self.nodes.items()
                                        if r in self.attached and r not in self.exit_codes})
            if notice is not None:
                self.supervisor.notify(*notice)
        for rank in set(self.pod_names) - set(current):
            if rank not in self.exit_codes:
                self.exit_codes[rank] = -1
                self.reasons[rank] = self.lost[rank] = (f"pod {self.pod_names[rank]} disappeared (deleted, evicted, "
                                                        "or its node was preempted)")

    def _observe(self, rank: int, pod: Any) -> None:
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
        if rank in self.exit_codes:
            return
        gone = _node_gone(pod)
        if gone is not None:  # deleted or disrupted: its node is gone or going (a preempted node)
            self.exit_codes[rank], self.reasons[rank] = -1, gone
            self.lost[rank] = gone
            return
        if rank in self.ended:  # torchrun ended (job_end); the pod may still run for its outputs copy
            self.exit_codes[rank] = self.ended[rank]
            return
        init = self._init_failure(pod)
        if init is not None:
            self.exit_codes[rank], self.reasons[rank] = init
            return
        terminated = state.terminated if state is not None else None
        waiting = state.waiting if state is not None else None
        if terminated is not None and terminated.exit_code == 0 and self.plan.mode == "trainjob" and \
                rank not in self.log_ended:
            return  # the container exits 0 whatever torchrun did (pod_entry.py): its job_end record, read first, says
        if terminated is not None:  # the training container ended (the keeper may keep the pod Running)
            code = terminated.exit_code if terminated.exit_code is not None else 1
            self.exit_codes[rank] = code
            if code != 0:
                self.reasons[rank] = (f"pod {pod.metadata.name} container {self.plan.app_container} ended with exit code {code}"
                                      + (f" ({terminated.reason})" if terminated.reason else "")
                                      + (f": {terminated.message}" if getattr(terminated, "message", None) else ""))
        elif phase == "Succeeded":
            self.exit_codes[rank] = 0
        elif phase == "Failed":  # ended with no container status (evicted, the node lost)
            self.exit_codes[rank] = 1
            reason, message = getattr(status, "reason", None), getattr(status, "message", None)
            self.reasons[rank] = (f"pod {pod.metadata.name} failed" + (f" ({reason})" if reason else "")
                                  + (f": {message}" if message else ""))
        elif waiting is not None and waiting.reason in FATAL_WAITING:
            self.exit_codes[rank] = -1
            self.reasons[rank] = (f"pod {pod.metadata.name} container {self.plan.app_container} cannot start: {waiting.reason}: "
                                  f"{waiting.message or ''}").rstrip(": ")

    def _init_failure(self, pod: Any) -> tuple[int, str] | None:
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

    def _check_start_deadline(self, current: dict[int, Any], now: float) -> None:
        """Past the start deadline, the ranks whose container is not running fail: first those whose pod
        is not placed (with the scheduler's reason, read from its pod's events: FailedScheduling,
        NotTriggerScaleUp, ...), since the others' init containers wait for their DNS records; when every
        pod is placed, those still in an init container (with its last log lines)."""
        if self.started_at is None or now - self.started_at < self.plan.start_deadline_s:
            return
        stuck = [r for r in range(self.plan.nodes) if r not in self.attached and r not in self.exit_codes]
        unplaced = [r for r in stuck if r in self.pending or current.get(r) is None
                    or not _initialising(current[r])]
        for rank in unplaced or stuck:
            pod = current.get(rank)
            name = pod.metadata.name if pod is not None else None
            init = _initialising(pod) if pod is not None else None
            why: str | None
            if pod is not None and init is not None:
                tail = self._init_log(pod.metadata.name, init[0])
                why = f"init container {init[0]} has not completed ({init[1]})" + (
                    f"; its last log lines:\n{tail}" if tail else "")
            else:
                why = self._events_reason(name) if name else "the Job made no pod for it"
            why = why or self.pending.get(rank) or "no reason reported"
            self.exit_codes[rank] = -1
            self.reasons[rank] = (f"pod {name or f'rank {rank}'} not running after the {self.plan.start_deadline_s} s "
                                  f"start deadline: {why}")

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
        container runs (see the module docstring); gives up after `retry.bound_s` without progress."""
        last: tuple[str, str] | None = None  # the time of the last line given
        at_last = 0  # how many lines were given with that time
        got_at: float | None = None  # when (here) the last line came
        stalled: float | None = None  # since when no line came while the container runs
        attempt = 0
        why = ""
        final = False  # the container ended while its stream was broken: one last read for what it printed
        while True:
            kw: dict[str, Any] = {}
            if got_at is not None:
                kw["since_seconds"] = max(1, math.ceil(time.monotonic() - got_at) + SINCE_MARGIN_S)
            response = None
            try:
                response = self.api.core.read_namespaced_pod_log(
                    pod_name, self.plan.namespace, container=self.plan.app_container, follow=True, timestamps=True,
                    _preload_content=False, **kw)
            except Exception as exc:  # noqa: BLE001 - ApiException, connection errors: retried or said
                why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                if not (transient(exc) or _status(exc) == 400):  # 400: the container is not running (yet/now)
                    yield f"[gpucluster] no log for pod {pod_name}: {why}\n".encode()
                    return
            broken: list[BaseException] = []
            if response is not None:
                skip = at_last if last is not None else 0
                for raw in _lines(response, broken):
                    stamp, sep, text = raw.partition(b" ")
                    key = _stamp(stamp) if sep else None
                    if key is None:  # not a time: given as it is
                        yield raw
                        continue
                    if last is not None and key < last:
                        continue
                    if key == last and skip:
                        skip -= 1
                        continue
                    at_last = at_last + 1 if key == last else 1
                    last, got_at, stalled, attempt = key, time.monotonic(), None, 0
                    yield text
                why = f"the stream broke: {broken[0]}" if broken else "the stream ended"
            if self.closed or rank in self.ended:
                return
            if rank in self.exit_codes:  # the container ended: a stream that ended by itself had it all
                if (response is not None and not broken) or final:
                    return
                final = True
                continue
            now = time.monotonic()
            stalled = stalled if stalled is not None else now
            if now - stalled > self.retry.bound_s:
                yield (f"[gpucluster] lost the log of pod {pod_name} for {now - stalled:.0f} s ({why}); its exit "
                       "code comes from its container status\n").encode()
                return
            attempt += 1
            end = time.monotonic() + backoff(attempt)
            while time.monotonic() < end and not self._done(rank):
                time.sleep(0.05)

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


def _stamp(text: bytes) -> tuple[str, str] | None:
    """An RFC3339(Nano) UTC time as a sortable key: (date and time, the fraction to 9 digits). The
    kubelet's times drop trailing zeros of the fraction, so they do not sort as text."""
    t = text.decode("ascii", "replace")
    if len(t) < 20 or t[4] != "-" or t[10] != "T" or not t.endswith("Z"):
        return None
    main, _, frac = t[:-1].partition(".")
    return (main, frac.ljust(9, "0")) if frac.isdigit() or not frac else None


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
