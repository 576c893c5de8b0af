"""A run's folder on each host (`~/.gpucluster/runs/RUN`, holding the node folders): removed as a
whole at teardown (what a --setup or the job wrote beside the node folders, e.g. Lightning's
`<script dir>/../../Datasets`, is the run's too), and looked for by the teardown check (issue 46
item 7)."""

from __future__ import annotations

import os
import shlex
from typing import Any

from gpucluster.errors import LaunchError

from .session import OWNER_FILE, node_label


def remove_run_folder(node_dir: str, owner: str | None) -> str:
    """Shell text that removes the run folder holding `node_dir` (RUN/node-N) as a whole: what a
    --setup or the job wrote beside the node folders (`../../Datasets`) is the run's too. Left when
    another owner's node folder is in it."""
    if not os.path.basename(node_dir.rstrip("/")).startswith("node-"):
        return "true"
    parent = os.path.dirname(node_dir.rstrip("/"))
    q = shlex.quote(parent)
    other = (f"for m in {q}/node-*/{OWNER_FILE}; do [ -f \"$m\" ] && [ \"$(cat \"$m\")\" != {shlex.quote(owner)} ] "
             "&& exit 0; done; ") if owner else ""
    return f"{{ {other}rm -rf {q}; true; }}"


def folder_left(session: Any, node: Any, folder: str) -> str | None:
    """`folder` on the node when it still exists ('~/' is the remote home): its path and first
    names, for the teardown check; None when it is gone."""
    path = '"$HOME"/' + shlex.quote(folder[2:]) if folder.startswith("~/") else shlex.quote(folder)
    cp = session.run(node, f"d={path}; if [ -e \"$d\" ] || [ -L \"$d\" ]; then echo \"$d\"; "
                        "ls -A \"$d\" 2>/dev/null | head -4; fi", timeout=30)
    if cp.returncode != 0:
        raise LaunchError(f"node {node.rank} ({node_label(node)}): could not look for {folder}: "
                          + cp.stderr.decode("utf-8", "replace").strip()[-200:])
    lines = cp.stdout.decode("utf-8", "replace").splitlines()
    return f"{lines[0]} (holds {', '.join(lines[1:]) or 'nothing'})" if lines else None



def folder_leftover(node: Any, left: str) -> Any:
    """A run folder still on a host (`folder_left`'s answer), as a teardown leftover."""
    from gpucluster.domain import Leftover

    return Leftover("folder", f"{node_label(node)}:{left.split(' (holds ')[0]}", detail=left)
