"""The local backend's GPU split, without a GPU: a stand-in `nvidia-smi` on PATH answers `-L` as
the real one does ("GPU 0: NVIDIA H200 (UUID: GPU-...)", one line per GPU). Node i sees GPUs
[i*G, (i+1)*G) through CUDA_VISIBLE_DEVICES (infra/local/launch.py `_visible`). Where there are
fewer GPUs than nodes, no two nodes share one (NCCL refuses two ranks on one device: "Duplicate
GPU detected"), so every node trains on the CPU with gloo, and the plan says so in one line: on an
H200 (benchmarks/gpu_check.py, 2026-11-28) `--nodes 2` ran both nodes on the CPU without a word."""

from __future__ import annotations

import pytest

from gpucluster.infra.local import catalog
from gpucluster.infra.local.launch import _visible
from gpucluster.infra.local.provider import LocalProvider
from gpucluster.infra.registry import plugin
from gpucluster.events import NullEvents
from gpucluster.lifecycle.prepare import Request, prepare

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


@pytest.fixture
def gpus(tmp_path, monkeypatch):
    def have(n: int) -> None:
        smi = tmp_path / "nvidia-smi"
        smi.write_text("#!/bin/sh\n" + "".join(f'echo "GPU {i}: NVIDIA H200 (UUID: GPU-{i:08d})"\n' for i in range(n)))
        smi.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
        catalog.gpus_present.cache_clear()

    yield have
    catalog.gpus_present.cache_clear()


def _plan(nodes: int, gpn: int | None = None):
    plan = prepare(Request(cloud="local", nodes=nodes, gpus_per_node=gpn, workload="digits"), plugin("local"))
    cluster = LocalProvider().up(plan.spec, NullEvents())
    return plan, cluster


def test_one_gpu_two_nodes_trains_on_the_cpu_and_the_plan_says_so(gpus):
    gpus(1)
    plan, cluster = _plan(2)
    assert plan.spec.gpus_per_node == 0 and [n.gpus for n in cluster.nodes] == [0, 0]
    assert [_visible(cluster, r) for r in range(2)] == ["", ""]
    assert [n for n in plan.notes if "GPU" in n] == [
        "this machine has 1 GPU(s) for 2 nodes: no node gets a whole GPU, so every node trains on the CPU (gloo); "
        "--nodes 1 trains on the GPU"]
    gpus(3)
    plan, _ = _plan(4)
    assert any(n.endswith("--nodes 3 or fewer gives each node GPUs of its own") for n in plan.notes)


def test_gpus_are_split_between_nodes_without_a_word(gpus):
    gpus(8)
    plan, cluster = _plan(2)
    assert cluster.gpus_per_node == 4 and not [n for n in plan.notes if "GPU" in n]
    assert [_visible(cluster, r) for r in range(2)] == ["0,1,2,3", "4,5,6,7"]
    plan, cluster = _plan(3)  # 8 // 3: two GPUs each, two left idle
    assert [_visible(cluster, r) for r in range(3)] == ["0,1", "2,3", "4,5"]
    gpus(0)  # a machine without GPUs: nothing to say
    plan, cluster = _plan(3)
    assert cluster.gpus_per_node == 0 and not [n for n in plan.notes if "GPU" in n]
    gpus(1)  # CPU nodes asked for: nothing to say
    plan, _ = _plan(2, gpn=0)
    assert not [n for n in plan.notes if "GPU" in n]


def test_a_sweep_sizes_by_the_gpus_the_local_backend_shares_and_asks_no_other_backend(gpus):
    """`sweep` asks what a backend with `Capability.SHARES_GPUS` (local) gives a spec of one node: every GPU of
    this machine (no `known_gpus` hook: the backend's own `prepare` shares them); other backends: None."""
    from gpucluster.sweep.runner import gpu_sizes, known_gpus

    gpus(5)
    assert known_gpus(plugin("local")) == 5
    assert gpu_sizes(None, True, known_gpus(plugin("local")), [1, 2]) == [0, 2]  # --compare-cpu: CPU, then 5 // 2
    gpus(0)
    assert known_gpus(plugin("local")) == 0
    with pytest.raises(Exception, match="there is no GPU to compare against"):
        gpu_sizes(None, True, known_gpus(plugin("local")), [1])
    assert known_gpus(plugin("ssh")) is None and known_gpus(plugin("aws")) is None
