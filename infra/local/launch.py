"""The `local` launcher: one torchrun agent per "node", all on this machine, joined by a c10d
rendezvous on 127.0.0.1 under the run's unique id. gloo on CPU, nccl when CUDA GPUs are present
(node i then sees its own slice of the GPUs through CUDA_VISIBLE_DEVICES).

The rendezvous store runs in a process of the launcher's own (`gpucluster.rdzv_store`), started
before the agents and stopped after the last of them has exited, on every path."""

from __future__ import annotations

import collections
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

from gpucluster.errors import LaunchError
from gpucluster.events import RunEvents
from gpucluster.launch import JobResult, JobSpec, Launcher, node_env, program_args, torchrun_argv
from gpucluster.supervisor import NodeSupervisor, terminate_groups
from gpucluster.procs import kill_run_processes, run_processes
from gpucluster.staging import GO_FILE, setup_wrapped, staged_env, staged_mounts


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


class RendezvousStore:
    """`python -m gpucluster.rdzv_store HOST PORT` run for one run; see gpucluster.rdzv_store.

    It carries the run id in its environment (so the leftover check finds it like any process of
    the run), and its stdin is a pipe that only gpucluster holds open: if gpucluster dies, even
    by SIGKILL, the store reads EOF and exits by itself."""

    READY_TIMEOUT = 120.0

    def __init__(self, python: str, host: str, port: int, env: dict[str, str], cwd: str | None):
        self.address = f"{host}:{port}"
        self.proc = subprocess.Popen([python, "-m", "gpucluster.rdzv_store", host, str(port)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=env, cwd=cwd, start_new_session=True)
        self.started = time.monotonic()
        self.ready = threading.Event()
        self.lines: collections.deque[str] = collections.deque(maxlen=20)
        threading.Thread(target=self._read, name="rdzv-store-out", daemon=True).start()

    def _read(self) -> None:
        try:
            for raw in self.proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip()
                if line.startswith("ready "):
                    self.ready.set()
                elif line:
                    self.lines.append(line)
        except (OSError, ValueError):
            pass

    def failure(self) -> str | None:
        """Why the store cannot serve the run, or None while it can (or is still starting)."""
        code = self.proc.poll()
        if code is not None:
            last = next((ln for ln in reversed(self.lines) if ln.strip()), "")
            return (f"the rendezvous store for {self.address} exited with code {code}"
                    + (f": {last}" if last else ""))
        if not self.ready.is_set() and time.monotonic() - self.started > self.READY_TIMEOUT:
            return f"the rendezvous store for {self.address} did not listen within {self.READY_TIMEOUT:g} s"
        return None

    def stop(self, grace: float) -> None:
        """Close its stdin (it exits), SIGTERM/SIGKILL its group if it does not, and reap it.
        A store that never listened has served nobody: it is killed at once."""
        if not self.ready.is_set() and self.proc.poll() is None:
            terminate_groups([self.proc.pid], grace=0.0, reap=self.proc.poll)
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            terminate_groups([self.proc.pid], grace=grace, reap=self.proc.poll)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()


def reaper_argv(python: str, grace: float) -> list[str]:
    """`python reaper.py --grace G --`: the node supervisor's command line."""
    from gpucluster import reaper

    return [python, reaper.__file__, "--grace", f"{reaper.nested_grace(grace):g}", "--"]


class LocalLauncher(Launcher):
    """Outputs: node N's GPUCLUSTER_OUTPUT_DIR is `job.output_dir/node-N` itself (this machine is
    every node), created before the agents start; nothing is copied, `collect_outputs` checks and
    counts what is there."""

    collects_outputs = True

    def __init__(self, python: str | None = None, cwd: str | None = None, grace: float = 3.0):
        self.python = python or sys.executable
        self.cwd = cwd
        self.grace = grace
        self._outputs: dict[str, dict[int, Path]] = {}  # run id -> node rank -> output folder

    def collect_outputs(self, job: JobSpec, events: RunEvents) -> list:
        from gpucluster.outputs import COMPLETE, FAILED, PARTIAL, NodeOutputs, measure

        results = []
        for rank, path in sorted(self._outputs.pop(job.run_id, {}).items()):
            start = time.monotonic()
            if not path.is_dir():
                results.append(NodeOutputs(rank, str(path), FAILED, detail=f"the output folder {path} is gone"))
                continue
            files, nbytes, problems = measure(path)
            verdict = COMPLETE if not problems else PARTIAL
            detail = None if not problems else "could not read " + "; ".join(problems[:5]) + (
                f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")
            results.append(NodeOutputs(rank, str(path), verdict, files, nbytes, time.monotonic() - start, detail))
        return results

    def describe(self, spec, job: JobSpec) -> list[str]:
        lines = [f"data: {m.src} (used in place: read it, do not write to it)" for m in job.data]
        return lines + ([f"resume: {job.resume.src} (used in place)"] if job.resume is not None else [])

    def launch(self, cluster, job: JobSpec, events: RunEvents, log_dir: Path) -> JobResult:
        nnodes = len(cluster.nodes)
        job = replace(job, rdzv_port=free_port())
        if job.threads_per_proc is None:
            job = replace(job, threads_per_proc=max(1, (os.cpu_count() or 1) // (nnodes * job.nproc_per_node)))
        program = program_args(job)
        # --setup: the nodes wait for this file (created once every node's setup succeeded)
        go_dir = tempfile.mkdtemp(prefix="gcsetup-") if job.setup else None
        go_file = os.path.join(go_dir, GO_FILE) if go_dir else ""
        supervisor = NodeSupervisor(job, events, log_dir, [f"local:{n.rank}" for n in cluster.nodes])
        procs: dict[int, subprocess.Popen] = {}
        samplers: list[subprocess.Popen] = []
        store: list[RendezvousStore] = []

        def stop() -> None:
            started = list(procs.values()) + samplers
            # The run's whole process tree, listed before anything is stopped: processes that a
            # reaper adopted are no longer findable under it once it is gone.
            tree = run_processes(job.run_id)
            terminate_groups([p.pid for p in started], grace=self.grace, reap=lambda: [p.poll() for p in started])
            # The store goes last: only now has every agent finished with the rendezvous.
            for s in store:
                s.stop(self.grace)
            # Workers live in sessions of their own: find them by the run id they inherited.
            kill_run_processes(job.run_id, grace=self.grace, also=tree)
            for p in list(procs.values()) + samplers:
                try:
                    p.wait(timeout=self.grace)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

        if job.output_dir:
            outs = {n.rank: Path(job.output_dir) / f"node-{n.rank}" for n in cluster.nodes}
            self._outputs[job.run_id] = outs
            for path in outs.values():
                try:
                    path.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise LaunchError(f"could not create the output folder {path}: {exc.strerror}") from None
        try:
            store_env = dict(os.environ, GPUCLUSTER_RUN_ID=job.run_id, CUDA_VISIBLE_DEVICES="")
            store.append(RendezvousStore(self.python, "127.0.0.1", job.rdzv_port, store_env, self.cwd))
            for node in cluster.nodes:
                argv = torchrun_argv(job, python=self.python, nnodes=nnodes, node_rank=node.rank,
                                     rdzv_host="127.0.0.1", local_addr="127.0.0.1", program=program,
                                     store_on_head=False)
                # torchrun runs under the node supervisor: a child subreaper that stops whatever
                # the job leaves behind, re-parented daemons included (see gpucluster/reaper.py).
                argv = reaper_argv(self.python, self.grace) + setup_wrapped(argv, job.setup, go_file)
                env = dict(os.environ)
                out = str(Path(job.output_dir) / f"node-{node.rank}") if job.output_dir else None
                env.update(node_env(job, node_rank=node.rank, node_ips=cluster.node_ips,
                                    gpus_per_node=cluster.gpus_per_node, output_dir=out))
                env.update(staged_env(job, [m.src for m in staged_mounts(job)]))  # local: the folders in place
                if cluster.gpus_per_node:
                    first = node.rank * cluster.gpus_per_node
                    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(first + i) for i in range(cluster.gpus_per_node))
                else:
                    env["CUDA_VISIBLE_DEVICES"] = ""
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, env=env, cwd=self.cwd, start_new_session=True)
                procs[node.rank] = proc
                events.on_spawn(node.rank, "process", str(proc.pid))
                supervisor.attach(node.rank, proc.stdout)
                if job.command:
                    # A user's script reports no utilisation: a sampler runs beside it on each node
                    # (built-in workloads sample themselves). It carries the run id in its
                    # environment, so stop() finds it; its exit code is not the node's.
                    from gpucluster.workloads.sampler import sampler_argv

                    sampler = subprocess.Popen(sampler_argv(self.python, node.rank, run_id=job.run_id),
                                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                               stderr=subprocess.DEVNULL, env=env, cwd=self.cwd,
                                               start_new_session=True)
                    samplers.append(sampler)
                    supervisor.attach(node.rank, sampler.stdout)
        except OSError as exc:
            stop()
            supervisor.close()
            _remove(go_dir)
            what = "the rendezvous store" if not store else f"torchrun for local node {len(procs)}"
            raise LaunchError(f"could not start {what}: {exc}") from None
        except BaseException:  # Ctrl-C included: what was started is stopped and removed before it propagates
            stop()
            supervisor.close()
            _remove(go_dir)
            raise
        try:
            return supervisor.run(procs, stop, watch=store[0].failure,
                                  release=lambda: open(go_file, "x").close() if go_file else None)
        finally:
            _remove(go_dir)


def _remove(folder: str | None) -> None:
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
