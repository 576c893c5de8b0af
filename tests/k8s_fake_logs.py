"""FAKE Kubernetes API, the log streams (`read_namespaced_pod_log(follow=True, _preload_content=False)`):
the app container's log as the entry script's model prints it (setup records, the go file, torchrun's
rendezvous, the job_end record), and an init container's log (what its command printed). The sources
of each behaviour are in tests/k8s_fake.py and tests/k8s_fake_pod.py."""

from __future__ import annotations

import json

from k8s_fake_pod import _Pod


# -- log streams ---------------------------------------------------------------------------------
def _chunks(self, lines):
    data = "".join(line + "\n" for line in lines).encode()
    for i in range(0, len(data), self.chunk):
        yield data[i:i + self.chunk]


class _LogResponse:
    """Like urllib3's HTTPResponse with _preload_content=False: .stream() yields byte chunks of the app
    container's log (the entry script's model)."""

    def __init__(self, pod: _Pod, chunk: int = 7):
        self.pod, self.chunk = pod, chunk
        self.released = False

    def _wait(self, *events, stoppable: bool = False) -> bool:
        """Until one of `events` (or the pod's deletion); True when one of `events` is set. `stoppable`:
        a `stop` file ends the container's command with 143 meanwhile (the entry script's own clock)."""
        while not any(e.is_set() for e in events) and not self.pod.deleted.is_set():
            if stoppable:
                self.pod.stopped()
            self.pod.deleted.wait(0.05)
        return any(e.is_set() for e in events)

    def _wait_peers(self) -> bool:
        """torchrun's c10d rendezvous: no worker starts until every node's agent has joined, so a pod's
        training output waits until every pod of the job is past its staged/go gates (PyTorch docs,
        "torchrun (Elastic Launch)": the rendezvous waits for --nnodes agents). False when the pod was
        stopped or deleted first."""
        pod = self.pod
        while not all(p.past_gates() for p in pod.peers):
            pod.stopped()
            if pod.torch_ended.is_set() or pod.ended.is_set() or pod.deleted.is_set():
                return False
            pod.deleted.wait(0.05)
        # the workers print only after torchrun spawned them and they imported torch: seconds on a real
        # node; RDZV_TO_OUTPUT_S here (the pod's tick model starts training then)
        while not pod.training.is_set():
            pod.stopped()
            if pod.torch_ended.is_set() or pod.ended.is_set() or pod.deleted.is_set():
                return False
            pod.deleted.wait(0.02)
        return True

    def stream(self):
        pod, s = self.pod, self.pod.script
        if pod.stages and not self._wait(pod.staged, pod.torch_ended, pod.ended, stoppable=True):
            return  # nothing runs before staging
        if pod.stages and not pod.staged.is_set():
            yield from self._end()
            return
        if pod.setup:  # the wrapper's records (gpucluster.staging.setup_wrapped), then the go file
            yield from _chunks(self, ['@gpucluster-metric {"kind": "setup_start"}', *s.setup_lines])
            if not self._wait(pod.setup_ended):
                return
            end = {"kind": "setup_end", "rc": s.setup_rc, "seconds": 1}
            if s.setup_rc:
                end = {"kind": "setup_end", "rc": s.setup_rc, "command": 1, "seconds": 1}
                yield from _chunks(self, [f"[gpucluster setup 1/1] failed: exit code {s.setup_rc}"])
            yield from _chunks(self, ["@gpucluster-metric " + json.dumps(end)])
            self._wait(pod.go, pod.torch_ended, pod.ended, stoppable=True)
            if s.setup_rc or not pod.go.is_set():  # failed, stopped while waiting, or deleted
                yield from self._end()
                return
        if not self._wait_peers():
            yield from self._end()
            return
        yield from self._end(s.lines)

    def _end(self, lines=()):
        yield from _chunks(self, lines)
        if self.pod.collecting:  # the entry script: torchrun ends, then its job_end record
            while not (self.pod.torch_ended.is_set() or self.pod.deleted.is_set()):
                self.pod.stopped()
                self.pod.deleted.wait(0.05)
            if self.pod.torch_ended.is_set():
                end = "@gpucluster-metric " + json.dumps({"kind": "job_end", "exit_code": self.pod.torch_code})
                yield from _chunks(self, [end])
        # follow=True: the stream stays open while the container runs
        while not (self.pod.ended.is_set() or self.pod.deleted.is_set()):
            self.pod.deleted.wait(0.05)

    def release_conn(self):
        self.released = True


class _InitLogResponse(_LogResponse):
    """An init container's log: what its command printed; with follow, until it ended."""

    def __init__(self, pod: _Pod, index: int, follow: bool, chunk: int = 7):
        super().__init__(pod, chunk)
        self.index, self.follow = index, follow

    def running(self) -> bool:
        pod = self.pod
        return self.follow and not pod.deleted.is_set() and pod.init_index == self.index and \
            pod.init_failed is None and (pod.init_proc is not None or pod.init_backoff == 0)

    def stream(self):
        path, sent = self.pod.init_log(self.pod.inits[self.index][0]), 0
        while True:
            alive = self.running()
            data = path.read_bytes()[sent:] if path.exists() else b""
            sent += len(data)
            for i in range(0, len(data), self.chunk):
                yield data[i:i + self.chunk]
            if not alive:
                return
            self.pod.deleted.wait(0.05)

    def text(self, tail_lines: int | None = None) -> str:
        path = self.pod.init_log(self.pod.inits[self.index][0])
        lines = (path.read_text(errors="replace") if path.exists() else "").splitlines(keepends=True)
        return "".join(lines[-tail_lines:] if tail_lines else lines)
