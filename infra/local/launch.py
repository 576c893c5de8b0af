"""The `local` launcher: one torchrun agent per "node", all on this machine, joined by a c10d
rendezvous on 127.0.0.1 under the run's unique id. gloo on CPU, nccl when CUDA GPUs are present
(node i then sees its own slice of the GPUs through CUDA_VISIBLE_DEVICES).

The rendezvous store lives in node 0's agent process beside its torchrun (`agent_boot`), which
keeps it until the launcher lets go: after every other agent has exited, on every path (see
`StoreHold`)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from gpucluster.watch.control import give_keys, new_keys
from gpucluster.errors import LaunchError
from gpucluster.events import RunEvents
from gpucluster.watch.launch import (JobResult, JobSpec, Launcher, agent_boot, lay_pg_hook, node_env, program_args,
                               resume_record, torchrun_argv)
from gpucluster.watch.nodeloss import killed_why
from gpucluster.watch.procs import terminate_groups
from gpucluster.watch.supervisor import NodeSupervisor
from gpucluster.watch.procs import kill_run_processes, piped, run_processes
from gpucluster.watch.sequence import PortRetry, Runs, Transport, launch_sequence
from gpucluster.watch.staging import GO_FILE, setup_wrapped, staged_env, staged_mounts
from gpucluster.infra.ssh.ship import left_out_notes, script_shipment, user_program
from gpucluster.states import JsonObject

if TYPE_CHECKING:
    from gpucluster.domain import Cluster, Node
    from gpucluster.spec import ClusterSpec
    from gpucluster.watch.outputs import NodeOutputs


def free_port() -> int:
    """A free TCP port for the rendezvous, picked below Linux's ephemeral range (32768-60999) so
    that no outgoing connection is handed it between this check and the head agent's bind."""
    import random

    for port in random.sample(range(20000, 32768), 50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StoreHold:
    """The launcher's hold on the rendezvous store that node 0's agent hosts (`agent_boot`): a pipe
    whose read end only that agent's process tree inherits (`read_fd`, passed to its reaper;
    every other child gets none: subprocess closes fds) and whose write end only this process
    holds. The agent keeps the store until its read returns: `release()` (once every other
    agent has exited, or the run is stopped), or this process dying, even by SIGKILL (the kernel
    closes the write end)."""

    def __init__(self) -> None:
        self.read_fd, self._write_fd = os.pipe()

    def started(self) -> None:
        """The agent's process has its copy of the read end: this process lets go of its own."""
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1

    def release(self) -> None:
        self.started()
        if self._write_fd >= 0:
            os.close(self._write_fd)
            self._write_fd = -1

    def release_when_alone(self, procs: dict[int, subprocess.Popen[bytes]]) -> None:
        """Release once every agent other than node 0's has exited (asked on every loop)."""
        if self._write_fd >= 0 and all(p.poll() is not None for rank, p in procs.items() if rank != 0):
            self.release()


def node_python(python: str | None) -> str:
    """The absolute path of the nodes' Python: `python` (a name on PATH or a path), by default the
    `python` (then `python3`) on this process's PATH; UsageError (exit 2) when it is not there."""
    from gpucluster.errors import UsageError

    if python is not None:
        found = shutil.which(os.path.expanduser(python))
        if not found:
            raise UsageError(f"--python {python!r} is not allowed: no such executable (give a Python with torch, "
                             "as a name on PATH or a path)")
        return os.path.abspath(found)
    found = shutil.which("python") or shutil.which("python3")
    return os.path.abspath(found) if found else sys.executable


def check_python(python: str, given: bool, job: JobSpec) -> None:
    """Before anything is created (issue 45 item 10): the nodes' Python runs, can find torch (torchrun
    and the ranks need it), and compiles the job's Python script. A Python without torch, or
    `--python /bin/false`, used to start every node and fail each in `rendezvous`; a script with a
    syntax error started on every node. UsageError (exit 2) naming the interpreter or the line."""
    from gpucluster.errors import UsageError

    prog = program_args(job) if job.command else []
    scripts = [prog[0]] if prog and prog[0] not in ("--no-python", "-m") and prog[0].endswith(".py") \
        and os.path.isfile(prog[0]) else []
    which = f"--python {python!r}" if given else f"the nodes' Python {python!r} (the first python on PATH; --python to choose)"
    try:
        cp = subprocess.run([python, str(Path(__file__).with_name("python_probe.py")), *scripts], capture_output=True,
                            text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        raise UsageError(f"{which} cannot be run: {exc}") from None
    if cp.returncode == 4:
        line, _, msg = cp.stdout.strip().partition("\t")
        raise UsageError(f"{scripts[0]}, line {line}: {msg} (a syntax error: fix the script; nothing was started)")
    if cp.returncode == 3:
        raise UsageError(f"{which} has no torch (torchrun and the ranks need it): install torch there "
                         "(pip install torch) or give a Python that has it")
    if cp.returncode != 0:
        last = (cp.stderr or cp.stdout).strip().splitlines()[-1:]
        raise UsageError(f"{which} is not a working Python (asked to run a small Python program it ended with exit "
                         f"code {cp.returncode}{': ' + last[0][:200] if last else ''}); give a Python with torch")


def python_env(python: str, path: str) -> dict[str, str]:
    """GPUCLUSTER_PYTHON for every rank and setup command, with its folder first on PATH."""
    folder = os.path.dirname(python)
    return {"GPUCLUSTER_PYTHON": python, "PATH": os.pathsep.join([folder, path]) if folder and path else folder or path}


def reaper_argv(python: str, grace: float, keyed: bool = False) -> list[str]:
    """`python reaper.py --grace G [--keyed] --`: the node supervisor's command line (`--keyed`: it
    reads the node's keys on its stdin, gpucluster.watch.control)."""
    from gpucluster.node import reaper

    return [python, reaper.__file__, "--grace", f"{reaper.nested_grace(grace):g}", *(["--keyed"] if keyed else []),
            "--"]


class LocalLauncher(Launcher):
    """Outputs: node N's GPUCLUSTER_OUTPUT_DIR is `job.output_dir/node-N` itself (this machine is
    every node), created before the agents start; nothing is copied, `collect_outputs` checks and
    counts what is there.

    Working folders: a user's script runs, on each node, in a copy of its folder of its own
    (`LOG_DIR/nodes/node-N/code`, as on an ssh node), so no two nodes write the same file; every
    --data and --resume DEST there is a link to its SRC (used in place). `collect_outputs` copies
    what each node's job wrote there to `job.output_dir/workdir/node-N` and removes the copies.
    """

    collects_outputs = True
    checks_nodes = True

    def __init__(self, python: str | None = None, cwd: str | None = None, grace: float = 3.0):
        # the nodes' Python (torchrun, the user's script, --setup): --python, else the user's active
        # environment; gpucluster's own helpers (store, supervisor, sampler) use its own interpreter
        self.python = node_python(python)
        self.own_python = sys.executable
        self.python_given = python is not None
        self.cwd = cwd
        self.grace = grace
        self._runs: Runs[_LocalHeld] = Runs()  # run id -> its output and node folders, for collect_outputs

    def collect_outputs(self, job: JobSpec, events: RunEvents) -> list[NodeOutputs]:
        from gpucluster.watch.outputs import COMPLETE, FAILED, PARTIAL, NodeOutputs, add_workdir, measure, workdir_dest

        if not job.output_dir:  # the lifecycle collects only a job that has an output folder
            return []
        results = []
        held = self._runs.take(job.run_id) or _LocalHeld()
        for rank, path in sorted(held.outputs.items()):
            start = time.monotonic()
            if not path.is_dir():
                results.append(NodeOutputs(rank, str(path), FAILED, detail=f"the output folder {path} is gone"))
                continue
            files, nbytes, problems = measure(path)
            verdict = COMPLETE if not problems else PARTIAL
            detail = None if not problems else "could not read " + "; ".join(problems[:5]) + (
                f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")
            results.append(NodeOutputs(rank, str(path), verdict, files, nbytes, time.monotonic() - start, detail))
        work = held.work
        try:
            for res in results:
                if res.node_rank in work:
                    add_workdir(res, *_copy_workdir(job, work[res.node_rank], workdir_dest(job.output_dir,
                                                                                            res.node_rank)))
        finally:
            _remove_work(work)
        return results

    def python_for(self, job: JobSpec) -> str:
        """The nodes' Python for `job`: a built-in workload is gpucluster's own code, so it runs on
        gpucluster's interpreter (which has gpucluster, and torch with the `local` extra) unless
        --python names one; a user's command runs on the nodes' Python (`self.python`)."""
        return self.python if job.command or self.python_given else self.own_python

    def describe(self, spec: ClusterSpec, job: JobSpec) -> list[str]:
        lines = [f"data: {m.src} (used in place: read it, do not write to it)" for m in job.data]
        python = self.python_for(job)
        ship = script_shipment(job, python)  # within the size limit, the script not ignored
        check_python(python, self.python_given, job)  # torch there, the script's syntax: before anything exists
        lines.append(f"python: {python}")
        if ship is not None:
            lines.append(f"working folder: a copy of {ship.root} per node ({ship.summary()}); what the job writes "
                         "there comes back to OUTPUTS/workdir/node-N")
            lines += left_out_notes(ship, job)
        return lines + ([f"resume: {job.resume.src} (used in place)"] if job.resume is not None else [])

    def launch(self, cluster: Cluster, job: JobSpec, events: RunEvents, log_dir: Path) -> JobResult:
        """The launch sequence (gpucluster.watch.sequence) through this machine's processes
        (`_LocalTransport`): the health check, the node folders, the processes under the node
        supervisor; on a free rendezvous port, once more on another when node 0's store could not
        bind it (EADDRINUSE: another process took it after it was found free; issue 46 item 6)."""
        return launch_sequence(_LocalTransport(self, cluster, job, events, Path(log_dir)), job, events)

    def _lay_work(self, cluster: Cluster, job: JobSpec, events: RunEvents,
                  log_dir: Path) -> tuple[list[str], dict[int, Path]]:
        """(the program each node runs, node rank -> run folder): a user's script's folder, copied
        per node (its resumed files laid back), the shipped script then run there; else the job's
        program as it is and no folders."""
        program = program_args(job)
        code_dir, shipped = user_program(job, self.python_for(job))
        if code_dir is None or shipped is None:  # (both or neither)
            return program, {}
        work = {n.rank: Path(log_dir) / "nodes" / f"node-{n.rank}" for n in cluster.nodes}
        held = self._held(job.run_id)
        held.work = work
        try:
            for rank, d in work.items():
                _lay_down(job, code_dir, d)
                if job.resume_files and job.resume is not None:  # --resume: the files as the script left them
                    events.on_metric(rank, _lay_back(job, os.path.join(job.resume.src, job.resume_files[0]), d))
        except BaseException:
            held.work = {}
            _remove_work(work)
            raise
        return shipped, work

    def _held(self, run_id: str) -> _LocalHeld:
        """The run's record (made on first use)."""
        return self._runs.get(run_id) or self._runs.put(run_id, _LocalHeld())


    def _check(self, cluster: Cluster, job: JobSpec, events: RunEvents, log_dir: Path) -> None:
        """Every node's health check at once: node_check.py with the nodes' Python, node i's GPUs
        only, gloo (or NCCL) over 127.0.0.1; HealthCheckFailed names each bad node."""
        from gpucluster.watch import health

        check = job.check
        if check is None:
            raise ValueError("_check: the job asks for no health check")
        store = f"127.0.0.1:{free_port()}"
        procs: dict[int, subprocess.Popen] = {}
        log_dir.mkdir(parents=True, exist_ok=True)

        def stop() -> None:
            started = list(procs.values())
            terminate_groups([p.pid for p in started], grace=self.grace, reap=lambda: [p.poll() for p in started])
            for p in started:
                p.wait()
                if p.stdout:
                    p.stdout.close()

        try:
            for node in cluster.nodes:
                disk = str(Path(job.output_dir) / f"node-{node.rank}") if job.output_dir else str(log_dir)
                argv = [self.python, str(health.PROGRAM), *health.program_args(
                    check, rank=node.rank, world=len(cluster.nodes), store=store, addr="127.0.0.1", disk=disk)]
                env = dict(os.environ, GPUCLUSTER_RUN_ID=job.run_id, GPUCLUSTER_NODE_RANK=str(node.rank),
                           CUDA_VISIBLE_DEVICES=_visible(cluster, node.rank), PYTHONUNBUFFERED="1")
                env.pop("GPUCLUSTER_OWNER", None)  # an outer run's mark is not this run's
                if job.owner:  # `down` after a kill finds the check programs by run id AND owner
                    env["GPUCLUSTER_OWNER"] = job.owner
                procs[node.rank] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                    stderr=subprocess.STDOUT, env=env, cwd=self.cwd,
                                                    start_new_session=True)
        except OSError as exc:
            stop()
            raise LaunchError(f"could not start the health check on local node {len(procs)}: {exc}") from None
        except BaseException:  # Ctrl-C included: what was started is stopped before it propagates
            stop()
            raise
        health.run(procs, {n.rank: f"local:{n.rank}" for n in cluster.nodes}, check, events, stop,
                   log_dir=log_dir, lost_why=lambda rank, code: killed_why(code))



class _LocalRun:
    """One launch's processes on this machine: torchrun under its node supervisor per node (and a
    sampler beside a user's script), started in node order, watched by the `NodeSupervisor`, and
    stopped and cleaned up on every path."""

    def __init__(self, launcher: LocalLauncher, cluster: Cluster, job: JobSpec, events: RunEvents, log_dir: Path,
                 program: list[str], work: dict[int, Path], secrets: dict[str, str]) -> None:
        self.launcher, self.cluster, self.job, self.events, self.log_dir = launcher, cluster, job, events, log_dir
        self.program, self.work, self.secrets = program, work, secrets
        self.python = launcher.python_for(job)
        # the run's folder: --setup's go file (made once every setup succeeded), a user command's process-group hook
        self.go_dir = tempfile.mkdtemp(prefix="gcrun-") if job.setup or job.command else None
        self.go_file = os.path.join(self.go_dir, GO_FILE) if self.go_dir and job.setup else ""
        self.pg_hook = self.go_dir and lay_pg_hook(self.go_dir)
        # the keys of the nodes' control records, given to each reaper on its stdin (gpucluster.watch.control)
        self.keys = new_keys(n.rank for n in cluster.nodes)
        self.supervisor = NodeSupervisor(job, events, log_dir, [f"local:{n.rank}" for n in cluster.nodes],
                                         reaper=True, keys=self.keys)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.samplers: list[subprocess.Popen[bytes]] = []
        self.hold = StoreHold()

    def stop(self) -> None:
        job, grace_s = self.job, self.launcher.grace
        started = list(self.procs.values()) + self.samplers
        # The run's whole process tree, listed before anything is stopped: processes that a
        # reaper adopted are no longer findable under it once it is gone.
        tree = run_processes(job.run_id, job.owner)
        self.hold.release()  # node 0's agent no longer waits for the others: it stops with them
        # a money guard's stop (guards.py) gives the ranks the notice's time to save a checkpoint
        grace = max(grace_s, self.supervisor.stop_grace or 0.0)
        terminate_groups([p.pid for p in started], grace=grace, reap=lambda: [p.poll() for p in started])
        # Workers live in sessions of their own: find them by the run id they inherited.
        kill_run_processes(job.run_id, grace=grace_s, also=tree, owner=job.owner)
        for p in list(self.procs.values()) + self.samplers:
            try:
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def make_outputs(self) -> None:
        """Each node's output folder (`job.output_dir/node-N`), before any agent starts."""
        if not self.job.output_dir:
            return
        outs = {n.rank: Path(self.job.output_dir) / f"node-{n.rank}" for n in self.cluster.nodes}
        self.launcher._held(self.job.run_id).outputs = outs
        for path in outs.values():
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                self.hold.release()
                raise LaunchError(f"could not create the output folder {path}: {exc.strerror}") from None

    def start_all(self) -> None:
        """Every node's processes; on a failure (Ctrl-C included) the sequence stops what was
        started (`_LocalTransport.stop`) before it propagates."""
        try:
            for node in self.cluster.nodes:
                self.start_node(node)
        except OSError as exc:
            raise LaunchError(f"could not start torchrun for local node {len(self.procs)}: {exc}") from None

    def abandon(self) -> None:
        """What was started stopped, the supervisor's threads closed (the start failed)."""
        self.stop()
        self.supervisor.close()

    def node_argv(self, node: Node) -> list[str]:
        """torchrun under the node supervisor: a child subreaper that stops whatever the job leaves
        behind, re-parented daemons included (see gpucluster/node/reaper.py)."""
        job = self.job
        # node 0's agent hosts the store and keeps it until `hold` lets go; no agent hosts
        # it through torchrun (is_host=false), so each only connects
        boot = agent_boot(("127.0.0.1", job.rdzv_port, self.hold.read_fd) if node.rank == 0 else None)
        argv = torchrun_argv(job, python=self.python, nnodes=len(self.cluster.nodes), node_rank=node.rank,
                             rdzv_host="127.0.0.1", local_addr="127.0.0.1", program=self.program,
                             store_on_head=False, boot=boot)
        return reaper_argv(self.launcher.own_python, self.launcher.grace, keyed=True) + setup_wrapped(
            argv, job.setup, self.go_file, keyed=True)

    def node_environ(self, node: Node) -> dict[str, str]:
        job, cluster = self.job, self.cluster
        env = dict(os.environ)
        env.pop("GPUCLUSTER_OWNER", None)  # an outer run's mark is not this run's
        out = str(Path(job.output_dir) / f"node-{node.rank}") if job.output_dir else None
        env.update(node_env(job, node_rank=node.rank, node_ips=cluster.node_ips,
                            gpus_per_node=cluster.gpus_per_node, output_dir=out, pg_hook=self.pg_hook))
        env.update(staged_env(job, [m.src for m in staged_mounts(job)]))  # local: the folders in place
        env.update(self.secrets)
        env.update(python_env(self.python, env.get("PATH", "")))
        env["CUDA_VISIBLE_DEVICES"] = _visible(cluster, node.rank)
        # torchrun's own log folder (else a /tmp/torchelastic_* per node, never removed: torch.distributed.
        # elastic.multiprocessing.api) beside the node logs, kept with them; not in RUN/nodes, which goes at
        # teardown and which the leftover check looks for. A PET_LOG_DIR of the user's own is kept.
        env.setdefault("PET_LOG_DIR", str(Path(self.log_dir) / "torchelastic" / f"node-{node.rank}"))
        return env

    def start_node(self, node: Node) -> None:
        job = self.job
        argv = self.node_argv(node)
        cwd = str(self.work[node.rank] / "code") if node.rank in self.work else self.launcher.cwd
        env = self.node_environ(node)
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True,
                                pass_fds=(self.hold.read_fd,) if node.rank == 0 else ())
        self.procs[node.rank] = proc
        if node.rank == 0:
            self.hold.started()
        give_keys(proc, self.keys[node.rank].reaper_line(bool(job.setup)))
        self.events.on_spawn(node.rank, "process", str(proc.pid))
        self.supervisor.attach(node.rank, piped(proc.stdout))
        if job.command:
            self.start_sampler(node, proc, env)

    def start_sampler(self, node: Node, proc: subprocess.Popen[bytes], env: dict[str, str]) -> None:
        """A user's script reports no utilisation: a sampler runs beside it on each node (built-in
        workloads sample themselves). It carries the run id in its environment, so stop() finds
        it; its exit code is not the node's."""
        from gpucluster.workloads.sampler import sampler_argv

        sampler = subprocess.Popen(sampler_argv(self.launcher.own_python, node.rank, run_id=self.job.run_id,
                                                root_pid=proc.pid),  # CPU: this node's tree only
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, env=env, cwd=self.launcher.cwd,
                                   start_new_session=True)
        self.samplers.append(sampler)
        self.supervisor.attach(node.rank, piped(sampler.stdout))

    def watch(self) -> None:
        self.hold.release_when_alone(self.procs)

    def release(self) -> None:
        if self.go_file:
            open(self.go_file, "x").close()

    def supervise(self) -> JobResult:
        """The node supervisor watches the processes until the job ends (it stops them)."""
        return self.supervisor.run(self.procs, self.stop, watch=self.watch, release=self.release,
                                   lost=lambda rank, code: killed_why(code))


@dataclass
class _LocalHeld:
    """What `collect_outputs` needs of a run: node rank -> output folder, node rank -> run folder
    (nodes/node-N)."""

    outputs: dict[int, Path] = field(default_factory=dict)
    work: dict[int, Path] = field(default_factory=dict)


class _LocalTransport(Transport):
    """The launch sequence's steps on this machine: every node a process tree of its own."""

    checks_first = True
    port_retry = PortRetry("local:0", "after it was found free", "after the check")

    def __init__(self, launcher: LocalLauncher, cluster: Cluster, job: JobSpec, events: RunEvents,
                 log_dir: Path) -> None:
        from gpucluster.plan.jobenv import secret_values

        self.launcher, self.cluster, self.events, self.log_dir = launcher, cluster, events, log_dir
        self.secrets = secret_values(job)  # --secret: into the processes' environment only (never argv or a file)
        self.program: list[str] = []
        self.work: dict[int, Path] = {}
        self.run: _LocalRun | None = None

    def check(self, job: JobSpec) -> None:
        self.launcher._check(self.cluster, job, self.events, self.log_dir)

    def lay_work(self, job: JobSpec) -> JobSpec:
        if job.threads_per_proc is None:
            nnodes = len(self.cluster.nodes)
            job = replace(job, threads_per_proc=max(1, (os.cpu_count() or 1) // (nnodes * job.nproc_per_node)))
        self.program, self.work = self.launcher._lay_work(self.cluster, job, self.events, self.log_dir)
        return job

    def rendezvous(self, job: JobSpec) -> JobSpec:
        return replace(job, rdzv_port=free_port())

    def another_port(self, taken: int) -> int:
        return free_port()

    def again(self, job: JobSpec) -> JobSpec:
        """The node folders laid down afresh (the first attempt's went, or were written to)."""
        return self.lay_work(replace(job, check=None))

    def start(self, job: JobSpec) -> None:
        self.run = _LocalRun(self.launcher, self.cluster, job, self.events, self.log_dir, self.program, self.work,
                             self.secrets)
        self.run.make_outputs()
        self.run.start_all()

    def stop(self) -> None:
        if self.run is not None:
            self.run.abandon()

    def watch(self, job: JobSpec) -> JobResult:
        if self.run is None:
            raise ValueError("watch: nothing was started")
        return self.run.supervise()

    def end_attempt(self, job: JobSpec) -> None:
        """The store, the run's folder and (nothing to collect) the node folders go."""
        run, self.run = self.run, None
        if run is not None:
            run.hold.release()
            _remove(run.go_dir)
        if not job.output_dir:  # nothing is collected: the node folders go now, and the run's record
            held = self.launcher._runs.take(job.run_id)
            if held is not None:
                _remove_work(held.work)


def _lay_back(job: JobSpec, saved: str, node_dir: Path) -> JsonObject:
    """--resume: the files as the script left them (`saved`), laid back into the node's `code/`;
    their record."""
    from gpucluster.node.workdir import lay_back

    try:
        files, nbytes = lay_back(saved, str(node_dir / "code"))
    except OSError as exc:
        raise LaunchError(f"could not lay the resumed files back into {node_dir / 'code'}: {exc}") from None
    return resume_record(job, files, nbytes)


def _visible(cluster: Cluster, rank: int) -> str:
    """CUDA_VISIBLE_DEVICES of local node `rank`: its own slice of this machine's GPUs ('' on CPU)."""
    first = rank * cluster.gpus_per_node
    return ",".join(str(first + i) for i in range(cluster.gpus_per_node))


SHIPPED = "shipped"  # the shipped list, written once a node's folder is laid down (gpucluster/node/workdir.py)


def _lay_down(job: JobSpec, code_dir: Path, node_dir: Path) -> None:
    """A node's run folder: `code/` a copy of what is shipped of the script's folder (as on ssh:
    `gpucluster.plan.shipping`, .gitignore and .gpuclusterignore honoured; links copied as links), each
    --data/--resume DEST a link to its SRC, then the `shipped` mark."""
    from gpucluster.errors import UsageError
    from gpucluster.plan.shipping import shipment

    ship = shipment(code_dir, exclude=[node_dir])  # e.g. GPUCLUSTER_HOME inside the script's folder
    try:
        ship.check_limit(what="copy for every node")
    except UsageError as exc:
        raise LaunchError(exc.message) from None
    code = node_dir / "code"
    try:
        if node_dir.exists():
            shutil.rmtree(node_dir)
        code.mkdir(parents=True)
        for entry in ship.entries:
            src, dst = code_dir / entry.rel, code / entry.rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if entry.link:
                dst.symlink_to(os.readlink(src))
            else:
                shutil.copy2(src, dst)
        for m in staged_mounts(job):
            link = Path(os.path.normpath(code / m.dest))
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists() and not link.is_symlink():
                link.symlink_to(os.path.abspath(m.src), target_is_directory=True)
        from gpucluster.node.workdir import shipped_list

        # the shipped list (size, content): what differs from it later is the job's, whatever its mtime
        (node_dir / SHIPPED).write_text(shipped_list(str(code), [e.rel for e in ship.entries if not e.link]))
    except OSError as exc:
        raise LaunchError(f"could not lay down the node folder {node_dir}: {exc}") from None


def _copy_workdir(job: JobSpec, node_dir: Path, dest: Path) -> tuple[int, int, list[str]]:
    """What the node's job wrote in its working folder, copied to `dest` (same choice as on ssh:
    `gpucluster/node/workdir.py`): (files, bytes, problems)."""
    from gpucluster.watch.outputs import make_dest, remove_if_empty, workdir_args, workdir_problems
    from gpucluster.node.workdir import DEFAULT_LIMIT, read_marker, select

    args = workdir_args(job, str(node_dir / "code"), str(node_dir / SHIPPED))
    skip = [args[i + 1] for i, a in enumerate(args) if a == "--exclude"]
    try:
        since, shipped = read_marker(str(node_dir / SHIPPED))
    except OSError as exc:
        return 0, 0, [f"the node folder {node_dir} is gone ({exc.strerror})"]
    limit = DEFAULT_LIMIT if job.collect_limit is None else job.collect_limit
    chosen, over, unreadable = select(str(node_dir / "code"), since, skip, list(job.collect), limit, shipped)
    files = nbytes = 0
    for rel, _size in chosen:
        target = dest / rel
        try:
            make_dest(target.parent)
            shutil.copyfile(node_dir / "code" / rel, target)
        except OSError as exc:
            unreadable.append(f"{rel}: {exc.strerror}")
            continue
        files += 1
        nbytes += target.stat().st_size
    remove_if_empty(dest)
    return files, nbytes, workdir_problems({"over": over, "unreadable": unreadable}, job.collect_limit)


def _remove_work(work: dict[int, Path]) -> None:
    """The node folders and the folder holding them (RUN/nodes), as a whole: what a --setup or the
    job wrote beside the node folders (`../../Datasets` from `code/`) is the run's too."""
    for d in work.values():
        shutil.rmtree(d, ignore_errors=True)
    for p in {d.parent for d in work.values()}:
        if p.name == "nodes":
            shutil.rmtree(p, ignore_errors=True)


def _remove(folder: str | None) -> None:
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
