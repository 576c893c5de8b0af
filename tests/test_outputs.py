"""Outputs come back (issue 14 item 1): every node's GPUCLUSTER_OUTPUT_DIR is copied to
$GPUCLUSTER_HOME/runs/RUN_ID/outputs/node-N (or --output DIR) before teardown, whatever ended the
run, with a per-node verdict in the ledger; a copy that is not complete fails the run.

Real runs: the local backend through the CLI, the ssh backend against real sshd servers on
loopback (tests/sshd.py) through the lifecycle. The training script (fixtures/output_train.py)
prints `SAVED name sha256` after each save; what came back is compared with it."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

sys.path.insert(0, str(Path(__file__).parent))
from conftest import FIXTURES, ROOT, gpucluster_argv, needs_torch, run_cli  # noqa: E402
from gpucluster.errors import UsageError  # noqa: E402
from gpucluster.ledger.store import Ledger  # noqa: E402
from gpucluster.watch.outputs import check_output_dest, extract_stream  # noqa: E402
from outputs_check import saved, sha, writer  # noqa: E402

SCRIPT = FIXTURES / "output_train.py"


def only_run(home):
    ledger = Ledger(home / "ledger.sqlite3")
    runs = ledger.list_runs()
    assert len(runs) == 1
    return ledger.get_run(runs[0].id).to_dict()


# -- checks without a run ------------------------------------------------------------------
@pytest.mark.parametrize("value,needle", [
    ("s3://bucket/prefix", "not supported yet"), ("gs://bucket", "not supported yet"),
    ("https://example.com/x", "a folder on this machine"), ("", "give a folder"),
])
def test_output_urls_are_refused(value, needle):
    with pytest.raises(UsageError) as exc:
        check_output_dest(value)
    assert needle in exc.value.message and repr(value) in exc.value.message


def test_output_folder_checks_create_nothing(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "old").write_text("x")
    for value, needle in [(tmp_path / "file", "not a folder"), (tmp_path / "file" / "sub", "is not a folder"),
                          (tmp_path / "full", "not empty")]:
        with pytest.raises(UsageError) as exc:
            check_output_dest(str(value))
        assert needle in exc.value.message, exc.value.message
    new = tmp_path / "a" / "b"
    assert check_output_dest(str(new)) == new and not (tmp_path / "a").exists()
    (tmp_path / "empty").mkdir()
    assert check_output_dest(str(tmp_path / "empty")) == tmp_path / "empty"


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    buf.seek(0)
    return buf


def test_extract_stream_writes_only_regular_files_inside(tmp_path):
    def entry(name, kind=tarfile.REGTYPE, link=""):
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, link
        return info

    stream = _tar([
        (entry("./sub", tarfile.DIRTYPE), None), (entry("./sub/model.pt"), b"weights"),
        (entry("../escape.txt"), b"no"), (entry("/abs.txt"), b"no"),
        (entry("./link", tarfile.SYMTYPE, "/etc/passwd"), None), (entry("./hard", tarfile.LNKTYPE, "sub/model.pt"), None),
        (entry("./ok.txt"), b"fine"),
    ])
    dest = tmp_path / "out" / "node-0"
    files, nbytes, refused = extract_stream(stream, dest)
    assert (files, nbytes) == (2, len(b"weights") + len(b"fine"))
    assert (dest / "sub" / "model.pt").read_bytes() == b"weights" and (dest / "ok.txt").read_text() == "fine"
    assert sorted(p.name for p in dest.rglob("*")) == ["model.pt", "ok.txt", "sub"]
    assert not (tmp_path / "out" / "escape.txt").exists()
    assert len(refused) == 4 and any("../escape.txt" in r for r in refused) and any("link" in r for r in refused)


def test_truncated_stream_raises_after_counting(tmp_path):
    data = _tar([(tarfile.TarInfo("a.bin"), b"a" * 5000), (tarfile.TarInfo("b.bin"), b"b" * 50000)]).getvalue()
    tally = {"files": 0, "bytes": 0, "refused": []}
    with pytest.raises(tarfile.TarError):
        extract_stream(io.BytesIO(data[:20000]), tmp_path / "d", tally)
    assert tally["files"] == 1  # a.bin came back whole before the stream broke
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["a.bin"]  # b.bin, cut short, is not left
    # a stream cut exactly between members (no end-of-archive blocks) is not taken for a whole one
    with pytest.raises(tarfile.TarError):
        extract_stream(io.BytesIO(data[:512 + 5120]), tmp_path / "e")


def test_extract_stream_from_a_pipe_that_delivers_odd_pieces(tmp_path):
    # ssh hands the stream over in pieces of its own size: file data is written as it comes
    # (readinto1), so every piece boundary (inside headers, data and padding) must be handled
    import threading

    blobs = {f"f{i}.bin": os.urandom(n) for i, n in enumerate([0, 1, 511, 512, 513, 70_000, 1_300_000])}
    data = _tar([(tarfile.TarInfo(name), blob) for name, blob in blobs.items()]
                + [(tarfile.TarInfo("./link"), None)]).getvalue()
    r, w = os.pipe()

    def feed() -> None:
        with open(w, "wb", buffering=0) as out:
            i, step = 0, 1
            while i < len(data):
                out.write(data[i:i + step])
                i += step
                step = step * 7 % 65_521 + 1  # 1, 8, 57, ... odd sizes up to 64 KiB

    feeder = threading.Thread(target=feed)
    feeder.start()
    with open(r, "rb", buffering=1 << 20) as stream:
        files, nbytes, refused = extract_stream(stream, tmp_path / "out")
    feeder.join()
    assert (files, nbytes) == (len(blobs) + 1, sum(map(len, blobs.values())))
    assert refused == []  # "./link" was a regular empty file here, not a link
    for name, blob in blobs.items():
        assert (tmp_path / "out" / name).read_bytes() == blob



def test_parallel_node_copies_with_nothing_do_not_break_each_other(tmp_path):
    """Nodes copy their working folders at once, each into workdir/node-N; one that brought nothing
    removes its folder and the then-empty workdir/ (remove_if_empty). Another node creating its
    folder at that moment must not lose it: before the fix, 4 of 8 ssh hosts on loopback failed
    their copy with ENOENT on workdir/node-N (benchmarks/scale_ssh.py, 8 hosts), and the run failed."""
    import threading

    from gpucluster.watch.outputs import remove_if_empty

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can: the window is a few bytecodes
    empty = _tar([]).getvalue()
    errors: list[str] = []
    nodes = 8
    try:
        for round_ in range(150):
            gate = threading.Barrier(nodes)

            def node(rank: int) -> None:
                dest = tmp_path / f"r{round_}" / "workdir" / f"node-{rank}"
                gate.wait()
                try:
                    extract_stream(io.BytesIO(empty), dest)
                except OSError as exc:
                    errors.append(f"round {round_} node {rank}: {exc}")
                remove_if_empty(dest)

            threads = [threading.Thread(target=node, args=(r,)) for r in range(nodes)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not (tmp_path / f"r{round_}" / "workdir").exists()  # nothing came back: nothing left
    finally:
        sys.setswitchinterval(interval)
    assert errors == []


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_long_names_in_every_tar_format(tmp_path, fmt):
    src = tmp_path / "src"
    deep = src / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    (deep / ("f" * 90 + ".pt")).write_bytes(os.urandom(3000))
    (src / "small.txt").write_text("x")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        tar.add(src, arcname=".")
    buf.seek(0)
    files, nbytes, refused = extract_stream(buf, tmp_path / "out")
    assert (files, nbytes, refused) == (2, 3001, [])
    for p in src.rglob("*"):
        if p.is_file():
            assert (tmp_path / "out" / p.relative_to(src)).read_bytes() == p.read_bytes()


# -- local: real runs through the CLI ------------------------------------------------------
def _local(*args, env=None):
    return run_cli("run", "--cloud", "local", "--nodes", "2", *args, "--", "python", str(SCRIPT), env=env)


@needs_torch
@pytest.mark.slow
def test_local_model_comes_back_with_its_checksum(home, tmp_path):
    r = _local("--json", env={"STEPS": "20"})
    assert r.returncode == 0, r.stderr[-3000:]
    run = only_run(home)
    assert run["status"] == "succeeded"
    dest = home / "runs" / run["id"] / "outputs"
    w, log = writer(home / "runs" / run["id"])
    assert sha(dest / f"node-{w}" / "model.pt") == saved(log, "model.pt")[-1]
    assert sha(dest / f"node-{w}" / "checkpoint.pt") == saved(log, "checkpoint.pt")[-1]
    # every rank wrote into its own node's folder: no collision between nodes
    assert sorted(p.parent.parent.name for p in dest.glob("node-*/logs/rank-*.txt")) == ["node-0", "node-1"]
    outs = json.loads(r.stdout)["outputs"]
    assert [(o["node_rank"], o["verdict"]) for o in outs] == [(0, "complete"), (1, "complete")]
    assert outs[w]["files"] == 3 and outs[w]["bytes"] == sum(
        p.stat().st_size for p in (dest / f"node-{w}").rglob("*") if p.is_file())
    assert {p["name"]: p["status"] for p in run["phases"]}["outputs"] == "ok"
    shown = run_cli("show", run["id"])
    assert "complete" in shown.stdout and f"outputs: {dest}" in shown.stdout, shown.stdout
    assert json.loads(run_cli("show", run["id"], "--json").stdout)["outputs"] == run["outputs"]


@needs_torch
@pytest.mark.slow
def test_local_output_dir_and_a_crashed_rank(home, tmp_path):
    target = tmp_path / "results"
    r = _local("--output", str(target), env={"CRASH_RANK": "1", "CRASH_STEP": "15"})
    assert r.returncode == 1, r.stderr[-3000:]
    run = only_run(home)
    assert run["status"] == "failed" and "node" in run["failure"] and "outputs" not in run["failure"]
    # the checkpoint saved at step 10, before the crash, is there and whole
    w, log = writer(home / "runs" / run["id"])
    assert sha(target / f"node-{w}" / "checkpoint.pt") == saved(log, "checkpoint.pt")[-1]
    assert [o["verdict"] for o in run["outputs"]] == ["complete", "complete"]
    assert f"outputs: {target}" in r.stdout
    assert not (home / "runs" / run["id"] / "outputs").exists()


@needs_torch
@pytest.mark.slow
def test_local_ctrl_c_mid_training_brings_the_last_checkpoint_back(home):
    env = dict(os.environ, COLUMNS="200", STEPS="100000")
    proc = subprocess.Popen(gpucluster_argv("run", "--nodes", "2", "--", "python", str(SCRIPT)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    seen, deadline = [], time.monotonic() + 120
    for line in proc.stdout:
        seen.append(line)
        if "SAVED checkpoint.pt" in line:
            break
        assert time.monotonic() < deadline, "".join(seen)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 130, out[-2000:]
    run = only_run(home)
    assert run["status"] == "interrupted" and run["teardown"] == "verified"
    w, log = writer(home / "runs" / run["id"])
    ckpt = home / "runs" / run["id"] / "outputs" / f"node-{w}" / "checkpoint.pt"
    assert sha(ckpt) == saved(log, "checkpoint.pt")[-1]
    assert [o["verdict"] for o in run["outputs"]] == ["complete", "complete"]


@needs_torch
@pytest.mark.slow
def test_local_missing_output_folder_fails_the_run(home):
    r = _local(env={"STEPS": "10", "OUTPUT_TRICK": "remove"})
    assert r.returncode == 1, r.stderr[-3000:]
    run = only_run(home)
    assert run["status"] == "failed" and run["teardown"] == "verified"
    w, _ = writer(home / "runs" / run["id"])  # its node's folder is the one removed
    assert run["failure"].startswith(f"outputs of node {w} failed: "), run["failure"]
    assert "is gone" in run["failure"]
    assert [o["verdict"] for o in run["outputs"]] == (["failed", "complete"] if w == 0 else ["complete", "failed"])
    assert "failed" in r.stdout and f"node {w}" in r.stdout


@pytest.mark.parametrize("args,needles", [
    (("--output", "s3://bucket/prefix"), ("'s3://bucket/prefix'", "not supported yet")),
    (("--output", "gs://b/p"), ("'gs://b/p'", "not supported yet")),
    (("--output", "/etc/passwd"), ("'/etc/passwd'", "not a folder")),
    (("--output", str(ROOT)), ("not empty",)),
])
def test_bad_output_is_refused_before_anything(home, args, needles):
    from test_bad_input import assert_clean_refusal, assert_no_run_recorded

    r = run_cli("run", "--cloud", "local", "--nodes", "2", *args)
    assert_clean_refusal(r, *needles)
    assert_no_run_recorded(home)


@pytest.mark.integration  # a real process or server: not in `make test-fast`
def test_output_on_gcp_is_accepted_and_creates_nothing_in_a_dry_run(home, tmp_path):
    """gcp copies outputs back from the pods (issue 14): --output DIR is no longer refused there;
    a dry run still creates nothing. (An s3:// URL on gcp stays refused: tests/test_bad_input.py.)"""
    from test_bad_input import assert_no_run_recorded

    target = tmp_path / "never"
    r = run_cli("run", "--cloud", "gcp", "--project", "p-123456", "--dry-run", "--output", str(target))
    assert r.returncode == 0, r.stderr
    assert "not supported yet" not in r.stdout + r.stderr
    assert not target.exists()
    assert_no_run_recorded(home)
