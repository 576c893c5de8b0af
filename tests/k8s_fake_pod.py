"""FAKE Kubernetes API, the pod part (the kubelet's side): one pod of a Job, its init containers, its
app containers, its network records and its logs. The API server part and the sources of the API's
behaviours are in tests/k8s_fake.py.

Every container runs its REAL command here, as a process of this machine (wait.py, the entry script
infra/kubernetes/pod_entry.py with the setup wrapper and gates, the keeper infra/kubernetes/pod_keeper.py), from the
ConfigMap the launcher made, with the pod template's environment. Volumes cannot be mounted, so their
paths (/gpucluster/, /gpucluster-run, /gpucluster-cache) are mapped to folders here wherever they occur
in a command, an environment value or argv.json. The image is this machine's Python, run under the fake
pod network (tests/k8s_fake_net.py); `python -m torch.distributed.run` is the fake torchrun
(tests/k8s_fake_torchrun.py: a real rendezvous, then the pod's `PodScript` or the job's program).

- Init containers (Kubernetes docs, "Init Containers",
  https://kubernetes.io/docs/concepts/workloads/pods/init-containers/): once the pod is placed (it
  then has an address, so its DNS record is published) each init container's command runs, one by
  one, each to completion (exit 0) before the next; the app containers start only after the last
  one. Meanwhile the pod is `Pending` (kubectl: `Init:N/M`), `status.initContainerStatuses` says which
  runs and the app containers wait in `PodInitializing`. The image is pulled for the first container
  that starts, so an image that cannot be pulled shows `ErrImagePull`, then `ImagePullBackOff`, on
  the first init container. A failed init container fails the pod when restartPolicy is Never;
  otherwise it is restarted after a back-off (`CrashLoopBackOff`; kubectl: `Init:CrashLoopBackOff`):
  the kubelet's back-off starts at 10 s and doubles (Kubernetes docs, "Pod Lifecycle", container
  restarts), here BACKOFF_TICKS listings. A runtime that cannot start the command (an image without
  `python`) terminates the container at once with reason `StartError`, exit code 128 and containerd's
  message `exec: "python": executable file not found in $PATH` (containerd/runc's error text, as
  `kubectl describe pod` shows it).
- App containers (Kubernetes docs, "Pod Lifecycle"): the pod is `Running` while one of its containers
  runs, `Succeeded` when all ended with 0, `Failed` when all ended and one did not; each container's
  status says `running`, or `terminated` with its exit code and reason (`Completed`, `Error`,
  `OOMKilled`: the kernel's OOM killer ends a container over its memory limit with SIGKILL, code 137;
  Kubernetes docs, "Assign Memory Resources to Containers and Pods").
- Logs (Kubernetes docs, "Logging Architecture"; the CRI log format): the kubelet keeps each container's
  output as lines, each with the RFC3339Nano time it was written (Go's format: trailing zeros of the
  fraction dropped); `kubectl logs --timestamps` prefixes each line with it. Log streams are in
  tests/k8s_fake_logs.py.
- Deletion: every container gets SIGTERM, and SIGKILL after the grace period (the pods' 15 s,
  STOP_GRACE_S here); `lose()` (tests/k8s_fake.py) is a preempted node: the containers are killed and
  the pod object vanishes at once (GKE docs, "Spot VMs": a preempted node's pods are deleted).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace as NS

INDEX = "batch.kubernetes.io/job-completion-index"
HERE = Path(__file__).resolve().parent
NET = str(HERE / "k8s_fake_net.py")
TORCHRUN = str(HERE / "k8s_fake_torchrun.py")
BACKOFF_TICKS = 2  # listings an init container waits before it is restarted (CrashLoopBackOff)
STOP_GRACE_S = 2.0  # SIGTERM, then SIGKILL: the pods' terminationGracePeriodSeconds (15 s), scaled down
_LIVE: set = set()  # every process a fake pod started, killed at exit whatever the test did


_CONTAINERS: set = set()  # the marks of every container started


def kill_marked(*tokens: str) -> None:
    """SIGKILL every process of these containers (they carry their container's mark in their environment)."""
    import psutil

    me = os.getpid()
    for p in psutil.process_iter():
        try:
            if p.pid != me and p.environ().get("FAKE_CONTAINER_ID") in tokens:
                p.kill()
        except (psutil.Error, OSError):
            pass


def _kill_all() -> None:
    for proc in list(_LIVE):
        _kill(proc)
    if _CONTAINERS:
        kill_marked(*_CONTAINERS)


def _kill(proc) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
    _LIVE.discard(proc)


import atexit  # noqa: E402

atexit.register(_kill_all)


def stamp(ns: int) -> str:
    """RFC3339Nano as Go prints it (UTC, trailing zeros of the fraction dropped)."""
    t = datetime.fromtimestamp(ns // 10**9, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    frac = f"{ns % 10**9:09d}".rstrip("0")
    return f"{t}.{frac}Z" if frac else f"{t}Z"


def python_shim(bin_dir: Path) -> None:
    """The image's `python`: this machine's, under the fake pod network; torch.distributed.run is faked."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    text = ("#!/bin/sh\n"
            "if [ \"$1\" = -m ] && [ \"$2\" = torch.distributed.run ]; then shift 2; "
            f"exec '{sys.executable}' '{NET}' \"$GPUCLUSTER_FAKE_NET\" '{TORCHRUN}' \"$@\"; fi\n"
            f"exec '{sys.executable}' '{NET}' \"$GPUCLUSTER_FAKE_NET\" \"$@\"\n")
    for name in ("python", "python3"):
        path = bin_dir / name
        path.write_text(text)
        path.chmod(0o755)


class Network:
    """The job's pod DNS records and open ports, as tests/k8s_fake_net.py reads them."""

    def __init__(self, path: Path):
        self.path, self.names, self.hosts, self.ports = path, set(), {}, {}
        self.port_dir = path.with_suffix(".ports")
        self.port_dir.mkdir(parents=True, exist_ok=True)
        self.placed: list[str] = []  # pod names in the order they got an address
        self.lock = threading.Lock()
        self.write()

    def write(self) -> None:
        with self.lock:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"names": sorted(self.names), "hosts": self.hosts, "ports": self.ports}))
            os.replace(tmp, self.path)

    def publish(self, names) -> None:
        self.hosts.update({n: "127.0.0.1" for n in names})
        self.write()

    def withdraw(self, names) -> None:
        for n in names:
            self.hosts.pop(n, None)
            for f in self.port_dir.glob(f"{n}:*"):
                f.unlink(missing_ok=True)
        self.write()


class LogStore:
    """A container's log as the kubelet keeps it: (time in ns, its RFC3339Nano text, the line)."""

    def __init__(self):
        self.lines: list[tuple[int, str, bytes]] = []
        self.cond = threading.Condition()
        self.ended = False

    def add(self, data: bytes) -> None:
        with self.cond:
            now = max(time.time_ns(), self.lines[-1][0] if self.lines else 0)
            self.lines.append((now, stamp(now), data))
            self.cond.notify_all()

    def end(self) -> None:
        with self.cond:
            self.ended = True
            self.cond.notify_all()

    def text(self) -> str:
        return b"".join(line for _, _, line in self.lines).decode("utf-8", "replace")


class _Container:
    """One app container: its command runs as a process; its output is its log."""

    def __init__(self, name: str, command: list[str], env: dict, cwd: Path):
        self.name, self.command, self.env, self.cwd = name, command, env, cwd
        self.proc: subprocess.Popen | None = None
        self.log = LogStore()
        self.code: int | None = None
        self.reason: str | None = None
        self.pump: threading.Thread | None = None
        self.restarts = 0  # times the kubelet reran it in this pod (restartPolicy OnFailure)

    def start(self) -> None:
        import uuid

        self.cwd.mkdir(parents=True, exist_ok=True)
        self.token = uuid.uuid4().hex  # marks every process of this container (a container is a cgroup)
        self.env = {**self.env, "FAKE_CONTAINER_ID": self.token}
        _CONTAINERS.add(self.token)
        self.proc = subprocess.Popen(self.command, env=self.env, cwd=self.cwd, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        _LIVE.add(self.proc)
        self.pump = threading.Thread(target=self._pump, daemon=True)
        self.pump.start()
        threading.Thread(target=self._reap, daemon=True).start()

    def _reap(self) -> None:
        """When the container's command ends, the runtime kills what it left (the container is gone)."""
        self.proc.wait()
        kill_marked(self.token)

    def _pump(self) -> None:
        for line in iter(self.proc.stdout.readline, b""):
            self.log.add(line)
        self.proc.stdout.close()
        self.proc.wait()
        _LIVE.discard(self.proc)
        rc = self.proc.returncode
        self.code = rc if rc >= 0 else 128 - rc
        if self.reason is None:
            self.reason = "Completed" if self.code == 0 else "Error"
        self.log.end()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.code is None

    def signal(self, sig) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except OSError:
                pass
        if sig == signal.SIGKILL and self.proc is not None:
            kill_marked(self.token)

    def state(self, waiting: str | None) -> NS:
        if self.code is not None:
            return NS(waiting=None, running=None, terminated=NS(
                exit_code=self.code, reason=self.reason, message="container exceeded its memory limit"
                if self.reason == "OOMKilled" else None, started_at=None, finished_at=None, signal=None,
                container_id=None))
        if self.proc is not None:
            return NS(waiting=None, running=NS(started_at=None), terminated=None)
        return NS(waiting=NS(reason=waiting or "ContainerCreating", message=None), running=None, terminated=None)


class _Pod:
    def __init__(self, name: str, index: int, labels: dict, script, delay: int = 0):
        self.name, self.index, self.labels, self.script = name, index, labels, script
        self.delay = delay  # start-up skew: extra Pending ticks
        # metadata.creationTimestamp: set by the API server at the create, RFC 3339 in UTC to the second (Kubernetes
        # API reference, ObjectMeta: "creationTimestamp ... populated by the system. Read-only")
        self.created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.age = 0
        self.deleted = threading.Event()
        self.terminating: int | None = None  # listings left before a deleted pod is really gone
        self.shutdown: tuple[str, str] | None = None  # (reason, message): its node shut down (FakeKubeApi.preempt)
        self.base: Path | None = None  # where the fake keeps the pods' filesystems
        self.host: Path | None = None  # the node's disk (the hostPath cache)
        self.bin: Path | None = None  # the image's python shim
        self.service_account: str | None = None  # the pod template's serviceAccountName
        self.config_files: dict = {}  # the ConfigMap volume at /gpucluster: path -> bytes
        self.inits: list[tuple[str, list[str], dict]] = []  # [(name, command, env)], run in order
        self.apps: list[tuple[str, list[str], dict]] = []  # the app containers' (name, command, env)
        self.containers: list[_Container] = []
        self.restart_policy = "Never"
        self.image = ""
        self.network: Network | None = None
        self.dns_names: list[str] = []  # the pod's records once it has an address
        self.resolve_env = None  # () -> (env, None) or (None, why): Secrets read as the kubelet starts the apps
        self.env: dict | None = None  # the first app container's environment once it started
        self.config_error: str | None = None  # CreateContainerConfigError's message while it cannot start
        self.sandbox = False  # placed on a node, has an address
        self.pulls = 0  # image pull attempts (an image that cannot be pulled)
        self.init_index = 0  # the init container running (or next)
        self.init_proc = None
        self.init_rc: dict[int, int] = {}  # init index -> its last exit code
        self.init_restarts: dict[int, int] = {}
        self.init_backoff = 0
        self.init_term: tuple[str, str | None] = ("Error", None)  # how a failed init container terminated
        self.init_failed: int | None = None  # restartPolicy Never: the init container that failed the pod
        self.app_age: int | None = None  # when the app containers started
        self.schedule = None  # () -> None once bound to a node, else why not (tests/k8s_fake_sched.py)
        self.unplaced: str | None = None  # the scheduler's FailedScheduling message while it cannot place it
        self.events: list[NS] = [NS(type="Normal", reason="Scheduled" if not script.unschedulable else "Pending",
                                    message="fake", last_timestamp="2026-11-22T00:00:00Z")]
        if script.unschedulable:
            self.events.append(NS(type="Warning", reason="FailedScheduling",
                                  message="0/3 nodes are available: 1 node(s) had untolerated taint, "
                                          "2 Insufficient nvidia.com/gpu.",
                                  last_timestamp="2026-11-22T00:00:05Z"))
            self.events.append(NS(type="Normal", reason="NotTriggerScaleUp",
                                  message="pod didn't trigger scale-up: 1 max node group size reached",
                                  last_timestamp="2026-11-22T00:00:09Z"))

    # -- paths ------------------------------------------------------------------------------------
    @property
    def fs(self) -> Path:
        return self.base / self.name

    @property
    def root(self) -> Path:
        """The pod's emptyDir (/gpucluster-run)."""
        return self.fs / "run"

    @property
    def config(self) -> Path:
        return self.fs / "config"

    def mapped(self, text: str) -> str:
        """A command word, environment value or argv.json with the mount paths of this machine."""
        return (text.replace("/gpucluster-run", str(self.root)).replace("/gpucluster-cache", str(self.host))
                .replace("/gpucluster/", f"{self.config}/"))

    @property
    def phase(self) -> str:
        if self.init_failed is not None:
            return "Failed"
        if not self.containers:
            return "Pending"
        if any(c.code is None for c in self.containers):
            return "Running"
        if self.restart_policy == "OnFailure" and not self.deleted.is_set():
            return "Running"  # a container that failed is rerun in place ("Pod Lifecycle": phase stays Running)
        return "Succeeded" if all(c.code == 0 for c in self.containers) else "Failed"

    # -- the kubelet's clock -------------------------------------------------------------------
    def tick(self) -> None:
        self.age += 1
        if self.phase == "Pending" and not self.deleted.is_set():
            self._tick_pending()
        if self.restart_policy == "OnFailure" and not self.deleted.is_set():
            self._restart_failed()

    def _restart_failed(self) -> None:
        """restartPolicy OnFailure: the kubelet reruns an app container that exited non-zero in the same pod
        (its emptyDir kept), and the pod stays Running (Kubernetes docs, "Pod Lifecycle", "Container restart
        policy"; a Job counts those restarts toward its backoffLimit: not modelled here)."""
        for i, c in enumerate(self.containers):
            if c.code not in (None, 0):
                again = _Container(c.name, c.command, c.env, c.cwd)
                again.restarts = c.restarts + 1
                self.containers[i] = again
                again.start()

    def _tick_pending(self) -> None:
        s = self.script
        if s.unschedulable or self.age < s.start_after + self.delay:
            return
        if not self.sandbox and self.schedule is not None:
            why = self.schedule()
            if why is not None:
                if self.unplaced != why:
                    self.events.append(NS(type="Warning", reason="FailedScheduling", message=why,
                                          last_timestamp="2026-11-22T00:00:05Z"))
                self.unplaced = why
                return
            self.unplaced = None
        if not self.sandbox:  # placed: the pod has an address, its DNS record is published
            self.sandbox = True
            self._write_config()
            if self.network is not None:
                self.network.placed.append(self.name)
                self.network.publish(self.dns_names)
        if s.waiting_reason is not None:  # the image cannot be pulled (for the first container)
            self.pulls += 1
            return
        while self.init_index < len(self.inits):
            if not self._tick_init():
                return
        if self.resolve_env is not None:  # the kubelet makes the app containers' environment (Secrets read now)
            extra, self.config_error = self.resolve_env()
            if self.config_error is not None:
                return  # CreateContainerConfigError: retried at every sync, as the kubelet does
            self.apps = [(n, cmd, {**env, **extra}) for n, cmd, env in self.apps]
            self.resolve_env = None
        self.env = dict(self.apps[0][2]) if self.apps else {}
        self._start_apps()

    def _env(self, env: dict) -> dict:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCLUSTER_", "STORAGE_EMULATOR"))}
        script = self.fs / "script.json"
        if not script.exists():
            script.write_text(json.dumps(self.script.plan()))
        return {**base, **{k: self.mapped(v) for k, v in env.items()},
                "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONDONTWRITEBYTECODE": "1",
                "GPUCLUSTER_FAKE_NET": str(self.network.path) if self.network else "",
                "GPUCLUSTER_FAKE_PORTS": str(self.network.port_dir) if self.network else "",
                "GPUCLUSTER_FAKE_DNS": ",".join(self.dns_names), "GPUCLUSTER_FAKE_SCRIPT": str(script),
                "GPUCLUSTER_FAKE_FAST_CLOCK": "1"}

    def _start_apps(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for name, command, env in self.apps:
            argv = [self.mapped(a) for a in command]
            self.containers.append(_Container(name, argv, self._env(env), self.fs / "workspace"))
        for c in self.containers:
            c.start()
        self.app_age = self.age
        if self.script.oom_after_s is not None:
            threading.Thread(target=self._oom, daemon=True).start()

    def _oom(self) -> None:
        if not self.deleted.wait(self.script.oom_after_s):
            app = self.containers[0]
            app.reason = "OOMKilled"
            app.signal(signal.SIGKILL)

    def _tick_init(self) -> bool:
        """One step of the running init container; True when it completed (start the next)."""
        if self.init_proc is None:
            if self.init_backoff > 0:
                self.init_backoff -= 1
                return False
            self._start_init()
            return False
        rc = self.init_proc.poll()
        if rc is None:
            return False
        _LIVE.discard(self.init_proc)
        self.init_proc = None
        self.init_rc[self.init_index] = rc
        if rc == 0:
            self.init_index += 1
            return True
        if self.restart_policy == "Never":  # the pod fails (Init:Error)
            self.init_failed = self.init_index
        else:
            self.init_restarts[self.init_index] = self.init_restarts.get(self.init_index, 0) + 1
            self.init_backoff = BACKOFF_TICKS
        return False

    def _start_init(self) -> None:
        name, command, env = self.inits[self.init_index]
        if self.script.no_python and command[:1] in (["python"], ["python3"]):
            self.init_term = ("StartError", f'failed to create containerd task: exec: "{command[0]}": executable '
                                            "file not found in $PATH: unknown")
            self.init_proc = subprocess.Popen(["sh", "-c", "exit 128"], start_new_session=True)
            _LIVE.add(self.init_proc)
            return
        argv = [self.mapped(a) for a in command]
        log = self.init_log(name)
        with open(log, "ab") as out:
            self.init_proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self._env(env),
                                              start_new_session=True, stdin=subprocess.DEVNULL)
        _LIVE.add(self.init_proc)

    def init_log(self, name: str) -> Path:
        return self.fs / f"init-{name}.log"

    def _write_config(self) -> None:
        """The ConfigMap volume at /gpucluster, read-only, for every container of the pod (argv.json with
        the mount paths of this machine)."""
        for rel, content in self.config_files.items():
            path = self.config / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(self.mapped(content.decode()).encode() if rel == "argv.json" else content)
        self.fs.mkdir(parents=True, exist_ok=True)

    def kill(self) -> None:
        """The pod is deleted (or its node lost): every container gets SIGTERM, then SIGKILL after the
        grace period; its records go."""
        self.deleted.set()
        if self.init_proc is not None:
            _kill(self.init_proc)
        for c in self.containers:
            c.signal(signal.SIGTERM)

        def hard() -> None:
            time.sleep(STOP_GRACE_S)
            for c in self.containers:
                c.signal(signal.SIGKILL)

        threading.Thread(target=hard, daemon=True).start()
        if self.network is not None and self.sandbox:
            self.network.withdraw(self.dns_names)

    def container(self, name: str | None) -> _Container | None:
        return next((c for c in self.containers if c.name == (name or self.apps[0][0])), None)

    def log_text(self, container: str = "pytorch") -> str:
        return c.log.text() if (c := self.container(container)) is not None else ""

    # -- what the API server shows -----------------------------------------------------------------
    def _init_statuses(self) -> list[NS] | None:
        if not self.inits:
            return None
        out = []
        for i, (name, _, _) in enumerate(self.inits):
            running = waiting = terminated = last = None
            if i < self.init_index:
                terminated = NS(exit_code=0, reason="Completed", message=None)
            elif i == self.init_index and self.init_failed == i:
                terminated = NS(exit_code=self.init_rc[i], reason=self.init_term[0], message=self.init_term[1])
            elif i == self.init_index and self.sandbox and self.script.waiting_reason is not None:
                reason = "ErrImagePull" if self.pulls % 2 else self.script.waiting_reason
                waiting = NS(reason=reason, message=f'Back-off pulling image "{self.image}"'
                             if reason == "ImagePullBackOff" else
                             f'rpc error: code = NotFound desc = failed to pull and unpack image "{self.image}": '
                             "not found")
            elif i == self.init_index and self.init_proc is None and self.init_restarts.get(i):
                waiting = NS(reason="CrashLoopBackOff",
                             message=f"back-off 10s restarting failed container={name} pod={self.name}")
                last = NS(terminated=NS(exit_code=self.init_rc[i], reason=self.init_term[0], message=self.init_term[1]))
            elif i == self.init_index and self.init_proc is not None:
                running = NS(started_at=None)
            else:
                waiting = NS(reason="PodInitializing", message=None)
            out.append(self._status(name, NS(waiting=waiting, running=running, terminated=terminated), last,
                                    self.init_restarts.get(i, 0), terminated is not None and terminated.exit_code == 0))
        return out

    def _status(self, name: str, state: NS, last=None, restarts: int = 0, ready: bool = False) -> NS:
        return NS(name=name, image=self.image, image_id="", ready=ready, restart_count=restarts, started=None,
                  state=state, last_state=last, container_id=None)

    def status_text(self) -> str:
        """What `kubectl get pods` prints in STATUS for this pod (Init:N/M while init containers run)."""
        for i, st in enumerate(self._init_statuses() or []):
            if st.state.terminated is not None and st.state.terminated.exit_code == 0:
                continue
            if st.state.terminated is not None:
                return f"Init:{st.state.terminated.reason}"
            if st.state.waiting is not None and st.state.waiting.reason != "PodInitializing":
                return f"Init:{st.state.waiting.reason}"
            return f"Init:{i}/{len(self.inits)}"
        return self.phase

    def view(self) -> NS:
        phase = self.phase
        waiting = None
        if phase in ("Pending", "Failed") and not self.containers:
            waiting = "PodInitializing" if self.inits and self.init_index < len(self.inits) else \
                (self.script.waiting_reason or ("CreateContainerConfigError" if self.config_error else "ContainerCreating"))
        statuses = []
        for name, _, _ in self.apps:
            c = self.container(name)
            state = c.state(waiting) if c is not None else NS(
                waiting=NS(reason=waiting or "ContainerCreating", message=self.config_error or "fake"), running=None,
                terminated=None)
            statuses.append(self._status(name, state, ready=c is not None and c.running,
                                         restarts=c.restarts if c is not None else 0))
        return NS(
            metadata=NS(name=self.name, namespace="default", labels=dict(self.labels), creation_timestamp=self.created,
                        deletion_timestamp="2026-11-22T00:01:00Z" if self.terminating is not None else None,
                        annotations={} if "training.kubeflow.org/replica-type" in self.labels
                        else {INDEX: str(self.index)}),
            # podIP: "IP address allocated to the pod ... Empty if not yet allocated" (Kubernetes API
            # reference, PodStatus): given once the pod is placed (its sandbox exists); every fake pod
            # shares this machine's loopback (tests/k8s_fake_net.py)
            spec=NS(node_name=f"gke-gpu-node-{self.index}" if self.sandbox else None,  # tests/k8s_fake_nodes.py
                    containers=[NS(name=name, image=self.image) for name, _, _ in self.apps]),
            status=NS(phase=phase, pod_ip="127.0.0.1" if self.sandbox else None,
                      reason=self.shutdown[0] if self.shutdown else None,
                      message=self.shutdown[1] if self.shutdown else None,
                      init_container_statuses=self._init_statuses(), container_statuses=statuses,
                      conditions=[NS(type="PodScheduled", status="False", reason="Unschedulable",
                                     message="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")]
                      if self.script.unschedulable else
                      [NS(type="PodScheduled", status="False", reason="Unschedulable", message=self.unplaced)]
                      if self.unplaced else
                      [NS(type="DisruptionTarget", status="True", reason="TerminationByKubelet",
                          message=self.shutdown[1])] if self.shutdown else []),
        )
