"""Checkpoints of the built-in workloads: saved after every epoch (and every --checkpoint-every
steps, and on SIGTERM, and when a collective fails because a peer went away), loaded by a resumed
run. torch + standard library only (shipped with the workloads folder).

Save: when GPUCLUSTER_OUTPUT_DIR is set, local rank 0 of EVERY node writes
`$GPUCLUSTER_OUTPUT_DIR/checkpoint.pt` (a temporary file, then os.replace, so a run stopped
mid-save leaves the previous checkpoint whole), then `checkpoint.json` beside it (epoch, batch,
step: where training is). Every rank holds the same weights and optimizer state after each step
(gradients are all-reduced before it), so every node's copy is the same checkpoint: a node that is
lost (and its output folder with it) loses no checkpoint while another node's copy comes back.

Where: `epoch` epochs are complete and `batch` batches of the next one are done (0 at an epoch's
end); a resume skips those batches of that epoch, in the same order (the shard of an epoch
depends only on the seed, the epoch and the ranks).

Load: `gpucluster run --resume RUN_ID` (and the recovery loop) stages RUN_ID's collected outputs
(node-0/, node-1/, ...) on every node and sets GPUCLUSTER_RESUME_DIR to them; every rank reads the
NEWEST whole checkpoint among `$GPUCLUSTER_RESUME_DIR/node-*/` (or `$GPUCLUSTER_RESUME_DIR/`, when
the variable names one node's folder) and the run continues from where it holds. A checkpoint
that is missing, unreadable or from another workload ends the run with one line: a resumed run
never starts from scratch silently.
"""

from __future__ import annotations

import glob
import json
import math
import os
import signal
import sys
from typing import Any, Callable

import torch

NAME = "checkpoint.pt"
WHERE = "checkpoint.json"  # beside it: {"epoch", "batch", "step", "workload"}, written after it
OUTPUT_ENV, RESUME_ENV = "GPUCLUSTER_OUTPUT_DIR", "GPUCLUSTER_RESUME_DIR"
VERSION = 1


class ResumeError(SystemExit):
    """A resume that cannot continue: one line on stderr, exit code 1 (every rank says the same)."""

    def __init__(self, workload: str, text: str):
        super().__init__(f"{workload}: cannot resume: {text}")


def is_saver(node_rank: int, local_rank: int) -> bool:
    """Local rank 0 of every node (each node keeps a copy), when there is an output folder."""
    return local_rank == 0 and bool(os.environ.get(OUTPUT_ENV))


def save(node_rank: int, local_rank: int, *, workload: str, epoch: int, step: int, model: torch.nn.Module,
         opt: torch.optim.Optimizer, sched: Any = None, batch: int = 0, **extra: Any) -> str | None:
    """Write the checkpoint (atomically) when this process is a saver; its path, else None."""
    if not is_saver(node_rank, local_rank):
        return None
    state = {"version": VERSION, "workload": workload, "epoch": int(epoch), "step": int(step), "batch": int(batch),
             "model": model.state_dict(), "optimizer": opt.state_dict(),
             "scheduler": sched.state_dict() if sched is not None else None,
             "rng": torch.get_rng_state(), **extra}
    return write(state)


def write(state: dict) -> str:
    folder = os.environ[OUTPUT_ENV]
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, NAME)
    tmp = f"{path}.tmp-{os.getpid()}"
    torch.save(state, tmp)
    os.replace(tmp, path)
    where = {k: state.get(k) for k in ("workload", "epoch", "batch", "step")}
    with open(f"{path}.json.tmp-{os.getpid()}", "w") as f:
        json.dump(where, f)
    os.replace(f"{path}.json.tmp-{os.getpid()}", os.path.join(folder, WHERE))
    return path


def candidates(resume_dir: str) -> list[str]:
    """Every checkpoint in the folder (each node's copy, or the folder's own), newest first by the
    step its `checkpoint.json` says; copies without one (older gpucluster) after, node-0 first."""
    found: list[tuple[int, int, str]] = []
    for path in [*sorted(glob.glob(os.path.join(resume_dir, "node-*", NAME))), os.path.join(resume_dir, NAME)]:
        if not os.path.isfile(path):
            continue
        try:
            with open(os.path.join(os.path.dirname(path), WHERE)) as f:
                step = int(json.load(f)["step"])
        except (OSError, ValueError, KeyError, TypeError):
            step = -1 if os.path.basename(os.path.dirname(path)) == "node-0" else -2
        found.append((-step, len(found), path))
    return [p for _, _, p in sorted(found)]


def find(resume_dir: str) -> str | None:
    got = candidates(resume_dir)
    return got[0] if got else None


def load(workload: str) -> tuple[str, dict] | None:
    """(path, state) of the checkpoint in GPUCLUSTER_RESUME_DIR; None when the variable is unset.
    ResumeError (one line) when it is set and no whole checkpoint of this workload is there."""
    resume_dir = os.environ.get(RESUME_ENV)
    if not resume_dir:
        return None
    if not os.path.isdir(resume_dir):
        raise ResumeError(workload, f"{RESUME_ENV}={resume_dir} is not a folder")
    paths = candidates(resume_dir)
    if not paths:
        raise ResumeError(workload, f"no {NAME} in {resume_dir}/node-N (nor in {resume_dir}): no checkpoint was "
                                    "saved there (did the run finish an epoch?)")
    for path in paths:  # the newest whole copy: a copy cut short on a lost node is passed over
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            break
        except Exception as exc:  # noqa: BLE001 - a cut or damaged file, whatever torch says about it
            why = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
            if path == paths[-1]:
                raise ResumeError(workload, f"{path} cannot be read ({why})") from None
    if not isinstance(state, dict) or not {"epoch", "step", "model", "optimizer"} <= set(state):
        raise ResumeError(workload, f"{path} is not a gpucluster checkpoint (epoch, step, model, optimizer)")
    if state.get("workload") != workload:
        raise ResumeError(workload, f"{path} is a checkpoint of workload {state.get('workload')!r}, "
                                    f"not {workload!r}: resume with --workload {state.get('workload')}")
    return path, state


def restore(workload: str, path: str, state: dict, model: torch.nn.Module, opt: torch.optim.Optimizer,
            sched: Any = None, epochs: int | None = None) -> None:
    """Load the state into the model, optimizer and scheduler (ResumeError when it does not fit).
    A cosine schedule is stretched to this run's `epochs`: it goes on from the epoch reached."""
    try:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        if sched is not None and state.get("scheduler"):
            sched.load_state_dict(state["scheduler"])
    except (RuntimeError, ValueError, KeyError) as exc:
        why = str(exc).strip().splitlines()[0][:200]
        raise ResumeError(workload, f"{path} does not fit this model ({why})") from None
    if isinstance(state.get("rng"), torch.Tensor):
        torch.set_rng_state(state["rng"])
    if sched is not None and epochs and hasattr(sched, "T_max"):
        sched.T_max = max(1, epochs)
        lrs = [sched.eta_min + (base - sched.eta_min) * (1 + math.cos(math.pi * sched.last_epoch / sched.T_max)) / 2
               for base in sched.base_lrs]
        for group, lr in zip(opt.param_groups, lrs):
            group["lr"] = lr
        sched._last_lr = lrs


class Keeper:
    """When a built-in workload saves: after every epoch (`epoch_end`), every `every` optimizer
    steps, on SIGTERM (at the next consistent point, then the process exits 143), and once more
    when the training loop fails (`failed`: a collective broke because a peer went away) if the
    state is still the last consistent one.

    The loop tells it each consistent point with `at(epoch, batch, step, **extra)`: after an
    optimizer step (`batch` batches of epoch `epoch + 1` done) or after an epoch's scheduler step
    (`batch` 0). Between `dirty()` (before the optimizer or scheduler change the state) and the
    next `at`, nothing is saved on failure: a half-made update is never written."""

    def __init__(self, save_fn: Callable[..., str | None], every: int = 0, announce: Callable[..., None] | None = None):
        self.save_fn, self.every, self.announce = save_fn, max(0, int(every or 0)), announce
        self.pos: tuple[int, int, int] | None = None
        self.extra: dict[str, Any] = {}
        self.saved: tuple[int, int, int] | None = None
        self.clean = False
        self.stop_asked = False
        if sys.platform != "win32":
            try:
                signal.signal(signal.SIGTERM, self._on_term)
            except ValueError:  # not the main thread (an in-process test): no handler
                pass

    def _on_term(self, signum: int, frame: Any) -> None:
        self.stop_asked = True

    def dirty(self) -> None:
        self.clean = False

    def at(self, epoch: int, batch: int, step: int, **extra: Any) -> None:
        self.pos, self.extra, self.clean = (int(epoch), int(batch), int(step)), extra, True
        if self.stop_asked:
            self.save("sigterm")
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(128 + signal.SIGTERM)  # what SIGTERM would have ended it with; no library shutdown
        if batch and self.every and step % self.every == 0:
            self.save("every")

    def epoch_end(self, epoch: int, step: int, **extra: Any) -> None:
        self.pos, self.clean = (int(epoch), 0, int(step)), True
        self.extra.update(extra)
        self.save("epoch")

    def failed(self) -> None:
        """The loop is failing: save the last consistent state unless it is saved already."""
        if self.clean and self.pos is not None and self.pos != self.saved:
            try:
                self.save("failure")
            except Exception:  # noqa: BLE001 - the failure that brought us here is the one to report
                pass

    def save(self, reason: str) -> None:
        if self.pos is None:
            return
        epoch, batch, step = self.pos
        self.save_fn(epoch=epoch, batch=batch, step=step, reason=reason, **self.extra)
        self.saved = self.pos
