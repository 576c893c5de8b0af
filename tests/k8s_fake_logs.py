"""FAKE Kubernetes API, the log streams (`read_namespaced_pod_log`): an app container's log as the
kubelet keeps it (tests/k8s_fake_pod.py, LogStore), and an init container's (what its command
printed). Each behaviour from its source:

- `follow`: the stream stays open while the container runs and ends once it has ended and every line
  was sent (Kubernetes API, PodLogOptions.follow; `kubectl logs -f`). Chunks are odd-sized: a line
  may be split across them (an HTTP chunked body has no line boundaries).
- `timestamps`: each line starts with the RFC3339Nano time the kubelet stored it at, then a space
  (PodLogOptions.timestamps).
- `sinceSeconds`: only the lines stored at or after now minus that many seconds; a line exactly at
  the boundary is sent again (the kubelet keeps a line unless its time is before `since`:
  kubernetes pkg/kubelet/kuberuntime/logs, `ReadLogs`). `tailLines`: the last N lines.
- A stream is cut when the API server goes away (a control-plane upgrade or repair drops every open
  connection, GKE docs "Standard cluster upgrades"), or when a test cuts it: the body ends in the
  middle, urllib3 raises ProtocolError("Connection broken: IncompleteRead"), as a chunked body cut
  mid-chunk does.
"""

from __future__ import annotations

import time

from k8s_fake_pod import _Pod


class _LogResponse:
    """Like urllib3's HTTPResponse with _preload_content=False: .stream() yields byte chunks."""

    def __init__(self, fake, pod: _Pod, container, follow: bool = True, timestamps: bool = False,
                 since_seconds: int | None = None, tail_lines: int | None = None, chunk: int = 7):
        self.fake, self.pod, self.container = fake, pod, container
        self.follow, self.timestamps, self.chunk = follow, timestamps, chunk
        self.released = False
        self.cut_after: int | None = None  # bytes after which the connection breaks (a test's cut)
        self.sent = 0
        store = container.log
        with store.cond:
            lines = list(store.lines)
        self.start = 0
        if since_seconds is not None:
            since = time.time_ns() - int(since_seconds) * 10**9
            self.start = next((i for i, (ns, _, _) in enumerate(lines) if ns >= since), len(lines))
        if tail_lines is not None:
            self.start = max(self.start, len(lines) - int(tail_lines))

    def _broken(self) -> Exception:
        from urllib3.exceptions import ProtocolError

        return ProtocolError("Connection broken: IncompleteRead(0 bytes read, 2 more expected)", None)

    def lines(self):
        """(time text, line) as the stream sends them, waiting for more while it follows."""
        store, i = self.container.log, self.start
        while True:
            with store.cond:
                while (i >= len(store.lines) and self.follow and not store.ended and not self.pod.deleted.is_set()
                       and not self.fake.api_down() and not self._cut()):
                    store.cond.wait(0.05)
                batch = store.lines[i:]
                ended = store.ended or self.pod.deleted.is_set()
            i += len(batch)
            for _, text, line in batch:
                yield text, line
            if self.fake.api_down():
                raise self._broken()
            if not self.follow or (ended and i >= len(store.lines)):
                return
            if self._cut():
                raise self._broken()

    def _cut(self) -> bool:
        return self.cut_after is not None and self.sent >= self.cut_after

    def stream(self):
        for text, line in self.lines():
            data = (text.encode() + b" " + line) if self.timestamps else line
            for j in range(0, len(data), self.chunk):
                piece = data[j:j + self.chunk]
                if self.cut_after is not None and self.sent + len(piece) > self.cut_after:
                    piece = piece[:max(0, self.cut_after - self.sent)]
                    if piece:
                        self.sent += len(piece)
                        yield piece
                    raise self._broken()
                self.sent += len(piece)
                yield piece

    def text(self) -> str:
        return "".join(line.decode("utf-8", "replace") for _, line in self.lines())

    def cut(self, after_bytes: int = 0) -> None:
        """Break the connection once `after_bytes` more bytes were sent (mid-line, usually)."""
        self.cut_after = self.sent + after_bytes
        with self.container.log.cond:
            self.container.log.cond.notify_all()

    def release_conn(self):
        self.released = True

    def close(self):
        self.released = True


class _InitLogResponse:
    """An init container's log: what its command printed; with follow, until it ended."""

    def __init__(self, pod: _Pod, index: int, follow: bool, chunk: int = 7):
        self.pod, self.index, self.follow, self.chunk = pod, index, follow, chunk
        self.released = False

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

    def release_conn(self):
        self.released = True
