"""digits: a small CNN on the 1,797 real 8x8 handwritten digits (UCI optdigits, the set scikit-learn
ships as load_digits).

The data is read with the standard library from the copy shipped next to this script
(data/digits.csv.gz, licence in data/DIGITS-LICENSE.txt); `--data-file` points at a copy elsewhere.
A fixed split keeps 20 % for testing. Default run: >= 95 % test accuracy.

    torchrun --nproc-per-node 2 -m gpucluster.workloads.digits --epochs 20
"""

from __future__ import annotations

import csv
import gzip
import os

import torch
from torch import nn

try:
    from gpucluster.workloads import common
    from gpucluster.workloads.args import build_parser
except ImportError:
    import common  # type: ignore[no-redef, import-not-found]
    from args import build_parser  # type: ignore[no-redef, import-not-found]


SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "digits.csv.gz")


def digits_file() -> str:
    """The copy shipped next to this script (remote nodes get it with the job bundle, so they
    need only torch)."""
    if os.path.exists(SHIPPED):
        return SHIPPED
    try:
        from gpucluster.workloads.digits_data import local_digits_file
    except ImportError:
        from digits_data import local_digits_file  # type: ignore[no-redef, import-not-found]
    path = local_digits_file()
    if path is None:
        raise SystemExit(f"digits: the data file {SHIPPED} is missing (a broken install?); pass --data-file")
    return path


def load(path: str, seed: int = 1234) -> tuple[torch.Tensor, ...]:
    with gzip.open(path, "rt") as f:
        rows = [[float(v) for v in row] for row in csv.reader(f) if row]
    data = torch.tensor(rows, dtype=torch.float32)
    x = (data[:, :64] / 16.0).reshape(-1, 1, 8, 8)
    y = data[:, 64].long()
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = len(y) // 5
    test, train = perm[:n_test], perm[n_test:]
    return x[train], y[train], x[test], y[test]


def model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def main(argv: list[str] | None = None) -> None:
    p = build_parser("digits")  # torch-free (args.py): `gpucluster run` checks --workload-args with it
    args = p.parse_args(argv)
    ctx = common.setup(args)
    data = load(args.data_file or digits_file())
    result = common.train_classifier(model(), data, args, ctx, workload="digits")
    common.finish(ctx, result)


if __name__ == "__main__":
    main()
