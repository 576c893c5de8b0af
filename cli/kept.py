"""`gpucluster exec` (the next job on a kept cluster) and `gpucluster ssh` (a shell, a command or a
tunnel to one of its nodes; `--ssh-config` host aliases)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from gpucluster.cli import common
from gpucluster.cli.complete import complete_cluster
from gpucluster.cli.options import options
from gpucluster.cli.taskopts import TaskCommand
from gpucluster.errors import UsageError, not_allowed

if TYPE_CHECKING:
    from gpucluster.domain import Cluster
    from gpucluster.watch.launch import Forward

JOB_OPTIONS = ("task_file", "workload", "epochs", "workload_args", "procs_per_node", "threads_per_proc", "max_restarts",
               "max_minutes", "max_cost", "stall_minutes", "data", "setup", "output", "collect", "collect_limit", "remote_python", "env",
               "env_file", "secret", "quiet", "as_json", "check")


class ExecCommand(TaskCommand):
    """`exec` takes a task file as `run` does (`exec CLUSTER task.yaml`, or `-f`): its job keys apply;
    its cluster keys (resources, name, limits of the nodes) are the kept cluster's and are not used."""

    @staticmethod
    def known_cloud(ctx: click.Context, opts: dict[str, object]) -> str | None:
        """The kept cluster's cloud, from the ledger (the task file's cloud-only keys are checked
        against it); None when the ledger does not know the name (the command itself says so)."""
        name = opts.get("cluster")
        if ctx.resilient_parsing or not isinstance(name, str):
            return None
        from gpucluster.ledger.store import Ledger

        runs = [r for r in Ledger.open_default().list_runs(limit=None) if r.cluster == name]
        return str(runs[0].cloud) if runs else None


@click.command("exec", cls=ExecCommand)
@click.argument("cluster", shell_complete=complete_cluster)
@options(*JOB_OPTIONS, as_json=dict(help="Print the run record as JSON at the end (logs go to stderr)."))
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def exec_(cluster: str, command: tuple[str, ...], quiet: bool, as_json: bool, **flags: Any) -> int:
    """Run a new job on a kept cluster (`up`, `run --keep`): its own run, no teardown.

    The job is recorded as a run of its own on the cluster; --data goes through the nodes' cache
    (what they hold already is not sent again); outputs come back as with `run`; the cluster stays
    up (and keeps billing) until `gpucluster down CLUSTER`.

    \b
    Examples:
      gpucluster exec demo -- python train.py --epochs 3
      gpucluster exec demo --workload digits --epochs 2 --data ./data
      gpucluster exec demo task.yaml --env LR=0.1 --secret HF_TOKEN   (a task file: its job keys)
    """
    from gpucluster.api.clusters import plan_exec, run_exec
    from gpucluster.cli.run import report
    from gpucluster.lifecycle.kept import node_count
    from gpucluster.lifecycle.prepare import open_ledger

    ledger = open_ledger()
    planned = plan_exec(cluster, dict(flags, command=command), ledger)  # the one path: Cluster.exec's (api/clusters.py)
    kept, plan, cluster_ = planned.kept, planned.plan, planned.attached
    fits, reclaimed = planned.fits, planned.reclaimed
    out = common.console(stderr=as_json)
    if reclaimed:
        out.print(f"note: {reclaimed}", highlight=False)
    job = plan.needs_job()
    count = node_count(cluster_)  # GKE: the pool's size (its nodes are not listed one by one)
    out.print(f"[bold]plan[/bold]: exec on kept cluster {kept.name} ({count} node(s) on {kept.cloud}, "
              f"created by run {kept.origin.id}), run {job.run_id}: {job.display}", highlight=False)
    for line in [*plan.notes, *([fits] if fits else [])]:
        out.print(f"  note: {line}", highlight=False)
    for line in plan.described:
        out.print(f"  {line}", highlight=False)
    from gpucluster.cli.render import RichRunUI

    with RichRunUI(out, quiet=quiet, epochs=flags["epochs"]) as ui:
        outcome, forced, said = run_exec(planned, ledger=ledger, ui=ui)
    report(out, ledger.get_run(outcome.run_id), as_json)
    if said:
        click.echo(f"gpucluster: {said}", err=True)
    from gpucluster.lifecycle.held import kept_said
    from gpucluster.infra.registry import provisioning

    out.print(f"the nodes bill to cluster {kept.name} (run {kept.origin.id}) until `gpucluster down {kept.name}`"
              if kept.cloud in provisioning() else f"cluster {kept.name} stays kept "
              f"({kept_said(planned.backend, planned.plan.spec, cluster_)[0]}) until `gpucluster down {kept.name}`",
              highlight=False)
    if outcome.record_error:
        from gpucluster.ledger.recording import record_line

        click.echo(f"gpucluster: error: {record_line(outcome.record_error, kept.name)}", err=True)
    code = int(forced if forced is not None and int(forced) > int(outcome.exit_code) else outcome.exit_code)
    return common.ledger_kept_true(ledger, code, "exec", "the job's outputs and report above are all that is left of it")


@click.command("ssh")
@click.argument("target", nargs=-1, type=click.UNPROCESSED, shell_complete=complete_cluster)
@click.option("-L", "forwards", multiple=True, metavar="LOCAL:HOST:REMOTE",
              help="Forward this machine's 127.0.0.1:LOCAL to HOST:REMOTE as the node sees it (repeatable), "
                   "e.g. -L 6006:localhost:6006 for TensorBoard. Without a command: the tunnel only.")
@options("identity")
@click.option("--ssh-config", "ssh_config", is_flag=True,
              help="Write OpenSSH host aliases (CLUSTER-N, CLUSTER for the head) with the pinned host keys, and "
                   "print the Include line for ~/.ssh/config; `gpucluster down` removes them.")
def ssh(target: tuple[str, ...], forwards: tuple[str, ...], identity: str | None, ssh_config: bool) -> int:
    """Open a shell, run a command or forward ports on a node of a kept cluster.

    CLUSTER [NODE] [-- COMMAND...]: NODE is the node's rank (default 0, the head). aws: over ssh,
    trusting only the host keys the cluster's outputs pinned, with the cluster's own key. gcp:
    through the Kubernetes API (exec, portforward) into node NODE's pod of the job running on the
    cluster (between jobs a GKE cluster has no pod of ours: start one with `exec`).

    \b
    Examples:
      gpucluster ssh demo
      gpucluster ssh demo 1 -- nvidia-smi
      gpucluster ssh demo -L 6006:localhost:6006
      gpucluster ssh demo --ssh-config              (aws)
      gpucluster ssh gke-demo 1 -- nvidia-smi       (gcp: while a job runs on it)
    """
    from gpucluster.lifecycle.held import holding, reach_of
    from gpucluster.infra.contract import LaunchOptions
    from gpucluster.infra.registry import plugin
    from gpucluster.lifecycle.kept import access_dir, attach, find, node_count
    from gpucluster.lifecycle.prepare import check_ssh_files
    from gpucluster.spec import ClusterSpec, normalize

    name, rank, rest = _target(target)
    tunnels = _tunnels(forwards, ssh_config, rest)
    check_ssh_files(identity, None)
    ledger = common.ledger()
    kept = find(ledger, name, in_use_ok=True)
    # gcp: the launcher's namespace and kind, as the cluster's runs had them (read as `prepare` reads them)
    spec = normalize(ClusterSpec.from_dict(kept.spec), plugin(kept.cloud))
    reach = reach_of(ledger, kept)  # machines that exist (`up --cloud ssh`): the key and known hosts `up` was given
    provider, launcher = plugin(kept.cloud).transport.make(LaunchOptions(
        identity=identity or reach.get("identity"), known_hosts=reach.get("known_hosts"),
        remote_python=reach.get("remote_python"), spec_options=spec.option_dict))
    cluster = attach(provider, kept, spec) if holding(kept, ledger) else attach(common.provider_for(kept.cloud), kept)
    nodes = node_count(cluster)
    if not 0 <= rank < nodes:
        raise UsageError(not_allowed("node", rank, f"0 to {nodes - 1} (cluster {name} has {nodes} node(s))"))
    if ssh_config:
        _print_ssh_config(launcher.ssh_config(cluster, access_dir(name, create=True)), name, cluster)
        return 0

    def opening() -> None:  # after the launcher's own refusals, before it opens anything
        for f in tunnels:  # a taken port is refused here, before anything is opened (and by the backend again)
            check_free(f)
        for f in tunnels:
            click.echo(f"forwarding 127.0.0.1:{f.local} -> {f.host}:{f.remote} on node {rank} of {name}"
                       + ("" if rest else "; Ctrl-C closes it"), err=True)

    return launcher.connect(cluster, rank, rest, tunnels, opening)


def _target(target: tuple[str, ...]) -> tuple[str, int, list[str]]:
    """CLUSTER [NODE] [-- COMMAND...] -> (cluster, node rank, command)."""
    if not target:
        raise UsageError("name a cluster: gpucluster ssh CLUSTER [NODE] [-- COMMAND]")
    name, rest = target[0], list(target[1:])
    rank = 0
    if rest and rest[0].isascii() and rest[0].isdigit():
        rank = int(rest.pop(0))
    if rest and rest[0] == "--":
        rest.pop(0)
    return name, rank, rest


def _tunnels(forwards: tuple[str, ...], ssh_config: bool, rest: list[str]) -> list[Forward]:
    """-L LOCAL:HOST:REMOTE, each LOCAL port once; none (nor a command) with --ssh-config."""
    from gpucluster.watch.launch import Forward

    tunnels = [Forward.parse(f) for f in forwards]  # checked before anything is read
    twice = sorted({f.local for f in tunnels if [t.local for t in tunnels].count(f.local) > 1})
    if twice:
        raise UsageError(f"-L: local port {twice[0]} is given twice; each -L needs a LOCAL port of its own")
    if ssh_config and (tunnels or rest):
        raise UsageError("--ssh-config writes host aliases; give -L or a command without it")
    return tunnels


def _print_ssh_config(lines: list[str], name: str, cluster: Cluster) -> None:
    """--ssh-config: the aliases written, and the Include line for ~/.ssh/config."""
    click.echo(f"host aliases for cluster {name}: "
               + ", ".join(f"{name}-{n.rank}" for n in cluster.nodes) + f" ({name} is node 0)")
    click.echo("add this line at the top of ~/.ssh/config (once):")
    for line in lines:
        click.echo(f"  {line}")


def check_free(forward: Forward) -> None:
    """-L LOCAL: 127.0.0.1:LOCAL can be listened on here (UsageError naming it otherwise)."""
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", forward.local))
        except OSError as exc:
            raise UsageError(f"-L {forward}: 127.0.0.1:{forward.local} cannot be used on this machine "
                             f"({exc.strerror}); choose another LOCAL port") from None
