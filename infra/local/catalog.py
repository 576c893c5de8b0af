"""The `local` backend's checks: GPUs are whatever this machine has (counted without torch)."""

from __future__ import annotations

import functools
import shutil
import subprocess

from gpucluster.errors import SpecError


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
