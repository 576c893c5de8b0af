"""FAKE Kubernetes controllers for tests/k8s_fake.py: the Job controller and the Kubeflow training
operator (v1) act on a run's pods as the real ones do, on their own thread, whatever the client does.

Every rule below is the real controller's, with its source:

- A pod counts as failed when its phase is Failed, or when it is being deleted (deletionTimestamp)
  and has not Succeeded, unless the Job only replaces failed pods (`podReplacementPolicy: Failed`,
  which a `podFailurePolicy` implies): kubernetes/kubernetes pkg/controller/job/job_controller.go
  `isPodFailed` (v1.34) — "Count deleted Pods as failures to account for orphan Pods that never have a
  chance to reach the Failed phase". A pod removed without a terminal phase (its node lost, the pod
  garbage-collected) is counted as failed too: the Job's tracking finalizer keeps it visible to the
  controller until it has counted it (Kubernetes docs, "Jobs", "Job tracking with finalizers").
- `backoffLimit` (default 6): once more pods failed than it allows, "the Job will be marked as failed
  and any running Pods will be terminated" (Kubernetes docs, "Jobs", "Pod backoff failure policy");
  condition Failed, reason BackoffLimitExceeded.
- `backoffLimitPerIndex` (Indexed Jobs only; GA in 1.33): failures are counted per index; an index
  that failed more than the limit is marked failed (status.failedIndexes) and not retried, and "the
  Job executes all indexes by default"; when every index has finished and one failed, the Job fails
  with reason FailedIndexes; `maxFailedIndexes` exceeded fails the Job at once (reason
  MaxFailedIndexesExceeded) and terminates its running pods (Kubernetes docs, "Jobs", "Backoff limit
  per index"). With it set, `backoffLimit` defaults to the largest int32.
- `podFailurePolicy` rules, first match wins (Kubernetes docs, "Jobs", "Pod failure policy";
  pkg/controller/job/pod_failure_policy.go): `onExitCodes` (a container's terminated exit code, 0
  ignored, `In`/`NotIn`, optional containerName) or `onPodConditions` (e.g. DisruptionTarget);
  actions FailJob (the Job fails now, reason PodFailurePolicy, running pods terminated), Ignore (not
  counted; the pod is replaced), FailIndex (the index fails), Count (the default).
- A failed pod whose index (or Job) still has retries is replaced by a new pod of the same index
  (restartPolicy Never: "the Job controller starts a new Pod").
- `activeDeadlineSeconds`, counted from the Job's start: once reached "all of its running Pods are
  terminated and the Job status will become type: Failed with reason: DeadlineExceeded".
- `ttlSecondsAfterFinished`: the TTL-after-finished controller deletes a finished Job, and with it
  its pods (cascading), that many seconds after it finished (Kubernetes docs, "Automatic Cleanup for
  Finished Jobs").
- Validation (pkg/apis/batch/validation/validation.go): backoffLimitPerIndex only with Indexed
  completion mode; maxFailedIndexes needs backoffLimitPerIndex and is at most completions;
  podFailurePolicy needs the template's restartPolicy Never; the FailIndex action needs
  backoffLimitPerIndex -> 422.
- Kubeflow training operator v1 (kubeflow/training-operator pkg/controller.v1/pytorch and
  pkg/controller.v1/common/job.go): a PyTorchJob succeeds when its Master succeeds and fails when a
  replica's pod fails past `runPolicy.backoffLimit`; once finished, its pods are deleted by
  `runPolicy.cleanPodPolicy`: All deletes every pod, Running the running ones, None none.

Time: the controllers read `fake.clock()` (seconds, scaled by `fake.time_scale`), so a test can let
a 10-minute deadline pass in a fraction of a second.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass, field

from k8s_fake_objects import FakeApiException, _get

MAX_INT32 = 2**31 - 1
SYNC_S = 0.02  # how often the controllers look (the real one reacts to pod watch events within ms)


@dataclass
class JobState:
    """What the Job controller keeps of one Job (its status, as the API server would store it)."""

    name: str
    kind: str  # "job" or "pytorchjob"
    indexes: int
    started: float  # fake clock
    backoff_limit: int
    per_index: int | None = None
    max_failed_indexes: int | None = None
    failure_policy: list = field(default_factory=list)
    only_failed: bool = False  # podReplacementPolicy Failed (implied by a podFailurePolicy)
    deadline_s: int | None = None
    ttl_s: int | None = None
    clean_pod_policy: str = "None"  # pytorchjob only
    pods: dict = field(default_factory=dict)  # pod name -> index, every pod the Job made
    counted: set = field(default_factory=set)  # pod names already counted as failed or succeeded
    failures: dict = field(default_factory=dict)  # index -> failed pods
    failed_total: int = 0
    failed_indexes: set = field(default_factory=set)
    succeeded: set = field(default_factory=set)
    condition: tuple[str, str, str] | None = None  # (type, reason, message) once finished
    finished_at: float | None = None
    replacements: int = 0


def validate_job(body) -> None:
    spec = body.spec
    mode = spec.completion_mode or "NonIndexed"
    policy = spec.pod_failure_policy
    if spec.backoff_limit_per_index is not None and mode != "Indexed":
        raise FakeApiException(422, "spec.backoffLimitPerIndex: Invalid value: requires indexed completion mode")
    if spec.max_failed_indexes is not None:
        if spec.backoff_limit_per_index is None:
            raise FakeApiException(422, "spec.maxFailedIndexes: Required value: when maxFailedIndexes is specified, "
                                        "backoffLimitPerIndex must also be specified")
        if spec.max_failed_indexes > (spec.completions or 0):
            raise FakeApiException(422, "spec.maxFailedIndexes: Invalid value: must be less than or equal to completions")
    if policy is not None:
        if (spec.template.spec.restart_policy or "Always") != "Never":
            raise FakeApiException(422, "spec.podFailurePolicy: Invalid value: only \"Never\" is supported "
                                        "when podFailurePolicy is specified")
        for rule in policy.rules or []:
            if rule.action == "FailIndex" and spec.backoff_limit_per_index is None:
                raise FakeApiException(422, "spec.podFailurePolicy.rules.action: Invalid value: \"FailIndex\": "
                                            "requires the backoffLimitPerIndex to be set")


def job_state(body, started: float) -> JobState:
    spec = body.spec
    per_index = spec.backoff_limit_per_index
    default_limit = MAX_INT32 if per_index is not None else 6
    policy = spec.pod_failure_policy
    return JobState(
        name=body.metadata.name, kind="job", indexes=spec.completions, started=started,
        backoff_limit=spec.backoff_limit if spec.backoff_limit is not None else default_limit,
        per_index=per_index, max_failed_indexes=spec.max_failed_indexes,
        failure_policy=list(policy.rules or []) if policy is not None else [],
        only_failed=policy is not None or spec.pod_replacement_policy == "Failed",
        deadline_s=spec.active_deadline_seconds, ttl_s=spec.ttl_seconds_after_finished)


def pytorchjob_state(body: dict, started: float, replicas: int) -> JobState:
    run = body["spec"].get("runPolicy") or {}
    return JobState(name=body["metadata"]["name"], kind="pytorchjob", indexes=replicas, started=started,
                    backoff_limit=run.get("backoffLimit", 0) if run.get("backoffLimit") is not None else 0,
                    deadline_s=run.get("activeDeadlineSeconds"), ttl_s=run.get("ttlSecondsAfterFinished"),
                    clean_pod_policy=run.get("cleanPodPolicy") or "None")


def _matches(rule, pod) -> bool:
    codes = _get(rule, "on_exit_codes")
    if codes is not None:
        name = _get(codes, "container_name")
        found = [c.code for c in pod.containers if c.code not in (None, 0) and (name is None or c.name == name)]
        values = set(_get(codes, "values") or [])
        op = _get(codes, "operator")
        return any((code in values) if op == "In" else (code not in values) for code in found)
    for cond in _get(rule, "on_pod_conditions") or []:
        if _get(cond, "type") == "DisruptionTarget" and pod.shutdown is not None and (_get(cond, "status") or "True") == "True":
            return True
    return False


class JobControllers:
    """Mixin for FakeKubeApi: the Job controller, the TTL controller and the training operator."""

    def _start_controllers(self) -> None:
        self.jobs: dict[str, JobState] = {}
        self.time_scale = 1.0  # fake seconds per real second
        self._t0 = time.monotonic()
        ref = weakref.ref(self)

        def loop() -> None:
            while True:
                fake = ref()
                if fake is None or fake.controllers_off:
                    return
                fake.sync_controllers()
                del fake
                time.sleep(SYNC_S)

        self.controllers_off = False
        threading.Thread(target=loop, daemon=True, name="fake-job-controller").start()

    def clock(self) -> float:
        return (time.monotonic() - self._t0) * self.time_scale

    def job_condition(self, name: str) -> tuple[str, str, str] | None:
        state = self.jobs.get(name)
        return state.condition if state else None

    # -- one pass of every controller ------------------------------------------------------------
    def sync_controllers(self) -> None:
        with self.lock:
            now = self.clock()
            self.sync_trainer(now)  # Kubeflow Trainer v2 and JobSet (tests/k8s_fake_trainer.py)
            for name, state in list(self.jobs.items()):
                if state.condition is None:
                    self._sync_job(state, now)
                if state.condition is not None and state.ttl_s is not None and state.finished_at is not None \
                        and now - state.finished_at >= state.ttl_s:  # the TTL-after-finished controller
                    self._ttl_delete(state)

    def _sync_job(self, state: JobState, now: float) -> None:
        for pod_name, index in list(state.pods.items()):
            if pod_name in state.counted:
                continue
            pod = self.pods.get(pod_name)
            phase = pod.phase if pod is not None else None
            if phase == "Succeeded":
                state.counted.add(pod_name)
                state.succeeded.add(index)
                continue
            gone = pod is None  # removed before it reached a terminal phase: its finalizer made it counted
            deleting = pod is not None and pod.terminating is not None  # deletionTimestamp set
            failed = phase == "Failed" or gone or (deleting and not state.only_failed)
            if not failed:
                continue
            state.counted.add(pod_name)
            self._pod_failed(state, index, pod)
            if state.condition is not None:
                return
        # restartPolicy OnFailure: the containers' restarts count toward backoffLimit (job_controller.go
        # pastBackoffLimitOnFailure: "the sum of the restartCount of all containers ... > backoffLimit")
        restarts = sum(c.restarts for n in state.pods if (p := self.pods.get(n)) is not None
                       and p.restart_policy == "OnFailure" for c in p.containers)
        if restarts and restarts > state.backoff_limit:
            self._finish(state, "Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
            return
        if state.deadline_s is not None and now - state.started >= state.deadline_s:
            self._finish(state, "Failed", "DeadlineExceeded", "Job was active longer than specified deadline")
            return
        if state.kind == "pytorchjob":
            if 0 in state.succeeded:  # the Master succeeded: the PyTorchJob did
                self._finish(state, "Succeeded", "PyTorchJobSucceeded", f"PyTorchJob {state.name} is successfully completed.")
            return
        done = state.succeeded | state.failed_indexes
        if len(state.succeeded) == state.indexes:
            self._finish(state, "Complete", "CompletionsReached", "Reached expected number of succeeded pods")
        elif len(done) == state.indexes and state.failed_indexes:
            self._finish(state, "Failed", "FailedIndexes", "Job has failed indexes")

    def _pod_failed(self, state: JobState, index: int, pod) -> None:
        action = "Count"
        for rule in state.failure_policy:
            if pod is not None and _matches(rule, pod):
                action = _get(rule, "action") or "Count"
                break
        if action == "FailJob":
            self._finish(state, "Failed", "PodFailurePolicy", f"Container of pod {pod.name} matched a FailJob rule")
            return
        if action == "Ignore":
            self._new_pod_for(state, index)
            return
        state.failed_total += 1
        if state.per_index is not None:
            state.failures[index] = state.failures.get(index, 0) + 1
            if action == "FailIndex" or state.failures[index] > state.per_index:
                state.failed_indexes.add(index)
                if state.max_failed_indexes is not None and len(state.failed_indexes) > state.max_failed_indexes:
                    self._finish(state, "Failed", "MaxFailedIndexesExceeded", "Job has exceeded maxFailedIndexes")
                return
            self._new_pod_for(state, index)
            return
        if state.failed_total > state.backoff_limit:
            reason = "BackoffLimitExceeded" if state.kind == "job" else "PyTorchJobFailed"
            self._finish(state, "Failed", reason, "Job has reached the specified backoff limit")
            return
        self._new_pod_for(state, index)

    def _replacement_pod(self, job: str, index: int, n: int) -> str | None:
        """The Job controller's new pod for `index` after one failed (tests/k8s_fake_jobs.py)."""
        body, namespace = self.objects.get(("job", job)), self.object_ns.get(("job", job), "default")
        if body is None:
            return None
        network = self.networks[job]
        pod = self._new_pod(f"{job}-{index}-fake{index}r{n}", index, body.spec.template.metadata.labels,
                            body.spec.template.spec, job)
        pod.network, pod.dns_names = network, self._dns_names(body, index)
        pod.resolve_env = lambda containers=body.spec.template.spec.containers: self.secret_env(containers, namespace)
        return pod.name

    def _new_pod_for(self, state: JobState, index: int) -> None:
        """A new pod for `index` (restartPolicy Never: the controller starts a new Pod)."""
        if state.kind != "job":
            return
        state.replacements += 1
        name = self._replacement_pod(state.name, index, state.replacements)
        if name is not None:
            state.pods[name] = index

    def _finish(self, state: JobState, kind: str, reason: str, message: str) -> None:
        state.condition = (kind, reason, message)
        state.finished_at = self.clock()
        if state.kind == "job":
            if kind != "Failed":
                return
            running_only = True  # the Job controller terminates the running pods; finished ones stay
        elif state.clean_pod_policy == "None":
            return
        else:
            running_only = state.clean_pod_policy == "Running"
        for pod_name in state.pods:
            pod = self.pods.get(pod_name)
            if pod is None or pod.terminating is not None:
                continue
            if running_only and pod.phase in ("Succeeded", "Failed"):
                continue
            self._delete_pod_object(pod_name)

    def _delete_pod_object(self, pod_name: str) -> None:
        """A pod deleted (by a client or a controller): its containers stopped, listed as terminating a while."""
        pod = self.pods[pod_name]
        pod.kill()
        if self.delete_ticks:
            pod.terminating = self.delete_ticks
        else:
            self.pods.pop(pod_name)

    def _ttl_delete(self, state: JobState) -> None:
        self.jobs.pop(state.name, None)
        key = ("job", state.name) if state.kind == "job" else ("pytorchjobs.kubeflow.org", state.name)
        self.objects.pop(key, None)
        self.object_ns.pop(key, None)
        for pod_name in state.pods:
            if pod_name in self.pods and self.pods[pod_name].terminating is None:
                self._delete_pod_object(pod_name)
