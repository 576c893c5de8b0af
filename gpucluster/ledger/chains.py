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


class ResumeLinks(dict[str, tuple]):
    """`links` as `Ledger.resume_links()` reads them, with every chain's members found once, on
    first use: `members` is then a look-up, so reading every run of a ledger (`cost report`) stays
    linear in the runs, where walking the links for each run made it quadratic in the chained
    ones. Read once and not changed afterwards (a change would not reach the index)."""

    _chains: dict[str, list[str]] | None = None

    def chains(self) -> dict[str, list[str]]:
        """root -> the chain's runs, ordered as `members` orders them."""
        if self._chains is None:
            groups: dict[str, list[str]] = {}
            for r in self:
                groups.setdefault(root_of(r, self), []).append(r)
            self._chains = {root: _ordered(root, runs, self) for root, runs in groups.items()}
        return self._chains


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
    if isinstance(links, ResumeLinks):
        return list(links.chains().get(root) or [root])
    return _ordered(root, [r for r in links if root_of(r, links) == root], links)


def _ordered(root: str, runs: list[str], links: Links) -> list[str]:
    """A chain's runs, the root first (added when it is not among the links), then by creation."""
    out = runs if root in runs else [*runs, root]
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
