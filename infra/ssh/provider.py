"""The `ssh` provider: a cluster made of machines that already exist.

Nothing is created or deleted here. `up` turns the spec's host list (`user@host[:port]`, head
first) into a `Cluster`; `down` succeeds without doing anything; `leftovers` asks every host,
over ssh, for processes that still carry the run's id in their environment (the only thing a run
on existing machines can leave behind). Connecting, checking readiness and launching are the job
of `gpucluster.infra.ssh.launch.SshLauncher`, which the `aws` backend uses as well.

Host syntax: `[user@]host[:port]` where host is a DNS name, an IPv4 address, or an IPv6 address
(bare, or in brackets when a port follows: `user@[fe80::1]:2222`).

Spec options understood here:
- `private_ips`: comma-separated addresses the nodes use to reach each other (one per host, same
  order). Default: the host itself. Set it when the hosts are reached through public addresses
  but train over a private network.
"""

from __future__ import annotations

import ipaddress
import re
from typing import TYPE_CHECKING, Sequence

from gpucluster.errors import SpecError, not_allowed

from gpucluster.domain import Check, Cluster, Node, Provider, ProvisionEvents

if TYPE_CHECKING:
    from gpucluster.spec import ClusterSpec

    from .launch import SshLauncher

HOST_FORMAT = "[user@]host[:port], e.g. ubuntu@10.0.0.5 or ubuntu@gpu1.example.com:2222"
_USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?$")
_LABEL_RE = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def parse_host(text: str) -> tuple[str | None, str, int]:
    """`[user@]host[:port]` -> (user, host, port); SpecError naming the value otherwise."""
    raw = text
    text = text.strip()
    if not text:
        raise SpecError(not_allowed("ssh host", raw, HOST_FORMAT))
    user: str | None = None
    if "@" in text:
        user, _, text = text.rpartition("@")
        if not _USER_RE.match(user):
            raise SpecError(not_allowed("ssh user in host", raw, "a user name of letters, digits, '_', '.', '-'"))
    port = 22
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise SpecError(not_allowed("ssh host", raw, HOST_FORMAT))
        if rest:
            port = _port(rest[1:], raw)
        if not _is_ip(host, 6):
            raise SpecError(not_allowed("ssh host", raw, "an IPv6 address inside [...]"))
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
        port = _port(port_text, raw)
    else:
        host = text  # a name, an IPv4 address, or a bare IPv6 address (no port)
    if not (_is_ip(host, 4) or _is_ip(host, 6) or _is_hostname(host)):
        raise SpecError(not_allowed("ssh host", raw, HOST_FORMAT))
    return user, host, port


def format_host(user: str | None, host: str, port: int) -> str:
    """The canonical `user@host[:port]` text (brackets around IPv6 when a port follows)."""
    shown = f"[{host}]" if ":" in host and port != 22 else host
    return f"{user + '@' if user else ''}{shown}{'' if port == 22 else f':{port}'}"


NEEDS_HOSTS = "the ssh backend needs --hosts user@host1,user@host2[:port] (head first)"


def host_list(hosts: Sequence[str]) -> tuple[str, ...]:
    """The spec's hosts (`--hosts` split at its commas, or as recorded) in their one form, head first; a
    SpecError naming the `--hosts` text when none is given, or one is malformed, empty or listed twice."""
    if not hosts:
        raise SpecError(NEEDS_HOSTS)
    return parse_hosts(",".join(hosts))


def resolve_hosts(spec: ClusterSpec) -> ClusterSpec:
    """`SpecRules.resolve`: the hosts as the ledger records them (`format_host`), after `validate_spec`."""
    return spec.replace(hosts=host_list(spec.hosts)) if spec.hosts else spec


def parse_hosts(text: str) -> tuple[str, ...]:
    """The CLI's `--hosts user@h1,user@h2:2222` -> canonical host strings, head first."""
    parts = [p.strip() for p in str(text).split(",")]
    if not any(parts):
        raise SpecError(not_allowed("--hosts", text, "a comma-separated list of " + HOST_FORMAT))
    if any(not p for p in parts):
        raise SpecError(not_allowed("--hosts", text, "no empty entries between commas"))
    out = tuple(format_host(*parse_host(p)) for p in parts)
    _check_unique(out)
    return out


def _check_unique(hosts: tuple[str, ...]) -> None:
    seen: dict[tuple[str, int], str] = {}
    for h in hosts:
        _, host, port = parse_host(h)
        key = (host.lower(), port)
        if key in seen:
            raise SpecError(
                f"ssh host {h!r} is listed twice (as {seen[key]!r} too); each node must be a different host or port"
            )
        seen[key] = h


def _port(text: str, raw: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise SpecError(not_allowed("ssh port in host", raw, "a port from 1 to 65535"))
    return int(text)


def _is_ip(text: str, version: int) -> bool:
    try:
        return ipaddress.ip_address(text).version == version
    except ValueError:
        return False


def _is_hostname(text: str) -> bool:
    if len(text) > 253 or text.replace(".", "").isdigit():
        return False
    return all(_LABEL_RE.match(label) for label in text.rstrip(".").split("."))


def nodes_from_spec(spec: ClusterSpec) -> tuple[Node, ...]:
    """Validate the spec's hosts (and `private_ips` option) and build the nodes, head first."""
    hosts = tuple(spec.hosts or ())
    if not hosts:
        raise SpecError(NEEDS_HOSTS)
    parsed = [parse_host(h) for h in hosts]
    _check_unique(tuple(format_host(*p) for p in parsed))
    if spec.nodes != len(hosts):
        raise SpecError(
            f"nodes {spec.nodes!r} does not match the {len(hosts)} ssh host(s) given; "
            "leave --nodes out or give one host per node"
        )
    private = spec.option("private_ips")
    if private:
        ips = [p.strip() for p in str(private).split(",")]
        if len(ips) != len(hosts):
            raise SpecError(
                not_allowed("option private_ips", private, f"one address per host ({len(hosts)}), comma-separated")
            )
        for ip in ips:
            if not (_is_ip(ip, 4) or _is_ip(ip, 6) or _is_hostname(ip)):
                raise SpecError(not_allowed("private address", ip, "an IP address or host name"))
    else:
        ips = [p[1] for p in parsed]
    gpus = int(spec.gpus_per_node or 0)
    return tuple(
        Node(rank=i, host=host, private_ip=ips[i], user=user, port=port, gpus=gpus)
        for i, (user, host, port) in enumerate(parsed)
    )


def validate_spec(spec: ClusterSpec) -> list[str]:
    """The ssh backend's spec checks (called by `gpucluster.spec.validate`); returns warnings."""
    host_list(spec.hosts)  # the `--hosts` text as given, named in the error (before the node count is compared)
    nodes_from_spec(spec)
    warnings = []
    ignored = (("region", spec.region), ("zone", spec.zone), ("instance_type", spec.instance_type),
               ("accelerator", spec.accelerator))
    for key, value in ignored:
        if value:
            warnings.append(f"{key} is ignored by the ssh backend (the machines already exist)")
    if spec.spot:
        warnings.append("spot is ignored by the ssh backend (the machines already exist)")
    if not spec.gpus_per_node:
        warnings.append("no GPU count given (--gpus-per-node): nodes are not checked for GPUs")
    return warnings


class SshProvider(Provider):
    """Provider for existing machines: nothing to create, nothing to delete, processes to check.

    `launcher`: the `SshLauncher` that runs the jobs; `leftovers` then reaches the hosts the way
    it does and checks only the nodes it gave a run folder (the health check, the staging and the
    job run there; a run refused before that, e.g. for an unknown host key, left nothing to check). Without it, `identity`,
    `known_hosts` and `ssh_options` (as for `SshLauncher`) are used and every node is checked.
    """

    # the check reaches every host the run started on (an unreachable one is reported unchecked)
    # and scans all its processes for the run id: it sees every process a run made there (the run
    # folder is removed by the launcher, and not re-checked: it holds no process and bills nothing)
    check_is_complete = True

    cloud = "ssh"

    def __init__(self, identity: str | None = None, known_hosts: str | None = None, ssh_options: tuple[str, ...] = (),
                 *, launcher: SshLauncher | None = None):
        self.identity = identity
        self.known_hosts = known_hosts
        self.ssh_options = tuple(ssh_options)
        self.launcher = launcher
        self._clusters: dict[str, Cluster] = {}
        self._owners: dict[str, str | None] = {}  # cluster -> the owner id its spec carries (marks)

    def up(self, spec: ClusterSpec, events: ProvisionEvents) -> Cluster:
        nodes = nodes_from_spec(spec)
        cluster = Cluster(
            name=spec.name,
            cloud="ssh",
            nodes=nodes,
            gpus_per_node=int(spec.gpus_per_node or 0),
            outputs={"hosts": [format_host(n.user, n.host, n.port) for n in nodes]},
        )
        self._clusters[spec.name] = cluster
        self._owners[spec.name] = dict(spec.marks).get("gpucluster-owner")
        events.message(f"ssh cluster {spec.name}: {len(nodes)} existing host(s), head {cluster.outputs['hosts'][0]}")
        return cluster

    def down(self, name: str, events: ProvisionEvents) -> None:
        """Nothing was created, so nothing is deleted (run processes are stopped by the launcher).
        The hosts stay known to this provider so that `leftovers` can still check them."""
        return None

    def leftovers(self, name: str, run_id: str | None = None) -> Check:
        """Processes on the hosts whose environment carries the run's id (any gpucluster run when
        `run_id` is None). A host that cannot be reached is reported as a leftover of kind
        "unverified", since nothing can be said about it. With the launcher of the run, a run it
        reached nowhere (stopped before any node had a run folder) has nothing on any host: the
        check is complete.
        Otherwise a cluster this provider has not brought up in this process is unknown: its hosts
        cannot be asked, and that is "not checked", never "nothing left"."""
        cluster = self._clusters.get(name)
        if self.launcher is not None and run_id and not self.launcher.touched_ranks(run_id):
            return Check()  # the only thing that starts processes on the hosts reached none
        if cluster is None:
            return Check(unchecked=(f"processes of cluster {name!r}: its hosts are unknown to this process",))
        if self.launcher is not None:
            ranks = self.launcher.touched_ranks(run_id) if run_id else None
            return Check.of(self.launcher.processes_left(cluster, run_id, ranks=ranks, owner=self._owners.get(name)))
        from gpucluster.infra.ssh.cleanup import remote_leftovers

        return Check.of(remote_leftovers(
            cluster, run_id, identity=self.identity, known_hosts=self.known_hosts, ssh_options=self.ssh_options
        ))
