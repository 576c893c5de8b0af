"""Built-in training workloads, run by torchrun on the nodes.

They depend on torch and the standard library only, so this folder can be shipped alone to a node.
Run one directly: `torchrun --nproc-per-node 2 -m gpucluster.workloads.digits` or, from a copy of
this folder, `torchrun --nproc-per-node 2 digits.py`.
"""

NAMES = ("digits", "mnist", "synthetic")
