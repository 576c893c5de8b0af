"""Issue 42: `--gpu TYPE[:COUNT]` through the real CLI (a subprocess, as a user runs it): `run`, `up`,
`cost estimate` and task files carry the picked instance type and the GPU in `--dry-run --json` and
`cost estimate --json`; bad input is one line, exit 2, no traceback, nothing recorded.
"""

from __future__ import annotations

import json

import pytest

from conftest import run_cli
from test_bad_input import assert_clean_refusal, assert_no_run_recorded

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)


def _cli(*args: str) -> tuple[int, str, str]:
    res = run_cli(*args)  # the real CLI in a subprocess, with the test's GPUCLUSTER_HOME
    return res.returncode, res.stdout, res.stderr


@pytest.mark.parametrize("args,needle", [
    (["--gpu", "H100:3"], "GPUs per node that exist: 1, 8"),
    (["--gpu", "X100"], 'did you mean "V100"'),
    (["--gpu", "h200:8", "--region", "eu-west-1"], "it is in: us-east-1 (p5en.48xlarge $63.296/h)"),
    (["--gpu", "H100:8", "--instance-type", "g5.xlarge"], "contradicts instance type g5.xlarge (--instance-type"),
    (["--gpu", "H100:8", "--gpus-per-node", "4"], "--gpu H100:8 asks for 8 GPU(s) per node but --gpus-per-node"),
])
def test_bad_gpu_input_is_one_line_exit_2_and_creates_nothing(home, args, needle):
    r = run_cli("run", "--cloud", "aws", "--nodes", "2", "--ssh-cidr", "203.0.113.7/32", "--yes", *args)
    assert_clean_refusal(r, needle)
    assert_no_run_recorded(home)


def test_dry_run_json_and_estimate_json_carry_the_instance_type_and_gpu(home):
    code, out, err = _cli("run", "--cloud", "aws", "--gpu", "H100:8", "--nodes", "2", "--dry-run", "--json",
                          "--ssh-cidr", "203.0.113.7/32")
    assert code == 0, err
    d = json.loads(out)
    assert (d["instance_type"], d["gpu"]) == ("p5.48xlarge", "H100:8")
    assert d["instances"]["type"] == "p5.48xlarge" and d["instances"]["count"] == 2  # what the program declares
    assert "plan: 2 × p5.48xlarge (8 × H100 each)" in err
    code, out, err = _cli("cost", "estimate", "--cloud", "aws", "--gpu", "l4:4", "--json")
    assert code == 0, err
    est = json.loads(out)
    assert (est["instance_type"], est["gpu"], est["per_gpu_hour"]) == ("g6.12xlarge", "L4:4", "1.150400000")
    code, out, err = _cli("up", "--cloud", "aws", "--gpu", "A100-80GB:8", "--nodes", "2", "--dry-run", "--json",
                          "--ssh-cidr", "203.0.113.7/32")
    assert code == 0, err
    assert (json.loads(out)["instance_type"], json.loads(out)["gpu"]) == ("p4de.24xlarge", "A100-80GB:8")


def test_task_file_gpu_key(home, tmp_path):
    task = tmp_path / "task.yaml"
    task.write_text("resources:\n  cloud: aws\n  gpu: H100:1\n  nodes: 1\n  ssh_cidr: 203.0.113.7/32\n")
    code, out, err = _cli("cost", "estimate", "-f", str(task), "--json")
    assert code == 0, err
    assert json.loads(out)["instance_type"] == "p5.4xlarge"
    code, out, err = _cli("run", str(task), "--dry-run", "--json")
    assert code == 0, err
    assert (json.loads(out)["instance_type"], json.loads(out)["gpu"]) == ("p5.4xlarge", "H100:1")


def test_gcp_gpu_through_the_cli(home):
    code, out, err = _cli("run", "--cloud", "gcp", "--gpu", "L4:1", "--nodes", "2", "--dry-run", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert (d["instance_type"], d["gpu"]) == ("g2-standard-4", "L4:1")
    assert "plan: 2 × g2-standard-4 (1 × L4 each)" in err
    code, out, err = _cli("cost", "estimate", "--cloud", "gcp", "--gpu", "H100:8", "--json")
    assert code == 0, err
    est = json.loads(out)
    assert (est["instance_type"], est["gpu"]) == ("a3-highgpu-8g", "H100:8")
    r = run_cli("run", "--cloud", "gcp", "--gpu", "H100:2", "--nodes", "2", "--yes")
    assert_clean_refusal(r, "a3-highgpu-2g is offered as Spot VMs or through flex-start only")
    assert_no_run_recorded(home)


@pytest.mark.parametrize("args,needle", [
    (["run", "--cloud", "local", "--gpu", "H100:8", "--nodes", "1"], "--gpu H100:8 is not allowed with --cloud local"),
    (["sweep", "--cloud", "aws", "--gpu", "H100:3", "--nodes", "1", "--yes"], "GPUs per node that exist: 1, 8"),
    (["sweep", "--cloud", "aws", "--gpu", "H100:8", "--gpus-per-node", "4", "--nodes", "1", "--yes"],
     "--gpu H100:8 asks for 8 GPU(s) per node but --gpus-per-node is 4"),
])
def test_gpu_refusals_of_local_and_sweep(home, args, needle):
    r = run_cli(*args)
    assert_clean_refusal(r, needle)
    assert_no_run_recorded(home)
