"""The backend contract, written once: what a cloud (or a set of machines) implements.

A backend is one package under `infra/` (`infra/local`, `infra/ssh`, `infra/aws`, `infra/gcp`)
whose `__init__.py` defines `BACKEND`, an instance of a `Backend` subclass, and imports nothing
heavy: every SDK (boto3, pulumi, kubernetes, google-cloud-*) is imported inside the hook that
needs it. `infra/registry.py` maps names to packages; nothing outside the backend packages and
the registry compares a cloud's name. The core reaches a backend only through these hooks;
attributes are plain values, hooks are methods, and every hook a shared module calls is listed
here with a default that says "not applicable", so nothing is found by `getattr` probing.

Identity and limits
  name              the `--cloud` value.
  max_nodes         the largest `--nodes` accepted.
  provisions        True when the backend creates billable cloud resources with Pulumi (one stack
                    per cluster, `up`/`down`/`gc`, tag scans, prices); False for machines that
                    already exist (local, ssh): their leftovers are the run's processes.
  resource_kinds    the ledger's resource kinds it records (instance, node-pool, process, ...).
  priced            True when runs on it cost money the price catalog knows.

Spec validation against its catalog
  validate_spec(spec) -> [warnings]     raise `SpecError` naming the bad value and what is allowed.
  resolve(spec) -> spec                 the location and defaults really used (region, zone), filled
                                        in once before the ledger row is written.
  prepare_spec(spec, **kw) -> (spec, notes)   before the plan is shown: values found at run time
                                        (aws: the SSH CIDR from this machine's public IPv4).
  plan_line(spec, nproc_per_node, hourly) -> str | None   one line for the run's plan.
  scan_scope(spec_dict) -> dict         where a leftover scan of this cluster looks (aws: its
                                        region; gcp: its project), from the recorded spec.

Provisioning (backends with `provisions`)
  declare(spec) -> outputs              the Pulumi component, called inside the ONE Pulumi program
                                        (`infra/program.py`); returns the stack outputs.
  cluster_from_outputs(outputs) -> Cluster   stack outputs (secrets included) -> nodes, head first.
  dry_run(spec, **kw) -> dict           what `up`/`run` would declare, under Pulumi's mock runtime.
  capacity_attempts                     how many placements `up` tries when capacity runs out.

Account scope (backends whose resources live in a named account, e.g. a GCP project)
  with_project(spec, project, required) -> spec   the spec with the project it is made in,
                                        resolved once (flag, spec option, environment, the SDK's
                                        defaults) and stored in its options, so the program, the
                                        scan and the ledger use the same one. Default: unchanged.
  parse_project(text) -> str            a `--project` value checked for form (`down`, `cost
                                        report`); the default refuses it.

Launch transport
  make(**options) -> (provider, launcher)   the `Provider` (see `gpucluster.domain`) and the
                                        launcher that runs torchrun on its nodes.

Object storage (`--data URL[:DEST]`, `--output URL`: the nodes read and write it themselves)
  object_store                          the URL scheme its nodes read and write with their own
                                        credentials, granted by its component ("s3"), or None
                                        (default: such URLs are refused, exit 2).
  object_url(text, what) -> str         a URL of that scheme checked for form (bucket naming
                                        rules) and normalized; UsageError starting with `what`.
  with_object_access(spec, reads, writes) -> spec   the spec carrying the URLs the nodes may read
                                        and write, for the component to grant exactly those.

Leftover scan (backends with `provisions`)
  scan(name, run_id, **scope) -> ScanReport   resources tagged managed-by=gpucluster (and the
                                        cluster / run), and each check that could not run.
  delete(leftovers, **kw) -> [errors]   delete what a scan found, waiting until it is gone.

Pulumi engine and leftovers: infra internals (backends with `provisions`)
  pulumi_kinds                          {Pulumi type token: ledger resource kind} for the resources
                                        that exist in the cloud (and may bill or block a later
                                        delete); events of other types are not recorded. Default {}.
  resource_detail(kind, inputs, spec) -> dict   what the cost code needs about a requested resource
                                        of one of its kinds, from its Pulumi inputs, else from the
                                        spec. Default {}.
  capacity_markers                      substrings of an error that mean "no capacity in that zone".
                                        Default () (never a capacity error).
  capacity_zones(spec, text, zone_lister) -> (zone, suggested, what)   for a capacity failure: the
                                        zone that failed, the next zones to try (best first) and what
                                        could not be placed ("g5.xlarge"). `zone_lister(region, type)`
                                        is injectable (aws: DescribeInstanceTypeOfferings).
  classify_failure(spec, text) -> GpuclusterError | None   a more precise error for a failed `up`
                                        (gcp: a quota error naming the quota and other regions).
                                        Default None.
  leftover_kinds                        the kinds its tag scan reports and its `delete` handles, in
                                        deletion order. Default ().

Prices (backends with `priced`)
  fetch_prices(catalog, **kw) -> [PriceRow]   current prices from the cloud's price API.
  system_pool(spec) -> dict | None      a pool that bills for as long as the cluster exists,
                                        whatever the job does (gcp: GKE's system node pool).

Cost engine (backends with `priced`; `gpucluster.costing` calls these, never a cloud's name)
  default_region                        the region an estimate prices when the spec names none
                                        (aws: us-east-1; gcp: us-central1); also where a disk
                                        price missing in a region is borrowed from.
  default_disk_type                     the disk priced when the spec names none (gp3, pd-balanced).
  gpus_billed_apart                     True when an instance's GPUs are billed per GPU-hour apart
                                        from it (GCE); False when they are in its price (EC2).
  provider_region_config                the Pulumi config namespace whose `region` key is the
                                        default region of a stack (aws: "aws"), or None.
  price_plan(spec, catalog, plan, free_tier)   fill in a `costing.plan.Plan`'s machine, GPU and
                                        fee rows (and notes) for a resolved spec; UsageError for a
                                        shape that cannot be priced.
  instance_price(catalog, region, item, market) -> PriceRow   the hourly row of an instance type
                                        (gcp: named N1 rows, else derived from vCPU + memory).
  planned_resources(spec, region, catalog) -> [dict]   the ledger resource rows ({kind, name,
                                        detail}) a run of the resolved spec records: what an
                                        estimate costs.
  estimate_notes(plan, always_on_hourly) -> [str]   notes an estimate adds (gcp: what keeps
                                        billing after the max lifetime; the GKE free tier).
  gpu_of(instance_type, catalog) -> str | None   the GPU an instance type carries (aws: A10G),
                                        None where the spec's accelerator says it.

Doctor checks
  doctor(**kw) -> [DoctorCheck]         credentials, quotas, tools, each with a fix.

CLI and run lifecycle (what `gpucluster run/up/down/gc/doctor/status` ask of a backend)
  flags                 the cloud-only CLI options (Click parameter names) this backend uses; a
                        flag that some other backend lists and this one does not is refused
                        (exit 2) rather than silently ignored. Default: none.
  flags_refused_why     why those other flags do not apply here (said in the refusal).
  verified_how          how `down` checks a teardown ("by tag" / "by run id").
  verified_detail       what a verified teardown rests on, in the run report.
  pulumi_plugins        Pulumi plugins its program needs (doctor notes the missing ones).
  host_list(text) -> hosts      `--hosts` parsed (ssh); raise `UsageError` when the backend needs
                        hosts and none are given. Default: no hosts, ().
  known_gpus() -> int | None    GPUs a node has, when known before anything exists (local: this
                        machine's). Default: None (unknown until provisioned).
  provider(**options) -> Provider   the provider alone (`up`, `down`, `status`). Default: make()'s.
  check_down(provider, name, runs) -> Check   `down`'s independent check after deleting cluster
                        `name`; `runs`: run id -> ledger record of the runs that had open rows.
                        Default: the provider's leftover check of the whole cluster (by tag).
  node_gpu_state(provider, name) -> [dict]   per-node GPU state of a live cluster (`status
                        --gpus`). Default: one {"note"} saying it is not available.
  gc_scope(open_rows, runs, **flags) -> dict   where `gc` scans (scan()'s scope) from the ledger's
                        open resource rows and runs of this backend and gc's --region/--project.
  gc_label(scope) -> str        the scope in gc's verdict line (aws: "aws us-east-1").

Adding a backend: docs/backends.md.
"""

from __future__ import annotations

from typing import Any

from gpucluster.errors import UsageError


class Backend:
    """Defaults for every hook: a backend overrides what applies to it."""

    name: str = ""
    max_nodes: int = 64
    provisions: bool = False
    priced: bool = False
    resource_kinds: tuple[str, ...] = ()
    capacity_attempts: int = 1

    # -- spec ------------------------------------------------------------------------------------
    def validate_spec(self, spec: Any) -> list[str]:
        return []

    def resolve(self, spec: Any) -> Any:
        return spec

    def prepare_spec(self, spec: Any, **kw: Any) -> tuple[Any, list[str]]:
        return spec, []

    def plan_line(self, spec: Any, nproc_per_node: int, hourly: Any = None) -> str | None:
        return None

    def scan_scope(self, spec: dict[str, Any] | None) -> dict[str, Any]:
        return {}

    # -- provisioning ----------------------------------------------------------------------------
    def declare(self, spec: Any) -> dict[str, Any]:
        raise UsageError(f"--cloud {self.name} has no Pulumi program (it creates nothing; use `gpucluster run`)")

    def cluster_from_outputs(self, outputs: dict[str, Any]) -> Any:
        raise UsageError(f"--cloud {self.name} has no stack outputs")

    def dry_run(self, spec: Any, **kw: Any) -> dict[str, Any]:
        raise UsageError(f"--dry-run is not available for --cloud {self.name}")

    # -- account scope ---------------------------------------------------------------------------
    def with_project(self, spec: Any, project: str | None = None, *, required: bool = True) -> Any:
        if project:
            raise UsageError(f"--project {project} is not allowed with --cloud {self.name}")
        return spec

    def parse_project(self, text: str) -> str:
        raise UsageError(f"--project {text} is not allowed with --cloud {self.name}")

    # -- launch transport ------------------------------------------------------------------------
    def make(self, **options: Any) -> tuple[Any, Any]:
        raise NotImplementedError(f"backend {self.name!r} defines no provider and launcher")

    # -- object storage --------------------------------------------------------------------------
    object_store: str | None = None

    def object_url(self, text: str, what: str) -> str:
        raise UsageError(f"{what} is not supported with --cloud {self.name}")

    def with_object_access(self, spec: Any, reads: Any = (), writes: Any = ()) -> Any:
        if reads or writes:
            raise UsageError(f"--cloud {self.name} nodes cannot read or write object storage")
        return spec

    # -- leftovers -------------------------------------------------------------------------------
    def scan(self, name: str | None = None, run_id: str | None = None, **scope: Any) -> Any:
        raise UsageError(f"--cloud {self.name} has no tag scan: its leftovers are the run's processes")

    def delete(self, leftovers: list[Any], **kw: Any) -> list[str]:
        return [f"{lo.kind} {lo.id}: --cloud {self.name} cannot delete by tag" for lo in leftovers]

    # -- prices and doctor -----------------------------------------------------------------------
    def fetch_prices(self, catalog: Any, **kw: Any) -> list[Any]:
        raise UsageError(f"--cloud {self.name} has no price API (runs on it are not priced)")

    def system_pool(self, spec: Any) -> dict[str, Any] | None:
        return None

    def doctor(self, **kw: Any) -> list[Any]:
        return []

    # -- cost engine (h-cost: gpucluster.costing) ------------------------------------------------
    default_region: str | None = None
    default_disk_type: str | None = None
    gpus_billed_apart: bool = False
    provider_region_config: str | None = None

    def price_plan(self, spec: Any, catalog: Any, plan: Any, free_tier: bool | None = None) -> None:
        raise UsageError(f"--cloud {self.name} runs are not priced (they cost $0)")

    def instance_price(self, catalog: Any, region: str, item: str, market: str) -> Any:
        return catalog.get(self.name, region, "instance", item, market)

    def planned_resources(self, spec: Any, region: str, catalog: Any = None) -> list[dict[str, Any]]:
        return []

    def estimate_notes(self, plan: Any, always_on_hourly: Any) -> list[str]:
        return []

    def gpu_of(self, instance_type: str, catalog: Any) -> str | None:
        return None

    # -- CLI and run lifecycle (h-cli) -----------------------------------------------------------
    flags: tuple[str, ...] = ()
    flags_refused_why: str = ""
    verified_how: str = "by tag"
    verified_detail: str = "every check by tag found nothing"
    pulumi_plugins: tuple[str, ...] = ()

    def host_list(self, text: str | None) -> tuple[str, ...]:
        return ()

    def known_gpus(self) -> int | None:
        return None

    def provider(self, **options: Any) -> Any:
        return self.make(**options)[0]

    def check_down(self, provider: Any, name: str, runs: dict[str, dict[str, Any]]) -> Any:
        from gpucluster.domain import Check

        return Check.of(provider.leftovers(name))

    def node_gpu_state(self, provider: Any, name: str) -> list[dict[str, Any]]:
        return [{"note": f"per-node GPU state is read over ssh; not available for {self.name} clusters"}]

    def gc_scope(self, open_rows: list[dict[str, Any]], runs: list[dict[str, Any]], **flags: Any) -> dict[str, Any]:
        return {}

    def gc_label(self, scope: dict[str, Any]) -> str:
        return self.name

    # -- infra internals: Pulumi engine events, capacity, failures, leftover kinds ----------------
    pulumi_kinds: dict[str, str] = {}
    capacity_markers: tuple[str, ...] = ()
    leftover_kinds: tuple[str, ...] = ()

    def resource_detail(self, kind: str, inputs: Any, spec: Any) -> dict[str, Any]:
        return {}

    def capacity_zones(self, spec: Any, text: str, zone_lister: Any = None) -> tuple[str | None, list[str], str]:
        return getattr(spec, "zone", None), [], "the request"

    def classify_failure(self, spec: Any, text: str) -> Any:
        return None
