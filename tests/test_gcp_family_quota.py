"""Issue 42: the GKE preflight checks the vCPU quota of the GPU nodes' machine family before anything is made:
A3_CPUS for a3-highgpu-8g, G2_CPUS for g2, A2_CPUS for a2, the regional CPUS for N1 (+ V100/T4) and for the
system and default nodes. Before, every GPU node was counted against CPUS: a project with CPUS to spare and
A3_CPUS at 0 passed the preflight and failed at node-pool creation, after the cluster (and its fee) existed.

Against tests/google_fake.py's FakeProject: Compute `regions.get` lists the family metrics beside CPUS, and
`create_instance` takes a VM's vCPUs from its family's quota and refuses past the limit with Compute Engine's
403 "Quota 'A3_CPUS' exceeded" (Cloud Quotas terminology, "CPUS-PER-VM-FAMILY-per-project-region"; the
Compute v1 Quota.Metric enum, https://cloud.google.com/compute/docs/reference/rest/v1/regions; gcpdiag
gcpdiag/lint/gce/warn_2022_005_cpu_quota.py). The preflight and the fake agree: what one refuses the other does.
"""

from __future__ import annotations

import pytest

from google_fake import FakeProject

from gpucluster.infra.gcp import preflight
from gpucluster.infra.gcp.preflight import ApiError, PreflightError, checks
from gpucluster.infra.gcp.shapes import BY_NAME, cpu_quota_metric
from gpucluster.spec import ClusterSpec

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def spec(**kw):
    base = dict(cloud="gcp", nodes=2, name="gpu", region="us-central1", project="my-proj-42")
    base.update(kw)
    return ClusterSpec(**base)


def project(**regional):
    """GPU quota to spare everywhere, the regional CPUS at 1000: only the family metric can refuse."""
    p = FakeProject().ready()
    p.global_quotas["CPUS_ALL_REGIONS"] = (5000.0, 0.0)
    p.global_quotas["GPUS_ALL_REGIONS"] = (64.0, 0.0)
    p.regions["us-central1"].update(CPUS=(1000.0, 0.0), NVIDIA_H100_GPUS=(64.0, 0.0), NVIDIA_L4_GPUS=(64.0, 0.0),
                                    NVIDIA_A100_GPUS=(64.0, 0.0), IN_USE_ADDRESSES=(64.0, 0.0))
    p.regions["us-central1"].update(regional)
    return p


def by_check(found):
    return {c["check"]: c for c in found}


def test_the_family_metric_of_each_gpu_machine():
    assert [cpu_quota_metric(m) for m in ("n1-standard-8", "e2-medium", "a2-highgpu-1g", "a2-ultragpu-8g",
                                          "g2-standard-24", "a3-highgpu-8g", "a3-ultragpu-8g")] == [
        "CPUS", "CPUS", "A2_CPUS", "A2_CPUS", "G2_CPUS", "A3_CPUS", "A3_CPUS"]


def test_a3_nodes_are_refused_on_a3_cpus_even_with_cpus_to_spare():
    p = project()  # A3_CPUS at 0, as a new project has it
    s = spec(accelerator="H100", gpus_per_node=8)
    with pytest.raises(PreflightError) as err:
        preflight.preflight(s, google=p, billing=p)
    msg = err.value.message
    assert msg.startswith("gcp quota A3_CPUS (us-central1): 0 used of 0 in us-central1: the GPU nodes "
                          "(2 x a3-highgpu-8g (8 H100 each)) needs 416"), msg
    assert "\n" not in msg and err.value.exit_code == 2
    assert "filter: metric compute.googleapis.com/a3_cpus, region us-central1" in msg
    # the cloud agrees: the first a3-highgpu-8g node is refused on A3_CPUS, whatever CPUS holds
    with pytest.raises(ApiError, match=r"Quota 'A3_CPUS' exceeded"):
        p.create_instance("us-central1", "a3-highgpu-8g", BY_NAME["a3-highgpu-8g"].vcpus)

    p.regions["us-central1"]["A3_CPUS"] = (416.0, 0.0)
    found = by_check(checks(s, google=p, billing=p))
    assert found["gcp quota A3_CPUS (us-central1)"]["ok"] is True
    # CPUS carries only the system node (n1-standard-2) and GKE's default e2-medium: 4, not 420
    assert found["gcp quota CPUS (us-central1)"]["detail"].endswith("(4)"), found["gcp quota CPUS (us-central1)"]
    preflight.preflight(s, google=p, billing=p)
    for _ in range(2):  # and the cloud makes both nodes
        p.create_instance("us-central1", "a3-highgpu-8g", 208)


@pytest.mark.parametrize("gpu, count, metric, need", [("L4", 1, "G2_CPUS", 8), ("A100", 1, "A2_CPUS", 24)])
def test_g2_and_a2_nodes_draw_on_their_family_quota(gpu, count, metric, need):
    p = project(**{metric: (need - 1.0, 0.0)})
    s = spec(accelerator=gpu, gpus_per_node=count)
    with pytest.raises(PreflightError, match=rf"gcp quota {metric} \(us-central1\): 0 used of {need - 1:g} in "
                                             rf"us-central1: the GPU nodes \(2 x [a-z0-9-]+ .*\) needs {need}"):
        preflight.preflight(s, google=p, billing=p)
    p.regions["us-central1"][metric] = (float(need), 0.0)
    preflight.preflight(s, google=p, billing=p)


def test_n1_v100_nodes_still_draw_on_cpus_with_the_system_and_default_nodes():
    p = project(CPUS=(19.0, 0.0), NVIDIA_V100_GPUS=(8.0, 0.0))
    found = by_check(checks(spec(gpus_per_node=2), google=p, billing=p))  # 2 x n1-standard-8 + 2 + 2 = 20
    cpus = found["gcp quota CPUS (us-central1)"]
    assert cpus["ok"] is False and "needs 20" in cpus["detail"], cpus
    assert not any(name.startswith("gcp quota A") or name.startswith("gcp quota G2") for name in found)


def test_spot_family_nodes_use_preemptible_cpus_where_the_project_has_it():
    p = project(PREEMPTIBLE_CPUS=(500.0, 0.0), PREEMPTIBLE_NVIDIA_H100_GPUS=(16.0, 0.0))
    found = by_check(checks(spec(accelerator="H100", gpus_per_node=8, spot=True), google=p, billing=p))
    assert found["gcp quota PREEMPTIBLE_CPUS (us-central1)"]["ok"] is True
    assert "gcp quota A3_CPUS (us-central1)" not in found
    p.create_instance("us-central1", "a3-highgpu-8g", 208, spot=True)  # the cloud takes it from PREEMPTIBLE_CPUS


def test_a_family_metric_the_region_does_not_list_is_not_checked_rather_than_passed():
    p = project()
    del p.regions["us-central1"]["G2_CPUS"]
    found = by_check(checks(spec(accelerator="L4", gpus_per_node=1), google=p, billing=p))
    g2 = found["gcp quota G2_CPUS (us-central1)"]
    assert g2["ok"] is None and "lists no G2_CPUS" in g2["detail"]
