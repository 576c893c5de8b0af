"""Kept clusters of machines that exist (`up --cloud ssh --hosts ...`, `up --cloud local --nodes N`):
nothing is provisioned. `up` checks once that every machine answers and is ready (the backend's
`Operations.hold`: ssh asks each host for python, torch, setsid, tar and the GPUs expected), then
records one `host` row per machine with how it is reached (the key, the known hosts file, the
Python). Those rows are what makes the cluster "up" in the ledger (`kept.find`), what `status`
lists (billed by nobody: $0) and what `down` closes once the check of the hosts is verified; the
hosts themselves are never touched, only what gpucluster put there (run folders, processes).
A namespace of an existing Kubernetes cluster (`up --cloud kubernetes --name`) is held the same way:
its cluster lists no nodes (a job's pods are placed by the scheduler), so `hold` names its one row
(the context and namespace) and the check is the one a run makes before creating anything.

- `Holding`: the provider `up` runs through the lifecycle's `provision_only` (the same bookkeeping
  as a cloud cluster's `up`): the backend's own provider builds the cluster and the rows are
  written. The ready check runs before that (`api.clusters.plan_up`): a machine that is not ready
  is refused before anything is recorded.
- `reach_of(ledger, kept)`: the connection settings recorded at `up`, as `exec` and `ssh` ask them
  of a `prepare.Request` (a flag given to `exec` wins).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Mapping

from gpucluster.domain import Check, Cluster, Provider
from gpucluster.errors import LaunchError
from gpucluster.events import ProvisionEvents

if TYPE_CHECKING:
    from gpucluster.ledger.records import JsonObject
    from gpucluster.lifecycle.kept import Kept
    from gpucluster.ledger.store import Ledger
    from gpucluster.spec import ClusterSpec
    from gpucluster.infra.contract import Plugin

HOST_KIND = "host"  # the ledger's row of a machine that exists (or a namespace of a cluster), held as a kept cluster's
REACH = ("identity", "known_hosts", "remote_python", "python")  # Request fields recorded with the rows


def kept_said(backend: Plugin, spec: ClusterSpec, cluster: Cluster) -> tuple[str, str]:
    """(what the kept cluster is, with its price; what `down` never touches), as `up` and `exec` say them:
    its provider's words (`Cluster.kept_as`, `spares`; machines that exist by default), $0 unless the user gave
    an internal price (`gpucluster.costing.internal`, for an hour of the spec's GPUs)."""
    from gpucluster.costing.cost import money
    from gpucluster.costing.internal import internal_cost

    priced = internal_cost(backend, spec.to_dict(), 3600.0)
    price = f"internal price {money(priced[0])}/hour while it runs a job, rented by nobody" if priced else "$0 here"
    return f"{cluster.kept_as or 'machines that exist'}, {price}", cluster.spares or "the machines"


def reach_given(flags: Mapping[str, object]) -> dict[str, str]:
    """The connection settings `up` was given, paths made absolute (a later `exec` runs elsewhere)."""
    out = {}
    for key in REACH:
        value = flags.get(key)
        if value:
            path = os.path.expanduser(str(value))
            out[key] = os.path.abspath(path) if key in ("identity", "known_hosts") or os.sep in path else str(value)
    return out


class Holding(Provider):
    """`up` of machines that exist: `provider.up` builds the cluster (nothing is created) and one
    `host` row per machine records it with `reach` and what the ready check found (`found`: the
    backend's `hold`, asked before the run's row). `down` of an interrupted `up` closes the rows it
    wrote; nothing else was made."""

    check_is_complete = True  # nothing is started on the machines: the check answers for all

    def __init__(self, provider: Provider, found: dict[int, dict[str, object]], reach: dict[str, str]):
        self.inner, self.found, self.reach = provider, found, dict(reach)
        self.cloud = provider.cloud
        self._written: list[str] = []

    def up(self, spec: ClusterSpec, events: ProvisionEvents) -> Cluster:
        cluster: Cluster = self.inner.up(spec, events)
        rows = [(f"node-{node.rank}", {"rank": node.rank, "host": node.host, "user": node.user, "port": node.port,
                                       **self.reach, **(self.found.get(node.rank) or {})}) for node in cluster.nodes]
        if not cluster.nodes:  # a place whose nodes are not addressed one by one (a Kubernetes namespace): its rows
            rows = [(str(d.get("row") or f"place-{r}"), {"rank": r, **self.reach, **d}) for r, d in sorted(self.found.items())]
        for name, detail in rows:
            events.resource_requested(HOST_KIND, name, **detail)
            self._written.append(name)
            events.resource_created(HOST_KIND, name, str(detail.get("label") or detail.get("host")))
        events.message(f"kept cluster {spec.name}: {len(cluster.nodes)} machine(s) that exist, each checked ready; "
                       "nothing created" if cluster.nodes else f"kept cluster {spec.name}: "
                       f"{', '.join(str(d.get('label')) for _, d in rows)}, checked as a run checks it; nothing created")
        return cluster

    def down(self, name: str, events: ProvisionEvents) -> None:
        for row in self._written:
            events.resource_deleted(HOST_KIND, row)

    def leftovers(self, name: str, run_id: str | None = None) -> Check:
        return Check()  # the ready check's programs ended with its connections: nothing of `up` runs there


def not_ready(problems: dict[int, list[str]], labels: dict[int, str]) -> LaunchError:
    """The refusal of `up` when some machines are not ready: each named with what is wrong."""
    said = "; ".join(f"node {r} ({labels.get(r, '?')}): {', '.join(p)}" for r, p in sorted(problems.items()))
    return LaunchError(f"not every machine is ready, so no cluster is kept: {said}")


def host_rows(ledger: Ledger, kept: Kept) -> list[JsonObject]:
    """The open `host` rows of a kept cluster of machines that exist, by rank (none: a cloud cluster)."""
    rows = [r for r in ledger.open_resources(kept.name) if r["kind"] == HOST_KIND]
    return sorted(rows, key=lambda r: int((r.get("detail") or {}).get("rank", 0)))


def reach_of(ledger: Ledger, kept: Kept) -> dict[str, str]:
    """The connection settings recorded by `up` (the head's row holds the same as every other)."""
    rows = host_rows(ledger, kept)
    detail = (rows[0].get("detail") or {}) if rows else {}
    return {k: str(detail[k]) for k in REACH if detail.get(k)}


def holding(kept: Kept, ledger: Ledger) -> bool:
    return bool(host_rows(ledger, kept))


class _Silent:
    """Events nobody reads: the cluster rebuilt from its spec for `exec` and `ssh` records nothing."""

    def resource_requested(self, kind: str, name: str, **detail: object) -> None: ...
    def resource_created(self, kind: str, name: str, cloud_id: str | None = None, **detail: object) -> None: ...
    def resource_deleted(self, kind: str, name: str, cloud_id: str | None = None) -> None: ...
    def message(self, text: str) -> None: ...


def attach_held(provider: Provider, spec: ClusterSpec) -> Cluster:
    """The kept cluster of machines that exist, from the spec `up` recorded (its hosts, its node
    count): the backend's provider builds it as for a run, creating nothing."""
    cluster: Cluster = provider.up(spec, _Silent())
    return cluster
