"""The Launcher contract and the torchrun command line every launcher shares.

`Launcher.launch(cluster, job, events) -> JobResult` starts torchrun on every node of a cluster,
streams the nodes' logs (prefixed with the node rank) through the one metrics parser, fails fast
when any node fails, enforces the job's wall-clock limit, and before returning (also on Ctrl-C or
an exception) makes sure none of the processes it started is left running.

Here: the job and result types, the torchrun command line (argv lists, never shell strings) and
the per-node environment contract. Beside it: `gpucluster.watch.supervisor` (`NodeSupervisor`, which
runs one local process per node, a torchrun agent for `local`, an `ssh` client for `ssh`, and
watches them; `gpucluster.watch.procs.terminate_groups` stops them) and `gpucluster.ledger.node_output` (what a node prints: cut lines,
tails, the console feed, the root cause of a failure).
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from gpucluster.errors import UsageError
from gpucluster.events import RunEvents
from gpucluster.watch.metrics import MetricsState
from gpucluster.states import OutputDest

if TYPE_CHECKING:
    from gpucluster.ledger.records import JsonObject
    from gpucluster.domain import Cluster, Leftover
    from gpucluster.watch.health import HealthSpec
    from gpucluster.watch.outputs import NodeOutputs
    from gpucluster.spec import ClusterSpec
    from gpucluster.watch.staging import DataMount


def _program(name: str) -> str:
    """The text of a program that runs on a node (a file of gpucluster/node/, shipped by content)."""
    return (Path(__file__).parents[1] / "node" / name).read_text()  # gpucluster/node/: programs run on nodes


DEFAULT_RDZV_PORT = 29400
# What a user's command is started through on every rank: it announces the worker's start (the
# observable start of the train phase) as a metric record, then exec()s the command unchanged, in
# the same process (same pid, environment, argv). The program is the file node_announce.py, shipped
# by content (`python -c`), so it works on any node.
WORKER_START_KIND = "worker_start"
# It starts with "-1" (a statement that does nothing, in the file) so that torchrun's failure summary names the
# user's program (the word before the JSON list of its words, see `announced_program`):
# torch.distributed.launcher.api._get_entrypoint_name takes the first argument that does not start
# with "-" when the entry point is its own interpreter (torch 2.x).
_ANNOUNCE = _program("node_announce.py")  # its first line is that "-1"
# Whether a rank joined a process group (issue 46 item 2): node_pghook.py, shipped as `sitecustomize.py`
# into a folder of the run that GPUCLUSTER_PG_HOOK names; the announcer puts it first on the worker's
# PYTHONPATH (`pg_hook_file`, `lay_pg_hook`; the ssh bundle and the Kubernetes ConfigMap carry it too).
PG_HOOK_ENV, PG_HOOK_DIR = "GPUCLUSTER_PG_HOOK", "pghook"


def pg_hook_file() -> Path:
    """The hook's program, a file of gpucluster/node/ (stdlib only), shipped as `PG_HOOK_DIR/sitecustomize.py`."""
    return Path(__file__).parents[1] / "node" / "node_pghook.py"


def lay_pg_hook(folder: str) -> str | None:
    """`folder/PG_HOOK_DIR/sitecustomize.py` written (the local launcher's run folder); the hook's folder, or
    None when it could not be written (then whether a rank joined a process group is not known)."""
    hook = Path(folder) / PG_HOOK_DIR
    try:
        hook.mkdir(exist_ok=True)
        (hook / "sitecustomize.py").write_bytes(pg_hook_file().read_bytes())
    except OSError:
        return None
    return str(hook)


@dataclass(frozen=True)
class JobSpec:
    run_id: str
    command: tuple[str, ...] = ()  # user argv after `--` (e.g. python train.py --epochs 3)
    workload: str | None = None  # built-in workload name, used when command is empty
    workload_args: tuple[str, ...] = ()
    nproc_per_node: int = 1
    rdzv_port: int = DEFAULT_RDZV_PORT
    max_restarts: int = 0
    max_seconds: float | None = None
    env: tuple[tuple[str, str], ...] = ()  # --env/--env-file: plain settings every rank gets
    secrets: tuple[str, ...] = ()  # --secret: NAMES only; values are read at launch (gpucluster.plan.jobenv)
    threads_per_proc: int | None = None  # OMP/MKL threads per worker; None = torchrun's default
    setup: tuple[str, ...] = ()  # --setup: shell commands run on every node before torchrun
    data: tuple[DataMount, ...] = ()  # --data: gpucluster.watch.staging.DataMount, staged to every node
    output_dir: str | None = None  # where node N's outputs come back (DIR/node-N); None: not collected
    resume: DataMount | None = None  # --resume: a DataMount of the resumed run's outputs, staged as GPUCLUSTER_RESUME_DIR
    # --resume: (folder inside the resume mount, why that node) whose files are laid back into
    # every node's working folder before the job starts (gpucluster.plan.resume.resume_files)
    resume_files: tuple[str, str] | None = None
    collect: tuple[str, ...] = ()  # --collect: patterns narrowing what comes back from the working folder
    collect_limit: int | None = None  # --collect-limit: bytes per node from the working folder (None: 10 GB)
    owner: str | None = None  # the installation id of the home running it (GPUCLUSTER_OWNER on every process)
    check: HealthSpec | None = None  # the health check before the job (gpucluster/watch/health.py); None: skipped
    # money guards (gpucluster/costing/guards.py): the cap in USD, the stall time, what earlier attempts cost
    max_cost: float | None = None
    stall_s: float | None = None
    cost_before: float = 0.0
    cost_of: str | None = None  # the run whose cost the cap watches (exec: the kept cluster's first run); None: this one

    @property
    def display(self) -> str:
        if self.command:
            return shlex.join(self.command)
        return shlex.join(["workload:" + str(self.workload), *self.workload_args])

    @property
    def output(self) -> OutputDest | None:
        """`output_dir` classified: a local folder, or a bucket (s3://, gs://) each node uploads to."""
        return None if self.output_dir is None else OutputDest.of(self.output_dir)


@dataclass
class NodeResult:
    node_rank: int
    host: str
    exit_code: int | None  # None: killed by us or never finished
    last_lines: list[str] = field(default_factory=list)


@dataclass
class JobResult:
    ok: bool
    nodes: list[NodeResult]
    metrics: MetricsState
    failure: str | None = None
    failed_node: int | None = None
    timed_out: bool = False
    train_started_at: float | None = None
    rendezvous_started_at: float | None = None
    log_dir: str | None = None
    unwitnessed: list[str] = field(default_factory=list)  # nodes whose end nothing vouches for (the verdict)
    stopped_by: str | None = None  # a money guard stopped the job: "cost" or "stall" (gpucluster/costing/guards.py)


class Launcher:
    """Runs a job's torchrun agents on a cluster's nodes. Subclass it; the optional parts have
    defaults here, so callers never probe for attributes. `launch` builds the run's transport
    (`gpucluster.watch.sequence.Transport`: the operations on its nodes) and hands it to
    `launch_sequence`, which runs the steps in their one order and stops, releases or holds what
    was started on every path; what `collect_outputs` needs is one record per run (`Runs`).

    - `describe(spec, job)`: lines for the run's plan (image, data, what is shipped); its errors
      come before anything exists.
    - `collect_outputs(job, events)`: called by the lifecycle once the job has ended, however it
      ended, before teardown: every node's output folder (GPUCLUSTER_OUTPUT_DIR) brought to
      `job.output_dir/node-N`, one `gpucluster.watch.outputs.NodeOutputs` per node where the job was
      started ([] where it started nowhere). None (the default): this launcher cannot collect
      outputs (`collects_outputs` is False; `--output` is refused for it).
    - `cleanup_errors`: what the launcher could not delete of what it created on the cluster (one
      line each), read by the lifecycle once the job and its outputs are done.
    - `checks_nodes`: it runs the health check (`job.check`, gpucluster/watch/health.py) before the job;
      a launcher that cannot is never given one (`health.spec_for` refuses `--check` for it).
    - `leftovers(cluster, run_id, remove=False)`: the run's processes (or objects) still on the nodes
      (`Leftover`s), for a job on a kept cluster (`exec`), whose teardown keeps the nodes; None: nothing
      to ask beyond `cleanup_errors`. With `remove`, for a run whose gpucluster process died (the next
      `exec` reclaims it): what it started there, found by its marks, deleted first, then read back;
      None: this launcher cannot delete them.
    - `connect(cluster, rank, command, forwards, opening)`: `gpucluster ssh`: a shell (or `command`)
      on node `rank` of a kept cluster, with local ports forwarded to the node (`Forward`); its exit
      code. What it would refuse (a host it cannot forward to) it refuses first, then calls
      `opening()` (the CLI's own checks and lines: nothing is said before a refusal), then opens.
    - `ssh_config(cluster, folder)`: `gpucluster ssh --ssh-config`: OpenSSH host aliases for the
      nodes (the files it needs written under `folder`); the lines to add to ~/.ssh/config.
    """

    collects_outputs = False
    checks_nodes = False
    cleanup_errors: Sequence[str] = ()

    def launch(self, cluster: Cluster, job: JobSpec, events: RunEvents, log_dir: Path) -> JobResult:
        raise NotImplementedError

    def describe(self, spec: ClusterSpec, job: JobSpec) -> list[str]:
        return []

    def collect_outputs(self, job: JobSpec, events: RunEvents) -> list[NodeOutputs] | None:
        return None

    def leftovers(self, cluster: Cluster, run_id: str | None, *, remove: bool = False) -> list[Leftover] | None:
        return None

    def connect(self, cluster: Cluster, rank: int, command: Sequence[str], forwards: Sequence["Forward"],
                opening: Callable[[], None] = lambda: None) -> int:
        opening()
        raise UsageError(f"{cluster.cloud} nodes cannot be reached with `gpucluster ssh`")

    def ssh_config(self, cluster: Cluster, folder: Path) -> list[str]:
        raise UsageError(f"{cluster.cloud} nodes are not reached over ssh: there is no ssh config to write")


@dataclass(frozen=True)
class Forward:
    """`-L LOCAL:HOST:REMOTE`: this machine's 127.0.0.1:LOCAL to HOST:REMOTE as the node sees it."""

    local: int
    host: str
    remote: int

    @classmethod
    def parse(cls, text: str) -> "Forward":
        parts = text.split(":")
        if len(parts) == 2:
            parts = [parts[0], "localhost", parts[1]]
        ok = len(parts) == 3 and all(p.isdigit() and 0 < int(p) < 65536 for p in (parts[0], parts[2])) and bool(
            re.fullmatch(r"[A-Za-z0-9.-]+", parts[1]))
        if not ok:
            raise UsageError(f"-L {text!r} is not allowed: LOCAL_PORT:HOST:REMOTE_PORT (ports 1-65535), e.g. "
                             "-L 6006:localhost:6006")
        return cls(int(parts[0]), parts[1], int(parts[2]))

    def __str__(self) -> str:
        return f"{self.local}:{self.host}:{self.remote}"


# -- torchrun command line ------------------------------------------------------------------
_PYTHON_RE = re.compile(r"^python(\d+(\.\d+)?)?$")


_PY_ARG_OPTS = "WX"  # python's short options that take an argument (-W arg, -X opt; attached or next word)
_PY_EXIT_OPTS = "hV?"  # -h, -V, -?: print and exit
_PY_LONG_ARG = ("--check-hash-based-pycs",)


def python_target(rest: Sequence[str]) -> tuple[str | None, str | None]:
    """What `python REST...` runs, read as CPython reads its command line (options first, then
    the program): ("script", path), ("-m", module), ("-c", code) (None when the word is missing),
    ("-", None) for stdin, ("exit", option) for an option that prints and exits (--version), or
    (None, None) when only options are given (python would wait for input on stdin)."""
    i = 0
    while i < len(rest):
        word = rest[i]
        if word == "--":
            i += 1
            break
        if word == "-" or not word.startswith("-"):
            break
        if word.startswith("--"):
            if word in _PY_LONG_ARG:
                i += 1
            elif word.split("=", 1)[0] not in _PY_LONG_ARG:
                return "exit", word  # --version, --help, --help-env, ...: print and exit
            i += 1
            continue
        for j, ch in enumerate(word[1:], 1):  # a cluster of short options: -uB, -Wignore, -Xdev, -uc CODE
            if ch in "cm":
                arg = word[j + 1:] or (rest[i + 1] if i + 1 < len(rest) else None)
                return f"-{ch}", arg
            if ch in _PY_EXIT_OPTS:
                return "exit", word
            if ch in _PY_ARG_OPTS:
                if j + 1 == len(word):
                    i += 1  # the argument is the next word
                break
        i += 1
    if i >= len(rest):
        return None, None
    return ("-", None) if rest[i] == "-" else ("script", rest[i])


def program_args(job: JobSpec, *, workload_dir: str | None = None) -> list[str]:
    """What follows torchrun's own options: a module, a script, or --no-python + a command.

    With `workload_dir` the built-in workloads run as scripts from that folder (shipped alone to a
    node); otherwise as modules of the installed package.
    """
    if not job.command:
        if not job.workload:
            raise UsageError("a job needs a workload or a command")
        if workload_dir:
            return [f"{workload_dir.rstrip('/')}/{job.workload}.py", *job.workload_args]
        return ["-m", f"gpucluster.workloads.{job.workload}", *job.workload_args]
    cmd = list(job.command)
    if _PYTHON_RE.match(os.path.basename(cmd[0])) and len(cmd) > 1:
        rest = cmd[1:]
        if rest[0] == "-m" and len(rest) > 1:
            return ["-m", *rest[1:]]
        if not rest[0].startswith("-"):
            return rest
    return ["--no-python", *cmd]


def agent_boot(store: tuple[str, int, int] | None = None) -> str:
    """Python code that runs torchrun exactly as `python -m torch.distributed.run ARGS...` does
    (runpy with alter_sys, as -m does: the same sys.argv, __main__, exit code and traceback), for
    `python -c CODE ARGS...`. Two additions, for agents that share one machine (`local`):

    - On the way out it freezes the garbage collector's objects. With torch imported, the
      interpreter's final collection walks millions of objects: about 0.45 s of CPU and wall after
      the job has ended, on every agent (a 2-node trivial job's agents left 0.55 s sooner, median
      of 8 interleaved pairs on this 2-core machine). atexit handlers, logging's flush and module
      teardown still run.
    - `store` = (host, port, fd): this agent also hosts the run's c10d rendezvous store (a
      multi-tenant `TCPStore`, as torch's c10d backend makes on its host agent; every agent,
      this one included, runs with is_host=false and connects to it), and, when its torchrun
      succeeded, keeps it until the launcher lets go: until reading `fd` (the read end of a pipe
      whose only write end the launcher holds) returns, which it does once every other agent has
      exited, when the launcher stops the run, or when the launcher dies. So no agent loses the store while it shuts the
      rendezvous down (torch's `recvVector failed ... RendezvousConnectionError` traces at the end
      of a clean run when the store's agent left first), and the store costs no process of its
      own: a separate one imported torch again, about 1.8 s of CPU per run.
    """
    lines = ["import gc, os, runpy, sys"]
    if store is not None:
        host, port, fd = store
        lines += [
            "from datetime import timedelta",
            "try:",
            "    from torch.distributed import TCPStore",
            f"    store = TCPStore({host!r}, {int(port)}, is_master=True, multi_tenant=True,"
            " wait_for_workers=False, timeout=timedelta(seconds=60))",
            "except (RuntimeError, ValueError, OSError) as exc:",
            f"    sys.stderr.write('rendezvous store: cannot listen on {host}:{int(port)}: ' + str(exc) + chr(10))",
            "    sys.exit(1)",
        ]
    lines += [
        "ok = False",
        "try:",
        "    runpy.run_module('torch.distributed.run', run_name='__main__', alter_sys=True)",
        "    ok = True",
        "except SystemExit as exc:",
        "    ok = exc.code in (None, 0)",
        "    raise",
        "finally:",
    ]
    if store is not None:
        lines += [
            "    if ok:  # a failed agent leaves at once: its node is seen failing, and the run stops anyway",
            "        try:",
            f"            os.read({int(fd)}, 1)  # until the launcher lets go of the store",
            "        except OSError:",
            "            pass",
            "    del store",
        ]
    lines.append("    gc.freeze()")
    return "\n".join(lines) + "\n"


def torchrun_argv(
    job: JobSpec,
    *,
    python: str,
    nnodes: int,
    node_rank: int,
    rdzv_host: str,
    local_addr: str | None,
    program: Sequence[str],
    store_on_head: bool = True,
    boot: str | None = None,
) -> list[str]:
    """torchrun for one node: c10d rendezvous on the head, a unique id per run, no restarts.

    With `store_on_head=False` no agent hosts the rendezvous store (every agent has
    is_host=false): the launcher has the store served at `rdzv_host:rdzv_port` itself (the local
    launcher: by node 0's agent through `agent_boot`), so that it outlives every agent. A user's
    command (not a built-in workload) is started through a one-line announcer (see
    `announced_program`).
    `boot` (from `agent_boot`): `python -c BOOT` instead of `python -m torch.distributed.run`, the
    same torchrun. The local launcher uses it, where every node shares one machine; the others
    keep the command users know.
    """
    is_host = node_rank == 0 and store_on_head
    if job.command:
        program = announced_program(python, program)
    argv = [
        python, *(("-c", boot) if boot is not None else ("-m", "torch.distributed.run")),
        f"--nnodes={nnodes}",
        f"--nproc-per-node={job.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv_host}:{job.rdzv_port}",
        f"--rdzv-id={job.run_id}",
        # The head hosts the rendezvous store; the others only connect (no guessing by hostname).
        f"--rdzv-conf=is_host={'true' if is_host else 'false'},join_timeout=300",
        f"--max-restarts={job.max_restarts}",
        "--monitor-interval=0.5",
    ]
    if local_addr:
        argv.append(f"--local-addr={local_addr}")
    return argv + list(program)


def announced_program(python: str, program: Sequence[str]) -> list[str]:
    """torchrun's program part, run through the announcer: each worker prints a `worker_start`
    metric record and then exec()s exactly what torchrun would have run (`python -u script`,
    `python -u -m module`, or the command given with --no-python).

    The program comes as ONE argument, its words as a JSON list: torchrun parses its whole command
    line with argparse, which refuses an ambiguous abbreviation of its own options anywhere on it,
    even among the script's arguments (`train.py --log x`: "ambiguous option: --log could match
    --log-dir, --logs-specs"; likewise --node, --local, --s), so a script that runs under plain
    `python` would not start. A JSON list starts with "[", which argparse never reads as an option.
    Before it, the word torchrun's failure summary names (the script), which the announcer skips."""
    import json

    name = next((w for w in program if not w.startswith("-")), "program")
    return ["--no-python", python, "-c", _ANNOUNCE, name, json.dumps(list(program))]


def resume_record(job: JobSpec, files: int, nbytes: int) -> JsonObject:
    """The `resume_files` metric record of one node: what --resume laid back into its working folder."""
    rel, why = job.resume_files or ("", "")
    return {"kind": "resume_files", "from": f"{job.resume.src.rstrip('/')}/{rel}" if job.resume else rel,
            "why": why, "files": files, "bytes": nbytes}


def node_env(job: JobSpec, *, node_rank: int, node_ips: Sequence[str], gpus_per_node: int,
             output_dir: str | None = None, pg_hook: str | None = None) -> dict[str, str]:
    """The GPUCLUSTER_* contract every rank sees, beside torchrun's own variables.
    `output_dir`: the node's output folder (GPUCLUSTER_OUTPUT_DIR), copied back before teardown.
    `pg_hook`: the folder on the node holding the process-group hook (`PG_HOOK_DIR`), for a user's command."""
    env = {
        "GPUCLUSTER_RUN_ID": job.run_id,
        "GPUCLUSTER_NODE_RANK": str(node_rank),
        "GPUCLUSTER_NUM_NODES": str(len(node_ips)),
        "GPUCLUSTER_NODE_IPS": ",".join(node_ips),
        "GPUCLUSTER_GPUS_PER_NODE": str(gpus_per_node),
        "PYTHONUNBUFFERED": "1",
    }
    if job.owner:  # processes are matched by run id AND owner (gpucluster.watch.procs)
        env["GPUCLUSTER_OWNER"] = job.owner
    if output_dir:
        env["GPUCLUSTER_OUTPUT_DIR"] = output_dir
    if pg_hook and job.command:
        env[PG_HOOK_ENV] = pg_hook
    if job.threads_per_proc:
        env["OMP_NUM_THREADS"] = str(job.threads_per_proc)
        env["MKL_NUM_THREADS"] = str(job.threads_per_proc)
    env.update(dict(job.env))
    return env
