"""What every built-in workload shares: process group set-up, sharding, explicit gradient
all-reduce with timing, all-reduced evaluation, metric records. torch + standard library only.

Data parallelism is done by hand rather than with DDP so that each step's time splits honestly
into data (fetching the batch), compute (forward + backward + optimizer) and comm (the gradient
all-reduce): the sweep's diagnosis reads those splits. Gradients are flattened into one buffer and
all-reduced once per step (what DDP's buckets do, without the overlap).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

try:  # run as gpucluster.workloads.<name>
    from gpucluster.workloads import args as _args
    from gpucluster.workloads import checkpoint
    from gpucluster.workloads.protocol import emit
    from gpucluster.workloads.sampler import Sampler, interval_from_env
except ImportError:  # run as a script from a shipped copy of this folder
    import args as _args  # type: ignore[no-redef, import-not-found]
    import checkpoint  # type: ignore[no-redef, import-not-found]
    from protocol import emit  # type: ignore[no-redef, import-not-found]
    from sampler import Sampler, interval_from_env  # type: ignore[no-redef, import-not-found]


@dataclass
class Ctx:
    rank: int
    world_size: int
    local_rank: int
    node_rank: int
    device: torch.device
    backend: str | None  # None: single process, no process group

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def base_parser(description: str, *, epochs: int, batch: int, lr: float) -> argparse.ArgumentParser:
    """The options every built-in workload takes (defined torch-free in args.py)."""
    return _args.base_parser(description, epochs=epochs, batch=batch, lr=lr)


def setup(args: argparse.Namespace) -> Ctx:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    node_rank = int(os.environ.get("GPUCLUSTER_NODE_RANK", os.environ.get("GROUP_RANK", "0")))
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit():
        torch.set_num_threads(int(threads))
    use_cuda = torch.cuda.is_available() and not args.cpu
    if use_cuda:
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    backend = None
    if world > 1 or "MASTER_ADDR" in os.environ:
        backend = args.backend or ("nccl" if use_cuda else "gloo")
        if use_cuda and backend == "nccl":
            dist.init_process_group(backend, device_id=device)
        else:
            dist.init_process_group(backend)
        world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(args.seed)
    return Ctx(rank, world, local_rank, node_rank, device, backend)


def scaled_lr(args: argparse.Namespace, ctx: Ctx) -> float:
    return args.lr * (args.batch_size * ctx.world_size) / 64.0


def shard(n: int, ctx: Ctx, *, epoch: int, seed: int, no_shard: bool = False) -> torch.Tensor:
    """This rank's sample indices for an epoch: one shared permutation, cut into equal slices.

    Every rank gets the same number of samples (the tail that does not divide is dropped for the
    epoch, like DistributedSampler(drop_last=True)), so every rank runs the same number of steps
    and no collective waits for a rank that has finished. `set_epoch` is the `epoch` argument.
    """
    g = torch.Generator().manual_seed(seed + epoch)
    perm = torch.randperm(n, generator=g)
    if no_shard or ctx.world_size == 1:
        return perm
    per_rank = n // ctx.world_size
    return perm[ctx.rank * per_rank:(ctx.rank + 1) * per_rank]


class GradSync:
    """All-reduce averaged gradients in one flat buffer, timed."""

    def __init__(self, model: torch.nn.Module, ctx: Ctx):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.ctx = ctx

    def __call__(self) -> float:
        if self.ctx.backend is None:
            return 0.0
        grads = [p.grad for p in self.params if p.grad is not None]
        if len(grads) != len(self.params):  # every rank must send the same buffer
            raise RuntimeError("a trainable parameter got no gradient in this step")
        flat = torch.cat([g.reshape(-1) for g in grads])
        sync(self.ctx)
        t0 = time.perf_counter()
        dist.all_reduce(flat)
        sync(self.ctx)
        elapsed = time.perf_counter() - t0
        flat /= self.ctx.world_size
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset:offset + n].view_as(g))
            offset += n
        return elapsed


def broadcast_params(model: torch.nn.Module, ctx: Ctx) -> None:
    """Start every rank from rank 0's weights."""
    if ctx.backend is None:
        return
    for p in model.parameters():
        dist.broadcast(p.data, src=0)


def sync(ctx: Ctx) -> None:
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)


@torch.no_grad()
def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, ctx: Ctx, batch: int = 1000) -> tuple[float, float]:
    """Test loss and accuracy over the WHOLE test set: each rank scores its slice, then the
    counts (correct, seen, loss sum) are all-reduced. No shard is divided by the full size."""
    model.eval()
    n = x.shape[0]
    per = (n + ctx.world_size - 1) // ctx.world_size
    lo, hi = ctx.rank * per, min(n, (ctx.rank + 1) * per)
    totals = torch.zeros(3, dtype=torch.float64, device=ctx.device)
    for i in range(lo, hi, batch):
        xb, yb = x[i:min(hi, i + batch)].to(ctx.device), y[i:min(hi, i + batch)].to(ctx.device)
        out = model(xb)
        totals[0] += (out.argmax(1) == yb).sum()
        totals[1] += yb.numel()
        totals[2] += torch.nn.functional.cross_entropy(out, yb, reduction="sum")
    if ctx.backend is not None:
        dist.all_reduce(totals)
    model.train()
    seen = max(1.0, totals[1].item())
    return totals[2].item() / seen, totals[0].item() / seen


def mean_across_ranks(value: float, ctx: Ctx) -> float:
    if ctx.backend is None:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t)
    return t.item() / ctx.world_size


def start_sampler(ctx: Ctx) -> "Sampler | None":
    """Utilisation records on local rank 0 while training (GPUCLUSTER_UTIL_INTERVAL=0: off)."""
    interval = interval_from_env()
    if ctx.local_rank != 0 or interval <= 0:
        return None
    # the node's own processes: this worker's torchrun agent (its parent) and everything under it
    return Sampler(node_rank=ctx.node_rank, interval=interval, root_pid=os.getppid()).start()


def save_checkpoint(ctx: Ctx, reason: str = "epoch", **state) -> None:
    """The checkpoint (see checkpoint.py; every node's local rank 0 writes it, when
    GPUCLUSTER_OUTPUT_DIR is set) and a `checkpoint` record saying where it is (epoch, batch, step)
    and why it was written (epoch, every, sigterm, failure)."""
    t0 = time.perf_counter()
    path = checkpoint.save(ctx.node_rank, ctx.local_rank, **state)
    if path:
        emit("checkpoint", rank=ctx.rank, node_rank=ctx.node_rank, epoch=state["epoch"], batch=state.get("batch", 0),
             step=state["step"], reason=reason, bytes=os.path.getsize(path), seconds=round(time.perf_counter() - t0, 4))


def keeper(ctx: Ctx, args: argparse.Namespace, **objects) -> checkpoint.Keeper:
    """When this process saves (checkpoint.Keeper): per epoch, --checkpoint-every, SIGTERM, failure."""
    return checkpoint.Keeper(lambda **where: save_checkpoint(ctx, **objects, **where),
                             every=getattr(args, "checkpoint_every", 0))


def resumed_fields(first: int, skip: int, step: int, path: str) -> dict:
    """The `start` record's account of a resume: the epoch it continues after (and the batches of
    the next one already done), the step, the checkpoint."""
    out = dict(resumed_from_epoch=first - 1, resumed_from_step=step, resumed_from=path)
    if skip:
        out["resumed_from_batch"] = skip
    return out


def train_classifier(model: torch.nn.Module, data: tuple, args: argparse.Namespace, ctx: Ctx, *,
                     workload: str, step_every: int = 0) -> dict:
    """The shared training loop of the classifier workloads (digits, mnist)."""
    x_train, y_train, x_test, y_test = data
    model.to(ctx.device)
    broadcast_params(model, ctx)
    lr = scaled_lr(args, ctx)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, args.epochs))
    sync_grads = GradSync(model, ctx)
    resumed = checkpoint.load(workload)  # GPUCLUSTER_RESUME_DIR: every rank continues from the same state
    first = 1
    step = skip = 0
    loss_v = float("nan")
    acc = 0.0
    partial = (0.0, 0)  # the loss sum and batches of an epoch a checkpoint was taken in the middle of
    if resumed:
        path, state = resumed
        checkpoint.restore(workload, path, state, model, opt, sched, epochs=args.epochs)
        first = state["epoch"] + 1
        step, skip = state["step"], int(state.get("batch") or 0)
        loss_v, acc = state.get("loss", loss_v), state.get("accuracy", acc)
        partial = (float(state.get("epoch_loss_sum") or 0.0), int(state.get("epoch_batches") or 0))
    if ctx.device.type == "cuda":  # keep the (small) data sets on the GPU: no loader in the way
        x_train, y_train = x_train.to(ctx.device), y_train.to(ctx.device)
    start_fields = dict(world_size=ctx.world_size, backend=ctx.backend or "none", device=str(ctx.device),
                        global_batch=args.batch_size * ctx.world_size, lr=lr, workload=workload,
                        node_rank=ctx.node_rank, train_samples=int(x_train.shape[0]))
    if resumed:
        start_fields.update(resumed_fields(first, skip, step, resumed[0]))
    if ctx.is_main:
        emit("start", rank=ctx.rank, **start_fields)
        if first > args.epochs:
            print(f"{workload}: the checkpoint is at epoch {first - 1}, --epochs is {args.epochs}: "
                  "nothing left to train", flush=True)
    if resumed and first > args.epochs:  # carried forward, so a resume of this run finds it too
        save_checkpoint(ctx, workload=workload, epoch=first - 1, step=step, model=model, opt=opt, sched=sched,
                        loss=loss_v, accuracy=acc)
    keep = keeper(ctx, args, workload=workload, model=model, opt=opt, sched=sched)
    try:
        return _classifier_epochs(model, (x_train, y_train, x_test, y_test), args, ctx, keep, opt, sched, sync_grads,
                                  first=first, step=step, skip=skip, partial=partial, loss_v=loss_v, acc=acc,
                                  step_every=step_every)
    except Exception:  # a collective broke (a peer went away): the last consistent state is saved first
        if ctx.backend is not None:
            keep.failed()
        raise


def _classifier_epochs(model: torch.nn.Module, data: tuple, args: argparse.Namespace, ctx: Ctx,
                       keep: checkpoint.Keeper, opt: torch.optim.Optimizer,
                       sched: torch.optim.lr_scheduler.LRScheduler, sync_grads: GradSync, *,
                       first: int, step: int, skip: int, partial: tuple, loss_v: float, acc: float,
                       step_every: int) -> dict:
    x_train, y_train, x_test, y_test = data
    sampler = start_sampler(ctx)
    seen = 0
    train_time = 0.0
    for epoch in range(first, args.epochs + 1):
        idx = shard(x_train.shape[0], ctx, epoch=epoch, seed=args.seed, no_shard=args.no_shard)
        sync(ctx)
        t_epoch = time.perf_counter()
        data_s = compute_s = comm_s = 0.0
        step_times = []
        loss_sum, batches = partial if epoch == first else (0.0, 0)
        done = skip if epoch == first else 0  # batches of this epoch a mid-epoch checkpoint already holds
        for i in range(done * args.batch_size, idx.numel() - args.batch_size + 1, args.batch_size):
            t0 = time.perf_counter()
            b = idx[i:i + args.batch_size]
            xb, yb = x_train[b.to(x_train.device)].to(ctx.device), y_train[b.to(y_train.device)].to(ctx.device)
            sync(ctx)
            t1 = time.perf_counter()
            opt.zero_grad(set_to_none=False)
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            sync(ctx)
            t2 = time.perf_counter()
            comm = sync_grads()
            t3 = time.perf_counter()
            keep.dirty()
            opt.step()
            sync(ctx)
            t4 = time.perf_counter()
            data_s += t1 - t0
            compute_s += (t2 - t1) + (t4 - t3)
            comm_s += comm
            step_times.append(t4 - t0)
            loss_sum += loss.item()
            batches += 1
            step += 1
            seen += yb.numel()
            if step_every and ctx.is_main and step % step_every == 0:
                emit("step", rank=ctx.rank, epoch=epoch, step=step, loss=round(loss.item(), 5))
            keep.at(epoch - 1, i // args.batch_size + 1, step, loss=loss_v, accuracy=acc, epoch_loss_sum=loss_sum,
                    epoch_batches=batches)
        keep.dirty()
        sched.step()
        keep.at(epoch, 0, step, loss=loss_v, accuracy=acc)
        epoch_time = time.perf_counter() - t_epoch
        train_time += epoch_time
        loss_v = mean_across_ranks(loss_sum / max(1, batches), ctx)
        test_loss, acc = evaluate(model, x_test, y_test, ctx)
        global_samples = batches * args.batch_size * ctx.world_size
        timing = step_timing(step_times, data_s, compute_s, comm_s, ctx)
        if ctx.is_main:
            emit("epoch", rank=ctx.rank, epoch=epoch, step=step, loss=round(loss_v, 5),
                 test_loss=round(test_loss, 5), accuracy=round(acc, 5),
                 samples_per_s=round(global_samples / epoch_time, 2), epoch_time_s=round(epoch_time, 4),
                 **timing)
        keep.epoch_end(epoch, step, loss=loss_v, accuracy=acc)
    if sampler:
        sampler.stop()
    return dict(epochs=args.epochs, loss=round(loss_v, 5), accuracy=round(acc, 5),
                train_time_s=round(train_time, 4), samples_seen=seen,
                samples_per_s=round(seen * ctx.world_size / train_time, 2) if train_time > 0 else None)


def step_timing(step_times: list[float], data_s: float, compute_s: float, comm_s: float, ctx: Ctx) -> dict:
    """Per-epoch timing splits, plus every rank's p90 step time (to spot stragglers)."""
    p90 = sorted(step_times)[int(0.9 * (len(step_times) - 1))] if step_times else 0.0
    out: dict[str, Any] = dict(data_s=round(data_s, 4), compute_s=round(compute_s, 4), comm_s=round(comm_s, 4))
    if ctx.backend is not None:
        gathered: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(gathered, round(p90, 5))
        out["step_p90_s"] = gathered
    else:
        out["step_p90_s"] = [round(p90, 5)]
    return out


def finish(ctx: Ctx, result: dict) -> None:
    """Every rank writes its final record, then the process group is torn down and a distributed
    rank exits at once (exit code 0), skipping the interpreter's shutdown.

    Why the immediate exit: with torch 2.13 (CPU build, gloo), about one run in 30-150 of the
    2-node test job had a rank that had printed its final record, passed the barrier and destroyed
    its process group, then died with SIGABRT ("terminate called without an active exception")
    while the interpreter shut down: Python's fault handler showed no Python frame left, so the
    abort came from C++ destructors at exit (a std::thread still joinable), after all the work
    was done. torchrun reported the rank as failed and the whole run as failed. Everything the
    workload owes is written by then (records flushed here, checkpoints saved with os.replace),
    so nothing is lost by not running the shutdown."""
    emit("final", rank=ctx.rank, node_rank=ctx.node_rank, world_size=ctx.world_size, ok=True, **result)
    if ctx.backend is not None:
        dist.barrier()
        dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
