"""Issue 42 item 5: the health check knows the GPU the shape promises (name, memory, count per node)
and fails a node whose GPUs differ, naming expected and found.

What a node reports is what nvidia-smi says (`--query-gpu=index,uuid,name` and
`--query-gpu=index,memory.total --format=csv,noheader,nounits`); the names and memory.total figures
below are the ones real nodes report (NVIDIA A100-SXM4-40GB 40960 MiB on p4d, NVIDIA A100-SXM4-80GB
81920 MiB on p4de, NVIDIA H100 80GB HBM3 81559 MiB on p5, NVIDIA L4 23034 MiB, NVIDIA L40S 46068 MiB).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

from gpucluster.watch.health import HealthSpec, NodeRun, expected_gpu, judge, spec_for, wrong_gpus  # noqa: E402
from gpucluster.infra.registry import plugin  # noqa: E402
from gpucluster.spec import ClusterSpec  # noqa: E402


def node(rank: int, names: list[str], mems: list[int] | None = None) -> NodeRun:
    n = NodeRun(rank, f"h{rank}", rc=0)
    n.records["hello"] = {"kind": "hello", "time": time.time()}
    n.hello_arrived = time.time()
    n.records["node"] = {"kind": "node", "problems": [], "gpu_names": names,
                         **({"gpu_memory_mib": mems} if mems is not None else {})}
    n.records["links"] = {"kind": "links", "problems": [], "pairs": []}
    n.records["done"] = {"kind": "done"}
    return n


def test_a_node_with_other_gpus_fails_naming_expected_and_found():
    spec = HealthSpec(gpus=8, gpu="A100-80GB")
    good = node(0, ["NVIDIA A100-SXM4-80GB"] * 8, [81920] * 8)
    small = node(1, ["NVIDIA A100-SXM4-40GB"] * 8, [40960] * 8)  # a p4d where a p4de was promised
    problems, _, _ = judge({0: good, 1: small}, spec)
    assert list(problems) == [1] and len(problems[1]) == 8
    assert problems[1][0] == ("GPU 0 is NVIDIA A100-SXM4-40GB with 40960 MiB, not the GPU this shape promises: "
                              "expected 8 × A100-80GB (81920 MiB each)")


def test_names_and_memory_as_real_nodes_report_them_pass():
    assert wrong_gpus({"gpu_names": ["NVIDIA H100 80GB HBM3"] * 8, "gpu_memory_mib": [81559] * 8},
                      HealthSpec(gpus=8, gpu="H100")) == []
    assert wrong_gpus({"gpu_names": ["NVIDIA L4"], "gpu_memory_mib": [23034]}, HealthSpec(gpus=1, gpu="L4")) == []
    # an L40S is not an L4 (the name), an L4 is not an L40S
    assert wrong_gpus({"gpu_names": ["NVIDIA L40S"], "gpu_memory_mib": [46068]}, HealthSpec(gpus=1, gpu="L4"))
    assert wrong_gpus({"gpu_names": ["NVIDIA L4"]}, HealthSpec(gpus=1, gpu="L40S"))
    assert wrong_gpus({"gpu_names": ["Tesla V100-SXM2-16GB"]}, HealthSpec(gpus=1, gpu="V100")) == []  # no memory: name
    assert wrong_gpus({"gpu_names": ["NVIDIA H100 80GB HBM3 MIG 1g.10gb"]}, HealthSpec(gpus=1, gpu="H100")) == []
    assert wrong_gpus({"gpu_names": ["NVIDIA T4"]}, HealthSpec(gpus=1)) == []  # no expectation: not judged


def test_the_expected_gpu_comes_from_the_spec_or_the_backends_shape():
    aws, gcp = plugin("aws"), plugin("gcp")
    assert expected_gpu(ClusterSpec(cloud="aws", nodes=2, instance_type="p5.48xlarge", gpus_per_node=8), aws) == "H100"
    assert expected_gpu(ClusterSpec(cloud="gcp", nodes=2, instance_type="n1-standard-16", gpus_per_node=4,
                                    accelerator="nvidia-tesla-v100"), gcp) == "V100"
    assert expected_gpu(ClusterSpec(cloud="gcp", nodes=1, instance_type="a3-ultragpu-8g", gpus_per_node=8), gcp) == "H200"
    check = spec_for(ClusterSpec(cloud="aws", nodes=2, instance_type="p4de.24xlarge", gpus_per_node=8), aws, None)
    assert (check.gpus, check.gpu) == (8, "A100-80GB")


def test_the_node_program_reports_memory_total_from_nvidia_smi(tmp_path, monkeypatch):
    """node_check.py's own record carries each GPU's memory.total from a stub nvidia-smi answering each
    query as the real one does (csv, no header; nounits: plain MiB)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "nvidia-smi"
    stub.write_text('#!/bin/sh\ncase "$*" in\n'
                    '  *memory.total*) echo "0, 40960"; echo "1, 40960";;\n'
                    '  *) echo "0, GPU-0000-a, NVIDIA A100-SXM4-40GB"; echo "1, GPU-0000-b, NVIDIA A100-SXM4-40GB";;\n'
                    'esac\n')
    stub.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    code = ("import sys; sys.argv=['x']; from gpucluster.node import node_check as n; "
            "print(n.nvidia_smi_memory()); print(n.nvidia_smi_gpus()[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                         cwd=Path(__file__).parent.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "{0: 40960, 1: 40960}"
