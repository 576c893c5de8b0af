"""synthetic: a compute-bound throughput benchmark (an MLP on random data, fixed steps).

Compute per step grows with width^2 x depth x batch, communication with width^2 x depth: raise
--batch-size to make a run compute-bound, lower it to make it communication-bound. Reports
global samples/s and the per-step split into compute and all-reduce time.

    torchrun --nproc-per-node 2 -m gpucluster.workloads.synthetic --width 1024 --depth 4
"""

from __future__ import annotations

import contextlib
import time

import torch
from torch import nn

try:
    from gpucluster.workloads import checkpoint, common
    from gpucluster.workloads.args import build_parser
    from gpucluster.workloads.protocol import emit
except ImportError:
    import checkpoint  # type: ignore[no-redef, import-not-found]
    import common  # type: ignore[no-redef, import-not-found]
    from args import build_parser  # type: ignore[no-redef, import-not-found]
    from protocol import emit  # type: ignore[no-redef, import-not-found]


def model(width: int, depth: int, classes: int = 16) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, classes))


def flops_per_sample(net: nn.Module) -> int:
    """Training FLOPs per sample: forward 2 x weights (multiply-add), backward twice that."""
    return 6 * sum(m.weight.numel() for m in net.modules() if isinstance(m, nn.Linear))


def precision(name: str, ctx) -> contextlib.AbstractContextManager:
    """The context every forward pass runs in for --precision (TF32 is a global switch)."""
    cuda = ctx.device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
    if cuda and name == "bf16":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def main(argv: list[str] | None = None) -> None:
    p = build_parser("synthetic")  # torch-free (args.py): `gpucluster run` checks --workload-args with it
    args = p.parse_args(argv)
    ctx = common.setup(args)
    net = model(args.width, args.depth).to(ctx.device)
    common.broadcast_params(net, ctx)
    lr = common.scaled_lr(args, ctx)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    sync_grads = common.GradSync(net, ctx)
    g = torch.Generator(device="cpu").manual_seed(args.seed + ctx.rank)
    x = torch.randn(args.batch_size, args.width, generator=g).to(ctx.device)
    y = torch.randint(0, 16, (args.batch_size,), generator=g).to(ctx.device)

    flops = flops_per_sample(net)

    def step() -> tuple[float, float, float]:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        with precision(args.precision, ctx):
            loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        common.sync(ctx)
        t1 = time.perf_counter()
        comm = sync_grads()
        t2 = time.perf_counter()
        keep.dirty()
        opt.step()
        common.sync(ctx)
        t3 = time.perf_counter()
        return loss.item(), (t1 - t0) + (t3 - t2), comm

    keep = common.keeper(ctx, args, workload="synthetic", model=net, opt=opt)
    for _ in range(args.warmup):
        step()
    first, total_steps, skip, loss_v, resumed = 1, 0, 0, float("nan"), {}
    loaded = checkpoint.load("synthetic")  # GPUCLUSTER_RESUME_DIR: after the warm-up, which moved the weights
    if loaded:
        checkpoint.restore("synthetic", loaded[0], loaded[1], net, opt)
        first, total_steps = loaded[1]["epoch"] + 1, loaded[1]["step"]
        skip = int(loaded[1].get("batch") or 0)
        loss_v = loaded[1].get("loss", loss_v)
        resumed = common.resumed_fields(first, skip, total_steps, loaded[0])
    params = sum(p.numel() for p in net.parameters())
    if ctx.is_main:
        emit("start", rank=ctx.rank, world_size=ctx.world_size, backend=ctx.backend or "none",
             device=str(ctx.device), global_batch=args.batch_size * ctx.world_size, lr=lr, workload="synthetic",
             params=params, width=args.width, depth=args.depth, node_rank=ctx.node_rank,
             precision=args.precision if ctx.device.type == "cuda" else "fp32", flops_per_sample=flops, **resumed)
        if first > args.epochs:
            print(f"synthetic: the checkpoint is at epoch {first - 1}, --epochs is {args.epochs}: "
                  "nothing left to train", flush=True)
    if loaded and first > args.epochs:  # carried forward, so a resume of this run finds it too
        common.save_checkpoint(ctx, workload="synthetic", epoch=first - 1, step=total_steps, model=net, opt=opt,
                               loss=loss_v)
    sampler = common.start_sampler(ctx)
    total_time = 0.0
    try:
        for epoch in range(first, args.epochs + 1):
            common.sync(ctx)
            t_epoch = time.perf_counter()
            compute_s = comm_s = 0.0
            times = []
            for i in range(skip if epoch == first else 0, args.steps):  # a mid-epoch checkpoint's steps are done
                t = time.perf_counter()
                loss_v, compute, comm = step()
                compute_s += compute
                comm_s += comm
                times.append(time.perf_counter() - t)
                total_steps += 1
                keep.at(epoch - 1, i + 1, total_steps, loss=loss_v)
            epoch_time = time.perf_counter() - t_epoch
            total_time += epoch_time
            keep.at(epoch, 0, total_steps, loss=loss_v)
            loss_mean = common.mean_across_ranks(loss_v, ctx)
            timing = common.step_timing(times, 0.0, compute_s, comm_s, ctx)
            if ctx.is_main:
                rate = len(times) * args.batch_size * ctx.world_size / epoch_time
                emit("epoch", rank=ctx.rank, epoch=epoch, step=total_steps, loss=round(loss_mean, 5),
                     samples_per_s=round(rate, 2), epoch_time_s=round(epoch_time, 4),
                     model_tflops=round(rate * flops / 1e12, 3), **timing)
            keep.epoch_end(epoch, total_steps, loss=loss_mean)
    except Exception:  # a collective broke (a peer went away): the last consistent state is saved first
        if ctx.backend is not None:
            keep.failed()
        raise
    if sampler:
        sampler.stop()
    seen = (args.epochs - first + 1) * args.steps * args.batch_size if first <= args.epochs else 0  # this run's
    common.finish(ctx, dict(epochs=args.epochs, loss=round(loss_v, 5), train_time_s=round(total_time, 4),
                            samples_seen=seen,
                            samples_per_s=round(seen * ctx.world_size / total_time, 2) if total_time > 0 else None))


if __name__ == "__main__":
    main()
