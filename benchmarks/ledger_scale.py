"""The ledger at scale: latency of `runs`, `show`, `cost report` and `status` with 100, 1,000 and
10,000 recorded runs.

    python benchmarks/ledger_scale.py [SIZES...]      (default: 100 1000 10000)

Each ledger is filled with runs shaped like real ones, written through the `Ledger` API: four
template runs (aws 2 x g5.xlarge, gcp 2 x n1-standard-8 + V100 on GKE, local, ssh), each with its
phases, nodes, 40 metric records (epochs, utilisation samples, a stage record), its resources with
lifetimes, its outputs, its price snapshot and its stored cost; then copied row for row (new ids,
one run every 10 minutes) to the wanted count. Every 20th run resumes the run before it (a
--resume chain); three aws runs keep a resource not confirmed gone (so `status` has clusters).

Each command is the installed CLI in a fresh process, as a user types it (`gpucluster runs`,
`runs --limit 1000 --json`, `show RUN`, `show RUN --json`, `cost report`, `cost report
--group-by chain`, `status`); the medians of REPEATS (default 5) wall times and CPU times (user +
system of the command's process) are printed per size, with the load average before and after.
`status` asks each cloud with a cluster still up whether its resources exist: without
credentials that is one quick local refusal per cluster (aws here), not a network round trip.
Not a test.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _util import BIN, median

REPEATS = int(os.environ.get("REPEATS", "5"))
T0 = 1_790_000_000.0
STEP = 600.0  # one run every 10 minutes
TABLES = {"phases": "run_id", "nodes": "run_id", "metrics": "run_id", "resources": "run_id", "outputs": "run_id"}


def _template(ledger, rid: str, cloud: str, now: float) -> None:
    """One finished run as the lifecycle records it (phases, nodes, metrics, resources, outputs, cost)."""
    from gpucluster.costing import cost as C
    from gpucluster.catalog.prices import load_catalog
    from gpucluster.spec import ClusterSpec
    from gpucluster.infra import registry

    backend = registry.plugin(cloud)
    catalog = load_catalog(False)
    if cloud == "aws":
        spec = ClusterSpec(cloud="aws", nodes=2, instance_type="g5.xlarge", name="bench-aws", region="us-east-1")
        res = [("instance", f"node-{i}", "us-east-1", {"instance_type": "g5.xlarge", "spot": False, "disk_gb": 100,
                                                       "disk_type": "gp3"}) for i in range(2)]
        res += [("security-group", "sg", "us-east-1", {}), ("key-pair", "kp", "us-east-1", {})]
    elif cloud == "gcp":
        spec = ClusterSpec(cloud="gcp", nodes=2, instance_type="n1-standard-8", gpus_per_node=1,
                           accelerator="nvidia-tesla-v100", zone="us-central1-a", name="bench-gcp")
        pool = {"machine_type": "n1-standard-8", "node_count": 2, "gpus_per_node": 1, "spot": False,
                "accelerator": "nvidia-tesla-v100", "disk_gb": 100, "disk_type": "pd-balanced"}
        res = [("gke-cluster", "c", "us-central1-a", {"zonal": True}), ("node-pool", "gpu", "us-central1-a", pool)]
    else:
        spec = ClusterSpec(cloud=cloud, nodes=2, name=f"bench-{cloud}",
                           hosts=("u@10.0.0.1", "u@10.0.0.2") if cloud == "ssh" else ())
        res = [("run-folder" if cloud == "ssh" else "process", f"node-{i}", None, {"host": f"10.0.0.{i + 1}"})
               for i in range(2)]
    prices = C.price_snapshot(spec, catalog, backend=backend, now=now)
    ledger.create_run(rid, cloud=cloud, cluster=spec.name, nodes=2, gpus_per_node=spec.gpus_per_node or 0,
                      command=["python", "train.py", "--epochs", "10"], spec=spec.to_dict(), workload=None,
                      prices=prices, log_dir=f"/home/u/.gpucluster/runs/{rid}", now=now)
    t = now
    for name, took in (("prepare", 1), ("provision", 120), ("ready", 30), ("stage", 5), ("rendezvous", 4),
                       ("train", 300), ("outputs", 3), ("teardown", 60)):
        ledger.phase_start(rid, name, now=t)
        t += took
        ledger.phase_end(rid, name, now=t)
    for kind, name, region, detail in res:
        ledger.resource_requested(rid, kind, name, region=region, detail=detail, now=now + 2)
        ledger.resource_created(rid, kind, name, cloud_id=f"id-{rid}-{name}", now=now + 60)
        ledger.resource_deleted(rid, kind, name, now=t)
    records = [(r, {"kind": "stage", "files": 100, "bytes": 100 << 20, "sent_bytes": 0, "seconds": 1.0})
               for r in range(2)]
    records += [(0, {"kind": "epoch", "rank": 0, "epoch": e, "loss": 1 / (e + 1), "accuracy": 0.9,
                     "samples_per_s": 1000.0, "time": now + e}) for e in range(10)]
    records += [(r, {"kind": "util", "cpu": 50.0, "gpus": [{"util": 90, "mem_used_mib": 9000}], "time": now + i})
                for i in range(14) for r in range(2)]
    ledger.add_metrics(rid, records)
    for r in range(2):
        ledger.record_node(rid, r, f"10.0.0.{r + 1}", 0, [f"epoch {e} done" for e in range(20)])
    ledger.record_outputs(rid, [{"node_rank": r, "path": f"/home/u/out/{rid}/node-{r}", "files": 3, "bytes": 1 << 20,
                                 "seconds": 0.5, "verdict": "complete", "detail": None} for r in range(2)])
    ledger.finish_run(rid, status="succeeded", exit_code=0, now=t,
                      metrics={"train_time_s": 300.0, "epochs": 10, "accuracy": 0.9, "loss": 0.1, "samples_per_s": 1000.0})
    ledger.set_teardown(rid, "verified", [])
    C.record_run_cost(ledger, rid, backend=backend, now=t + 1)


def fill(home: Path, count: int) -> str:
    """A ledger of `count` runs under `home`; returns the id of a run in the middle."""
    from gpucluster.ledger.store import Ledger

    ledger = Ledger(home / "ledger.sqlite3")
    clouds = ("aws", "gcp", "local", "ssh")
    templates = [f"tmpl-{c}" for c in clouds]
    for rid, cloud in zip(templates, clouds):
        _template(ledger, rid, cloud, T0)
    db = ledger._db  # the copies: row for row, in one transaction (the API would take 40 commits a run)
    rows = {t: db.execute("SELECT * FROM runs WHERE id = ?", (t,)).fetchone() for t in templates}
    children = {(table, t): db.execute(f"SELECT * FROM {table} WHERE run_id = ?", (t,)).fetchall()
                for table in TABLES for t in templates}
    ids = [f"r{time.strftime('%Y%m%d-%H%M%S', time.gmtime(T0 + i * STEP))}-{i:06x}" for i in range(count)]
    db.execute("BEGIN")
    for i, rid in enumerate(ids):
        t = templates[i % len(templates)]
        shift = i * STEP
        row = dict(rows[t])
        row.update(id=rid, created_at=row["created_at"] + shift, ended_at=row["ended_at"] + shift,
                   log_dir=row["log_dir"].replace(t, rid),
                   resumed_from=ids[i - 1] if i % 20 == 19 else None,
                   cost=row["cost"].replace(t, rid) if row["cost"] else None)
        db.execute(f"INSERT INTO runs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))
        for table in TABLES:
            for child in children[(table, t)]:
                c = dict(child)
                c["run_id"] = rid
                if table == "resources":
                    c.pop("id")
                    for k in ("requested_at", "created_at", "deleted_at"):
                        c[k] = c[k] + shift if c[k] is not None else None
                    if i in (count - 4, count - 8, count - 12) and t == "tmpl-aws" and c["kind"] == "instance":
                        c["deleted_at"], c["confirmed_gone"] = None, 0  # left behind: `status` lists it
                elif table == "outputs":
                    c["path"] = c["path"].replace(t, rid)
                elif table == "phases":
                    c["started_at"] += shift
                    c["ended_at"] += shift
                db.execute(f"INSERT INTO {table} ({', '.join(c)}) VALUES ({', '.join('?' * len(c))})", list(c.values()))
    for t in templates:
        for table in TABLES:
            db.execute(f"DELETE FROM {table} WHERE run_id = ?", (t,))
        db.execute("DELETE FROM runs WHERE id = ?", (t,))
    db.execute("COMMIT")
    ledger.close()
    return ids[count // 2]


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one command. On a machine shared with other
    work the CPU time is the steadier figure: wall time there is CPU time / the share of a core got."""
    c0, t0 = _children_cpu(), time.perf_counter()
    p = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took, cpu = time.perf_counter() - t0, _children_cpu() - c0
    assert p.returncode == 0, (argv, p.stderr[-2000:])
    return took, cpu


def main(sizes: list[int]) -> None:
    load0 = os.getloadavg()
    exe = str(BIN / "gpucluster")
    table: dict[str, list[float]] = {}
    for count in sizes:
        home = Path(tempfile.mkdtemp(prefix="gpucluster-bench-ledger-"))
        try:
            t0 = time.perf_counter()
            mid = fill(home, count)
            filled = time.perf_counter() - t0
            size_mb = (home / "ledger.sqlite3").stat().st_size / 1e6
            env = dict(os.environ, GPUCLUSTER_HOME=str(home), COLUMNS="200")
            cmds = {
                "runs": ["runs"], "runs --limit 1000 --json": ["runs", "--limit", "1000", "--json"],
                "show RUN": ["show", mid], "show RUN --json": ["show", mid, "--json"],
                "cost report": ["cost", "report"], "cost report --group-by chain": ["cost", "report", "--group-by", "chain"],
                "status": ["status"],
            }
            print(f"{count} runs (filled in {filled:.1f} s, {size_mb:.1f} MB):")
            for label, args in cmds.items():
                got = [timed([exe, *args], env) for _ in range(REPEATS)]
                times, cpus = [g[0] for g in got], [g[1] for g in got]
                table.setdefault(label, []).append((median(times), median(cpus)))
                print(f"  {label:32s} median {median(times):.3f} s (min {min(times):.3f}, max {max(times):.3f}); "
                      f"CPU median {median(cpus):.3f} s")
        finally:
            shutil.rmtree(home, ignore_errors=True)
    load1 = os.getloadavg()
    print(f"medians of {REPEATS} runs per command; load average {load0[0]:.1f} before, {load1[0]:.1f} after")
    print("wall s / CPU s".ljust(32) + "".join(f"{n:>16}" for n in sizes))
    for label, row in table.items():
        print(label.ljust(32) + "".join(f"{w:>8.2f}/{c:<7.2f}" for w, c in row))


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [100, 1000, 10000])
