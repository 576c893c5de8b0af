"""Nothing a job writes in its working folder is lost (issue 28 items 1 and 2): a script that saves
relative to its working folder (a model, one event file per rank, a folder tree, a same-name file
on every node, a change to a shipped file) gets every such file back, per node, with the same
checksums, on local (each node in a copy of the script's folder of its own) and on real sshd;
a size limit names what is over and makes the verdict partial; --collect narrows the copy."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import FIXTURES, needs_torch, run_cli
from gpucluster.ledger.store import Ledger

pytestmark = [pytest.mark.slow]

JOB = FIXTURES / "workdir_job"


def only_run(home):
    runs = Ledger(home / "ledger.sqlite3").list_runs()
    assert len(runs) == 1, runs
    return Ledger(home / "ledger.sqlite3").get_run(runs[0].id).to_dict()


def check_every_file_came_back(out: Path, nodes: int) -> int:
    """Every file a rank says it wrote is in OUT/workdir/node-N of its node, same sha256; the
    files shipped and left alone are not; returns how many files were compared."""
    import hashlib

    compared = 0
    for n in range(nodes):
        wrote = {}
        for f in (out / f"node-{n}").glob("wrote-rank*.json"):
            wrote.update(json.loads(f.read_text()))
        assert wrote, f"node {n} reported nothing"
        work = out / "workdir" / f"node-{n}"
        for rel, digest in wrote.items():
            assert hashlib.sha256((work / rel).read_bytes()).hexdigest() == digest, (n, rel)
            compared += 1
        assert (work / "same-name.txt").read_text() == f"written by node {n}\n"
        assert not (work / "train.py").exists() and not (work / "unchanged.txt").exists()
        assert not (work / "outputs").exists()  # the output folder comes back on its own, once
    return compared


@needs_torch
def test_local_each_node_writes_in_its_own_folder_and_everything_comes_back(home, tmp_path):
    project = tmp_path / "project"
    shutil.copytree(JOB, project)
    out = tmp_path / "results"
    r = run_cli("run", "--nodes", "2", "--output", str(out), "--", "python", "train.py", cwd=project)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    run = only_run(home)
    assert check_every_file_came_back(out, 2) == 9
    rows = run["outputs"]
    assert [o["verdict"] for o in rows] == ["complete", "complete"]
    assert all(o["workdir_files"] > 0 for o in rows)
    assert sum(o["workdir_files"] for o in rows) == sum(
        1 for p in (out / "workdir").rglob("*") if p.is_file())
    assert "working folders:" in r.stdout and str(out / "workdir") in r.stdout
    # the user's folder is left as it was, and the per-node copies are gone
    assert sorted(p.name for p in project.iterdir()) == ["notes.txt", "train.py", "unchanged.txt"]
    assert (project / "notes.txt").read_text() == "shipped with the script\n"
    assert not (home / "runs" / run["id"] / "nodes").exists()


@needs_torch
def test_local_limit_names_what_is_over_and_collect_narrows(home, tmp_path):
    project = tmp_path / "project"
    shutil.copytree(JOB, project)
    out = tmp_path / "results"
    r = run_cli("run", "--nodes", "2", "--output", str(out), "--collect-limit", "20KB", "--", "python", "train.py",
                cwd=project, env={"BIG": "30000"})
    assert r.returncode == 1, r.stdout[-3000:]
    run = only_run(home)
    assert [o["verdict"] for o in run["outputs"]] == ["partial", "partial"]
    assert "big.bin (30000 B)" in run["failure"] and "over the 20.0 KB limit" in run["failure"]
    assert not list((out / "workdir").rglob("big.bin"))
    assert (out / "workdir" / "node-0" / "same-name.txt").is_file()  # what fits still came back

    out2 = tmp_path / "narrow"
    r = run_cli("run", "--nodes", "2", "--output", str(out2), "--collect", "*.pt", "--collect", "runs",
                "--", "python", "train.py", cwd=project, env={"GPUCLUSTER_HOME": str(tmp_path / "h2")})
    assert r.returncode == 0, r.stdout[-3000:]
    got = sorted(p.relative_to(out2 / "workdir").as_posix().split("/", 1)[1]
                 for p in (out2 / "workdir").rglob("*") if p.is_file())
    assert "model.pt" in got and "snapshot.pt" in got
    assert all(g.endswith(".pt") or g.startswith("runs/") for g in got), got


@pytest.mark.parametrize("flag,value,why", [
    ("--collect", "../up", "a pattern relative to the job's working folder"),
    ("--collect", "/etc/*", "a pattern relative to the job's working folder"),
    ("--collect-limit", "lots", "a size such as 500MB or 10GB"),
    ("--python", "/nonexistent/python", "no such executable"),
])
def test_bad_collect_and_python_values_are_refused(home, tmp_path, flag, value, why):
    (tmp_path / "train.py").write_text("print('never runs')\n")
    r = run_cli("run", "--nodes", "2", flag, value, "--", "python", "train.py", cwd=tmp_path)
    assert r.returncode == 2 and why in r.stderr and value in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (home / "ledger.sqlite3").exists()


def test_python_is_for_local_only(home, tmp_path):
    r = run_cli("run", "--cloud", "ssh", "--hosts", "u@h1,u@h2", "--python", "python3", "--", "python", "x.py")
    assert r.returncode == 2 and "--python does not apply to --cloud ssh" in r.stderr, r.stderr


@needs_torch
def test_local_data_beside_the_script_folder(home, tmp_path):
    """`--data SRC:../data` (issue 28 item 7): every node reads ../data from its working folder; the
    data (used in place through a link) does not come back as something the job wrote."""
    project, data = tmp_path / "project", tmp_path / "dataset"
    shutil.copytree(JOB, project)
    data.mkdir()
    (data / "input.txt").write_text("forty-two\n")
    out = tmp_path / "results"
    r = run_cli("run", "--nodes", "2", "--output", str(out), "--data", f"{data}:../data", "--", "python", "train.py",
                cwd=project)
    assert r.returncode == 0, r.stdout[-3000:]
    run = only_run(home)
    logs = "".join(p.read_text() for p in Path(run["log_dir"]).glob("node-*.log"))
    assert logs.count("read ../data/input.txt: forty-two") == 2, logs[-2000:]
    assert not list((out / "workdir").rglob("input.txt"))
    assert (data / "input.txt").read_text() == "forty-two\n"


@needs_torch
def test_a_failure_names_the_users_script_and_shows_the_failed_nodes_lines(home, tmp_path):
    """Issue 28 item 4: torchrun's failure summary names the user's script, not gpucluster's
    announcer program; the report prints the last lines of the node the failure names."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(FIXTURES / "crashy_train.py", project / "crashy_train.py")
    r = run_cli("run", "--nodes", "2", "--", "python", "crashy_train.py", cwd=project,
                env={"CRASH_RANK": "1", "CRASH_STEP": "3"})
    assert r.returncode == 1, r.stdout[-3000:]
    run = only_run(home)
    logs = "".join(p.read_text() for p in Path(run["log_dir"]).glob("node-*.log"))
    assert "crashy_train.py FAILED" in logs and "import json" not in logs, logs[-3000:]
    import re

    named = int(re.search(r"\bnode (\d+)\b", run["failure"]).group(1))
    assert f"last lines of node {named}:" in r.stdout


@needs_torch
def test_local_resume_lays_the_scripts_own_snapshot_back(home, tmp_path):
    """Issue 28 item 3: `--resume RUN` puts the files the resumed run's global-rank-0 node wrote in
    its working folder back into every node's working folder: a script that reloads its own
    snapshot.pt continues unchanged; which node they came from is recorded and shown."""
    import re

    import torch

    project = tmp_path / "project"
    shutil.copytree(JOB, project)
    first = run_cli("run", "--nodes", "2", "--", "python", "train.py", cwd=project, env={"RESUME": "1"})
    assert first.returncode == 0, first.stdout[-3000:]
    led = Ledger(home / "ledger.sqlite3")
    rid = led.list_runs()[0].id
    head = next(r["node_rank"] for r in led.metrics(rid, "worker_start") if r["rank"] == 0)
    second = run_cli("run", "--nodes", "2", "--resume", rid, "--", "python", "train.py", cwd=project,
                     env={"RESUME": "1"})
    assert second.returncode == 0, second.stdout[-3000:]
    assert f"node {head}, which held global rank 0" in second.stdout
    new = next(r.id for r in led.list_runs() if r.id != rid)
    logs = "".join(p.read_text() for p in (home / "runs" / new).glob("node-*.log"))
    assert len(re.findall(r"rank \d resumed from snapshot.pt at epoch 1", logs)) == 2, logs[-2000:]
    out = home / "runs" / new / "outputs" / "workdir"
    new_head = next(r["node_rank"] for r in led.metrics(new, "worker_start") if r["rank"] == 0)
    assert torch.load(out / f"node-{new_head}" / "snapshot.pt")["epoch"] == 1  # saved by the resumed run
    # the laid-back files come back with the run too (a later --resume finds them in this run)
    assert all((out / f"node-{n}" / "snapshot.pt").is_file() for n in (0, 1))
    shown = run_cli("show", new)
    assert f"from {home / 'runs' / rid / 'outputs' / 'workdir' / f'node-{head}'}" in shown.stdout, shown.stdout
    assert "laid back into 2 node(s)" in " ".join(shown.stdout.split())


@needs_torch
@pytest.mark.parametrize("error_first", [False, True])
def test_a_signal_after_the_last_line_is_named_as_such(home, tmp_path, error_first):
    """Issue 28 item 4: a worker killed by SIGABRT after its last output line (torch 2.13's exit
    abort) is reported as such; with an error among its last lines it is a plain signal death."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(FIXTURES / "abort_at_exit.py", project / "abort_at_exit.py")
    r = run_cli("run", "--nodes", "2", "--", "python", "abort_at_exit.py", cwd=project,
                env={"ABORT_RANK": "1", "ERROR_FIRST": "1" if error_first else "0"})
    assert r.returncode == 1, r.stdout[-3000:]
    failure = only_run(home)["failure"]
    if error_first:
        assert "worker ended with SIGABRT" in failure and "after its last line" not in failure, failure
    else:
        assert "worker ended with SIGABRT after its last line; its work may be complete" in failure, failure


@needs_torch
def test_local_python_is_explicit_and_given_to_every_rank_and_setup(home, tmp_path):
    """Issue 28 item 6: `--python` is what every node runs; every rank and --setup command gets
    GPUCLUSTER_PYTHON with its folder first on PATH, so `python` inside a wrapper is the same one."""
    import sys

    env_bin = tmp_path / "myenv" / "bin"
    env_bin.mkdir(parents=True)
    py = env_bin / "python"
    py.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    project = tmp_path / "project"
    project.mkdir()
    (project / "where.py").write_text(
        "import json, os, shutil\n"
        "print('PY ' + json.dumps({'gp': os.environ.get('GPUCLUSTER_PYTHON'), 'which': shutil.which('python'),"
        " 'rank': os.environ['RANK']}), flush=True)\n")
    r = run_cli("run", "--nodes", "2", "--python", str(py), "--setup", "echo SETUP-PY $GPUCLUSTER_PYTHON $(command -v python)",
                "--", "python", "where.py", cwd=project)
    assert r.returncode == 0, r.stdout[-3000:]
    run = only_run(home)
    text = "".join(p.read_text() for p in Path(run["log_dir"]).glob("node-*.log"))
    seen = [json.loads(ln.split("PY ", 1)[1]) for ln in text.splitlines() if ln.startswith("PY ")]
    assert len(seen) == 2 and all(s["gp"] == str(py) and s["which"] == str(py) for s in seen), seen
    assert text.count(f"SETUP-PY {py} {py}") == 2, text[-2000:]
    assert f"python: {py}" in r.stdout  # the plan names the nodes' Python
