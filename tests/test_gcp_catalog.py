"""GCP spec validation against the shipped V100/N1 catalog (no cloud SDK needed)."""

from __future__ import annotations

import pytest

from gpucluster.infra.gcp import catalog
from gpucluster.errors import SpecError
from gpucluster.spec import ClusterSpec
from specs import validate

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def spec(**kw) -> ClusterSpec:
    base = dict(cloud="gcp", nodes=2, name="v100", zone="us-central1-a", instance_type="n1-standard-16",
                accelerator="nvidia-tesla-v100", gpus_per_node=4)
    base.update(kw)
    return ClusterSpec(**base)


def test_example_stack_spec_is_valid_without_warnings():
    assert validate(spec()) == []


def test_machine_type_table_matches_google_n1_sizes():
    mt = catalog.N1_MACHINE_TYPES
    assert (mt["n1-standard-16"].vcpus, mt["n1-standard-16"].memory_gb) == (16, 60.0)
    assert (mt["n1-standard-1"].vcpus, mt["n1-standard-1"].memory_gb) == (1, 3.75)
    assert (mt["n1-highmem-96"].vcpus, mt["n1-highmem-96"].memory_gb) == (96, 624.0)
    assert mt["n1-highcpu-32"].memory_gb == 28.8
    assert "n1-highmem-1" not in mt and len(mt) == 22


def test_n1_standard_32_with_one_v100_is_refused_over_12_vcpu():
    with pytest.raises(SpecError) as e:
        validate(spec(instance_type="n1-standard-32", gpus_per_node=1))
    msg = str(e.value)
    assert "n1-standard-32" in msg and "at most 12 vCPU" in msg and "78 GB" in msg


def test_highmem_types_at_the_limits_accepted():
    assert validate(spec(instance_type="n1-highmem-8", gpus_per_node=1)) == []  # 8 vCPU, 52 GB
    assert validate(spec(instance_type="n1-highmem-96", gpus_per_node=8)) == []  # 96 vCPU, 624 GB
    with pytest.raises(SpecError, match="at most 48 vCPU and 312 GB"):
        validate(spec(instance_type="n1-highmem-96", gpus_per_node=4))


def test_memory_limit_enforced_on_its_own(monkeypatch):
    # No predefined N1 type breaks only the memory limit, so tighten the table to reach that branch.
    monkeypatch.setitem(catalog.V100_LIMITS, 1, (12, 40.0))
    with pytest.raises(SpecError, match=r"'n1-highmem-8' \(8 vCPU, 52 GB\).*40 GB"):
        validate(spec(instance_type="n1-highmem-8", gpus_per_node=1))


def test_n1_standard_8_with_four_v100_accepted_with_starvation_warning():
    warnings = validate(spec(instance_type="n1-standard-8", gpus_per_node=4))
    assert len(warnings) == 1
    w = warnings[0]
    assert "n1-standard-8" in w and "2m34s" in w and "39s" in w and "seed 003" in w


def test_four_vcpus_per_gpu_does_not_warn():
    assert validate(spec(instance_type="n1-standard-4", gpus_per_node=1)) == []
    assert validate(spec(instance_type="n1-standard-2", gpus_per_node=1))  # 2 per GPU warns


@pytest.mark.parametrize("count", [3, 0, 5, 16])
def test_gpu_counts_other_than_1_2_4_8_refused(count):
    with pytest.raises(SpecError) as e:
        validate(spec(gpus_per_node=count))
    assert repr(count) in str(e.value) and "1, 2, 4, 8" in str(e.value)


def test_other_accelerators_refused():
    # issue 42: T4 is a GKE GPU now (N1 + attached T4); K80 is not known, A10G is not on GKE
    assert validate(spec(accelerator="nvidia-tesla-t4")) == []
    from gpucluster.errors import UsageError

    with pytest.raises(UsageError, match=r"gpu 'nvidia-tesla-k80' is not known.*known GPUs: T4, V100"):
        validate(spec(accelerator="nvidia-tesla-k80"))
    with pytest.raises(SpecError, match=r"gpu A10G is not offered on gcp.*it is on aws"):
        validate(spec(accelerator="A10G", instance_type=None, gpus_per_node=1))


def test_unknown_or_non_n1_machine_type_refused_with_suggestion():
    with pytest.raises(SpecError, match='did you mean "n1-standard-16"'):
        validate(spec(instance_type="n1-standart-16"))
    with pytest.raises(SpecError, match="'n2-standard-16'"):
        validate(spec(instance_type="n2-standard-16"))


def test_zone_without_v100_refused_and_list_overridable():
    with pytest.raises(SpecError, match="'europe-west1-b'"):
        validate(spec(zone="europe-west1-b"))
    ok = spec(zone="europe-west1-b", options=(("v100Zones", "europe-west1-b, europe-west1-d"),))
    assert validate(ok) == []
    # the override replaces the shipped list
    with pytest.raises(SpecError, match="'us-central1-a'"):
        validate(spec(options=(("v100Zones", "europe-west1-b"),)))
    with pytest.raises(SpecError, match="v100Zones entry 'nowhere'"):
        validate(spec(options=(("v100Zones", "nowhere"),)))


def test_region_derived_from_zone_and_defaults_filled():
    r = catalog.resolve(ClusterSpec(cloud="gcp", nodes=1))
    assert (r.zone, r.region, r.accelerator, r.gpus_per_node, r.instance_type, r.disk_type) == (
        "us-central1-a", "us-central1", "nvidia-tesla-v100", 1, "n1-standard-4", "pd-balanced")
    assert validate(ClusterSpec(cloud="gcp", nodes=1)) == []
    r = catalog.resolve(ClusterSpec(cloud="gcp", nodes=1, region="europe-west4", gpus_per_node=8))
    assert (r.zone, r.region, r.instance_type) == ("europe-west4-a", "europe-west4", "n1-standard-32")
    assert catalog.resolve(spec(zone="us-west1-b")).region == "us-west1"


def test_zone_region_mismatch_and_region_without_v100():
    with pytest.raises(SpecError, match="zone 'us-east1-b'.*region us-central1"):
        validate(spec(zone="us-east1-b", region="us-central1"))
    with pytest.raises(SpecError, match="'southamerica-east1'"):
        validate(spec(zone=None, region="southamerica-east1"))


def test_nodes_bounds_and_spot():
    with pytest.raises(SpecError, match="nodes 65"):
        validate(spec(nodes=65))
    with pytest.raises(SpecError, match="nodes 0"):
        validate(spec(nodes=0))
    assert validate(spec(nodes=64, spot=True)) == []


def test_disk_type_and_options_checked():
    with pytest.raises(SpecError, match="disk type 'gp3'"):
        validate(spec(disk_type="gp3"))
    with pytest.raises(SpecError, match="releaseChannel 'FAST'"):
        validate(spec(options=(("releaseChannel", "FAST"),)))
    with pytest.raises(SpecError, match="gpuDriverVersion 'NEWEST'"):
        validate(spec(options=(("gpuDriverVersion", "NEWEST"),)))
    with pytest.raises(SpecError, match="launcher 'mpi'"):
        validate(spec(options=(("launcher", "mpi"),)))
    with pytest.raises(SpecError, match="minNodes '3'.*0 to 2"):
        validate(spec(options=(("autoscale", "true"), ("minNodes", "3"))))
    with pytest.raises(SpecError, match="autoscale 'maybe'"):
        validate(spec(options=(("autoscale", "maybe"),)))
    assert validate(spec(options=(("releaseChannel", "stable"), ("autoscale", "yes")))) == []


def test_label_values_must_follow_gcp_rules():
    with pytest.raises(SpecError, match="label team value 'ML Team'"):
        validate(spec(tags=(("team", "ML Team"),)))


@pytest.mark.parametrize("value", ["n1-standard-2", "e2-medium", "e2-standard-2", "n2-standard-8",
                                   "n1-custom-2-7680", "n2-custom-4-16384-ext", "c3-highcpu-4-lssd"])
def test_system_machine_type_takes_compute_engine_cpu_types(value):
    assert catalog.system_machine_type(spec(options={"systemMachineType": value})) == value


@pytest.mark.parametrize("value", ["n1-standard-0", "n1-standard-3", "n2-standard-0", "bogus", "N1-STANDARD-2",
                                   "a2-highgpu-1g", "g2-standard-4"])
def test_system_machine_type_refuses_names_that_are_no_cpu_machine(value):
    with pytest.raises(SpecError, match=f"option systemMachineType '{value}' is not allowed"):
        catalog.system_machine_type(spec(options={"systemMachineType": value}))
