"""GKE pods that fit real nodes: the training pod's CPU and memory requests (infra/gcp/gke.py) against
nodes as the kubelet reports them (capacity = MemTotal, below the machine type's nominal memory; GKE's
reservations; GKE's own DaemonSets already there) and a scheduler that places a pod only where its
requests fit (tests/k8s_fake_sched.py, each rule with its source). On a real node a pod that asks more
stays Pending with "Insufficient memory" while every GPU of the pool bills, until the start deadline."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("kubernetes")

from k8s_fake import FakeKubeApi  # noqa: E402
from k8s_fake_sched import Scheduler, gke_node, pod_requests  # noqa: E402
from test_k8s_launcher import healthy, job  # noqa: E402

from gpucluster.domain import Cluster  # noqa: E402

from gpucluster.events import NullEvents  # noqa: E402
from gpucluster.infra.gcp import gke  # noqa: E402
from gpucluster.infra.gcp import shapes  # noqa: E402
from gpucluster.infra.gcp.catalog import DEFAULT_MACHINE_TYPE, N1_MACHINE_TYPES, machine_shape, n1_shape  # noqa: E402
from gpucluster.infra.kubernetes import launcher as k8s, manifests, plan as k8s_plan  # noqa: E402


@pytest.mark.parametrize("machine", sorted(N1_MACHINE_TYPES) + sorted(shapes.BY_NAME))
def test_every_gpu_machine_shape_fits_its_real_node_with_gkes_daemonsets_on_it(machine):
    vcpus, gib = machine_shape(machine)
    requests = gke.pod_requests(machine)
    if not requests:  # too small a machine to ask anything of: the pod asks nothing (and fits)
        return
    node = gke_node("n", vcpus, float(gib), 8)
    placed = Scheduler([node]).place("p", {"containers": [{"resources": {"requests": requests,
                                                                          "limits": {"nvidia.com/gpu": "1"}}}]})
    assert placed is None, (machine, requests, placed)


def test_an_8_gpu_v100_pod_is_scheduled_on_a_real_like_n1_standard_32(tmp_path):
    """The 8-GPU shape (n1-standard-32: 120 GB nominal, about 117.8 GiB of MemTotal). The former request
    (GKE's formula on the nominal memory, less 1.5 GiB) asked about 109.6 GiB where about 108.3 GiB is
    left once GKE's DaemonSets are there: FailedScheduling, Insufficient memory, for ever."""
    machine = DEFAULT_MACHINE_TYPE[8]
    vcpus, gib = n1_shape(machine)
    labels = {"cloud.google.com/gke-accelerator": "nvidia-tesla-v100", "cloud.google.com/gke-nodepool": "gpu"}
    fake = FakeKubeApi({r: healthy(r) for r in range(2)})
    fake.scheduler = Scheduler([gke_node(f"gke-gpu-{i}", vcpus, float(gib), 8, labels) for i in range(2)])
    c = Cluster(name="v100", cloud="gcp", nodes=(), gpus_per_node=8, instance_type=machine, kubeconfig="{}",
                outputs={"nodes": 2, "gpus_per_node": 8, "machine_type": machine,
                         "accelerator_type": "nvidia-tesla-v100", "node_pool_name": "gpu"})
    launcher = k8s.KubernetesLauncher(api=k8s.KubeApi(fake, fake, fake, stream=fake.stream), poll_interval=0,
                                      platform=gke.GKE, start_deadline_s=30)
    result = launcher.launch(c, job(), NullEvents(), tmp_path / "logs")
    assert result.ok, result.failure
    assert len(fake.scheduler.bound) == 2
    plan = k8s_plan.plan_job(c, job(), platform=gke.GKE)
    assert pod_requests(manifests.pod_template(plan).spec)["gpu"] == 8


def test_a_pool_whose_real_allocatable_is_below_the_formula_still_schedules(tmp_path):
    """Nodes of the pool exist (scaled up) and give pods less than the formula assumes: MemTotal 4 % below
    nominal (the formula takes 2.5 %) and DaemonSets holding 1.5 GiB (it takes 0.75). The formula's
    request does not fit them (FailedScheduling, Insufficient memory, until the start deadline); the
    launcher reads the nodes' status.allocatable and their DaemonSet pods' requests and asks what is left."""
    from k8s_fake_sched import DAEMONSET_CPU_M

    machine = DEFAULT_MACHINE_TYPE[8]
    vcpus, gib = n1_shape(machine)
    labels = {"cloud.google.com/gke-accelerator": "nvidia-tesla-v100", "cloud.google.com/gke-nodepool": "gpu"}

    def pool():
        return [gke_node(f"gke-gpu-{i}", vcpus, float(gib), 8, labels, shortfall=0.04, daemonset_mi=1536)
                for i in range(2)]

    formula = gke.pod_requests(machine)
    alone = Scheduler(pool()).place("p", {"containers": [{"resources": {"requests": formula}}]})
    assert alone is not None and "Insufficient memory" in alone  # the formula's pod would never run here
    fake = FakeKubeApi({r: healthy(r) for r in range(2)})
    fake.scheduler = Scheduler(pool())
    c = Cluster(name="v100", cloud="gcp", nodes=(), gpus_per_node=8, instance_type=machine, kubeconfig="{}",
                outputs={"nodes": 2, "gpus_per_node": 8, "machine_type": machine,
                         "accelerator_type": "nvidia-tesla-v100", "node_pool_name": "gpu"})
    said = []

    class Events(NullEvents):
        def message(self, text):
            said.append(text)

    launcher = k8s.KubernetesLauncher(api=k8s.KubeApi(fake, fake, fake, stream=fake.stream), poll_interval=0,
                                      platform=gke.GKE, start_deadline_s=30)
    result = launcher.launch(c, job(), Events(), tmp_path / "logs")
    assert result.ok, result.failure
    assert len(fake.scheduler.bound) == 2
    assert any("from the pool's nodes" in s for s in said)
    assert ("list", "node", "", "cloud.google.com/gke-accelerator=nvidia-tesla-v100,cloud.google.com/gke-nodepool=gpu") \
        in fake.calls
    node = fake.scheduler.nodes[0]
    assert node.used["memory"] <= node.mem_mi and DAEMONSET_CPU_M < node.used["cpu"] <= node.cpu_m


def test_a_pool_at_zero_keeps_the_formula(tmp_path):
    """No node yet (the autoscaler makes them for the pods): the conservative formula is what the pods ask."""
    fake = FakeKubeApi({0: healthy(0, 1)})
    machine = DEFAULT_MACHINE_TYPE[1]
    c = Cluster(name="v100", cloud="gcp", nodes=(), gpus_per_node=1, instance_type=machine, kubeconfig="{}",
                outputs={"nodes": 1, "gpus_per_node": 1, "machine_type": machine})
    launcher = k8s.KubernetesLauncher(api=k8s.KubeApi(fake, fake, fake, stream=fake.stream), poll_interval=0,
                                      platform=gke.GKE)
    assert launcher.launch(c, job(), NullEvents(), tmp_path / "logs").ok
    created = [c for c in fake.calls if c[:2] == ("create", "job")]
    assert created and any(c[:2] == ("list", "node") for c in fake.calls)
    plan = k8s_plan.plan_job(c, job(), platform=gke.GKE)
    assert dict(plan.requests) == gke.pod_requests(machine)
