"""`gpucluster:gcp:GpuCluster` under Pulumi's mock runtime: what would be created, field by field."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

pulumi = pytest.importorskip("pulumi")
pytest.importorskip("pulumi_gcp")

from gpucluster.errors import SpecError  # noqa: E402
from gpucluster.spec import ClusterSpec  # noqa: E402

CLUSTER = "gcp:container/cluster:Cluster"
POOL = "gcp:container/nodePool:NodePool"
COMPONENT = "gpucluster:gcp:GpuCluster"


class RecordingMocks(pulumi.runtime.Mocks):
    """Pulumi mock engine: records every declared resource, echoes inputs, fakes GKE outputs."""

    def __init__(self):
        self.resources = []

    def new_resource(self, args):
        self.resources.append(args)
        outputs = dict(args.inputs)
        if args.typ == CLUSTER:
            outputs["endpoint"] = "203.0.113.10"
            outputs["masterAuth"] = {"clusterCaCertificate": "LS0tQ0EtLS0="}
        return [f"{args.name}-id", outputs]

    def call(self, args):
        return {}

    def of_type(self, typ):
        return [r for r in self.resources if r.typ == typ]

    def pool(self, name):
        (pool,) = [r for r in self.of_type(POOL) if r.inputs["name"] == name]
        return pool.inputs


@pytest.fixture
def mocks():
    m = RecordingMocks()
    pulumi.runtime.set_mocks(m, project="gpucluster", stack="gcp-v100", preview=False)
    return m


def spec(**kw) -> ClusterSpec:
    base = dict(cloud="gcp", nodes=2, name="v100", zone="us-central1-a", instance_type="n1-standard-16",
                accelerator="nvidia-tesla-v100", gpus_per_node=4, run_id="r20261122-031500-abc123",
                disk_gb=200, disk_type="pd-ssd", project="my-proj")
    base.update(kw)
    return ClusterSpec(**base)


def declare(s):
    from gpucluster.infra.gcp import component as gcp
    from gpucluster.infra.gcp.plugin import PLUGIN

    return gcp.declare(s, PLUGIN)


def after(outputs: dict, check):
    """Run `check` once every output (so every resource behind them) has been registered."""
    return pulumi.Output.all(*outputs.values()).apply(check)


@pulumi.runtime.test
def test_cluster_is_zonal_without_default_pool_or_deletion_protection(mocks):
    outputs = declare(spec())

    def check(_):
        (cluster,) = mocks.of_type(CLUSTER)
        i = cluster.inputs
        assert i["name"] == "v100" and i["location"] == "us-central1-a" and i["project"] == "my-proj"
        assert i["removeDefaultNodePool"] is True and i["initialNodeCount"] == 1
        assert i["deletionProtection"] is False
        assert i["enableShieldedNodes"] is True
        assert i["workloadIdentityConfig"] == {"workloadPool": "my-proj.svc.id.goog"}
        assert i["releaseChannel"] == {"channel": "REGULAR"}
        assert i["resourceLabels"] == {"managed-by": "gpucluster", "gpucluster-cluster": "v100",
                                       "gpucluster-run": "r20261122-031500-abc123"}
        (component,) = mocks.of_type(COMPONENT)
        assert cluster.custom is True and component.name == "v100"
        # upgrades held for the cluster's life (issue 26): a NO_UPGRADES exclusion from now to its max
        # lifetime + 1 h (a zonal control plane is down for minutes during an upgrade)
        from datetime import datetime, timedelta, timezone

        policy = i["maintenancePolicy"]
        assert policy["dailyMaintenanceWindow"] == {"startTime": "03:00"}
        (excl,) = policy["maintenanceExclusions"]
        assert excl["exclusionName"] == "gpucluster-run" and excl["exclusionOptions"] == {"scope": "NO_UPGRADES"}
        start, end = (datetime.strptime(excl[k], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
                      for k in ("startTime", "endTime"))
        now = datetime.now(timezone.utc)
        assert start == now.replace(hour=0, minute=0, second=0, microsecond=0) or now - start < timedelta(minutes=5)
        assert end - start == timedelta(days=1, minutes=spec().max_lifetime_minutes + 60)
        assert end >= now + timedelta(minutes=spec().max_lifetime_minutes + 60)

    return after(outputs, check)


def test_the_maintenance_exclusion_is_capped_at_gkes_30_days():
    from datetime import datetime, timezone

    from gpucluster.infra.gcp.component import maintenance_policy

    now = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)
    (excl,) = maintenance_policy(90 * 24 * 60, now=now).maintenance_exclusions
    assert excl.start_time == "2026-11-25T00:00:00Z" and excl.end_time == "2026-12-25T00:00:00Z"


def test_a_second_up_the_same_day_declares_the_same_exclusion_so_the_cluster_is_not_updated():
    """The program runs at every `pulumi up`; an exclusion computed from the second changed the cluster
    each time. Within a day it is the same; it still covers the whole lifetime from any moment of it."""
    from datetime import datetime, timedelta, timezone

    from gpucluster.infra.gcp.component import maintenance_policy

    def window(at):
        (e,) = maintenance_policy(240, now=at).maintenance_exclusions
        return e.start_time, e.end_time

    morning, night = (datetime(2026, 11, 25, h, m, tzinfo=timezone.utc) for h, m in ((0, 5), (23, 59)))
    assert window(morning) == window(night)
    end = datetime.strptime(window(night)[1], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    assert end >= night + timedelta(minutes=240 + 60)
    assert window(night + timedelta(minutes=2)) != window(night)  # the next day: one update


@pulumi.runtime.test
def test_gpu_pool_machine_accelerator_driver_taint_disk_labels(mocks):
    outputs = declare(spec())

    def check(_):
        gpu = mocks.pool("gpu")
        nc = gpu["nodeConfig"]
        # the dead-man switch: the pool autoscales to zero once the Job's deadline removed its pods
        assert gpu["autoscaling"] == {"minNodeCount": 0, "maxNodeCount": 2} and gpu["initialNodeCount"] == 2
        assert "nodeCount" not in gpu and gpu["location"] == "us-central1-a"
        assert gpu["cluster"] == "v100"
        assert nc["machineType"] == "n1-standard-16"
        assert nc["guestAccelerators"] == [{
            "type": "nvidia-tesla-v100", "count": 4,
            "gpuDriverInstallationConfig": {"gpuDriverVersion": "LATEST"},
        }]
        assert nc["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}]
        assert nc["diskSizeGb"] == 200 and nc["diskType"] == "pd-ssd"
        assert nc["spot"] is False
        assert nc["imageType"] == "COS_CONTAINERD"
        assert nc["resourceLabels"]["gpucluster-run"] == "r20261122-031500-abc123"
        assert nc["labels"]["managed-by"] == "gpucluster" and nc["labels"]["gpucluster-pool"] == "gpu"
        assert nc["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}
        assert nc["shieldedInstanceConfig"] == {"enableSecureBoot": True, "enableIntegrityMonitoring": True}

    return after(outputs, check)


@pulumi.runtime.test
def test_system_pool_is_small_cpu_only_and_labelled(mocks):
    outputs = declare(spec())

    def check(_):
        system = mocks.pool("system")
        nc = system["nodeConfig"]
        assert system["nodeCount"] == 1
        assert nc["machineType"] == "n1-standard-2"  # priced from the N1 unit prices
        assert "guestAccelerators" not in nc and "taints" not in nc
        assert nc["resourceLabels"]["gpucluster-cluster"] == "v100"
        assert len(mocks.of_type(POOL)) == 2
        # every child hangs off the component
        (component,) = mocks.of_type(COMPONENT)
        for r in mocks.of_type(POOL) + mocks.of_type(CLUSTER):
            assert r.name.startswith("v100-")

    return after(outputs, check)


@pulumi.runtime.test
def test_spot_autoscaling_and_options(mocks):
    outputs = declare(spec(spot=True, project="proj-two", options=(("autoscale", "true"), ("minNodes", "1"),
                                     ("releaseChannel", "stable"), ("gpuDriverVersion", "DEFAULT"),
                                     ("systemMachineType", "e2-medium"))))

    def check(_):
        gpu = mocks.pool("gpu")
        assert gpu["nodeConfig"]["spot"] is True
        assert gpu["autoscaling"] == {"minNodeCount": 1, "maxNodeCount": 2}
        assert gpu["initialNodeCount"] == 2 and "nodeCount" not in gpu
        accel = gpu["nodeConfig"]["guestAccelerators"][0]
        assert accel["gpuDriverInstallationConfig"] == {"gpuDriverVersion": "DEFAULT"}
        (cluster,) = mocks.of_type(CLUSTER)
        assert cluster.inputs["releaseChannel"] == {"channel": "STABLE"}
        assert mocks.pool("system")["nodeConfig"]["machineType"] == "e2-medium"

    return after(outputs, check)


@pulumi.runtime.test
def test_autoscale_off_gives_a_fixed_pool(mocks):
    outputs = declare(spec(project="proj-two", options=(("autoscale", "false"),)))

    def check(_):
        gpu = mocks.pool("gpu")
        assert gpu["nodeCount"] == 2 and "autoscaling" not in gpu

    return after(outputs, check)


@pulumi.runtime.test
def test_outputs_and_secret_kubeconfig_with_exec_plugin(mocks):
    outputs = declare(spec())
    assert {"cluster_name", "location", "endpoint", "kubeconfig", "node_pool_name", "machine_type",
            "accelerator_type", "accelerator_count"} <= set(outputs)

    def check(args):
        (name, location, endpoint, pool, machine, accel, count, kubeconfig_secret) = args
        assert (name, location, endpoint, pool) == ("v100", "us-central1-a", "203.0.113.10", "gpu")
        assert (machine, accel, count) == ("n1-standard-16", "nvidia-tesla-v100", 4)
        assert kubeconfig_secret is True
        return True

    def check_kubeconfig(text):
        cfg = json.loads(text)
        assert cfg["clusters"][0]["cluster"] == {"server": "https://203.0.113.10",
                                                 "certificate-authority-data": "LS0tQ0EtLS0="}
        exec_ = cfg["users"][0]["user"]["exec"]
        assert exec_["command"] == "gke-gcloud-auth-plugin"
        assert exec_["apiVersion"] == "client.authentication.k8s.io/v1beta1"
        assert cfg["current-context"] == cfg["contexts"][0]["name"]

    outputs["kubeconfig"].apply(check_kubeconfig)
    return pulumi.Output.all(
        outputs["cluster_name"], outputs["location"], outputs["endpoint"], outputs["node_pool_name"],
        outputs["machine_type"], outputs["accelerator_type"], outputs["accelerator_count"],
        pulumi.Output.from_input(outputs["kubeconfig"].is_secret()),
    ).apply(check)


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(instance_type="n1-standard-32", gpus_per_node=1), "at most 12 vCPU"),
        (dict(gpus_per_node=3), "V100 GPUs per node 3"),
        (dict(zone="europe-west1-b"), "europe-west1-b"),
        (dict(accelerator="nvidia-tesla-a100"), "nvidia-tesla-a100"),
        (dict(nodes=65), "nodes 65"),
        (dict(project=None), "no GCP project"),
    ],
)
def test_invalid_spec_refused_before_any_resource(mocks, monkeypatch, tmp_path, bad, message):
    from gpucluster.infra.gcp import access as gcp_access

    for var in ("GOOGLE_PROJECT", "GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))  # no gcloud config file
    monkeypatch.setattr(gcp_access, "adc_project", lambda: None)  # no ADC project
    with pytest.raises(SpecError, match=message):
        declare(spec(**bad))
    assert mocks.resources == []


@pulumi.runtime.test
def test_starved_spec_is_declared_with_a_warning(mocks, monkeypatch):
    warned = []
    monkeypatch.setattr(pulumi.log, "warn", lambda msg, resource=None, **kw: warned.append(msg))
    outputs = declare(spec(instance_type="n1-standard-8", gpus_per_node=4))

    def check(_):
        assert mocks.pool("gpu")["nodeConfig"]["machineType"] == "n1-standard-8"
        assert len(warned) == 1 and "2m34s" in warned[0]

    return after(outputs, check)


def test_kubeconfig_is_readable_by_the_kubernetes_client():
    kubernetes = pytest.importorskip("kubernetes")
    from gpucluster.infra.gcp.component import kubeconfig_for

    import yaml

    cfg = yaml.safe_load(kubeconfig_for("c1", "198.51.100.1", "Q0E="))
    loader = kubernetes.config.kube_config.KubeConfigLoader(config_dict=cfg)
    assert loader.current_context["name"] == "gke-c1"
    assert loader._cluster["server"] == "https://198.51.100.1"


def test_cluster_from_outputs_feeds_the_kubernetes_launcher():
    from gpucluster.infra.gcp.component import cluster_from_outputs

    outputs = {"cluster_name": "v100", "location": "us-central1-a", "zone": "us-central1-a",
               "region": "us-central1", "machine_type": "n1-standard-16", "accelerator_type": "nvidia-tesla-v100",
               "accelerator_count": 4, "gpus_per_node": 4, "nodes": 2, "node_pool_name": "gpu",
               "kubeconfig": "{secret}"}
    c = cluster_from_outputs(outputs)
    assert (c.name, c.cloud, c.zone, c.gpus_per_node, c.kubeconfig) == ("v100", "gcp", "us-central1-a", 4, "{secret}")
    assert "kubeconfig" not in c.outputs and c.outputs["nodes"] == 2
    pytest.importorskip("kubernetes")
    from gpucluster.infra.gcp.gke import GKE
    from gpucluster.infra.kubernetes import plan as k8s_plan
    from gpucluster.watch.launch import JobSpec

    plan = k8s_plan.plan_job(c, JobSpec(run_id="r1", workload="digits", nproc_per_node=4), platform=GKE)
    assert plan.nodes == 2 and plan.gpus_per_node == 4
    assert dict(plan.node_selector)["cloud.google.com/gke-nodepool"] == "gpu"
