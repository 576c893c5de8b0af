"""Find and delete what gpucluster created, by tag/label, independently of any local state.

Every resource gpucluster creates carries `managed-by=gpucluster` and `gpucluster-cluster=<name>`
(and `gpucluster-run=<run id>` when made by a run): AWS tags, GCP labels. The tag scan asks the
cloud for exactly those, so it finds resources a crashed process never recorded, and it leaves
anything without the tag alone (someone else's instances in the same account are never touched).

This module is the shared part: the tags, `Found`, `ScanReport`, and the entry points, which reach
each cloud through its backend (`backend(cloud).scan(...)` / `.delete(...)`, see `infra.contract`);
the scans themselves live in the backend packages (`infra/aws/leftovers.py`, `infra/gcp/leftovers.py`).

`find_leftovers(...) -> Check` is the teardown check: what is left and, never dropped, what could not
be checked (no credentials, a denied call, no project); `scan(...)` returns the same with the cluster
and run of each find; `delete_leftovers(list)` deletes in dependency order and returns the errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from gpucluster.domain import Check, Leftover
from gpucluster.infra.contract import ScanScope
from gpucluster.infra.pulumi.cloud import PulumiCloud
from gpucluster.states import JsonMapping

MANAGED_BY = ("managed-by", "gpucluster")
CLUSTER_TAG = "gpucluster-cluster"
RUN_TAG = "gpucluster-run"


@dataclass(frozen=True)
class Found:
    leftover: Leftover
    cluster: str | None
    run_id: str | None


@dataclass
class ScanReport:
    found: list[Found] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # what could not be checked, and why

    @property
    def leftovers(self) -> list[Leftover]:
        return [f.leftover for f in self.found]

    @property
    def check(self) -> Check:
        """Three-state verdict: a skipped check is never counted as clean."""
        return Check(tuple(self.leftovers), tuple(self.skipped))


def wanted(tags: dict[str, str], name: str | None, run_id: str | None) -> bool:
    if tags.get(MANAGED_BY[0]) != MANAGED_BY[1]:
        return False
    if name and tags.get(CLUSTER_TAG) != name:
        return False
    if run_id and not name and tags.get(RUN_TAG) != run_id:
        return False
    return True


def with_marks(lo: Leftover, tags: Mapping[str, str], created: float | None = None,
               hourly: str | None = None) -> Leftover:
    """`lo` with who made it, from its tags/labels (gpucluster.ownership): owner id, user@host, run,
    standalone stack, and since when (the cloud's creation time, else the run's start)."""
    import dataclasses

    from gpucluster.ownership import HOST_TAG, OWNER_TAG, STACK_TAG, USER_TAG, run_started

    user, host = tags.get(USER_TAG), tags.get(HOST_TAG)
    run = tags.get(RUN_TAG)
    return dataclasses.replace(
        lo, owner=tags.get(OWNER_TAG) or None, made_by=f"{user or '?'}@{host or '?'}" if user or host else None,
        run_id=run or None, since=created if created is not None else run_started(run), stack=tags.get(STACK_TAG) or None,
        hourly=hourly)


def wanted_found(f: Found, name: str | None, run_id: str | None) -> bool:
    if name and f.cluster != name:
        return False
    if run_id and not name and f.run_id != run_id:
        return False
    return True



# -- the entry points -------------------------------------------------------------------------------
def scope_of(options: JsonMapping) -> ScanScope:
    """A `ScanScope` from loose options: regions (aws), project (gcp), owner (whose global resources
    are listed), session / gke_client / google (clients)."""
    return ScanScope(regions=tuple(options.get("regions") or ()), project=options.get("project"),
                     owner=options.get("owner"),
                     clients={k: options[k] for k in ("session", "gke_client", "google") if options.get(k) is not None})


def scan(provisioner: PulumiCloud, name: str | None = None, run_id: str | None = None,
         live_clusters: Iterable[str] = (), scope: ScanScope | None = None) -> ScanReport:
    """What is still tagged as ours by `provisioner`'s backend (minus resources of `live_clusters`),
    and what was not checked. `scope`: where to look and with what (aws: regions, session; gcp:
    project, gke_client)."""
    report = provisioner.scan(name, run_id, scope or ScanScope())
    live = set(live_clusters)
    report.found = [f for f in report.found if f.cluster not in live]
    return report


def find_leftovers(provisioner: PulumiCloud, name: str | None = None, run_id: str | None = None,
                   live_clusters: Iterable[str] = (), scope: ScanScope | None = None) -> Check:
    """The teardown check: what is left *and* what could not be checked (never dropped)."""
    return scan(provisioner, name, run_id, live_clusters, scope).check


def delete_leftovers(provisioner: PulumiCloud, leftovers: Check | list[Leftover], scope: ScanScope | None = None,
                     wait_seconds: float | None = 600) -> list[str]:
    """Delete what `find_leftovers` found (a Check or a list) through the backend that scanned it,
    in its dependency order; the errors (empty when all went)."""
    found = list(leftovers.leftovers) if isinstance(leftovers, Check) else list(leftovers)
    mine = [lo for lo in found if lo.kind in provisioner.leftover_kinds]
    return provisioner.delete(mine, scope or ScanScope(), wait_seconds) if mine else []
