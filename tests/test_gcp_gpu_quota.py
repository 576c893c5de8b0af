"""Issue 42: the GKE preflight asks each GPU's own regional quota: NVIDIA_H100_GPUS for an a3-highgpu
pool, NVIDIA_L4_GPUS for g2, PREEMPTIBLE_<metric> for spot where the project has it; a metric the
region does not list (NVIDIA_H200_GPUS, absent from the Compute v1 Quota.Metric enum as read on
2026-11-28) is reported as not checked, never as passed.

Against tests/google_fake.py's FakeProject, which answers Compute `regions.get` with the quotas[]
rows it holds (metric, limit, usage), as Compute Engine does
(https://cloud.google.com/compute/docs/reference/rest/v1/regions/get).
"""

from __future__ import annotations

import pytest

from google_fake import FakeProject

from gpucluster.infra.gcp import preflight
from gpucluster.infra.gcp.preflight import PreflightError, checks
from gpucluster.spec import ClusterSpec

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def spec(**kw):
    base = dict(cloud="gcp", nodes=2, name="gpu", region="us-central1", project="my-proj-42")
    base.update(kw)
    return ClusterSpec(**base)


def project_with(**regional):
    project = FakeProject().ready()
    project.global_quotas["CPUS_ALL_REGIONS"] = (1000.0, 0.0)
    project.regions["us-central1"]["CPUS"] = (1000.0, 0.0)
    project.regions["us-central1"].update(regional)
    return project


def by_check(found):
    return {c["check"]: c for c in found}


def test_h100_on_a3_asks_nvidia_h100_gpus_not_the_v100_metric():
    # plenty of V100 quota, 8 H100: 2 x a3-highgpu-8g need 16
    project = project_with(NVIDIA_V100_GPUS=(64.0, 0.0), NVIDIA_H100_GPUS=(8.0, 0.0))
    found = by_check(checks(spec(accelerator="H100", gpus_per_node=8), google=project, billing=project))
    h100 = found["gcp quota NVIDIA_H100_GPUS (us-central1)"]
    assert h100["ok"] is False
    assert "2 x a3-highgpu-8g (8 H100 each) needs 16" in h100["detail"]
    assert "nvidia_h100_gpus" in h100["fix"] and "another region that offers H100" in h100["fix"]
    assert not any("V100" in name for name in found)
    with pytest.raises(PreflightError, match=r"NVIDIA_H100_GPUS \(us-central1\)"):
        preflight.preflight(spec(accelerator="H100", gpus_per_node=8), google=project, billing=project)
    project.regions["us-central1"]["NVIDIA_H100_GPUS"] = (16.0, 0.0)
    found = by_check(checks(spec(accelerator="H100", gpus_per_node=8), google=project, billing=project))
    assert found["gcp quota NVIDIA_H100_GPUS (us-central1)"]["ok"] is True


def test_spot_l4_draws_on_the_preemptible_l4_quota():
    project = project_with(NVIDIA_L4_GPUS=(0.0, 0.0), PREEMPTIBLE_NVIDIA_L4_GPUS=(4.0, 0.0))
    found = by_check(checks(spec(accelerator="L4", gpus_per_node=1, spot=True), google=project, billing=project))
    assert found["gcp quota PREEMPTIBLE_NVIDIA_L4_GPUS (us-central1)"]["ok"] is True
    found = by_check(checks(spec(accelerator="L4", gpus_per_node=1), google=project, billing=project))
    assert found["gcp quota NVIDIA_L4_GPUS (us-central1)"]["ok"] is False


def test_a_metric_the_region_does_not_list_is_not_checked_rather_than_passed():
    project = project_with()
    found = by_check(checks(spec(accelerator="H200", gpus_per_node=8, zone="us-central1-b"), google=project,
                            billing=project))
    h200 = found["gcp quota NVIDIA_H200_GPUS (us-central1)"]
    assert h200["ok"] is None and "not" in h200["detail"]
