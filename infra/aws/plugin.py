"""The `aws` plugin: machines gpucluster creates (EC2 made by Pulumi, reached over ssh)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from gpucluster.domain import Provider
from gpucluster.infra.contract import (CreatedMachines, LaunchOptions, ObjectStore, Operations, Pricing, Record,
                                       ScanScope, SpecRules, Transport)
from gpucluster.infra.pulumi.cloud import PulumiCloud, sdk_needed
from gpucluster.infra.pulumi.provider import PulumiProvider
from gpucluster.infra.ssh.launch import SshLauncher
from gpucluster.spec import ClusterSpec

from . import TRAITS, catalog, doctor, engine, failures, leftovers, liveness, outputs, prices, s3, shapes
from .preflight import credentials_check, credentials_found, preflight


def declare(spec: ClusterSpec) -> Mapping[str, object]:
    """Imported here: the component module imports pulumi and pulumi_aws (only a program needs them)."""
    from .component import declare as declare_

    return declare_(spec)


def dry_run(spec: ClusterSpec, job: object, launcher: object) -> dict[str, object]:
    """`--dry-run`: the real Pulumi program under Pulumi's mock runtime (imported here: it imports pulumi), and
    the command each node would run."""
    from gpucluster.watch.launch import JobSpec

    assert job is None or isinstance(job, JobSpec)  # what Operations.dry_run hands it
    assert launcher is None or isinstance(launcher, SshLauncher)  # the one `make` gives
    with sdk_needed("--dry-run", TRAITS.name):
        from .dryrun import dry_run as dry_run_

        return dry_run_(spec, job=job, launcher=launcher)


def make(options: LaunchOptions) -> tuple[PulumiProvider, SshLauncher]:
    kw: dict[str, Any] = {"python": options.remote_python or catalog.NODE_PYTHON, "diagnose": outputs.console_tail,
                          "objects": s3.NodeTransfer(),
                          # a spot interruption notice, watched on every node (node_notice.py)
                          "watcher": (str(Path(__file__).with_name("node_notice.py")), "--interval", "5", "--keyed")}
    if options.ready_timeout is not None:
        kw["ready_timeout"] = options.ready_timeout
    return PulumiProvider(PLUGIN).scoped(ownership=options.ownership, project=options.project), SshLauncher(**kw)


def scan_scope(recorded: Record | None) -> ScanScope:
    """A leftover scan of a recorded cluster looks in its region."""
    spec = recorded or {}
    zone = spec.get("zone")
    region = spec.get("region") or engine.region_of_zone(str(zone) if zone else None)
    return ScanScope(regions=(str(region),)) if region else ScanScope()


def node_gpu_state(provider: Provider, name: str) -> list[dict[str, object]]:
    """Asked over ssh, with the stack's outputs (pinned host keys, the cluster's key)."""
    found = provider.driver.outputs(name)  # type: ignore[attr-defined]  # the aws transport's PulumiProvider
    if not found:
        return [{"note": "no stack outputs: the cluster is not up"}]
    cluster = outputs.cluster_with_host_keys(found)
    return [{"node": r.rank, "host": r.label, "reachable": r.ok or bool(r.gpu_state), "problems": r.problems,
             "gpus": r.gpu_state} for r in SshLauncher().probe(cluster)]


def gc_scope(open_rows: Sequence[Record], runs: Sequence[Record], regions: tuple[str, ...],
             project: str | None) -> ScanScope:
    return ScanScope(regions=tuple(doctor.gc_regions(open_rows, runs, regions)))


def doctor_checks(region: str | None, project: str | None, sole: bool, *, nodes: int | None = None,
                  instance_type: str | None = None, spot: bool = False) -> list[dict[str, object]]:
    """The preflight of `run` for the region and shape given (default: the default run's)."""
    return doctor.doctor(region, nodes=nodes, instance_type=instance_type, spot=bool(spot))


PLUGIN = CreatedMachines(
    traits=TRAITS,
    spec=SpecRules(options=catalog.OPTIONS, validate=catalog.validate_spec, resolve=catalog.resolve, prepare=catalog.prepare,
                   plan_line=catalog.plan_line, ready_within=catalog.ready_within,
                   link_gbps=catalog.link_gbps, gpu_shapes=shapes.gpu_shapes),
    transport=Transport(make=make),
    ops=Operations(node_gpu_state=node_gpu_state, doctor=doctor_checks, dry_run=dry_run,
                   credentials_found=credentials_found, bucket_facts=s3.bucket_facts,
                   gone_at=liveness.gone_at),  # status: kept nodes the dead-man switch powered off
    provisioner=PulumiCloud(
        plugins=("aws", "tls"), region_config="aws",  # a stack's `aws:region` is its default region
        scan_scope=scan_scope, credentials=credentials_check,
        # host keys pinned from each node's serial console before any ssh (infra/aws/hostkeys.py)
        declare=declare, cluster_from_outputs=outputs.cluster_with_host_keys,
        scan=leftovers.scan_scope, delete=leftovers.delete_in, gc_scope=gc_scope,
        pulumi_kinds=engine.PULUMI_KINDS, resource_detail=engine.resource_detail,
        leftover_kinds=leftovers.DELETE_ORDER,
        capacity_markers=engine.CAPACITY_MARKERS, capacity_zones=engine.capacity_zones,
        # On a capacity error (InsufficientInstanceCapacity), `up` tries again in the next zone that
        # offers the type, this many attempts in all; each attempt's resources keep {"attempt", "zone"}.
        capacity_attempts=3,
        zone_pinned=catalog.zone_pinned,  # option subnetId: the subnet's zone, no failover (issue 40 item 5)
        classify_failure=failures.classify,  # the AWS error code and message, not "update failed"
        preflight=preflight,  # quota, AMI, subnet and a RunInstances dry run, before anything
        # `down` terminates the nodes and waits for `terminated` before `pulumi destroy` (issue 40 item 1)
        terminate_kinds=("instance",), terminate=leftovers.terminate_in,
        # a fleet refused for an instance profile IAM has not propagated is launched again (issue 40 item 3)
        relaunch=engine.relaunch, relaunch_delays=engine.RELAUNCH_DELAYS),
    pricing=Pricing(
        price_rows=prices.price_rows, instance_price=prices.instance_price,
        planned_resources=prices.planned_resources, fetch_prices=prices.fetch_prices),
    objects=ObjectStore(scheme="s3", url=s3.parse_url, option_prefix=s3.OPTION_PREFIX),
)
