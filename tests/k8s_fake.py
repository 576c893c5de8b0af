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
  Never or OnFailure; containers need a name and an image) -> 422 Unprocessable Entity.
- Deletion takes time (Kubernetes docs, "Garbage Collection": with Foreground propagation the owner
  stays, with a deletionTimestamp, until its dependents are gone; pods get a termination grace period):
  a deleted object and the Job's pods stay listed as terminating for `delete_ticks` more listings.
  `settle()` lets that time pass.
- Exec (`stream(core.connect_get_namespaced_pod_exec, POD, NS, command=..., container=..., binary=True,
  _preload_content=False)`, as kubernetes.stream.stream is called) works only into a Running container
  (Kubernetes docs, "Get a Shell to a Running Container": exec needs a running container; `kubectl exec`
  into an ended pod fails with "cannot exec into a container in a completed pod; current phase is
  Succeeded"), a deleted or terminating pod is not found, and a handshake the API server refuses surfaces
  as ApiException(status=0) (kubernetes-client ws_client.websocket_call wraps every error that way).
  The command really runs (this machine's python) over a per-pod folder standing for the container's
  filesystem (/gpucluster-run is mapped to it); its stdout comes back in odd-sized frames, decoded as
  UTF-8 with replacement unless binary=True (ws_client.WSClient.update), and `returncode` is known only
  once the stream is closed (WSClient.returncode).
- With the collection handshake on (the pod template sets GPUCLUSTER_CONTROL_DIR, as the entry script
  reads it): the pod's files (`PodScript.outputs`) appear in its output folder when it starts; when
  torchrun ends (its exit code, or 143 once a `stop` file is made) the log gets the entry script's
  `job_end` record and the pod stays Running until a `collected` file exists (then Succeeded/Failed);
  the log stream stays open while the container runs (`follow=True`). `lose(rank)` makes a pod vanish
  (preempted node). `preempt(rank)` is the kubelet's graceful node shutdown of the pod's node
  (Kubernetes docs, "Node Shutdowns": the pod's containers are stopped within its grace period and
  the pod is marked Failed, reason `Terminated`, message "Pod was terminated in response to imminent
  node shutdown.", with a `DisruptionTarget` condition, reason `TerminationByKubelet` (Kubernetes
  docs, "Pod disruption conditions"); GKE's docs name the reason `Shutdown` for preempted Spot VMs):
  the pod stays listed, Failed, its log ends; `delete_pod(rank)` deletes one pod as `kubectl delete
  pod` does: listed with a deletionTimestamp while it terminates (`delete_ticks`), then gone.
- With --setup, and with --data/--resume (the pod waits for its staged file): see
  tests/k8s_fake_setup.py.
- Exec with stdin (`stdin=True`, as the launcher stages data): the command runs while frames are
  sent to it with `write_stdin`; its stdin is NEVER closed, because the v4 websocket protocol has
  no way to close it (kubernetes/kubernetes#89899; v5.channel.k8s.io added a close signal that
  older API servers do not speak), so a command that waits for end-of-input hangs, as in a real pod.
  Paths under /gpucluster-run (the pod's emptyDir), /gpucluster-cache (the hostPath cache, one
  folder per node index under `host_root`, which outlives pods and, given again, fakes) and
  /gpucluster/ (the ConfigMap volume, its files as the Job's volume items place them) are mapped
  wherever they occur in the command.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from dataclasses import dataclass, field
from types import SimpleNamespace as NS

from k8s_fake_exec import _FakeExecStdin, _FakeWSClient
from k8s_fake_logs import _InitLogResponse, _LogResponse
from k8s_fake_pod import INDEX, Network, _Pod  # noqa: F401 - _Pod, INDEX: for tests


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
    outputs: dict = field(default_factory=dict)  # relative path -> bytes/str, in the pod's output folder
    raw_tar: bytes | None = None  # what packing the output folder returns instead (a tampered image)
    setup_lines: list[str] = field(default_factory=list)  # what the setup commands print (with --setup)
    setup_rc: int = 0  # the setup's exit code
    setup_ticks: int = 1  # ticks the setup takes once the container runs
    no_python: bool = False  # the image has no `python`: the init container cannot start (StartError)


_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_SELECTOR = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_./]*=[A-Za-z0-9]?[-A-Za-z0-9_.]*$")
_CM_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_FIELD_SELECTOR = re.compile(r"^involvedObject\.name=[a-z0-9][-a-z0-9.]*$")


def _argv(objects: dict, name: str, rank: int) -> list:
    cm = objects.get(("configmap", name))
    data = (cm.get("data") if isinstance(cm, dict) else getattr(cm, "data", None)) or {}
    argv = json.loads(data.get("argv.json", "[]"))
    return argv[rank] if rank < len(argv) else []


def wrapped(objects: dict, name: str, rank: int) -> bool:
    """Whether the ConfigMap's argv.json gives `rank` the setup wrapper (the pod runs --setup)."""
    argv = _argv(objects, name, rank)
    return argv[:1] == ["sh"] and "gpucluster-setup" in argv


def stages(objects: dict, name: str, rank: int) -> bool:
    """Whether `rank`'s argv waits for the staged file first (--data/--resume: k8s_stage sends the data)."""
    argv = _argv(objects, name, rank)
    return argv[:1] == ["sh"] and "/control/staged" in argv[2]


class FakeKubeApi:
    """FAKE: records calls, keeps objects in dicts, simulates pods. Use as core, batch and custom."""

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
        self.pods: dict[str, _Pod] = {}
        self.responses: list[_LogResponse] = []
        self.lists = 0
        self.lock = threading.Lock()
        self.root = Path(tempfile.mkdtemp(prefix="fake-pods-"))  # the pods' filesystems
        self.host_root = host_root or self.root / "hosts"  # the GPU nodes' disks (hostPath), by pod index
        self._tls = threading.local()
        self.networks: dict[str, Network] = {}  # job name -> its pods' DNS records and open ports
        self.exec_clients: list = []  # every exec with stdin, for tests to check none is left running

    # -- auth and validation ---------------------------------------------------------------
    def _authenticate(self) -> None:
        if self.auth is not None and self.auth() not in self.tokens:
            raise FakeApiException(401, "Unauthorized")

    def _validate(self, kind: str, body) -> None:
        from kubernetes.client import ApiClient

        obj = body if isinstance(body, dict) else ApiClient().sanitize_for_serialization(body)
        name = (obj.get("metadata") or {}).get("name") or ""
        rule = _DNS1035_LABEL if kind == "service" else _DNS1123_SUBDOMAIN
        limit = 63 if kind == "service" else 253
        problems = []
        if not name or len(name) > limit or not rule.match(name):
            problems.append(f"metadata.name: Invalid value: {name!r}")
        if kind == "configmap":
            data = {**(obj.get("data") or {}), **(obj.get("binaryData") or {})}
            problems += [f"data[{k}]: Invalid key" for k in data if not _CM_KEY.match(k)]
            size = sum(len(str(v)) for v in (obj.get("data") or {}).values())
            size += sum(len(v) * 3 // 4 for v in (obj.get("binaryData") or {}).values())
            if size > 1024 * 1024:
                problems.append("data: Too long: must have at most 1048576 bytes")
        if kind == "job":
            spec = obj.get("spec") or {}
            if spec.get("completionMode") == "Indexed" and not spec.get("completions"):
                problems.append("spec.completions: Required value: when completion mode is Indexed")
            pod = (spec.get("template") or {}).get("spec") or {}
            if pod.get("restartPolicy") not in ("Never", "OnFailure"):
                problems.append(f"spec.template.spec.restartPolicy: Unsupported value: {pod.get('restartPolicy')!r}")
            for c in (pod.get("containers") or []) + (pod.get("initContainers") or []):
                if not c.get("name") or not c.get("image"):
                    problems.append("spec.template.spec.containers: name and image: Required value")
            if not pod.get("containers"):
                problems.append("spec.template.spec.containers: Required value")
        if problems:
            raise FakeApiException(422, "Unprocessable Entity: " + "; ".join(problems))

    def settle(self) -> None:
        """Let deletion time pass: every terminating object and pod is gone."""
        for key in list(self.terminating):
            self.objects.pop(key, None)
        self.terminating.clear()
        for name in [n for n, p in self.pods.items() if p.terminating is not None]:
            self.pods.pop(name)

    def _age_deletions(self) -> None:
        for key in list(self.terminating):
            self.terminating[key] -= 1
            if self.terminating[key] <= 0:
                del self.terminating[key]
                self.objects.pop(key, None)
        for name, pod in list(self.pods.items()):
            if pod.terminating is not None:
                pod.terminating -= 1
                if pod.terminating <= 0:
                    self.pods.pop(name)

    # -- create ----------------------------------------------------------------------------
    def _create(self, kind: str, namespace: str, body) -> object:
        name = body["metadata"]["name"] if isinstance(body, dict) else body.metadata.name
        self.calls.append(("create", kind, namespace, name))
        self._authenticate()
        if kind in self.refuse:
            raise FakeApiException(self.refuse[kind], "Forbidden" if self.refuse[kind] == 403 else "refused")
        if kind in ("configmap", "service", "job"):
            self._validate(kind, body)
        if (kind, name) in self.objects:
            raise FakeApiException(409, "AlreadyExists")
        self.objects[(kind, name)] = body
        return body

    def create_namespaced_config_map(self, namespace, body, **kw):
        return self._create("configmap", namespace, body)

    def create_namespaced_service(self, namespace, body, **kw):
        return self._create("service", namespace, body)

    def create_namespaced_service_account(self, namespace, body, **kw):
        return self._create("serviceaccount", namespace, body)

    def _google_identity(self, pod) -> bool:
        """GKE Workload Identity: a pod has Google credentials only when it runs as a Kubernetes
        service account annotated with the Google service account it acts as (GKE docs, "Authenticate
        to Google Cloud APIs from GKE workloads"); others get no usable token."""
        sa = self.objects.get(("serviceaccount", pod.service_account or ""))
        notes = (getattr(getattr(sa, "metadata", None), "annotations", None) or {}) if sa is not None else {}
        return bool(notes.get("iam.gke.io/gcp-service-account"))

    def _mounted_config(self, body) -> dict:
        """{path under /gpucluster: content} of the ConfigMap volume, as the kubelet projects it."""
        import base64

        cm = self.objects.get(("configmap", body.metadata.name))
        files = {}
        for vol in body.spec.template.spec.volumes or []:
            if cm is None or vol.config_map is None:
                continue
            for item in vol.config_map.items or []:
                if item.key in (cm.data or {}):
                    files[item.path] = cm.data[item.key].encode()
                elif item.key in (cm.binary_data or {}):
                    files[item.path] = base64.b64decode(cm.binary_data[item.key])
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

    @staticmethod
    def _container_env(container, index: int) -> dict:
        """A container's environment as the kubelet sets it: values, the completion-index annotation
        through the downward API, and JOB_COMPLETION_INDEX (the Job controller sets it in every container)."""
        env = {"JOB_COMPLETION_INDEX": str(index)}
        for e in container.env or []:
            ref = getattr(getattr(e, "value_from", None), "field_ref", None)
            env[e.name] = str(index) if ref is not None and INDEX in ref.field_path else (e.value or "")
        return env

    def create_namespaced_job(self, namespace, body, **kw):
        self._create("job", namespace, body)
        labels = body.spec.template.metadata.labels
        pod_spec = body.spec.template.spec
        app = pod_spec.containers[0]
        collecting = any(e.name == "GPUCLUSTER_CONTROL_DIR" for e in app.env or [])
        n = body.spec.completions
        network = self.networks.setdefault(body.metadata.name, Network(self.root / f"net-{body.metadata.name}.json"))
        for i in range(n):
            network.names.update(self._dns_names(body, i))
        network.write()
        for i in range(n):
            name = f"{body.metadata.name}-{i}-fake{i}"
            # skew: the head (index 0) is the last to start
            pod = self.pods[name] = _Pod(name, i, labels, self.scripts.get(i, PodScript()), delay=self.skew * (n - 1 - i))
            pod.collecting, pod.base = collecting, self.root
            pod.setup = wrapped(self.objects, body.metadata.name, i)
            pod.stages = stages(self.objects, body.metadata.name, i)
            pod.service_account = pod_spec.service_account_name
            pod.config_files = self._mounted_config(body)
            pod.inits = [(c.name, list(c.command or []) + list(c.args or []), self._container_env(c, i))
                         for c in pod_spec.init_containers or []]
            pod.restart_policy, pod.image = pod_spec.restart_policy or "Always", app.image
            pod.network, pod.dns_names = network, self._dns_names(body, i)
            pod.rdzv_ports = [p.container_port for p in app.ports or []]
        peers = [p for p in self.pods.values() if p.name.startswith(body.metadata.name + "-")]
        for p in peers:
            p.peers = peers  # the job's pods: training waits for all of them (the rendezvous)
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
                env = spec["template"]["spec"]["containers"][0].get("env") or []
                self.pods[pod].collecting = any(e.get("name") == "GPUCLUSTER_CONTROL_DIR" for e in env)
                self.pods[pod].base = self.root
                self.pods[pod].setup = wrapped(self.objects, name, rank)
                rank += 1
        return body

    # -- read ------------------------------------------------------------------------------
    def list_namespaced_pod(self, namespace, label_selector=None, **kw):
        with self.lock:
            self.lists += 1
            self.calls.append(("list", "pod", namespace, label_selector))
            self._authenticate()
            if label_selector and not _SELECTOR.match(label_selector):
                raise FakeApiException(400, f"BadRequest: unable to parse requirement: {label_selector!r}")
            self._age_deletions()
            if self.interrupt_on_list is not None and self.lists == self.interrupt_on_list:  # one Ctrl-C
                raise KeyboardInterrupt
            if self.interrupt_when is not None and self.interrupt_when(self):  # one Ctrl-C, once it holds
                self.interrupt_when = None
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

    def list_namespaced_event(self, namespace, field_selector=None, **kw):
        self.calls.append(("list", "event", namespace, field_selector))
        self._authenticate()
        if field_selector and not _FIELD_SELECTOR.match(field_selector):
            raise FakeApiException(400, f"BadRequest: invalid field selector {field_selector!r}")
        name = (field_selector or "").partition("=")[2]
        pod = self.pods.get(name)
        return NS(items=list(pod.events) if pod else [])

    def read_namespaced_pod_log(self, name, namespace, container=None, follow=False, _preload_content=True,
                                tail_lines=None, **kw):
        """The app container's log, or an init container's (what its command printed). A container that
        has not started has no log: 400 "container ... is waiting to start: PodInitializing"."""
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
        if container not in (None, "pytorch"):
            raise FakeApiException(400, f"BadRequest: container {container} is not valid for pod {name}")
        if pod.app_age is None and pod.phase in ("Pending", "Failed"):
            raise FakeApiException(400, f'BadRequest: container "pytorch" in pod "{name}" is waiting to start: '
                                        "PodInitializing")
        response = _LogResponse(pod)
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
        self._authenticate()
        pod = self.pods.get(name)
        if pod is None or pod.terminating is not None:
            raise FakeApiException(0, f'Handshake status 404 Not Found: pods "{name}" not found')
        if container != "pytorch":
            raise FakeApiException(0, f"Handshake status 400 Bad Request: container {container} is not valid")
        if pod.phase != "Running":
            raise FakeApiException(0, "Handshake status 400 Bad Request: cannot exec into a container in a "
                                      f"completed pod; current phase is {pod.phase}")
        assert _preload_content is False and stdout and stderr and not tty
        host = self.host_root / f"node-{pod.index}"
        argv = [sys.executable if a == "python" else
                a.replace("/gpucluster-run", str(pod.root)).replace("/gpucluster-cache", str(host))
                .replace("/gpucluster/", f"{pod.root}/config/")  # the ConfigMap volume
                for a in command]
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        if not self._google_identity(pod):  # no Workload Identity: no storage endpoint, no token
            env.pop("STORAGE_EMULATOR_HOST", None)
            env["GCE_METADATA_HOST"] = "127.0.0.1:9"
        if stdin:
            host.mkdir(parents=True, exist_ok=True)  # hostPath DirectoryOrCreate
            client = _FakeExecStdin(argv, env, binary, self.stdin_delay)
            self.exec_clients.append(client)
            return client
        if pod.script.raw_tar is not None and argv[-1] == str(pod.root / "outputs"):
            return _FakeWSClient(pod.script.raw_tar, b"", 0, binary)
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
                pod.kill()
                pod.code = pod.torch_code = 143  # SIGTERM, within the grace period
                pod.phase = "Failed"
                pod.shutdown = (reason, "Pod was terminated in response to imminent node shutdown.")
                pod.ended.set()

    def delete_pod(self, rank: int) -> None:
        """`kubectl delete pod` on the pod of `rank` (see the module docstring)."""
        for name, pod in list(self.pods.items()):
            if pod.index == rank:
                pod.kill()
                if self.delete_ticks:
                    pod.terminating = self.delete_ticks
                else:
                    self.pods.pop(name)

    # -- delete ----------------------------------------------------------------------------
    def _delete(self, kind: str, name: str, namespace: str, body=None):
        policy = getattr(body, "propagation_policy", None)
        self.calls.append(("delete", kind, namespace, name, policy))
        self._authenticate()
        if kind in self.refuse_delete:
            raise FakeApiException(self.refuse_delete[kind], "Internal Server Error")
        if (kind, name) not in self.objects or (kind, name) in self.terminating:
            raise FakeApiException(404, "NotFound")
        if self.delete_ticks:
            self.terminating[(kind, name)] = self.delete_ticks  # gone only after a while
        else:
            del self.objects[(kind, name)]

    def _terminate_pods(self, name: str) -> None:
        for pod_name in [p for p in self.pods if p.startswith(name + "-")]:
            pod = self.pods[pod_name]
            pod.kill()  # the containers are killed now; the pod object lingers while terminating
            if self.delete_ticks:
                pod.terminating = self.delete_ticks
            else:
                self.pods.pop(pod_name)

    def delete_namespaced_job(self, name, namespace, body=None, **kw):
        self._delete("job", name, namespace, body)
        self._terminate_pods(name)

    def delete_namespaced_service(self, name, namespace, **kw):
        self._delete("service", name, namespace)

    def delete_namespaced_config_map(self, name, namespace, **kw):
        self._delete("configmap", name, namespace)

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, body=None, **kw):
        self._delete(f"{plural}.{group}", name, namespace, body)
        self._terminate_pods(name)

    # -- inspection ------------------------------------------------------------------------
    def of(self, verb: str) -> list[tuple]:
        return [c for c in self.calls if c[0] == verb]
