"""Object storage on the nodes (`--data s3://...`, `--output s3://...`): each node pulls a source
into its DEST or pushes its output folder itself, with its own credentials, driven over the run's
ssh connections. What runs on the node comes from the backend (`launcher.objects`, e.g.
`infra.aws.s3.NodeTransfer`): `script(python, "pull", URL, DEST)` / `script(python, "push", SRC,
URL)`, whose last stdout line is a JSON object (tool, files, bytes; push: failed) and whose exit
code is 0 (done), 3 (push: some files failed) or anything else (nothing done, why on stderr).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Sequence

from gpucluster.errors import LaunchError
from gpucluster.states import JsonObject
from gpucluster.watch.launch import JobSpec

from .session import Session, node_label

if TYPE_CHECKING:
    from gpucluster.domain import Node
    from gpucluster.watch.outputs import NodeOutputs

TRANSFER_TIMEOUT_S = 6 * 3600  # one node's pull or push of every object


def is_url(text: str | None) -> bool:
    return bool(text) and "://" in str(text)


def _answer(out: bytes) -> JsonObject:
    lines = [ln for ln in out.decode("utf-8", "replace").splitlines() if ln.strip()]
    try:
        return json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        return {}


def _why(err: bytes, rc: int) -> str:
    lines = [ln.strip() for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1][-400:] if lines else f"exit code {rc}"


def pull(session: Session, job: JobSpec, pairs: dict[int, Sequence[tuple[str, str]]]) -> dict[int, JsonObject]:
    """Every node pulls its (URL, absolute DEST) pairs, nodes in parallel. {rank: {files, bytes,
    seconds, tool}}; LaunchError naming each node that failed."""
    objects = session.launcher.objects
    if objects is None:
        raise LaunchError("this backend's nodes cannot read object storage (no --data URL is allowed here)")

    def one(node: Node) -> tuple[JsonObject, None]:
        start, files, nbytes, tools = time.monotonic(), 0, 0, set()
        for url, dest in pairs[node.rank]:
            cp = session.run(node, objects.script(session.launcher.python, "pull", url, dest),
                             timeout=TRANSFER_TIMEOUT_S)
            if cp.returncode != 0:
                raise LaunchError(f"node {node.rank} ({node_label(node)}): staging {url} failed: "
                                  f"{_why(cp.stderr, cp.returncode)}")
            got = _answer(cp.stdout)
            files, nbytes = files + int(got.get("files", 0)), nbytes + int(got.get("bytes", 0))
            tools.add(str(got.get("tool", "?")))
        return {"files": files, "bytes": nbytes, "seconds": round(time.monotonic() - start, 3),
                "tool": ",".join(sorted(tools))}, None

    results: dict[int, JsonObject] = {}
    errors: list[str] = []
    for node, (res, err) in zip(session.nodes, session.each(one)):
        if err is not None:
            errors.append(err)
        elif res is not None:
            results[node.rank] = res
    if errors:
        raise LaunchError("; ".join(errors))
    return results


def push(session: Session, todo: set[int], out_dirs: dict[int, str], url: str, run_id: str) -> list[NodeOutputs]:
    """Every node in `todo` uploads its output folder to URL/RUN_ID/node-N/. One
    `gpucluster.watch.outputs.NodeOutputs` per node: complete, partial (which files failed) or failed."""
    from gpucluster.watch.outputs import FAILED, NodeOutputs, pushed

    objects = session.launcher.objects
    base = url.rstrip("/")

    def one(node: Node) -> tuple[NodeOutputs | None, None]:
        where = f"{base}/{run_id}/node-{node.rank}"
        who = f"node {node.rank} ({node_label(node)})"
        if objects is None:
            return NodeOutputs(node.rank, where, FAILED, detail=f"{who}: cannot write object storage"), None
        start = time.monotonic()
        cp = session.run(node, objects.script(session.launcher.python, "push", out_dirs[node.rank], where),
                         timeout=TRANSFER_TIMEOUT_S)
        took = time.monotonic() - start
        return pushed(node.rank, where, who, cp.returncode, _answer(cp.stdout), _why(cp.stderr, cp.returncode),
                      took), None

    results: list[NodeOutputs] = []
    for node, (res, err) in zip(session.nodes, session.each(lambda n: one(n) if n.rank in todo else (None, None))):
        if node.rank not in todo:
            continue
        results.append(res if res is not None else
                       NodeOutputs(node.rank, f"{base}/{run_id}/node-{node.rank}", FAILED, detail=err))
    return results
