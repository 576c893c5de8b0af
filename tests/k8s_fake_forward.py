"""FAKE Kubernetes API server, the port-forward part: `GET .../pods/NAME/portforward?ports=P[,Q]`
upgraded to a websocket, served as the API server and the kubelet serve it for a websocket client
(the python client's `kubernetes.stream.portforward`). The rest of the fake: tests/k8s_fake_http.py.

Each behaviour from its source:

- The channel protocol `v4.channel.k8s.io` (the kubelet's websocket port-forward handler,
  pkg/kubelet/cri/streaming/portforward/websocket.go, accepts "", v4.channel.k8s.io and
  v4.base64.channel.k8s.io; the client offers v5 and v4, so v4 is chosen). `ports` is required
  (400 otherwise); a pod that does not exist is 404 and one not running refuses before any upgrade.
- Per port, in the order asked, two channels: 2i carries the data both ways, 2i+1 errors from the
  server. Right after the upgrade the server writes the port on each of them as an unsigned 16-bit
  little-endian number, one frame per channel (websocket.go: `binary.LittleEndian.PutUint16`, one
  Write per stream; the python client refuses a first frame that is not channel + 2 bytes).
- The server connects to the pod's port once, when the websocket opens (the forwarder's PortForward
  is called for each stream pair at once): one websocket carries ONE connection per port; a second
  connection needs a second websocket. A port nothing listens on: the error channel gets
  "error forwarding port P to pod NAME, uid UID: ... connect: connection refused" and the socket
  closes.
- Data from the pod goes out as it is read (io.Copy), here in frames of at most 4093 bytes, so a
  reply larger than that arrives in several frames.
- When the pod's side of the connection ends, the stream pair ends and the websocket is closed
  (`defer conn.Close()` once every stream pair's forward returned): the client sees its port's
  socket end. When the client closes the websocket, the pod's connection is closed.

The pod's port P is the pod's own loopback: here this machine's 127.0.0.1:P, or the port a container
published for one of the pod's names in the pod network's ports folder (tests/k8s_fake_net.py).
"""

from __future__ import annotations

import socket
import struct
import threading

from k8s_fake import FakeApiException
from k8s_fake_http import WebSocketExec

CHUNK = 4093


def pod_address(pod, port: int) -> tuple[str, int]:
    network = getattr(pod, "network", None)
    if network is not None:
        for name in pod.dns_names:
            f = network.port_dir / f"{name}:{port}"
            if f.exists():
                try:
                    return "127.0.0.1", int(f.read_text())
                except ValueError:
                    pass
    return "127.0.0.1", port


def check(fake, name: str, ports_text: str | None) -> list[int]:
    """The ports asked for, or the API server's refusal (before any upgrade)."""
    if not ports_text:
        raise FakeApiException(400, 'BadRequest: query parameter "ports" is required')
    ports = []
    for p in ports_text.split(","):
        if not p.isdigit() or not 0 < int(p) < 65536:
            raise FakeApiException(400, f'BadRequest: unable to parse "{ports_text}" as a port')
        ports.append(int(p))
    pod = fake.pods.get(name)
    if pod is None or pod.terminating is not None:
        raise FakeApiException(404, f'NotFound: pods "{name}" not found')
    if pod.phase != "Running":
        raise FakeApiException(400, f"BadRequest: pod {name} is not running (phase {pod.phase})")
    return ports


class WebSocketForward(WebSocketExec):
    """One port-forward websocket: per port, a connection to the pod's port relayed on channel 2i."""

    def __init__(self, conn: socket.socket, fake, pod_name: str, ports: list[int]):
        super().__init__(conn, None, fake)
        self.fake, self.pod_name, self.ports = fake, pod_name, ports
        self.targets: dict[int, socket.socket] = {}  # data channel -> the pod's connection

    def reader(self) -> None:
        """Client frames: data for a port's channel, close, ping."""
        try:
            while not self.closed.is_set():
                b0, b1 = self._recv(2)
                n = b1 & 0x7F
                if n == 126:
                    n = struct.unpack("!H", self._recv(2))[0]
                elif n == 127:
                    n = struct.unpack("!Q", self._recv(8))[0]
                mask = self._recv(4) if b1 & 0x80 else b"\0\0\0\0"
                payload = bytes(c ^ mask[i % 4] for i, c in enumerate(self._recv(n)))
                opcode = b0 & 0x0F
                if opcode == 0x8:
                    break
                if opcode == 0x9:
                    self.send(0xA, payload)
                elif opcode in (0x1, 0x2) and payload and payload[0] in self.targets and len(payload) > 1:
                    self.targets[payload[0]].sendall(payload[1:])
        except (EOFError, OSError):
            pass
        self.closed.set()
        for target in self.targets.values():  # the websocket went: the pod's connections are closed
            try:
                target.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _from_pod(self, channel: int, target: socket.socket, done: threading.Event) -> None:
        try:
            while not self.closed.is_set():
                data = target.recv(CHUNK)
                if not data:
                    break
                self.send(0x2, bytes([channel]) + data)
        except OSError:
            pass
        finally:
            target.close()
            done.set()

    def run(self) -> None:
        pod = self.fake.pods.get(self.pod_name)
        ended = []
        try:
            for i, port in enumerate(self.ports):
                for channel in (2 * i, 2 * i + 1):
                    self.send(0x2, bytes([channel]) + struct.pack("<H", port))
            for i, port in enumerate(self.ports):
                try:
                    target = socket.create_connection(pod_address(pod, port), timeout=5)
                    target.settimeout(None)
                except OSError as exc:
                    message = (f"error forwarding port {port} to pod {self.pod_name}, uid fake-{self.pod_name}: "
                               f"failed to connect to localhost:{port} inside namespace: dial tcp "
                               f"127.0.0.1:{port}: connect: {(exc.strerror or str(exc)).lower()}")
                    self.send(0x2, bytes([2 * i + 1]) + message.encode())
                    continue
                self.fake.calls.append(("portforward", "pod", self.pod_name, port))
                self.targets[2 * i] = target
                done = threading.Event()
                ended.append(done)
                threading.Thread(target=self._from_pod, args=(2 * i, target, done), daemon=True).start()
            threading.Thread(target=self.reader, daemon=True).start()
            for done in ended:  # every stream pair's forward returned: the connection is closed
                while not done.wait(0.1) and not self.closed.is_set():
                    pass
            if not self.closed.is_set():
                self.send(0x8, struct.pack("!H", 1000))
        except OSError:
            pass
        finally:
            self.closed.set()
            self.forget()
            for target in self.targets.values():
                try:
                    target.close()
                except OSError:
                    pass
            try:
                self.conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
