"""The metrics line protocol shared by workloads and the controller (standard library only).

A workload prints one JSON object per line behind PREFIX on stdout. Every backend streams node
logs through the same parser (`gpucluster.watch.metrics.parse_line`), so a metric means the same thing
whether it came from a local process, an ssh host or a Kubernetes pod.

Record kinds (all carry "kind", "rank" and "time", a Unix timestamp):
- "start":  world_size, backend, device, global_batch, lr, workload, args; resumed_from_epoch and
            resumed_from (the checkpoint's path) when GPUCLUSTER_RESUME_DIR gave a checkpoint
- "epoch":  epoch, step, loss, accuracy (test accuracy, all ranks aggregated), samples_per_s
            (global), epoch_time_s, plus timing splits where measured: compute_s, comm_s, data_s
- "step":   epoch, step, loss (sparse progress, e.g. every N steps on rank 0)
- "checkpoint": epoch, step, bytes, seconds (the process that saved $GPUCLUSTER_OUTPUT_DIR/checkpoint.pt)
- "util":   node_rank, gpu (list of {index, util, mem_used_mib, mem_total_mib, power_w}), cpu_percent,
            cpu_scope ("node": the node's own processes, also as cpu_cores; "machine": the whole machine)
- "final":  written by EVERY rank before destroy_process_group(): epochs, loss, accuracy,
            train_time_s, samples_per_s, samples_seen (this rank), ok
"""

from __future__ import annotations

import json
import sys
import time

PREFIX = "@gpucluster-metric "


def emit(kind: str, stream=None, **fields) -> None:
    record = {"kind": kind, "time": round(time.time(), 3)}
    record.update(fields)
    out = stream or sys.stdout
    out.write(PREFIX + json.dumps(record, separators=(",", ":"), default=float) + "\n")
    out.flush()
