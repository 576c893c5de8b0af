"""The Provider contract, written once.

A provider turns a validated `ClusterSpec` into a `Cluster` and back into nothing:

- `up(spec, events) -> Cluster`: create (or find, when it already exists) the cluster named
  `spec.name`; idempotent per name. The returned nodes are ordered **head first**: rank i is
  node i, and node 0 hosts the rendezvous. Every resource it asks a cloud for is reported to
  `events.resource_requested(...)` *before* the request and `events.resource_created(...)` after,
  so a crash in between leaves a ledger row saying what may exist.
- `down(name, events)`: delete everything the cluster owns; idempotent (a cluster that is
  already gone is a success). Reports `events.resource_deleted(...)` per resource.
- `leftovers(name, run_id=None) -> Check`: what still exists, found by tag/label
  (`managed-by=gpucluster`, `gpucluster-cluster=<name>`) or by run id, independent of any local
  state, **and** every check that could not run (no credentials, an unreachable host, ...).
  Only a `Check` whose verdict is "verified" (every check ran, nothing found) is the teardown
  guarantee; a skipped check is never counted as clean.

Like SkyPilot's per-cloud `provision/<cloud>/instance.py` or Ray's `NodeProvider`: one small
contract, one module per cloud, the cloud SDKs imported lazily.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from gpucluster.events import NullEvents, ProvisionEvents
from gpucluster.states import TeardownVerdict

if TYPE_CHECKING:
    from gpucluster.states import JsonObject
    from gpucluster.spec import ClusterSpec

__all__ = ["NullEvents", "ProvisionEvents"]  # re-exported: providers import them from here


@dataclass(frozen=True)
class Node:
    rank: int
    host: str  # address the launcher connects to (public IP, hostname, 127.0.0.1, pod name)
    private_ip: str  # address other nodes use (rendezvous endpoint on the head)
    user: str | None = None
    port: int = 22
    instance_id: str | None = None
    gpus: int = 0
    host_keys: tuple[str, ...] = ()  # pinned OpenSSH public host keys ("ssh-ed25519 AAAA...")


@dataclass(frozen=True)
class Cluster:
    name: str
    cloud: str
    nodes: tuple[Node, ...]  # head first
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    gpus_per_node: int = 0
    ssh_private_key: str | None = None  # secret: never logged, never written to the ledger
    kubeconfig: str | None = None  # secret
    outputs: JsonObject = field(default_factory=dict)  # non-secret provider outputs
    # a kept cluster of machines that exist (`up`, `exec`: `gpucluster.lifecycle.held.kept_said`), in its
    # provider's words: what it is, and what `down` never touches; None: "machines that exist", "the machines"
    kept_as: str | None = None
    spares: str | None = None

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def node_ips(self) -> list[str]:
        return [n.private_ip for n in self.nodes]


# Ledger rows a launcher writes for what it starts on nodes it did not create: the job's processes (local,
# ssh, aws) and a GKE run's Kubernetes objects (`infra.kubernetes.gone.ROW_KINDS`). They are not cloud resources
# (no bill of their own, not part of a cluster being up) and are closed by the launcher's own check.
LAUNCHER_KINDS = ("process", "k8s-secret", "k8s-configmap", "k8s-service", "k8s-job", "k8s-pytorchjob",
                  "k8s-trainjob", "k8s-namespace")


@dataclass(frozen=True)
class Leftover:
    """Something that still exists and may bill."""

    kind: str  # "instance", "security-group", "volume", "process", "gke-cluster", ...
    id: str
    region: str | None = None
    detail: str = ""
    deleting: bool = False  # the cloud is deleting it already (GKE STOPPING): wait, do not delete again
    # who made it, from its marks (gpucluster.ownership); None where the scan does not read them
    owner: str | None = None  # the installation id of the home whose run made it (gpucluster-owner)
    made_by: str | None = None  # "user@host" (gpucluster-user, gpucluster-host)
    run_id: str | None = None  # gpucluster-run
    since: float | None = None  # when it was made (epoch seconds): the cloud's creation time, or the run's start
    stack: str | None = None  # a stack made with `pulumi up -s STACK` directly (gpucluster-stack)
    hourly: str | None = None  # USD per hour while it exists, where the backend can price it

    def to_dict(self) -> JsonObject:
        """As JSON keeps it: the ownership fields only where they are known."""
        return {k: v for k, v in self.__dict__.items() if v is not None or k in _LEFTOVER_CORE}


_LEFTOVER_CORE = ("kind", "id", "region", "detail", "deleting")


VERIFIED, LEFTOVERS, NOT_VERIFIED = TeardownVerdict.VERIFIED, TeardownVerdict.LEFTOVERS, TeardownVerdict.NOT_VERIFIED
VERDICTS = (VERIFIED, LEFTOVERS, NOT_VERIFIED)
# The start of an unchecked line that no later check can clear: a node whose reaper was killed (or
# whose session was cut) had no witness, and a process the job detached there has nothing left that
# names the run. `down` keeps such lines (and so "not verified") until a person says, with
# `down --ack-unwitnessed`, that they checked those nodes themselves.
UNWITNESSED = "no witness: "


@dataclass(frozen=True)
class Check:
    """The outcome of looking for what a cluster or run left behind, in three states:

    - *verified*: every check ran and found nothing;
    - *leftovers*: something was found (listed), whatever else could not be checked;
    - *not verified*: nothing was found, but at least one check could not run (each listed with why).
    """

    leftovers: tuple[Leftover, ...] = ()
    unchecked: tuple[str, ...] = ()  # one line per check that could not run: "<what>: <why>"
    # found under the same name but not ours to delete (another owner's, a standalone stack's): left
    # alone, said, and no part of the verdict
    not_ours: tuple[Leftover, ...] = ()
    # how the check looked ("by tag", "by run id", "by run label"), as `down` says it: "verified by run id";
    # set by the backend that made it (`Check.of(found, how=...)`), kept by `+` and `with_unchecked`
    how: str = field(default="by tag", compare=False)

    @property
    def verdict(self) -> TeardownVerdict:
        if self.leftovers:
            return LEFTOVERS
        return NOT_VERIFIED if self.unchecked else VERIFIED

    @property
    def verified(self) -> bool:
        return self.verdict == VERIFIED

    @classmethod
    def of(cls, found: "Check | list[Leftover] | tuple[Leftover, ...]", *, how: str | None = None) -> "Check":
        """A Check from a provider's answer; a plain list's Leftover(kind="unverified") entries
        (a host that could not be asked) become unchecked lines, never clean ones. `how`: how it
        looked, when not by tag (a Check given keeps its own otherwise)."""
        if isinstance(found, Check):
            return found if how is None else replace(found, how=how)
        left, unchecked = [], []
        for lo in found:
            if lo.kind == "unverified":
                unchecked.append(f"{lo.id}: {lo.detail or 'could not be checked'}")
            else:
                left.append(lo)
        return cls(tuple(left), tuple(unchecked), how=how or "by tag")

    def __add__(self, other: "Check") -> "Check":
        other = Check.of(other)
        return Check(self.leftovers + other.leftovers, self.unchecked + other.unchecked,
                     self.not_ours + other.not_ours, how=self.how)

    def with_unchecked(self, *lines: str) -> "Check":
        return Check(self.leftovers, self.unchecked + tuple(lines), self.not_ours, how=self.how)

    def to_dict(self) -> JsonObject:
        d: JsonObject = {"verdict": self.verdict, "leftovers": [lo.to_dict() for lo in self.leftovers],
                             "unchecked": list(self.unchecked)}
        if self.not_ours:
            d["not_ours"] = [lo.to_dict() for lo in self.not_ours]
        return d

    def summary(self) -> str:
        """One line: what the verdict rests on."""
        if self.verdict == VERIFIED:
            return "verified: every check ran and found nothing"
        parts = []
        if self.leftovers:
            parts.append(f"{len(self.leftovers)} left: " + ", ".join(f"{lo.kind} {lo.id}" for lo in self.leftovers[:5])
                         + (" ..." if len(self.leftovers) > 5 else ""))
        if self.unchecked:
            parts.append(f"{len(self.unchecked)} check(s) could not run: " + "; ".join(self.unchecked[:3])
                         + (" ..." if len(self.unchecked) > 3 else ""))
        return f"{self.verdict}: " + "; ".join(parts)


class Provider:
    """What a backend's `make()` hands back to provision and check a cluster (the contract is in
    this module's docstring). Subclass it; every optional part has a default here, so callers
    never probe for attributes:

    - `check_is_complete`: True when `leftovers(name, run_id)` sees everything a run could have
      made (local: every process of this machine; ssh: every host the run started on), so a
      failed `down` whose check then finds nothing is still verified.
    - `preflight(spec)`: fail fast before anything is recorded or created (the Pulumi CLI missing,
      the cloud's quota or a dry run of the launch refusing `spec`, ...); it returns the state it
      keeps, as checked (aws/gcp: the Pulumi backend URL), which the ledger row records; None: none.

    Whose resources `down` and `leftovers` may count and delete, and in which account, are given when
    the provider is made (`LaunchOptions.ownership`, `project`: `down`'s scope), not set on it after.
    """

    cloud: str = ""
    check_is_complete: bool = False

    def preflight(self, spec: ClusterSpec | None = None) -> str | None:
        return None

    def up(self, spec: ClusterSpec, events: ProvisionEvents) -> Cluster:
        raise NotImplementedError

    def down(self, name: str, events: ProvisionEvents) -> None:
        raise NotImplementedError

    def leftovers(self, name: str, run_id: str | None = None) -> Check:
        raise NotImplementedError

    def attach(self, name: str) -> Cluster | None:
        """A cluster that is up and kept (`up`, `run --keep`), with what reaching it needs (keys,
        kubeconfig), for `exec` and `ssh`; None when it does not exist. Only backends that create
        clusters keep them: the default has none."""
        return None
