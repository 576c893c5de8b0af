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
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpucluster.events import NullEvents

SSHD = "/usr/sbin/sshd"


def missing_reason() -> str | None:
    if not os.path.exists(SSHD):
        return f"{SSHD} not found (install openssh-server: make system-deps)"
    for tool in ("ssh", "ssh-keygen"):
        if not shutil.which(tool):
            return f"{tool} not found (install openssh-client)"
    return None


def skip_unless_usable() -> None:
    """Called at the top of a test module: skip it (with the reason) without torch or OpenSSH."""
    pytest.importorskip("torch")
    reason = missing_reason()
    if reason:
        pytest.skip(reason, allow_module_level=True)


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
    addresses: list[str] = field(default_factory=list)  # one loopback address per server
    host_keys: list[str] = field(default_factory=list)  # "ssh-ed25519 AAAA..." per server
    procs: list[subprocess.Popen] = field(default_factory=list)
    wrap: list[list[str]] = field(default_factory=list)  # per server: a command prefix (e.g. nsenter into a netns)

    @property
    def hosts(self) -> list[str]:
        return [f"{self.user}@{a}:{p}" for a, p in zip(self.addresses, self.ports)]

    @classmethod
    def start(cls, root: Path, n: int, *, addresses: list[str] | None = None, port: int | None = None,
              path: list[str] | None = None, extra_config: list[str] | None = None,
              env: list[dict[str, str]] | None = None,
              defer: bool = False, wrap: list[list[str]] | None = None) -> "SshdHosts":
        """n servers on 127.0.0.1 with free ports, or on the given loopback `addresses` all on `port`
        (port 22 makes them look like cloud nodes; binding it needs root). `path`: the remote PATH
        (default: bin_dir, this Python's folder, the system folders); `extra_config[i]`: more
        sshd_config lines for server i; `defer`: write everything but start no server (call
        `launch(i)` later, like a node that boots after its instance is "running"); `env[i]`: more
        variables sshd sets for server i's sessions; `wrap[i]`: a command prefix server i is started
        under (e.g. `nsenter -t PID -n`: a host in a network namespace of its own)."""
        root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        identity = root / "id_user"
        user_pub = keygen(identity)
        (root / "authorized_keys").write_text(user_pub + "\n")
        bin_dir = root / "bin"
        bin_dir.mkdir()
        self = cls(root=root, user=getpass.getuser(), identity=identity, known_hosts=root / "known_hosts",
                   bin_dir=bin_dir, wrap=list(wrap or []))
        path = os.pathsep.join(path or [str(bin_dir), os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"])
        try:
            for i in range(n):
                d = root / f"host{i}"
                d.mkdir()
                key = d / "host_ed25519"
                host_pub = keygen(key)
                address = addresses[i] if addresses else "127.0.0.1"
                port_i = port or free_port()
                config = d / "sshd_config"
                config.write_text(
                    f"Port {port_i}\nListenAddress {address}\nHostKey {key}\nPidFile {d / 'sshd.pid'}\n"
                    f"AuthorizedKeysFile {root / 'authorized_keys'}\n"
                    "UsePAM no\nStrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                    "PubkeyAuthentication yes\nPermitRootLogin prohibit-password\n"
                    f"SetEnv PATH={path}" + "".join(f" {k}={v}" for k, v in ((env or [{}] * n)[i] or {}).items())
                    + "\nMaxSessions 64\nMaxStartups 64:30:128\nLogLevel INFO\n"
                    + "".join(line + "\n" for line in ((extra_config or [""] * n)[i] or "").splitlines())
                )
                self.ports.append(port_i)
                self.addresses.append(address)
                self.host_keys.append(" ".join(host_pub.split()[:2]))
            if not defer:
                for i in range(n):
                    self.launch(i)
            self.write_known_hosts()
        except BaseException:
            self.stop()
            raise
        return self

    def launch(self, i: int) -> None:
        """Start server i and wait until it answers."""
        d = self.root / f"host{i}"
        log = open(d / "sshd.log", "ab")
        prefix = self.wrap[i] if i < len(self.wrap) else []
        proc = subprocess.Popen([*prefix, SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, start_new_session=True)
        log.close()
        while len(self.procs) <= i:
            self.procs.append(None)
        self.procs[i] = proc
        self._wait(i, self.ports[i])

    def _wait(self, i: int, port: int) -> None:
        end = time.monotonic() + 15
        while time.monotonic() < end:
            if self.procs[i].poll() is not None:
                raise RuntimeError(f"sshd {i} exited: {(self.root / f'host{i}' / 'sshd.log').read_text()[-2000:]}")
            try:
                with socket.create_connection((self.addresses[i], port), timeout=1) as s:
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
        path.write_text("".join(f"[{self.addresses[i]}]:{self.ports[i]} {keys[i]}\n" for i in chosen))
        return path

    def stop(self) -> None:
        for proc in self.procs:
            if proc is None:
                continue
            if proc.poll() is None:
                proc.kill()
            proc.wait()


# -- shared by the test modules that use these servers ----------------------------------------
def hosts_fixture(n: int):
    """A module's `hosts` fixture of `n` sshd hosts (`hosts = sshd.hosts_fixture(2)` in the module)."""

    @pytest.fixture(scope="module", name="hosts")
    def _hosts(tmp_path_factory):
        h = SshdHosts.start(tmp_path_factory.mktemp("sshd"), n)
        yield h
        h.stop()

    return _hosts


hosts = hosts_fixture(3)


@pytest.fixture
def remote_dir(tmp_path):
    return tmp_path / "remote"


def make_launcher(hosts, remote_dir, **kw):
    from gpucluster.infra.ssh.launch import SshLauncher

    kw.setdefault("identity", str(hosts.identity))
    kw.setdefault("known_hosts", str(hosts.known_hosts))
    kw.setdefault("python", sys.executable)
    return SshLauncher(remote_dir=str(remote_dir), grace=2.0, **kw)


def cluster_of(hosts, n, **kw):
    from gpucluster.domain import NullEvents
    from gpucluster.infra.ssh.provider import SshProvider
    from gpucluster.spec import ClusterSpec

    spec = ClusterSpec(cloud="ssh", nodes=n, name="loopback", hosts=tuple(hosts.hosts[:n]), **kw)
    return SshProvider().up(spec, NullEvents())


def run_processes(run_id: str, node_rank: int | None = None) -> dict[int, str]:
    """Processes on this machine whose environment carries the run id (and node rank)."""
    want = [f"GPUCLUSTER_RUN_ID={run_id}".encode()]
    if node_rank is not None:
        want.append(f"GPUCLUSTER_NODE_RANK={node_rank}".encode())
    found = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            env = Path(f"/proc/{d}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{d}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if state != b"Z" and all(w in env for w in want):
            found[int(d)] = cmd
    return found


def _orphaned_ssh() -> dict[str, str]:
    """{pid: argv} of ssh processes whose ControlPath lies in a directory that no longer exists.
    `ControlPath=none` is no path: it turns connection sharing off (ssh_config(5)), as the
    launchers' one-off probes do."""
    found = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            argv = Path(f"/proc/{d}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == "ssh":
            for a in argv:
                path = a.split("=", 1)[1] if a.startswith("ControlPath=") else None
                if path and path != "none" and not os.path.isdir(os.path.dirname(path)):
                    found[d] = " ".join(argv)
    return found


def leaked_ssh_masters(settle: float = 5.0) -> list[str]:
    """ssh processes whose ControlPath lies in a directory that no longer exists, and that are
    still there `settle` seconds later: tests in other xdist workers remove their folders a moment
    before their own masters exit, which is not a leak of this test's."""
    found = _orphaned_ssh()
    deadline = time.monotonic() + settle
    while found and time.monotonic() < deadline:
        time.sleep(0.2)
        now = _orphaned_ssh()
        found = {pid: argv for pid, argv in found.items() if now.get(pid) == argv}
    return list(found.values())


class Recorder(NullEvents):
    """What the launcher reports, kept (the events the tests do not look at are dropped)."""

    def __init__(self, on_line=None):
        self.lines: list[tuple[int, str]] = []
        self.phases: list[str] = []
        self.metrics: list[tuple[int, dict]] = []
        self._hook = on_line

    def on_line(self, node_rank, line):
        self.lines.append((node_rank, line))
        if self._hook:
            self._hook(node_rank, line)

    def on_metric(self, node_rank, record):
        self.metrics.append((node_rank, record))

    def on_phase(self, phase):
        self.phases.append(phase)

    def envs(self) -> list[tuple[int, dict]]:
        return [(r, json.loads(line[4:])) for r, line in self.lines if line.startswith("ENV ")]


def assert_nothing_left(hosts, cluster, run_id, remote_dir):
    """No process of the run here (all hosts are this machine), none reported by the remote
    check either, no run folder left on the nodes, no ssh master connection left behind."""
    from gpucluster.infra.ssh.cleanup import remote_leftovers

    assert run_processes(run_id) == {}
    assert remote_leftovers(cluster, run_id, identity=str(hosts.identity), known_hosts=str(hosts.known_hosts)) == []
    assert not (remote_dir / run_id).exists(), list((remote_dir / run_id).rglob("*"))
    assert leaked_ssh_masters() == []


FIXTURE = Path(__file__).parent / "fixtures" / "ddp_tiny.py"


def user_job_dir(tmp_path, monkeypatch) -> Path:
    """A user's project folder: the script, a data file, and a .git folder that is not shipped."""
    job = tmp_path / "project"
    job.mkdir()
    shutil.copy(FIXTURE, job / "train.py")
    (job / "labels.txt").write_text("0 1\n")
    (job / ".git").mkdir()
    (job / ".git" / "HEAD").write_text("ref\n")
    monkeypatch.chdir(job)
    return job
