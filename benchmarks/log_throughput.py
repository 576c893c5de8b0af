"""Log streaming through gpucluster.

1. Wall time of `gpucluster run --cloud local --nodes 2 -- python tests/fixtures/spew.py` (each
   rank prints 20 MB of plain lines; console on, read by a fast reader) divided by bare torchrun
   running the same script with the same two agents and its output thrown away (goal <= 1.5).
2. Throughput of the log pipeline itself (NodeSupervisor: node logs, tail, metrics, console
   feed): two processes each printing 50 MB straight into it, MB/s of wall time from their start
   until every byte is in the node logs (goal >= 50 MB/s; the processes' own time is included,
   so this is a lower bound).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _util import BIN, ROOT, fresh_home_env, median

SPEW = str(ROOT / "tests" / "fixtures" / "spew.py")
MB_PER_RANK = 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bare_torchrun() -> float:
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", SPEW_MB=str(MB_PER_RANK), PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    procs = []
    for rank in range(2):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
                "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=bare{port}",
                f"--rdzv-conf=is_host={'true' if rank == 0 else 'false'}", "--max-restarts=0",
                "--monitor-interval=0.5", "--local-addr=127.0.0.1", SPEW]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    codes = [p.wait() for p in procs]
    assert codes == [0, 0], codes
    return time.perf_counter() - t0


def via_gpucluster() -> tuple[float, int]:
    env = fresh_home_env(SPEW_MB=MB_PER_RANK)
    argv = [str(BIN / "gpucluster"), "run", "--cloud", "local", "--nodes", "2", "--threads-per-proc", "1",
            "--yes", "--", sys.executable, SPEW]
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    logs = list(Path(env["GPUCLUSTER_HOME"]).glob("runs/*/node-*.log"))
    assert len(logs) == 2 and all(f.stat().st_size >= MB_PER_RANK * 1e6 for f in logs), logs
    return wall, p.stdout.count("\n")


def pipeline_throughput(mb: int = 50) -> float:
    """MB/s through NodeSupervisor from two local processes printing `mb` MB each."""
    from gpucluster.watch.launch import JobSpec
    from gpucluster.watch.supervisor import NodeSupervisor

    class Events:
        def on_line(self, node_rank, line):
            pass

        def on_metric(self, node_rank, record):
            pass

        def on_phase(self, phase):
            pass

    with tempfile.TemporaryDirectory(prefix="gpucluster-bench-") as d:
        sup = NodeSupervisor(JobSpec("bench", command=("x",)), Events(), Path(d), ["a", "b"])
        env = dict(os.environ, SPEW_MB=str(mb), RANK="0")
        t0 = time.perf_counter()
        procs = {r: subprocess.Popen([sys.executable, SPEW], stdout=subprocess.PIPE, env=env) for r in range(2)}
        for r, p in procs.items():
            sup.attach(r, p.stdout)
        result = sup.run(procs, stop=lambda: None)
        wall = time.perf_counter() - t0
        assert result.ok, result.failure
        size = sum(f.stat().st_size for f in Path(d).glob("node-*.log"))
        assert size >= 2 * mb * 1e6, size
    return size / 1e6 / wall


def main(repeats: int = 3) -> float:
    bare, ours, shown = [], [], []
    for _ in range(repeats):  # interleaved, so drift hits both alike
        bare.append(bare_torchrun())
        wall, lines = via_gpucluster()
        ours.append(wall)
        shown.append(lines)
    ratio = median(ours) / median(bare)
    rates = [pipeline_throughput() for _ in range(repeats)]
    print(f"log throughput: {MB_PER_RANK} MB/rank x 2 nodes: gpucluster {median(ours):.2f} s "
          f"(console {median(shown):.0f} lines) vs bare torchrun {median(bare):.2f} s (medians of {repeats}) "
          f"-> ratio {ratio:.3f}; goal <= 1.5")
    print(f"log pipeline: {median(rates):.0f} MB/s (median of {repeats}, 2 x 50 MB; min {min(rates):.0f}); "
          "goal >= 50 MB/s")
    return ratio


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
