"""Real OpenSSH servers on loopback, one per "host", for the ssh backend's tests.

`SshdHosts.start(tmp_path, n)` generates a user key and one host key per server with
ssh-keygen, starts `sshd -D -e -f <config>` on 127.0.0.1 with a free port each (as the current
user: UsePAM no, StrictModes no, keys under tmp_path), waits until each answers, and writes a
known_hosts file with `[127.0.0.1]:PORT ssh-ed25519 ...` lines. Remote commands find the
test's Python first on PATH (`SetEnv PATH=...` in sshd_config), so `python3` there has torch.
`stop()` kills every server. Tests skip when the OpenSSH binaries are missing.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def missing_reason() -> str | None:
    if not os.path.exists(SSHD):
        return f"{SSHD} not found (install openssh-server: make system-deps)"
    for tool in ("ssh", "ssh-keygen"):
        if not shutil.which(tool):
            return f"{tool} not found (install openssh-client)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpucluster-test", "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL)
    return Path(str(path) + ".pub").read_text().strip()


@dataclass
class SshdHosts:
    root: Path
    user: str
    identity: Path
    known_hosts: Path
    bin_dir: Path  # first on the remote PATH: tests may drop fake tools here (nvidia-smi)
    ports: list[int] = field(default_factory=list)
    host_keys: list[str] = field(default_factory=list)  # "ssh-ed25519 AAAA..." per server
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def hosts(self) -> list[str]:
        return [f"{self.user}@127.0.0.1:{p}" for p in self.ports]

    @classmethod
    def start(cls, root: Path, n: int) -> "SshdHosts":
        root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        identity = root / "id_user"
        user_pub = keygen(identity)
        (root / "authorized_keys").write_text(user_pub + "\n")
        bin_dir = root / "bin"
        bin_dir.mkdir()
        self = cls(root=root, user=getpass.getuser(), identity=identity, known_hosts=root / "known_hosts",
                   bin_dir=bin_dir)
        path = os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"])
        try:
            for i in range(n):
                d = root / f"host{i}"
                d.mkdir()
                key = d / "host_ed25519"
                host_pub = keygen(key)
                port = free_port()
                config = d / "sshd_config"
                config.write_text(
                    f"Port {port}\nListenAddress 127.0.0.1\nHostKey {key}\nPidFile {d / 'sshd.pid'}\n"
                    f"AuthorizedKeysFile {root / 'authorized_keys'}\n"
                    "UsePAM no\nStrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                    "PubkeyAuthentication yes\nPermitRootLogin prohibit-password\n"
                    f"SetEnv PATH={path}\nMaxSessions 64\nMaxStartups 64:30:128\nLogLevel INFO\n"
                )
                log = open(d / "sshd.log", "wb")
                proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL,
                                        stdout=log, stderr=log, start_new_session=True)
                log.close()
                self.procs.append(proc)
                self.ports.append(port)
                self.host_keys.append(" ".join(host_pub.split()[:2]))
            for i, port in enumerate(self.ports):
                self._wait(i, port)
            self.write_known_hosts()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait(self, i: int, port: int) -> None:
        end = time.monotonic() + 15
        while time.monotonic() < end:
            if self.procs[i].poll() is not None:
                raise RuntimeError(f"sshd {i} exited: {(self.root / f'host{i}' / 'sshd.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd {i} did not answer on port {port}")

    def write_known_hosts(self, path: Path | None = None, indexes: list[int] | None = None,
                          keys: list[str] | None = None) -> Path:
        """known_hosts for the servers in `indexes` (all by default), with `keys` instead of the
        real host keys when given (to test refusals)."""
        path = path or self.known_hosts
        keys = keys or self.host_keys
        chosen = range(len(keys)) if indexes is None else indexes
        path.write_text("".join(f"[127.0.0.1]:{self.ports[i]} {keys[i]}\n" for i in chosen))
        return path

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
