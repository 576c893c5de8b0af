"""The `check` phase on gcp (docs/recovery.md): gpucluster/node/node_check.py in every pod, judged by
`gpucluster.watch.health` as on the other backends.

A pod exists only once the Job does, so the check, like staging (`stage`), is part of the run:
`PodChecker` is the `stage` of `gpucluster.watch.supervisor.NodeSupervisor.run`, in front of the stager
when there is one. Every rank's argv waits for `plan.STAGED_FILE` before anything of the job
(setup, torchrun). Once every pod's training container runs and the pod has an address
(`status.podIP`, empty until one is allocated: Kubernetes API reference, PodStatus), node_check.py
(shipped in the ConfigMap) runs in each pod through the exec API, in the training container (the
one that holds the node's GPUs), all at once: node 0's pod hosts the check's TCP store on the
rendezvous port + 1 (its own network namespace: nothing else there uses it) and every process group
binds its own pod's address. What each prints comes back on the exec stream and is read, judged and
recorded by `gpucluster.watch.health.run` on a thread of its own; its records reach the run's events from
`poll`, on the supervisor's thread. Then:

- every node passed: the stager goes on (it makes the staged file), or the staged file is made in
  every pod here, and the job starts;
- a node failed: the run fails before anything of the job started, naming each bad node and its pod
  (`health check failed: node 1 (pod NAME): ...`), each with a `node_lost` record (cause `health`:
  the recovery loop provisions again, gpucluster/lifecycle/recovery.py); a pod lost during the check (deleted,
  preempted) is named as lost.

Stopping (`cancel`) closes the exec streams and ends what may still run of the check in each pod
(an exec whose stream closes need not end its command in a real container).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from gpucluster.events import NullEvents, Phase, RunEvents

from .outputs import TOUCH, _exec, _run
from .plan import CHECK_FILE, MOUNT, RUN_DIR, STAGED_FILE, Plan

if TYPE_CHECKING:
    from gpucluster.states import JsonObject
    from gpucluster.watch.health import HealthSpec

    from .api import KubeApi, KubeObject, Retry
    from .pods import _Pods
    from .stage import PodStager

ADDRESS_WAIT_S = 15.0  # how long every pod may run without its address before its DNS name is used

class _ExecProc:
    """What `gpucluster.watch.health` reads of a node's check program (a `subprocess.Popen`'s `stdout`,
    `poll`, `returncode`), over one exec stream: its stdout and stderr on one pipe, as a node's
    merged output; the exit status once the stream has ended (-1 when Kubernetes gave none)."""

    def __init__(self, open_stream: Callable[[], KubeObject]):
        r, w = os.pipe()
        self.stdout = os.fdopen(r, "rb", buffering=0)
        self._w = w
        self.returncode: int | None = None
        self.client: KubeObject = None
        self._closed = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._pump, args=(open_stream,), daemon=True)
        self._thread.start()

    def _write(self, data: object) -> None:
        if data:
            os.write(self._w, data if isinstance(data, bytes) else str(data).encode())

    def _pump(self, open_stream: Callable[[], KubeObject]) -> None:
        rc: int | None = None
        try:
            self.client = client = open_stream()
            if self._closed:
                client.close()
            while True:
                for read in (client.read_stdout, client.read_stderr):
                    self._write(read(timeout=0))
                if not client.is_open():
                    for read in (client.read_stdout, client.read_stderr):
                        self._write(read(timeout=0))
                    break
                client.update(timeout=1)
            try:
                rc = client.returncode
            except Exception:  # noqa: BLE001 - the stream broke before Kubernetes sent the status
                rc = None
        except Exception as exc:  # noqa: BLE001 - the exec was refused (the pod gone): said on the node's output
            self._write(f"the exec into the pod failed: {exc}\n")
        finally:
            os.close(self._w)
            self.returncode = -1 if rc is None else int(rc)
            self._done.set()

    def poll(self) -> int | None:
        return self.returncode if self._done.is_set() else None

    def close(self) -> None:
        self._closed = True
        if self.client is not None:
            try:
                self.client.close()
            except Exception:  # noqa: BLE001 - closing what may already be closed
                pass
        self._thread.join(5)


class _Buffered(NullEvents):
    """The run's events, kept while the check's thread reports and given on the supervisor's thread."""

    def __init__(self) -> None:
        self.calls: list[Callable[[RunEvents], None]] = []
        self.lock = threading.Lock()

    def on_metric(self, node_rank: int | None, record: JsonObject) -> None:
        with self.lock:
            self.calls.append(lambda events: events.on_metric(node_rank, record))

    def message(self, text: str) -> None:
        with self.lock:
            self.calls.append(lambda events: events.message(text))

    def flush(self, events: RunEvents) -> None:
        with self.lock:
            calls, self.calls = self.calls, []
        for call in calls:
            call(events)


class PodChecker:
    """The health check in every pod of `plan`, before `then` (the stager) or the job (see the
    module docstring)."""

    def __init__(self, api: KubeApi, plan: Plan, pods: _Pods, spec: HealthSpec, then: PodStager | None = None,
                 python: str = "python", log_dir: Path | None = None, retry: Retry | None = None):
        self.api, self.plan, self.pods, self.spec, self.then = api, plan, pods, spec, then
        self.python, self.log_dir, self.retry = python, log_dir, retry
        self.events: RunEvents | None = None
        self.phase: Phase = Phase.CHECK
        self.passed = False
        self.failure: str | None = None
        self.procs: dict[int, _ExecProc] = {}
        self._buffer = _Buffered()
        self._thread: threading.Thread | None = None
        self._released = False
        self._cancelled = False
        self._running_since: float | None = None

    @property
    def done(self) -> bool:
        if not self.passed:
            return False
        return self.then.done if self.then is not None else self._released

    def poll(self) -> str | None:
        if self.events is not None:
            self._buffer.flush(self.events)
        if self.failure is not None:
            return self.failure
        if self._thread is None:
            running = [r for r in range(self.plan.nodes) if r in self.pods.attached and self.pods.pod_names.get(r)]
            if len(running) < self.plan.nodes:
                return None
            self._running_since = self._running_since or time.monotonic()
            addressed = all(r in self.pods.ips for r in running)
            # a pod that runs has its address; should the API not say it, the pod's DNS name serves
            if (addressed or time.monotonic() - self._running_since > ADDRESS_WAIT_S) and not self._cancelled:
                self._thread = threading.Thread(target=self._check, name="check-pods", daemon=True)
                self._thread.start()
            return None
        if not self.passed:
            return None
        if self.then is not None:
            self.phase = Phase.STAGE
            if self.then.events is None:
                self.then.events = self.events
            return self.then.poll()
        if not self._released:
            failure = self._release()
            if failure:
                self.failure = failure
                return failure
            self._released = True
        return None

    def cancel(self, wait_s: float = 10.0) -> None:
        self._cancelled = True
        self._stop()
        if self._thread is not None:
            self._thread.join(wait_s)
        if self.then is not None:
            self.then.cancel()

    # -- the check, on its own thread -------------------------------------------------------------
    def _check(self) -> None:
        from gpucluster.watch import health

        names = {r: self.pods.pod_names[r] for r in range(self.plan.nodes)}
        ips = {r: self.pods.ips.get(r) or self.plan.hosts[r] for r in range(self.plan.nodes)}
        store = f"{ips[0]}:{self.plan.rdzv_port + 1}"
        program = f"{MOUNT}/{CHECK_FILE}"
        for r in range(self.plan.nodes):
            argv = [self.python, program, *health.program_args(self.spec, rank=r, world=self.plan.nodes, store=store,
                                                               addr=ips[r], disk=RUN_DIR)]
            self.procs[r] = _ExecProc(functools.partial(self._open, names[r], argv))
        try:
            health.run(self.procs, {r: f"pod {n}" for r, n in names.items()}, self.spec, self._buffer, self._stop,
                       log_dir=self.log_dir, lost_why=lambda rank, code: self.pods.lost.get(rank))
        except Exception as exc:  # noqa: BLE001 - HealthCheckFailed names the nodes; anything else fails the run too
            self.failure = str(exc) if str(exc).startswith("health check failed") else f"health check failed: {exc}"
            return
        self.passed = True

    def _open(self, pod: str, argv: list[str]) -> KubeObject:
        # stdin: the stream then carries what the program prints as it prints it (its first line's
        # arrival is the clock check's reference); the program never reads it
        return _exec(self.api, self.plan, pod, argv, stdin=True, container=self.plan.app_container)

    def _stop(self) -> None:
        """Close every check stream; in each pod whose program may still run, end it."""
        still = [r for r, p in self.procs.items() if p.poll() is None]
        for p in self.procs.values():
            p.close()
        for r in still:
            pod = self.pods.pod_names.get(r)
            if pod and r not in self.pods.lost:
                try:
                    _run(self.api, self.plan, pod, [self.python, f"{MOUNT}/{CHECK_FILE}", "--stop"], self.retry,
                         container=self.plan.app_container)
                except Exception:  # noqa: BLE001 - a pod that is gone has nothing left to stop
                    pass

    def _release(self) -> str | None:
        """Every node passed and nothing is to be staged: the staged file in each pod, the job starts."""
        errors = []
        for r in range(self.plan.nodes):
            pod = self.pods.pod_names[r]
            try:
                rc, err = _run(self.api, self.plan, pod, [self.python, "-c", TOUCH, STAGED_FILE], self.retry)
            except Exception as exc:  # noqa: BLE001 - ApiException, a broken stream: the run fails naming it
                rc, err = None, str(exc)
            if rc != 0:
                errors.append(f"cannot start the job on node {r} (pod {pod}) after its health check: "
                              + (err.strip().splitlines()[-1] if err.strip() else f"exit code {rc}"))
        return "; ".join(errors) or None

