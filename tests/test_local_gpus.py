"""The local backend's GPU split (infra/local/provider.py), without a GPU: the count nvidia-smi
gives is replaced. Node i sees GPUs [i*G, (i+1)*G) through CUDA_VISIBLE_DEVICES; where there are
fewer GPUs than nodes, no two nodes share one (NCCL refuses two ranks on one device: "Duplicate GPU
detected"), so every node trains on the CPU with gloo, and the run says so in one line (before,
`--nodes 2` on a one-GPU machine ran both nodes on the CPU without a word)."""

from __future__ import annotations

from gpucluster.events import NullEvents
from gpucluster.infra.local import catalog
from gpucluster.infra.local.launch import _visible
from gpucluster.infra.local.provider import LocalProvider
from gpucluster.spec import ClusterSpec


class Said(NullEvents):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def message(self, text: str) -> None:
        self.lines.append(text)


def _up(monkeypatch, present: int, nodes: int, gpn: int | None = None):
    monkeypatch.setattr(catalog, "gpus_present", lambda: present)
    events = Said()
    cluster = LocalProvider().up(ClusterSpec(cloud="local", nodes=nodes, name="t", gpus_per_node=gpn), events)
    return cluster, events.lines


def test_one_gpu_two_nodes_trains_on_the_cpu_and_says_so(monkeypatch):
    cluster, said = _up(monkeypatch, present=1, nodes=2)
    assert cluster.gpus_per_node == 0 and [n.gpus for n in cluster.nodes] == [0, 0]
    assert [_visible(cluster, r) for r in range(2)] == ["", ""]
    assert said == ["this machine has 1 GPU(s) for 2 nodes: no node gets a whole GPU, so every node trains on "
                    "the CPU (gloo); --nodes 1 or fewer puts each node on GPUs of its own"]


def test_gpus_are_split_between_nodes_without_a_word(monkeypatch):
    cluster, said = _up(monkeypatch, present=8, nodes=2)
    assert cluster.gpus_per_node == 4 and said == []
    assert [_visible(cluster, r) for r in range(2)] == ["0,1,2,3", "4,5,6,7"]
    cluster, said = _up(monkeypatch, present=0, nodes=3)  # a machine without GPUs: nothing to say
    assert cluster.gpus_per_node == 0 and said == []
    cluster, said = _up(monkeypatch, present=1, nodes=2, gpn=0)  # asked for CPU nodes: nothing to say
    assert said == []
