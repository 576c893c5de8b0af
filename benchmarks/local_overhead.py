"""Wall time of `gpucluster run --cloud local --nodes 2 --workload synthetic` divided by bare
torchrun running the same workload with the same two agents (goal <= 1.10)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from _util import BIN, fresh_home_env, median

WORKLOAD = ["--epochs", "3", "--steps", "20", "--width", "512", "--depth", "4", "--batch-size", "256"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bare_torchrun() -> float:
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    t0 = time.perf_counter()
    procs = []
    for rank in range(2):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
                "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=bare{port}",
                f"--rdzv-conf=is_host={'true' if rank == 0 else 'false'}", "--max-restarts=0",
                "--monitor-interval=0.5", "--local-addr=127.0.0.1", "-m", "gpucluster.workloads.synthetic", *WORKLOAD]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    codes = [p.wait() for p in procs]
    assert codes == [0, 0], codes
    return time.perf_counter() - t0


def via_gpucluster() -> float:
    env = fresh_home_env()
    argv = [str(BIN / "gpucluster"), "run", "--cloud", "local", "--nodes", "2", "--workload", "synthetic",
            "--threads-per-proc", "1", "--quiet", "--workload-args", " ".join(WORKLOAD)]
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return time.perf_counter() - t0


def main(repeats: int = 3) -> float:
    bare, ours = [], []
    for _ in range(repeats):  # interleaved, so drift hits both alike
        bare.append(bare_torchrun())
        ours.append(via_gpucluster())
    ratio = median(ours) / median(bare)
    print(f"local run overhead: gpucluster {median(ours):.2f} s vs bare torchrun {median(bare):.2f} s "
          f"(medians of {repeats}) -> ratio {ratio:.3f}; goal <= 1.10")
    return ratio


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
