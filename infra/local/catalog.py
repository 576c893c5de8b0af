"""The `local` backend's checks: GPUs are whatever this machine has (counted without torch)."""

from __future__ import annotations

import functools
import shutil
import subprocess

from gpucluster.errors import SpecError
from gpucluster.spec import ClusterSpec


@functools.lru_cache(maxsize=1)
def gpus_present() -> int:
    """NVIDIA GPUs visible on this machine (nvidia-smi -L), 0 when there is no driver."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def validate_spec(spec) -> list[str]:
    present = gpus_present()
    gpn = spec.gpus_per_node
    if gpn:
        if present == 0:
            raise SpecError(
                f"gpus per node {gpn} is not allowed: this machine has no NVIDIA GPU; "
                "leave --gpus-per-node out (or use --procs-per-node for CPU processes)"
            )
        if gpn * spec.nodes > present:
            raise SpecError(
                f"gpus per node {gpn} x {spec.nodes} nodes is not allowed: this machine has {present} GPU(s); "
                f"at most {max(1, present // spec.nodes)} per node for {spec.nodes} nodes"
            )
    return []


def share_gpus(spec: ClusterSpec, **_: object) -> tuple[ClusterSpec, list[str]]:
    """`SpecRules.prepare`: this machine's GPUs shared out among the local "nodes" when --gpus-per-node is not
    given (a spec of one node gets them all: what `sweep` sizes by); a note when no node gets a whole one."""
    if spec.gpus_per_node is not None:
        return spec, []
    present = gpus_present()
    spec = spec.replace(gpus_per_node=present // spec.nodes if present else 0)
    if not present or spec.gpus_per_node:
        return spec, []
    # NCCL refuses two ranks on one GPU ("Duplicate GPU detected")
    return spec, [f"this machine has {present} GPU(s) for {spec.nodes} nodes: no node gets a whole GPU, so every "
                  "node trains on the CPU (gloo); " + ("--nodes 1 trains on the GPU" if present == 1 else
                                                      f"--nodes {present} or fewer gives each node GPUs of its own")]
