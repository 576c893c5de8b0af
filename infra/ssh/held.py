"""A kept ssh cluster (`up --cloud ssh --hosts ...`, `gpucluster.held`): the ready check `up` runs
once, and the rows `down` cleans the hosts with.

- `hold(launcher, cluster)`: every host asked once (the launcher's readiness probe: reachable with
  the key and known hosts given, python, torch, setsid, tar, the GPUs expected); a LaunchError
  naming each host that is not ready. Returns what each host's `host` row records: its home (where
  the run folders go), its Python and torch.
- `host_run_rows(rows, run_ids)`: `ssh-run`-shaped rows for the runs of a kept cluster that hold
  none of their own (the `up` run; a job killed before it wrote them), from the `host` rows: `down`
  kills each such run's processes by run id and removes its run folder under the recorded home.
"""

from __future__ import annotations

from typing import Any, Iterable

from gpucluster.held import HOST_KIND, not_ready

from .session import node_label


def hold(launcher: Any, cluster: Any) -> dict[int, dict[str, object]]:
    ready = launcher.probe(cluster)
    problems = {r.rank: r.problems for r in ready if not r.ok}
    if problems:
        raise not_ready(problems, {n.rank: node_label(n) for n in cluster.nodes})
    return {r.rank: {"label": r.label, "home": r.home, "remote_python_path": r.python, "torch": r.torch,
                     "gpus_seen": r.gpus} for r in ready}


def host_run_rows(rows: Iterable[dict[str, Any]], run_ids: Iterable[str], remote_dir: str) -> list[dict[str, Any]]:
    """For each run id, one row per held host, as the launcher's `ssh-run` rows read: the connection
    details and (the home being known) the node's run folder as its cloud id."""
    hosts = [r for r in rows if r.get("kind") == HOST_KIND]
    out = []
    for rid in run_ids:
        for row in hosts:
            d = dict(row.get("detail") or {})
            home = str(d.get("home") or "").rstrip("/")
            base = home + remote_dir[1:] if remote_dir.startswith("~/") and home else ""
            out.append({"run_id": rid, "cluster": row.get("cluster"), "kind": "ssh-run",
                        "cloud_id": f"{base}/{rid}/node-{d.get('rank', 0)}" if base else None,
                        "detail": {**d, "python": d.get("remote_python") or "python3"}})
    return out
