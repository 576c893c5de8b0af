"""The `gcp` backend: a GKE cluster with a V100 node pool (GKE installs the driver) made by
Pulumi; jobs run as a Kubernetes Indexed Job + headless Service (or a Kubeflow PyTorchJob).

Contract: `gpucluster.infra.contract`. Modules: catalog (zones, machine types, spec checks),
component (the Pulumi component), access (project and credentials), k8s (the launcher),
dryrun (the program under Pulumi's mock runtime, for --dry-run)."""

from __future__ import annotations

from typing import Any

from gpucluster.infra.contract import Backend

from .engine import CAPACITY_MARKERS, PULUMI_KINDS


class GcpBackend(Backend):
    name = "gcp"
    max_nodes = 64
    provisions = True
    priced = True
    resource_kinds = ("gke-cluster", "node-pool", "network", "subnetwork", "firewall", "service-account")
    leftover_kinds = ("gke-cluster",)  # what the tag scan reports (node pools go with their cluster)

    def validate_spec(self, spec: Any) -> list[str]:
        from .catalog import validate_spec

        return validate_spec(spec)

    def resolve(self, spec: Any) -> Any:
        from .catalog import resolve

        return resolve(spec)

    def system_pool(self, spec: Any) -> dict[str, Any] | None:
        from .catalog import system_pool

        return system_pool(spec)

    def with_project(self, spec: Any, project: str | None = None, *, required: bool = True) -> Any:
        from .access import spec_with_project

        return spec_with_project(spec, project, required=required)

    def parse_project(self, text: str) -> str:
        from .access import resolve_project

        return resolve_project(text, None, env={})[0]  # checks the ID's form

    def scan_scope(self, spec: dict[str, Any] | None) -> dict[str, Any]:
        spec = spec or {}
        project = spec.get("project") or dict(spec.get("options") or {}).get("project")
        return {"project": project} if project else {}

    def declare(self, spec: Any) -> dict[str, Any]:
        from .component import declare

        return declare(spec)

    def cluster_from_outputs(self, outputs: dict[str, Any]) -> Any:
        from .component import cluster_from_outputs

        return cluster_from_outputs(outputs)

    def dry_run(self, spec: Any, **kw: Any) -> dict[str, Any]:
        from .dryrun import dry_run

        return dry_run(spec, **kw)

    def make(self, **options: Any) -> tuple[Any, Any]:
        from gpucluster.infra.pulumi_provider import PulumiProvider

        from .gcs import GcsTransfer
        from .k8s import KubernetesLauncher

        kw: dict[str, Any] = {"objects": GcsTransfer()}  # gs:// read and written by the pods themselves
        if options.get("start_deadline_s"):
            kw["start_deadline_s"] = options["start_deadline_s"]
        return PulumiProvider("gcp"), KubernetesLauncher.from_options(options.get("spec_options") or {}, **kw)

    # -- object storage: gs:// read and written by the pods through Workload Identity (gcs.py) ------
    object_store = "gs"

    def object_url(self, text: str, what: str) -> str:
        from .gcs import parse_url

        return parse_url(text, what)

    def with_object_access(self, spec: Any, reads: Any = (), writes: Any = ()) -> Any:
        from .gcs import with_access

        return with_access(spec, reads, writes)

    def scan(self, name: str | None = None, run_id: str | None = None, **scope: Any) -> Any:
        from .leftovers import scan

        return scan(name, run_id, project=scope.get("project"), client=scope.get("gke_client"))

    def delete(self, leftovers: list[Any], **kw: Any) -> list[str]:
        from .leftovers import delete

        return delete(leftovers, client=kw.get("gke_client"), wait_seconds=kw.get("wait_seconds", 1800))

    # -- CLI and run lifecycle (h-cli) -----------------------------------------------------------
    flags = ("region", "zone", "instance_type", "spot", "disk_gb", "tags", "keep",
             "project",  # a GCP project
             "start_deadline",  # GKE pods' scheduling deadline
             "setup",  # run in each pod before torchrun (the entry script's setup wrapper)
             "data", "resume")  # staged into each pod through the exec API (k8s_stage)
    flags_refused_why = "gcp runs on GKE pods reached through the Kubernetes API"
    pulumi_plugins = ("gcp",)

    def provider(self, **options: Any) -> Any:
        from gpucluster.infra.pulumi_provider import PulumiProvider

        return PulumiProvider(self.name)

    def gc_scope(self, open_rows: list[dict[str, Any]], runs: list[dict[str, Any]], **flags: Any) -> dict[str, Any]:
        return {"project": flags.get("project")}

    def doctor(self, **kw: Any) -> list[Any]:
        """The region is used only when gcp is the one cloud checked (else it names an aws one)."""
        from .access import doctor_checks

        return doctor_checks(kw.get("project"), kw.get("region") if kw.get("sole") else None)

    # -- cost engine and prices (h-cost): infra/gcp/prices.py --------------------------------------
    default_region = "us-central1"  # the region of catalog.DEFAULT_ZONE
    default_disk_type = "pd-balanced"  # = catalog.DEFAULT_DISK_TYPE
    gpus_billed_apart = True  # GCE bills attached GPUs per GPU-hour, apart from the VM

    def fetch_prices(self, catalog: Any, **kw: Any) -> list[Any]:
        from .prices import fetch_prices

        return fetch_prices(catalog, **kw)

    def price_plan(self, spec: Any, catalog: Any, plan: Any, free_tier: bool | None = None) -> None:
        from .prices import price_plan

        price_plan(spec, catalog, plan, free_tier)

    def instance_price(self, catalog: Any, region: str, item: str, market: str) -> Any:
        from .prices import n1_row

        return n1_row(catalog, region, item, market)

    def planned_resources(self, spec: Any, region: str, catalog: Any = None) -> list[dict[str, Any]]:
        from .prices import planned_resources

        return planned_resources(spec, region, catalog)

    def estimate_notes(self, plan: Any, always_on_hourly: Any) -> list[str]:
        from .prices import estimate_notes

        return estimate_notes(plan, always_on_hourly)


    # -- infra internals: Pulumi engine events, capacity, failures, leftovers ---------------------
    pulumi_kinds = PULUMI_KINDS
    capacity_markers = CAPACITY_MARKERS

    def resource_detail(self, kind: str, inputs: Any, spec: Any) -> dict[str, Any]:
        from .engine import resource_detail

        return resource_detail(kind, inputs, spec)

    def capacity_zones(self, spec: Any, text: str, zone_lister: Any = None) -> tuple[str | None, list[str], str]:
        from .engine import capacity_zones

        return capacity_zones(spec, text, zone_lister)

    def classify_failure(self, spec: Any, text: str) -> Any:
        from .access import classify_quota

        return classify_quota(text, spec)


BACKEND = GcpBackend()
