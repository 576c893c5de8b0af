"""The Python programs the ssh launcher runs on each node with `python3 -` (the code comes on
stdin, so nothing is installed there): `READY_PY` reports what the node has (python, torch, GPUs,
tools), `PROCS_PY` lists or kills the processes of a run on the node. Only the standard library is
used on the node. `RESOLVE_PYTHON`: the shell words that make --remote-python absolute there.
`gpu_row`: one GPU line of what READY_PY reports, read here."""

from __future__ import annotations

from pathlib import Path

from gpucluster.states import JsonObject


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

# Run on the head by `python3 -c`: is the rendezvous port free, else the nearest free one above it and
# who holds it (health.free_port).
PORT_PY = _program("node_port.py")

# --remote-python as every rank and --setup command see it: GPUCLUSTER_PYTHON an absolute path on
# the node (a bare name is looked up on the node's own PATH, as the node's shell would run it; a
# symlink is not followed, so a virtualenv's python stays that virtualenv's), its folder first on
# PATH, so `python` inside a wrapper script is the same interpreter. Not found: the node says so
# and its job does not start (sh: the chain after it stops, NODE_EXIT_SH reports the status).
RESOLVE_PYTHON = ('{ case "$GPUCLUSTER_PYTHON" in /*) p=$GPUCLUSTER_PYTHON;; */*) p=$PWD/$GPUCLUSTER_PYTHON;; '
                  '*) p=$(command -v "$GPUCLUSTER_PYTHON");; esac; [ -n "$p" ] || { echo "gpucluster: remote python '
                  '$GPUCLUSTER_PYTHON not found on this node (PATH=$PATH)" >&2; false; }; } && '
                  'export GPUCLUSTER_PYTHON="$p" PATH="${p%/*}:$PATH" && ')


def gpu_row(line: str) -> JsonObject:
    """One `nvidia-smi --query-gpu=name,utilization.gpu,memory.used,memory.total` csv row."""
    name, *rest = [f.strip() for f in line.rsplit(",", 3)] if line.count(",") >= 3 else [line.strip()]
    row: JsonObject = {"name": name}
    for key, value in zip(("util", "mem_used_mib", "mem_total_mib"), rest):
        try:
            row[key] = float(value)
        except ValueError:
            row[key] = None  # "[N/A]" on some boards
    return row
