"""Scaling on the local backend: synthetic workload, 1 agent x 1 thread vs 2 agents x 1 thread
each, on a compute-bound setting (goal: efficiency >= 0.85).

efficiency = global samples/s with 2 agents / (2 x samples/s with 1 agent), from the workload's
own measured training time (process start-up excluded, it is reported separately)."""

from __future__ import annotations

import json
import subprocess
import sys

from _util import BIN, fresh_home_env, median

COMPUTE_BOUND = "--epochs 3 --steps 10 --width 1024 --depth 4 --batch-size 1024"


def throughput(nodes: int) -> tuple[float, float]:
    argv = [str(BIN / "gpucluster"), "run", "--cloud", "local", "--nodes", str(nodes), "--workload", "synthetic",
            "--threads-per-proc", "1", "--quiet", "--json", "--workload-args", COMPUTE_BOUND]
    p = subprocess.run(argv, env=fresh_home_env(), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    rec = json.loads(p.stdout)
    wall = rec["ended_at"] - rec["created_at"]
    return rec["metrics"]["samples_per_s"], wall


def main(repeats: int = 3) -> float:
    one = [throughput(1) for _ in range(repeats)]
    two = [throughput(2) for _ in range(repeats)]
    s1, s2 = median([x[0] for x in one]), median([x[0] for x in two])
    eff = s2 / (2 * s1)
    print(f"scaling (synthetic, {COMPUTE_BOUND}): 1 agent {s1:,.0f} samples/s, 2 agents {s2:,.0f} samples/s "
          f"-> efficiency {eff:.3f}; goal >= 0.85 (wall: {median([x[1] for x in one]):.1f} s vs "
          f"{median([x[1] for x in two]):.1f} s)")
    return eff


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
