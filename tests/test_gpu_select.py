"""Issue 42: `--gpu TYPE[:COUNT]` on run, up, sweep, cost estimate, task files and stack config: the
GPU names (case-insensitive, aliases, did-you-mean), the cheapest machine of the cloud and region
with exactly COUNT of that GPU (by the price catalog's dated rows), and the bad-input refusals:
one line, exit 2, no traceback, nothing created.

Prices and zones come from the shipped catalogs (gpucluster/catalog/data/prices.json, read from
SkyPilot's catalogs/v8/aws/vms.csv on 2026-11-28; infra/aws/shapes.py, moto 5.2.5's EC2 offerings).
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from gpucluster.catalog import gpus
from gpucluster.catalog.prices import load_catalog
from gpucluster.errors import SpecError, UsageError
from gpucluster.infra.aws import catalog as aws
from gpucluster.spec import ClusterSpec
from gpucluster.plan.stackconfig import spec_from_config

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def aws_spec(**kw) -> ClusterSpec:
    return ClusterSpec(**{**dict(cloud="aws", nodes=2, region="us-east-1"), **kw})


def picked(gpu: str, count: int, **kw) -> str:
    return aws.instance_type_of(aws_spec(accelerator=gpu, gpus_per_node=count, **kw)).name


def test_names_are_case_insensitive_with_aliases_and_a_did_you_mean():
    assert gpus.parse("h100:8") == ("H100", 8)
    assert gpus.parse("L4") == ("L4", 1)  # COUNT defaults to 1
    assert gpus.parse("nvidia-tesla-v100:2") == ("V100", 2)  # GKE's accelerator name
    assert gpus.parse("a100-80gb:4") == ("A100-80GB", 4)
    with pytest.raises(UsageError, match=r'gpu \'X100\' is not known \(did you mean "V100"\?\); known GPUs: T4, '):
        gpus.parse("X100")
    with pytest.raises(UsageError, match=r'did you mean "H100"'):
        gpus.parse("h10:8")
    for bad in ("H100:0", "H100:x", "H100:8:1", ":8"):
        with pytest.raises(UsageError, match="TYPE:COUNT|TYPE\\[:COUNT\\]"):
            gpus.parse(bad)


def test_the_cheapest_type_with_exactly_that_many_gpus_in_the_region():
    assert picked("H100", 8) == "p5.48xlarge" and picked("H100", 1) == "p5.4xlarge"
    assert picked("L4", 1) == "g6.xlarge"  # $0.8048/h, the cheapest of the 1-GPU g6 sizes priced there
    assert picked("L4", 4) == "g6.12xlarge"  # g6.24xlarge carries 4 too, at more vCPUs and no price row
    assert picked("L40S", 8) == "g6e.48xlarge" and picked("A100", 8) == "p4d.24xlarge"
    assert picked("A100-80GB", 8) == "p4de.24xlarge" and picked("B200", 8) == "p6-b200.48xlarge"
    assert picked("H200", 8) == "p5en.48xlarge"  # p5e is not offered in us-east-1
    assert picked("A10G", 1) == "g5.xlarge"
    assert picked("L4", 8, region="us-west-2", spot=True) == "g6.48xlarge"
    # no price in us-east-2 for either H200 type: the one sold on demand somewhere (p5en) before p5e, which
    # the catalog never prices on demand (capacity blocks)
    assert picked("H200", 8, region="us-east-2") == "p5en.48xlarge"


def test_the_pick_follows_the_prices_not_a_fixed_list(tmp_path, monkeypatch):
    # a user catalog (what `prices refresh` writes) that makes g6.4xlarge the cheapest 1 x L4 in us-east-1
    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path))
    row = {"cloud": "aws", "region": "us-east-1", "kind": "instance", "item": "g6.4xlarge", "market": "on-demand",
           "unit": "hour", "price": "0.5", "gpus": 1, "gpu": "L4", "source": "test", "date": "2026-12-01"}
    (tmp_path / "prices.json").write_text(json.dumps({"format": 1, "currency": "USD", "rows": [row]}))
    assert picked("L4", 1) == "g6.4xlarge"
    assert load_catalog().get("aws", "us-east-1", "instance", "g6.4xlarge").price == Decimal("0.5")


def test_zones_of_the_picked_type_come_from_the_catalog():
    p5 = aws.instance_type_of(aws_spec(accelerator="H100", gpus_per_node=8))
    assert p5.zones_in("us-east-1") == ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1e",
                                        "us-east-1f")
    assert p5.zones_in("eu-west-1") == ()
    assert aws.INSTANCE_TYPES["p4de.24xlarge"].zones_in("us-east-1") == ("us-east-1b", "us-east-1c")


def test_a_count_that_does_not_exist_lists_the_counts_that_do():
    with pytest.raises(SpecError) as err:
        picked("H100", 3)
    assert str(err.value) == ("gpu H100:3 is not allowed: no aws machine carries 3 × H100; GPUs per node that "
                              "exist: 1, 8 (1: p5.4xlarge; 8: p5.48xlarge)")


def test_a_region_without_the_gpu_says_where_it_is_and_at_what_price():
    with pytest.raises(SpecError) as err:
        picked("H200", 8, region="eu-west-1")
    msg = str(err.value)
    assert msg.startswith("gpu H200:8 is not offered on aws in region 'eu-west-1'")
    assert "us-east-1 (p5en.48xlarge $63.296/h)" in msg and "us-west-2 (p5en.48xlarge $63.296/h)" in msg
    assert msg.index("us-east-1 (") < msg.index("not priced")  # the priced regions first
    assert msg.endswith("pass --region")


def test_a_gpu_the_cloud_lacks_is_refused_with_what_it_has():
    with pytest.raises(SpecError, match=r"gpu T4 is not offered on aws in gpucluster's catalog.*aws offers: A100"):
        picked("T4", 1)


def test_gpu_and_instance_type_that_contradict_are_refused_naming_both():
    with pytest.raises(SpecError) as err:
        aws.validate_spec(aws_spec(accelerator="H100", gpus_per_node=8, instance_type="g5.xlarge",
                                   ssh_cidr="203.0.113.7/32"))
    assert ("gpu H100:8 (--gpu, or accelerator 'H100') contradicts instance type g5.xlarge (--instance-type, "
            "1 × A10G): give one of them; types with H100: p5.4xlarge, p5.48xlarge") == str(err.value)
    # the same GPU and count as the type: fine
    assert aws.instance_type_of(aws_spec(accelerator="h100", gpus_per_node=8, instance_type="p5.48xlarge")).gpus == 8
    with pytest.raises(UsageError, match=r"--gpu H100:8 asks for 8 GPU\(s\) per node but --gpus-per-node is 4"):
        gpus.combine("H100:8", 4)


def test_stack_config_gpu_key():
    spec = spec_from_config({"cloud": "aws", "gpu": "l40s:4", "nodes": 2}, "demo")
    assert (spec.accelerator, spec.gpus_per_node, spec.instance_type) == ("L40S", 4, None)
    assert aws.instance_type_of(spec.replace(region="us-east-1")).name == "g6e.12xlarge"
    with pytest.raises(UsageError, match=r"gpucluster:gpu H100:8 asks for 8 GPU\(s\) per node but "
                                         r"gpucluster:gpusPerNode is 2"):
        spec_from_config({"cloud": "aws", "gpu": "H100:8", "gpusPerNode": "2"}, "demo")


# -- GKE (infra/gcp/shapes.py; prices from SkyPilot's catalogs/v8/gcp/vms.csv, read 2026-11-28) ----------
def gke(**kw) -> ClusterSpec:
    from gpucluster.infra.gcp import catalog as gcp

    return gcp.resolve(ClusterSpec(**{**dict(cloud="gcp", nodes=2), **kw}))


def test_gke_picks_the_cheapest_machine_and_writes_gkes_accelerator_name():
    l4 = gke(accelerator="L4", gpus_per_node=1)  # host + 1 L4 row: g2-standard-4 is the cheapest 1-L4 G2
    assert (l4.instance_type, l4.accelerator, l4.gpus_per_node, l4.zone) == ("g2-standard-4", "nvidia-l4", 1,
                                                                              "us-central1-a")
    assert gke(accelerator="h100", gpus_per_node=8).instance_type == "a3-highgpu-8g"
    assert gke(accelerator="A100", gpus_per_node=4).instance_type == "a2-highgpu-4g"
    assert gke(accelerator="A100-80GB", gpus_per_node=8).instance_type == "a2-ultragpu-8g"
    t4 = gke(accelerator="T4", gpus_per_node=2)  # N1 + attached T4: 4 vCPUs per GPU
    assert (t4.instance_type, t4.accelerator) == ("n1-standard-8", "nvidia-tesla-t4")
    h200 = gke(accelerator="H200", gpus_per_node=8)  # offered in us-central1-b only there
    assert (h200.instance_type, h200.zone) == ("a3-ultragpu-8g", "us-central1-b")
    # a machine type that carries GPUs names them without --gpu
    a3 = gke(instance_type="a3-highgpu-8g")
    assert (a3.accelerator, a3.gpus_per_node) == ("nvidia-h100-80gb", 8)
    # the design card's V100 default is unchanged
    v100 = gke()
    assert (v100.instance_type, v100.accelerator, v100.gpus_per_node) == ("n1-standard-4", "nvidia-tesla-v100", 1)


def test_gke_a3_shapes_under_8_gpus_are_refused_on_demand_with_the_reason():
    with pytest.raises(SpecError) as err:
        gke(accelerator="H100", gpus_per_node=4)
    assert "a3-highgpu-4g is offered as Spot VMs or through flex-start only, not on demand" in str(err.value)
    assert "add --spot, or use a3-highgpu-8g (H100:8)" in str(err.value)
    assert gke(accelerator="H100", gpus_per_node=4, spot=True).instance_type == "a3-highgpu-4g"
    from gpucluster.infra.gcp import catalog as gcp

    with pytest.raises(SpecError, match="machine type a3-highgpu-2g is not allowed on demand"):
        gcp.validate_spec(ClusterSpec(cloud="gcp", nodes=1, instance_type="a3-highgpu-2g"))


def test_gke_refusals_name_counts_regions_and_contradictions():
    with pytest.raises(SpecError, match=r"GPUs per node that exist: 1, 2, 4, 8 \(1: g2-standard-4, g2-standard-8"):
        gke(accelerator="L4", gpus_per_node=3)
    with pytest.raises(SpecError, match=r"gpu H200:8 is not offered on gcp in region 'us-east1'.*us-central1 "
                                        r"\(a3-ultragpu-8g \$86\.76/h\)"):
        gke(accelerator="H200", gpus_per_node=8, region="us-east1")
    from gpucluster.infra.gcp import catalog as gcp

    with pytest.raises(SpecError, match=r"gpu H100:8 .* contradicts machine type a2-highgpu-8g \(--machine-type, "
                                        r"8 × A100\): give one of them; machine types with H100:8: a3-highgpu-8g"):
        gcp.validate_spec(ClusterSpec(cloud="gcp", nodes=1, accelerator="H100", gpus_per_node=8,
                                      instance_type="a2-highgpu-8g"))
    with pytest.raises(SpecError, match=r"gpu A10G is not offered on gcp.*it is on aws us-east-1"):
        gcp.validate_spec(ClusterSpec(cloud="gcp", nodes=1, accelerator="A10G"))


def test_gke_machine_shapes_for_requests_and_quotas():
    from decimal import Decimal as D

    from gpucluster.infra.gcp.catalog import machine_shape

    assert machine_shape("a3-highgpu-8g") == (208, D("1872")) and machine_shape("g2-standard-4") == (4, D("16"))
    assert machine_shape("n1-standard-16") == (16, D("60")) and machine_shape("e2-small") is None


def test_doctor_checks_the_machine_run_would_pick():
    from gpucluster.cli.doctor import _machine_for
    from gpucluster.infra.registry import plugin

    assert _machine_for(plugin("aws"), "aws", "H100:8", None, None, False, strict=True) == ("p5.48xlarge", "")
    assert _machine_for(plugin("gcp"), "gcp", "l4", None, None, False, strict=True) == ("g2-standard-4", "")
    machine, why = _machine_for(plugin("gcp"), "gcp", "B200:8", None, None, False, strict=False)
    assert machine is None and "gpu B200 is not offered on gcp" in why
    with pytest.raises(SpecError, match="not offered on gcp"):
        _machine_for(plugin("gcp"), "gcp", "B200:8", None, None, False, strict=True)
    with pytest.raises(UsageError, match="--gpu H100:8 and --instance-type g5.xlarge both pick the machine"):
        _machine_for(plugin("aws"), "aws", "H100:8", "g5.xlarge", None, False, strict=True)
