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
from typing import TYPE_CHECKING

from gpucluster.errors import UsageError
from gpucluster.watch.staging import RESUME_DEST, DataMount
from gpucluster.states import RunStatus

if TYPE_CHECKING:
    from gpucluster.infra.contract import Plugin
    from gpucluster.ledger.records import OutputRow, RunRecord
    from gpucluster.ledger.store import Ledger
    from gpucluster.watch.staging import Readers


def _resumable(ledger: Ledger | None, value: str) -> tuple[str, RunRecord]:
    """The run `value` names (its full id and record): in the ledger, and ended."""
    text = (value or "").strip()
    if not text:
        raise UsageError("--resume '' is not allowed: give the id of an earlier run (see `gpucluster runs`)")
    run = ledger.get_run(text) if ledger is not None else None
    if run is None or run.id is None:  # a stored run always has its id
        raise UsageError(f"--resume {value!r}: no such run in the ledger; give the id of an earlier run whose "
                         "outputs came back (see `gpucluster runs`)")
    rid = run.id
    if run.run.status == RunStatus.RUNNING:
        raise UsageError(f"--resume {rid!r}: that run is still running (or died without finishing its row); "
                         "resume a run that has ended")
    return rid, run


def _kept(rid: str, rows: list[OutputRow]) -> list[tuple[OutputRow, str]]:
    """The outputs that came back holding files (each with its path), or UsageError saying why none did."""
    kept = [(o, o.path) for o in rows if o.path and (o.files or 0) + (o.workdir_files or 0) > 0
            and o.verdict != "failed"]
    if not kept:
        why = ("no outputs were collected for it" if not rows else
               "its outputs came back empty or failed: " + "; ".join(
                   f"node {o.node_rank} {o.verdict}, {o.files or 0} file(s)" for o in rows))
        raise UsageError(f"--resume {rid!r}: nothing to resume from: {why}; give a run whose outputs "
                         "(GPUCLUSTER_OUTPUT_DIR) came back")
    return kept


def _object_mount(rid: str, url: str, store: Plugin | None, readers: Readers | None) -> DataMount:
    """`--output s3://...`: the nodes uploaded, nothing came back to this machine; the new run's nodes pull it."""
    from gpucluster.watch.staging import object_refusal

    base = url.rsplit("/", 1)[0]
    refusal = object_refusal(f"--resume {rid!r}: its outputs went to object storage ({base}), and reading", base,
                             store, readers)
    if refusal:
        raise UsageError(f"{refusal}; or give a run whose outputs came back to this machine")
    if store is None:  # a URL object_refusal does not know, and no backend to read it (was an AttributeError)
        raise UsageError(f"--resume {rid!r}: its outputs went to {base}, which no backend reads here; give a run "
                         "whose outputs came back to this machine")
    return DataMount(store.object_url(base, f"--resume {rid!r}: its outputs' location {base!r}"), RESUME_DEST)


def resume_source(ledger: Ledger | None, value: str, store: Plugin | None = None,
                  readers: Readers | None = None) -> tuple[str, DataMount]:
    """(the full run id, the mount of its collected outputs), or UsageError (exit 2) naming the run.
    Outputs the nodes uploaded to object storage (`--output s3://...`, `gs://...`) are a mount of
    that URL (`PREFIX/RUN_ID`, holding every `node-N/`), which the new run's nodes pull themselves;
    only where the new run's backend (`store`) reads that scheme (`readers`, `staging.Readers`: the
    backends that do, named when it does not)."""
    rid, run = _resumable(ledger, value)
    kept = _kept(rid, run.outputs)
    urls = [path for _, path in kept if "://" in path]
    if urls:
        return rid, _object_mount(rid, urls[0], store, readers)
    folder = os.path.dirname(os.path.abspath(kept[0][1]))
    if not os.path.isdir(folder) or not any(os.path.isdir(path) for _, path in kept):
        raise UsageError(f"--resume {rid!r}: its outputs folder {folder} is gone from this machine; "
                         "give a run whose outputs are still there")
    return rid, DataMount(folder, RESUME_DEST)


def resume_files(ledger: Ledger | None, run_id: str, mount: DataMount) -> tuple[str, str] | None:
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
