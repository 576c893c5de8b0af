"""Files a job writes in its working folder come back over ssh (issue 28 item 1), against real
sshd servers on loopback: the script saves relative to its working folder (`code/` in the node's
run folder, which teardown removes); every such file is back, per node, with its checksum, before
the run folder goes; a size limit names what is over (verdict partial)."""

from __future__ import annotations

import itertools
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from sshd import free_port, hosts, make_launcher, remote_dir, skip_unless_usable  # noqa: E402,F401

skip_unless_usable()
pytestmark = [pytest.mark.sshd, pytest.mark.slow]

from gpucluster.infra.registry import plugin as backend_of  # noqa: E402
from gpucluster.infra.ssh.provider import SshProvider  # noqa: E402
from gpucluster.watch.launch import JobSpec  # noqa: E402
from gpucluster.ledger.store import Ledger  # noqa: E402
from gpucluster.lifecycle.steps import execute  # noqa: E402
from gpucluster.spec import ClusterSpec  # noqa: E402
from specs import validate  # noqa: E402
from test_ssh_outputs import nothing_left  # noqa: E402
from test_workdir import JOB, check_every_file_came_back  # noqa: E402

_COUNT = itertools.count()


def _ssh_run(hosts, remote_dir, tmp_path, monkeypatch, python=sys.executable, **job_fields):
    tmp_path.mkdir(exist_ok=True)
    project = tmp_path / "project"
    shutil.copytree(JOB, project)
    monkeypatch.chdir(project)
    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path / "home"))
    spec = ClusterSpec(cloud="ssh", nodes=2, name="loopback", hosts=tuple(hosts.hosts[:2]))
    validate(spec)
    job = JobSpec(f"wd-{os.getpid()}-{next(_COUNT)}", command=("python", "train.py"), rdzv_port=free_port(),
                  max_seconds=180, threads_per_proc=1, output_dir=str(tmp_path / "results"), **job_fields)
    ledger = Ledger(tmp_path / "ledger.db")
    launcher = make_launcher(hosts, remote_dir, python=python)
    outcome = execute(spec, job, backend=backend_of(spec.cloud),
                      ledger=ledger, provider=SshProvider(launcher=launcher), launcher=launcher,
                      log_dir=tmp_path / "logs")
    return outcome, ledger.get_run(job.run_id).to_dict(), job


def test_ssh_files_written_in_the_working_folder_come_back_before_teardown(hosts, remote_dir, tmp_path, monkeypatch):
    """Also issue 28 item 6: `--remote-python NAME` (a bare name, as the default `python3` is)
    reaches every rank and --setup command as the absolute path the node's PATH gives it, its
    folder first on PATH. The name is one only the hosts' bin folder has (a wrapper around this
    test's Python): a login's own PATH entries (pyenv shims here) come before that folder."""
    import json

    want = hosts.bin_dir / "py-with-torch"
    want.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    want.chmod(0o755)
    outcome, run, job = _ssh_run(hosts, remote_dir, tmp_path, monkeypatch, python="py-with-torch",
                                 setup=("echo SETUP-PY $GPUCLUSTER_PYTHON ${PATH%%:*}",))
    assert outcome.status == "succeeded", outcome.failure
    want = str(want)
    logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("node-*.log"))
    seen = [json.loads(ln.split("PY ", 1)[1]) for ln in logs.splitlines() if ln.startswith("PY ")]
    assert len(seen) == 2 and all(s["gp"] == want and s["path0"] == os.path.dirname(want) for s in seen), seen
    assert logs.count(f"SETUP-PY {want} {os.path.dirname(want)}") == 2, logs[-2000:]
    out = tmp_path / "results"
    assert check_every_file_came_back(out, 2) == 9
    assert [o["verdict"] for o in run["outputs"]] == ["complete", "complete"]
    assert all(o["workdir_files"] > 0 for o in run["outputs"])
    nothing_left(hosts, remote_dir, job.run_id)  # the run folders are gone, nothing runs


def test_ssh_limit_is_partial_and_named(hosts, remote_dir, tmp_path, monkeypatch):
    outcome, run, job = _ssh_run(hosts, remote_dir, tmp_path, monkeypatch, env=(("BIG", "30000"),),
                                 collect_limit=20000)
    assert outcome.status == "failed" and "big.bin (30000 B)" in outcome.failure, outcome.failure
    assert [o["verdict"] for o in run["outputs"]] == ["partial", "partial"]
    assert not list((tmp_path / "results" / "workdir").rglob("big.bin"))
    nothing_left(hosts, remote_dir, job.run_id)


def test_ssh_data_beside_the_script_folder(hosts, remote_dir, tmp_path, monkeypatch):
    """`--data SRC:../data` (issue 28 item 7): staged beside `code/` in each node's run folder."""
    from gpucluster.watch.staging import parse_data

    data = tmp_path / "dataset"
    data.mkdir()
    (data / "input.txt").write_text("forty-two\n")
    outcome, run, job = _ssh_run(hosts, remote_dir, tmp_path, monkeypatch, data=parse_data([f"{data}:../data"]))
    assert outcome.status == "succeeded", outcome.failure
    logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("node-*.log"))
    assert logs.count("read ../data/input.txt: forty-two") == 2, logs[-2000:]
    assert not list((tmp_path / "results" / "workdir").rglob("input.txt"))
    nothing_left(hosts, remote_dir, job.run_id)


def test_ssh_resume_lays_the_scripts_own_snapshot_back(hosts, remote_dir, tmp_path, monkeypatch):
    """Issue 28 item 3 over ssh: the resumed run's rank-0 node's working-folder files are laid back
    into every node's `code/` before the job starts (writable copies, not the cache's links)."""
    import re

    import torch

    from gpucluster.plan.resume import resume_files, resume_source

    first, run1, job1 = _ssh_run(hosts, remote_dir, tmp_path / "a", monkeypatch, env=(("RESUME", "1"),))
    assert first.status == "succeeded", first.failure
    ledger = Ledger(tmp_path / "a" / "ledger.db")
    rid, mount = resume_source(ledger, job1.run_id)
    back = resume_files(ledger, rid, mount)
    head = next(r["node_rank"] for r in ledger.metrics(rid, "worker_start") if r["rank"] == 0)
    assert back == (f"workdir/node-{head}", f"node {head}, which held global rank 0")
    second, run2, job2 = _ssh_run(hosts, remote_dir, tmp_path / "b", monkeypatch, env=(("RESUME", "1"),),
                                  resume=mount, resume_files=back)
    assert second.status == "succeeded", second.failure
    logs = "".join(p.read_text() for p in (tmp_path / "b" / "logs").glob("node-*.log"))
    assert len(re.findall(r"rank \d resumed from snapshot.pt at epoch 1", logs)) == 2, logs[-2000:]
    assert [r["files"] for r in run2["resume_files"]] == [6, 6]  # all that node K wrote: model, snapshot, notes, 3 more
    new_head = next(r["node_rank"] for r in Ledger(tmp_path / "b" / "ledger.db").metrics(job2.run_id, "worker_start")
                    if r["rank"] == 0)
    assert torch.load(tmp_path / "b" / "results" / "workdir" / f"node-{new_head}" / "snapshot.pt")["epoch"] == 1
    nothing_left(hosts, remote_dir, job2.run_id)
