"""`--gpu TYPE[:COUNT]` on an existing cluster: COUNT GPUs per pod, on the nodes whose GPU feature discovery
label names TYPE, found among the cluster's nodes before anything is created.

What the labels are (NVIDIA GPU feature discovery, part of the NVIDIA device plugin: NVIDIA/k8s-device-plugin,
docs/gpu-feature-discovery/README.md "Generated Labels", https://github.com/NVIDIA/k8s-device-plugin#gpu-feature-discovery;
how the value is written: internal/lm/resource.go `getProductName` and `sanitise`):
- `nvidia.com/gpu.product`: the GPU's name as the driver (NVML) reports it, characters other than letters,
  digits, `-`, `_`, `.` and blanks dropped and each run of blanks made one `-` ("NVIDIA A100-SXM4-80GB" ->
  `NVIDIA-A100-SXM4-80GB`, "Tesla T4" -> `Tesla-T4`, "NVIDIA H100 80GB HBM3" -> `NVIDIA-H100-80GB-HBM3`); under
  the MIG "single" strategy `-MIG-<profile>` is added (`A100-SXM4-40GB-MIG-1g.5gb`), and where GPUs are
  shared (time-slicing or MPS, resources not renamed) `-SHARED`.
- `nvidia.com/gpu.memory`: the GPU's memory in MiB (of the MIG slice under MIG).

The rule (`carries`): a node has catalog GPU X (gpucluster.catalog.gpus) when one `-`-separated word of its
product label is X's model, X's catalog name up to its first `-` (A100-80GB: A100), any case, and no word is
MIG or SHARED (a slice or a shared replica is not a whole GPU). Where the catalog names one model in two
memory sizes (A100: 40 and 80 GB), the size decides: a word `NNGB` of the label, else `nvidia.com/gpu.memory`;
the catalog's size nearest it is the node's; a label saying neither is taken for neither.

The pods then select the product values the matching nodes carry: one value, a nodeSelector; several, a
required node affinity `In` them (Kubernetes docs, "Assigning Pods to Nodes": nodeSelector and
`requiredDuringSchedulingIgnoredDuringExecution`). Where the nodes cannot be read (a dry run, or a user who may
not list nodes) the values GPU feature discovery writes for the common parts of X (`KNOWN`) are used, and the
check is said not done.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping

from gpucluster.states import JsonObject

if TYPE_CHECKING:
    from gpucluster.catalog.gpus import Gpu
    from gpucluster.infra.kubernetes.api import KubeObject

PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"
_SIZE = re.compile(r"^(\d+)GB$", re.IGNORECASE)

# The product values of the usual parts of each catalog GPU (their NVML names, sanitised as above): what a dry
# run shows and what a user who may not list nodes selects; a real run reads the values its nodes carry.
KNOWN: dict[str, tuple[str, ...]] = {
    "T4": ("Tesla-T4",),
    "V100": ("Tesla-V100-SXM2-16GB", "Tesla-V100-PCIE-16GB"),
    "A10G": ("NVIDIA-A10G",),
    "L4": ("NVIDIA-L4",),
    "L40S": ("NVIDIA-L40S",),
    "A100": ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"),
    "A100-80GB": ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"),
    "H100": ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", "NVIDIA-H100-NVL"),
    "H200": ("NVIDIA-H200",),
    "B200": ("NVIDIA-B200",),
}


def _catalog_gpus() -> dict[str, Gpu]:
    from gpucluster.catalog import gpus

    return gpus.GPUS


def model(name: str) -> str:
    return name.split("-")[0].upper()


def _sized_models(name: str) -> list[Gpu]:
    """The catalog's GPUs of `name`'s model (more than one: the memory size tells them apart)."""
    return [g for g in _catalog_gpus().values() if model(g.name) == model(name)]


def carries(name: str, labels: Mapping[str, str]) -> bool:
    """Whether a node with these labels has catalog GPU `name` (the rule above)."""
    words = [w.upper() for w in str(labels.get(PRODUCT_LABEL) or "").split("-")]
    if model(name) not in words or "MIG" in words or "SHARED" in words:
        return False
    siblings = _sized_models(name)
    if len(siblings) < 2:
        return True
    sizes = [int(m.group(1)) for m in (_SIZE.match(w) for w in words) if m]
    memory = str(labels.get(MEMORY_LABEL) or "")
    gb = sizes[0] if sizes else (int(memory) / 1024 if memory.isdigit() else None)
    if gb is None:
        return False
    nearest = min(siblings, key=lambda g: abs(g.nominal_gb - gb))
    return bool(nearest.name == name)


def names_other(name: str, value: str) -> bool:
    """Whether a product value the user gave (`--option gpu-product`, `node-selector`) names another GPU
    than `name`: not its model, or (A100) a size word of the other size. A value without a size passes."""
    words = [w.upper() for w in value.split("-")]
    if model(name) not in words:
        return True
    if any(_SIZE.match(w) for w in words):
        return not carries(name, {PRODUCT_LABEL: value})
    return False


@dataclass(frozen=True)
class GpuNodes:
    """The nodes a run's pods may use for `--gpu`: those whose product label is one of `products` (and, where
    one value covers both sizes of a model, whose memory label is one of `memory`); `checked`: read from
    the cluster's nodes (False: the rule's known values, `KNOWN`)."""

    gpu: str
    products: tuple[str, ...]
    memory: tuple[str, ...] = ()
    checked: bool = True

    def admits(self, labels: Mapping[str, str]) -> bool:
        return (labels.get(PRODUCT_LABEL) in self.products
                and (not self.memory or labels.get(MEMORY_LABEL) in self.memory))

    def selector(self) -> dict[str, str]:
        """The nodeSelector part: one product value and no memory condition."""
        return {PRODUCT_LABEL: self.products[0]} if len(self.products) == 1 and not self.memory else {}

    def affinity(self) -> list[JsonObject]:
        """The matchExpressions of a required node affinity, where a nodeSelector cannot say it."""
        if self.selector():
            return []
        out = [{"key": PRODUCT_LABEL, "operator": "In", "values": list(self.products)}]
        if self.memory:
            out.append({"key": MEMORY_LABEL, "operator": "In", "values": list(self.memory)})
        return out

    def said(self) -> str:
        values = ", ".join(self.products) + (f" with {MEMORY_LABEL} {', '.join(self.memory)}" if self.memory else "")
        return f"GPU {self.gpu}: nodes labelled {PRODUCT_LABEL} {values}"

    def to_dict(self) -> JsonObject:
        return {"gpu": self.gpu, "products": list(self.products), "memory": list(self.memory), "checked": self.checked}

    @staticmethod
    def from_dict(data: object) -> "GpuNodes | None":
        if not isinstance(data, Mapping) or not data.get("gpu") or not data.get("products"):
            return None
        return GpuNodes(str(data["gpu"]), tuple(str(p) for p in data["products"]),
                        tuple(str(m) for m in data.get("memory") or ()), bool(data.get("checked", True)))


def assumed(name: str, pinned: str | None = None) -> GpuNodes:
    """The nodes the rule names without reading the cluster: the value the user pinned, else `KNOWN`."""
    return GpuNodes(name, (pinned,) if pinned else KNOWN.get(name, ()), checked=False)


def _count(items: Iterable[str]) -> str:
    tally: dict[str, int] = {}
    for item in items:
        tally[item] = tally.get(item, 0) + 1
    return ", ".join(f"{v} ({n} node{'s' if n > 1 else ''})" for v, n in sorted(tally.items()))


def choose(nodes: list[KubeObject], name: str, resource: str, pinned: str | None) -> GpuNodes:
    """The nodes of `nodes` (typed V1Node, those offering `resource`) that carry GPU `name`, or a UsageError
    saying which GPUs the nodes do carry, or that their label is missing. `pinned`: a product value the user
    gave (`--option gpu-product`/`node-selector`): only nodes labelled with it."""
    labelled = [(n.metadata.name, n.metadata.labels or {}) for n in nodes]
    found = [labels for _, labels in labelled if (labels.get(PRODUCT_LABEL) == pinned if pinned else carries(name, labels))]
    if found:
        products = tuple(sorted({str(labels[PRODUCT_LABEL]) for labels in found}))
        # one product value that also covers nodes of the model's other size: the memory label tells them apart
        mixed = [labels for _, labels in labelled if labels.get(PRODUCT_LABEL) in products and labels not in found]
        memory = tuple(sorted({str(labels.get(MEMORY_LABEL)) for labels in found})) if mixed and not pinned else ()
        return GpuNodes(name, products, memory)
    raise _none_carries(labelled, name, resource, pinned)


def _none_carries(labelled: list[tuple[str, Mapping[str, str]]], name: str, resource: str,
                  pinned: str | None) -> Exception:
    """The refusal when no node carries GPU `name`: which GPUs they carry, or that their label is missing."""
    from gpucluster.errors import UsageError

    bare = [n for n, labels in labelled if not labels.get(PRODUCT_LABEL)]
    carried = _count(str(labels[PRODUCT_LABEL]) for _, labels in labelled if labels.get(PRODUCT_LABEL))
    wanted = f"GPU {name}" + (f" ({PRODUCT_LABEL}={pinned})" if pinned else "")
    if bare and not carried:
        return UsageError(f"--gpu {name}: no node offering {resource} has the label {PRODUCT_LABEL} ({len(bare)} "
                          "node(s) without it: NVIDIA GPU feature discovery is not installed): choose the nodes with "
                          "--option node-selector=KEY=VALUE and give --gpus-per-node instead of --gpu")
    said = f"the cluster's nodes carry {PRODUCT_LABEL} {carried}" if carried else "no node carries a GPU label"
    missing = (f"; {len(bare)} node(s) lack the label (GPU feature discovery not installed there: reach them "
               "with --option node-selector=KEY=VALUE and --gpus-per-node instead of --gpu)" if bare else "")
    return UsageError(f"no node has {wanted}: {said}{missing}; ask for a GPU they have with --gpu")
