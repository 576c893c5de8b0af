"""A ledger for the dashboard's tests, written with the ledger's own API (no job is run): a finished
local digits run with its phases, nodes, epoch and utilisation metrics and outputs; an aws and a gcp
run with stored itemised costs on earlier days; and a local run left `running` by a process that is
gone (an orphaned cluster, which `status` lists and `down` finishes)."""

from __future__ import annotations

import time
from pathlib import Path

from gpucluster.ledger.store import Ledger
from gpucluster.spec import ClusterSpec

DONE = "r20261127-091500-d1g175"
AWS = "r20261125-140000-a0a0a0"
GCP = "r20261126-103000-9c9c9c"
ORPHAN = "r20261128-080000-0dead0"
ORPHAN_CLUSTER = "gpucluster-local-0dead"
LOSSES = (1.62, 0.61, 0.32, 0.21)


def _cost(run_id: str, cloud: str, total: str, lines: list[tuple[str, str, str, int, str]]) -> dict:
    return {"run_id": run_id, "cloud": cloud, "currency": "USD", "total": total, "price_date": "2026-11-20",
            "notes": [], "still_billing": [],
            "lines": [{"resource": r, "category": c, "description": d, "billed_seconds": s, "cost": v}
                      for r, c, d, s, v in lines]}


def seed(home: Path, now: float | None = None) -> Ledger:
    """Write the runs into `home`'s ledger (GPUCLUSTER_HOME must name it); the ledger, open."""
    now = time.time() if now is None else now
    ledger = Ledger(home / "ledger.sqlite3")
    t0 = now - 3600
    logs = home / "runs" / DONE
    logs.mkdir(parents=True, exist_ok=True)
    for rank in (0, 1):
        (logs / f"node-{rank}.log").write_text(f"node {rank} starting\ntraining on digits\ndone\n")
    spec = ClusterSpec(cloud="local", nodes=2, name="gpucluster-local-7209").to_dict()
    ledger.create_run(DONE, cloud="local", cluster="gpucluster-local-7209", nodes=2, gpus_per_node=0,
                      command=["python", "-m", "gpucluster.workloads.digits"], spec=spec, workload="digits",
                      log_dir=str(logs), now=t0)
    steps = [("prepare", 0, 0.4), ("provision", 0.4, 1.0), ("rendezvous", 1.0, 4.2), ("train", 4.2, 16.0),
             ("outputs", 16.0, 16.6), ("teardown", 16.6, 17.3)]
    for name, start, end in steps:
        ledger.phase_start(DONE, name, now=t0 + start)
        ledger.phase_end(DONE, name, now=t0 + end)
    metrics = [(0, {"kind": "epoch", "epoch": i + 1, "step": 22 * (i + 1), "loss": loss, "accuracy": 0.80 + 0.04 * i,
                    "samples_per_s": 4800 + 100 * i, "time": t0 + 6 + 2.5 * i, "rank": 0})
               for i, loss in enumerate(LOSSES)]
    metrics += [(rank, {"kind": "util", "node_rank": rank, "time": t0 + 4 + 2 * i, "cpu_percent": 40.0 + 10 * rank + i,
                        "gpu": [{"index": 0, "util": 50.0 + 5 * i + rank}]}) for rank in (0, 1) for i in range(6)]
    ledger.add_metrics(DONE, metrics)
    for rank in (0, 1):
        ledger.record_node(DONE, rank, "127.0.0.1", 0, ["done"])
    ledger.record_outputs(DONE, [{"node_rank": rank, "path": str(home / "runs" / DONE / "outputs" / f"node-{rank}"),
                                  "files": 2, "bytes": 1_800_000, "seconds": 0.1, "verdict": "complete"}
                                 for rank in (0, 1)])
    ledger.finish_run(DONE, status="succeeded", exit_code=0, teardown="verified",
                      metrics={"accuracy": 0.92, "loss": LOSSES[-1], "epochs": len(LOSSES)}, now=t0 + 17.3)
    ledger.set_cost(DONE, {"run_id": DONE, "cloud": "local", "currency": "USD", "total": "0", "local": True,
                           "notes": ["local run: no rented cloud resources, $0"], "lines": [], "still_billing": []})
    for run_id, cloud, cluster, days, total, lines in (
            (AWS, "aws", "gpucluster-aws-3f9c", 3, "6.12",
             [("i-0a1", "compute", "g5.2xlarge on-demand", 3600, "1.212"), ("i-0a2", "compute", "g5.2xlarge on-demand",
                                                                            3600, "1.212"),
              ("vol-1", "storage", "gp3 100 GB", 3600, "0.02"), ("nat", "network", "public IPv4", 3600, "0.01")]),
            (GCP, "gcp", "gpucluster-gcp-77aa", 2, "3.40",
             [("pool", "compute", "n1-standard-8 + V100", 3600, "3.30"), ("gke", "cluster fee", "GKE", 3600, "0.10")])):
        made = now - days * 86400
        spec = ClusterSpec(cloud=cloud, nodes=2, name=cluster, region="us-east-1" if cloud == "aws" else "us-central1",
                           instance_type="g5.2xlarge" if cloud == "aws" else "n1-standard-8",
                           gpus_per_node=1).to_dict()
        ledger.create_run(run_id, cloud=cloud, cluster=cluster, nodes=2, gpus_per_node=1, command=["python", "train.py"],
                          spec=spec, now=made)
        ledger.phase_start(run_id, "provision", now=made)
        ledger.phase_end(run_id, "provision", now=made + 300)
        ledger.finish_run(run_id, status="succeeded", exit_code=0, teardown="verified", now=made + 3600)
        ledger.set_cost(run_id, _cost(run_id, cloud, total, lines))
    # a run whose process died (no owner lock) with a resource row open: an orphaned cluster
    spec = ClusterSpec(cloud="local", nodes=1, name=ORPHAN_CLUSTER).to_dict()
    ledger.create_run(ORPHAN, cloud="local", cluster=ORPHAN_CLUSTER, nodes=1, gpus_per_node=0, command=["python", "x.py"],
                      spec=spec, log_dir=str(home / "runs" / ORPHAN), now=now - 600)
    ledger.resource_requested(ORPHAN, "process", "node-0", now=now - 600)
    ledger.resource_created(ORPHAN, "process", "node-0", cloud_id="999999", now=now - 600)
    return ledger
