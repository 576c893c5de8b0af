"""`gpucluster ssh` on nodes reached over OpenSSH (aws): a shell, a command or port forwards, and
`--ssh-config` host aliases. The connection is the launcher's own (`Session`): the host keys pinned
in the cluster's outputs (StrictHostKeyChecking=yes against a private known_hosts file, never the
user's), the cluster's key in a file of mode 0600 in a private temporary folder removed on exit."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from gpucluster.errors import UsageError

from .session import NodeObjects, Session, known_hosts_name

if TYPE_CHECKING:
    from gpucluster.domain import Cluster, Node
    from gpucluster.watch.launch import Forward


class NodeAccess:
    """`Launcher.connect` and `Launcher.ssh_config` for the ssh launcher (mixed into `SshLauncher`)."""

    # the connection settings the launcher this is mixed into sets (`session.SshSettings`)
    ssh: str
    connect_timeout: int
    known_hosts: str | None
    identity: str | None
    ssh_options: tuple[str, ...]
    python: str
    grace: float
    data_cache: str
    objects: NodeObjects | None
    diagnose: Callable[[Cluster, Node], str | None] | None

    def connect(self, cluster: Cluster, rank: int, command: Sequence[str], forwards: Sequence[Forward],
                opening: Callable[[], None] = lambda: None) -> int:
        opening()  # nothing of its own to refuse first: ssh says what it cannot do
        node = cluster.nodes[rank]
        extra: list[str] = []
        for f in forwards:  # bound to this machine's loopback only; ssh fails at once if a port is taken
            extra += ["-L", f"127.0.0.1:{f.local}:{f.host}:{f.remote}"]
        if forwards:
            extra += ["-o", "ExitOnForwardFailure=yes"]
            if not command:
                extra.append("-N")  # a tunnel: no shell
        if command and sys.stdin.isatty():
            extra.append("-t")  # an interactive command (top, python) gets a terminal
        with Session(self, cluster) as session:
            argv = session.argv(node, shlex.join(command) if command else None, *extra)
            try:
                return subprocess.call(argv)
            except KeyboardInterrupt:  # Ctrl-C ends a tunnel (ssh got it too); the session is closed below
                return 0

    def ssh_config(self, cluster: Cluster, folder: Path) -> list[str]:
        """`folder/config` with one `Host CLUSTER-N` per node (and `CLUSTER` for the head), the pinned
        host keys in `folder/known_hosts`, the cluster's key in `folder/id_cluster` (mode 0600);
        the lines to put in ~/.ssh/config. `gpucluster down` removes the folder."""
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(folder, 0o700)
        pinned = [f"{known_hosts_name(n)} {k.strip()}" for n in cluster.nodes for k in (n.host_keys or ())]
        if not pinned or not all(n.host_keys for n in cluster.nodes):
            raise UsageError(f"cluster {cluster.name}: its outputs pin no host key for every node; refusing to "
                             "write a config that would trust keys on first use")
        known = folder / "known_hosts"
        known.write_text("\n".join(pinned) + "\n")
        identity = self.identity
        if identity:
            key_path = os.path.abspath(os.path.expanduser(identity))
        elif cluster.ssh_private_key:
            key = folder / "id_cluster"
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(cluster.ssh_private_key.rstrip("\n") + "\n")
            os.chmod(key, 0o600)
            key_path = str(key)
        else:
            key_path = ""
        blocks = []
        for node in cluster.nodes:
            names = f"{cluster.name}-{node.rank}" + (f" {cluster.name}" if node.rank == 0 else "")
            lines = [f"Host {names}", f"  HostName {node.host}", f"  Port {node.port}",
                     f"  UserKnownHostsFile {known}", "  StrictHostKeyChecking yes", "  GlobalKnownHostsFile /dev/null",
                     "  UpdateHostKeys no"]
            if node.user:
                lines.append(f"  User {node.user}")
            if key_path:
                lines += [f"  IdentityFile {key_path}", "  IdentitiesOnly yes"]
            blocks.append("\n".join(lines))
        config = folder / "config"
        config.write_text(f"# gpucluster: cluster {cluster.name}; removed by `gpucluster down {cluster.name}`\n"
                          + "\n\n".join(blocks) + "\n")
        return [f"Include {config}"]
