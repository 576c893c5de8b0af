"""The health check's duration on the local backend (issue 30 item 6; goal: <= 10 s for 4 nodes).

Real runs through the lifecycle: N local nodes (default 4), the check on, a job that does nothing
(`python -c pass` under torchrun); the `check` phase's duration as the ledger timed it (from the
phase's start to its end: every node's program started, torch imported, its own checks, the
store, the all-reduce, every pair's exchange, the judgement), ROUNDS times (default 3), median.
Not a test.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

from _util import ROOT

sys.path.insert(0, str(ROOT / "tests"))

NODES = int(os.environ.get("NODES", "4"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))


def one(home: Path) -> tuple[float, dict]:
    from gpucluster.watch.health import HealthSpec
    from gpucluster.infra.local.launch import LocalLauncher
    from gpucluster.infra.local.provider import LocalProvider
    from gpucluster.watch.launch import JobSpec
    from gpucluster.ledger.store import Ledger
    from gpucluster.infra.registry import plugin as backend_of
    from gpucluster.lifecycle.steps import execute
    from gpucluster.spec import ClusterSpec, new_run_id

    spec = ClusterSpec(cloud="local", nodes=NODES, name="bench-hc", gpus_per_node=0, run_id=new_run_id())
    ledger = Ledger(home / "ledger.sqlite3")
    job = JobSpec(run_id=spec.run_id, command=(sys.executable, "-c", "pass"), threads_per_proc=1,
                  check=HealthSpec(), max_seconds=300)
    outcome = execute(spec, job, backend=backend_of(spec.cloud),
                      ledger=ledger, provider=LocalProvider(), launcher=LocalLauncher(python=sys.executable))
    if outcome.status != "succeeded":
        raise SystemExit(f"run failed: {outcome.failure}")
    phase = ledger.get_run(spec.run_id).phase("check")
    (summary,) = ledger.metrics(spec.run_id, kind="check")
    links = ledger.metrics(spec.run_id, kind="link")
    (ar,) = ledger.metrics(spec.run_id, kind="allreduce")
    return phase.ended_at - phase.started_at, {"program_s": summary["seconds"], "pairs": len(links),
                                               "slowest_gbps": min(r["gbps"] for r in links),
                                               "busbw_gbps": ar["busbw_gbps"]}


def main() -> None:
    os.environ["GPUCLUSTER_HOME"] = home = tempfile.mkdtemp(prefix="gpucluster-bench-hc-")
    times, extra = [], []
    for _ in range(ROUNDS):
        t, info = one(Path(home))
        times.append(t)
        extra.append(info)
        print(f"health check, {NODES} local nodes: {t:.2f} s (pairs {info['pairs']}, slowest pair "
              f"{info['slowest_gbps']:.2f} Gbit/s, all-reduce bus bandwidth {info['busbw_gbps']:.2f} Gbit/s)")
    print(f"health check, {NODES} local nodes: median {statistics.median(times):.2f} s "
          f"(min {min(times):.2f}, max {max(times):.2f}; goal <= 10 s)")


if __name__ == "__main__":
    main()
