"""The Pulumi engine's contract: what a backend that provisions with Pulumi (aws, gcp) gives the engine.

`PulumiCloud` extends the core's `Provisioner` (`gpucluster.infra.contract`: `gc`'s scan and delete, the
capacity and quota markers placement fails over on) with the hooks only this engine reads: the ONE
program (`infra/program.py`: `declare`, `region_config`), the `PulumiProvider` (stack outputs, capacity
retries, preflight, credentials, terminate, where a cluster's scan looks), the driver and its event
bridge (`pulumi_kinds`, `resource_detail`, `classify_failure`, `relaunch`), and the leftovers module
(`leftover_kinds`). Nothing in `gpucluster/` (outside `gpucluster.infra`), `cli/` or `api/` reads these
hooks: they ask the engine (`PulumiProvider`, `plugins_needed`, `infra.program`). A backend sets its
`PulumiCloud` as its plugin's `provisioner`; the engine finds it with `pulumi_cloud(plugin)`.

Plain values and functions only: importing this module imports no SDK (pulumi is imported inside the
functions that need it)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Mapping, Sequence

from gpucluster.errors import GpuclusterError, MissingDependency, UsageError
from gpucluster.infra.contract import Provisioner, Record, ScanScope

if TYPE_CHECKING:
    from gpucluster.domain import Cluster, Leftover
    from gpucluster.infra.contract import Plugin
    from gpucluster.spec import ClusterSpec


def _no_failure_class(spec: ClusterSpec, text: str) -> GpuclusterError | None:
    return None


def _no_scope(recorded: Record | None) -> ScanScope:
    return ScanScope()


@dataclass(frozen=True, kw_only=True)
class PulumiCloud(Provisioner):
    declare: Callable[[ClusterSpec], Mapping[str, object]]  # inside the ONE Pulumi program
    cluster_from_outputs: Callable[[Mapping[str, object]], Cluster]
    pulumi_kinds: Mapping[str, str]  # Pulumi type token -> ledger resource kind
    resource_detail: Callable[[str, Mapping[str, object], ClusterSpec], dict[str, object]]
    leftover_kinds: tuple[str, ...]  # what its tag scan reports, in deletion order
    plugins: tuple[str, ...] = ()  # Pulumi plugins its program needs (doctor)
    # the Pulumi config namespace whose `region` is a stack's default region (aws: `aws:region`), or None
    region_config: str | None = None
    # (recorded spec) -> where a leftover scan of the cluster looks (aws: its region; gcp: its project)
    scan_scope: Callable[[Record | None], ScanScope] = _no_scope
    # (region) -> the credential checks alone, in that region (aws: STS there), asked before anything
    # is recorded by commands that have no spec to preflight (`down`); None: the doctor's checks
    credentials: Callable[[str | None], list[dict[str, object]]] | None = None
    # substrings of a failed update's text meaning "no capacity there": the engine raises a `CapacityError`
    # (cause "capacity") naming the zone and the next ones (`capacity_zones`); a quota too low is the
    # `classify_failure` error whose `cause` is "quota" (aws: failures.QUOTA_CODES; gcp: access.QuotaError)
    capacity_markers: tuple[str, ...] = ()
    capacity_zones: Callable[..., tuple[str | None, list[str], str]] | None = None  # (spec, text, lister)
    capacity_attempts: int = 1  # placements `up` tries when capacity runs out
    # why the spec's zone cannot change (aws: option subnetId, whose subnet is in one zone), or None:
    # then a capacity error tries no other zone and its hint says so, instead of "retrying" the same zone
    zone_pinned: Callable[[ClusterSpec], str | None] | None = None
    classify_failure: Callable[[ClusterSpec, str], GpuclusterError | None] = _no_failure_class
    # the spec checked against the cloud before anything is recorded or created (aws: credentials, the
    # vCPU quota, IAM permissions, the AMI and a RunInstances dry run, all in the spec's region); raises
    # a UsageError (exit 2) with the fix. It checks the credentials itself, first: given a spec, the
    # provider asks nothing else (no second credential check in a default region)
    preflight: Callable[[ClusterSpec], None] | None = None
    # what the cluster needs inside it once the stack is up, through the cluster's own API (gcp: the idle
    # stop's watcher, infra/gcp/idle.py); an error fails `up`, whose teardown then removes the stack
    after_up: Callable[[ClusterSpec, Cluster, object], None] | None = None
    # the machines `down` stops first and waits for, before the stack is destroyed: leftover kinds, and
    # how to ask the cloud to stop them (no wait; the errors). aws: the fleet's instances, which an
    # instant fleet's delete does not wait for while EC2 refuses to delete their placement group, security
    # group and subnet until they are terminated (infra/aws/leftovers.py `terminate_in`)
    terminate_kinds: tuple[str, ...] = ()
    terminate: Callable[[Sequence[Leftover], ScanScope], list[str]] | None = None
    # a launch the cloud refuses only for a while (aws: a new instance profile IAM has not yet propagated to
    # EC2): (spec, failure text) -> (the Pulumi type token of what to launch again, why), or None. `up` then
    # replaces that resource alone (`pulumi up --replace`) after each of `relaunch_delays` seconds, keeping
    # the rest (a new profile would meet the same wait), before it fails as any other failed `up`
    relaunch: Callable[[ClusterSpec, str], tuple[str | None, str] | None] | None = None
    relaunch_delays: tuple[float, ...] = ()


@contextmanager
def sdk_needed(what: str, cloud: str) -> Iterator[None]:
    """A module of the cloud's extra (pulumi, its providers) missing inside: a MissingDependency naming it."""
    try:
        yield
    except ModuleNotFoundError as exc:
        raise MissingDependency(f"{what} needs {exc.name} (pip install -e '.[{cloud}]')") from None


def pulumi_cloud(plugin: Plugin) -> PulumiCloud:
    """The backend's `PulumiCloud` (its plugin's provisioner), or a UsageError for one that has no Pulumi program."""
    provisioner = plugin.needs_provisioner()
    if not isinstance(provisioner, PulumiCloud):
        raise UsageError(f"--cloud {plugin.name} has no Pulumi program")
    return provisioner


def plugins_needed(plugins: Iterable[Plugin]) -> list[str]:
    """The Pulumi plugins the programs of `plugins` need (`gpucluster doctor`)."""
    return sorted({p for plugin in plugins if isinstance(plugin.provisioner, PulumiCloud)
                   for p in plugin.provisioner.plugins})
