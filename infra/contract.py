"""The backend contract: small typed parts, split by who calls them.

A backend is one package under `infra/` (`infra/local`, `infra/ssh`, `infra/kube`, `infra/aws`, `infra/gcp`).
Its `__init__.py` defines `TRAITS` (a `Traits`: plain values, imports nothing, so `--help` and the
CLI's choice lists cost nothing) and its `plugin.py` defines `PLUGIN`, a `Plugin` whose fields are
its own modules' functions and objects (no wrapper methods). `infra/registry.py` maps names to
packages and is consulted only at the composition roots: once per command in `cli/`, once in the
Pulumi program (`infra/program.py`). Everything below receives the plugin, or the part it needs,
as an argument. Every SDK (boto3, pulumi, kubernetes, google-cloud-*) is imported inside the
function that needs it.

Two bases follow from the data:
  ExistingMachines   machines that already exist (local, ssh, kubernetes): their leftovers are the
                     run's processes (or objects). A new one needs `Traits` (name, max_nodes, flags,
                     flags_refused_why), `Transport.make` and, usually, `SpecRules.validate`.
  CreatedMachines    machines gpucluster creates with Pulumi (aws, gcp): also a `Provisioner`
                     (tag scan and delete for `gc`) and a `Pricing` (price rows, planned resources,
                     price API). Its provisioner is the shared Pulumi engine's `PulumiCloud`
                     (infra/pulumi/cloud.py), which extends the `Provisioner` with what only that
                     engine reads (program, stack outputs, engine events, capacity markers and
                     zones, failure classes, preflight, credentials, scan scope).

Parts and who calls them
  Traits       (cli/, lifecycle)  identity, limits, capabilities (`Capability`: what applies) and
               why other backends' flags are refused here.
  SpecRules    (spec, cli)        options -> the option names it takes; validate -> warnings (SpecError
               names the bad value; ssh: `--hosts`; gcp: the project's form); resolve -> the location
               and defaults really used (a spec without a region is priced where this puts it);
               prepare(spec, *, dry_run) -> values found at run time (aws: the SSH CIDR; gcp: the
               default project; local: this machine's GPUs shared out) and notes; plan_line -> one line of the run's plan; ready_within -> how
               long its nodes may take to be ready, and why; link_gbps -> the bandwidth one flow
               between two nodes of the shape should reach (the health check's expectation);
               gpu_shapes -> the GPU machines it can create.
  Transport    (cli)              make(LaunchOptions) -> (Provider, Launcher); cheap (no SDK, nothing
               asked), so `up`, `down` and `status` take its provider alone.
  Operations   (cli down/status/run/doctor/place)  check_down (down's independent check; the `Check`
               says how it looked), hold (`up` of machines
               that exist: the ready check, once), node_gpu_state (status --gpus), gone_at (status:
               kept nodes that powered off), doctor checks, credentials_found and bucket_facts
               (placement), sweep (`gc` of objects in namespaces the user names), dry_run (what
               `--dry-run` shows, each backend its own way), in_context (`down --context`).
  Provisioner  (gc)               scan, delete, gc_scope. A create that failed for want of capacity
               or quota says so with its error (`ProvisionError.cause`), which placement and recovery
               read. The engine's own hooks are in `PulumiCloud` (infra/pulumi/cloud.py; read by
               infra/pulumi, infra/program.py and infra/leftovers.py only).
  Pricing      (gpucluster.costing, catalog.prices)  price_rows(spec, catalog, region, market,
               free_tier) -> PricedRows (machine, GPU and fee rows, the nodes' disk type, an always-on
               system pool, what the max lifetime leaves billing, notes: returned, never written into
               the core's Plan), instance_price, planned_resources, fetch_prices. The core derives
               the rest: the default region (`resolve`), whether GPUs bill apart (the catalog), an
               unpriced backend's internal price (`pricePerGpuHour` among its options).
  ObjectStore  (staging, cli)     scheme ("s3", "gs"), url(text, what) checked for form, and the
               prefix of the two stack options that carry the scopes (`s3Read`/`s3Write`, lifted into
               `spec.reads/writes`).

What a backend hands back: a `Provider` (gpucluster/domain.py: up, down, leftovers, preflight,
attach; `down`'s scope, whose resources it may delete and in which account, comes in `LaunchOptions`)
and a `Launcher` (gpucluster/watch/launch.py: launch, describe, collect_outputs, leftovers, connect,
ssh_config). A kept cluster of machines that exist says what
it is in its `Cluster` (`kept_as`, `spares`).

A part that does not apply is absent (None); `Traits.capabilities` says which apply (`Plugin.can`).

Adding a backend: docs/backends.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from gpucluster.errors import UsageError

if TYPE_CHECKING:
    from gpucluster.catalog.prices import Catalog, PriceRow
    from gpucluster.domain import Check, Cluster, Leftover, Provider
    from gpucluster.ownership import Ownership
    from gpucluster.watch.launch import Launcher
    from gpucluster.spec import ClusterSpec
    from gpucluster.infra.leftovers import ScanReport

Record = Mapping[str, object]  # a ledger row or run record, as read from the ledger


class Capability(enum.Enum):
    PROVISIONS = "provisions"  # creates billable resources with Pulumi: stacks, up/down/gc, tag scans
    PRICED = "priced"  # runs cost money the price catalog knows
    OBJECT_STORE = "object-store"  # its nodes read and write an object store themselves
    # `--gpu TYPE[:COUNT]` where no machine is created: COUNT GPUs per node, on the nodes that carry TYPE
    # (kubernetes: by their GPU feature discovery labels); without it (or PROVISIONS) `--gpu` is refused
    GPU_SELECTS_NODES = "gpu-selects-nodes"
    # its nodes share GPUs it knows before anything exists (local: this machine's): its `SpecRules.prepare`
    # shares them out when --gpus-per-node is not given, so a spec of one node gets them all (`sweep` asks so)
    SHARES_GPUS = "shares-gpus"


@dataclass(frozen=True)
class Traits:
    """Plain facts about a backend, importable for free (`--help`, choice lists, flag checks)."""

    name: str  # the `--cloud` value
    max_nodes: int  # the largest `--nodes` accepted
    flags: tuple[str, ...] = ()  # the cloud-only CLI options (Click names) it uses; others are refused
    flags_refused_why: str = ""  # why the other backends' flags do not apply here
    capabilities: frozenset[Capability] = frozenset()

    def can(self, capability: Capability) -> bool:
        return capability in self.capabilities


@dataclass(frozen=True)
class LaunchOptions:
    """What the CLI passes to `Transport.make`; each backend reads the ones it uses."""

    identity: str | None = None  # ssh, aws
    known_hosts: str | None = None  # ssh
    remote_python: str | None = None  # ssh, aws
    python: str | None = None  # local: the Python every node runs
    ready_timeout: float | None = None  # aws
    start_deadline_s: float | None = None  # gcp
    spec_options: Mapping[str, str] = field(default_factory=dict)  # gcp: launcher, image, namespace
    # `down`'s scope (aws, gcp: the Pulumi engine's provider): whose resources its delete and leftover scan
    # may count and delete (None: this home's owner), and the account they live in (`down --project`)
    ownership: Ownership | None = None
    project: str | None = None


@dataclass(frozen=True)
class ScanScope:
    """Where a leftover scan looks: aws regions, a gcp project, the owner of the global resources;
    `clients` are injected SDK clients."""

    regions: tuple[str, ...] = ()
    project: str | None = None
    clients: Mapping[str, object] = field(default_factory=dict)
    # whose global resources (IAM roles, instance profiles, service accounts) are listed: this owner
    # id's, found by owner and cluster; None: every owner's (`--any-owner`), still by region/cluster
    owner: str | None = None


def _no_warnings(spec: ClusterSpec) -> list[str]:
    return []


def _unchanged(spec: ClusterSpec) -> ClusterSpec:
    return spec


def _nothing_found(spec: ClusterSpec, **kw: object) -> tuple[ClusterSpec, list[str]]:
    return spec, []


def _no_line(spec: ClusterSpec, nproc_per_node: int, hourly: Decimal | None) -> str | None:
    return None


def _no_ready_bound(spec: ClusterSpec) -> tuple[int, str] | None:
    return None


def _no_shapes() -> list[dict[str, object]]:
    return []


def _no_link(spec: ClusterSpec) -> float | None:
    return None


@dataclass(frozen=True)
class SpecRules:
    # the options (`--option K=V`, stack keys `gpucluster:K`) it takes, each in its one spelling
    # (the other spelling, camelCase or snake_case, is accepted as input: `gpucluster.spec.normalize`)
    options: tuple[str, ...] = ()
    validate: Callable[[ClusterSpec], list[str]] = _no_warnings
    resolve: Callable[[ClusterSpec], ClusterSpec] = _unchanged
    # (spec, *, dry_run=False, detect=...): values found at run time (aws: the SSH CIDR; gcp: the project, from
    # --project, the environment, gcloud's config or the credentials; required but in a dry run) and notes;
    # detect=None: find nothing, the spec as given (a dry run after a failed detection, `doctor`)
    prepare: Callable[..., tuple[ClusterSpec, list[str]]] = _nothing_found
    plan_line: Callable[[ClusterSpec, int, Decimal | None], str | None] = _no_line
    # (spec) -> (seconds its nodes may need to be ready, why), from the node's own bounds; None: none
    ready_within: Callable[[ClusterSpec], tuple[int, str] | None] = _no_ready_bound
    # the bandwidth (Gbit/s) one flow between two of the shape's nodes should reach; the health
    # check's expectation for every node pair (None: unknown, not judged)
    link_gbps: Callable[[ClusterSpec], float | None] = _no_link
    # the machines it can create that carry GPUs, each {"machine", "gpu", "gpus", "regions", "on_demand"} and,
    # where a cluster is placed in one zone (gcp), "zones": what `--gpu` chooses among, `gpucluster gpus` lists
    # and placement makes its candidates of (none: a backend that creates no machines)
    gpu_shapes: Callable[[], list[dict[str, object]]] = _no_shapes


@dataclass(frozen=True)
class Transport:
    # (options) -> (Provider, Launcher); cheap (no SDK imported, nothing asked), so `up`, `down` and `status`
    # take its provider alone
    make: Callable[[LaunchOptions], tuple[Provider, Launcher]]


def _check_by_tag(provider: Provider, name: str, runs: Mapping[str, Record]) -> Check:
    from gpucluster.domain import Check

    return Check.of(provider.leftovers(name))


def _no_doctor(region: str | None, project: str | None, sole: bool, **shape: object) -> list[dict[str, object]]:
    return []


@dataclass(frozen=True)
class Operations:
    # down's independent check after deleting cluster `name`; runs: run id -> its ledger record. The Check says
    # how it looked (`Check.how`, said as "verified by run id"): by tag unless the backend's check names another way
    check_down: Callable[[Provider, str, Mapping[str, Record]], Check] = _check_by_tag
    node_gpu_state: Callable[[Provider, str], list[dict[str, object]]] | None = None
    # (region, project, sole, *, nodes=None, instance_type=None, spot=False): checks with a fix each
    doctor: Callable[..., list[dict[str, object]]] = _no_doctor
    # (open ledger rows of a kept cluster, its max lifetime in minutes) -> {row id: (when its resource stopped
    # billing, how that is known)} for those the cloud says are gone (aws: instances the dead-man switch
    # powered off); `status` closes those rows there. None: not asked
    gone_at: Callable[[Sequence[Record], int | None], dict[int, tuple[float, str]]] | None = None
    # () -> None when credentials are found on this machine, else what was looked for; asks no API (it
    # may read files, the environment and a metadata server): which clouds `--cloud auto` places on
    credentials_found: Callable[[], str | None] | None = None
    # (a bucket URL of its object store) -> (the bucket's region, bytes under the URL, None when not counted); a
    # GpuclusterError says why it could not be read: what placement prices egress with (gpucluster.plan.egress)
    bucket_facts: Callable[[str], tuple[str | None, int | None]] | None = None
    # `gc` of a backend whose objects live in namespaces the user names (kubernetes): (context, namespace, owner,
    # remove) -> (ours still there, other owners' objects, errors); ours are deleted first with `remove`
    sweep: Callable[[str | None, str, str, bool], tuple[list[Leftover], list[Leftover], list[str]]] | None = None
    # `--dry-run`: (spec, job or None, launcher or None) -> what `up`/`run` would create, reaching nothing and
    # needing no credentials (aws, gcp: the real Pulumi program under Pulumi's mock runtime; kubernetes: the
    # manifests, and the checks a real run makes that were skipped); with a "text" entry it renders itself.
    # None: `--dry-run` is refused for this backend
    dry_run: Callable[[ClusterSpec, object, object], dict[str, object]] | None = None
    # a kept cluster of machines that exist (`up --cloud ssh`): (launcher, cluster) -> {rank: what to record with
    # the machine's `host` row}, each machine asked once whether it is ready (a LaunchError naming those that are
    # not); None: `up` is not offered on this backend (`gpucluster.lifecycle.held`)
    hold: Callable[[Launcher, Cluster], dict[int, dict[str, object]]] | None = None
    # `down NAME --context C` of a backend whose runs name a kubeconfig context (kubernetes): (C, run id -> the
    # cluster's run records) -> (the records to check, each pointed at C where the context it names is gone from
    # the kubeconfig; what was done, said); a UsageError (exit 2) when C is not a context, or a run names another
    # that still exists. None: `--context` is refused for this backend's clusters
    in_context: Callable[[str, Mapping[str, Record]], tuple[dict[str, Record], list[str]]] | None = None


@dataclass(frozen=True)
class Provisioner:
    """What the core asks of a backend that creates machines: `gc`'s scan and delete of what is tagged as
    ours (gpucluster.lifecycle.teardown). A create that failed for want of capacity or quota says so with
    the error it raises (`ProvisionError.cause`; placement and recovery read it). Everything the shared
    Pulumi engine alone reads (the program, stack outputs, engine events, capacity markers and zones,
    terminate, relaunch) is its own contract: `gpucluster.infra.pulumi.cloud.PulumiCloud`, which extends
    this part."""

    scan: Callable[[str | None, str | None, ScanScope], ScanReport]
    delete: Callable[[Sequence[Leftover], ScanScope, float | None], list[str]]  # wait seconds
    gc_scope: Callable[[Sequence[Record], Sequence[Record], tuple[str, ...], str | None], ScanScope]


@dataclass
class PricedRows:
    """What `Pricing.price_rows` returns for a resolved spec; the core puts it into its `Plan`."""

    machine: PriceRow  # instance row (derived for shapes priced from unit prices)
    disk_type: str = ""  # the nodes' disks, priced by the core: the spec's type, else the backend's default
    gpus_per_node: int = 0
    gpu_name: str | None = None
    gpu: PriceRow | None = None  # per-GPU row, where GPUs are billed apart from the instance
    fee: PriceRow | None = None
    zonal: bool = False
    free_tier: bool = False
    system_unpriced: bool = False
    idle_nodes: int = 0  # GPU nodes that keep billing after the job ends (a fixed-size pool, its minimum)
    notes: list[str] = field(default_factory=list)
    # an always-on pool of CPU nodes beside the GPU nodes (GKE: the system pool), as its `node-pool` ledger detail
    # (machine_type, disk_type, ...): priced into the run's snapshot; with the fee it bills on when the GPU
    # nodes are gone (`status` of a kept cluster with an idle stop says so)
    system_pool: dict[str, object] | None = None
    # what the max lifetime leaves billing, said with an estimate, to which the core adds the hourly figure of what
    # still bills (the fee, the system pool, idle GPU nodes) and "until `gpucluster down`"; "" for nothing (gcp:
    # "after the max lifetime the Job stops and the GPU pool scales to zero; the cluster fee and the system pool
    # keep billing")
    after_lifetime: str = ""


@dataclass(frozen=True)
class Pricing:
    # (spec, catalog, region, market, free_tier) -> machine, GPU and fee rows and notes
    price_rows: Callable[[ClusterSpec, Catalog, str, str, bool | None], PricedRows]
    instance_price: Callable[[Catalog, str, str, str], PriceRow]  # (catalog, region, item, market)
    # the ledger resource rows ({kind, name, detail}) a run of the resolved spec records
    planned_resources: Callable[[ClusterSpec, str, Catalog | None], list[dict[str, object]]]
    fetch_prices: Callable[..., list[PriceRow]]  # (catalog, *, regions, date, **clients)


@dataclass(frozen=True)
class ObjectStore:
    scheme: str
    url: Callable[[str, str], str]  # (text, what) -> normalized URL; UsageError starting with `what`
    # the stack options (JSON lists of URLs) that set `spec.reads` and `spec.writes` are this prefix's `Read` and
    # `Write` ("s3": s3Read, s3Write; "gcs": gcsRead, gcsWrite)
    option_prefix: str

    @property
    def scope_options(self) -> tuple[str, str]:
        """(the option that sets `spec.reads`, the one that sets `spec.writes`)."""
        return f"{self.option_prefix}Read", f"{self.option_prefix}Write"


@dataclass(frozen=True, kw_only=True)
class Plugin:
    """One backend: its traits and its parts. Build it with `ExistingMachines` or `CreatedMachines`."""

    traits: Traits
    transport: Transport
    spec: SpecRules = SpecRules()
    ops: Operations = Operations()
    provisioner: Provisioner | None = None
    pricing: Pricing | None = None
    objects: ObjectStore | None = None

    @property
    def name(self) -> str:
        return self.traits.name

    def can(self, capability: Capability) -> bool:
        return self.traits.can(capability)

    @property
    def object_store(self) -> str | None:
        """The URL scheme its nodes read and write (`--data`, `--output`), or None."""
        return self.objects.scheme if self.objects is not None else None

    # -- the "not applicable" answers, in one place ------------------------------------------------
    def object_url(self, text: str, what: str) -> str:
        if self.objects is None:
            raise UsageError(f"{what} is not supported with --cloud {self.name}")
        return self.objects.url(text, what)

    def with_object_access(self, spec: ClusterSpec, reads: Sequence[str] = (),
                           writes: Sequence[str] = ()) -> ClusterSpec:
        if self.objects is not None:
            return spec.replace(reads=tuple(sorted(set(reads))), writes=tuple(sorted(set(writes))))
        if reads or writes:
            raise UsageError(f"--cloud {self.name} nodes cannot read or write object storage")
        return spec

    def needs_provisioner(self) -> Provisioner:
        if self.provisioner is None:
            raise UsageError(f"--cloud {self.name} has no Pulumi program (it creates nothing; use `gpucluster run`)")
        return self.provisioner

    def needs_pricing(self) -> Pricing:
        if self.pricing is None:
            raise UsageError(f"--cloud {self.name} runs are not priced (they cost $0)")
        return self.pricing


@dataclass(frozen=True, kw_only=True)
class ExistingMachines(Plugin):
    """Machines that exist (local, ssh): nothing provisioned, nothing priced."""

    def __post_init__(self) -> None:
        assert Capability.PROVISIONS not in self.traits.capabilities, self.traits.name


@dataclass(frozen=True, kw_only=True)
class CreatedMachines(Plugin):
    """Machines gpucluster creates with Pulumi (aws, gcp): a provisioner and pricing are required."""

    provisioner: Provisioner
    pricing: Pricing

    def __post_init__(self) -> None:
        assert {Capability.PROVISIONS, Capability.PRICED} <= self.traits.capabilities, self.traits.name
