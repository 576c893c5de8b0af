"""Issue 42: the GKE GPU pool's boot disk type per machine series, checked before anything is created.

A3 Ultra (a3-ultragpu-8g, H200) boots from Hyperdisk only; G2 (L4) and A3 High (H100) take no pd-standard;
N1 and A2 take every Persistent Disk type (Google Cloud docs, accelerator-optimized machine family, each
series' supported disk types: infra/gcp/shapes.py BOOT_DISK_TYPES, with what could and could not be read
from here). Before, every pool got pd-balanced: an H200 pool was declared with a boot disk its machines
cannot take, and GKE refused it minutes after the cluster was made. Hyperdisk Balanced draws on its own
regional quota, HDB_TOTAL_GB (the metric Compute Engine names refusing it: "Quota 'HDB_TOTAL_GB'
exceeded. Limit: 500.0 in region us-central1"), which the stand-in Google lists like any other.
"""

from __future__ import annotations

import pytest

from google_fake import FakeProject

from gpucluster.errors import SpecError
from gpucluster.infra.gcp import catalog, preflight
from gpucluster.infra.gcp.preflight import checks
from gpucluster.spec import ClusterSpec

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def spec(**kw):
    base = dict(cloud="gcp", nodes=2, name="gpu", region="us-central1", project="my-proj-42")
    base.update(kw)
    return ClusterSpec(**base)


H200 = dict(accelerator="H200", gpus_per_node=8, zone="us-central1-b")


def test_a3_ultra_defaults_to_hyperdisk_balanced_the_others_keep_pd_balanced():
    assert catalog.resolve(spec(**H200)).disk_type == "hyperdisk-balanced"
    assert catalog.validate_spec(spec(**H200)) == []
    for kw in (dict(accelerator="L4"), dict(accelerator="H100", gpus_per_node=8), dict(accelerator="A100"), {}):
        assert catalog.resolve(spec(**kw)).disk_type == "pd-balanced", kw


@pytest.mark.parametrize("kw, disk, machine, allowed", [
    (H200, "pd-balanced", "a3-ultragpu-8g", "hyperdisk-balanced"),
    (H200, "pd-ssd", "a3-ultragpu-8g", "hyperdisk-balanced"),
    (dict(accelerator="L4"), "pd-standard", "g2-standard-4", "pd-balanced, pd-ssd"),
    (dict(accelerator="H100", gpus_per_node=8), "pd-standard", "a3-highgpu-8g", "pd-balanced, pd-ssd, hyperdisk-balanced"),
    (dict(), "hyperdisk-balanced", "n1-standard-4", "pd-standard, pd-balanced, pd-ssd"),
])
def test_a_boot_disk_the_series_cannot_take_is_refused_naming_both_and_the_source(kw, disk, machine, allowed):
    with pytest.raises(SpecError) as err:
        catalog.validate_spec(spec(disk_type=disk, **kw))
    msg = err.value.message
    assert msg.startswith(f"disk type {disk!r} is not allowed as the boot disk of {machine} nodes; allowed: {allowed} ")
    assert "accelerator-optimized-machines" in msg and "\n" not in msg and err.value.exit_code == 2


def test_series_that_take_it_accept_pd_standard_and_pd_ssd():
    assert catalog.validate_spec(spec(disk_type="pd-standard", accelerator="A100")) == []
    assert catalog.validate_spec(spec(disk_type="pd-ssd", accelerator="L4")) == []
    assert catalog.validate_spec(spec(disk_type="hyperdisk-balanced", accelerator="H100", gpus_per_node=8)) == []


def test_hyperdisk_boot_disks_are_checked_on_hdb_total_gb():
    p = FakeProject().ready()
    p.global_quotas.update(GPUS_ALL_REGIONS=(64.0, 0.0), CPUS_ALL_REGIONS=(5000.0, 0.0))
    p.regions["us-central1"].update(NVIDIA_H200_GPUS=(16.0, 0.0), A3_CPUS=(448.0, 0.0), HDB_TOTAL_GB=(150.0, 0.0))
    s = spec(disk_gb=100, **H200)
    assert preflight.needs(s)["disks"] == {"HDB_TOTAL_GB": 200, "SSD_TOTAL_GB": 150}  # the system and default pools
    found = {c["check"]: c for c in checks(s, google=p, billing=p)}
    hdb = found["gcp quota HDB_TOTAL_GB (us-central1)"]
    assert hdb["ok"] is False and "0 used of 150 in us-central1" in hdb["detail"] and "needs 200" in hdb["detail"]
    p.regions["us-central1"]["HDB_TOTAL_GB"] = (200.0, 0.0)
    preflight.preflight(s, google=p, billing=p)
