"""LimitRanges and ResourceQuotas on CPU and memory (issue 44 item 2), judged on the pod the run's Job will really
carry (the launcher's own manifests, the options added), as the LimitRanger and ResourceQuota admissions judge a
pod at its create. The LimitRanges are given as the API server serves them (tests/k8s_fake_limits.py `served`:
defaulted at their own create); a refused pod is refused here, before anything is created, in the plugin's words.
Each case is also put to the fake API server's own LimitRanger (tests/k8s_fake_limits.py), which must agree."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("kubernetes")

from k8s_fake_limits import pod_refusals, served  # noqa: E402

from gpucluster.errors import UsageError  # noqa: E402
from gpucluster.infra.kube import fit  # noqa: E402
from gpucluster.infra.kube.limits import job_pod, refusals  # noqa: E402
from gpucluster.infra.kubernetes.api import Retry  # noqa: E402
from gpucluster.watch.launch import JobSpec  # noqa: E402
from gpucluster.spec import ClusterSpec  # noqa: E402


def model(data, kind):
    from kubernetes.client import ApiClient

    return ApiClient()._ApiClient__deserialize(data, kind)


def the_pod(gpus=2, collect=False, **opts):
    from gpucluster.infra.kube.platform import kube_platform
    from gpucluster.infra.kube.plugin import KubeLauncher
    from gpucluster.infra.kube.provider import KubeProvider

    spec = ClusterSpec(cloud="kubernetes", nodes=2, gpus_per_node=gpus, name="lab",
                       options=tuple(sorted({"namespace": "team-a", **opts}.items())))
    launcher = KubeLauncher(KubeProvider(), namespace="team-a", platform=kube_platform(dict(spec.options)))
    job = JobSpec(run_id="r20261128-000000-abcdef", command=("python", "-c", "1"),
                  output_dir="/tmp/out" if collect else None)
    return job_pod(launcher, spec, job)


def ranges(*items, name="lr"):
    raw = {"metadata": {"name": name}, "spec": {"limits": list(items)}}
    return served(raw), model(served(raw), "V1LimitRange")


CASES = [  # (LimitRange item as written by an admin, gpus per pod, what the plugin says; None: admitted)
    ({"type": "Container", "max": {"cpu": "4", "memory": "8Gi"}}, 2, None),  # default = max fills every container
    ({"type": "Container", "max": {"nvidia.com/gpu": "2"}}, 3,
     "Maximum nvidia.com/gpu usage per Container is 2, but limit is 3. (container pytorch)"),
    ({"type": "Pod", "max": {"memory": "16Gi"}}, 1, "Maximum memory usage per Pod is 16Gi.  No limit is specified."),
    ({"type": "Container", "min": {"cpu": "500m"}}, 1, None),  # defaultRequest = min
    ({"type": "Container", "min": {"cpu": "500m"}, "defaultRequest": {"cpu": "100m"}}, 1,
     "Minimum cpu usage per Container is 500m, but request is 100m. (container pytorch)"),
    ({"type": "Container", "default": {"cpu": "4"}, "defaultRequest": {"cpu": "1"}, "maxLimitRequestRatio": {"cpu": "2"}},
     1, "cpu max limit to request ratio per Container is 2, but provided ratio is 4.000000. (container pytorch)"),
]


@pytest.mark.parametrize("item,gpus,said", CASES)
def test_the_run_pod_against_each_limit_range_as_the_plugin_judges_it(item, gpus, said):
    pod = the_pod(gpus)
    as_json, as_model = ranges(item)
    got = refusals(pod, [as_model])
    assert (got[0][1] if got else None) == said, got
    assert bool(pod_refusals(pod, [as_json])) == bool(said)  # the fake API server's admission agrees
    core = NS(list_namespaced_limit_range=lambda ns: NS(items=[as_model]))
    if said:
        with pytest.raises(UsageError, match="LimitRange lr in namespace team-a refuses the run's pods"):
            fit.check_limits(core, "team-a", pod, "nvidia.com/gpu", gpus, Retry(0), fit.Fit())
    else:
        fit.check_limits(core, "team-a", pod, "nvidia.com/gpu", gpus, Retry(0), fit.Fit())


def test_a_pod_limit_counts_the_keeper_beside_the_training_container():
    """With --output the pod has a keeper container (10m CPU, 32Mi, no limit): a Pod max on CPU counts both, the
    keeper with the Container default's limit."""
    item = {"type": "Container", "default": {"cpu": "2"}, "defaultRequest": {"cpu": "1"}}
    pod = the_pod(1, collect=True)
    assert [c["name"] for c in pod["containers"]] == ["pytorch", "gpucluster"]
    _, lr = ranges(item, {"type": "Pod", "max": {"cpu": "2"}})  # the keeper gets the default limit too: 2 + 2
    assert refusals(pod, [lr]) == [("lr", "Maximum cpu usage per Pod is 2, but limit is 4.")]
    _, lr = ranges(item, {"type": "Pod", "max": {"cpu": "4"}})
    assert refusals(pod, [lr]) == []


def quota(hard, used=None):
    return model({"metadata": {"name": "q"}, "spec": {"hard": hard},
                  "status": {"hard": hard, "used": used or {}}}, "V1ResourceQuota")


def test_a_cpu_quota_is_met_by_the_limit_range_defaults_and_counted_per_pod():
    pod = the_pod(1)
    need = fit.needs(2, 1, "nvidia.com/gpu", "job", False)
    core = NS(list_namespaced_resource_quota=lambda ns: NS(items=[quota({"requests.cpu": "2500m"}, {"requests.cpu": "1"})]))
    with pytest.raises(UsageError, match="every container must state requests.cpu, and the run's pytorch, "
                                         "wait-for-peers do not"):
        fit.check_quota(core, "team-a", need, Retry(0), fit.Fit(), pod, [], 2)
    _, lr = ranges({"type": "Container", "default": {"cpu": "2"}, "defaultRequest": {"cpu": "1"}})
    with pytest.raises(UsageError, match=r"allows requests.cpu 2.5 with 1 in use; the run needs 2: it does not fit now"):
        fit.check_quota(core, "team-a", need, Retry(0), fit.Fit(), pod, [lr], 2)
    roomy = NS(list_namespaced_resource_quota=lambda ns: NS(items=[quota({"cpu": "8", "limits.cpu": "4"})]))
    ok = fit.Fit()
    fit.check_quota(roomy, "team-a", need, Retry(0), ok, pod, [lr], 2)
    assert ok.notes == ["fits the namespace's ResourceQuota (q)"]
