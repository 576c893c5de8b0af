"""Clean up after ssh runs: `remote_leftovers(cluster, run_id)` (the teardown check: the run's
processes still on each node) and `clean_recorded_hosts(rows)` (`gpucluster down` of an ssh run
whose process was killed: kill by run id from the ledger's `ssh-run` rows, remove the run folders,
close the run's ssh connections on this machine)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from typing import TYPE_CHECKING, Optional, Sequence

from gpucluster.errors import ConfigError, LaunchError, MissingDependency
from gpucluster.states import JsonMapping, JsonObject

from .launch import SshLauncher
from .session import (NOT_OURS_RC, OWNER_FILE, Session, folder_left, folder_leftover, node_label, owner_guard,
                      remove_run_folder)
from .ship import check_run_id

if TYPE_CHECKING:
    from gpucluster.domain import Cluster, Leftover, Node


def remote_leftovers(cluster: Cluster, run_id: str | None, *, identity: str | None = None,
                     known_hosts: str | None = None, ssh_options: Sequence[str] = ()) -> list[Leftover]:
    """Processes on the cluster's nodes whose environment carries GPUCLUSTER_RUN_ID=<run_id>
    (any run when None), as `Leftover(kind="process")`; unreachable nodes as kind "unverified".
    An empty list is the teardown guarantee for ssh nodes."""
    return SshLauncher(identity, known_hosts, ssh_options).processes_left(cluster, run_id)


def clean_recorded_hosts(rows: Sequence[JsonMapping], *, grace: float = 3.0,
                         owner: str | None = None) -> list[Leftover]:
    """`gpucluster down` of an ssh cluster whose run did not tear down (its process was killed).

    `rows`: the ledger's open `ssh-run` resources (one per node and run, written by `launch`
    before its first connection: host, user, port, identity, known_hosts, ssh options, remote
    Python, the local control folder; cloud_id = the node's run folder). For every run and node:
    connect, kill the run's processes by run id and node rank (and their descendants, SIGTERM then
    SIGKILL), remove the run folder, check again; then close the run's ControlMaster connections
    (`ssh -O exit`), stop this machine's ssh clients of the run and delete its control folder. With
    `owner` (this home's id), processes are matched by run id AND owner and a run folder another
    owner marked is left alone: another user on the same hosts is never touched.

    Returns `Leftover`s: processes still found (kind "process"), and each host that could not be
    checked (kind "unverified", id `user@host[:port]`, detail = why). Empty: verified clean.
    """
    from gpucluster.domain import Leftover

    found: list[Leftover] = []
    for (run_id, identity, known_hosts, options, python), group in sorted(_by_run(rows).items(),
                                                                          key=lambda kv: kv[0][0]):
        group.sort(key=lambda r: int((r.get("detail") or {}).get("rank", 0)))
        cluster, dirs, control_dirs = _recorded_cluster(group)
        try:
            check_run_id(run_id)
            launcher = SshLauncher(identity, known_hosts, options, python=python, grace=grace)
            with Session(launcher, cluster) as session:
                def one(node: Node) -> tuple[JsonObject, None]:
                    d = dirs.get(node.rank, "")
                    session.procs(node, "kill", run_id, str(node.rank), f"{d}/pgid" if d else "", grace, owner)
                    if d:
                        cp = session.run(node, f"{owner_guard(d, owner)}rm -rf {shlex.quote(d)} && "
                                               + remove_run_folder(d, owner))
                        if cp.returncode == NOT_OURS_RC:  # another owner's folder at this path: not ours
                            d = ""
                        elif cp.returncode != 0:
                            raise LaunchError(f"node {node.rank} ({node_label(node)}): could not remove {d}: "
                                              + cp.stderr.decode("utf-8", "replace").strip()[-200:])
                    left, _ = session.procs(node, "list", run_id, str(node.rank), "", 0, owner)
                    return {**left, "folder": folder_left(session, node, os.path.dirname(d)) if d else None}, None

                for node, (left, err) in zip(cluster.nodes, session.each(one)):
                    _found_on(node, left, err, run_id, found)
        except (ConfigError, MissingDependency, LaunchError) as exc:
            for node in cluster.nodes:
                found.append(Leftover("unverified", node_label(node), detail=f"run {run_id}: {exc}"))
        for control_dir in sorted(control_dirs):
            found += close_local_ssh(cluster, control_dir, run_id, launcher_ssh="ssh", owner=owner)
    return found


RunKey = tuple[str, Optional[str], Optional[str], tuple[str, ...], str]  # run id, identity, known_hosts, options, python


def _by_run(rows: Sequence[JsonMapping]) -> dict[RunKey, list[JsonMapping]]:
    """The rows grouped by run and by how its hosts were reached."""
    groups: dict[RunKey, list[JsonMapping]] = {}
    for row in rows:
        d = row.get("detail") or {}
        key = (row["run_id"], d.get("identity"), d.get("known_hosts"), tuple(d.get("ssh_options") or ()),
               d.get("python") or "python3")
        groups.setdefault(key, []).append(row)
    return groups


def _recorded_cluster(group: Sequence[JsonMapping]) -> tuple[Cluster, dict[int, str], set[str]]:
    """(the run's nodes as a cluster, rank -> run folder, the local control folders) from its rows."""
    from gpucluster.domain import Cluster, Node

    nodes, dirs, control_dirs = [], {}, set()
    for row in group:
        d = row["detail"]
        nodes.append(Node(rank=int(d["rank"]), host=d["host"], private_ip=d["host"], user=d.get("user"),
                          port=int(d.get("port") or 22), host_keys=tuple(d.get("host_keys") or ())))
        if row.get("cloud_id"):
            dirs[int(d["rank"])] = row["cloud_id"]
        if d.get("control_dir"):
            control_dirs.add(d["control_dir"])
    return Cluster(name=str(group[0].get("cluster") or "ssh"), cloud="ssh", nodes=tuple(nodes)), dirs, control_dirs


def _found_on(node: Node, left: JsonObject | None, err: str | None, run_id: str, found: list[Leftover]) -> None:
    """What one node's cleanup left, added to `found`: the node unverified, its run folder, its processes."""
    from gpucluster.domain import Leftover

    if err is not None or left is None:
        found.append(Leftover("unverified", node_label(node), detail=f"run {run_id}: {err}"))
        return
    folder = left.pop("folder")
    if folder and folder not in {f.detail for f in found}:
        found.append(folder_leftover(node, folder))
    for pid, cmd in sorted(left.items(), key=lambda kv: int(kv[0])):
        found.append(Leftover("process", f"{node_label(node)}/pid {pid}", detail=cmd[:200]))


def close_local_ssh(cluster: Cluster, control_dir: str, run_id: str, *, launcher_ssh: str = "ssh",
                    owner: str | None = None) -> list[Leftover]:
    """Close the ControlMaster connections under `control_dir` (`ssh -O exit`), stop this machine's
    ssh clients that use it or carry the run id, delete the folder; what survived, as Leftovers.
    With `owner`: a control folder another owner marked is not ours (left alone, with its clients),
    and a client carrying another owner's GPUCLUSTER_OWNER is never stopped."""
    import psutil

    from gpucluster.domain import Leftover

    try:
        marked = open(os.path.join(control_dir, OWNER_FILE), encoding="utf-8").read().strip()
    except OSError:
        marked = ""
    if owner and marked and marked != owner:
        return []  # another home's live connections: not ours to close
    if os.path.isdir(control_dir):
        for node in cluster.nodes:
            dest = f"{node.user}@{node.host}" if node.user else node.host
            try:
                subprocess.run([launcher_ssh, "-o", f"ControlPath={control_dir}/%C", "-p", str(node.port),
                                "-O", "exit", "--", dest], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=10)
            except (subprocess.TimeoutExpired, OSError):
                pass
    marks = (f"ControlPath={control_dir}/", f"GPUCLUSTER_RUN_ID={run_id}")
    clients = []
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or ())
            foreign = owner and "GPUCLUSTER_OWNER=" in cmd and f"GPUCLUSTER_OWNER={owner}" not in cmd
            if p.info["name"] == os.path.basename(launcher_ssh) and any(m in cmd for m in marks) and not foreign:
                clients.append(p)
        except psutil.Error:
            continue
    from gpucluster.watch.procs import kill_processes

    survivors = kill_processes(clients, grace=2.0)
    shutil.rmtree(control_dir, ignore_errors=True)
    out = [Leftover("process", f"local pid {p.pid}", detail="ssh client of run " + run_id) for p in survivors]
    if os.path.exists(control_dir):
        out.append(Leftover("unverified", control_dir, detail="the run's ssh control folder could not be removed"))
    return out
