"""The GPUs users ask for by name (`--gpu TYPE[:COUNT]`), in one table every cloud's catalog names.

Cloud-agnostic: no backend is imported here. Each cloud's catalog (infra/aws/shapes.py,
infra/gcp/shapes.py) maps these names to the shapes that carry them; this module only knows the
GPU itself and how users spell it.

Memory is what the driver reports per GPU (nvidia-smi `memory.total`, MiB), as the EC2
DescribeInstanceTypes data bundled in moto 5.2.5 gives it (GpuInfo.Gpus[].MemoryInfo.SizeInMiB,
read 2026-11-28) for the GPUs EC2 offers; T4 and V100 (16 GB parts) from NVIDIA's data sheets
(16 GB). `nominal_gb` is the marketing size the listing shows. Compute capability (sm) from
NVIDIA's CUDA GPUs page (https://developer.nvidia.com/cuda-gpus), read 2026-11-28. `generation`
decides the default image on GKE: PyTorch 2.11's cu128/cu130 wheels dropped sm_70 (Volta)
(pytorch/pytorch#172352), so Volta gets a cu126 build (FACTS.md, "Volta is leaving").
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from gpucluster.errors import UsageError


@dataclass(frozen=True)
class Gpu:
    name: str  # the one spelling the catalogs, prices and plans use
    memory_mib: int  # per GPU, as the driver reports it
    nominal_gb: int
    generation: str  # volta, turing, ampere, ada, hopper, blackwell
    sm: str  # CUDA compute capability
    aliases: tuple[str, ...] = ()  # other spellings (lowercase), cloud names included


GPUS: dict[str, Gpu] = {
    g.name: g
    for g in (
        Gpu("T4", 15360, 16, "turing", "7.5", ("nvidia-tesla-t4", "tesla-t4")),
        Gpu("V100", 16384, 16, "volta", "7.0", ("nvidia-tesla-v100", "tesla-v100", "v100-16gb")),
        Gpu("A10G", 22888, 24, "ampere", "8.6", ("a10", "nvidia-a10g")),
        Gpu("L4", 22888, 24, "ada", "8.9", ("nvidia-l4",)),
        Gpu("L40S", 45776, 48, "ada", "8.9", ("nvidia-l40s", "l40")),
        Gpu("A100", 40960, 40, "ampere", "8.0", ("a100-40gb", "a100-40", "nvidia-tesla-a100", "a100-sxm4-40gb")),
        Gpu("A100-80GB", 81920, 80, "ampere", "8.0", ("a100-80", "a100-80g", "nvidia-a100-80gb", "a100-sxm4-80gb")),
        Gpu("H100", 81920, 80, "hopper", "9.0", ("h100-80gb", "nvidia-h100-80gb", "h100-sxm", "nvidia-h100-mega-80gb")),
        Gpu("H200", 144384, 141, "hopper", "9.0", ("h200-141gb", "nvidia-h200-141gb")),
        Gpu("B200", 183359, 180, "blackwell", "10.0", ("nvidia-b200",)),
    )
}

# Volta and Turing: the GPUs whose current PyTorch wheels (cu128/cu130) no longer run everywhere.
LEGACY_GENERATIONS = ("volta", "turing")

_SPEC_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?::\s*([0-9]+)\s*)?$")


def names() -> list[str]:
    return list(GPUS)


def lookup(name: str) -> Gpu | None:
    """The GPU a user's spelling means (case-insensitive, aliases included), or None."""
    key = str(name).strip().lower()
    for gpu in GPUS.values():
        if key == gpu.name.lower() or key in gpu.aliases:
            return gpu
    return None


def normalize(name: str) -> str:
    """The catalog's name for `name`; UsageError listing the known names (with a did-you-mean)."""
    gpu = lookup(name)
    if gpu is not None:
        return gpu.name
    upper = {n.upper(): n for n in GPUS}  # compared upper-cased, suggested in the catalog's spelling
    close = difflib.get_close_matches(str(name).strip().upper(), list(upper), n=1, cutoff=0.6)
    hint = f' (did you mean "{upper[close[0]]}"?)' if close else ""
    raise UsageError(f"gpu {str(name)!r} is not known{hint}; known GPUs: {', '.join(GPUS)} "
                     "(case does not matter; `gpucluster gpus` lists them with their clouds and prices)")


def parse(text: str) -> tuple[str, int]:
    """`TYPE[:COUNT]` -> (canonical name, GPUs per node); COUNT defaults to 1."""
    m = _SPEC_RE.match(str(text))
    if not m:
        raise UsageError(f"--gpu {str(text)!r} is not allowed: write TYPE[:COUNT] with COUNT the GPUs per node, "
                         "for example H100:8 or L4")
    name = normalize(m.group(1))
    count = int(m.group(2)) if m.group(2) is not None else 1
    if count < 1:
        raise UsageError(f"--gpu {str(text)!r} is not allowed: write TYPE:COUNT with COUNT the GPUs per node, 1 or more")
    return name, count


def spelled(name: str, count: int) -> str:
    """The form plans and JSON show: `H100:8`."""
    return f"{name}:{count}"


def combine(gpu: str | None, gpus_per_node: int | None, accelerator: str | None = None, *,
            flag: str = "--gpu", count_flag: str = "--gpus-per-node") -> tuple[str | None, int | None]:
    """(accelerator, GPUs per node) of a spec given `--gpu TYPE[:COUNT]` and the older flags; a
    contradiction between them is refused naming both. Without `gpu` the others pass unchanged."""
    if gpu is None:
        return accelerator, gpus_per_node
    name, count = parse(gpu)
    if gpus_per_node is not None and int(gpus_per_node) != count:
        raise UsageError(f"{flag} {gpu} asks for {count} GPU(s) per node but {count_flag} is {gpus_per_node}: "
                         f"give one of them (COUNT in {flag} TYPE:COUNT is the GPUs per node)")
    if accelerator is not None and lookup(accelerator) is not None and normalize(accelerator) != name:
        raise UsageError(f"{flag} {gpu} and accelerator {accelerator!r} name different GPUs: give one of them")
    return name, count
