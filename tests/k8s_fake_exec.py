"""FAKE Kubernetes API, part three: the exec streams, one whose output is known when it is opened and
one with stdin (see tests/k8s_fake.py for the rest and the source of each behaviour: stdin is never
closed, kubernetes/kubernetes#89899)."""

from __future__ import annotations

import subprocess
import threading


class _FakeWSClient:
    """Shaped like kubernetes.stream.ws_client.WSClient (_preload_content=False): one frame per update."""

    def __init__(self, stdout: bytes, stderr: bytes, rc: int, binary: bool, chunk: int = 4093):
        self.frames = [(1, stdout[i:i + chunk]) for i in range(0, len(stdout), chunk)]
        self.frames += [(2, stderr)] if stderr else []
        self.rc, self.binary = rc, binary
        self._channels: dict[int, object] = {}
        self._open = True

    def is_open(self):
        return self._open

    def update(self, timeout=0):
        if not self._open:
            return
        if not self.frames:
            self._open = False
            return
        channel, data = self.frames.pop(0)
        if not self.binary:
            data = data.decode("utf-8", "replace")
        self._channels[channel] = self._channels.get(channel, b"" if self.binary else "") + data

    def _read(self, channel, timeout):
        if channel not in self._channels:
            self.update(timeout)
        return self._channels.pop(channel, b"" if self.binary else "")

    def read_stdout(self, timeout=None):
        return self._read(1, timeout)

    def read_stderr(self, timeout=None):
        return self._read(2, timeout)

    @property
    def returncode(self):
        return None if self._open else self.rc

    def close(self, **kw):
        self._open = False



class _FakeExecStdin(_FakeWSClient):
    """Shaped like WSClient for an exec with stdin: the command runs as frames come and go; stdin is
    never closed (see the module docstring); `close()` ends the command, as the API server does when
    the websocket goes."""

    def __init__(self, argv, env, binary: bool, delay: float = 0.0, stdin: bool = True):
        import queue

        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.binary, self.frames, self.sent = binary, queue.Queue(), 0
        self.delay = delay  # seconds per frame sent: a slow link
        self._channels: dict[int, object] = {}
        self._open, self._eof = True, 0
        for channel, pipe in ((1, self.proc.stdout), (2, self.proc.stderr)):
            threading.Thread(target=self._pump, args=(channel, pipe), daemon=True).start()

    def _pump(self, channel, pipe):
        for data in iter(lambda: pipe.read1(4093), b""):
            self.frames.put((channel, data))
        self.frames.put((channel, None))

    def write_stdin(self, data):
        if not self._open:
            raise OSError("socket is already closed.")
        if self.delay:
            import time

            time.sleep(self.delay)
        if self.proc.stdin is None:
            raise OSError("the exec was opened without stdin")
        self.proc.stdin.write(data)
        self.proc.stdin.flush()
        self.sent += len(data)

    def update(self, timeout=0):
        import queue

        if not self._open:
            return
        try:
            channel, data = self.frames.get(timeout=timeout or 0.01)
        except queue.Empty:
            return
        if data is None:
            self._eof += 1
            if self._eof == 2:
                self.proc.wait()
                self._open = False
            return
        if not self.binary:
            data = data.decode("utf-8", "replace")
        self._channels[channel] = self._channels.get(channel, b"" if self.binary else "") + data

    @property
    def returncode(self):
        return None if self._open else self.proc.returncode

    def close(self, **kw):
        self._open = False
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass


class _FakeExecTty(_FakeWSClient):
    """Shaped like WSClient for an exec with `tty=True` (kubectl exec -it): the command runs on a real
    pseudo-terminal as its controlling terminal, as the container runtime gives it one. As the kubelet
    does it (pkg/kubelet/cri/streaming/remotecommand): with a tty there is no stderr stream (it is
    "bypassed": the terminal carries both), stdin frames go to the terminal, and the terminal's size is
    what the client sends on the resize channel (4) as JSON {"Width", "Height"}; until the first
    resize it is 0x0 (the runtime creates the console with no size; `stty size` says "0 0"), so a
    client that never sends its size leaves full-screen programs and line wrapping broken."""

    def __init__(self, argv, env, cwd=None):
        import os
        import pty
        import queue

        master, slave = pty.openpty()
        self.master = master
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd,
                                     start_new_session=True, preexec_fn=_controlling_tty)
        os.close(slave)
        self.binary, self.frames = True, queue.Queue()
        self._channels: dict[int, object] = {}
        self._open = True
        self.sizes: list[tuple[int, int]] = []  # every resize received, (cols, rows)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        import os

        while True:
            try:
                data = os.read(self.master, 4093)
            except OSError:  # EIO: every process holding the terminal ended
                break
            if not data:
                break
            self.frames.put((1, data))
        self.frames.put((1, None))

    def write_stdin(self, data):
        import os

        if not self._open:
            raise OSError("socket is already closed.")
        os.write(self.master, data)

    def resize(self, payload: bytes):
        import fcntl
        import json
        import struct
        import termios

        size = json.loads(payload)
        cols, rows = int(size["Width"]), int(size["Height"])
        self.sizes.append((cols, rows))
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))  # SIGWINCH to it

    def update(self, timeout=0):
        import queue

        if not self._open:
            return
        try:
            channel, data = self.frames.get(timeout=timeout or 0.01)
        except queue.Empty:
            return
        if data is None:
            self.proc.wait()
            self._open = False
            return
        self._channels[channel] = self._channels.get(channel, b"") + data

    @property
    def returncode(self):
        return None if self._open else self.proc.returncode

    def close(self, **kw):
        import os

        self._open = False
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 9)
            except OSError:
                pass
        self.proc.wait()
        try:
            os.close(self.master)
        except OSError:
            pass


def _controlling_tty():
    """In the child: its terminal (fd 0) becomes its controlling terminal, as in a container with tty."""
    import fcntl
    import termios

    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
