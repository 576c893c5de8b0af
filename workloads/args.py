"""Each built-in workload's command-line parser, without torch.

The workloads parse their arguments with these parsers, and `gpucluster run` checks
`--workload-args` against the same parsers before anything starts (importing this module costs
only argparse). Standard library only, so this file ships with the workloads folder.
"""

from __future__ import annotations

import argparse

NAMES = ("digits", "mnist", "synthetic")


def base_parser(description: str, *, epochs: int, batch: int, lr: float, prog: str | None = None,
                cls: type = argparse.ArgumentParser) -> argparse.ArgumentParser:
    p = cls(prog=prog, description=description)
    p.add_argument("--epochs", type=int, default=epochs, help=f"training epochs (default {epochs})")
    p.add_argument("--batch-size", type=int, default=batch, help=f"per-rank batch size (default {batch})")
    p.add_argument("--lr", type=float, default=lr,
                   help=f"learning rate at a global batch of 64, scaled linearly with the global batch (default {lr})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu", action="store_true", help="stay on the CPU even when CUDA is present")
    p.add_argument("--backend", choices=["gloo", "nccl"], default=None,
                   help="process group backend (default: nccl on CUDA, gloo otherwise)")
    p.add_argument("--no-shard", action="store_true",
                   help="every rank trains the full dataset (the mistake seed 003 measured; for diagnosis demos)")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="STEPS",
                   help="also checkpoint every STEPS optimizer steps, not only after each epoch (0: per epoch); "
                        "a lost node then costs at most STEPS steps")
    return p


def digits_parser(prog: str | None = None, cls: type = argparse.ArgumentParser) -> argparse.ArgumentParser:
    p = base_parser("Small CNN on the 1,797 real 8x8 handwritten digits (UCI optdigits)", epochs=15, batch=32, lr=2e-3, prog=prog, cls=cls)
    p.add_argument("--data-file", default=None, help="digits.csv.gz (default: the copy shipped with gpucluster)")
    return p


def mnist_parser(prog: str | None = None, cls: type = argparse.ArgumentParser) -> argparse.ArgumentParser:
    p = base_parser("CNN on real MNIST (defaults: 2 epochs, batch 64, lr 1e-3; with --fast: 3, 512, 8e-3)",
                    epochs=2, batch=64, lr=1e-3, prog=prog, cls=cls)
    p.add_argument("--data-dir", default=None, help="folder with the MNIST IDX files")
    p.add_argument("--download", action="store_true", help="download the IDX files into --data-dir if missing")
    p.add_argument("--limit", type=int, default=0, help="use only the first N training images (quick checks)")
    p.add_argument("--fast", action="store_true",
                   help="the fast variant (workloads/fast.py): data on the device, batch 512, bf16 on CUDA, "
                        "one-cycle SGD; default 3 epochs, --lr 0.008 (at a global batch of 64), --shift 0")
    p.add_argument("--shift", type=int, default=0, metavar="PIXELS",
                   help="--fast: move each batch by up to PIXELS in x and y (augmentation; default 0: none)")
    p.add_argument("--target", type=float, default=0.99,
                   help="test accuracy whose training time is reported as time_to_target_s (default 0.99)")
    p.set_defaults(epochs=None, lr=None, batch_size=None)  # the defaults depend on --fast (mnist.defaults)
    return p


def synthetic_parser(prog: str | None = None, cls: type = argparse.ArgumentParser) -> argparse.ArgumentParser:
    p = base_parser("Compute-bound MLP throughput benchmark on random data", epochs=3, batch=256, lr=1e-3, prog=prog, cls=cls)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--steps", type=int, default=20, help="steps per epoch (default 20)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before the first epoch")
    p.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="fp32",
                   help="matmul precision on CUDA: fp32 (default), tf32 (fp32 storage, TF32 tensor cores), "
                        "bf16 (autocast); the CPU stays fp32")
    return p


def build_parser(name: str, prog: str | None = None, cls: type = argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The parser the workload `name` uses for its arguments (`cls`: an ArgumentParser subclass)."""
    builders = {"digits": digits_parser, "mnist": mnist_parser, "synthetic": synthetic_parser}
    if name not in builders:
        raise KeyError(name)
    return builders[name](prog, cls)


class _Refused(Exception):
    pass


class _CheckingParser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print usage and exit 2; the caller words it instead
        raise _Refused(message)

    def print_help(self, file=None):  # --help: nothing is printed while checking
        pass

    def exit(self, status=0, message=None):  # --help would exit 0 on every rank: not a training run
        raise _Refused("--help prints the workload's help and trains nothing")


def check_args(name: str, argv: list[str]) -> str | None:
    """None when the workload `name` accepts `argv`, else argparse's one-line reason."""
    parser = build_parser(name, prog=name, cls=_CheckingParser)
    try:
        parser.parse_args(argv)
    except _Refused as exc:
        return str(exc)
    return None
