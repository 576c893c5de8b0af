"""One stack-config reader (`gpucluster.plan.stackconfig`): `cost estimate --stack` prices exactly the
spec the Pulumi program (`infra.program`) declares from the same `stacks/Pulumi.<stack>.yaml`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpucluster.errors import ConfigError, SpecError, UsageError
from gpucluster.infra import program
from gpucluster.plan.stackconfig import read_stack_file, spec_from_stack_file, stack_name_of

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

yaml = pytest.importorskip("yaml")
STACKS = Path(__file__).resolve().parent.parent / "stacks"


@pytest.mark.parametrize("stack", ["aws-g5", "gcp-v100"])
def test_stack_file_reads_as_the_pulumi_program_reads_it(stack):
    path = STACKS / f"Pulumi.{stack}.yaml"
    doc = yaml.safe_load(path.read_text())
    namespace = {k.split(":", 1)[1]: v for k, v in doc["config"].items() if k.startswith("gpucluster:")}
    assert read_stack_file(path) == namespace
    assert spec_from_stack_file(path) == program.spec_from_config(namespace, stack)
    assert stack_name_of(path) == stack


def test_gcp_option_keys_keep_their_stack_names():
    """The bug: the estimate's reader turned `gpucluster:systemMachineType` into the option
    `system_machine_type`, which the gcp backend never reads; its GKE system pool was then priced
    as the default n1-standard-2 instead of the type the program declares."""
    spec = spec_from_stack_file(STACKS / "Pulumi.gcp-v100.yaml")
    assert spec.option("systemMachineType") == "e2-standard-2"
    assert spec.option("system_machine_type") is None
    assert spec.option("gpuDriverVersion") == "LATEST" and spec.option("minNodes") == "0"


def _gcp_stack(tmp_path: Path, system: str) -> Path:
    p = tmp_path / "Pulumi.sys.yaml"
    p.write_text("config:\n  gpucluster:cloud: gcp\n  gpucluster:zone: us-central1-a\n  gpucluster:nodes: 1\n"
                 f"  gpucluster:gpusPerNode: 1\n  gpucluster:systemMachineType: {system}\n")
    return p


def test_estimate_from_a_stack_prices_the_system_pool_it_names(tmp_path):
    from gpucluster.cli.cost import cost

    res = CliRunner().invoke(cost, ["estimate", "--stack", str(_gcp_stack(tmp_path, "n1-standard-4")), "--json"])
    assert res.exit_code == 0, res.output
    est = json.loads(res.stdout)
    system = [ln for ln in est["lines"] if ln["description"].startswith("system pool: ")]
    assert any("n1-standard-4" in ln["description"] for ln in system), system
    assert not any("n1-standard-2" in ln["description"] for ln in system)
    # a type the catalog cannot price is said, not replaced by the default
    res = CliRunner().invoke(cost, ["estimate", "--stack", str(_gcp_stack(tmp_path, "e2-standard-2")), "--json"])
    assert res.exit_code == 0, res.output
    est = json.loads(res.stdout)
    assert any("(e2-standard-2) has no price" in n for n in est["notes"])
    assert not any(ln["description"].startswith("system pool: ") for ln in est["lines"])


@pytest.mark.parametrize("body, error, needle", [
    ("config:\n  gpucluster:cloud: aws\n  gpucluster:spot: sometimes\n", SpecError, "gpucluster:spot 'sometimes'"),
    ("config:\n  gpucluster:cloud: aws\n  gpucluster:nodes: 0\n", SpecError, "gpucluster:nodes"),
    ("config:\n  gpucluster:cloud: aws\n  gpucluster:instance_type: g5.xlarge\n", ConfigError,
     'did you mean "gpucluster:instanceType"'),
    ("config:\n  gpucluster:nodes: 2\n", ConfigError, "has no gpucluster:cloud"),
    ("config: []\n", ConfigError, "has no config: mapping"),
])
def test_bad_stack_files_name_the_file_and_the_key(tmp_path, body, error, needle):
    p = tmp_path / "Pulumi.bad.yaml"
    p.write_text(body)
    with pytest.raises(error, match=needle) as caught:
        spec_from_stack_file(p)
    assert str(p) in str(caught.value)


def test_missing_stack_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        spec_from_stack_file(tmp_path / "Pulumi.none.yaml")
