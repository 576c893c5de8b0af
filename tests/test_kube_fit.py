"""The kubernetes backend's judgement of a cluster, on the API's objects as the client returns them (typed
models built from the API's JSON), without a server: which nodes a run's pods may use (cordons, labels,
taints), whether N pods × G GPUs fit ever or now, a ResourceQuota's room, and the options' forms."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("kubernetes")

from gpucluster.errors import SpecError, UsageError  # noqa: E402
from gpucluster.infra.kube import fit, options  # noqa: E402
from gpucluster.infra.kubernetes.api import Retry  # noqa: E402
from gpucluster.spec import ClusterSpec  # noqa: E402


def model(data, kind):
    from kubernetes.client import ApiClient

    return ApiClient()._ApiClient__deserialize(data, kind)


def node(name, gpus, labels=None, taints=None, cordoned=False, resource="nvidia.com/gpu"):
    return model({"metadata": {"name": name, "labels": labels or {}},
                  "spec": {"taints": taints or [], "unschedulable": cordoned or None},
                  "status": {"allocatable": {"cpu": "8", resource: str(gpus)}}}, "V1Node")


def pod(on, gpus):
    return model({"metadata": {"name": f"p-{on}"}, "spec": {"nodeName": on, "containers": [
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}, "status": {"phase": "Running"}},
        "V1Pod")


class Core:
    def __init__(self, nodes, pods=(), quotas=(), limits=()):
        self.nodes, self.pods, self.quotas, self.limits = list(nodes), list(pods), list(quotas), list(limits)

    def list_node(self):
        return NS(items=self.nodes)

    def list_pod_for_all_namespaces(self):
        return NS(items=self.pods)

    def list_namespaced_resource_quota(self, namespace):
        return NS(items=self.quotas)

    def list_namespaced_limit_range(self, namespace):
        return NS(items=self.limits)


def spec(**opts):
    return ClusterSpec(cloud="kubernetes", nodes=2, options=tuple(sorted(opts.items())))


def judge(core, nodes=2, gpus=1, queued=False, **opts):
    result = fit.Fit()
    fit.check_nodes(core, nodes, gpus, options.gpu_resource(spec(**opts)), options.passthrough(spec(**opts)),
                    queued, Retry(0), result)
    return result


def test_never_fits_names_the_largest_node_and_why_the_others_are_not_eligible():
    core = Core([node("a", 4), node("b", 8, taints=[{"key": "team", "value": "x", "effect": "NoSchedule"}]),
                 node("c", 8, cordoned=True), node("d", 8, labels={"nvidia.com/gpu.product": "T4"}),
                 node("e", 4, taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]),
                 node("f", 8, taints=[{"key": "x", "effect": "PreferNoSchedule"}])])
    with pytest.raises(UsageError) as exc:
        judge(core, nodes=2, gpus=16)
    msg = exc.value.message
    assert msg.startswith("2 nodes × 16 GPUs requested; the largest node has 8 allocatable nvidia.com/gpu"), msg
    assert "b: taint team=x:NoSchedule not tolerated" in msg and "c: cordoned" in msg and "it can never fit" in msg
    assert " e: " not in msg and " f: " not in msg  # the GPU taint is tolerated; PreferNoSchedule only steers
    with pytest.raises(UsageError, match=r"; the largest node has 8 allocatable nvidia.com/gpu and 2 node\(s\) have 8"):
        judge(core, nodes=3, gpus=8)
    assert judge(core, nodes=3, gpus=8, tolerations="team=x:NoSchedule").notes  # b becomes eligible
    with pytest.raises(UsageError) as exc:
        judge(core, nodes=2, gpus=1, gpuProduct="T4")
    assert "and 1 node(s) have 1" in exc.value.message and "a: label nvidia.com/gpu.product=(unset)" in exc.value.message


def test_gpus_held_now_refuse_without_a_queue_and_wait_with_one():
    core = Core([node("a", 4), node("b", 4)], pods=[pod("a", 4), pod("b", 2)])
    with pytest.raises(UsageError, match=r"1 node\(s\) have 2 free nvidia.com/gpu now"):
        judge(core, nodes=2, gpus=2)
    assert "admission is waited for" in judge(core, nodes=2, gpus=2, queued=True).notes[0]
    assert judge(core, nodes=1, gpus=2).notes == ["fits: 1 eligible node(s) have 2 free nvidia.com/gpu now"]


def test_a_resource_no_node_offers():
    with pytest.raises(UsageError, match=r"no node of the cluster offers amd.com/gpu \(offered: nvidia.com/gpu\)"):
        judge(Core([node("a", 4)]), gpuResource="amd.com/gpu")
    assert judge(Core([node("a", 4, resource="amd.com/gpu")] * 2), gpuResource="amd.com/gpu").notes


def test_quota_room_and_a_quota_on_cpu():
    def quota(hard, used):
        return model({"metadata": {"name": "q"}, "spec": {"hard": hard}, "status": {"hard": hard, "used": used}},
                     "V1ResourceQuota")

    need = fit.needs(2, 4, "nvidia.com/gpu", "job", False)
    with pytest.raises(UsageError, match="allows requests.nvidia.com/gpu 4; the run needs 8: it can never fit"):
        fit.check_quota(Core([], quotas=[quota({"requests.nvidia.com/gpu": "4"}, {})]), "ns", need, Retry(0), fit.Fit())
    with pytest.raises(UsageError, match="allows count/jobs.batch 3 with 3 in use; the run needs 1"):
        fit.check_quota(Core([], quotas=[quota({"count/jobs.batch": "3"}, {"count/jobs.batch": "3"})]), "ns", need,
                        Retry(0), fit.Fit())
    with pytest.raises(UsageError, match="limits requests.cpu, so every pod must state it"):
        fit.check_quota(Core([], quotas=[quota({"requests.cpu": "64"}, {})]), "ns", need, Retry(0), fit.Fit())
    ok = fit.Fit()
    fit.check_quota(Core([], quotas=[quota({"requests.nvidia.com/gpu": "16", "pods": "10"}, {"pods": "2"})]), "ns",
                    need, Retry(0), ok)
    assert ok.notes == ["fits the namespace's ResourceQuota (q)"]


def test_a_limit_range_under_the_gpus_a_pod_asks():
    lr = model({"metadata": {"name": "small"}, "spec": {"limits": [{"type": "Container", "max": {"nvidia.com/gpu": "2"}},
                                                                     {"type": "Pod", "max": {"cpu": "4"}}]}},
               "V1LimitRange")
    with pytest.raises(UsageError, match="LimitRange small in namespace ns allows at most 2 nvidia.com/gpu per "
                                         r"container; the run asks 4 \(--gpus-per-node\)"):
        fit.check_limits(Core([], limits=[lr]), "ns", None, "nvidia.com/gpu", 4, Retry(0), fit.Fit())
    fit.check_limits(Core([], limits=[lr]), "ns", None, "nvidia.com/gpu", 2, Retry(0), fit.Fit())


@pytest.mark.parametrize("key,value", [("tolerations", "a=b:Never"), ("tolerations", "=b:NoSchedule"),
                                       ("nodeSelector", "a"), ("nodeSelector", "a=b c"), ("queue", "-q"),
                                       ("priorityClass", "High"), ("serviceAccount", "a_b"),
                                       ("imagePullSecret", "a/b"), ("gpuResource", "gpu"), ("namespace", "Team"),
                                       ("pricePerGpuHour", "x"), ("pricePerGpuHour", "NaN"), ("launcher", "mpi"),
                                       ("createNamespace", "maybe")])
def test_every_option_is_checked_for_form(key, value):
    with pytest.raises(SpecError, match="is not allowed"):
        options.validate_spec(spec(**{key: value}))


def test_options_parse_as_kubectl_writes_them():
    extra = options.passthrough(spec(tolerations="a=b:NoSchedule,gpu:NoExecute", nodeSelector="pool=gpu,zone=a",
                                     gpuProduct="NVIDIA-A100"))
    assert [(t.key, t.value, t.effect) for t in extra.tolerations] == [("a", "b", "NoSchedule"), ("gpu", None, "NoExecute")]
    assert dict(extra.node_selector) == {"pool": "gpu", "zone": "a", "nvidia.com/gpu.product": "NVIDIA-A100"}
    assert options.resolve(spec()).gpus_per_node == 1 and options.resolve(spec().replace(gpus_per_node=0)).gpus_per_node == 0
