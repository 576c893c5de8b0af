"""The `local` backend: N "nodes" are N torchrun agents on this machine; nothing is provisioned.

Contract: `gpucluster.infra.contract`. `TRAITS` here (plain values); `plugin.PLUGIN` holds its
parts. Modules: catalog (GPU count, spec checks), provider (`LocalProvider`: the run's processes
are its leftovers), launch (`LocalLauncher`)."""

from __future__ import annotations

from gpucluster.infra.contract import Capability, Traits

TRAITS = Traits(
    name="local",
    max_nodes=16,  # local "nodes" are processes on this machine: beyond 16 they only measure contention
    flags=("data", "setup", "resume", "python"),
    flags_refused_why="local runs use this machine as it is",
    capabilities=frozenset({Capability.SHARES_GPUS}),  # this machine's GPUs, shared out by catalog.share_gpus
)
