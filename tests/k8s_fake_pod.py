"""FAKE Kubernetes API, the pod part (the kubelet's side): one pod of a Job, its init containers, its
app container's phases and handshakes, its network records and its log streams. The API server part
and the sources of each behaviour are in tests/k8s_fake.py.

Init containers (Kubernetes docs, "Init Containers",
https://kubernetes.io/docs/concepts/workloads/pods/init-containers/): once the pod is placed (it then
has an address, so its DNS record is published) each init container's command really runs, here, one
by one, each to completion (exit 0) before the next; the app container starts only after the last
one. Meanwhile the pod is `Pending` (kubectl: `Init:N/M`), `status.initContainerStatuses` says which
runs and the app container waits in `PodInitializing`. The image is pulled for the first container
that starts, so an image that cannot be pulled shows `ErrImagePull`, then `ImagePullBackOff`, on the
first init container. A failed init container fails the pod when restartPolicy is Never; otherwise it
is restarted after a back-off (`CrashLoopBackOff`; kubectl: `Init:CrashLoopBackOff`). Its output is
its log (`read_namespaced_pod_log(container=NAME)`). Commands run through tests/k8s_fake_net.py (the
pod network: the job's DNS names, the head's rendezvous port once its torchrun starts).

Log streams are in tests/k8s_fake_logs.py. The app container: a tick model of the entry script (`PodScript`), with --setup (the wrapper's
records, then the go file made through exec) and --data (the staged file made through exec), the
collection handshake (stop / job_end / collected) and torchrun's rendezvous (training output waits
until every pod of the job is past its gates).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace as NS

INDEX = "batch.kubernetes.io/job-completion-index"
NET = str(Path(__file__).with_name("k8s_fake_net.py"))
RDZV_TO_OUTPUT_S = 0.4  # from the rendezvous to the workers' first output
BACKOFF_TICKS = 2  # listings an init container waits before it is restarted (CrashLoopBackOff)
_LIVE: set = set()  # every process a fake pod started, killed at exit whatever the test did


def _kill_all() -> None:
    for proc in list(_LIVE):
        _kill(proc)


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


class Network:
    """The job's pod DNS records and open ports, as tests/k8s_fake_net.py reads them."""

    def __init__(self, path: Path):
        self.path, self.names, self.hosts, self.ports = path, set(), {}, {}
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
            for key in [k for k in self.ports if k.startswith(n + ":")]:
                self.ports.pop(key)
        self.write()


class _Pod:
    def __init__(self, name: str, index: int, labels: dict, script, delay: int = 0):
        self.name, self.index, self.labels, self.script = name, index, labels, script
        self.delay = delay  # start-up skew: extra Pending ticks
        self.age = 0
        self.phase = "Pending"
        self.deleted = threading.Event()
        self.ended = threading.Event()
        self.terminating: int | None = None  # listings left before a deleted pod is really gone
        self.shutdown: tuple[str, str] | None = None  # (reason, message): its node shut down (FakeKubeApi.preempt)
        self.collecting = False  # the entry script's handshake (GPUCLUSTER_CONTROL_DIR in the template)
        self.root: Path | None = None  # the container's filesystem under /gpucluster-run
        self.base: Path | None = None  # where the fake keeps the pods' filesystems
        self.torch_code: int | None = None  # torchrun's exit code once it ended (collecting)
        self.torch_ended = threading.Event()
        self.setup = False  # argv.json holds the setup wrapper
        self.stages = False  # argv.json waits for the staged file (--data)
        self.service_account: str | None = None  # the pod template's serviceAccountName
        self.config_files: dict = {}  # the ConfigMap volume at /gpucluster: path -> bytes
        self.peers: list = [self]  # every pod of its job
        self.staged = threading.Event()
        self.staged_age: int | None = None
        self.setup_ended = threading.Event()
        self.go = threading.Event()  # the go file exists: torchrun starts
        self.go_age: int | None = None
        self.code: int | None = None  # the container's exit code (without the handshake)
        # init containers: [(name, command, env)], run in order by the fake kubelet
        self.inits: list[tuple[str, list[str], dict]] = []
        self.restart_policy = "Never"
        self.image = ""
        self.network: Network | None = None
        self.dns_names: list[str] = []  # the pod's records once it has an address
        self.rdzv_ports: list[int] = []  # the app container's declared ports (the head's rendezvous)
        self.sandbox = False  # placed on a node, has an address
        self.pulls = 0  # image pull attempts (an image that cannot be pulled)
        self.init_index = 0  # the init container running (or next)
        self.init_proc = None
        self.init_rc: dict[int, int] = {}  # init index -> its last exit code
        self.init_restarts: dict[int, int] = {}
        self.init_backoff = 0
        self.init_term: tuple[str, str | None] = ("Error", None)  # how a failed init container terminated
        self.init_failed: int | None = None  # restartPolicy Never: the init container that failed the pod
        self.app_age: int | None = None  # when the app container started
        self.train_age: int | None = None  # when the workers started (training output begins)
        self.joined_at: float | None = None  # when every agent had joined the rendezvous
        self.training = threading.Event()
        self.rdzv: list[socket.socket] = []  # the head's rendezvous listener once its torchrun runs
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

    # -- the kubelet's clock -------------------------------------------------------------------
    def tick(self) -> None:
        self.age += 1
        if self.phase == "Pending":
            self._tick_pending()
        if self.phase != "Running" or self.app_age is None:
            return
        start = self.app_age
        if self.root is None and (self.collecting or self.setup or self.stages):
            self.start_files(self.base)  # the container starts: the emptyDir, the training's files
        if self.stages:
            start = self.tick_staged(start)
            if start is None:
                return
        if self.setup:
            start = self.tick_setup(start)
            if start is None:
                return
        self._open_rendezvous()
        if not all(p.past_gates() for p in self.peers):  # torchrun's rendezvous waits for every agent
            self.stopped()
            return
        if self.train_age is None:  # the workers start (and print) a while after the rendezvous
            self.joined_at = self.joined_at or time.monotonic()
            if time.monotonic() - self.joined_at < RDZV_TO_OUTPUT_S:
                self.stopped()
                return
            self.train_age = self.age
            self.training.set()
        start, s = self.train_age, self.script
        if self.collecting:
            self._tick_collecting(start)
        elif s.exit_code is not None and self.age >= start + s.run_ticks:
            self._finish(s.exit_code)

    def _finish(self, code: int) -> None:
        self.code = code
        self.phase = "Succeeded" if code == 0 else "Failed"
        self.ended.set()
        self._close_rendezvous()

    def _tick_pending(self) -> None:
        s = self.script
        if s.unschedulable or self.age < s.start_after + self.delay:
            return
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
        self.phase, self.app_age = "Running", self.age

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
            self.phase = "Failed"
            self.ended.set()
        else:
            self.init_restarts[self.init_index] = self.init_restarts.get(self.init_index, 0) + 1
            self.init_backoff = BACKOFF_TICKS
        return False

    def _start_init(self) -> None:
        name, command, env = self.inits[self.init_index]
        if self.script.no_python and command[:1] in (["python"], ["python3"]):
            # the runtime cannot start the command (an image without python): StartError, exit code 128
            self.init_term = ("StartError", f'failed to create containerd task: exec: "{command[0]}": executable '
                                            "file not found in $PATH: unknown")
            self.init_proc = subprocess.Popen(["sh", "-c", "exit 128"], start_new_session=True)
            _LIVE.add(self.init_proc)
            return
        config = self.base / self.name / "config"
        argv = []
        for i, arg in enumerate(command):
            if i == 0 and arg in ("python", "python3"):
                argv += [sys.executable, NET, str(self.network.path)]
            else:
                argv.append(arg.replace("/gpucluster/", f"{config}/"))
        env = {**os.environ, **env, "PYTHONDONTWRITEBYTECODE": "1", "GPUCLUSTER_FAKE_FAST_CLOCK": "1"}
        log = self.init_log(name)
        with open(log, "ab") as out:
            self.init_proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                              start_new_session=True, stdin=subprocess.DEVNULL)
        _LIVE.add(self.init_proc)

    def init_log(self, name: str) -> Path:
        return self.base / self.name / f"init-{name}.log"

    def _write_config(self) -> None:
        """The ConfigMap volume at /gpucluster, read-only, for every container of the pod."""
        for rel, content in self.config_files.items():
            path = self.base / self.name / "config" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
        (self.base / self.name).mkdir(parents=True, exist_ok=True)

    def _open_rendezvous(self) -> None:
        """The head's torchrun runs: its c10d store listens on the rendezvous port."""
        if self.index != 0 or self.rdzv or self.network is None or not self.rdzv_ports or self.ended.is_set() \
                or self.torch_ended.is_set():
            return
        for port in self.rdzv_ports:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sock.listen(64)
            self.rdzv.append(sock)
            self.network.ports.update({f"{n}:{port}": sock.getsockname()[1] for n in self.dns_names})
        self.network.write()

    def _close_rendezvous(self) -> None:
        if self.rdzv and self.network is not None:
            for key in [k for k in self.network.ports if k.split(":")[0] in self.dns_names]:
                self.network.ports.pop(key)
            self.network.write()
        for sock in self.rdzv:
            sock.close()
        self.rdzv = []

    def kill(self) -> None:
        """The pod is deleted (or its node lost): every container stops, its records go."""
        self.deleted.set()
        if self.init_proc is not None:
            _kill(self.init_proc)
        self._close_rendezvous()
        if self.network is not None and self.sandbox:
            self.network.withdraw(self.dns_names)

    def _tick_collecting(self, start: int) -> None:
        s, control = self.script, self.root / "control"
        if self.torch_code is None:
            if (control / "stop").exists():
                self.torch_code = 143
            elif s.exit_code is not None and self.age >= start + s.run_ticks:
                self.torch_code = s.exit_code
            if self.torch_code is not None:
                self.torch_ended.set()
                self._close_rendezvous()
        if self.torch_code is not None and (control / "collected").exists():
            self.phase = "Succeeded" if self.torch_code == 0 else "Failed"
            self.ended.set()

    def start_files(self, base: Path) -> None:
        self.root = base / self.name
        (self.root / "control").mkdir(parents=True)
        out = self.root / "outputs"
        out.mkdir()
        for rel, content in self.script.outputs.items():
            path = out / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content if isinstance(content, bytes) else content.encode())

    # -- --data and --setup gates (the wrapper in argv.json) ---------------------------------------
    def end_container(self, code: int, start: int) -> None:
        """The wrapper ended before torchrun (failed setup, or stopped while waiting): the container's
        command ends with `code` (with the handshake, job_end first and the pod waits for collection)."""
        if self.collecting:
            if self.torch_code is None:
                self.torch_code = code
                self.torch_ended.set()
            self._tick_collecting(start)
        elif not self.ended.is_set():
            self.code, self.phase = code, "Failed"
            self.ended.set()

    def tick_staged(self, start: int) -> int | None:
        """Waiting for the staged file (made through exec once the pod's data is in place): None while
        it waits (a `stop` file ends it with 143), else the tick the setup or training starts from."""
        control = self.root / "control"
        if not self.staged.is_set():
            if (control / "staged").exists():
                self.staged_age = self.age
                self.staged.set()
            elif (control / "stop").exists():
                self.end_container(143, start)
                return None
            else:
                return None
        return self.staged_age

    def tick_setup(self, start: int) -> int | None:
        """The setup wrapper: None while it runs or waits for go (or once it ended the container);
        else the tick training starts from."""
        s, control = self.script, self.root / "control"
        if not self.setup_ended.is_set():
            if self.age < start + s.setup_ticks:
                return None
            self.setup_ended.set()
        if s.setup_rc != 0 or (not self.go.is_set() and (control / "stop").exists()):
            self.end_container(s.setup_rc or 143, start)
            return None
        if not self.go.is_set():
            if not (control / "setup-go").exists():
                return None
            self.go_age = self.age
            self.go.set()
        return self.go_age

    def past_gates(self) -> bool:
        return (self.app_age is not None and (not self.stages or self.staged.is_set())
                and (not self.setup or self.go.is_set()))

    def stopped(self) -> None:
        """A `stop` file seen before torchrun ended: the command ends with 143."""
        if self.root is not None and self.torch_code is None and not self.ended.is_set() and \
                (self.root / "control" / "stop").exists():
            self.end_container(143, self.age)

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
            out.append(NS(name=name, state=NS(waiting=waiting, running=running, terminated=terminated),
                          last_state=last, restart_count=self.init_restarts.get(i, 0), ready=terminated is not None
                          and terminated.exit_code == 0))
        return out

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
        if self.phase == "Pending" or (self.phase == "Failed" and self.init_failed is not None):
            if self.inits and self.init_index < len(self.inits):
                waiting = NS(reason="PodInitializing", message=None)
            else:
                waiting = NS(reason=self.script.waiting_reason or "ContainerCreating", message="fake")
            state = NS(waiting=waiting, running=None, terminated=None)
        elif self.phase == "Running":
            state = NS(waiting=None, running=NS(started_at=None), terminated=None)
        else:
            code = self.torch_code if self.collecting else self.code
            state = NS(waiting=None, running=None,
                       terminated=NS(exit_code=code, reason="Completed" if code == 0 else "Error", message=None))
        return NS(
            metadata=NS(name=self.name, labels=dict(self.labels),
                        deletion_timestamp="2026-11-22T00:01:00Z" if self.terminating is not None else None,
                        annotations={} if "training.kubeflow.org/replica-type" in self.labels
                        else {INDEX: str(self.index)}),
            status=NS(phase=self.phase, reason=self.shutdown[0] if self.shutdown else None,
                      message=self.shutdown[1] if self.shutdown else None,
                      init_container_statuses=self._init_statuses(),
                      container_statuses=[NS(name="pytorch", state=state, last_state=None,
                                             restart_count=0)],
                      conditions=[NS(type="PodScheduled", status="False", reason="Unschedulable",
                                     message="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")]
                      if self.script.unschedulable else
                      [NS(type="DisruptionTarget", status="True", reason="TerminationByKubelet",
                          message=self.shutdown[1])] if self.shutdown else []),
        )
