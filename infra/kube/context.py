"""`gpucluster down NAME --context C` of a kubernetes cluster (a run's objects, or a kept namespace): the context
the ledger recorded with each run is where its objects are looked for, deleted and read back. `--context C` must
name that context, or stand in for it once it is gone from the kubeconfig (renamed, or the kubeconfig made
again, e.g. by `aws eks update-kubeconfig --alias`): the objects are then looked for in C, in the namespace the
run recorded, by the run's label (and a kept namespace's by its cluster label and this home's owner id). A
context of the kubeconfig other than the recorded one is refused: the run's objects are not there.
"""

from __future__ import annotations

import copy
from typing import Mapping

from gpucluster.states import JsonMapping, JsonObject

from gpucluster.errors import UsageError

from . import access


def known_contexts() -> tuple[str, list[str]]:
    """(the kubeconfig's path, the names of its contexts); a UsageError when it cannot be read."""
    path = access.kubeconfig_path()
    known, _ = access.contexts(path)
    return path, [str(c.get("name")) for c in known if isinstance(c, dict) and c.get("name")]


def recorded(record: JsonMapping) -> set[str]:
    """The contexts a run's record names: its spec's `context` option, and a kept namespace's `host` row."""
    from gpucluster.lifecycle.held import HOST_KIND

    out = set()
    spec = record.get("spec")
    opts = spec.get("options") if isinstance(spec, Mapping) else None
    given = dict(opts) if isinstance(opts, (Mapping, list, tuple)) else {}
    if given.get("context"):
        out.add(str(given["context"]))
    rows = record.get("resources")
    for row in rows if isinstance(rows, list) else []:
        detail = row.get("detail") if isinstance(row, Mapping) else None
        if row.get("kind") == HOST_KIND and isinstance(detail, Mapping) and detail.get("context"):
            out.add(str(detail["context"]))
    return out


def pointed(record: JsonMapping, context: str) -> JsonObject:
    """A copy of the record naming `context` wherever it named one."""
    from gpucluster.lifecycle.held import HOST_KIND

    out = copy.deepcopy(dict(record))
    spec = out.get("spec")
    if isinstance(spec, dict) and isinstance(spec.get("options"), (Mapping, list, tuple)):
        given = dict(spec["options"])
        if given.get("context"):
            given["context"] = context
        spec["options"] = given
    rows = out.get("resources")
    for row in rows if isinstance(rows, list) else []:
        detail = row.get("detail") if isinstance(row, dict) else None
        if isinstance(row, dict) and row.get("kind") == HOST_KIND and isinstance(detail, dict) and detail.get("context"):
            detail["context"] = context
    return out


def in_context(context: str, runs: Mapping[str, JsonMapping]) -> tuple[JsonObject, list[str]]:
    """(the runs' records to check, pointed at `context` where theirs is gone; what was done), or a UsageError
    (exit 2): `context` not in the kubeconfig, or a run recorded with another context the kubeconfig holds."""
    path, names = known_contexts()
    if context not in names:
        raise UsageError(f"context {context!r} is not in kubeconfig {path}: known contexts: "
                         f"{', '.join(names) or '(none)'}")
    out: JsonObject = {}
    said = []
    for rid, record in sorted(runs.items()):
        others = sorted(recorded(record) - {context})
        alive = [c for c in others if c in names]
        if alive:
            raise UsageError(f"run {rid} was made in context {alive[0]!r}, which kubeconfig {path} still holds, not "
                             f"in {context!r}: give --context {alive[0]}, or leave --context out")
        out[rid] = pointed(record, context) if others else dict(record)
        if others:
            said.append(f"run {rid}: its context {', '.join(repr(c) for c in others)} is no longer in the kubeconfig; "
                        f"its objects are looked for in context {context!r} (--context)")
    return out, said


def gone_hint(context: str, name: str) -> str:
    """What to do when the context a run recorded is no longer in the kubeconfig ('' when it is)."""
    try:
        _, names = known_contexts()
    except UsageError:
        return ""
    return "" if context in names else (f"; the kubeconfig no longer holds context {context!r}: if it was renamed, "
                                        f"gpucluster down {name} --context NEW_NAME")
