"""`gpucluster run --resume RUN_ID`, checked before anything starts: RUN_ID must be a run in the
ledger whose outputs came back (its `outputs` rows, as the outputs phase recorded them: at least
one node's copy holds files, and the folder is still there). The new run gets that folder, all its
node-N subfolders, staged like a `--data` folder (local: used in place; ssh, aws: copied through
the nodes' data cache) to `resume/` in the job's working directory, as GPUCLUSTER_RESUME_DIR;
outputs that went to object storage are pulled by the new run's nodes themselves (same cloud). The
built-in workloads read `$GPUCLUSTER_RESUME_DIR/node-0/checkpoint.pt` (workloads/checkpoint.py);
a user's script reads what it saved there itself.
"""

from __future__ import annotations

import os
from typing import Any

from gpucluster.errors import UsageError
from gpucluster.watch.staging import RESUME_DEST, DataMount
from gpucluster.states import RunStatus


def resume_source(ledger: Any, value: str, store: Any = None, readers: Any = None) -> tuple[str, DataMount]:
    """(the full run id, the mount of its collected outputs), or UsageError (exit 2) naming the run.
    Outputs the nodes uploaded to object storage (`--output s3://...`, `gs://...`) are a mount of
    that URL (`PREFIX/RUN_ID`, holding every `node-N/`), which the new run's nodes pull themselves;
    only where the new run's backend (`store`) reads that scheme (`readers`, `staging.Readers`: the
    backends that do, named when it does not)."""
    text = (value or "").strip()
    if not text:
        raise UsageError("--resume '' is not allowed: give the id of an earlier run (see `gpucluster runs`)")
    run = ledger.get_run(text) if ledger is not None else None
    if run is None:
        raise UsageError(f"--resume {value!r}: no such run in the ledger; give the id of an earlier run whose "
                         "outputs came back (see `gpucluster runs`)")
    rid = run.id
    if run.run.status == RunStatus.RUNNING:
        raise UsageError(f"--resume {rid!r}: that run is still running (or died without finishing its row); "
                         "resume a run that has ended")
    rows = run.outputs
    kept = [o for o in rows if o.path and (o.files or 0) + (o.workdir_files or 0) > 0 and o.verdict != "failed"]
    if not kept:
        why = ("no outputs were collected for it" if not rows else
               "its outputs came back empty or failed: " + "; ".join(
                   f"node {o.node_rank} {o.verdict}, {o.files or 0} file(s)" for o in rows))
        raise UsageError(f"--resume {rid!r}: nothing to resume from: {why}; give a run whose outputs "
                         "(GPUCLUSTER_OUTPUT_DIR) came back")
    urls = [o.path for o in kept if "://" in str(o.path)]
    if urls:  # `--output s3://...`: the nodes uploaded, nothing came back to this machine
        from gpucluster.watch.staging import object_refusal

        base = urls[0].rsplit("/", 1)[0]
        refusal = object_refusal(f"--resume {rid!r}: its outputs went to object storage ({base}), and reading", base,
                                 store, readers)
        if refusal:
            raise UsageError(f"{refusal}; or give a run whose outputs came back to this machine")
        return rid, DataMount(store.object_url(base, f"--resume {rid!r}: its outputs' location {base!r}"), RESUME_DEST)
    folder = os.path.dirname(os.path.abspath(kept[0].path))
    if not os.path.isdir(folder) or not any(os.path.isdir(o.path) for o in kept):
        raise UsageError(f"--resume {rid!r}: its outputs folder {folder} is gone from this machine; "
                         "give a run whose outputs are still there")
    return rid, DataMount(folder, RESUME_DEST)


def resume_files(ledger: Any, run_id: str, mount: DataMount) -> tuple[str, str] | None:
    """Which node's working-folder files the new run lays back into every node's working folder
    (`OUTPUTS/workdir/node-K`, as the resumed run's outputs phase copied them): the node that held
    global rank 0 (its `worker_start` record), else the copy holding the newest file. (folder
    relative to the resumed outputs, why it was chosen), or None when no working folder came back."""
    from gpucluster.watch.outputs import WORKDIR

    if "://" in mount.src:
        return None
    base = os.path.join(mount.src, WORKDIR)
    nodes = sorted(int(n.split("-", 1)[1]) for n in (os.listdir(base) if os.path.isdir(base) else ())
                   if n.startswith("node-") and n[5:].isdigit())
    if not nodes:
        return None
    starts = ledger.metrics(run_id, kind="worker_start") if ledger is not None else []
    head = next((r.get("node_rank") for r in starts if r.get("rank") == 0), None)
    if head in nodes:
        return f"{WORKDIR}/node-{head}", f"node {head}, which held global rank 0"

    def newest(n: int) -> float:
        times = [os.stat(os.path.join(r, f)).st_mtime for r, _, fs in os.walk(os.path.join(base, f"node-{n}"))
                 for f in fs]
        return max(times, default=0.0)

    pick = max(nodes, key=newest)
    return f"{WORKDIR}/node-{pick}", f"node {pick}, the newest copy (which node held global rank 0 is not recorded)"


def check_dest_free(mounts: tuple[DataMount, ...]) -> None:
    """--resume's DEST (`resume`) may not be, or overlap, a --data DEST."""
    for m in mounts:
        if m.dest == RESUME_DEST or m.dest.startswith(RESUME_DEST + "/"):
            raise UsageError(f"--data {m.spec!r}: DEST {m.dest!r} is where --resume stages the resumed run's "
                             f"outputs ({RESUME_DEST}/); give the --data folder another DEST (SRC:DEST)")
