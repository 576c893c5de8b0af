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
   Whenever the run ends (success, failure, time limit, Ctrl-C, exception) every node that can
   still be reached gets its run's processes killed: the recorded process group and every
   process whose environment carries this run's id and the node's rank (torchrun starts its
   workers in sessions of their own), SIGTERM then SIGKILL after a grace period. Then the local
   ssh clients are stopped, the remote run folders removed (logs are kept locally) and the
   master connections closed.

`remote_leftovers(cluster, run_id)` is the teardown check: the processes on each node whose
environment still carries `GPUCLUSTER_RUN_ID=<run_id>`.

Every remote command is a POSIX `sh -c` script built with `shlex.quote`; local commands are argv
lists. Secrets (the cluster's private key) go to files of mode 0600 in the temporary directory,
never onto a command line or into a log.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from gpucluster.errors import ConfigError, LaunchError, MissingDependency
from gpucluster.reaper import nested_grace
from gpucluster.launch import (
    _PYTHON_RE, JobResult, JobSpec, LaunchEvents, NodeSupervisor, node_env, program_args, torchrun_argv,
)

DEFAULT_REMOTE_DIR = "~/.gpucluster/runs"
MAX_SHIP_BYTES = 200 * 1024 * 1024
_SKIP_DIRS = {".git", ".hg", ".svn", ".venv", "venv", "__pycache__", "node_modules", ".mypy_cache", ".pytest_cache"}
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_OPTION_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*=.+$")
_OWN_OPTIONS = {"stricthostkeychecking", "userknownhostsfile", "globalknownhostsfile", "batchmode",
                "controlmaster", "controlpath", "controlpersist", "updatehostkeys"}
_READY_MARK = "@gpucluster-ready "
RUN_RESOURCE = "ssh-run"  # ledger resource per node: connection details, run folder, control dir
_NO_PYTHON_RC = 97

# Run on each node by `python3 -` (the code comes on stdin): what the node has.
_READY_PY = r"""
import json, os, shutil, subprocess, sys
want_gpus = int(sys.argv[1])
info = {"python": sys.version.split()[0], "home": os.path.expanduser("~"),
        "setsid": bool(shutil.which("setsid")), "tar": bool(shutil.which("tar"))}
try:
    import torch
    info["torch"] = torch.__version__
except Exception as exc:
    info["torch_error"] = "%s: %s" % (type(exc).__name__, exc)
if want_gpus:
    smi = shutil.which("nvidia-smi")
    if not smi:
        info["gpu_error"] = "nvidia-smi not found on PATH (is the NVIDIA driver installed?)"
    else:
        try:
            r = subprocess.run([smi, "--query-gpu=name,utilization.gpu,memory.used,memory.total",
                                "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=60)
            if r.returncode == 0:
                info["gpus"] = [l.strip() for l in r.stdout.splitlines() if l.strip()]
            else:
                info["gpu_error"] = "nvidia-smi failed: " + (r.stderr or r.stdout).strip()[-300:]
        except Exception as exc:
            info["gpu_error"] = "nvidia-smi failed: %s" % exc
print("@gpucluster-ready " + json.dumps(info))
"""

# Run on each node by `python3 -`: list, or kill, the processes of a run on this node.
# argv: mode (list|kill) run_id node_rank|"" pgid_file|"" grace_seconds
_PROCS_PY = r"""
import json, os, signal, sys, time
mode, run_id, rank, pgid_file, grace = sys.argv[1:6]
want = [b"GPUCLUSTER_RUN_ID=" + run_id.encode()] if run_id else []
if rank:
    want.append(b"GPUCLUSTER_NODE_RANK=" + rank.encode())
me = os.getpid()
def matching():
    # the run's processes (by environment) and every descendant of those, whatever its
    # environment: a daemon that cleared it is adopted by the node's reaper (a subreaper)
    out, stat, kids = {}, {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open("/proc/%s/stat" % d, "rb") as f:
                rest = f.read().rsplit(b")", 1)[1].split()
            stat[int(d)] = rest[0]
            kids.setdefault(int(rest[1]), []).append(int(d))
            with open("/proc/%s/environ" % d, "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if want and all(w in env for w in want) or not want and any(e.startswith(b"GPUCLUSTER_RUN_ID=") for e in env):
            out[int(d)] = None
    todo = list(out)
    while todo:
        for k in kids.get(todo.pop(), ()):
            if k not in out and k != me:
                out[k] = None
                todo.append(k)
    found = {}
    for pid in out:
        if stat.get(pid) == b"Z":
            continue
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                found[pid] = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            continue
    return found
if mode == "list":
    print(json.dumps(matching()))
    sys.exit(0)
if pgid_file:
    # Mark the run cancelled BEFORE looking for its processes: a node command that starts after
    # the scan sees the mark and exits instead of starting torchrun (see the start script).
    try:
        open(os.path.join(os.path.dirname(pgid_file), "cancelled"), "w").close()
    except OSError:
        pass
own = os.getpgrp()
def groups():
    gs = set()
    for pid in matching():
        try:
            gs.add(os.getpgid(pid))
        except OSError:
            pass
    if pgid_file:
        try:
            with open(pgid_file) as f:
                g = int(f.read().split()[0])
            # only a group whose leader still carries this run's environment (pids get reused)
            with open("/proc/%d/environ" % g, "rb") as f:
                if all(w in f.read().split(b"\0") for w in want):
                    gs.add(g)
        except (OSError, ValueError, IndexError):
            pass
    gs.discard(own)
    return {g for g in gs if g > 1}
killed = set()
first = set(matching())  # listed before anything is signalled: orphans move once parents die
for sig, wait in ((signal.SIGTERM, float(grace)), (signal.SIGKILL, 2.0)):
    gs = groups()
    for g in gs:
        try:
            os.killpg(g, sig)
            killed.add(g)
        except OSError:
            pass
    for pid in set(matching()) | first:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    end = time.time() + wait
    while time.time() < end and matching():
        time.sleep(0.05)
    if not matching():
        break
print(json.dumps({"groups": sorted(killed), "left": matching()}))
"""


def node_label(node: Any) -> str:
    """`user@host[:port]` of a node, as people type it."""
    host = f"[{node.host}]" if ":" in node.host and node.port != 22 else node.host
    return f"{node.user + '@' if node.user else ''}{host}{'' if node.port == 22 else f':{node.port}'}"


def _known_hosts_name(node: Any) -> str:
    return node.host if node.port == 22 else f"[{node.host}]:{node.port}"


def sh(script: str) -> str:
    """A remote command that runs `script` with POSIX sh whatever the login shell is."""
    return "sh -c " + shlex.quote(script)


@dataclass
class NodeReadiness:
    rank: int
    label: str
    ok: bool
    problems: list[str] = field(default_factory=list)
    home: str | None = None
    python: str | None = None
    torch: str | None = None
    gpu_state: list[dict[str, Any]] = field(default_factory=list)  # name, util %, mem_used/total MiB

    @property
    def gpus(self) -> int:
        return len(self.gpu_state)

    @property
    def gpu_names(self) -> list[str]:
        return [g["name"] for g in self.gpu_state]


class SshLauncher:
    """Launcher over OpenSSH for clusters of reachable machines (`ssh` and `aws` backends).

    identity: private key file (`ssh -i`, IdentitiesOnly); default: the cluster's own key when it
        has one (cloud nodes), else the user's agent and default keys.
    known_hosts: file to check host keys against; default: the user's ~/.ssh/known_hosts (and the
        system one). Host keys pinned on the nodes (`Node.host_keys`) are always trusted for them.
    ssh_options: extra `Key=Value` OpenSSH options (e.g. "ProxyJump=bastion").
    remote_dir: where run folders go on the nodes ("~/" is the remote user's home).
    python: the Python on the nodes that has torch (a name on the remote PATH or a full path,
        e.g. /opt/conda/bin/python).
    """

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
        diagnose: Callable[[Any, Any], str | None] | None = None,
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
        self._started: dict[str, set[int]] = {}  # run id -> node ranks where torchrun was started

    # -- public API --------------------------------------------------------------------------
    def launch(self, cluster: Any, job: JobSpec, events: LaunchEvents, log_dir: Path) -> JobResult:
        _check_run_id(job.run_id)
        code_dir, program = _user_program(job, self.python)
        bundle = _bundle(code_dir)
        cleaned: set[int] = set()
        dirs: dict[int, str] = {}
        try:
            with _Session(self, cluster) as session:
                # Where the run reaches its hosts goes to the ledger before the first connection:
                # if this process dies, `gpucluster down` uses it to clean the hosts.
                self._record(session, events)
                events.on_phase("ready")
                ready_file = (getattr(cluster, "outputs", None) or {}).get("ready_file")
                if ready_file:
                    session.wait_ready(str(ready_file), self.ready_timeout, events)
                ready = session.readiness(cluster.gpus_per_node, raise_on_problem=True)
                dirs = {r.rank: f"{self._base(r.home)}/{job.run_id}/node-{r.rank}" for r in ready}
                for rank, d in dirs.items():
                    if hasattr(events, "resource_created"):
                        events.resource_created(RUN_RESOURCE, f"node-{rank}", d)
                try:
                    session.ship(bundle, dirs)
                    return self._run(session, cluster, job, events, Path(log_dir), dirs, code_dir is not None, program)
                finally:
                    cleaned = session.remove_dirs(dirs)
        finally:
            # the session is closed (master connections, temporary folder): what was cleaned is gone
            if hasattr(events, "resource_deleted"):
                for node in cluster.nodes:
                    if node.rank in cleaned or node.rank not in dirs:
                        events.resource_deleted(RUN_RESOURCE, f"node-{node.rank}")

    def _record(self, session: "_Session", events: Any) -> None:
        """One ledger resource per node: how to reach it and where the run's local ssh state lives."""
        if not hasattr(events, "resource_requested"):
            return
        for node in session.nodes:
            events.resource_requested(
                RUN_RESOURCE, f"node-{node.rank}", rank=node.rank, host=node.host, user=node.user,
                port=node.port, host_keys=list(node.host_keys or ()),
                identity=os.path.abspath(os.path.expanduser(self.identity)) if self.identity else None,
                known_hosts=os.path.abspath(os.path.expanduser(self.known_hosts)) if self.known_hosts else None,
                ssh_options=list(self.ssh_options), python=self.python, control_dir=session.tmp,
            )

    def probe(self, cluster: Any) -> list[NodeReadiness]:
        """Readiness of every node (reachable, python, torch, GPUs) without raising: for `status`."""
        with _Session(self, cluster) as session:
            return session.readiness(cluster.gpus_per_node, raise_on_problem=False)

    def started_ranks(self, run_id: str) -> set[int]:
        """The node ranks where this launcher started the run's processes (in this process)."""
        return set(self._started.get(run_id, ()))

    def leftovers(self, cluster: Any, run_id: str | None, *, ranks: set[int] | None = None) -> list:
        """The run's processes still alive on the nodes (only the nodes in `ranks` when given);
        an unreachable node is an "unverified" leftover."""
        from gpucluster.domain import Leftover

        if run_id is not None:
            _check_run_id(run_id)
        if ranks is not None:
            cluster = dataclasses.replace(cluster, nodes=tuple(n for n in cluster.nodes if n.rank in ranks))
            if not cluster.nodes:
                return []
        found: list = []
        seen: set[tuple[str, int]] = set()
        with _Session(self, cluster) as session:
            results = session.each(lambda n: session.procs(n, "list", run_id or "", "", "", 0))
            for node, (out, err) in zip(cluster.nodes, results):
                if err is not None:
                    found.append(Leftover("unverified", node_label(node), detail=f"could not check: {err}"))
                    continue
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
        _, program = _user_program(job, self.python)
        out = []
        for rank, ip in enumerate(private_ips):
            node_dir = f"{self.remote_dir.rstrip('/')}/{job.run_id}/node-{rank}"
            argv = self.node_argv(job, program, node_dir, nnodes=len(private_ips), node_rank=rank,
                                  rdzv_host=private_ips[0], local_addr=ip)
            env = node_env(job, node_rank=rank, node_ips=list(private_ips), gpus_per_node=gpus_per_node)
            out.append(" ".join(shlex.quote(f"{k}={v}") for k, v in env.items()) + " " + shlex.join(argv))
        return out

    def _base(self, home: str | None) -> str:
        base = self.remote_dir.rstrip("/")
        if base == "~" or base.startswith("~/"):
            if not home:
                raise LaunchError("could not learn the remote home directory")
            base = home.rstrip("/") + base[1:]
        if not base.startswith("/"):
            raise ConfigError(f"remote run directory {self.remote_dir!r} is not allowed: an absolute path or ~/...")
        return base

    def _run(self, session: "_Session", cluster: Any, job: JobSpec, events: LaunchEvents, log_dir: Path,
             dirs: dict[int, str], has_code: bool, program: list[str] | None) -> JobResult:
        nodes = cluster.nodes
        supervisor = NodeSupervisor(job, events, log_dir, [node_label(n) for n in nodes])
        procs: dict[int, subprocess.Popen] = {}

        def stop() -> None:
            session.kill_run(job.run_id, dirs)
            _stop_local(procs)

        try:
            for node in nodes:
                node_dir = dirs[node.rank]
                argv = self.node_argv(job, program, node_dir, nnodes=len(nodes), node_rank=node.rank,
                                      rdzv_host=cluster.head.private_ip, local_addr=node.private_ip)
                env = node_env(job, node_rank=node.rank, node_ips=cluster.node_ips, gpus_per_node=cluster.gpus_per_node)
                cwd = f"{node_dir}/code" if has_code else node_dir
                # torchrun runs under the node supervisor, a child subreaper that stops whatever
                # the job leaves behind (re-parented daemons included) and carries the run's env.
                argv = [self.python, f"{node_dir}/reaper.py", "--grace", f"{nested_grace(self.grace):g}",
                        "--", *argv]
                inner = (f"echo $$ > {shlex.quote(node_dir + '/pgid')} && "
                         f"[ ! -e {shlex.quote(node_dir + '/cancelled')} ] && cd {shlex.quote(cwd)} && "
                         f"exec {shlex.join(argv)}")
                script = ("exec env " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
                          + " setsid -w sh -c " + shlex.quote(inner))
                proc = subprocess.Popen(
                    session.argv(node, sh(script), "-o", "ControlMaster=no", "-T"), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, start_new_session=True,
                )
                procs[node.rank] = proc
                self._started.setdefault(job.run_id, set()).add(node.rank)
                if hasattr(events, "on_spawn"):  # the ledger notes where the run's processes live
                    events.on_spawn(node.rank, "process", f"{node_label(node)}:{node_dir}/pgid")
                supervisor.attach(node.rank, proc.stdout)
        except BaseException:
            stop()
            raise
        return supervisor.run(procs, stop)


def remote_leftovers(cluster: Any, run_id: str | None, *, identity: str | None = None,
                     known_hosts: str | None = None, ssh_options: Sequence[str] = ()) -> list:
    """Processes on the cluster's nodes whose environment carries GPUCLUSTER_RUN_ID=<run_id>
    (any run when None), as `Leftover(kind="process")`; unreachable nodes as kind "unverified".
    An empty list is the teardown guarantee for ssh nodes."""
    return SshLauncher(identity, known_hosts, ssh_options).leftovers(cluster, run_id)


def clean_recorded_hosts(rows: Sequence[dict[str, Any]], *, grace: float = 3.0) -> list:
    """`gpucluster down` of an ssh cluster whose run did not tear down (its process was killed).

    `rows`: the ledger's open `ssh-run` resources (one per node and run, written by `launch`
    before its first connection: host, user, port, identity, known_hosts, ssh options, remote
    Python, the local control folder; cloud_id = the node's run folder). For every run and node:
    connect, kill the run's processes by run id and node rank (and their descendants, SIGTERM then
    SIGKILL), remove the run folder, check again; then close the run's ControlMaster connections
    (`ssh -O exit`), stop this machine's ssh clients of the run and delete its control folder.

    Returns `Leftover`s: processes still found (kind "process"), and each host that could not be
    checked (kind "unverified", id `user@host[:port]`, detail = why). Empty: verified clean.
    """
    from gpucluster.domain import Cluster, Leftover, Node

    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        d = row.get("detail") or {}
        key = (row["run_id"], d.get("identity"), d.get("known_hosts"), tuple(d.get("ssh_options") or ()),
               d.get("python") or "python3")
        groups.setdefault(key, []).append(row)
    found: list = []
    for (run_id, identity, known_hosts, options, python), group in sorted(groups.items(), key=lambda kv: kv[0][0]):
        group.sort(key=lambda r: int((r.get("detail") or {}).get("rank", 0)))
        nodes, dirs, control_dirs = [], {}, set()
        for row in group:
            d = row["detail"]
            nodes.append(Node(rank=int(d["rank"]), host=d["host"], private_ip=d["host"], user=d.get("user"),
                              port=int(d.get("port") or 22), host_keys=tuple(d.get("host_keys") or ())))
            if row.get("cloud_id"):
                dirs[int(d["rank"])] = row["cloud_id"]
            if d.get("control_dir"):
                control_dirs.add(d["control_dir"])
        cluster = Cluster(name=str(group[0].get("cluster") or "ssh"), cloud="ssh", nodes=tuple(nodes))
        try:
            _check_run_id(run_id)
            launcher = SshLauncher(identity, known_hosts, options, python=python, grace=grace)
            with _Session(launcher, cluster) as session:
                def one(node: Any) -> tuple[dict[str, str], None]:
                    d = dirs.get(node.rank, "")
                    session.procs(node, "kill", run_id, str(node.rank), f"{d}/pgid" if d else "", grace)
                    if d:
                        cp = session.run(node, f"rm -rf {shlex.quote(d)} && "
                                               f"{{ rmdir {shlex.quote(os.path.dirname(d))} 2>/dev/null; true; }}")
                        if cp.returncode != 0:
                            raise LaunchError(f"node {node.rank} ({node_label(node)}): could not remove {d}: "
                                              + cp.stderr.decode("utf-8", "replace").strip()[-200:])
                    return session.procs(node, "list", run_id, str(node.rank), "", 0)

                for node, (left, err) in zip(cluster.nodes, session.each(one)):
                    if err is not None:
                        found.append(Leftover("unverified", node_label(node), detail=f"run {run_id}: {err}"))
                        continue
                    for pid, cmd in sorted(left.items(), key=lambda kv: int(kv[0])):
                        found.append(Leftover("process", f"{node_label(node)}/pid {pid}", detail=cmd[:200]))
        except (ConfigError, MissingDependency, LaunchError) as exc:
            for node in cluster.nodes:
                found.append(Leftover("unverified", node_label(node), detail=f"run {run_id}: {exc}"))
        for control_dir in sorted(control_dirs):
            found += _close_local_ssh(cluster, control_dir, run_id, launcher_ssh="ssh")
    return found


def _close_local_ssh(cluster: Any, control_dir: str, run_id: str, *, launcher_ssh: str = "ssh") -> list:
    """Close the ControlMaster connections under `control_dir` (`ssh -O exit`), stop this machine's
    ssh clients that use it or carry the run id, delete the folder; what survived, as Leftovers."""
    import psutil

    from gpucluster.domain import Leftover

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
            if p.info["name"] == os.path.basename(launcher_ssh) and any(m in cmd for m in marks):
                clients.append(p)
        except psutil.Error:
            continue
    from gpucluster.procs import kill_processes

    survivors = kill_processes(clients, grace=2.0)
    shutil.rmtree(control_dir, ignore_errors=True)
    out = [Leftover("process", f"local pid {p.pid}", detail="ssh client of run " + run_id) for p in survivors]
    if os.path.exists(control_dir):
        out.append(Leftover("unverified", control_dir, detail="the run's ssh control folder could not be removed"))
    return out


# -- the connection ---------------------------------------------------------------------------
class _Session:
    """Per-launch ssh state: a private temp dir (control sockets, known_hosts, key), masters."""

    def __init__(self, launcher: SshLauncher, cluster: Any):
        self.launcher = launcher
        self.cluster = cluster
        self.nodes = tuple(cluster.nodes)
        self.tmp = ""
        self.base_opts: list[str] = []
        self.known_hosts_files: list[str] = []

    def __enter__(self) -> "_Session":
        if not shutil.which(self.launcher.ssh):
            raise MissingDependency(f"the OpenSSH client {self.launcher.ssh!r} is not installed or not on PATH; "
                                    "install it (Debian/Ubuntu: apt-get install openssh-client)")
        self.tmp = tempfile.mkdtemp(prefix="gcssh-")  # short: control socket paths are limited
        try:
            self.base_opts = self._options()
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _options(self) -> list[str]:
        L = self.launcher
        opts = [
            "BatchMode=yes", "StrictHostKeyChecking=yes", "UpdateHostKeys=no", "CheckHostIP=no",
            f"ConnectTimeout={L.connect_timeout}", "ServerAliveInterval=5", "ServerAliveCountMax=3",
            f"ControlPath={self.tmp}/%C", "LogLevel=ERROR",
        ]
        pinned = [f"{_known_hosts_name(n)} {k.strip()}" for n in self.nodes for k in (n.host_keys or ())]
        files = []
        if pinned:
            path = os.path.join(self.tmp, "known_hosts")
            Path(path).write_text("\n".join(pinned) + "\n")
            files.append(path)
        if L.known_hosts:
            kh = os.path.abspath(os.path.expanduser(L.known_hosts))
            if not os.path.isfile(kh):
                raise ConfigError(f"known_hosts file {L.known_hosts!r} does not exist; "
                                  "give an OpenSSH known_hosts file with the nodes' host keys")
            files.append(kh)
        elif not pinned or not all(n.host_keys for n in self.nodes):
            files.append(os.path.expanduser("~/.ssh/known_hosts"))
        self.known_hosts_files = files
        opts.append("UserKnownHostsFile=" + " ".join(f'"{f}"' if " " in f else f for f in files))
        if pinned or L.known_hosts:
            opts.append("GlobalKnownHostsFile=/dev/null")
        identity = L.identity
        if identity:
            identity = os.path.abspath(os.path.expanduser(identity))
            if not os.path.isfile(identity):
                raise ConfigError(f"ssh identity file {L.identity!r} does not exist")
        elif getattr(self.cluster, "ssh_private_key", None):
            fd, identity = tempfile.mkstemp(dir=self.tmp, prefix="id-")
            with os.fdopen(fd, "w") as f:
                f.write(self.cluster.ssh_private_key.rstrip("\n") + "\n")
        if identity:
            opts += ["IdentitiesOnly=yes", f"IdentityFile={identity}"]
        out: list[str] = []
        for o in [*L.ssh_options, *opts]:  # the first value of an option wins: user options first
            out += ["-o", o]
        return out

    def argv(self, node: Any, remote: str | None, *extra: str) -> list[str]:
        dest = f"{node.user}@{node.host}" if node.user else node.host
        argv = [self.launcher.ssh, *self.base_opts, "-p", str(node.port), *extra, "--", dest]
        return argv + ([remote] if remote is not None else [])

    def each(self, fn: Callable[[Any], Any]) -> list[Any]:
        """fn(node) on every node in parallel; results in node order. Exceptions become (None, msg)."""
        def safe(node: Any) -> Any:
            try:
                return fn(node)
            except LaunchError as exc:
                return None, str(exc)
        with ThreadPoolExecutor(max_workers=min(16, len(self.nodes)) or 1) as pool:
            return list(pool.map(safe, self.nodes))

    def run(self, node: Any, script: str, *, stdin: bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run `sh -c script` on a node; LaunchError naming the node when ssh itself fails."""
        argv = self.argv(node, sh(script), "-o", "ControlMaster=no", "-T")
        try:
            cp = subprocess.run(argv, input=stdin if stdin is not None else b"", capture_output=True,
                                timeout=timeout + self.launcher.connect_timeout, start_new_session=True)
        except subprocess.TimeoutExpired:
            raise LaunchError(f"node {node.rank} ({node_label(node)}): no answer within "
                              f"{timeout + self.launcher.connect_timeout:g} s") from None
        if cp.returncode == 255:
            raise LaunchError(self.explain(node, cp.stderr.decode("utf-8", "replace")))
        return cp

    def explain(self, node: Any, stderr: str) -> str:
        """A one-line reason for an ssh connection failure, naming the node."""
        who = f"node {node.rank} ({node_label(node)})"
        low = stderr.lower()
        files = ", ".join(self.known_hosts_files)
        if ("host key verification failed" in low or "host key is known" in low
                or "remote host identification has changed" in low):
            kh = _known_hosts_name(node)
            return (f"{who}: host key refused: no matching key for {kh} in {files}; refusing to connect. "
                    f"Verify the host's key fingerprint and add it to the file "
                    f"(e.g. ssh-keyscan -p {node.port} {node.host} >> FILE after checking it)")
        if "permission denied" in low:
            return (f"{who}: ssh authentication failed for user {node.user or '(default)'} "
                    "(give the key with --identity, or load it into ssh-agent; passwords are not used)")
        last = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        return f"{who}: cannot connect over ssh: {last[-1] if last else 'ssh exited with code 255'}"

    def wait_ready(self, ready_file: str, timeout: float, events: Any, *,
                   first_delay: float = 1.0, max_delay: float = 15.0) -> None:
        """Until every node answers over ssh AND its ready marker (JSON written by user data after
        the driver/GPU/torch check) exists: retry each node with exponential backoff, progress on
        the status line. LaunchError naming each node that was not ready by `timeout` seconds,
        with what was last seen (and the launcher's `diagnose` text), or at once when a marker
        says ok=false."""
        progress = getattr(events, "progress", None) or (lambda text: None)
        start = time.monotonic()
        deadline = start + timeout
        last: dict[int, str] = {n.rank: "not tried yet" for n in self.nodes}
        done: dict[int, dict[str, Any]] = {}
        delay: dict[int, float] = {n.rank: first_delay for n in self.nodes}
        due: dict[int, float] = {n.rank: start for n in self.nodes}
        if not re.match(r"^/[A-Za-z0-9._/-]+$", ready_file):
            raise LaunchError(f"ready file {ready_file!r} from the stack outputs is not a plain absolute path")

        def poll(node: Any) -> tuple[Any, None]:
            try:
                # GPUCLUSTER_STATE_DIR: the same override the user-data scripts honour (tests)
                cp = self.run(node, 'f=${GPUCLUSTER_STATE_DIR:+$GPUCLUSTER_STATE_DIR/ready}; '
                                    f'cat "${{f:-{ready_file}}}" 2>/dev/null || exit 3', timeout=30)
            except LaunchError as exc:
                text = str(exc)
                last[node.rank] = text.split(": ", 1)[1] if text.startswith("node ") else text
                return None, None
            if cp.returncode == 3:
                last[node.rank] = f"sshd answers; {ready_file} not written yet (user data still running)"
                return None, None
            try:
                marker = json.loads(cp.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
            except (ValueError, IndexError):
                last[node.rank] = f"{ready_file} is unreadable"
                return None, None
            done[node.rank] = marker
            return None, None

        while True:
            now = time.monotonic()
            todo = [n for n in self.nodes if n.rank not in done and due[n.rank] <= now]
            if todo:
                with ThreadPoolExecutor(max_workers=min(16, len(todo))) as pool:
                    list(pool.map(poll, todo))
                now = time.monotonic()
                for n in todo:
                    if n.rank not in done:
                        due[n.rank] = now + delay[n.rank]
                        delay[n.rank] = min(max_delay, delay[n.rank] * 2)
            failed = {r: m for r, m in done.items() if not m.get("ok")}
            if failed:
                raise LaunchError("; ".join(
                    f"node {r} ({node_label(self.nodes[r])}) is not ready: its check says "
                    f"{m.get('gpus')} of {m.get('expected_gpus')} GPU(s), torch {m.get('torch') or 'missing'}"
                    + (f", error: {m['error']}" if m.get("error") else "")
                    for r, m in sorted(failed.items())))
            if len(done) == len(self.nodes):
                progress(f"all {len(done)} node(s) ready after {time.monotonic() - start:.0f} s")
                return
            waiting = [n for n in self.nodes if n.rank not in done]
            progress(f"waiting for nodes: {len(done)}/{len(self.nodes)} ready, {time.monotonic() - start:.0f} s; "
                     f"node {waiting[0].rank}: {last[waiting[0].rank]}")
            if time.monotonic() >= deadline:
                parts = []
                for n in waiting:
                    part = (f"node {n.rank} ({node_label(n)}, {getattr(n, 'instance_id', None) or 'no id'}) "
                            f"not ready after {timeout:g} s; last seen: {last[n.rank]}")
                    if self.launcher.diagnose is not None:
                        try:
                            extra = self.launcher.diagnose(self.cluster, n)
                        except Exception as exc:  # noqa: BLE001 - help text only
                            extra = f"(console output unavailable: {exc})"
                        if extra:
                            part += f"; {extra}"
                    parts.append(part)
                raise LaunchError("; ".join(parts))
            next_due = min(due[n.rank] for n in waiting)
            time.sleep(max(0.05, min(next_due, deadline) - time.monotonic()))

    def open_master(self, node: Any) -> None:
        argv = self.argv(node, None, "-o", "ControlMaster=yes", "-o", "ControlPersist=300", "-N", "-f")
        with tempfile.TemporaryFile() as err:
            try:
                rc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                    timeout=self.launcher.connect_timeout + 30, start_new_session=True).returncode
            except subprocess.TimeoutExpired:
                raise LaunchError(f"node {node.rank} ({node_label(node)}): ssh connection timed out") from None
            if rc != 0:
                err.seek(0)
                raise LaunchError(self.explain(node, err.read().decode("utf-8", "replace")))

    def readiness(self, gpus_expected: int, *, raise_on_problem: bool) -> list[NodeReadiness]:
        py = shlex.quote(self.launcher.python)
        check = f"command -v {py} >/dev/null 2>&1 || exit {_NO_PYTHON_RC}; exec {py} - {int(gpus_expected or 0)}"

        def one(node: Any) -> NodeReadiness:
            r = NodeReadiness(node.rank, node_label(node), ok=False)
            try:
                self.open_master(node)
                cp = self.run(node, check, stdin=_READY_PY.encode(), timeout=180)
            except LaunchError as exc:
                r.problems.append(str(exc).split(": ", 1)[1] if str(exc).startswith("node ") else str(exc))
                return r
            if cp.returncode == _NO_PYTHON_RC:
                r.problems.append(f"{self.launcher.python} not found on the remote PATH")
                return r
            lines = [ln for ln in cp.stdout.decode("utf-8", "replace").splitlines() if ln.startswith(_READY_MARK)]
            if not lines:
                tail = cp.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit code {cp.returncode}"]
                r.problems.append(f"readiness check failed: {tail[0]}")
                return r
            try:
                info = json.loads(lines[-1][len(_READY_MARK):])
            except ValueError:
                r.problems.append("readiness check printed an unreadable answer")
                return r
            r.home, r.python, r.torch = info.get("home"), info.get("python"), info.get("torch")
            r.gpu_state = [_gpu_row(line) for line in info.get("gpus") or []]
            if "torch_error" in info:
                r.problems.append(f"torch is not importable by {self.launcher.python} {r.python} ({info['torch_error']}); "
                                  "install it on the node, e.g. pip install torch")
            for tool in ("setsid", "tar"):
                if not info.get(tool):
                    r.problems.append(f"{tool} not found on the remote PATH")
            if gpus_expected:
                if "gpu_error" in info:
                    r.problems.append(info["gpu_error"])
                elif r.gpus < gpus_expected:
                    r.problems.append(f"{r.gpus} GPU(s) visible to nvidia-smi, expected {gpus_expected}")
            r.ok = not r.problems
            return r

        results = self.each(one)
        bad = [r for r in results if not r.ok]
        if bad and raise_on_problem:
            detail = "; ".join(f"node {r.rank} ({r.label}): {', '.join(r.problems)}" for r in bad)
            raise LaunchError(f"{len(bad)} of {len(results)} node(s) not ready: {detail}")
        return results

    def ship(self, bundle: bytes, dirs: dict[int, str]) -> None:
        def one(node: Any) -> tuple[Any, str | None]:
            d = shlex.quote(dirs[node.rank])
            cp = self.run(node, f"umask 077 && rm -rf {d} && mkdir -p {d} && tar -xf - -C {d}", stdin=bundle, timeout=300)
            if cp.returncode != 0:
                return None, (f"node {node.rank} ({node_label(node)}): copying the job files failed: "
                              + cp.stderr.decode("utf-8", "replace").strip()[-300:])
            return None, None

        errors = [err for _, err in self.each(one) if err]
        if errors:
            raise LaunchError("; ".join(errors))

    def procs(self, node: Any, mode: str, run_id: str, rank: str, pgid_file: str,
              grace: float) -> tuple[dict[str, str], None]:
        """({pid: command line}, None): the run's processes on the node ("list"), or those that
        survived SIGKILL ("kill"). LaunchError naming the node when it cannot be asked."""
        args = " ".join(shlex.quote(a) for a in (mode, run_id, rank, pgid_file, str(grace)))
        cp = self.run(node, f"exec {shlex.quote(self.launcher.python)} - {args}", stdin=_PROCS_PY.encode(), timeout=grace + 30)
        out = cp.stdout.decode("utf-8", "replace").strip().splitlines()
        if cp.returncode != 0 or not out:
            raise LaunchError(f"node {node.rank} ({node_label(node)}): process check failed: "
                              + (cp.stderr.decode("utf-8", "replace").strip()[-300:] or f"exit code {cp.returncode}"))
        try:
            data = json.loads(out[-1])
        except ValueError:
            raise LaunchError(f"node {node.rank} ({node_label(node)}): process check printed {out[-1][:200]!r}") from None
        return (data if mode == "list" else data.get("left", {})), None

    def kill_run(self, run_id: str, dirs: dict[int, str]) -> dict[int, str | None]:
        """Kill the run's processes on every reachable node; {rank: problem or None}."""
        results = self.each(lambda n: self.procs(n, "kill", run_id, str(n.rank), f"{dirs[n.rank]}/pgid",
                                                 self.launcher.grace))
        problems: dict[int, str | None] = {}
        for node, (left, err) in zip(self.nodes, results):
            problems[node.rank] = err or (f"{len(left)} process(es) survived SIGKILL" if left else None)
        return problems

    def remove_dirs(self, dirs: dict[int, str]) -> set[int]:
        """Remove the run folders; the ranks where that was done (or there was none)."""
        def one(node: Any) -> tuple[bool, None]:
            d = dirs.get(node.rank)
            if d:
                parent = shlex.quote(os.path.dirname(d))
                cp = self.run(node, f"rm -rf {shlex.quote(d)} && {{ rmdir {parent} 2>/dev/null; true; }}", timeout=60)
                return cp.returncode == 0, None
            return True, None

        return {n.rank for n, (ok, _err) in zip(self.nodes, self.each(one)) if ok}

    def close(self) -> None:
        """Close the master connections and delete the temporary directory (sockets, key)."""
        if not self.tmp:
            return
        for node in self.nodes:
            try:
                subprocess.run(self.argv(node, None, "-O", "exit"), stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)
            except (subprocess.TimeoutExpired, OSError):
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp = ""


def _gpu_row(line: str) -> dict[str, Any]:
    """One `nvidia-smi --query-gpu=name,utilization.gpu,memory.used,memory.total` csv row."""
    name, *rest = [f.strip() for f in line.rsplit(",", 3)] if line.count(",") >= 3 else [line.strip()]
    row: dict[str, Any] = {"name": name}
    for key, value in zip(("util", "mem_used_mib", "mem_total_mib"), rest):
        try:
            row[key] = float(value)
        except ValueError:
            row[key] = None  # "[N/A]" on some boards
    return row


def _stop_local(procs: dict[int, subprocess.Popen]) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            proc.terminate()
    end = time.monotonic() + 3
    for proc in procs.values():
        try:
            proc.wait(timeout=max(0.05, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- what is shipped --------------------------------------------------------------------------
def _check_run_id(run_id: str) -> None:
    if not _RUN_ID_RE.match(run_id or ""):
        raise LaunchError(f"run id {run_id!r} is not allowed: letters, digits, '.', '_' and '-' "
                          "(it names a folder on every node)")


# Python's options whose value is the next argument (`python -X faulthandler train.py`)
_PYTHON_VALUE_OPTIONS = frozenset({"-X", "-W", "--check-hash-based-pycs"})


def _user_program(job: JobSpec, python: str = "python3") -> tuple[Path | None, list[str] | None]:
    """(local folder to ship, torchrun program relative to it) when the command runs a local
    script (`python train.py`, `python -u train.py`, `./run.sh`, `bash run.sh`); (None, None)
    when it runs a module or something already on the nodes. A `python` that torchrun runs
    as a plain command becomes the nodes' Python."""
    if not job.command:
        return None, None
    prog = program_args(job)
    if prog[0] != "--no-python":
        path = Path(prog[0])
        if prog[0] == "-m" or not path.is_file():
            return None, None
        return path.resolve().parent, [path.name, *prog[1:]]
    cmd = prog[1:]
    is_python = bool(_PYTHON_RE.match(os.path.basename(cmd[0])))
    if is_python:
        cmd[0] = python
    script = None
    if not is_python and "/" in cmd[0] and Path(cmd[0]).is_file():
        script = 0
    else:
        takes_value = False
        for j, arg in enumerate(cmd[1:], start=1):
            if takes_value:  # the value of `-X opt` / `-W arg`, not the script
                takes_value = False
                continue
            if arg.startswith("-"):
                if arg in ("-m", "-c"):
                    break
                takes_value = is_python and arg in _PYTHON_VALUE_OPTIONS
                continue
            script = j if Path(arg).is_file() else None
            break
    if script is None:
        return None, ["--no-python", *cmd]
    path = Path(cmd[script])
    cmd[script] = "./" + path.name if script == 0 else path.name
    return path.resolve().parent, ["--no-python", *cmd]


def _bundle(code_dir: Path | None) -> bytes:
    """A tar of workloads/ (the built-in workload scripts) and code/ (the user's script folder)."""
    import gpucluster.workloads as workloads

    buf = io.BytesIO()
    total = 0
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for f in sorted(Path(workloads.__file__).parent.glob("*.py")):
            tar.add(f, arcname=f"workloads/{f.name}")
        from gpucluster import reaper

        tar.add(reaper.__file__, arcname="reaper.py")  # the node supervisor (stdlib only)
        # digits' data (~60 KB) goes with the scripts, so a node needs only torch
        from gpucluster.workloads.digits_data import local_digits_file

        digits = local_digits_file()
        if digits:
            tar.add(digits, arcname="workloads/data/digits.csv.gz")
        if code_dir is not None:
            for root, dirnames, filenames in os.walk(code_dir):
                dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
                for name in sorted(filenames):
                    path = Path(root, name)
                    if path.suffix == ".pyc":
                        continue
                    total += path.lstat().st_size
                    if total > MAX_SHIP_BYTES:
                        raise LaunchError(
                            f"the script's folder {str(code_dir)!r} holds more than {MAX_SHIP_BYTES >> 20} MB to "
                            "copy to every node; put the script in a folder of its own (data belongs on the nodes "
                            "or in object storage)")
                    tar.add(path, arcname=f"code/{path.relative_to(code_dir).as_posix()}", recursive=False)
    return buf.getvalue()
