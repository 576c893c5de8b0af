"""The Python programs the ssh launcher runs on each node with `python3 -` (the code comes on
stdin, so nothing is installed there): `READY_PY` reports what the node has (python, torch, GPUs,
tools), `PROCS_PY` lists or kills the processes of a run on the node. Only the standard library is
used on the node."""

from pathlib import Path


def _program(name: str) -> str:
    """The text of a program that runs on a node (a file of this package, shipped by content)."""
    return (Path(__file__).parent / name).read_text()


READY_MARK = "@gpucluster-ready "
NO_PYTHON_RC = 97

# Run on each node by `python3 -` (the code comes on stdin): what the node has.
READY_PY = _program("node_ready.py")

# Run on each node by `python3 -`: list, or kill, the processes of a run on this node.
# argv: mode (list|kill) run_id node_rank|"" pgid_file|"" grace_seconds
PROCS_PY = _program("node_procs.py")
