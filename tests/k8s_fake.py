"""FAKE Kubernetes API for the launcher tests: an in-memory stand-in, NOT a real cluster.

`FakeKubeApi` implements the CoreV1Api / BatchV1Api / CustomObjectsApi methods the launcher calls,
with the same names and argument order, records every call in `calls`, and runs an Indexed Job's pods:
creating the Job creates one Pending pod per index; every `list_namespaced_pod` call is one tick of
the scheduler's and kubelet's clock (placement, image pull, init containers); from then on the pod's
containers run their REAL commands as processes here (tests/k8s_fake_pod.py: the launcher's own entry
script, wait.py and keeper, with a fake torchrun that plays the pod's `PodScript`). Deleting the Job
deletes its pods. tests/k8s_fake_http.py serves this fake over HTTP and websockets, so that the real
kubernetes client (and its `stream`, which patches its ApiClient) talks to it.

Failure switches: a pod exit code or script, a container stuck in a waiting reason (ImagePullBackOff),
an image without python, an OOM kill, an API refusal per create call (`refuse`) or delete
(`refuse_delete`), a KeyboardInterrupt on the n-th pod listing or when a condition holds, 503 answers
to chosen pod listings (`list_errors`), the whole API down for a while (`outage`), a log stream cut
(`cut_logs`), a pod lost with its node (`lose`), slow exec stdin (`stdin_delay`).

It behaves like a real API server at its worst, each behaviour with its public source:

- Pods start with skew, the head (index 0) LAST: `skew` extra Pending ticks per index below the
  highest. GPU nodes for different pods are created, get their driver installed and pull the image
  separately (GKE docs, "Run GPUs in GKE Standard node pools": driver installation runs on each new
  node; Kubernetes docs, "Pod Lifecycle": a pod is Pending until its containers are created), and
  nothing orders them by index.
- Pending pods carry Events (Kubernetes docs, "Events" / `kubectl describe pod`: a pod the scheduler
  cannot place gets a Warning `FailedScheduling` event with "0/N nodes are available: ...
  Insufficient nvidia.com/gpu"; the cluster autoscaler adds `TriggeredScaleUp` / `NotTriggerScaleUp`),
  read with `list_namespaced_event(field_selector="involvedObject.name=POD")`.
- Unauthenticated calls are refused with 401 (Kubernetes docs, "Authenticating": "requests that are
  rejected by all authenticators are ... HTTP status code 401"): with `auth` set, every call checks
  the bearer token the client would send.
- Field validation as the API server does it, for the objects we send (Kubernetes docs, "Object Names
  and IDs": ConfigMap/Job names are DNS-1123 subdomains, Service names DNS-1035 labels; "Labels and
  Selectors": equality-based selector syntax; ConfigMap docs: at most 1 MiB of data, keys
  [-._a-zA-Z0-9]+; Job docs: Indexed Jobs need `completions`, the pod template's restartPolicy must be
  Never or OnFailure; containers need a name and an image, unique in the pod) -> 422.
- Namespaces (Kubernetes docs, "Admission Controllers", NamespaceLifecycle: an object in a namespace
  that does not exist, or is being deleted, is refused; "Namespaces": default, kube-system,
  kube-public and kube-node-lease always exist): 404 `namespaces "x" not found`; deleting a namespace
  deletes what is in it.
- Deletion takes time (Kubernetes docs, "Garbage Collection": with Foreground propagation the owner
  stays, with a deletionTimestamp, until its dependents are gone; pods get a termination grace period):
  a deleted object and the Job's pods stay listed as terminating for `delete_ticks` more listings.
  `settle()` lets that time pass.
- The control plane goes away (GKE docs, "Standard cluster upgrades": a zonal cluster's only control
  plane is unavailable for minutes while it is upgraded; repairs ignore maintenance exclusions):
  `outage(seconds)` makes every call answer 503 Service Unavailable, refuses exec handshakes and
  breaks every open log stream and drops every open exec and port-forward websocket (no close frame:
  the TCP connection just ends) for that long (real seconds: the tests scale the launcher's retry
  bound down with it).
- Exec (`stream(core.connect_get_namespaced_pod_exec, POD, NS, command=..., container=..., binary=True,
  _preload_content=False)`, as kubernetes.stream.stream is called) works only into a running container
  (Kubernetes docs, "Get a Shell to a Running Container"; `kubectl exec` into an ended pod fails with
  "cannot exec into a container in a completed pod; current phase is Succeeded"; into an ended container
  of a running pod the runtime refuses: CRI, Exec needs a running container), a deleted or terminating
  pod is not found, and a handshake the API server refuses surfaces as ApiException(status=0)
  (kubernetes-client ws_client.websocket_call wraps every error that way). The command really runs
  (this machine's python) with the mount paths mapped (tests/k8s_fake_pod.py); its stdout comes back in
  odd-sized frames, decoded as UTF-8 with replacement unless binary=True (ws_client.WSClient.update),
  and `returncode` is known only once the stream is closed (WSClient.returncode).
- Secrets (Kubernetes docs, "Secrets"): a Secret's name is a DNS-1123 subdomain, its `data` keys
  [-._a-zA-Z0-9]+ and its values base64 (422 otherwise), at most 1 MiB in all. A container whose env
  refers to a Secret (`valueFrom.secretKeyRef`) gets the decoded value when the kubelet starts it;
  a Secret or key that does not exist then (or is being deleted) keeps the container waiting with
  reason CreateContainerConfigError and the kubelet's message (`secret "NAME" not found`,
  `couldn't find key KEY in Secret NS/NAME`; kubelet_pods.go makeEnvironmentVariables). The
  container's resolved environment is kept on the pod (`_Pod.env`) for tests to read.
- `preempt(rank)` is the kubelet's graceful node shutdown of the pod's node (Kubernetes docs, "Node
  Shutdowns": the pod's containers are stopped within its grace period and the pod is marked Failed,
  reason `Terminated`, message "Pod was terminated in response to imminent node shutdown.", with a
  `DisruptionTarget` condition, reason `TerminationByKubelet` (Kubernetes docs, "Pod disruption
  conditions"); GKE's docs name the reason `Shutdown` for preempted Spot VMs): the pod stays listed,
  Failed once its containers ended, its log ends; `delete_pod(rank)` deletes one pod as `kubectl
  delete pod` does: listed with a deletionTimestamp while it terminates (`delete_ticks`), then gone.
- Nodes (`spec.nodeName`, `read_node`) and GCE host maintenance of a GPU node as GKE shows it, late
  and with no warning at its start (`host_maintenance(rank)`): tests/k8s_fake_nodes.py, with its sources.
- Exec with stdin (`stdin=True`, as the launcher stages data): the command runs while frames are
  sent to it with `write_stdin`; its stdin is NEVER closed, because the v4 websocket protocol has
  no way to close it (kubernetes/kubernetes#89899; v5.channel.k8s.io added a close signal that
  older API servers do not speak), so a command that waits for end-of-input hangs, as in a real pod.
- RBAC for service-account tokens, label selectors of several requirements, Jobs that are not Indexed
  (placeholder pods, `parallelism` changed by a merge patch) and Roles, RoleBindings and Deployments
  stored: tests/k8s_fake_rbac.py, each with its source.
- The Job controller (failed and deleted pods counted per Job or per index, failed Jobs terminating
  their running pods, activeDeadlineSeconds, ttlSecondsAfterFinished, podFailurePolicy, replacement
  pods) and the Kubeflow training operator's cleanPodPolicy act on their own thread, on a clock
  scaled by `time_scale`: tests/k8s_fake_jobs.py, each rule with its source.
- Kubeflow Trainer v2 (TrainJob -> JobSet -> headless Service and child Jobs, API discovery, the torch
  ClusterTrainingRuntime): tests/k8s_fake_trainer.py, each rule with its source.
- GKE Workload Identity: a pod has Google credentials only when it runs as a Kubernetes service account
  annotated with the Google service account it acts as (GKE docs, "Authenticate to Google Cloud APIs
  from GKE workloads").
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace as NS

from k8s_fake_jobs import JobControllers, job_state, pytorchjob_state, validate_job
from k8s_fake_exec import _FakeExecStdin, _FakeExecTty, _FakeWSClient
from k8s_fake_logs import _InitLogResponse, _LogResponse
from k8s_fake_nodes import FakeNodes
from k8s_fake_objects import (BUILTIN_NAMESPACES, _FIELD_SELECTOR, _SELECTOR, FakeApiException,  # noqa: F401
                              ObjectStore, _get)
from k8s_fake_pod import INDEX, Network, _Pod, python_shim  # noqa: F401 - _Pod, INDEX: for tests
from k8s_fake_rbac import ClusterObjects, PlainPod, parse_selector, selector_match
from k8s_fake_sched import NodeViews
from k8s_fake_trainer import TrainerControllers

@dataclass
class PodScript:
    lines: list[str] = field(default_factory=list)
    exit_code: int | None = 0  # None: runs until stopped or deleted
    start_after: int = 1  # ticks spent Pending
    run_s: float = 0.1  # seconds torchrun runs after its lines
    first_output_s: float = 0.4  # from the rendezvous to the workers' first output (they import torch first)
    line_interval_s: float = 0.0  # seconds between two of its lines (a training that prints as it goes)
    waiting_reason: str | None = None  # stays Pending with this container waiting reason
    unschedulable: bool = False  # reports PodScheduled=False (no node with a free GPU)
    outputs: dict = field(default_factory=dict)  # relative path -> bytes/str, written to the output folder
    raw_tar: bytes | None = None  # what packing the output folder returns instead (a tampered image)
    no_python: bool = False  # the image has no `python`: the init container cannot start (StartError)
    program: bool = False  # torchrun runs the job's program as its workers instead of playing `lines`
    oom_after_s: float | None = None  # the kernel's OOM killer ends the training container after this

    def plan(self) -> dict:
        """What tests/k8s_fake_torchrun.py plays."""
        return {"lines": self.lines, "exit_code": self.exit_code, "run_s": self.run_s, "program": self.program,
                "first_output_s": self.first_output_s, "line_interval_s": self.line_interval_s,
                "outputs": {k: (v if isinstance(v, bytes) else v.encode()).hex() for k, v in self.outputs.items()}}




class FakeKubeApi(FakeNodes, NodeViews, TrainerControllers, JobControllers, ClusterObjects, ObjectStore):
    """FAKE: records calls, keeps objects in dicts, runs pods. Use as core, batch and custom."""

    def __init__(self, scripts: dict[int, PodScript], *, refuse: dict[str, int] | None = None,
                 interrupt_on_list: int | None = None, list_errors: tuple[int, ...] = (),
                 skew: int = 1, delete_ticks: int = 2, auth=None, tokens: tuple[str, ...] = (),
                 host_root: Path | None = None):
        self.skew, self.delete_ticks = skew, delete_ticks
        self.auth, self.tokens = auth, set(tokens)  # auth(): the Authorization header the client would send
        self.terminating: dict[tuple[str, str], int] = {}  # deleted objects still present, ticks left
        self.scripts = scripts
        self.refuse = refuse or {}
        self.refuse_delete: dict[str, int] = {}  # kind -> status a delete of it answers (500: etcd trouble)
        self.interrupt_on_list = interrupt_on_list
        self.interrupt_when = None  # fake -> bool: a Ctrl-C at the first pod listing where it holds
        self.stdin_delay = 0.0  # seconds each exec stdin frame takes (a slow link to the API server)
        self.list_errors = set(list_errors)  # listing numbers (1-based) that answer 503
        self.calls: list[tuple] = []
        self.objects: dict[tuple[str, str], object] = {}
        self.object_ns: dict[tuple[str, str], str] = {}
        self.namespaces: dict[str, dict] = {ns: {} for ns in BUILTIN_NAMESPACES}  # name -> labels
        self.pods: dict[str, _Pod] = {}
        self.responses: list[_LogResponse] = []
        self.lists = 0
        self.lock = threading.Lock()
        self.root = Path(tempfile.mkdtemp(prefix="fake-pods-"))  # the pods' filesystems
        self.host_root = host_root or self.root / "hosts"  # the GPU nodes' disks (hostPath), by pod index
        self.bin = self.root / "bin"
        python_shim(self.bin)
        self._tls = threading.local()
        self.networks: dict[str, Network] = {}  # job name -> its pods' DNS records and open ports
        self.exec_clients: list = []  # every exec with stdin, for tests to check none is left running
        self.down_until = 0.0  # the API answers 503 until then (monotonic)
        self.outage_when = None  # (fake -> bool, seconds): the outage starts when it holds
        self.refused_while_down = 0
        self.exec_handshake_s = 0.0  # how long an exec's websocket handshake takes (tests/k8s_fake_http.py)
        self.rest_upgrades: list = []  # REST calls that came as websocket upgrades (a patched ApiClient)
        self.sa_tokens: dict[str, tuple[str, str]] = {}  # token -> (namespace, service account): RBAC applies
        # an exec without stdin streams its output as the command writes it, as the kubelet does; off:
        # the command runs to its end when the exec opens (the launcher's copies, written before this)
        self.streaming_exec = False
        self.scheduler = None  # a tests/k8s_fake_sched.Scheduler: pods placed only where their requests fit
        self._start_trainer()  # Kubeflow Trainer v2 and JobSet (tests/k8s_fake_trainer.py)
        self._start_controllers()  # the Job controller and the training operator (tests/k8s_fake_jobs.py)

    # -- the control plane ---------------------------------------------------------------------
    def outage(self, seconds: float, when=None) -> None:
        """The API server goes away for `seconds`, now or once `when(fake)` holds at some call."""
        if when is None:
            self._go_down(seconds)
        else:
            self.outage_when = (when, seconds)

    def _go_down(self, seconds: float) -> None:
        self.down_until = time.monotonic() + seconds
        for r in self.responses:  # every open connection drops
            with r.container.log.cond:
                r.container.log.cond.notify_all()
        for ws in list(getattr(self, "websockets", ())):  # exec and port-forward streams too (k8s_fake_http)
            ws.drop()

    def api_down(self) -> bool:
        if self.outage_when is not None and self.outage_when[0](self):
            seconds = self.outage_when[1]
            self.outage_when = None
            self._go_down(seconds)
        return time.monotonic() < self.down_until

    def cut_logs(self, rank: int, after_bytes: int = 0) -> None:
        """Break the open log streams of `rank`'s training container after `after_bytes` more bytes."""
        for r in self.responses:
            if r.pod.index == rank and r.container.name == "pytorch":
                r.cut(after_bytes)

    # -- pods of a Job -------------------------------------------------------------------------
    def _google_identity(self, pod) -> bool:
        sa = self.objects.get(("serviceaccount", pod.service_account or ""))
        notes = (getattr(getattr(sa, "metadata", None), "annotations", None) or {}) if sa is not None else {}
        return bool(notes.get("iam.gke.io/gcp-service-account"))

    def _mounted_config(self, name: str, volumes) -> dict:
        """{path under /gpucluster: content} of the ConfigMap volume, as the kubelet projects it."""
        import base64

        files = {}
        for vol in volumes or []:
            source = _get(vol, "config_map") or _get(vol, "configMap")
            cm = self.objects.get(("configmap", _get(source, "name") or name)) if source is not None else None
            data, binary = (_get(cm, "data") or {}), (_get(cm, "binary_data") or _get(cm, "binaryData") or {})
            items = _get(vol, "config_map", "items") or _get(vol, "configMap", "items") or []
            for item in items:
                key, path = _get(item, "key"), _get(item, "path")
                if key in data:
                    files[path] = data[key].encode()
                elif key in binary:
                    files[path] = base64.b64decode(binary[key])
        return files

    def _dns_names(self, body, index: int) -> list[str]:
        """The pod's DNS names: an Indexed Job's pod has hostname `<job>-<index>`; with `subdomain` set and a
        headless Service of that name selecting it, `<hostname>.<subdomain>[.<ns>.svc[.cluster.local]]`
        resolve to it (Kubernetes docs, "Jobs": Indexed completion mode; "DNS for Services and Pods")."""
        spec, labels = body.spec.template.spec, body.spec.template.metadata.labels or {}
        service = self.objects.get(("service", spec.subdomain or ""))
        if service is None or not all(labels.get(k) == v for k, v in (service.spec.selector or {}).items()):
            return []
        short = f"{body.metadata.name}-{index}.{spec.subdomain}"
        ns = body.metadata.namespace or "default"
        return [short, f"{short}.{ns}.svc", f"{short}.{ns}.svc.cluster.local"]

    def _resolve_app_env(self, container, index: int, namespace: str):
        secret_env, problem = self._secret_env(container, namespace)
        if problem is not None:
            return None, problem
        return {**self._container_env(container, index), **secret_env}, None

    @staticmethod
    def _container_env(container, index: int, indexed: bool = True) -> dict:
        """A container's environment as the kubelet sets it: values, the completion-index annotation
        through the downward API, and JOB_COMPLETION_INDEX (the Job controller sets it in every container
        of an Indexed Job's pod)."""
        env = {"JOB_COMPLETION_INDEX": str(index)} if indexed else {}
        for e in _get(container, "env") or []:
            ref = _get(e, "value_from", "field_ref") or _get(e, "valueFrom", "fieldRef")
            path = (_get(ref, "field_path") or _get(ref, "fieldPath") or "") if ref is not None else ""
            env[_get(e, "name")] = str(index) if INDEX in path else (_get(e, "value") or "")
        return env

    def _new_pod(self, name: str, index: int, labels: dict, pod_spec, config: str, delay: int = 0,
                 extra_env: dict | None = None) -> _Pod:
        pod = self.pods[name] = _Pod(name, index, labels, self.scripts.get(index, PodScript()), delay=delay)
        pod.base, pod.bin, pod.host = self.root, self.bin, self.host_root / f"node-{index}"
        pod.service_account = _get(pod_spec, "service_account_name") or _get(pod_spec, "serviceAccountName")
        pod.config_files = self._mounted_config(config, _get(pod_spec, "volumes"))
        indexed = extra_env is None
        pod.inits = [(_get(c, "name"), list(_get(c, "command") or []) + list(_get(c, "args") or []),
                      self._container_env(c, index, indexed))
                     for c in _get(pod_spec, "init_containers") or _get(pod_spec, "initContainers") or []]
        pod.apps = [(_get(c, "name"), list(_get(c, "command") or []) + list(_get(c, "args") or []),
                     {**self._container_env(c, index, indexed), **(extra_env or {})})
                    for c in _get(pod_spec, "containers") or []]
        pod.restart_policy = _get(pod_spec, "restart_policy") or _get(pod_spec, "restartPolicy") or "Always"
        pod.image = _get((_get(pod_spec, "containers") or [None])[0], "image") or ""
        pod.schedule = lambda: (self.scheduler.place(name, pod_spec, self._holds, labels) if self.scheduler is not None
                                else None)
        return pod

    def _holds(self, name: str) -> bool:
        pod = self.pods.get(name)
        return pod is not None and pod.phase not in ("Succeeded", "Failed")

    def create_namespaced_job(self, namespace, body, **kw):
        self._authenticate()
        validate_job(body)  # 422 as the API server's Job validation (tests/k8s_fake_jobs.py)
        if (body.spec.completion_mode or "NonIndexed") != "Indexed":
            return self._plain_job(namespace, body)  # tests/k8s_fake_rbac.py
        self._create("job", namespace, body)
        state = self.jobs[body.metadata.name] = job_state(body, self.clock())
        labels = body.spec.template.metadata.labels
        n = body.spec.completions
        network = self.networks.setdefault(body.metadata.name, Network(self.root / f"net-{body.metadata.name}.json"))
        for i in range(n):
            network.names.update(self._dns_names(body, i))
        network.write()
        for i in range(n):
            # skew: the head (index 0) is the last to start
            pod = self._new_pod(f"{body.metadata.name}-{i}-fake{i}", i, labels, body.spec.template.spec,
                                body.metadata.name, delay=self.skew * (n - 1 - i))
            pod.network, pod.dns_names = network, self._dns_names(body, i)
            pod.resolve_env = lambda containers=body.spec.template.spec.containers: self.secret_env(containers, namespace)
            state.pods[pod.name] = i
        return body

    def create_namespaced_custom_object(self, group, version, namespace, plural, body, **kw):
        if plural == "trainjobs":
            return self.create_trainjob(namespace, body)
        self._create(f"{plural}.{group}", namespace, body)
        # the training operator's part: one pod per replica, labelled with its type and index; the
        # operator's Service for the master gives `<name>-master-0` a DNS record
        name, rank = body["metadata"]["name"], 0
        replicas = sum((body["spec"]["pytorchReplicaSpecs"].get(k) or {}).get("replicas", 0) for k in ("Master", "Worker"))
        state = self.jobs[name] = pytorchjob_state(body, self.clock(), replicas)
        network = self.networks.setdefault(name, Network(self.root / f"net-{name}.json"))
        network.names.add(f"{name}-master-0")
        network.write()
        for kind in ("Master", "Worker"):
            spec = body["spec"]["pytorchReplicaSpecs"].get(kind)
            for i in range(spec["replicas"] if spec else 0):
                labels = dict(spec["template"]["metadata"]["labels"])
                labels.update({"training.kubeflow.org/replica-type": kind.lower(),
                               "training.kubeflow.org/replica-index": str(i)})
                pod_name = f"{name}-{kind.lower()}-{i}"
                # the operator sets RANK (and MASTER_ADDR/PORT, WORLD_SIZE) in every container
                pod = self._new_pod(pod_name, rank, labels, spec["template"]["spec"], name, extra_env={"RANK": str(rank)})
                pod.network, pod.dns_names = network, [pod_name] if kind == "Worker" else [f"{name}-master-0"]
                state.pods[pod_name] = rank
                rank += 1
        return body

    # -- read ------------------------------------------------------------------------------
    def list_namespaced_pod(self, namespace, label_selector=None, **kw):
        with self.lock:
            self.lists += 1
            self.calls.append(("list", "pod", namespace, label_selector))
            self._authenticate()
            reqs = parse_selector(label_selector)  # 400 for a selector the API server cannot parse
            self._age_deletions()
            if self.interrupt_on_list is not None and self.lists == self.interrupt_on_list:  # one Ctrl-C
                raise KeyboardInterrupt
            if self.interrupt_when is not None and self.interrupt_when(self):  # one Ctrl-C, once it holds
                self.interrupt_when = None
                raise KeyboardInterrupt
            if self.lists in self.list_errors:
                raise FakeApiException(503, "Service Unavailable")
            items = []
            for pod in list(self.pods.values()):
                pod.tick()
                if isinstance(pod, PlainPod) and pod.namespace != namespace:
                    continue
                if selector_match(reqs, pod.labels):
                    items.append(pod.view())
            return NS(items=items)

    def list_namespaced_event(self, namespace, field_selector=None, **kw):
        self.calls.append(("list", "event", namespace, field_selector))
        self._authenticate()
        if field_selector and not _FIELD_SELECTOR.match(field_selector):
            raise FakeApiException(400, f"BadRequest: invalid field selector {field_selector!r}")
        name = (field_selector or "").partition("=")[2]
        pod = self.pods.get(name)
        return NS(items=list(pod.events) if pod else [])

    def read_namespaced_pod_log(self, name, namespace, container=None, follow=False, _preload_content=True,
                                tail_lines=None, timestamps=False, since_seconds=None, **kw):
        """A container's log: an init container's (what its command printed) or an app container's (its
        process's output, as the kubelet keeps it). A container that has not started has no log: 400
        "container ... is waiting to start: PodInitializing" (the kubelet's answer)."""
        self.calls.append(("log", "pod", namespace, name, container, follow))
        self._authenticate()
        if name not in self.pods:
            raise FakeApiException(404, "NotFound")
        pod = self.pods[name]
        inits = [n for n, _, _ in pod.inits]
        if container in inits:
            index = inits.index(container)
            if index > pod.init_index or (index == pod.init_index and pod.init_proc is None
                                          and index not in pod.init_rc):
                raise FakeApiException(400, f'BadRequest: container "{container}" in pod "{name}" is waiting to '
                                            "start: PodInitializing")
            response = _InitLogResponse(pod, index, follow)
            return response if not _preload_content else response.text(tail_lines)
        if container not in [None] + [n for n, _, _ in pod.apps]:
            raise FakeApiException(400, f"BadRequest: container {container} is not valid for pod {name}")
        c = pod.container(container)
        if c is None:
            raise FakeApiException(400, f'BadRequest: container "{container or pod.apps[0][0]}" in pod "{name}" is '
                                        "waiting to start: PodInitializing")
        response = _LogResponse(self, pod, c, follow=follow, timestamps=timestamps, since_seconds=since_seconds,
                                tail_lines=tail_lines)
        if _preload_content:
            return response.text()
        self.responses.append(response)
        return response

    # -- exec ------------------------------------------------------------------------------
    def stream(self, api_method, *args, **kwargs):
        """As kubernetes.stream.stream: `binary` is taken off and the method called over a websocket."""
        self._tls.binary = kwargs.pop("binary", False)  # per thread: copies run in parallel
        try:
            return api_method(*args, **kwargs)
        finally:
            self._tls.binary = False

    def connect_get_namespaced_pod_exec(self, name, namespace, command=None, container=None, stderr=False,
                                        stdin=False, stdout=False, tty=False, _preload_content=True, **kw):
        binary = getattr(self._tls, "binary", False)
        self.calls.append(("exec", "pod", namespace, name, tuple(command or ())))
        try:
            self._authenticate()
        except FakeApiException as exc:
            raise FakeApiException(0, f"Handshake status {exc.status} {exc.reason}") from None
        return self.exec_in(name, command, container, stdin, binary, stdout, stderr, tty, _preload_content)

    def exec_in(self, name, command, container, stdin, binary, stdout=True, stderr=True, tty=False,
                preload=False):
        pod = self.pods.get(name)
        if pod is None or pod.terminating is not None:
            raise FakeApiException(0, f'Handshake status 404 Not Found: pods "{name}" not found')
        if container not in [n for n, _, _ in pod.apps]:
            raise FakeApiException(0, f"Handshake status 400 Bad Request: container {container} is not valid")
        if pod.phase != "Running":
            raise FakeApiException(0, "Handshake status 400 Bad Request: cannot exec into a container in a "
                                      f"completed pod; current phase is {pod.phase}")
        c = pod.container(container)
        if c is None or not c.running:
            raise FakeApiException(0, f"Handshake status 500 Internal Server Error: container {container} is not "
                                      "running")
        assert preload is False and stdout and (stderr or tty)
        argv = [sys.executable if a == "python" else pod.mapped(a) for a in command]
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        if not self._google_identity(pod):  # no Workload Identity: no storage endpoint, no token
            env.pop("STORAGE_EMULATOR_HOST", None)
            env["GCE_METADATA_HOST"] = "127.0.0.1:9"
        if tty:  # a terminal (kubectl exec -it): no stderr stream, its size from the resize channel
            env = {**env, **(c.env or {}), "TERM": env.get("TERM", "xterm")}
            client = _FakeExecTty(argv, env, cwd=c.cwd)
            self.exec_clients.append(client)
            return client
        if stdin:
            pod.host.mkdir(parents=True, exist_ok=True)  # the hostPath volume, DirectoryOrCreate
            client = _FakeExecStdin(argv, env, binary, self.stdin_delay)
            self.exec_clients.append(client)
            return client
        if pod.script.raw_tar is not None and argv[-1] == str(pod.root / "outputs"):
            return _FakeWSClient(pod.script.raw_tar, b"", 0, binary)
        if self.streaming_exec:  # the output comes as the command writes it; its status when it ends
            client = _FakeExecStdin(argv, env, binary, stdin=False)
            self.exec_clients.append(client)
            return client
        cp = subprocess.run(argv, capture_output=True, env=env)
        return _FakeWSClient(cp.stdout, cp.stderr, cp.returncode, binary)

    def lose(self, rank: int) -> None:
        """The pod of `rank` vanishes at once (its node was preempted)."""
        for name, pod in list(self.pods.items()):
            if pod.index == rank:
                pod.kill()
                self.pods.pop(name)

    def preempt(self, rank: int, reason: str = "Terminated") -> None:
        """The pod of `rank`'s node shuts down gracefully (see the module docstring)."""
        for pod in list(self.pods.values()):
            if pod.index == rank:
                pod.shutdown = (reason, "Pod was terminated in response to imminent node shutdown.")
                pod.kill()  # SIGTERM to its containers, SIGKILL after the grace period: Failed once they end

    def delete_pod(self, rank: int) -> None:
        """`kubectl delete pod` on the pod of `rank` (see the module docstring)."""
        for name, pod in list(self.pods.items()):
            if pod.index == rank:
                self._delete_pod_object(name)

    # -- delete ----------------------------------------------------------------------------
    def _terminate_pods(self, name: str) -> None:
        for pod_name in [p for p in self.pods if p.startswith(name + "-")]:
            self._delete_pod_object(pod_name)  # containers stopped now; the object lingers while terminating

    def delete_namespaced_job(self, name, namespace, body=None, **kw):
        self._delete("job", name, namespace, body)
        self.jobs.pop(name, None)  # its controller stops with it; its pods go (cascading)
        self._terminate_pods(name)

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, body=None, **kw):
        if plural == "trainjobs":
            return self.delete_trainjob(namespace, name, body)
        self._delete(f"{plural}.{group}", name, namespace, body)
        self.jobs.pop(name, None)
        self._terminate_pods(name)

    # -- inspection ------------------------------------------------------------------------
    def of(self, verb: str) -> list[tuple]:
        return [c for c in self.calls if c[0] == verb]
