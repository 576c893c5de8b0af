"""`gpucluster:gcp:GpuCluster`: a zonal GKE Standard cluster with a GPU node pool (N1 + V100/T4, G2 L4,
A2 A100, A3 H100/H200: catalog.resolve and shapes.py).

What it declares (every child has `parent=self`):

- `container.Cluster`: zonal (location = the zone; the GKE free-tier credit covers one zonal
  cluster), default node pool removed (`remove_default_node_pool` + `initial_node_count=1`, the
  provider's way), `deletion_protection=False` (pulumi-gcp defaults it to true and `pulumi destroy`
  then fails), workload identity (`<project>.svc.id.goog`), shielded nodes, the release channel from
  the option `releaseChannel` (REGULAR by default), upgrades held for the cluster's life (a
  NO_UPGRADES maintenance exclusion to its max lifetime, `maintenance_policy`), the managed labels
  as `resource_labels`.
- a small CPU system pool (kube-dns, metrics and other system pods land there, not on the GPUs):
  one node of the option `systemMachineType` (n1-standard-2 by default: N1 is priced from the
  shipped N1 unit prices, so the estimate includes it; it keeps billing after the dead-man switch).
- the GPU pool: the N1 machine type (`spec.instance_type`), `guest_accelerators` V100 x
  `gpus_per_node` with GKE installing the driver (option `gpuDriverVersion`, LATEST by default;
  changing it recreates the pool), autoscaling from `minNodes` (default 0) to `nodes` starting
  at `nodes` (the dead-man switch: GPU nodes without pods go away; option `autoscale=false`
  gives a fixed `node_count = nodes`); spot when `spec.spot`; boot disk type/size;
  the managed labels as GCE and Kubernetes labels; the taint nvidia.com/gpu=present:NoSchedule.

- object storage, only with the options `gcsRead` / `gcsWrite` (`run --data/--output gs://...`):
  a Google service account for the pods, prefix-scoped bucket IAM bindings and its Workload
  Identity binding (`infra/gcp/component_access.py`).

Outputs (also returned by `declare`): cluster name, location, endpoint, a kubeconfig (secret) that
authenticates with the `gke-gcloud-auth-plugin` exec flow, the GPU pool's name, machine type,
accelerator type and count; with object storage also `objects_service_account` (the Google
service account's email), `objects_ksa` and `objects_namespace`.

Validation runs before anything is declared: an invalid spec raises `SpecError` and no resource
(not even the component) exists.
"""

from __future__ import annotations

import json
from datetime import datetime

import pulumi
import pulumi_gcp as gcp

from gpucluster.infra.gcp import catalog, gcs
from gpucluster.infra.gcp.component_access import declare_object_access
from gpucluster.domain import Cluster
from gpucluster.infra.contract import Plugin
from gpucluster.spec import ClusterSpec, validate
from gpucluster.states import JsonObject

TYPE_TOKEN = "gpucluster:gcp:GpuCluster"
GPU_POOL_NAME = "gpu"
SYSTEM_POOL_NAME = "system"
GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_TAINT_VALUE = "present"
OAUTH_SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]


def project_of(spec: ClusterSpec) -> str:
    """The GCP project, by the one resolution order (`infra.gcp.access.resolve_project`): the option
    `project` (--project), the stack config `gcp:project`, GOOGLE_PROJECT / GOOGLE_CLOUD_PROJECT /
    GCLOUD_PROJECT / CLOUDSDK_CORE_PROJECT, the gcloud config file, the ADC project."""
    from gpucluster.infra.gcp.access import resolve_project

    try:
        stack_project = pulumi.Config("gcp").get("project")
    except Exception:  # noqa: BLE001 - outside a Pulumi program there is no stack config
        stack_project = None
    return str(resolve_project(spec.project, stack_project)[0])


def kubeconfig_for(name: str, endpoint: str, ca_certificate: str) -> str:
    """A kubeconfig for one GKE cluster that gets its token from `gke-gcloud-auth-plugin`.

    JSON is valid YAML, so kubectl and the kubernetes Python client both read it. The plugin
    must be on PATH where the kubeconfig is used (`gcloud components install
    gke-gcloud-auth-plugin`).
    """
    context = f"gke-{name}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": context,
                "cluster": {"server": f"https://{endpoint}", "certificate-authority-data": ca_certificate},
            }
        ],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
        "current-context": context,
        "users": [
            {
                "name": context,
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1beta1",
                        "command": "gke-gcloud-auth-plugin",
                        "installHint": "Install gke-gcloud-auth-plugin: gcloud components install "
                        "gke-gcloud-auth-plugin (or apt-get install google-cloud-cli-gke-gcloud-auth-plugin)",
                        "provideClusterInfo": True,
                        "interactiveMode": "IfAvailable",
                    }
                },
            }
        ],
    }
    return json.dumps(config, indent=2)


# Upgrades held while the cluster lives: a zonal cluster's control plane is down for minutes during an
# upgrade and node upgrades drain the GPU nodes (GKE docs, "Standard cluster upgrades"). A maintenance
# exclusion of scope NO_UPGRADES holds control-plane and node upgrades, minor and patch (GKE docs,
# "Maintenance windows and exclusions"; GKE API MaintenanceExclusionOptions.Scope), for at most 30
# days; GKE may still apply critical security fixes and control-plane repairs. pulumi-gcp requires a
# maintenance window beside it (daily_maintenance_window or recurring_window, exactly one).
EXCLUSION_NAME = "gpucluster-run"
EXCLUSION_MAX_DAYS = 30
MAINTENANCE_WINDOW_START = "03:00"  # UTC; only used after the exclusion has ended


def maintenance_policy(max_lifetime_minutes: int, now: datetime | None = None
                       ) -> gcp.container.ClusterMaintenancePolicyArgs:
    """A NO_UPGRADES exclusion that covers the cluster from now until its max lifetime has passed (capped at
    30 days). Its start is today's midnight (UTC), not now: the program runs again at every `pulumi up` of
    the stack, and an exclusion computed from the very second would change the cluster each time (an
    update of the cluster at every `up`); from the day, it changes at most once a day. So it ends a day
    later than it must: midnight + 1 day + the lifetime + 1 hour still covers now + the lifetime + 1 hour."""
    from datetime import timedelta, timezone

    start = (now or datetime.now(timezone.utc)).replace(hour=0, minute=0, second=0, microsecond=0)
    end = start + min(timedelta(days=1, minutes=int(max_lifetime_minutes)) + timedelta(hours=1),
                      timedelta(days=EXCLUSION_MAX_DAYS))
    return gcp.container.ClusterMaintenancePolicyArgs(
        daily_maintenance_window=gcp.container.ClusterMaintenancePolicyDailyMaintenanceWindowArgs(
            start_time=MAINTENANCE_WINDOW_START),
        maintenance_exclusions=[gcp.container.ClusterMaintenancePolicyMaintenanceExclusionArgs(
            exclusion_name=EXCLUSION_NAME,
            start_time=start.strftime("%Y-%m-%dT%H:%M:%SZ"),
            end_time=end.strftime("%Y-%m-%dT%H:%M:%SZ"),
            exclusion_options=gcp.container.ClusterMaintenancePolicyMaintenanceExclusionExclusionOptionsArgs(
                scope="NO_UPGRADES"),
        )],
    )


class GpuCluster(pulumi.ComponentResource):
    """A GKE Standard cluster with a CPU system pool and a GPU pool, built from a ClusterSpec."""

    cluster: gcp.container.Cluster
    system_pool: gcp.container.NodePool
    gpu_pool: gcp.container.NodePool

    def __init__(
        self,
        resource_name: str,
        *,
        spec: ClusterSpec,
        backend: Plugin,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        # Everything that can be refused is refused here, before the component registers (`backend`:
        # gcp's plugin, given by `plugin.declare`: this module does not import the plugin back).
        warnings = validate(spec, backend)
        spec = catalog.resolve(spec)
        project = project_of(spec)
        release_channel = catalog.option_choice(
            spec, "releaseChannel", catalog.RELEASE_CHANNELS, catalog.DEFAULT_RELEASE_CHANNEL
        )
        driver_version = catalog.option_choice(
            spec, "gpuDriverVersion", catalog.GPU_DRIVER_VERSIONS, catalog.DEFAULT_GPU_DRIVER_VERSION
        )
        # On by default: the dead-man switch. Once the Job's activeDeadlineSeconds (the max lifetime)
        # has killed its pods, the cluster autoscaler removes the idle GPU nodes with no client.
        autoscale = catalog.option_bool(spec, "autoscale", True)
        min_nodes = catalog.min_nodes(spec) if autoscale else None
        system_machine_type = catalog.system_machine_type(spec)
        gcs_reads, gcs_writes = gcs.scopes(spec)  # SpecError for a malformed gcsRead/gcsWrite URL
        namespace = gcs.namespace_of(spec) if gcs_reads or gcs_writes else None

        super().__init__(TYPE_TOKEN, resource_name, None, opts)
        for text in warnings:
            pulumi.log.warn(text, resource=self)
        if catalog.idle_minutes(spec):  # infra/gcp/idle.py: no Kubernetes provider in this program
            pulumi.log.info("idleMinutes: the idle stop's watcher is installed in the cluster by `gpucluster up` "
                            "(or `run --keep`) once the stack is up; a plain `pulumi up` does not install it",
                            resource=self)

        self.spec = spec
        assert spec.accelerator is not None and spec.gpus_per_node is not None  # catalog.resolve sets both
        labels = spec.managed_tags()
        child = pulumi.ResourceOptions(parent=self)
        # Pools have fixed names, so a change that forces a new pool must delete the old one first.
        pool_opts = pulumi.ResourceOptions(parent=self, delete_before_replace=True)

        self.cluster = gcp.container.Cluster(
            f"{resource_name}-cluster",
            name=spec.name,
            project=project,
            location=spec.zone,
            remove_default_node_pool=True,
            initial_node_count=1,
            deletion_protection=False,
            enable_shielded_nodes=True,
            workload_identity_config=gcp.container.ClusterWorkloadIdentityConfigArgs(
                workload_pool=f"{project}.svc.id.goog",
            ),
            release_channel=gcp.container.ClusterReleaseChannelArgs(channel=release_channel),
            maintenance_policy=maintenance_policy(spec.max_lifetime_minutes),
            network=spec.option("network") or None,  # None: the project's `default` network
            subnetwork=spec.option("subnetwork") or None,
            resource_labels=labels,
            opts=child,
        )

        self.system_pool = gcp.container.NodePool(
            f"{resource_name}-system",
            name=SYSTEM_POOL_NAME,
            project=project,
            cluster=self.cluster.name,
            location=spec.zone,
            node_count=1,
            management=gcp.container.NodePoolManagementArgs(auto_repair=True, auto_upgrade=True),
            node_config=gcp.container.NodePoolNodeConfigArgs(
                machine_type=system_machine_type,
                disk_size_gb=catalog.SYSTEM_DISK_GB,
                disk_type=catalog.SYSTEM_DISK_TYPE,
                oauth_scopes=OAUTH_SCOPES,
                resource_labels=labels,
                labels={**labels, "gpucluster-pool": "system"},
                shielded_instance_config=gcp.container.NodePoolNodeConfigShieldedInstanceConfigArgs(
                    enable_secure_boot=True, enable_integrity_monitoring=True
                ),
                workload_metadata_config=gcp.container.NodePoolNodeConfigWorkloadMetadataConfigArgs(
                    mode="GKE_METADATA"
                ),
            ),
            opts=pool_opts,
        )

        if autoscale:
            count_args: JsonObject = {
                "initial_node_count": spec.nodes,
                "autoscaling": gcp.container.NodePoolAutoscalingArgs(
                    min_node_count=min_nodes, max_node_count=spec.nodes
                ),
            }
        else:
            count_args = {"node_count": spec.nodes}

        self.gpu_pool = gcp.container.NodePool(
            f"{resource_name}-gpu",
            name=GPU_POOL_NAME,
            project=project,
            cluster=self.cluster.name,
            location=spec.zone,
            management=gcp.container.NodePoolManagementArgs(auto_repair=True, auto_upgrade=True),
            node_config=gcp.container.NodePoolNodeConfigArgs(
                machine_type=spec.instance_type,
                image_type="COS_CONTAINERD",
                # gVNIC: the virtual NIC GPU machines need for their bandwidth (A3 requires it; GKE docs,
                # "Use Google Virtual NIC": node pools with --enable-gvnic, COS images support it)
                gvnic=gcp.container.NodePoolNodeConfigGvnicArgs(enabled=True),
                spot=spec.spot,
                disk_size_gb=spec.disk_size,
                disk_type=spec.disk_type,
                oauth_scopes=OAUTH_SCOPES,
                guest_accelerators=[
                    gcp.container.NodePoolNodeConfigGuestAcceleratorArgs(
                        type=spec.accelerator,
                        count=spec.gpus_per_node,
                        gpu_driver_installation_config=(
                            gcp.container.NodePoolNodeConfigGuestAcceleratorGpuDriverInstallationConfigArgs(
                                gpu_driver_version=driver_version
                            )
                        ),
                    )
                ],
                # GKE adds this taint itself only when a non-GPU pool already exists; with the
                # default pool removed that can race (terraform-google-kubernetes-engine issue 703),
                # so it is declared here. Google's cluster-toolkit declares it the same way.
                taints=[
                    gcp.container.NodePoolNodeConfigTaintArgs(
                        key=GPU_TAINT_KEY, value=GPU_TAINT_VALUE, effect="NO_SCHEDULE"
                    )
                ],
                resource_labels=labels,
                labels={**labels, "gpucluster-pool": "gpu"},
                shielded_instance_config=gcp.container.NodePoolNodeConfigShieldedInstanceConfigArgs(
                    enable_secure_boot=True, enable_integrity_monitoring=True
                ),
                workload_metadata_config=gcp.container.NodePoolNodeConfigWorkloadMetadataConfigArgs(
                    mode="GKE_METADATA"
                ),
            ),
            opts=pool_opts,
            **count_args,
        )

        object_outputs = declare_object_access(
            self, resource_name, cluster_name=spec.name, project=project, namespace=namespace,
            reads=gcs_reads, writes=gcs_writes, cluster=self.cluster, labels=labels, run_id=spec.run_id)

        self.cluster_name = self.cluster.name
        self.location = self.cluster.location
        self.endpoint = self.cluster.endpoint
        self.kubeconfig: pulumi.Output[str] = pulumi.Output.secret(
            pulumi.Output.all(
                self.cluster.name, self.cluster.endpoint, self.cluster.master_auth.cluster_ca_certificate
            ).apply(lambda a: kubeconfig_for(a[0], a[1], a[2] or ""))
        )
        self.node_pool_name = self.gpu_pool.name
        self.outputs: JsonObject = {
            "cloud": "gcp",
            "cluster_name": self.cluster_name,
            "location": self.location,
            "zone": spec.zone,
            "region": spec.region,
            "project": project,
            "endpoint": self.endpoint,
            "kubeconfig": self.kubeconfig,
            "node_pool_name": self.node_pool_name,
            "system_pool_name": self.system_pool.name,
            "machine_type": spec.instance_type,
            "accelerator_type": spec.accelerator,
            "accelerator_count": spec.gpus_per_node,
            "gpus_per_node": spec.gpus_per_node,
            "nodes": spec.nodes,
            "spot": spec.spot,
            "labels": labels,
            "max_lifetime_minutes": spec.max_lifetime_minutes,
            "autoscale": autoscale,
            **object_outputs,
        }
        self.register_outputs(self.outputs)


def declare(spec: ClusterSpec, backend: Plugin) -> JsonObject:
    """Declare the GCP cluster for `spec` (inside a Pulumi program); the outputs to export."""
    component = GpuCluster(spec.name, spec=spec, backend=backend)
    return {k: v if isinstance(v, pulumi.Output) else pulumi.Output.from_input(v) for k, v in component.outputs.items()}


def cluster_from_outputs(outputs: JsonObject) -> Cluster:
    """A `Cluster` for the Kubernetes launcher from this stack's outputs (plain values).

    GKE nodes are not addressed one by one (the launcher schedules one pod per node), so `nodes` is
    empty and the node count travels in `outputs["nodes"]`; the kubeconfig is kept out of
    `outputs` (it is a secret) and set on `Cluster.kubeconfig`.
    """

    public = {k: v for k, v in outputs.items() if k != "kubeconfig"}
    return Cluster(
        name=str(outputs["cluster_name"]),
        cloud="gcp",
        nodes=(),
        region=outputs.get("region"),
        zone=outputs.get("zone") or outputs.get("location"),
        instance_type=outputs.get("machine_type"),
        gpus_per_node=int(outputs.get("gpus_per_node") or outputs.get("accelerator_count") or 0),
        kubeconfig=outputs.get("kubeconfig"),
        outputs=public,
    )
