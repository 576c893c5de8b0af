"""Issue 42: the real GKE Pulumi program (infra/gcp/component.py) under Pulumi's mock runtime for one
shape of each GPU family: the GPU pool's machine type, GKE's accelerator name and count, gVNIC on,
the taint and driver as for V100; and the training image by the GPU's generation (a CUDA 12.6 build for
Volta/Turing, whose sm_70 the cu128/cu130 wheels dropped: pytorch/pytorch#172352; CUDA 12.8 after).
The mocks echo inputs (as tests/test_gcp_infra.py's RecordingMocks do): what is checked is what the
program declares, which is what GKE's API would be sent."""

from __future__ import annotations

import pytest

pulumi = pytest.importorskip("pulumi")
pytest.importorskip("pulumi_gcp")

from test_gcp_infra import RecordingMocks, after, declare  # noqa: E402

from gpucluster.infra.gcp import catalog  # noqa: E402
from gpucluster.infra.gcp.gke import CURRENT_GPU_IMAGE, LEGACY_GPU_IMAGE, default_image  # noqa: E402
from gpucluster.spec import ClusterSpec  # noqa: E402

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


@pytest.fixture
def mocks():
    m = RecordingMocks()
    pulumi.runtime.set_mocks(m, project="gpucluster", stack="gcp-gpus", preview=False)
    return m


def gpu_spec(gpu: str, count: int, **kw) -> ClusterSpec:
    base = dict(cloud="gcp", nodes=2, name="gpus", region="us-central1", accelerator=gpu, gpus_per_node=count,
                run_id="r20261128-080000-abc123", project="my-proj")
    return catalog.resolve(ClusterSpec(**{**base, **kw}))


FAMILIES = [  # (gpu, count, spot, machine type, GKE accelerator)
    ("T4", 2, False, "n1-standard-8", "nvidia-tesla-t4"),
    ("L4", 1, False, "g2-standard-4", "nvidia-l4"),
    ("A100", 8, False, "a2-highgpu-8g", "nvidia-tesla-a100"),
    ("A100-80GB", 4, False, "a2-ultragpu-4g", "nvidia-a100-80gb"),
    ("H100", 8, False, "a3-highgpu-8g", "nvidia-h100-80gb"),
    ("H100", 2, True, "a3-highgpu-2g", "nvidia-h100-80gb"),
    ("H200", 8, False, "a3-ultragpu-8g", "nvidia-h200-141gb"),
]


@pytest.mark.parametrize("gpu,count,spot,machine,accelerator", FAMILIES)
@pulumi.runtime.test
def test_gpu_pool_per_family(mocks, gpu, count, spot, machine, accelerator):
    s = gpu_spec(gpu, count, spot=spot)
    assert catalog.validate_spec(s) == []
    outputs = declare(s)

    def check(_):
        nc = mocks.pool("gpu")["nodeConfig"]
        assert nc["machineType"] == machine and nc["spot"] is spot
        assert nc["guestAccelerators"] == [{"type": accelerator, "count": count,
                                            "gpuDriverInstallationConfig": {"gpuDriverVersion": "LATEST"}}]
        assert nc["gvnic"] == {"enabled": True}
        # A3 Ultra boots from Hyperdisk only (infra/gcp/shapes.py BOOT_DISK_TYPES); the others from pd-balanced
        assert nc["diskType"] == ("hyperdisk-balanced" if machine == "a3-ultragpu-8g" else "pd-balanced")
        assert nc["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}]

    return after(outputs, check)


def test_the_default_image_follows_the_gpu_generation():
    assert default_image({"accelerator_type": "nvidia-tesla-v100"}) == LEGACY_GPU_IMAGE  # Volta
    assert default_image({"accelerator_type": "nvidia-tesla-t4"}) == LEGACY_GPU_IMAGE  # Turing
    for acc in ("nvidia-l4", "nvidia-tesla-a100", "nvidia-a100-80gb", "nvidia-h100-80gb", "nvidia-h200-141gb"):
        assert default_image({"accelerator_type": acc}) == CURRENT_GPU_IMAGE, acc
    assert "cuda12.6" in LEGACY_GPU_IMAGE and "cuda12.8" in CURRENT_GPU_IMAGE
    assert default_image({}) is None  # unknown: the launcher's own default
