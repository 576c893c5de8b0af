"""How often a worker aborts at exit (issue 28 item 5): runs tests/fixtures/ddp_tutorial.py, a
script shaped like the official PyTorch multi-node DDP tutorial (gloo on CPU, process group from
torchrun's env, DDP, a few epochs, snapshot.pt in its working folder, destroy_process_group, a
normal interpreter exit), N times through `gpucluster run --cloud local --nodes 2` and N times
through two bare torchrun agents, and counts the runs in which a worker died by a signal (SIGABRT:
"terminate called ...", torchrun's "Signal 6") apart from other failures.

    python benchmarks/exit_abort.py --runs 50 [--mode both|gpucluster|bare] [--procs-per-node 1]
        [--epochs 5] [--threads N] [--env NAME=VALUE ...] [--cores DIR] [--cpus 0]

--env sets a variable for the job (both modes), e.g. to try a setting with and without it.
--cores DIR: core dumps allowed (RLIMIT_CORE unlimited; the kernel's core_pattern must be a plain
file name, which lands in the worker's working folder); every aborting run's folder is kept under
DIR with its logs and core, for `gdb python core` (bt of each thread).
Not a test: it prints counts. Wrap it in the machine's heavy-test lock on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _util import BIN, ROOT

FIXTURE = ROOT / "tests" / "fixtures" / "ddp_tutorial.py"
# what a worker killed by a signal leaves: torchrun's summary ("exitcode  : -6 (pid: ...)",
# "Signal 6 (SIGABRT) received by PID"), the C++ runtime's line, gpucluster's report note
SIGNALLED = re.compile(r"exitcode\s*:\s*-\d+|Signal \d+ \(SIG|terminate called|worker ended with SIG")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child_setup(args: argparse.Namespace):
    """What each run's processes get before they start: core dumps allowed (--cores), and the CPUs
    they may use (--cpus: fewer CPUs than processes makes the exit race's window wider, without
    loading the rest of a shared machine)."""
    def setup() -> None:
        if args.cores:
            resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        if args.cpus:
            os.sched_setaffinity(0, args.cpus)
    return setup


def project(tmp: Path) -> Path:
    d = tmp / "project"
    d.mkdir()
    shutil.copy(FIXTURE, d / "train.py")
    return d


def via_gpucluster(tmp: Path, args: argparse.Namespace) -> tuple[str, str]:
    proj = project(tmp)
    env = dict(os.environ, GPUCLUSTER_HOME=str(tmp / "home"), **args.env)  # local nodes inherit it
    argv = [str(BIN / "gpucluster"), "run", "--cloud", "local", "--nodes", "2",
            "--procs-per-node", str(args.procs_per_node), "--yes",
            *(("--threads-per-proc", str(args.threads)) if args.threads else ()),
            "--output", str(tmp / "out"), "--max-minutes", "5", "--python", sys.executable,
            "--", sys.executable, "train.py", str(args.epochs), "2"]
    p = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=proj,
                       preexec_fn=_child_setup(args))
    logs = "".join(f.read_text(errors="replace") for f in Path(env["GPUCLUSTER_HOME"]).rglob("node-*.log"))
    text = p.stdout + p.stderr + logs
    (tmp / "run.txt").write_text(text)
    if p.returncode == 0:
        return "ok", ""
    return ("signal" if SIGNALLED.search(text) else "other"), _reason(p.stdout)


def bare_torchrun(tmp: Path, args: argparse.Namespace) -> tuple[str, str]:
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1", **args.env)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    procs = []
    for rank in range(2):
        cwd = tmp / f"node-{rank}"
        shutil.copytree(project(tmp) if rank == 0 else tmp / "project", cwd)
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                f"--nproc-per-node={args.procs_per_node}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=bare{port}",
                f"--rdzv-conf=is_host={'true' if rank == 0 else 'false'}", "--max-restarts=0",
                "--monitor-interval=0.5", "--local-addr=127.0.0.1", "train.py", str(args.epochs), "2"]
        out = open(cwd / "out.txt", "w")
        procs.append((subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                       preexec_fn=_child_setup(args)), out))
    codes = []
    deadline = time.monotonic() + 300  # torchrun has been seen hanging 300 s after an abort
    for proc, out in procs:
        try:
            codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
        out.close()
    text = "".join((tmp / f"node-{r}" / "out.txt").read_text(errors="replace") for r in range(2))
    (tmp / "run.txt").write_text(text)
    if codes == [0, 0]:
        return "ok", ""
    return ("signal" if SIGNALLED.search(text) else "other"), f"exit codes {codes}"


def _reason(stdout: str) -> str:
    m = re.search(r"^reason: (.*)$", stdout, re.M)
    return m.group(1)[:300] if m else stdout.strip()[-300:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--mode", choices=("both", "gpucluster", "bare"), default="both")
    ap.add_argument("--procs-per-node", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None,
                    help="OMP threads per worker (default: what gpucluster and torchrun choose, as for a user)")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--cores", type=Path, help="keep every aborting run (and its core dump) here")
    ap.add_argument("--cpus", type=lambda v: {int(c) for c in v.split(",")}, default=None,
                    help="run each job on these CPUs only, e.g. 0")
    args = ap.parse_args()
    args.env = dict(e.split("=", 1) for e in args.env)
    modes = {"gpucluster": via_gpucluster, "bare": bare_torchrun}
    wanted = list(modes) if args.mode == "both" else [args.mode]
    counts = {m: {"ok": 0, "signal": 0, "other": 0} for m in wanted}
    t0 = time.monotonic()
    for i in range(args.runs):
        for mode in wanted:  # interleaved, so the machine's load hits both alike
            tmp = Path(tempfile.mkdtemp(prefix=f"exit-abort-{mode}-"))
            try:
                outcome, why = modes[mode](tmp, args)
                counts[mode][outcome] += 1
                if outcome != "ok":
                    print(f"run {i + 1} {mode}: {outcome}: {why}", flush=True)
                    if args.cores:
                        args.cores.mkdir(parents=True, exist_ok=True)
                        shutil.copytree(tmp, args.cores / f"{mode}-{i + 1}", symlinks=True)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    env = " ".join(f"{k}={v}" for k, v in args.env.items()) or "(none)"
    cpus = ",".join(map(str, sorted(args.cpus))) if args.cpus else "all"
    print(f"{args.runs} runs per mode of ddp_tutorial.py, 2 nodes x {args.procs_per_node} process(es), "
          f"{args.epochs} epochs, OMP threads {args.threads or 'default'}, env {env}, CPUs {cpus}, {time.monotonic() - t0:.0f} s:")
    for mode, c in counts.items():
        print(f"  {mode:10s} ok {c['ok']}, ended by a signal {c['signal']}, other failures {c['other']}")


if __name__ == "__main__":
    main()
