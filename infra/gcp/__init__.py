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
    resource_kinds = ("gke-cluster", "node-pool", "network", "subnetwork", "firewall")
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

        from .k8s import KubernetesLauncher

        kw = {"start_deadline_s": options["start_deadline_s"]} if options.get("start_deadline_s") else {}
        return PulumiProvider("gcp"), KubernetesLauncher.from_options(options.get("spec_options") or {}, **kw)

    def scan(self, name: str | None = None, run_id: str | None = None, **scope: Any) -> Any:
        from .leftovers import scan

        return scan(name, run_id, project=scope.get("project"), client=scope.get("gke_client"))

    def delete(self, leftovers: list[Any], **kw: Any) -> list[str]:
        from .leftovers import delete

        return delete(leftovers, client=kw.get("gke_client"), wait_seconds=kw.get("wait_seconds", 1800))

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
