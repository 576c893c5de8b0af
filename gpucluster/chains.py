"""Resume chains: a run started with `--resume RUN_ID` records RUN_ID (`runs.resumed_from`); a
chain is one training job spread over several runs: its root (a run resumed from nothing) and
every run resumed from it, transitively. Pure functions over the ledger's links, shared by
`gpucluster show` and `cost report --group-by chain`.

`links` maps run id -> (resumed_from or None, created_at) for the runs that take part in a link
(`Ledger.resume_links()`); a run absent from it is a chain of its own.
"""

from __future__ import annotations

from typing import Mapping

Links = Mapping[str, tuple]


def root_of(run_id: str, links: Links) -> str:
    """The first run of `run_id`'s chain (itself when it was resumed from nothing). A link to a run
    no longer in the ledger ends the walk there; a loop (only a hand-edited ledger has one) too."""
    seen = {run_id}
    current = run_id
    while True:
        parent = (links.get(current) or (None,))[0]
        if parent is None or parent in seen:
            return current
        if parent not in links:
            return parent
        seen.add(parent)
        current = parent


def members(run_id: str, links: Links) -> list[str]:
    """Every run of `run_id`'s chain, the root first, then in the order they were created."""
    root = root_of(run_id, links)
    out = [r for r in links if root_of(r, links) == root]
    if root not in out:
        out.append(root)
    return sorted(out, key=lambda r: (r != root, (links.get(r) or (None, 0.0))[1] or 0.0, r))


def ancestors(run_id: str, links: Links) -> list[str]:
    """The runs `run_id` continues, nearest first (empty for a root)."""
    out: list[str] = []
    current = run_id
    while True:
        parent = (links.get(current) or (None,))[0]
        if parent is None or parent in out or parent == run_id:
            return out
        out.append(parent)
        current = parent
