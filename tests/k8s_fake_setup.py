"""FAKE Kubernetes API, part two: a pod's log stream, and what a pod does with --setup (see
tests/k8s_fake.py for the rest and the sources of each behaviour).

With --setup, argv.json in the ConfigMap holds the setup wrapper (as `gpucluster.staging.setup_wrapped`
makes it) and the pod behaves as the real entry script running it would: it prints the wrapper's
`setup_start` record and `PodScript.setup_lines`, then, `setup_ticks` later, its `setup_end` record
with `setup_rc`; a failed setup ends the container's command with that code (a job_end record first
when collecting); a good one waits for the go file (control/setup-go, made through exec) before the
training lines start, and a `stop` file while it waits ends it with 143 (the entry script SIGTERMs
the wrapper's process group).
"""

from __future__ import annotations

import json


def wrapped(objects: dict, name: str, rank: int) -> bool:
    """Whether the ConfigMap's argv.json gives `rank` the setup wrapper (the pod runs --setup)."""
    cm = objects.get(("configmap", name))
    data = (cm.get("data") if isinstance(cm, dict) else getattr(cm, "data", None)) or {}
    argv = json.loads(data.get("argv.json", "[]"))
    return rank < len(argv) and argv[rank][:1] == ["sh"] and "gpucluster-setup" in argv[rank]


def stages(objects: dict, name: str, rank: int) -> bool:
    """Whether `rank`'s argv waits for the staged file first (--data/--resume: k8s_stage sends the data)."""
    cm = objects.get(("configmap", name))
    data = (cm.get("data") if isinstance(cm, dict) else getattr(cm, "data", None)) or {}
    argv = json.loads(data.get("argv.json", "[]"))
    return rank < len(argv) and argv[rank][:1] == ["sh"] and "/control/staged" in argv[rank][2]


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
    """Waiting for the staged file (made through exec once the pod's data is in place): None while it
    waits (a `stop` file ends it with 143), else the tick the setup or training starts from."""
    control = self.root / "control"
    if not self.staged.is_set():
        if (control / "staged").exists():
            self.staged_age = self.age
            self.staged.set()
        elif (control / "stop").exists():
            end_container(self, 143, start)
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
        end_container(self, s.setup_rc or 143, start)
        return None
    if not self.go.is_set():
        if not (control / "setup-go").exists():
            return None
        self.go_age = self.age
        self.go.set()
    return self.go_age

def _wait(self, *events, stoppable: bool = False) -> bool:
    """Until one of `events` (or the pod's deletion); True when one of `events` is set. `stoppable`:
    a `stop` file ends the container's command with 143 meanwhile (the entry script's own clock)."""
    while not any(e.is_set() for e in events) and not self.pod.deleted.is_set():
        if stoppable:
            _stopped(self.pod)
        self.pod.deleted.wait(0.05)
    return any(e.is_set() for e in events)


def _stopped(pod) -> None:
    """A `stop` file seen before torchrun ended: the command ends with 143."""
    if pod.root is not None and pod.torch_code is None and not pod.ended.is_set() and \
            (pod.root / "control" / "stop").exists():
        end_container(pod, 143, pod.age)

def _chunks(self, lines):
    data = "".join(line + "\n" for line in lines).encode()
    for i in range(0, len(data), self.chunk):
        yield data[i:i + self.chunk]


def setup_stream(self):
    pod, s = self.pod, self.pod.script
    if pod.stages and not _wait(self, pod.staged, pod.torch_ended, pod.ended, stoppable=True):
        return  # nothing runs before staging
    if pod.stages and not pod.staged.is_set():
        yield from self._end()
        return
    if pod.setup:  # the wrapper's records (gpucluster.staging.setup_wrapped), then the go file
        yield from _chunks(self, ['@gpucluster-metric {"kind": "setup_start"}', *s.setup_lines])
        if not _wait(self, pod.setup_ended):
            return
        end = {"kind": "setup_end", "rc": s.setup_rc, "seconds": 1}
        if s.setup_rc:
            end = {"kind": "setup_end", "rc": s.setup_rc, "command": 1, "seconds": 1}
            yield from _chunks(self, [f"[gpucluster setup 1/1] failed: exit code {s.setup_rc}"])
        yield from _chunks(self, ["@gpucluster-metric " + json.dumps(end)])
        _wait(self, pod.go, pod.torch_ended, pod.ended, stoppable=True)
        if s.setup_rc or not pod.go.is_set():  # failed, stopped while waiting, or deleted
            yield from self._end()
            return
    if (pod.stages or pod.setup) and not _wait_peers(self):
        yield from self._end()
        return
    yield from self._end(s.lines)


def _past_gates(pod) -> bool:
    return (not pod.stages or pod.staged.is_set()) and (not pod.setup or pod.go.is_set())


def _wait_peers(self) -> bool:
    """torchrun's c10d rendezvous: no worker starts until every node's agent has joined, so a pod's
    training output waits until every pod of the job is past its staged/go gates (PyTorch docs,
    "torchrun (Elastic Launch)": the rendezvous waits for --nnodes agents). False when the pod was
    stopped or deleted first."""
    pod = self.pod
    while not all(_past_gates(p) for p in pod.peers):
        _stopped(pod)
        if pod.torch_ended.is_set() or pod.ended.is_set() or pod.deleted.is_set():
            return False
        pod.deleted.wait(0.05)
    return True


class _LogResponse:
    """Like urllib3's HTTPResponse with _preload_content=False: .stream() yields byte chunks."""

    def __init__(self, pod: _Pod, chunk: int = 7):
        self.pod, self.chunk = pod, chunk
        self.released = False

    def stream(self):
        yield from setup_stream(self)

    def _end(self, lines=()):
        yield from _chunks(self, lines)
        if self.pod.collecting:  # the entry script: torchrun ends, then its job_end record
            while not (self.pod.torch_ended.is_set() or self.pod.deleted.is_set()):
                _stopped(self.pod)
                self.pod.deleted.wait(0.05)
            if self.pod.torch_ended.is_set():
                end = "@gpucluster-metric " + json.dumps({"kind": "job_end", "exit_code": self.pod.torch_code})
                data = (end + "\n").encode()
                for i in range(0, len(data), self.chunk):
                    yield data[i:i + self.chunk]
        # follow=True: the stream stays open while the container runs
        while not (self.pod.ended.is_set() or self.pod.deleted.is_set()):
            self.pod.deleted.wait(0.05)

    def release_conn(self):
        self.released = True
