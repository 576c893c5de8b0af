"""FAKE Kubernetes API for the launcher tests: an in-memory stand-in, NOT a real cluster.

`FakeKubeApi` implements the few CoreV1Api / BatchV1Api / CustomObjectsApi methods the launcher
calls, with the same names and argument order, records every call in `calls`, and simulates an
Indexed Job's pods: creating the Job creates one Pending pod per index; every `list_namespaced_pod`
call is one tick of a clock that moves pods to Running and then to Succeeded or Failed as their
`PodScript` says. A pod's log is its script's lines, handed out in odd-sized byte chunks (lines are
split across chunks on purpose); a pod that "runs forever" keeps its log stream open until it is
deleted. Deleting the Job deletes its pods. Failure switches: a pod exit code, a container stuck
in a waiting reason (ImagePullBackOff), an API refusal per create call, a KeyboardInterrupt on the
n-th pod listing, 503 answers to chosen pod listings.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace as NS

INDEX = "batch.kubernetes.io/job-completion-index"


class FakeApiException(Exception):
    """Shaped like kubernetes.client.ApiException: status and reason."""

    def __init__(self, status: int, reason: str = ""):
        super().__init__(f"({status}) {reason}")
        self.status = status
        self.reason = reason


@dataclass
class PodScript:
    lines: list[str] = field(default_factory=list)
    exit_code: int | None = 0  # None: runs until deleted
    start_after: int = 1  # ticks spent Pending
    run_ticks: int = 2  # ticks spent Running before it terminates
    waiting_reason: str | None = None  # stays Pending with this container waiting reason
    unschedulable: bool = False  # reports PodScheduled=False (no node with a free GPU)


class _Pod:
    def __init__(self, name: str, index: int, labels: dict, script: PodScript):
        self.name, self.index, self.labels, self.script = name, index, labels, script
        self.age = 0
        self.phase = "Pending"
        self.deleted = threading.Event()
        self.ended = threading.Event()

    def tick(self) -> None:
        self.age += 1
        s = self.script
        if self.phase == "Pending" and s.waiting_reason is None and self.age >= s.start_after:
            self.phase = "Running"
        if self.phase == "Running" and s.exit_code is not None and self.age >= s.start_after + s.run_ticks:
            self.phase = "Succeeded" if s.exit_code == 0 else "Failed"
            self.ended.set()

    def view(self) -> NS:
        if self.phase == "Pending":
            waiting = NS(reason=self.script.waiting_reason or "ContainerCreating", message="fake")
            state = NS(waiting=waiting, running=None, terminated=None)
        elif self.phase == "Running":
            state = NS(waiting=None, running=NS(started_at=None), terminated=None)
        else:
            code = self.script.exit_code
            state = NS(waiting=None, running=None,
                       terminated=NS(exit_code=code, reason="Completed" if code == 0 else "Error"))
        return NS(
            metadata=NS(name=self.name, labels=dict(self.labels),
                        annotations={} if "training.kubeflow.org/replica-type" in self.labels
                        else {INDEX: str(self.index)}),
            status=NS(phase=self.phase, reason=None, container_statuses=[NS(name="pytorch", state=state)],
                      conditions=[NS(type="PodScheduled", status="False", reason="Unschedulable",
                                     message="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")]
                      if self.script.unschedulable else []),
        )


class _LogResponse:
    """Like urllib3's HTTPResponse with _preload_content=False: .stream() yields byte chunks."""

    def __init__(self, pod: _Pod, chunk: int = 7):
        self.pod, self.chunk = pod, chunk
        self.released = False

    def stream(self):
        data = "".join(line + "\n" for line in self.pod.script.lines).encode()
        for i in range(0, len(data), self.chunk):
            yield data[i:i + self.chunk]
        # follow=True: the stream stays open while the container runs
        while not (self.pod.ended.is_set() or self.pod.deleted.is_set()):
            self.pod.deleted.wait(0.05)

    def release_conn(self):
        self.released = True


class FakeKubeApi:
    """FAKE: records calls, keeps objects in dicts, simulates pods. Use as core, batch and custom."""

    def __init__(self, scripts: dict[int, PodScript], *, refuse: dict[str, int] | None = None,
                 interrupt_on_list: int | None = None, list_errors: tuple[int, ...] = ()):
        self.scripts = scripts
        self.refuse = refuse or {}
        self.interrupt_on_list = interrupt_on_list
        self.list_errors = set(list_errors)  # listing numbers (1-based) that answer 503
        self.calls: list[tuple] = []
        self.objects: dict[tuple[str, str], object] = {}
        self.pods: dict[str, _Pod] = {}
        self.responses: list[_LogResponse] = []
        self.lists = 0
        self.lock = threading.Lock()

    # -- create ----------------------------------------------------------------------------
    def _create(self, kind: str, namespace: str, body) -> object:
        name = body["metadata"]["name"] if isinstance(body, dict) else body.metadata.name
        self.calls.append(("create", kind, namespace, name))
        if kind in self.refuse:
            raise FakeApiException(self.refuse[kind], "Forbidden" if self.refuse[kind] == 403 else "refused")
        if (kind, name) in self.objects:
            raise FakeApiException(409, "AlreadyExists")
        self.objects[(kind, name)] = body
        return body

    def create_namespaced_config_map(self, namespace, body, **kw):
        return self._create("configmap", namespace, body)

    def create_namespaced_service(self, namespace, body, **kw):
        return self._create("service", namespace, body)

    def create_namespaced_job(self, namespace, body, **kw):
        self._create("job", namespace, body)
        labels = body.spec.template.metadata.labels
        for i in range(body.spec.completions):
            name = f"{body.metadata.name}-{i}-fake{i}"
            self.pods[name] = _Pod(name, i, labels, self.scripts.get(i, PodScript()))
        return body

    def create_namespaced_custom_object(self, group, version, namespace, plural, body, **kw):
        self._create(f"{plural}.{group}", namespace, body)
        # the training operator's part: one pod per replica, labelled with its type and index
        name, rank = body["metadata"]["name"], 0
        for kind in ("Master", "Worker"):
            spec = body["spec"]["pytorchReplicaSpecs"].get(kind)
            for i in range(spec["replicas"] if spec else 0):
                labels = dict(spec["template"]["metadata"]["labels"])
                labels.update({"training.kubeflow.org/replica-type": kind.lower(),
                               "training.kubeflow.org/replica-index": str(i)})
                pod = f"{name}-{kind.lower()}-{i}"
                self.pods[pod] = _Pod(pod, rank, labels, self.scripts.get(rank, PodScript()))
                rank += 1
        return body

    # -- read ------------------------------------------------------------------------------
    def list_namespaced_pod(self, namespace, label_selector=None, **kw):
        with self.lock:
            self.lists += 1
            self.calls.append(("list", "pod", namespace, label_selector))
            if self.interrupt_on_list is not None and self.lists >= self.interrupt_on_list:
                raise KeyboardInterrupt
            if self.lists in self.list_errors:
                raise FakeApiException(503, "Service Unavailable")
            key, _, value = (label_selector or "").partition("=")
            items = []
            for pod in list(self.pods.values()):
                pod.tick()
                if not key or pod.labels.get(key) == value:
                    items.append(pod.view())
            return NS(items=items)

    def read_namespaced_pod_log(self, name, namespace, container=None, follow=False, _preload_content=True, **kw):
        self.calls.append(("log", "pod", namespace, name, container, follow))
        if name not in self.pods:
            raise FakeApiException(404, "NotFound")
        response = _LogResponse(self.pods[name])
        self.responses.append(response)
        return response

    # -- delete ----------------------------------------------------------------------------
    def _delete(self, kind: str, name: str, namespace: str, body=None):
        policy = getattr(body, "propagation_policy", None)
        self.calls.append(("delete", kind, namespace, name, policy))
        if (kind, name) not in self.objects:
            raise FakeApiException(404, "NotFound")
        del self.objects[(kind, name)]

    def delete_namespaced_job(self, name, namespace, body=None, **kw):
        self._delete("job", name, namespace, body)
        for pod_name in [p for p in self.pods if p.startswith(name + "-")]:
            self.pods.pop(pod_name).deleted.set()

    def delete_namespaced_service(self, name, namespace, **kw):
        self._delete("service", name, namespace)

    def delete_namespaced_config_map(self, name, namespace, **kw):
        self._delete("configmap", name, namespace)

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, body=None, **kw):
        self._delete(f"{plural}.{group}", name, namespace, body)
        for pod_name in [p for p in self.pods if p.startswith(name + "-")]:
            self.pods.pop(pod_name).deleted.set()

    # -- inspection ------------------------------------------------------------------------
    def of(self, verb: str) -> list[tuple]:
        return [c for c in self.calls if c[0] == verb]
