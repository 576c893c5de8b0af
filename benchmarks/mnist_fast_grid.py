"""`mnist --fast` over a small grid of learning rates, epochs and shifts, in one process (the data is
read once; each configuration trains from scratch). Not a test: it measures, to choose --fast's
defaults on the GPU they are meant for, and prints one JSON line per configuration:

    python benchmarks/mnist_fast_grid.py [--lrs 0.002,0.004,0.008] [--epochs 3,4] [--shifts 0,2] [--seeds 0,1]

Each line: the arguments, the test accuracy after each epoch, the training time (warm-up excluded,
as `mnist --fast` counts it) and the time to 99 %.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import time

os.environ.setdefault("GPUCLUSTER_UTIL_INTERVAL", "0")  # no sampler thread in a grid


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lrs", default="0.002,0.004,0.008")
    p.add_argument("--epochs", default="3,4")
    p.add_argument("--shifts", default="0,2")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--limit", type=int, default=0, help="first N training images only (a rehearsal on CPU)")
    p.add_argument("--budget", type=float, default=120.0, help="stop starting configurations after this many seconds")
    a = p.parse_args()
    from gpucluster.workloads import common, fast, mnist
    from gpucluster.workloads.args import build_parser

    base = mnist.defaults(build_parser("mnist").parse_args(["--fast"]))
    ctx = common.setup(base)
    x_train, y_train, x_test, y_test = mnist.load(base)
    if a.limit:
        x_train, y_train, x_test, y_test = x_train[:a.limit], y_train[:a.limit], x_test[:a.limit], y_test[:a.limit]
    data = (x_train.reshape(-1, 1, 28, 28), y_train, x_test.reshape(-1, 1, 28, 28), y_test)
    start = time.monotonic()
    grid = itertools.product([float(v) for v in a.lrs.split(",")], [int(v) for v in a.epochs.split(",")],
                             [int(v) for v in a.shifts.split(",")], [int(v) for v in a.seeds.split(",")])
    for lr, epochs, shift, seed in grid:
        if time.monotonic() - start > a.budget:
            print(json.dumps({"stopped": "budget"}), flush=True)
            break
        args = mnist.defaults(build_parser("mnist").parse_args(
            ["--fast", "--lr", str(lr), "--epochs", str(epochs), "--shift", str(shift), "--seed", str(seed)]))
        captured = io.StringIO()
        with contextlib.redirect_stdout(captured):
            result = fast.train(data, args, ctx)
        accs = [json.loads(ln.split(" ", 1)[1])["accuracy"] for ln in captured.getvalue().splitlines()
                if '"kind":"epoch"' in ln]
        print(json.dumps({"lr": lr, "epochs": epochs, "shift": shift, "seed": seed, "device": str(ctx.device),
                          "accuracy": accs, "train_time_s": result["train_time_s"],
                          "time_to_99_s": result["time_to_target_s"]}), flush=True)


if __name__ == "__main__":
    main()
