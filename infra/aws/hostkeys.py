"""Pin each EC2 node's ssh host key from its serial console, never trusting on first use.

The nodes of a cluster are launched from one launch template (one EC2 Fleet request), so no node
carries a host key of ours: each generates its own ed25519 key at first boot, and the user data
prints it to the serial console between cloud-init's `-----BEGIN SSH HOST KEY KEYS-----` and
`-----END SSH HOST KEY KEYS-----` markers (cloud-init's keys_to_console format,
canonical/cloud-init#2224). The launcher reads it with EC2 `GetConsoleOutput` (`Latest=True`,
Nitro types such as g5; the answer is base64, EC2 API reference), an authenticated API call, and
pins it before the first ssh connection. Console output can lack the block (canonical/cloud-init#3822)
or show it minutes after `running`: a node whose console shows no key by the deadline is not
reached, and the run fails naming it.

Keys once read are kept in the gpucluster home (`ssh/<cluster>/hostkeys/<instance id>`, removed by a
verified `down` with the cluster's other ssh files; keys of instances the cluster no longer has are
dropped when it is next pinned), so reaching a kept cluster later does not depend on the console's
last 64 KB still holding the block.
"""

from __future__ import annotations

import base64
import binascii
import re
import time
from pathlib import Path
from typing import Callable, Literal

from gpucluster.domain import Cluster, Node
from gpucluster.errors import ProvisionError

from .sdk import Ec2Client

BEGIN = "-----BEGIN SSH HOST KEY KEYS-----"
END = "-----END SSH HOST KEY KEYS-----"
KEY_TYPE = "ssh-ed25519"
# from `running` to the key on the console: the boot, cloud-init's init stage (which makes the key)
# and the first runcmd step (which prints it); EC2 says a running instance can take "a few minutes"
# to be ready to connect to
DEFAULT_TIMEOUT_S = 600.0
_KEY = re.compile(r"(ssh-ed25519)\s+(AAAA[0-9A-Za-z+/]+={0,3})")


def decode(raw: str | None) -> str:
    """GetConsoleOutput's `Output`: base64 text (a client may already have decoded it)."""
    raw = raw or ""
    try:
        return base64.b64decode(raw, validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return raw


def key_from_console(text: str) -> str | None:
    """The ed25519 host key of the last complete key block on the console, None when there is none
    (no block yet, a block cut off, or one without an ed25519 key). Lines may carry carriage returns
    and other output may interleave; only a block with both markers counts."""
    text = text.replace("\r", "")
    found = None
    start = 0
    while True:
        b = text.find(BEGIN, start)
        if b < 0:
            return found
        e = text.find(END, b + len(BEGIN))
        if e < 0:
            return found  # cut off: the console was read while the block was being written
        m = _KEY.search(text[b + len(BEGIN):e])
        if m:
            found = f"{m.group(1)} {m.group(2)}"
        start = e + len(END)


def client_for(region: str | None) -> Ec2Client:
    import boto3
    from botocore.config import Config

    return boto3.client("ec2", region_name=region,
                        config=Config(connect_timeout=5, read_timeout=20, retries={"max_attempts": 3}))


def _cache_dir(cluster: str) -> Path:
    """Beside the cluster's `ssh --ssh-config` files: a verified `down` removes the folder
    (`gpucluster.lifecycle.kept.forget_access`)."""
    from gpucluster.lifecycle.kept import access_dir

    return access_dir(cluster) / "hostkeys"


def _drop_stale(folder: Path, cluster: Cluster) -> None:
    """Keys of instances this cluster no longer has: gone."""
    current = {n.instance_id for n in cluster.nodes}
    for stale in folder.iterdir():
        if stale.name not in current:
            stale.unlink(missing_ok=True)


def _known_keys(cluster: Cluster, folder: Path | None) -> dict[int, str]:
    """{rank: key} for the nodes whose key is in the outputs or the cache already."""
    keys: dict[int, str] = {}
    for node in cluster.nodes:
        if node.host_keys:
            keys[node.rank] = node.host_keys[0]
        elif folder is not None and node.instance_id and (folder / node.instance_id).is_file():
            keys[node.rank] = (folder / node.instance_id).read_text().strip()
    return keys


def _console_key(client: Ec2Client, node: Node) -> tuple[str | None, str]:
    """(the node's host key from its console or None, why there is none yet)."""
    if not node.instance_id:
        return None, "no instance id"
    try:
        resp = client.get_console_output(InstanceId=node.instance_id, Latest=True)
    except Exception as exc:  # noqa: BLE001 - said at the deadline if it persists
        return None, f"GetConsoleOutput failed: {getattr(exc, 'response', {}).get('Error', {}).get('Code') or type(exc).__name__}"
    text = decode(resp.get("Output"))
    key = key_from_console(text)
    if key:
        return key, ""
    return None, "console output empty" if not text.strip() else "no host key block on the console yet"


def _read_round(client: Ec2Client, pending: list[Node], keys: dict[int, str], last: dict[int, str],
                folder: Path | None) -> None:
    """One read of every pending node's console: a key found is kept (and cached), the node leaves `pending`."""
    for node in list(pending):
        key, why = _console_key(client, node)
        if key is None:
            last[node.rank] = why
            continue
        keys[node.rank] = key
        pending.remove(node)
        if folder is not None and node.instance_id:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            (folder / node.instance_id).write_text(key + "\n")


def _not_pinned(cluster: Cluster, pending: list[Node], last: dict[int, str], timeout: float) -> ProvisionError:
    missing = "; ".join(f"node {n.rank} ({n.instance_id}): {last.get(n.rank, 'not read')}" for n in pending)
    return ProvisionError(
        f"{len(pending)} of {len(cluster.nodes)} node(s) showed no ssh host key on the serial console "
        f"within {timeout:.0f} s, so they are not reached (no trust on first use): {missing}")


def pin(cluster: Cluster, *, client: Ec2Client = None, timeout: float = DEFAULT_TIMEOUT_S, poll: float = 5.0,
        sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
        cache: Path | None | Literal[False] = None, progress: Callable[[str], None] | None = None) -> Cluster:
    """`cluster` with every node's host key pinned from its console (or the cache). Raises a
    ProvisionError naming each node whose console showed no key within `timeout` seconds."""
    if all(n.host_keys for n in cluster.nodes):
        return cluster
    folder = _cache_dir(cluster.name) if cache is None else (None if cache is False else cache)
    if folder is not None and folder.is_dir():
        _drop_stale(folder, cluster)
    keys = _known_keys(cluster, folder)
    pending = [n for n in cluster.nodes if n.rank not in keys]
    if pending and client is None:
        client = client_for(cluster.region)
    deadline = clock() + timeout
    last: dict[int, str] = {}
    while pending:
        _read_round(client, pending, keys, last, folder)
        if not pending:
            break
        if clock() >= deadline:
            raise _not_pinned(cluster, pending, last, timeout)
        if progress:
            progress(f"waiting for the host keys of {len(pending)} node(s) on the serial console")
        sleep(min(poll, max(0.0, deadline - clock())))
    nodes = tuple(n if n.host_keys else _with_key(n, keys[n.rank]) for n in cluster.nodes)
    return _with_nodes(cluster, nodes)


def _with_key(node: Node, key: str) -> Node:
    import dataclasses

    return dataclasses.replace(node, host_keys=(key,))


def _with_nodes(cluster: Cluster, nodes: tuple[Node, ...]) -> Cluster:
    import dataclasses

    return dataclasses.replace(cluster, nodes=nodes)
