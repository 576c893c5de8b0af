"""A kept ssh cluster (`up --cloud ssh --hosts ...`, `gpucluster.lifecycle.held`): the ready check `up` runs
once, and the rows `down` cleans the hosts with.

- `hold(launcher, cluster)`: every host asked once (the launcher's readiness probe: reachable with
  the key and known hosts given, python, torch, setsid, tar, the GPUs expected); a LaunchError
  naming each host that is not ready. Returns what each host's `host` row records: its home (where
  the run folders go), its Python and torch.
- `HeldSshLauncher`: the ssh launcher whose `leftovers(..., remove=True)` reclaims: before a job on a kept cluster whose last job's
  gpucluster process died, that job's processes (by run id AND this owner) are killed on every host
  and its run folder removed, then read back as a teardown would (`leftovers`). On a kept cluster
  whose hosts answered the readiness questions (python, torch, home, GPUs) less than READY_FRESH_S
  ago (`up`, or the last job's start), a job skips asking them again (issue 46, done-means 2): the
  answers are kept in `$GPUCLUSTER_HOME/held/NAME.ready.json`, which `up` writes and `down` removes.
- `host_run_rows(rows, run_ids)`: `ssh-run`-shaped rows for the runs of a kept cluster that hold
  none of their own (the `up` run; a job killed before it wrote them), from the `host` rows: `down`
  kills each such run's processes by run id and removes its run folder under the recorded home.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from gpucluster.lifecycle.held import HOST_KIND, not_ready
from gpucluster.states import JsonMapping, JsonObject
from gpucluster.watch.launch import Launcher

from .launch import SshLauncher
from .session import NodeReadiness, Session, node_label, owner_guard, remove_run_folder
from .ship import check_run_id

if TYPE_CHECKING:
    from gpucluster.domain import Cluster, Leftover, Node


def hold(launcher: Launcher, cluster: Cluster) -> dict[int, dict[str, object]]:
    if not isinstance(launcher, SshLauncher):
        raise TypeError(f"the ssh backend holds hosts through its own launcher, not {type(launcher).__name__}")
    ready = launcher.probe(cluster)
    problems = {r.rank: r.problems for r in ready if not r.ok}
    if problems:
        raise not_ready(problems, {n.rank: node_label(n) for n in cluster.nodes})
    remember_ready(cluster, launcher.python, ready)
    return {r.rank: {"label": r.label, "home": r.home, "remote_python_path": r.python, "torch": r.torch,
                     "gpus_seen": r.gpus} for r in ready}


READY_FRESH_S = 60.0  # hosts that answered this recently are not asked again (issue 46: "within the last minute")


def ready_file(name: str) -> Path:
    from gpucluster.home import home_dir

    return home_dir() / "held" / f"{name}.ready.json"


def _key(cluster: Cluster, python: str) -> JsonObject:
    return {"hosts": [node_label(n) for n in cluster.nodes], "python": python,
            "gpus_expected": int(cluster.gpus_per_node or 0)}


def remember_ready(cluster: Cluster, python: str, ready: list[NodeReadiness], *, only_if_kept: bool = False) -> None:
    """Keep the hosts' answers for the next job (`up`; each job's check on a kept cluster)."""
    path = ready_file(cluster.name)
    if only_if_kept and not path.exists():
        return  # a plain `run` on these hosts: nothing kept
    path.parent.mkdir(mode=0o700, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**_key(cluster, python), "at": time.time(), "nodes": [
        {"rank": r.rank, "label": r.label, "home": r.home, "python": r.python, "torch": r.torch,
         "gpu_state": r.gpu_state} for r in ready]}))
    os.replace(tmp, path)


def recent_ready(cluster: Cluster, python: str, now: float | None = None) -> list[NodeReadiness] | None:
    """The hosts' answers when the same hosts, Python and GPU count answered less than
    READY_FRESH_S ago; None otherwise (ask them)."""
    from gpucluster.errors import GpuclusterError
    from gpucluster.userfile import read_bounded

    try:
        data = json.loads(read_bounded(ready_file(cluster.name), "kept hosts' readiness", 1 << 20))
        age = (time.time() if now is None else now) - float(data["at"])
        if {k: data.get(k) for k in ("hosts", "python", "gpus_expected")} != _key(cluster, python) or not 0 <= age < READY_FRESH_S:
            return None
        return [NodeReadiness(int(n["rank"]), str(n["label"]), ok=True, home=n.get("home"), python=n.get("python"),
                              torch=n.get("torch"), gpu_state=list(n.get("gpu_state") or [])) for n in data["nodes"]]
    except (OSError, ValueError, KeyError, TypeError, GpuclusterError):  # no usable answers: ask the hosts
        return None


class HeldSshLauncher(SshLauncher):
    def leftovers(self, cluster: Cluster, run_id: str | None, *, remove: bool = False) -> list[Leftover] | None:
        """With `remove` (a run whose gpucluster process died): kill what run `run_id` left on the hosts
        and remove its run folder; what is still there after (an unreachable host is an "unverified"
        leftover, so exec refuses). Without: the ssh launcher's read."""
        from gpucluster.ownership import installation_id

        if not remove or run_id is None:
            return self.processes_left(cluster, run_id)
        check_run_id(run_id)
        owner = installation_id()
        base = self.remote_dir.rstrip("/")
        base = base[2:] if base.startswith("~/") else base  # ssh runs the command in the remote home
        with Session(self, cluster) as session:
            def one(node: Node) -> tuple[int, None]:
                d = f"{base}/{run_id}/node-{node.rank}"
                session.procs(node, "kill", run_id, str(node.rank), f"{d}/pgid", self.grace, owner)
                return session.run(node, f"{owner_guard(d, owner)}{remove_run_folder(d, owner)}",
                                   timeout=60).returncode, None

            session.each(one)  # a host that cannot be reached shows in the read-back below
        return self.processes_left(cluster, run_id, owner=owner)

    def ready_of(self, session: Session, cluster: Cluster) -> list[NodeReadiness]:
        """The kept hosts' recent answers when fresh (each host still reached: its ssh master opened),
        else the questions asked, and the answers kept when this is a kept cluster."""
        recent = recent_ready(cluster, self.python)
        if recent is None:
            ready = super().ready_of(session, cluster)
            remember_ready(cluster, self.python, ready, only_if_kept=True)
            return ready
        def reach(node: Node) -> tuple[bool, None]:
            session.open_master(node)  # a LaunchError naming the node when it cannot be reached
            return True, None

        failed = [err for _, err in session.each(reach) if err]
        if failed:
            from gpucluster.errors import LaunchError

            raise LaunchError("; ".join(failed))
        return recent


def host_run_rows(rows: Iterable[JsonMapping], run_ids: Iterable[str], remote_dir: str) -> list[JsonObject]:
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
