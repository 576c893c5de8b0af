"""`--data` and `--setup` over the ssh launcher, against real OpenSSH servers on loopback
(tests/sshd.py): the data folder checked by checksum on every rank, the content-addressed cache
(a rerun sends under 1% of the bytes), setup output before training, a failing setup."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from sshd import (  # noqa: E402
    Recorder, assert_nothing_left, cluster_of, free_port, hosts, make_launcher, remote_dir,  # noqa: F401
    skip_unless_usable,
)

skip_unless_usable()
pytestmark = [pytest.mark.sshd, pytest.mark.slow]

from gpucluster.watch.launch import JobSpec  # noqa: E402
from gpucluster.watch.staging import parse_data  # noqa: E402

CHECK = Path(__file__).parent / "fixtures" / "check_data.py"


def make_data(root: Path, files: int = 20, size: int = 200_000) -> Path:
    ds = root / "dataset"
    (ds / "shards").mkdir(parents=True)
    for i in range(files):
        (ds / "shards" / f"part-{i:03d}.bin").write_bytes(os.urandom(size))
    (ds / "labels.txt").write_text("0 1 2\n")
    return ds


def expected(ds: Path) -> str:
    return json.dumps({str(p.relative_to(ds)): hashlib.sha256(p.read_bytes()).hexdigest()
                       for p in ds.rglob("*") if p.is_file()})


def project(tmp_path: Path, monkeypatch) -> None:
    job = tmp_path / "project"
    job.mkdir()
    shutil.copy(CHECK, job / "check_data.py")
    monkeypatch.chdir(job)


def run(hosts, remote_dir, tmp_path, ds, run_id, setup=(), cache=None):
    job = JobSpec(run_id, command=("python", "check_data.py"), rdzv_port=free_port(), max_seconds=120,
                  env=(("CHECK_MANIFEST", expected(ds)),), setup=tuple(setup), data=parse_data([str(ds)]))
    events = Recorder()
    launcher = make_launcher(hosts, remote_dir, data_cache=str(cache or tmp_path / "cache"))
    result = launcher.launch(cluster_of(hosts, 2), job, events, tmp_path / run_id)
    return result, events


def stage_records(events):
    return {r: rec for r, rec in events.metrics if rec.get("kind") == "stage"}


def test_data_checked_on_every_rank_and_rerun_sends_under_one_percent(hosts, remote_dir, tmp_path, monkeypatch):
    project(tmp_path, monkeypatch)
    ds = make_data(tmp_path)
    total = sum(p.stat().st_size for p in ds.rglob("*") if p.is_file())
    setup = ["echo SETUP-MARK node $GPUCLUSTER_NODE_RANK in $(pwd); test -f check_data.py"]
    first, events = run(hosts, remote_dir, tmp_path, ds, f"dt1-{os.getpid()}", setup=setup)
    assert first.ok, (first.failure, events.lines[-20:])
    assert events.phases == ["ready", "stage", "setup", "rendezvous", "train"]
    lines = [ln for _, ln in events.lines]
    assert sum("data ok: 21 files" in ln for ln in lines) == 2, lines  # the job's own sha256 check, every rank
    recs = stage_records(events)
    assert sorted(recs) == [0, 1] and all(r["bytes"] == total and r["files"] == 21 for r in recs.values())
    # both "nodes" share this machine's cache: at least one of them sent everything
    assert max(r["sent_bytes"] for r in recs.values()) >= total
    for rank in (0, 1):
        log = (tmp_path / f"dt1-{os.getpid()}" / f"node-{rank}.log").read_text()
        assert log.index(f"SETUP-MARK node {rank} in {remote_dir}") < log.index("data ok"), log
        assert "[gpucluster setup 1/1] $ echo SETUP-MARK" in log
    cached = list((tmp_path / "cache").iterdir())
    assert len(cached) == 21 and all(stat.S_IMODE(p.stat().st_mode) == 0o444 for p in cached)
    assert_nothing_left(hosts, cluster_of(hosts, 2), f"dt1-{os.getpid()}", remote_dir)

    again, events = run(hosts, remote_dir, tmp_path, ds, f"dt2-{os.getpid()}")
    assert again.ok, (again.failure, events.lines[-20:])
    for rec in stage_records(events).values():
        assert rec["sent_files"] == 0 and rec["sent_bytes"] < 0.01 * total, rec

    (ds / "shards" / "part-007.bin").write_bytes(os.urandom(200_000))  # one file changed
    third, events = run(hosts, remote_dir, tmp_path, ds, f"dt3-{os.getpid()}")
    assert third.ok, (third.failure, events.lines[-20:])
    for rec in stage_records(events).values():
        assert rec["sent_files"] <= 1 and rec["sent_bytes"] < 200_000 + 0.01 * total, rec
    assert_nothing_left(hosts, cluster_of(hosts, 2), f"dt3-{os.getpid()}", remote_dir)


def test_failing_setup_names_the_node_and_leaves_nothing(hosts, remote_dir, tmp_path, monkeypatch):
    project(tmp_path, monkeypatch)
    ds = make_data(tmp_path, files=2, size=1000)
    run_id = f"ds-{os.getpid()}"
    # Lightning's `<script dir>/../../Datasets`: written beside the node folders, in the run folder (issue 46 item 7)
    setup = ['mkdir -p ../../Datasets/mnist && echo x > ../../Datasets/mnist/n$GPUCLUSTER_NODE_RANK; '
             'if [ "$GPUCLUSTER_NODE_RANK" = 1 ]; then echo broken-on-node-1; exit 7; fi; echo fine']
    result, events = run(hosts, remote_dir, tmp_path, ds, run_id, setup=setup)
    assert not result.ok
    assert result.failure.startswith(f"setup failed on node 1 ({hosts.hosts[1]}): exit code 7"), result.failure
    assert "broken-on-node-1" in result.failure
    assert "train" not in events.phases and "rendezvous" not in events.phases
    assert not any("data ok" in ln for _, ln in events.lines)
    assert_nothing_left(hosts, cluster_of(hosts, 2), run_id, remote_dir)  # the whole run folder went
    # and the teardown check looks there: a run folder left on a host is named, not "verified"
    (remote_dir / run_id / "Datasets").mkdir(parents=True)
    left = make_launcher(hosts, remote_dir).leftovers(cluster_of(hosts, 2), run_id)
    assert [(f.kind, f.id.endswith(f"{remote_dir}/{run_id}"), f.detail.endswith("(holds Datasets)")) for f in left] == [
        ("folder", True, True)], left
