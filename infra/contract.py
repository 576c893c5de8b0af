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

Launch transport
  make(**options) -> (provider, launcher)   the `Provider` (see `gpucluster.domain`) and the
                                        launcher that runs torchrun on its nodes.

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

Doctor checks
  doctor(**kw) -> [DoctorCheck]         credentials, quotas, tools, each with a fix.

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

    # -- launch transport ------------------------------------------------------------------------
    def make(self, **options: Any) -> tuple[Any, Any]:
        raise NotImplementedError(f"backend {self.name!r} defines no provider and launcher")

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
