"""The `gcp` plugin: machines gpucluster creates (GKE made by Pulumi, jobs through the Kubernetes API)."""

from __future__ import annotations

import sys
from typing import Mapping, Sequence

from gpucluster.domain import Cluster
from gpucluster.errors import GpuclusterError
from gpucluster.infra.contract import (CreatedMachines, LaunchOptions, ObjectStore, Operations, Pricing,
                                       Record, ScanScope, SpecRules, Transport)
from gpucluster.infra.pulumi.cloud import PulumiCloud, sdk_needed
from gpucluster.infra.kubernetes.launcher import KubernetesLauncher
from gpucluster.infra.pulumi.provider import PulumiProvider
from gpucluster.spec import ClusterSpec

from . import TRAITS, access, catalog, engine, gcs, leftovers, preflight, prices, shapes
from .gke import GKE
from .bucket_facts import bucket_facts


def declare(spec: ClusterSpec) -> Mapping[str, object]:
    """Imported here: the component module imports pulumi and pulumi_gcp (only a program needs them)."""
    from .component import declare as declare_

    return declare_(spec, PLUGIN)


def cluster_from_outputs(outputs: Mapping[str, object]) -> Cluster:
    """Imported here: the component module imports pulumi and pulumi_gcp."""
    from .component import cluster_from_outputs as read

    return read(dict(outputs))


def dry_run(spec: ClusterSpec, job: object, launcher: object) -> dict[str, object]:
    """`--dry-run`: the real Pulumi program under Pulumi's mock runtime, and the manifests (imported here:
    it imports pulumi)."""
    from gpucluster.watch.launch import JobSpec

    assert job is None or isinstance(job, JobSpec)  # what Operations.dry_run hands it
    assert launcher is None or isinstance(launcher, KubernetesLauncher)
    with sdk_needed("--dry-run", TRAITS.name):
        from .dryrun import dry_run as dry_run_

        return dry_run_(spec, backend=PLUGIN, job=job, launcher=launcher)


def after_up(spec: ClusterSpec, cluster: Cluster, events: object) -> None:
    """Imported here: the idle stop's manifests import the kubernetes client (only when asked for)."""
    from .catalog import idle_minutes

    if idle_minutes(spec):
        from .idle import after_up as install

        install(spec, cluster, events)


def make(options: LaunchOptions) -> tuple[PulumiProvider, KubernetesLauncher]:
    kw: dict[str, object] = {"objects": gcs.GcsTransfer()}  # gs:// read and written by the pods themselves
    if options.start_deadline_s:
        kw["start_deadline_s"] = options.start_deadline_s
    return PulumiProvider(PLUGIN).scoped(ownership=options.ownership, project=options.project), KubernetesLauncher.from_options(dict(options.spec_options), platform=GKE, **kw)


def scan_scope(recorded: Record | None) -> ScanScope:
    """A leftover scan of a recorded cluster looks in its project."""
    spec = recorded or {}
    options = spec.get("options") or {}  # recorded as a mapping or as [key, value] pairs
    given = dict(options) if isinstance(options, (Mapping, list, tuple)) else {}
    project = spec.get("project") or given.get("project")  # a field; among the options before
    return ScanScope(project=str(project)) if project else ScanScope()


def validate_spec(spec: ClusterSpec) -> list[str]:
    """The GKE GPU pool's checks (`catalog.validate_spec`), then the project's form (--project, a stack file's, a
    recorded run's)."""
    warnings = catalog.validate_spec(spec)
    if spec.project:
        access.resolve_project(spec.project, None, env={})  # checks the ID's form: SpecError naming it
    return warnings


def prepare(spec: ClusterSpec, *, dry_run: bool = False, detect: object = True) -> tuple[ClusterSpec, list[str]]:
    """The project the run uses (`project`, `project_source`): --project, else the default found where
    `access.resolve_project` looks; none found is refused (SpecError) but in a dry run, which shows a
    placeholder. `detect=None`: the spec as given."""
    if detect is None:
        return spec, []
    return access.spec_with_project(spec, None, required=not dry_run, stack_config=_stack_project()), []


def _stack_project() -> str | None:
    """The stack's `gcp:project` inside a Pulumi program (infra/program.py prepares its spec too): it comes
    before the environment, as `component.project_of` has it. None elsewhere: the CLI has not imported
    pulumi when it prepares a spec, and this does not import it."""
    if "pulumi" not in sys.modules:
        return None
    import pulumi

    try:
        found = pulumi.Config("gcp").get("project")
    except Exception:  # noqa: BLE001 - outside a Pulumi program there is no stack config
        return None
    return str(found) if found else None


def gc_scope(open_rows: Sequence[Record], runs: Sequence[Record], regions: tuple[str, ...],
             project: str | None) -> ScanScope:
    return ScanScope(project=project)


def doctor_checks(region: str | None, project: str | None, sole: bool, *, nodes: int | None = None,
                  instance_type: str | None = None, spot: bool = False) -> list[dict[str, object]]:
    """The prerequisites of a run of the shape given (default: the default run's). The region and the
    machine type are used only when gcp is the one cloud checked (else they name aws ones)."""
    from . import doctor

    return doctor.doctor_checks(project, region if sole else None, nodes=nodes,
                                instance_type=instance_type if sole else None, spot=spot)


def classify_failure(spec: ClusterSpec, text: str) -> GpuclusterError | None:
    return access.classify_quota(text, spec)


PLUGIN = CreatedMachines(
    traits=TRAITS,
    spec=SpecRules(options=catalog.OPTIONS, validate=validate_spec, resolve=catalog.resolve, prepare=prepare,
                   link_gbps=catalog.link_gbps, plan_line=catalog.plan_line, gpu_shapes=shapes.gpu_shapes),
    transport=Transport(make=make),
    ops=Operations(doctor=doctor_checks, dry_run=dry_run, credentials_found=access.credentials_found, bucket_facts=bucket_facts),
    provisioner=PulumiCloud(
        plugins=("gcp",), scan_scope=scan_scope,
        declare=declare, cluster_from_outputs=cluster_from_outputs,
        scan=leftovers.scan_scope, delete=leftovers.delete_in, gc_scope=gc_scope,
        pulumi_kinds=engine.PULUMI_KINDS, resource_detail=engine.resource_detail,
        # what the scan reports, in deletion order (node pools go with their cluster; the pods' account after)
        leftover_kinds=("gke-cluster", "service-account"),
        capacity_markers=engine.CAPACITY_MARKERS, capacity_zones=engine.capacity_zones,
        classify_failure=classify_failure,
        # a binding refused for an account or pool IAM does not show yet: `up` again (issue 41 item 9)
        relaunch=engine.relaunch, relaunch_delays=engine.RELAUNCH_DELAYS,
        preflight=preflight.preflight,  # APIs, billing, quotas and buckets, before anything is created
        after_up=after_up),  # the idle stop's watcher in the cluster (option idleMinutes)
    pricing=Pricing(
        price_rows=prices.price_rows, instance_price=prices.n1_row, planned_resources=prices.planned_resources,
        fetch_prices=prices.fetch_prices),
    objects=ObjectStore(scheme="gs", url=gcs.parse_url, option_prefix=gcs.OPTION_PREFIX),
)
