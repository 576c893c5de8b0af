"""The rule that maps `--gpu TYPE` to the nodes of an existing cluster (infra/kube/gpus.py), on label values as
NVIDIA GPU feature discovery writes them: `nvidia.com/gpu.product` is the NVML device name with blanks made `-`
(plus `-MIG-<profile>` under the MIG single strategy, `-SHARED` for shared GPUs), `nvidia.com/gpu.memory` the
memory in MiB — NVIDIA/k8s-device-plugin, docs/gpu-feature-discovery/README.md "Generated Labels"
(https://github.com/NVIDIA/k8s-device-plugin#gpu-feature-discovery; its example node: A100-SXM4-40GB with
gpu.memory 39538) and internal/lm/resource.go `getProductName`/`sanitise`. And the options that contradict
`--gpu`, refused before the cluster is asked."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("kubernetes")

from gpucluster.errors import SpecError, UsageError  # noqa: E402
from gpucluster.infra.kube import gpus, options  # noqa: E402
from gpucluster.spec import ClusterSpec  # noqa: E402

P, M = gpus.PRODUCT_LABEL, gpus.MEMORY_LABEL


@pytest.mark.parametrize("gpu,product,memory,has", [
    ("L4", "NVIDIA-L4", None, True),
    ("L4", "NVIDIA-L40S", None, False),  # a word, not a prefix
    ("L40S", "NVIDIA-L40S", None, True),
    ("T4", "Tesla-T4", None, True),
    ("V100", "Tesla-V100-SXM2-16GB", None, True),
    ("A10G", "NVIDIA-A10G", None, True),
    ("A10G", "NVIDIA-A100-SXM4-40GB", None, False),
    ("H100", "NVIDIA-H100-80GB-HBM3", None, True),
    ("H100", "NVIDIA-H100-PCIe", None, True),
    ("H100", "NVIDIA-GH200-480GB", None, False),
    ("H200", "NVIDIA-H200", None, True),
    ("B200", "NVIDIA-B200", None, True),
    ("A100", "A100-SXM4-40GB", "39538", True),  # the GFD README's own example node
    ("A100", "NVIDIA-A100-SXM4-80GB", None, False),
    ("A100-80GB", "NVIDIA-A100-SXM4-80GB", None, True),
    ("A100-80GB", "NVIDIA-A100-80GB-PCIe", None, True),
    ("A100-80GB", "NVIDIA-A100-PCIE", "81920", True),  # no size word: the memory label decides
    ("A100", "NVIDIA-A100-PCIE", "40960", True),
    ("A100", "NVIDIA-A100-PCIE", None, False),  # neither says the size: taken for neither
    ("A100", "A100-SXM4-40GB-MIG-1g.5gb", "4864", False),  # a MIG slice is not a whole GPU
    ("L4", "NVIDIA-L4-SHARED", None, False),  # nor a time-shared replica
    ("l4", "nvidia-l4", None, True),  # any case
])
def test_the_label_rule(gpu, product, memory, has):
    from gpucluster.catalog.gpus import normalize

    labels = {P: product, **({M: memory} if memory else {})}
    assert gpus.carries(normalize(gpu), labels) is has


def test_every_catalog_gpu_has_known_values_the_rule_accepts():
    from gpucluster.catalog.gpus import GPUS

    assert set(gpus.KNOWN) == set(GPUS)
    for name, values in gpus.KNOWN.items():
        assert values and all(gpus.carries(name, {P: v}) for v in values), name


def _node(name, product=None, memory=None):
    labels = {**({P: product} if product else {}), **({M: memory} if memory else {})}
    return NS(metadata=NS(name=name, labels=labels))


def test_choose_names_what_the_nodes_carry_and_what_they_lack():
    nodes = [_node("a", "NVIDIA-L4"), _node("b", "NVIDIA-L4"), _node("c", "NVIDIA-A100-SXM4-80GB")]
    assert gpus.choose(nodes, "L4", "nvidia.com/gpu", None) == gpus.GpuNodes("L4", ("NVIDIA-L4",))
    with pytest.raises(UsageError) as exc:
        gpus.choose(nodes, "H100", "nvidia.com/gpu", None)
    assert exc.value.message == (f"no node has GPU H100: the cluster's nodes carry {P} NVIDIA-A100-SXM4-80GB (1 node), "
                                 "NVIDIA-L4 (2 nodes); ask for a GPU they have with --gpu")
    with pytest.raises(UsageError, match="GPU feature discovery is not installed.*--option node-selector=KEY=VALUE"):
        gpus.choose([_node("a"), _node("b")], "L4", "nvidia.com/gpu", None)
    # one product value covering both A100 sizes: the memory label tells them apart
    mixed = [_node("a", "NVIDIA-A100-PCIE", "40960"), _node("b", "NVIDIA-A100-PCIE", "81920")]
    chosen = gpus.choose(mixed, "A100", "nvidia.com/gpu", None)
    assert chosen.selector() == {} and chosen.affinity() == [
        {"key": P, "operator": "In", "values": ["NVIDIA-A100-PCIE"]}, {"key": M, "operator": "In", "values": ["40960"]}]
    assert chosen.admits(mixed[0].metadata.labels) and not chosen.admits(mixed[1].metadata.labels)


def spec(gpu=None, **opts):
    return ClusterSpec(cloud="kubernetes", nodes=2, accelerator=gpu, gpus_per_node=1,
                       options=tuple(sorted(opts.items())))


@pytest.mark.parametrize("gpu,opts,said", [
    ("L4", {"gpuProduct": "NVIDIA-A100-SXM4-80GB"}, "--gpu L4 and --option gpu-product=NVIDIA-A100-SXM4-80GB name "
                                                    "different GPUs"),
    ("L4", {"nodeSelector": f"pool=a,{P}=Tesla-T4"}, f"--gpu L4 and --option node-selector={P}=Tesla-T4 name different"),
    ("A100-80GB", {"gpuProduct": "NVIDIA-A100-SXM4-40GB"}, "--gpu A100-80GB and --option gpu-product"),
    ("L4", {"gpuResource": "amd.com/gpu"}, "is not an NVIDIA resource"),
    (None, {"gpuProduct": "NVIDIA-L4", "nodeSelector": f"{P}=Tesla-T4"}, "name different nodes: give one of them"),
    ("nvidia-tesla-k80", {}, "--gpu 'nvidia-tesla-k80' is not allowed: a GPU of the catalog: T4, V100"),
])
def test_contradictions_are_refused_naming_both(gpu, opts, said):
    with pytest.raises(SpecError) as exc:
        options.validate_spec(spec(gpu, **opts))
    assert said in exc.value.message, exc.value.message


def test_consistent_pins_pass():
    options.validate_spec(spec("L4", gpuProduct="NVIDIA-L4"))
    options.validate_spec(spec("A100", nodeSelector=f"{P}=NVIDIA-A100-PCIE"))  # no size word: not a contradiction
    assert options.pinned_product(spec("L4", nodeSelector=f"pool=a,{P}=NVIDIA-L4")) == "NVIDIA-L4"
    assert options.gpu(spec("nvidia-l4")) == "L4"
