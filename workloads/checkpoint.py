"""Checkpoints of the built-in workloads: saved after every epoch, loaded by a resumed run.
torch + standard library only (shipped with the workloads folder).

Save: after every epoch, when GPUCLUSTER_OUTPUT_DIR is set, the process with node rank 0 and
local rank 0 writes `$GPUCLUSTER_OUTPUT_DIR/checkpoint.pt` (a temporary file, then os.replace, so
a run stopped mid-save leaves the previous epoch's checkpoint whole). Every rank holds the same
weights and optimizer state (gradients are all-reduced before each step), so any rank could save;
node 0 is chosen so the file is always in the node-0 folder of the run's outputs (global rank 0
may be on any node: torchrun's c10d rendezvous orders ranks by address and pid).

Load: `gpucluster run --resume RUN_ID` stages RUN_ID's collected outputs (node-0/, node-1/, ...)
on every node and sets GPUCLUSTER_RESUME_DIR to them; every rank reads
`$GPUCLUSTER_RESUME_DIR/node-0/checkpoint.pt` (or `$GPUCLUSTER_RESUME_DIR/checkpoint.pt`, when the
variable names one node's folder) and the run continues after the epoch it holds. A checkpoint
that is missing, unreadable or from another workload ends the run with one line: a resumed run
never starts from scratch silently.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

NAME = "checkpoint.pt"
OUTPUT_ENV, RESUME_ENV = "GPUCLUSTER_OUTPUT_DIR", "GPUCLUSTER_RESUME_DIR"
VERSION = 1


class ResumeError(SystemExit):
    """A resume that cannot continue: one line on stderr, exit code 1 (every rank says the same)."""

    def __init__(self, workload: str, text: str):
        super().__init__(f"{workload}: cannot resume: {text}")


def is_saver(node_rank: int, local_rank: int) -> bool:
    return node_rank == 0 and local_rank == 0 and bool(os.environ.get(OUTPUT_ENV))


def save(node_rank: int, local_rank: int, *, workload: str, epoch: int, step: int, model: torch.nn.Module,
         opt: torch.optim.Optimizer, sched: Any = None, **extra: Any) -> str | None:
    """Write the checkpoint (atomically) when this process is the saver; its path, else None."""
    if not is_saver(node_rank, local_rank):
        return None
    state = {"version": VERSION, "workload": workload, "epoch": int(epoch), "step": int(step),
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
    return path


def find(resume_dir: str) -> str | None:
    for path in (os.path.join(resume_dir, "node-0", NAME), os.path.join(resume_dir, NAME)):
        if os.path.isfile(path):
            return path
    return None


def load(workload: str) -> tuple[str, dict] | None:
    """(path, state) of the checkpoint in GPUCLUSTER_RESUME_DIR; None when the variable is unset.
    ResumeError (one line) when it is set and no whole checkpoint of this workload is there."""
    resume_dir = os.environ.get(RESUME_ENV)
    if not resume_dir:
        return None
    if not os.path.isdir(resume_dir):
        raise ResumeError(workload, f"{RESUME_ENV}={resume_dir} is not a folder")
    path = find(resume_dir)
    if path is None:
        raise ResumeError(workload, f"no {NAME} in {resume_dir}/node-0 (nor in {resume_dir}): no checkpoint was "
                                    "saved there (did the run finish an epoch?)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a cut or damaged file, whatever torch says about it
        why = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
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
