"""`gpucluster ssh` on a kept Kubernetes cluster (gcp: GKE), through the Kubernetes API only (the kubernetes client; no
kubectl, no ssh): a shell or a command in node N's pod through the exec API, and `-L` port forwards
through the portforward API.

Which pod: a kept cluster has no pod of ours between jobs (each `exec` or `run --keep` makes an
Indexed Job whose pods are deleted once its outputs are copied; on GKE the GPU pool then scales to zero), so
node N is the pod of node rank N of the job running on the cluster now (`find_target`): its training
container while torchrun runs there (the GPUs, the job's environment and files), else the keeper
container that keeps the pod up for the outputs copy (`pod_keeper.py`). No such pod: refused, saying
how to start one. In a namespace others use too (`Platform.shared`: kubernetes), only the pods labelled with
this cluster's name and this home's owner id are looked at (another home's cluster may have the same name).

- A command (`-- CMD`): stdout and stderr come back as they are; the exit code is the command's,
  read from the exec's status (channel 3). With a terminal on stdin it runs in a terminal (below).
  stdin is not passed otherwise: the v4 channel protocol cannot close it (kubernetes/kubernetes#89899),
  so a command that reads to end-of-input would never end.
- A shell (no command, or a command on a terminal): `tty=True, stdin=True`; this machine's terminal in
  raw mode (keys, Ctrl-C included, go to the pod), its size sent on the resize channel (4) at the
  start and on every SIGWINCH; the terminal is restored however it ends.
- `-L LOCAL:localhost:REMOTE`: a listener on 127.0.0.1:LOCAL; each accepted connection gets its own
  portforward websocket to the pod's REMOTE port (the v4 websocket protocol carries one connection per
  port and websocket), relayed both ways until either side closes. Ctrl-C closes the listeners and
  every relay. Only the pod's own ports are reached (the API forwards to the pod's network namespace).

Every stream is opened on an ApiClient of its own (`KubeApi.exec_core`: kubernetes.stream patches
the client it is given, kubernetes-client/python#928).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO, Sequence

from gpucluster.errors import LaunchError, UsageError

from .manifests import rank_in
from .platform import GENERIC, Platform
from .plan import CONTAINER, KEEPER, TRAINER_NODE

if TYPE_CHECKING:
    from gpucluster.domain import Cluster
    from gpucluster.watch.launch import Forward

    from .api import KubeApi, KubeObject

# the pod's shell: bash where the image has it, else sh (one line; the exec API runs an argv)
SHELL = ["sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash; fi; exec sh"]
POD_HOSTS = ("localhost", "127.0.0.1")
MANAGED = "app.kubernetes.io/managed-by=gpucluster"
STDOUT, STDERR, RESIZE = 1, 2, 4


@dataclass(frozen=True)
class Target:
    pod: str
    container: str
    run: str  # the run label of its job


def _running(pod: KubeObject, name: str) -> bool:
    for cs in getattr(pod.status, "container_statuses", None) or []:
        if cs.name == name and cs.state is not None and cs.state.running is not None:
            return True
    return False


def find_target(api: KubeApi, namespace: str, mode: str, rank: int, cluster: str, *,
                platform: Platform = GENERIC) -> Target:
    """Node `rank`'s pod of the job running on the cluster now, and the container to use."""
    selector = MANAGED
    if platform.shared:  # others' pods share the namespace: only this cluster's, made by this home
        from gpucluster.ownership import installation_id

        from .plan import CLUSTER_LABEL, dns_name

        selector += f",{CLUSTER_LABEL}={dns_name(cluster, 63)},gpucluster-owner={installation_id()}"
    pods = api.core.list_namespaced_pod(namespace, label_selector=selector).items
    live = [p for p in pods if getattr(p.metadata, "deletion_timestamp", None) is None
            and getattr(p.status, "phase", None) == "Running" and rank_in(p, mode) is not None]
    if not live:
        raise UsageError(
            f"cluster {cluster!r}: no job is running on it, and on {platform.name} a node is reached through a job's "
            f"pod ({platform.between_jobs}); start a job with "
            f"`gpucluster exec {cluster} ...`, then `gpucluster ssh {cluster}` while it runs")
    newest = max(live, key=lambda p: str(getattr(p.metadata, "creation_timestamp", None) or ""))
    run = (newest.metadata.labels or {}).get("gpucluster-run", "")
    mine = [p for p in live if (p.metadata.labels or {}).get("gpucluster-run", "") == run and rank_in(p, mode) == rank]
    if not mine:
        ranks = sorted({r for p in live if (r := rank_in(p, mode)) is not None})
        raise UsageError(f"cluster {cluster!r}: node {rank}'s pod of run {run} is not running (running: node(s) "
                         f"{', '.join(map(str, ranks))})")
    pod = mine[0]
    for container in (CONTAINER, KEEPER, TRAINER_NODE):
        if _running(pod, container):
            return Target(pod.metadata.name, container, run)
    raise UsageError(f"cluster {cluster!r}: pod {pod.metadata.name} has no running container to reach")


def check(api: KubeApi, namespace: str, mode: str, cluster: Cluster, rank: int, command: Sequence[str],
          forwards: Sequence[Forward], *, platform: Platform = GENERIC) -> Target:
    """What `connect` refuses (UsageError), before anything is opened; the pod it would reach."""
    for f in forwards:
        if f.host not in POD_HOSTS:
            raise UsageError(f"-L {f} is not allowed on {platform.name}: HOST must be localhost (the portforward API reaches "
                             "the pod's own ports), e.g. -L 6006:localhost:6006")
    if not command and not forwards and not sys.stdin.isatty():
        raise UsageError("a shell needs a terminal on stdin; give a command: gpucluster ssh CLUSTER [NODE] -- COMMAND")
    return find_target(api, namespace, mode, rank, cluster.name, platform=platform)


def connect(api: KubeApi, namespace: str, mode: str, cluster: Cluster, rank: int, command: Sequence[str],
            forwards: Sequence[Forward], *, platform: Platform = GENERIC) -> int:
    """`Launcher.connect` for the Kubernetes launcher: its exit code (the command's or the shell's)."""
    target = check(api, namespace, mode, cluster, rank, command, forwards, platform=platform)
    shell = not command and not forwards
    tunnels: list[Tunnel] = []
    try:
        for f in forwards:  # bound now: a taken port fails here (and closes those bound before it)
            tunnels.append(Tunnel(api, namespace, target.pod, f))
        for t in tunnels:
            t.start()
        if shell or (command and sys.stdin.isatty()):
            return terminal(api, namespace, target, list(command) or SHELL)
        if command:
            return run_command(api, namespace, target, list(command))
        try:
            while True:
                time.sleep(0.5)
        except KeyboardInterrupt:  # Ctrl-C ends a tunnel
            return 0
    finally:
        for t in tunnels:
            t.close()


def _open(api: KubeApi, namespace: str, target: Target, argv: list[str], tty: bool) -> KubeObject:
    core = api.exec_core()  # an ApiClient of its own for this stream
    try:
        return api.stream(core.connect_get_namespaced_pod_exec, target.pod, namespace, command=argv,
                          container=target.container, stdin=tty, stdout=True, stderr=not tty, tty=tty,
                          _preload_content=False, binary=True)
    except Exception as exc:  # ApiException(status=0, "Handshake status ...") and connection errors
        raise LaunchError(f"the exec API refused a connection to pod {target.pod}: {exc}") from None


def _returncode(ws: KubeObject, target: Target) -> int:
    try:
        return int(ws.returncode)
    except (TypeError, KeyError, ValueError, AttributeError):  # no status: the stream was cut
        raise LaunchError(f"the connection to pod {target.pod} ended without the command's exit status") from None


def _drain(ws: KubeObject, out: BinaryIO, err: BinaryIO) -> None:
    for channel, stream in ((STDOUT, out), (STDERR, err)):
        data = ws.read_channel(channel, timeout=0)
        if data:
            stream.write(data)
            stream.flush()


def _lost(target: Target, exc: BaseException) -> LaunchError:
    return LaunchError(f"the connection to pod {target.pod} was lost: {type(exc).__name__}: {exc}")


def run_command(api: KubeApi, namespace: str, target: Target, argv: list[str]) -> int:
    """`argv` in the pod, its stdout/stderr here as they come; its exit code."""
    from websocket import WebSocketException

    ws = _open(api, namespace, target, argv, tty=False)
    out, err = sys.stdout.buffer, sys.stderr.buffer
    try:
        while ws.is_open():
            ws.update(timeout=0.5)
            _drain(ws, out, err)
        _drain(ws, out, err)
        return _returncode(ws, target)
    except KeyboardInterrupt:  # the websocket goes: the API server ends the command
        return 130
    except (OSError, WebSocketException) as exc:  # the API server or the network went away
        raise _lost(target, exc) from None
    finally:
        ws.close()


def terminal(api: KubeApi, namespace: str, target: Target, argv: list[str]) -> int:
    """`argv` in a terminal of the pod, driven by this machine's terminal (raw mode, its size)."""
    import termios
    import tty

    from websocket import WebSocketException

    fd_in, fd_out = sys.stdin.fileno(), sys.stdout.fileno()
    ws = _open(api, namespace, target, argv, tty=True)
    resized = threading.Event()
    resized.set()  # the first size goes at once

    def on_winch(*_: object) -> None:
        resized.set()

    saved = termios.tcgetattr(fd_in)
    previous = signal.signal(signal.SIGWINCH, on_winch)
    tty.setraw(fd_in, termios.TCSADRAIN)  # what was typed ahead is kept and sent
    try:
        while ws.is_open():
            if resized.is_set():
                resized.clear()
                cols, rows = os.get_terminal_size(fd_in)
                ws.write_channel(RESIZE, json.dumps({"Width": cols, "Height": rows}).encode())
            ready, _, _ = select.select([fd_in, ws.sock.sock], [], [], 0.1)
            if fd_in in ready:
                data = os.read(fd_in, 4096)
                if not data:
                    break
                ws.write_stdin(data)
            ws.update(timeout=0)
            data = ws.read_channel(STDOUT, timeout=0)
            if data:
                os.write(fd_out, data)
        data = ws.read_channel(STDOUT, timeout=0)
        if data:
            os.write(fd_out, data)
        return _returncode(ws, target)
    except (WebSocketException, ValueError) as exc:  # the API server or the network went away
        raise _lost(target, exc) from None
    except OSError as exc:
        raise _lost(target, exc) from None
    finally:
        termios.tcsetattr(fd_in, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, previous)
        ws.close()


class Tunnel:
    """`-L LOCAL:localhost:REMOTE`: 127.0.0.1:LOCAL here to the pod's REMOTE port, one portforward
    websocket per accepted connection."""

    def __init__(self, api: KubeApi, namespace: str, pod: str, forward: Forward):
        self.api, self.namespace, self.pod, self.forward = api, namespace, pod, forward
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.listener.bind(("127.0.0.1", forward.local))
        except OSError as exc:
            self.listener.close()
            raise UsageError(f"-L {forward}: 127.0.0.1:{forward.local} cannot be used on this machine "
                             f"({exc.strerror}); choose another LOCAL port") from None
        self.listener.listen(16)
        self.closed = threading.Event()
        self.open: set[socket.socket] = set()  # sockets of the live relays, closed by `close`
        self.lock = threading.Lock()

    def start(self) -> None:
        threading.Thread(target=self._accept, daemon=True, name=f"tunnel {self.forward}").start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _track(self, *socks: socket.socket) -> None:
        with self.lock:
            self.open.update(socks)

    def _relay(self, conn: socket.socket) -> None:
        port = self.forward.remote
        self._track(conn)
        core = self.api.exec_core()  # one ApiClient per stream
        try:
            pf = self.api.open_portforward(core.connect_get_namespaced_pod_portforward, self.pod, self.namespace,
                                           ports=str(port))
        except Exception as exc:  # noqa: BLE001 - the handshake refused, the API unreachable
            print(f"gpucluster: -L {self.forward}: the portforward API refused pod {self.pod}: {exc}",
                  file=sys.stderr, flush=True)
            self._close(conn)
            return
        remote = pf.socket(port)
        self._track(remote)
        try:
            _pump(conn, remote, self.closed)
        finally:
            self._close(conn)
            pf.close()
            with self.lock:
                self.open.discard(remote)
        error = None
        for _ in range(20):  # the proxy thread reads the error channel's text as the websocket ends
            error = pf.error(port)
            if error or not pf.connected:
                break
            time.sleep(0.05)
        if error:
            print(f"gpucluster: -L {self.forward}: {error.strip()}", file=sys.stderr, flush=True)

    def _close(self, sock: socket.socket) -> None:
        with self.lock:
            self.open.discard(sock)
        try:
            sock.close()
        except OSError:
            pass

    def close(self) -> None:
        self.closed.set()
        self.listener.close()
        with self.lock:
            socks = list(self.open)
            self.open.clear()
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass


def _pump(a: socket.socket, b: socket.socket, closed: threading.Event) -> None:
    """Bytes both ways between two sockets until one side ends (or the tunnel is closed)."""
    while not closed.is_set():
        try:
            ready, _, _ = select.select([a, b], [], [], 0.2)
        except (OSError, ValueError):  # a socket was closed under us
            return
        for src in ready:
            dst = b if src is a else a
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                return
            try:
                dst.sendall(data)
            except OSError:
                return
