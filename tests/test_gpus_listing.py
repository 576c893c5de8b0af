"""Issue 42 item 4: `gpucluster gpus` lists every GPU `--gpu` takes: memory, the clouds and machines
(GPUs per node), and the cheapest on-demand and spot $/GPU-hour with where, the date read and the
source, priced by each backend's own rules (EC2: the instance row; GCE: host row + COUNT GPU rows).
Figures are hand-computed from gpucluster/catalog/data/prices.json (SkyPilot catalogs/v8, read
2026-11-28)."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from gpucluster.catalog.listing import gpu_listing
from gpucluster.catalog.prices import load_catalog
from gpucluster.errors import UsageError
from gpucluster.infra.registry import plugins

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


@pytest.fixture(scope="module")
def listing():
    return {e["gpu"]: e for e in gpu_listing(plugins(), load_catalog(False))}


def test_every_known_gpu_is_listed_with_its_clouds_and_counts(listing):
    assert list(listing) == ["T4", "V100", "A10G", "L4", "L40S", "A100", "A100-80GB", "H100", "H200", "B200"]
    h100 = listing["H100"]
    assert h100["memory_gib"] == 80.0 and h100["generation"] == "hopper"
    assert {(s["machine"], s["gpus"]) for s in h100["clouds"]["aws"]} == {("p5.4xlarge", 1), ("p5.48xlarge", 8)}
    assert {s["machine"]: s["on_demand"] for s in h100["clouds"]["gcp"]} == {
        "a3-highgpu-1g": False, "a3-highgpu-2g": False, "a3-highgpu-4g": False, "a3-highgpu-8g": True}
    assert set(listing["B200"]["clouds"]) == {"aws"} and set(listing["T4"]["clouds"]) == {"gcp"}


def test_cheapest_per_gpu_hour_is_computed_with_each_clouds_rules(listing):
    # GCE: (g2-standard-4 host 0.14679 + 1 x L4 0.56004) / 1 = 0.70683, cheaper than EC2 g6.xlarge 0.8048
    l4 = listing["L4"]["cheapest"]["on-demand"]
    assert (l4["cloud"], l4["region"], l4["machine"], Decimal(l4["per_gpu_hour"])) == (
        "gcp", "us-central1", "g2-standard-4", Decimal("0.7068"))
    assert l4["date"] == "2026-11-28" and "catalogs/v8/gcp/vms.csv" in l4["source"]
    # EC2: p6-b200.48xlarge 113.9328 / 8
    b200 = listing["B200"]["cheapest"]["on-demand"]
    assert (b200["machine"], Decimal(b200["per_gpu_hour"])) == ("p6-b200.48xlarge", Decimal("14.2416"))
    # spot: p5.48xlarge in us-west-2, 16.1301 / 8; a spot-only A3 shape is priced on the spot market only
    h100 = listing["H100"]["cheapest"]
    assert (h100["spot"]["cloud"], h100["spot"]["region"], Decimal(h100["spot"]["per_gpu_hour"])) == (
        "aws", "us-west-2", Decimal("2.0163"))
    assert h100["on-demand"]["machine"] in ("a3-highgpu-8g", "p5.4xlarge", "p5.48xlarge")


def test_one_gpu_by_any_spelling_and_unknown_names(listing):
    (only,) = gpu_listing(plugins(), load_catalog(False), "nvidia-h200-141gb")
    assert only["gpu"] == "H200"
    with pytest.raises(UsageError, match=r'did you mean "H100"'):
        gpu_listing(plugins(), load_catalog(False), "H10")


def test_the_cli_prints_json(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from gpucluster.cli.gpus import gpus

    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path))
    res = CliRunner().invoke(gpus, ["--gpu", "l40s", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    (l40s,) = doc["gpus"]
    assert doc["currency"] == "USD" and l40s["cheapest"]["on-demand"]["machine"] == "g6e.xlarge"
