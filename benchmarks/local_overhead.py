"""Fixed overhead of a local run: `gpucluster run --cloud local --nodes 2` against bare torchrun
running the same job with the same two agents (c10d rendezvous on 127.0.0.1, one process each).

    python benchmarks/local_overhead.py [ROUNDS] [--job trivial|synthetic]

`trivial` (default): `trivial_job.py` (init the process group, one barrier, exit), given after
`--` as a user's script (so gpucluster copies its folder per node and runs a utilisation sampler
beside it, as for any user's script); the goal is <= 1.15x bare torchrun or <= +0.5 s.
`synthetic`: the built-in synthetic workload, a few seconds of compute (goal <= 1.10).

Both sides run with Python's bytecode cache on (PYTHONDONTWRITEBYTECODE is taken out of their
environment: an installed gpucluster has its .pyc files, as torch has; a sandbox that sets it
would otherwise compile gpucluster's modules from source in every process, about 0.15 s of CPU
in the CLI alone), after one untimed round of each (caches warm).

Rounds are interleaved (bare, then gpucluster), so drift hits both alike; it prints the medians
of wall time and of CPU time (user + system of every process each side waited for: RUSAGE_CHILDREN),
the median of the per-round ratios, and the load average before and after. Not a test.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _util import BIN, ROOT, fresh_home_env, median

SYNTHETIC = ["--epochs", "3", "--steps", "20", "--width", "512", "--depth", "4", "--batch-size", "256"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(extra)
    return env


def bare_torchrun(program: list[str]) -> tuple[float, float]:
    port = free_port()
    env = base_env(OMP_NUM_THREADS="1")
    c0, t0 = children_cpu(), time.perf_counter()
    procs = []
    for rank in range(2):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
                "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=bare{port}",
                f"--rdzv-conf=is_host={'true' if rank == 0 else 'false'}", "--max-restarts=0",
                "--monitor-interval=0.5", "--local-addr=127.0.0.1", *program]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    codes = [p.wait() for p in procs]
    assert codes == [0, 0], codes
    return time.perf_counter() - t0, children_cpu() - c0


def via_gpucluster(args: list[str]) -> tuple[float, float]:
    env = base_env(GPUCLUSTER_HOME=fresh_home_env()["GPUCLUSTER_HOME"])
    argv = [str(BIN / "gpucluster"), "run", "--cloud", "local", "--nodes", "2", "--threads-per-proc", "1",
            "--python", sys.executable, "--quiet", *args]
    c0, t0 = children_cpu(), time.perf_counter()
    p = subprocess.run(argv, env=env, capture_output=True, text=True)
    took, cpu = time.perf_counter() - t0, children_cpu() - c0
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    shutil.rmtree(env["GPUCLUSTER_HOME"], ignore_errors=True)
    return took, cpu


def main(rounds: int = 5, job: str = "trivial") -> float:
    folder = Path(tempfile.mkdtemp(prefix="gpucluster-bench-job-"))  # the script in a folder of its own
    shutil.copy(ROOT / "benchmarks" / "trivial_job.py", folder / "trivial_job.py")
    if job == "trivial":
        bare_prog = [str(folder / "trivial_job.py")]
        ours_args = ["--", "python", str(folder / "trivial_job.py")]
    else:
        bare_prog = ["-m", "gpucluster.workloads.synthetic", *SYNTHETIC]
        ours_args = ["--workload", "synthetic", "--workload-args", " ".join(SYNTHETIC)]
    bare, ours = [], []
    try:
        bare_torchrun(bare_prog), via_gpucluster(ours_args)  # warm-up: page cache, bytecode cache
        load0 = os.getloadavg()
        for _ in range(rounds):  # interleaved, so drift hits both alike
            bare.append(bare_torchrun(bare_prog))
            ours.append(via_gpucluster(ours_args))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    load1 = os.getloadavg()
    ratios = [o[0] / b[0] for o, b in zip(ours, bare)]
    mb, mo = median([b[0] for b in bare]), median([o[0] for o in ours])
    goal = "<= 1.15 or <= +0.5 s" if job == "trivial" else "<= 1.10"
    print(f"local run overhead ({job} job, 2 nodes, {rounds} interleaved rounds; load average "
          f"{load0[0]:.1f} before, {load1[0]:.1f} after)")
    print(f"  bare torchrun: wall median {mb:.2f} s (runs {', '.join(f'{b[0]:.2f}' for b in bare)}); "
          f"CPU median {median([b[1] for b in bare]):.2f} s")
    print(f"  gpucluster:    wall median {mo:.2f} s (runs {', '.join(f'{o[0]:.2f}' for o in ours)}); "
          f"CPU median {median([o[1] for o in ours]):.2f} s")
    print(f"  ratio of medians {mo / mb:.3f}, median of per-round ratios {median(ratios):.3f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f}); +{mo - mb:.2f} s; goal {goal}")
    return mo / mb


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("rounds", nargs="?", type=int, default=5)
    ap.add_argument("--job", choices=("trivial", "synthetic"), default="trivial")
    ns = ap.parse_args()
    main(ns.rounds, ns.job)
