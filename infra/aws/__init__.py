"""The `aws` backend: EC2 g5 instances (Deep Learning AMI, NVIDIA driver ready) made by Pulumi,
reached with the `ssh` launcher using the cluster's own key and pinned host keys.

Contract: `gpucluster.infra.contract`. Modules: catalog (instance types, regions, spec checks),
component (the Pulumi component), outputs (stack outputs -> Cluster, console tail), dryrun and
mock_runtime (the program under Pulumi's mock runtime, for --dry-run)."""

from __future__ import annotations

from typing import Any

from gpucluster.infra.contract import Backend

from .engine import CAPACITY_MARKERS, PULUMI_KINDS, region_of_zone


class AwsBackend(Backend):
    name = "aws"
    max_nodes = 64
    provisions = True
    priced = True
    resource_kinds = ("instance", "security-group", "key-pair", "placement-group", "vpc", "subnet",
                      "internet-gateway", "route-table", "iam-role", "instance-profile", "launch-template")
    # On a capacity error (InsufficientInstanceCapacity), `up` tries again in the next zone that
    # offers the type, this many attempts in all; each attempt's resources keep {"attempt", "zone"}.
    capacity_attempts = 3
    # what the tag scan reports and `delete` handles, in deletion order: what holds others first
    leftover_kinds = ("instance", "launch-template", "elastic-ip", "network-interface", "volume", "placement-group", "key-pair",
                      "security-group", "subnet", "route-table", "internet-gateway", "vpc", "instance-profile",
                      "iam-role")

    def validate_spec(self, spec: Any) -> list[str]:
        from .catalog import validate_spec

        return validate_spec(spec)

    def resolve(self, spec: Any) -> Any:
        from .catalog import resolve

        return resolve(spec)

    def prepare_spec(self, spec: Any, **kw: Any) -> tuple[Any, list[str]]:
        from .catalog import resolve_spec

        return resolve_spec(spec, **kw)

    def plan_line(self, spec: Any, nproc_per_node: int, hourly: Any = None) -> str | None:
        from .catalog import plan_line

        return plan_line(spec, nproc_per_node, hourly)

    def scan_scope(self, spec: dict[str, Any] | None) -> dict[str, Any]:
        spec = spec or {}
        region = spec.get("region") or region_of_zone(spec.get("zone"))
        return {"regions": [region]} if region else {}

    def declare(self, spec: Any) -> dict[str, Any]:
        from .component import declare

        return declare(spec)

    def cluster_from_outputs(self, outputs: dict[str, Any]) -> Any:
        from .outputs import cluster_from_outputs

        return cluster_from_outputs(outputs)

    def dry_run(self, spec: Any, **kw: Any) -> dict[str, Any]:
        from .dryrun import dry_run

        return dry_run(spec, **kw)

    def make(self, **options: Any) -> tuple[Any, Any]:
        from gpucluster.infra.pulumi_provider import PulumiProvider
        from gpucluster.infra.ssh.launch import SshLauncher

        from .catalog import NODE_PYTHON
        from .outputs import console_tail

        from .s3 import NodeTransfer

        kw: dict[str, Any] = {"python": options.get("remote_python") or NODE_PYTHON, "diagnose": console_tail,
                              "objects": NodeTransfer()}
        if options.get("ready_timeout") is not None:
            kw["ready_timeout"] = options["ready_timeout"]
        from .preflight import preflight  # quota, AMI, subnet and a RunInstances dry run, before anything

        return PulumiProvider("aws", preflight=preflight), SshLauncher(**kw)

    # -- object storage: s3:// read and written by the nodes through the instance role (s3.py) ------
    object_store = "s3"

    def object_url(self, text: str, what: str) -> str:
        from .s3 import parse_url

        return parse_url(text, what)

    def with_object_access(self, spec: Any, reads: Any = (), writes: Any = ()) -> Any:
        from .s3 import with_access

        return with_access(spec, reads, writes)

    def scan(self, name: str | None = None, run_id: str | None = None, **scope: Any) -> Any:
        from .leftovers import default_regions, scan

        regions = scope.get("regions") or default_regions(scope.get("session"))
        return scan(list(regions), name, run_id, session=scope.get("session"))

    def delete(self, leftovers: list[Any], **kw: Any) -> list[str]:
        from .leftovers import delete

        return delete(leftovers, session=kw.get("session"), wait_seconds=kw.get("wait_seconds", 600))

    # -- infra internals: Pulumi engine events, capacity, leftovers --------------------------------
    pulumi_kinds = PULUMI_KINDS
    capacity_markers = CAPACITY_MARKERS

    def resource_detail(self, kind: str, inputs: Any, spec: Any) -> dict[str, Any]:
        from .engine import resource_detail

        return resource_detail(kind, inputs, spec)

    def classify_failure(self, spec: Any, text: str) -> Any:
        from .failures import classify  # the AWS error code and message, not "update failed"

        return classify(spec, text)

    def capacity_zones(self, spec: Any, text: str, zone_lister: Any = None) -> tuple[str | None, list[str], str]:
        from .engine import capacity_zones

        return capacity_zones(spec, text, zone_lister)

    # -- cost engine and prices (h-cost): infra/aws/prices.py --------------------------------------
    default_region = "us-east-1"  # = catalog.DEFAULT_REGION
    default_disk_type = "gp3"  # = catalog.DEFAULT_DISK_TYPE
    gpus_billed_apart = False  # an EC2 instance's price includes its GPUs
    provider_region_config = "aws"  # a stack's `aws:region` is its default region

    def fetch_prices(self, catalog: Any, **kw: Any) -> list[Any]:
        from .prices import fetch_prices

        return fetch_prices(catalog, **kw)

    def price_plan(self, spec: Any, catalog: Any, plan: Any, free_tier: bool | None = None) -> None:
        from .prices import price_plan

        price_plan(spec, catalog, plan)

    def planned_resources(self, spec: Any, region: str, catalog: Any = None) -> list[dict[str, Any]]:
        from .prices import planned_resources

        return planned_resources(spec)

    def gpu_of(self, instance_type: str, catalog: Any) -> str | None:
        from .prices import gpu_of

        return gpu_of(instance_type, catalog)

    # -- CLI and run lifecycle (h-cli) -----------------------------------------------------------
    flags = ("region", "zone", "instance_type", "spot", "disk_gb", "tags", "keep",
             "max_lifetime",  # the nodes' self-shutdown timer
             "ssh_cidr",  # who may reach the nodes over ssh
             "remote_python",
             "ready_timeout",  # waiting for ssh and the DLAMI's first boot
             "data", "setup", "resume")  # staged and run over ssh
    flags_refused_why = "aws nodes are created and reached by gpucluster itself"
    pulumi_plugins = ("aws", "tls")

    def provider(self, **options: Any) -> Any:
        from gpucluster.infra.pulumi_provider import PulumiProvider

        from .preflight import preflight

        return PulumiProvider(self.name, preflight=preflight)

    def node_gpu_state(self, provider: Any, name: str) -> list[dict[str, Any]]:
        """Asked over ssh, with the stack's outputs (pinned host keys, the cluster's key)."""
        from gpucluster.infra.ssh.launch import SshLauncher

        from .outputs import cluster_from_outputs

        outputs = provider.driver.outputs(name)
        if not outputs:
            return [{"note": "no stack outputs: the cluster is not up"}]
        cluster = cluster_from_outputs(outputs)
        return [{"node": r.rank, "host": r.label, "reachable": r.ok or bool(r.gpu_state), "problems": r.problems,
                 "gpus": r.gpu_state} for r in SshLauncher().probe(cluster)]

    def gc_scope(self, open_rows: list[dict[str, Any]], runs: list[dict[str, Any]], **flags: Any) -> dict[str, Any]:
        from .doctor import gc_regions

        return {"regions": gc_regions(open_rows, runs, tuple(flags.get("regions") or ()))}

    def gc_label(self, scope: dict[str, Any]) -> str:
        return f"aws {'/'.join(scope.get('regions') or [])}"

    def doctor(self, **kw: Any) -> list[Any]:
        from .doctor import doctor

        return doctor(kw.get("region"), nodes=kw.get("nodes"), instance_type=kw.get("instance_type"), spot=bool(kw.get("spot")))


BACKEND = AwsBackend()
