"""`mnist --fast` (workloads/fast.py) and `synthetic --precision` on the CPU: the parts whose logic
does not need a GPU. The figures themselves (time to 99 % on an H100/H200) come from
benchmarks/gpu_check.py on a GPU machine (README, "On a real GPU")."""

from __future__ import annotations

import io
import json
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import needs_torch  # noqa: E402
from gpucluster.workloads.args import build_parser, check_args  # noqa: E402

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def test_fast_has_its_own_defaults_and_given_values_win():
    from gpucluster.workloads import mnist

    plain = mnist.defaults(build_parser("mnist").parse_args([]))
    assert (plain.epochs, plain.batch_size, plain.lr, plain.fast) == (2, 64, 1e-3, False)
    fast = mnist.defaults(build_parser("mnist").parse_args(["--fast"]))
    assert (fast.epochs, fast.batch_size, fast.lr, fast.shift, fast.target) == (3, 512, 8e-3, 0, 0.99)
    given = mnist.defaults(build_parser("mnist").parse_args(["--fast", "--epochs", "3", "--lr", "0.01"]))
    assert (given.epochs, given.lr, given.batch_size) == (3, 0.01, 512)
    assert check_args("mnist", ["--fast", "--shift", "x"]) == "argument --shift: invalid int value: 'x'"
    assert check_args("synthetic", ["--precision", "fp8"]).startswith("argument --precision: invalid choice: 'fp8'")


@needs_torch
def test_shift_moves_the_batch_and_fills_with_the_background():
    import torch

    from gpucluster.workloads import fast

    x = torch.zeros(1, 1, 5, 5)
    x[0, 0, 2, 2] = 1.0

    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        state = g.get_state()
        dx, dy = (int(v) for v in torch.randint(-2, 3, (2,), generator=g))
        g.set_state(state)
        out = fast.shift(x, g, 2)
        if (dx, dy) == (0, 0):
            assert out is x
            continue
        assert out[0, 0, 2 + dy, 2 + dx] == 1.0 and (out == 1.0).sum() == 1
        background = -fast.MEAN / fast.STD  # what moved in from outside: an empty (black) border
        rows = slice(0, dy) if dy > 0 else slice(5 + dy, 5)
        assert dy == 0 or bool((out[0, 0, rows, :] == background).all())
    assert fast.shift(x, g, 0) is x  # --shift 0: no augmentation


def test_one_cycle_warms_up_then_decays_to_zero():
    from gpucluster.workloads.fast import one_cycle

    lrs = [one_cycle(s, 100, 1.0) for s in range(100)]
    assert lrs[0] == pytest.approx(0.05) and max(lrs) == 1.0 and lrs.index(1.0) == 19
    assert all(a >= b for a, b in zip(lrs[19:], lrs[20:])) and lrs[-1] == pytest.approx(1 / 80)


@needs_torch
def test_fast_trains_reports_each_epoch_and_the_time_to_target(monkeypatch):
    """Separable toy data (the class is the bright quadrant of a 28x28 image): --fast learns
    it within 2 epochs, every epoch record carries accuracy and times, and the final result names
    the training time at which --target was first reached."""
    import torch

    from gpucluster.workloads import common, fast, mnist

    monkeypatch.setenv("GPUCLUSTER_UTIL_INTERVAL", "0")
    g = torch.Generator().manual_seed(0)

    def toy(n):
        y = torch.randint(0, 4, (n,), generator=g)
        x = torch.rand(n, 1, 28, 28, generator=g) * 0.2
        for i, c in enumerate(y.tolist()):
            r, q = divmod(c, 2)
            x[i, 0, r * 14:(r + 1) * 14, q * 14:(q + 1) * 14] += 0.8
        return x, y

    xt, yt = toy(2048)
    xv, yv = toy(512)
    args = mnist.defaults(build_parser("mnist").parse_args(["--fast", "--epochs", "2", "--batch-size", "128",
                                                            "--lr", "0.01", "--target", "0.9", "--cpu"]))
    ctx = common.setup(args)
    out = io.StringIO()
    with redirect_stdout(out):
        result = fast.train((xt, yt, xv, yv), args, ctx)
    recs = [json.loads(ln.split(" ", 1)[1]) for ln in out.getvalue().splitlines() if ln.startswith("@gpucluster-metric")]
    epochs = [r for r in recs if r["kind"] == "epoch"]
    start = next(r for r in recs if r["kind"] == "start")
    assert start["fast"] is True and start["dtype"] == "float32" and start["global_batch"] == 128
    assert [e["epoch"] for e in epochs] == [1, 2] and all(e["epoch_time_s"] > 0 for e in epochs)
    assert result["accuracy"] >= 0.9 and result["samples_seen"] == 2 * (2048 // 128) * 128
    first = next(e for e in epochs if e["accuracy"] >= 0.9)
    assert result["time_to_target_s"] == pytest.approx(first["train_time_s"], abs=1e-3)
    assert result["train_time_s"] == pytest.approx(sum(e["epoch_time_s"] for e in epochs), abs=1e-3)


@needs_torch
def test_synthetic_reports_model_tflops_from_its_weights(monkeypatch, capsys):
    from gpucluster.workloads import synthetic

    monkeypatch.setenv("GPUCLUSTER_UTIL_INTERVAL", "0")
    net = synthetic.model(64, 2)
    assert synthetic.flops_per_sample(net) == 6 * (64 * 64 * 2 + 64 * 16)
    synthetic.main(["--epochs", "1", "--steps", "2", "--width", "64", "--depth", "2", "--batch-size", "8",
                    "--precision", "bf16"])
    recs = [json.loads(ln.split(" ", 1)[1]) for ln in capsys.readouterr().out.splitlines()
            if ln.startswith("@gpucluster-metric")]
    start = next(r for r in recs if r["kind"] == "start")
    epoch = next(r for r in recs if r["kind"] == "epoch")
    assert start["precision"] == "fp32"  # the CPU stays fp32 whatever --precision says
    assert start["flops_per_sample"] == 6 * (64 * 64 * 2 + 64 * 16)
    assert epoch["model_tflops"] == pytest.approx(epoch["samples_per_s"] * start["flops_per_sample"] / 1e12, abs=1e-3)
