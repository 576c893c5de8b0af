"""The `local` provider: N "nodes" on this machine. Nothing is created in any cloud; the node
processes themselves are started (and their absence verified) by `gpucluster.infra.local.launch.LocalLauncher`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpucluster.domain import Check, Cluster, Leftover, Node, Provider, ProvisionEvents

if TYPE_CHECKING:
    from gpucluster.spec import ClusterSpec

LOCALHOST = "127.0.0.1"


class LocalProvider(Provider):
    cloud = "local"
    # the leftover check scans every process on this machine for the run id: it sees all a run made
    check_is_complete = True

    def up(self, spec: ClusterSpec, events: ProvisionEvents) -> Cluster:
        from gpucluster.infra.local.catalog import gpus_present

        present = gpus_present()
        gpn = spec.gpus_per_node if spec.gpus_per_node is not None else (present // spec.nodes if present else 0)
        nodes = tuple(Node(rank=i, host=LOCALHOST, private_ip=LOCALHOST, gpus=gpn) for i in range(spec.nodes))
        return Cluster(name=spec.name, cloud="local", nodes=nodes, gpus_per_node=gpn)

    def down(self, name: str, events: ProvisionEvents) -> None:
        return None

    def leftovers(self, name: str, run_id: str | None = None) -> Check:
        if not run_id:
            return Check(unchecked=(f"processes of cluster {name!r}: no run id to look for",))
        import psutil

        from gpucluster.ownership import installation_id
        from gpucluster.watch.procs import run_processes

        out = []
        for p in run_processes(run_id, installation_id()):  # this home's: by run id AND owner
            try:
                cmd = " ".join(p.cmdline()[:4])
            except (psutil.Error, OSError):  # gone or not ours to read: the pid is still reported
                cmd = ""
            out.append(Leftover(kind="process", id=str(p.pid), detail=cmd))
        from gpucluster.home import home_dir

        nodes = home_dir(create=False) / "runs" / run_id / "nodes"  # the node folders' folder, removed as a whole (launch._remove_work)
        if nodes.exists() or nodes.is_symlink():
            held = sorted(p.name for p in nodes.iterdir())[:4] if nodes.is_dir() else []
            out.append(Leftover(kind="folder", id=str(nodes), detail=f"holds {', '.join(held) or 'nothing'}"))
        return Check(tuple(out))
