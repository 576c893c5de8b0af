"""The ssh launcher: torchrun on existing machines (and EC2 nodes) through the OpenSSH client.

`SshLauncher.launch(cluster, job, events, log_dir)`:

1. opens one multiplexed master connection per node (ControlMaster in a private temporary
   directory; BatchMode, StrictHostKeyChecking=yes against the given known_hosts file, or against
   the host keys pinned in `Node.host_keys` for cloud nodes);
2. checks every node (python3, torch importable, `setsid`/`tar` present, GPU count via
   `nvidia-smi` where the cluster expects GPUs) and names every node that is not ready;
3. ships the built-in workloads folder, and the user's script folder when the command runs a
   local script, into `~/.gpucluster/runs/<run_id>/node-<rank>/` on each node (a tar stream
   over ssh; one folder per node, so hosts sharing a home directory do not collide);
4. starts torchrun on every node under `setsid` (its own session and process group; the group
   id is written to `node-<rank>/pgid`) with the GPUCLUSTER_* environment, the head's private
   address as the rendezvous endpoint and the node's private address as `--local-addr`;
5. watches the local ssh clients with `NodeSupervisor` (logs, metrics, fail fast, deadline).
   Whenever the run ends (success, failure, time limit, Ctrl-C, exception) every reachable node
   gets its run's processes killed (the recorded process group and every process whose
   environment carries this run's id and the node's rank), SIGTERM then SIGKILL after a grace.
   Then the local ssh clients stop, the remote run folders go (logs are kept locally) and the
   master connections close.

Beside it: `session` (connections, per-node operations), `remote` (node programs), `ship`, `cleanup`.

Every remote command is a POSIX `sh -c` script built with `shlex.quote`; local commands are argv
lists. Secrets (the cluster's private key) go to 0600 files in the temporary directory, never
onto a command line or into a log.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from gpucluster.watch.control import give_keys, new_keys
from gpucluster.errors import ConfigError, LaunchError
from gpucluster.node.reaper import nested_grace
from gpucluster.events import Phase, RunEvents
from gpucluster.plan.jobenv import env_line, secret_values
from gpucluster.watch.launch import PG_HOOK_DIR, JobResult, JobSpec, Launcher, node_env, program_args, torchrun_argv
from gpucluster.watch.sequence import PortRetry, Runs, Transport, launch_sequence
from gpucluster.watch.supervisor import NODE_EXIT_SH, NodeSupervisor
from gpucluster.states import JsonObject
from gpucluster.watch.procs import piped

from gpucluster.watch.staging import GO_FILE, setup_wrapped, staged_env, staged_mounts

from gpucluster.watch.health import HealthCheckFailed

from .health import PhaseNoted, check_nodes, free_port, report_unreachable, ssh_lost, stop_local, watched
from .remote import PORT_PY, RESOLVE_PYTHON  # noqa: F401 - PORT_PY: part of this module's API (tests)
from .session import (HeldRun as _Held, NodeObjects, NodeReadiness, Session, folder_left, folder_leftover, node_label,
                      sh)
from .connect import NodeAccess  # gpucluster ssh: a shell, a command, port forwards, --ssh-config
from . import objects, rdzv
from .stage import CACHE_DIR, stage
from .ship import bundle as make_bundle, check_run_id, check_shippable, left_out_notes, user_program
from .workdir_copy import PROGRAM, copy_workdir, lay_back, push_workdirs

DEFAULT_REMOTE_DIR = "~/.gpucluster/runs"
_OPTION_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*=.+$")
_OWN_OPTIONS = {"stricthostkeychecking", "userknownhostsfile", "globalknownhostsfile", "batchmode",
                "controlmaster", "controlpath", "controlpersist", "updatehostkeys"}
SHIPPED = "shipped"  # the shipped list (ship.bundle), touched once the job's files are on a node (workdir.py)
# what gpucluster puts in a node's run folder, never taken for the job's own files (a run without code)
TOOL_FILES = ("workloads", "reaper.py", PROGRAM, "pgid", "cancelled", GO_FILE, SHIPPED, PG_HOOK_DIR)
RUN_RESOURCE = "ssh-run"  # ledger resource per node: connection details, run folder, control dir

if TYPE_CHECKING:
    from gpucluster.domain import Cluster, Leftover, Node
    from gpucluster.spec import ClusterSpec
    from gpucluster.watch.outputs import NodeOutputs




class SshLauncher(NodeAccess, Launcher):
    """Launcher over OpenSSH for clusters of reachable machines (`ssh` and `aws` backends).

    identity: private key file (`ssh -i`, IdentitiesOnly); default: the cluster's own key when it
        has one (cloud nodes), else the user's agent and default keys.
    known_hosts: file to check host keys against; default: the user's ~/.ssh/known_hosts (and the
        system one). Host keys pinned on the nodes (`Node.host_keys`) are always trusted for them.
    ssh_options: extra `Key=Value` OpenSSH options (e.g. "ProxyJump=bastion").
    remote_dir: where run folders go on the nodes ("~/" is the remote user's home).
    data_cache: the `--data` cache on the nodes (default ~/.cache/gpucluster/data).
    python: the Python on the nodes that has torch (a name on the remote PATH or a full path).
    objects: what the nodes run to pull `--data` URLs and push outputs to a `--output` URL with
        their own credentials (`infra/ssh/objects.py`; aws: `infra.aws.s3.NodeTransfer`); None
        where the nodes have no object storage of their own (ssh).
    """

    collects_outputs = checks_nodes = True

    def __init__(
        self,
        identity: str | None = None,
        known_hosts: str | None = None,
        ssh_options: Sequence[str] = (),
        *,
        remote_dir: str = DEFAULT_REMOTE_DIR,
        connect_timeout: int = 15,
        grace: float = 3.0,
        ssh: str = "ssh",
        python: str = "python3",
        ready_timeout: float = 600.0,
        diagnose: Callable[[Cluster, Node], str | None] | None = None,
        data_cache: str = CACHE_DIR,
        objects: NodeObjects | None = None,
        watcher: Sequence[str] = (),  # a node program beside each node's job, and its arguments (health.watched)
    ):
        self.identity = identity
        self.known_hosts = known_hosts
        self.ssh_options = tuple(ssh_options)
        for opt in self.ssh_options:
            if not _OPTION_RE.match(opt):
                raise ConfigError(f"ssh option {opt!r} is not allowed: use Key=Value, e.g. ProxyJump=bastion")
            if opt.split("=", 1)[0].lower() in _OWN_OPTIONS:
                raise ConfigError(f"ssh option {opt!r} is not allowed: host key checking, batch mode and "
                                  "connection sharing are set by gpucluster (give keys with --known-hosts)")
        self.remote_dir = remote_dir
        self.data_cache = data_cache  # --data: the content-addressed cache on every node (see stage.py)
        self.objects = objects  # --data/--output URLs: pulled and pushed by the nodes (see objects.py)
        self.watcher = tuple(watcher)
        self.connect_timeout = int(connect_timeout)
        self.grace = float(grace)
        self.ssh = ssh
        if not python or any(c.isspace() for c in python):
            raise ConfigError(f"remote python {python!r} is not allowed: a command name or path without spaces")
        self.python = python
        # Cloud nodes export a ready marker (`cluster.outputs["ready_file"]`): wait up to this long
        # for sshd to answer and the marker to say ok. `diagnose(cluster, node)` -> text that helps
        # when a node never gets ready (on EC2, the tail of GetConsoleOutput).
        self.ready_timeout = float(ready_timeout)
        self.diagnose = diagnose
        self._runs: Runs[_SshRun] = Runs()  # run id -> its nodes started and touched, what is held

    # -- public API --------------------------------------------------------------------------
    def launch(self, cluster: Cluster, job: JobSpec, events: RunEvents, log_dir: Path) -> JobResult:
        """The launch sequence (gpucluster.watch.sequence) over OpenSSH (`_SshTransport`). With
        `job.output_dir` set, the run folders and the connections outlive this call: they are held
        for `collect_outputs`, which copies every node's output folder back and then removes the
        run folders and closes the connections. Without it, both go before returning."""
        check_run_id(job.run_id)
        transport = _SshTransport(self, cluster, job, PhaseNoted(events), Path(log_dir))  # PhaseNoted: health.py
        return launch_sequence(transport, job, transport.events)

    def _run_of(self, run_id: str) -> _SshRun:
        """The run's record (made on first use)."""
        return self._runs.get(run_id) or self._runs.put(run_id, _SshRun())

    def _wait_ready_file(self, session: Session, cluster: Cluster, events: RunEvents) -> None:
        """Cloud nodes export a ready marker (`cluster.outputs["ready_file"]`): waited for."""
        ready_file = (cluster.outputs or {}).get("ready_file")
        if ready_file:
            session.wait_ready(str(ready_file), self.ready_timeout, events)

    def collect_outputs(self, job: JobSpec, events: RunEvents) -> list[NodeOutputs]:
        """Every node's output folder, streamed back over the run's own connections (`tar -cf -`
        on the node, unpacked here member by member: only regular files and folders, nothing
        outside `job.output_dir/node-N`), nodes in parallel; then the run folders are removed and
        the connections closed, whatever the copies did. [] when the job was started nowhere."""
        run = self._runs.get(job.run_id) or _SshRun()
        held = run.take()
        if held is None:
            return []
        results: list[NodeOutputs] = []
        cleaned: set[int] = set()
        try:
            dest = Path(job.output_dir or ".")
            started = run.started
            todo = {rank for rank in started if rank in held.out_dirs}  # where the job was started
            if job.output and job.output.remote:  # each node uploads its own folder (objects.py)
                results = objects.push(held.session, todo, held.out_dirs, str(job.output_dir), job.run_id)
                if held.cwds:  # and what the job wrote in its working folder, to URL/RUN_ID/workdir/node-N
                    push_workdirs(held, job, results, tool_files=TOOL_FILES, shipped=SHIPPED)
                return results
            copies = held.session.each(lambda n: (self._copy_node(held, job, n, dest) if n.rank in todo else None, None))
            for node, (res, err) in zip(held.session.nodes, copies):
                if node.rank not in todo:
                    continue
                if res is None:
                    from gpucluster.watch.outputs import FAILED, NodeOutputs

                    res = NodeOutputs(node.rank, str(dest / f"node-{node.rank}"), FAILED, detail=err)
                results.append(res)
            report_unreachable(held.session, held.events, [r.node_rank for r in results if r.verdict != "complete"],
                               Phase.OUTPUTS)
        finally:
            try:
                cleaned = held.session.remove_dirs(held.dirs, job.owner)
            finally:
                self._release(held.session, held.cluster, held.dirs, cleaned, held.events)
        return results

    def _copy_node(self, held: _Held, job: JobSpec, node: Node, dest: Path) -> NodeOutputs:
        """A node's output folder, then (a user's command) what the job wrote in its working folder."""
        from gpucluster.watch.outputs import add_workdir, workdir_args, workdir_dest

        res = held.session.copy_outputs(node, held.out_dirs[node.rank], dest / f"node-{node.rank}")
        cwd = held.cwds.get(node.rank)
        if cwd:
            d = held.dirs[node.rank]
            tool = () if cwd != d else TOOL_FILES
            args = workdir_args(job, cwd, f"{d}/{SHIPPED}", tool, held.out_dirs[node.rank])
            add_workdir(res, *copy_workdir(held.session, node, f"{d}/{PROGRAM}", args,
                                           workdir_dest(dest, node.rank)))
        return res

    def _out_dirs(self, job: JobSpec, dirs: dict[int, str], has_code: bool) -> dict[int, str]:
        """Each node's output folder: `outputs/` in the job's working folder on that node."""
        return {rank: f"{d}/code/outputs" if has_code else f"{d}/outputs" for rank, d in dirs.items()}

    @staticmethod
    def _release(session: Session, cluster: Cluster, dirs: dict[int, str], cleaned: set[int],
                 events: RunEvents) -> None:
        session.close()
        # the session is closed (master connections, temporary folder): what was cleaned is gone
        for node in cluster.nodes:
            if node.rank in cleaned or node.rank not in dirs:
                events.resource_deleted(RUN_RESOURCE, f"node-{node.rank}")

    def _record(self, session: Session, events: RunEvents) -> None:
        """One ledger resource per node: how to reach it and where the run's local ssh state lives."""
        for node in session.nodes:
            events.resource_requested(
                RUN_RESOURCE, f"node-{node.rank}", rank=node.rank, host=node.host, user=node.user,
                port=node.port, host_keys=list(node.host_keys or ()),
                identity=os.path.abspath(os.path.expanduser(self.identity)) if self.identity else None,
                known_hosts=os.path.abspath(os.path.expanduser(self.known_hosts)) if self.known_hosts else None,
                ssh_options=list(self.ssh_options), python=self.python, control_dir=session.tmp,
            )

    def ready_of(self, session: Session, cluster: Cluster) -> list[NodeReadiness]:
        """Each node asked (python, torch, home, GPUs); a LaunchError naming each one not ready."""
        return session.readiness(cluster.gpus_per_node, raise_on_problem=True)

    def probe(self, cluster: Cluster) -> list[NodeReadiness]:
        """Readiness of every node (reachable, python, torch, GPUs) without raising: for `status`."""
        with Session(self, cluster) as session:
            return session.readiness(cluster.gpus_per_node, raise_on_problem=False)

    def started_ranks(self, run_id: str) -> set[int]:
        """The node ranks where this launcher started the run's torchrun (in this process)."""
        run = self._runs.get(run_id)
        return set(run.started) if run is not None else set()

    def touched_ranks(self, run_id: str) -> set[int]:
        """The node ranks where this launcher may have left something of the run (in this process):
        each node given a run folder, where the health check, the staging and the job run. A node
        frozen during the check holds its check program and its folder: it is asked at teardown,
        and when it does not answer the verdict is "not verified", naming it (issue 45 item 1)."""
        run = self._runs.get(run_id)
        return (set(run.touched) if run is not None else set()) | self.started_ranks(run_id)

    def leftovers(self, cluster: Cluster, run_id: str | None, *, remove: bool = False) -> list[Leftover] | None:
        """`processes_left`; with `remove`, None: a killed run is reclaimed only on machines that exist
        (`HeldSshLauncher`), not on a cloud's kept nodes (`gpucluster down` removes those)."""
        return None if remove else self.processes_left(cluster, run_id)

    def processes_left(self, cluster: Cluster, run_id: str | None, *, ranks: set[int] | None = None,
                       owner: str | None = None) -> list[Leftover]:
        """The run's processes still alive on the nodes (only the nodes in `ranks`, and with `owner`
        only its own: by run id AND owner); an unreachable node is an "unverified" leftover."""
        from gpucluster.domain import Leftover

        if run_id is not None:
            check_run_id(run_id)
        if ranks is not None:
            cluster = dataclasses.replace(cluster, nodes=tuple(n for n in cluster.nodes if n.rank in ranks))
            if not cluster.nodes:
                return []
        found: list[Leftover] = []
        seen: set[tuple[str, int]] = set()

        folder = f"{self.remote_dir.rstrip('/')}/{run_id}" if run_id else None  # the run folder, removed as a whole
        with Session(self, cluster) as session:
            results = session.each(lambda n: ((session.procs(n, "list", run_id or "", "", "", 0, owner)[0],
                                               folder_left(session, n, folder) if folder else None), None))
            for node, (got, err) in zip(cluster.nodes, results):
                if err is not None or got is None:
                    found.append(Leftover("unverified", node_label(node), detail=f"could not check: {err}"))
                    continue
                out, left = got
                if left and left not in {f.detail for f in found}:  # hosts sharing a home: one folder
                    found.append(folder_leftover(node, left))
                for pid, cmd in sorted(out.items(), key=lambda kv: int(kv[0])):
                    if (node.host, int(pid)) not in seen:
                        seen.add((node.host, int(pid)))
                        found.append(Leftover("process", f"{node_label(node)}/pid {pid}", detail=cmd[:200]))
        return found

    # -- the run -----------------------------------------------------------------------------
    def node_argv(self, job: JobSpec, program: list[str] | None, node_dir: str, *, nnodes: int, node_rank: int,
                  rdzv_host: str, local_addr: str | None) -> list[str]:
        """The torchrun command one node runs (in `node_dir`, where the bundle was unpacked)."""
        prog = program if program is not None else program_args(job, workload_dir=f"{node_dir}/workloads")
        if program is None and job.workload == "mnist" and "--data-dir" not in job.workload_args:
            # MNIST (~11 MB) is downloaded on each node into its run folder (removed after)
            prog = [*prog, "--data-dir", f"{node_dir}/data/mnist", "--download"]
        return torchrun_argv(job, python=self.python, nnodes=nnodes, node_rank=node_rank,
                             rdzv_host=rdzv_host, local_addr=local_addr, program=prog)

    def preview_commands(self, job: JobSpec, private_ips: Sequence[str], gpus_per_node: int) -> list[str]:
        """`--dry-run`: the exact command line (environment included) each node would run, given
        the nodes' private IPs; `~` stands for the remote user's home."""
        code_dir, program = user_program(job, self.python)
        out = []
        for rank, ip in enumerate(private_ips):
            node_dir = f"{self.remote_dir.rstrip('/')}/{job.run_id}/node-{rank}"
            argv = self.node_argv(job, program, node_dir, nnodes=len(private_ips), node_rank=rank,
                                  rdzv_host=private_ips[0], local_addr=ip)
            argv = setup_wrapped(argv, job.setup, f"{node_dir}/{GO_FILE}")
            env = node_env(job, node_rank=rank, node_ips=list(private_ips), gpus_per_node=gpus_per_node,
                           output_dir=f"{node_dir}/code/outputs" if program is not None else f"{node_dir}/outputs")
            env.update(staged_env(job, self._data_dirs(job, node_dir, code_dir is not None)))
            env.update({name: "<secret: this machine's value, sent on stdin>" for name in job.secrets})
            out.append(" ".join(shlex.quote(f"{k}={v}") for k, v in env.items()) + " " + shlex.join(argv))
        return out

    def describe(self, spec: ClusterSpec, job: JobSpec) -> list[str]:
        ship = check_shippable(job, self.python, self.ssh)  # ssh on PATH, the script's folder not over the size limit
        up = [m.dest for m in staged_mounts(job) if m.dest.startswith("../")]
        if up and user_program(job, self.python)[0] is None:
            from gpucluster.errors import UsageError

            raise UsageError(f"--data DEST {up[0]!r} is not allowed here: '../' is beside the script's folder, and "
                             "this command ships no script (it runs a module or a program on the nodes)")
        lines = [f"{'resume' if m is job.resume else 'data'}: {m.src} -> {m.dest} on every node, " + (
                 "synced by each node with its own read-only credentials" if objects.is_url(m.src)
                 else "sending only what the node's cache lacks") for m in staged_mounts(job)]
        lines += [f"code: {ship.root} -> every node: {ship.summary()}", *left_out_notes(ship, job)] if ship else []
        if job.output and job.output.remote:
            lines.append(f"outputs: every node uploads its output folder to {job.output_dir}/{job.run_id}/node-N "
                         "with its own write-only credentials (nothing is copied back here)")
        return lines

    def _stage(self, session: Session, job: JobSpec, dests: dict[int, list[str]], events: RunEvents) -> None:
        """Local folders (--data, --resume) through the cache (stage.py), URLs pulled by the nodes
        (objects.py); one `stage` record per node with both (`fetched_bytes`: what the node read
        from object storage)."""
        mounts = staged_mounts(job)
        remote = [i for i, m in enumerate(mounts) if objects.is_url(m.src)]
        local = [i for i in range(len(mounts)) if i not in remote]
        recs: dict[int, JsonObject] = {r: {"kind": "stage", "files": 0, "bytes": 0, "sent_bytes": 0,
                                               "sent_files": 0, "seconds": 0.0} for r in dests}
        if local:
            for rank, rec in stage(session, job, {r: [d[i] for i in local] for r, d in dests.items()},
                                   events, emit=False, mounts=[mounts[i] for i in local]).items():
                recs[rank].update(rec)
        if remote:
            got = objects.pull(session, job, {r: [(mounts[i].src, d[i]) for i in remote] for r, d in dests.items()})
            for rank, rec in got.items():
                r = recs[rank]
                r.update(files=r["files"] + rec["files"], bytes=r["bytes"] + rec["bytes"], fetched_bytes=rec["bytes"],
                         seconds=round(r["seconds"] + rec["seconds"], 3), tool=rec["tool"])
        for rank in sorted(recs):
            events.on_metric(rank, recs[rank])

    @staticmethod
    def _data_dirs(job: JobSpec, node_dir: str, has_code: bool) -> list[str]:
        """Each --data (then --resume) folder's absolute path on a node (DEST under the job's working directory)."""
        return [f"{node_dir}/code/{m.dest}" if has_code else f"{node_dir}/{m.dest}" for m in staged_mounts(job)]

    def _base(self, home: str | None) -> str:
        base = self.remote_dir.rstrip("/")
        if base == "~" or base.startswith("~/"):
            if not home:
                raise LaunchError("could not learn the remote home directory")
            base = home.rstrip("/") + base[1:]
        if not base.startswith("/"):
            raise ConfigError(f"remote run directory {self.remote_dir!r} is not allowed: an absolute path or ~/...")
        return base

    def _free_rdzv_port(self, session: Session, cluster: Cluster, job: JobSpec, events: RunEvents) -> JobSpec:
        """The rendezvous port on the head, checked before torchrun starts: when another process
        holds it (a second run on the same hosts), a free port nearby is used and said; when
        none is free, LaunchError naming the port and its holder."""
        head = cluster.head
        alt, got = free_port(self, session, head, job.rdzv_port, what="rendezvous port")
        if alt == job.rdzv_port:
            return job
        who = got.get("holder") or "a process that is not listening (yet) or has just closed it"
        events.message(f"rendezvous port {job.rdzv_port} on node 0 ({node_label(head)}) is in use by {who}: using port {alt}")
        # recorded with the run's metrics (the ledger), where `show --json` finds it
        events.on_metric(0, {"kind": "rdzv_port", "port": alt, "busy_port": job.rdzv_port, "holder": who})
        return dataclasses.replace(job, rdzv_port=alt)

    def node_script(self, job: JobSpec, program: list[str] | None, cluster: Cluster, node: Node, node_dir: str,
                    has_code: bool, user_env: dict[str, str]) -> str:
        """The shell script node `node` runs (under `sh -c` over ssh): torchrun under the node
        supervisor, in the job's working folder, its environment but --env/--secret (on stdin)."""
        nodes = cluster.nodes
        argv = self.node_argv(job, program, node_dir, nnodes=len(nodes), node_rank=node.rank,
                              rdzv_host=cluster.head.private_ip, local_addr=node.private_ip)
        cwd = f"{node_dir}/code" if has_code else node_dir
        out = f"{cwd}/outputs"  # GPUCLUSTER_OUTPUT_DIR, copied back by collect_outputs
        env = node_env(job, node_rank=node.rank, node_ips=cluster.node_ips, gpus_per_node=cluster.gpus_per_node,
                       output_dir=out, pg_hook=f"{node_dir}/{PG_HOOK_DIR}")
        env.update(staged_env(job, self._data_dirs(job, node_dir, has_code)))
        env = {k: v for k, v in env.items() if k not in user_env}  # they come on stdin (below)
        env["GPUCLUSTER_PYTHON"] = self.python  # made absolute on the node by RESOLVE_PYTHON
        argv = setup_wrapped(argv, job.setup, f"{node_dir}/{GO_FILE}", keyed=True)
        # torchrun runs under the node supervisor (a child subreaper: it stops what the job leaves
        # behind, carries the run's env, and after a notice takes the grace the stop wrote).
        argv = [self.python, f"{node_dir}/reaper.py", "--grace", f"{nested_grace(self.grace):g}",
                "--grace-file", f"{node_dir}/stop-grace", "--keyed", *(["--env-stdin"] if user_env else []),
                "--", *argv]
        # The shell stays (no exec) to say when the reaper ended and how (a daemon that outlives a
        # killed reaper keeps the output open: the supervisor cuts it, bounded). It reads the node's
        # keys on stdin, keeps its own, gives the watcher its key, and pipes the rest (and the
        # environment line that follows, with --env/--secret) to the reaper.
        rest = "; cat" if user_env else ""
        pipe = f"{{ printf '%s\\n' \"$gk_rest\"{rest}; }} | {shlex.join(argv)}"
        inner = (f"IFS=' ' read -r gk_exit gk_notice gk_rest; echo $$ > {shlex.quote(node_dir + '/pgid')} && {RESOLVE_PYTHON}"
                 f"[ ! -e {shlex.quote(node_dir + '/cancelled')} ] && mkdir -p {shlex.quote(out)} && cd {shlex.quote(cwd)} && "
                 f"{watched(self.python, node_dir, self.watcher, pipe, key_var='gk_notice')}; {NODE_EXIT_SH}")
        return ("exec env " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
                + " setsid -w sh -c " + shlex.quote(inner))


@dataclasses.dataclass
class _SshRun:
    """What the launcher knows of a run after `launch`: the node ranks where torchrun was started,
    the node ranks given a run folder (from then on the launcher runs the run's programs there: the
    health check, staging, the job; the teardown check must ask each of them), and what
    `collect_outputs` copies from, then removes (None: nothing held)."""

    started: set[int] = dataclasses.field(default_factory=set)
    touched: set[int] = dataclasses.field(default_factory=set)
    held: _Held | None = None

    def take(self) -> _Held | None:
        """What is held, no longer held here (collect_outputs removes it)."""
        held, self.held = self.held, None
        return held


class _SshTransport(Transport):
    """The launch sequence's steps over OpenSSH: one multiplexed connection per node (`Session`),
    a run folder per node, torchrun under `setsid` and the node supervisor, watched through the
    local ssh clients."""

    ready_phase = checks_first = True

    def __init__(self, launcher: SshLauncher, cluster: Cluster, job: JobSpec, events: PhaseNoted,
                 log_dir: Path) -> None:
        self.launcher, self.cluster, self.events, self.log_dir = launcher, cluster, events, log_dir
        self.code_dir, self.program = user_program(job, launcher.python)
        self.has_code = self.code_dir is not None
        self.bundle = make_bundle(self.code_dir, launcher.watcher[:1])
        self.owner = job.owner
        self.run = launcher._run_of(job.run_id)
        self.session = Session(launcher, cluster)
        self.dirs: dict[int, str] = {}
        self.cleaned: set[int] = set()
        self.port_retry = PortRetry(node_label(cluster.head), "between its check and torchrun's bind",
                                    "between the check and torchrun's bind")
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.supervisor: NodeSupervisor | None = None
        self.job = job  # the job of the attempt under way

    def open(self) -> None:
        self.session.__enter__()
        self.session.mark_owner(self.owner)  # another home's `down` never closes these connections
        # how the hosts are reached goes to the ledger before the first connection (`down` after a crash)
        self.launcher._record(self.session, self.events)

    def wait_ready(self) -> None:
        launcher, session, job = self.launcher, self.session, self.job
        launcher._wait_ready_file(session, self.cluster, self.events)
        ready = launcher.ready_of(session, self.cluster)
        self.dirs = {r.rank: f"{launcher._base(r.home)}/{job.run_id}/node-{r.rank}" for r in ready}
        self.run.touched.update(self.dirs)
        for rank, d in self.dirs.items():
            self.events.resource_created(RUN_RESOURCE, f"node-{rank}", d)

    def ship(self, job: JobSpec) -> None:
        self.session.ship(self.bundle, self.dirs, make=self.launcher._out_dirs(job, self.dirs, self.has_code),
                          owner=job.owner)

    def check(self, job: JobSpec) -> None:
        check_nodes(self.launcher, self.session, self.cluster, job, self.events, self.dirs, self.log_dir)

    def lay_work(self, job: JobSpec) -> JobSpec:
        if job.command:  # what the job writes in its working folder later than this comes back
            session = self.session
            marks = [e for _, e in session.each(lambda n: session.touch(n, f"{self.dirs[n.rank]}/{SHIPPED}")) if e]
            if marks:
                raise LaunchError("; ".join(marks))
        return job

    def stages(self, job: JobSpec) -> bool:
        return bool(staged_mounts(job))

    def stage(self, job: JobSpec) -> None:
        """The --data/--resume folders, then the resumed files laid back."""
        dirs = self.dirs
        self.launcher._stage(self.session, job, {r: self.launcher._data_dirs(job, d, self.has_code)
                                                  for r, d in dirs.items()}, self.events)
        if job.resume_files and job.resume is not None and self.has_code:
            lay_back(self.session, job, job.resume_files[0], dirs, self.events)

    def rendezvous(self, job: JobSpec) -> JobSpec:
        return self.launcher._free_rdzv_port(self.session, self.cluster, job, self.events)

    def another_port(self, taken: int) -> int:
        return free_port(self.launcher, self.session, self.cluster.head, taken + rdzv.RETRY_STEP,
                         what="rendezvous port")[0]

    def again(self, job: JobSpec) -> JobSpec:
        """The nodes' `cancelled`, `pgid` and setup marks of the first try removed."""
        rdzv.clear_marks(self.session, self.dirs, ("cancelled", "pgid", GO_FILE))
        return job

    def start(self, job: JobSpec) -> None:
        launcher, session, cluster, dirs = self.launcher, self.session, self.cluster, self.dirs
        self.job, self.supervisor = job, None
        user_env = {**dict(job.env), **secret_values(job)}  # --env, --secret: on each node's stdin, never in argv
        keys = new_keys(n.rank for n in cluster.nodes)  # for the nodes' control records (gpucluster.watch.control)
        self.supervisor = NodeSupervisor(job, self.events, self.log_dir, [node_label(n) for n in cluster.nodes],
                                         reaper=True, keys=keys, grace=launcher.grace)
        self.procs = {}
        for node in cluster.nodes:
            node_dir = dirs[node.rank]
            script = launcher.node_script(job, self.program, cluster, node, node_dir, self.has_code, user_env)
            proc = subprocess.Popen(session.argv(node, sh(script), "-o", "ControlMaster=no", "-T"),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            self.procs[node.rank] = proc
            # the keys line, then (--env, --secret) one JSON line, then end of input
            give_keys(proc, keys[node.rank].shell_line(bool(job.setup)) + env_line(user_env))
            self.run.started.add(node.rank)
            # the ledger notes where the run's processes live
            self.events.on_spawn(node.rank, "process", f"{node_label(node)}:{node_dir}/pgid")
            self.supervisor.attach(node.rank, piped(proc.stdout))

    def stop(self) -> None:
        """After a node's interruption notice the ranks get the notice's time to save."""
        job = self.job
        if self.supervisor is None:  # nothing was started
            return
        self.session.kill_run(job.run_id, self.dirs, job.owner, grace=self.supervisor.stop_grace)
        stop_local(self.procs)

    def _release_nodes(self) -> None:
        """Every node's --setup succeeded: torchrun starts everywhere."""
        session = self.session
        errors = [err for _, err in session.each(lambda n: session.touch(n, f"{self.dirs[n.rank]}/{GO_FILE}")) if err]
        if errors:
            raise LaunchError("; ".join(errors))

    def watch(self, job: JobSpec) -> JobResult:
        if self.supervisor is None:
            raise ValueError("watch: nothing was started")
        return self.supervisor.run(self.procs, self.stop, release=self._release_nodes, lost=ssh_lost)

    def started(self, job: JobSpec) -> bool:
        return bool(self.run.started)

    def hold(self, job: JobSpec) -> None:
        dirs, has_code = self.dirs, self.has_code
        self.run.held = _Held(self.session, dirs, self.launcher._out_dirs(job, dirs, has_code), self.cluster,
                              self.events, {r: f"{d}/code" if has_code else d for r, d in dirs.items()}
                              if job.command else {})

    def clean(self, job: JobSpec) -> None:
        self.cleaned = self.session.remove_dirs(self.dirs, job.owner)

    def failed(self, exc: BaseException) -> None:
        """A node that stopped answering on the way is a lost node, not a failed job."""
        if isinstance(exc, LaunchError) and self.session.tmp and not isinstance(exc, HealthCheckFailed):
            report_unreachable(self.session, self.events, phase=self.events.phase)

    def release(self) -> None:
        self.launcher._release(self.session, self.cluster, self.dirs, self.cleaned, self.events)
