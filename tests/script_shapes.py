"""Issue 46 done-means 3: three public script shapes, run unmodified through the real CLI on local
and on ssh (tests/test_shapes_local.py, tests/test_shapes_ssh.py). The shapes are small scripts in
tests/fixtures/shapes/, each laid out as its original is (nothing is downloaded):

- `lightning_cli`: `python main.py fit --config config.yaml`; rank 0 writes `lightning_logs/version_0/`
  with its checkpoint (LightningCLI's layout);
- `hydra_app`: composed config, `outputs/DATE/TIME/` per process, and `data/vocab.txt` tracked by git
  under a `.gitignore` line `data/` (git never applies .gitignore to tracked files: it must ship);
- `nanogpt`: `.bin`/`.pkl` data made by `data/shakespeare_char/prepare.py` (ignored by git, so not
  shipped and named in the plan; `--setup` makes them on each node, as nanoGPT's first step does),
  `out/ckpt.pt` from the master process, then `--resume RUN` with `--init_from=resume`.

The DDP tutorial with its snapshot.pt resume and a script reading `../data` are tests/test_workdir.py
and tests/test_ssh_workdir.py. Each case asserts the files home, the resume, teardown verified and
nothing of the run left (processes by run id; the hosts' run folders)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from conftest import FIXTURES, run_cli
from gpucluster.ledger.store import Ledger
from gpucluster.watch.procs import run_processes

SHAPES = FIXTURES / "shapes"


def project(tmp_path: Path, shape: str) -> Path:
    """The shape's folder as its user has it: a git repository (its .gitignore in place, everything
    not ignored committed; a tracked file under an ignored name added with -f, as happens when a
    line is added to .gitignore after the file was committed)."""
    dest = tmp_path / shape
    shutil.copytree(SHAPES / shape, dest)
    if (dest / "gitignore").exists():
        (dest / "gitignore").rename(dest / ".gitignore")
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q"], cwd=dest, check=True)
    subprocess.run([*git, "add", "-A"], cwd=dest, check=True)
    if shape == "hydra_app":
        subprocess.run([*git, "add", "-f", "data/vocab.txt"], cwd=dest, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "shape"], cwd=dest, check=True)
    return dest


def finished(home: Path, before: set[str] = frozenset()) -> tuple[str, dict]:
    ledger = Ledger(home / "ledger.sqlite3")
    rid = next(r.id for r in ledger.list_runs() if r.id not in before)
    run = ledger.get_run(rid).to_dict()
    assert run["status"] == "succeeded" and run["teardown"] == "verified", (run["status"], run["teardown"],
                                                                           run.get("failure"))
    assert run_processes(rid) == []
    return rid, run


def workdir(home: Path, rid: str) -> Path:
    return home / "runs" / rid / "outputs" / "workdir"


def check_lightning(home: Path, cwd: Path, reach: tuple[str, ...]) -> str:
    done = run_cli("run", *reach, "--nodes", "2", "--", "python", "main.py", "fit", "--config", "config.yaml",
                   cwd=cwd, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    rid, _ = finished(home)
    ckpts = sorted(p.relative_to(workdir(home, rid)).as_posix() for p in workdir(home, rid).rglob("*.ckpt"))
    assert len(ckpts) == 1 and ckpts[0].endswith("lightning_logs/version_0/checkpoints/epoch=1-step=2.ckpt"), ckpts
    assert list(workdir(home, rid).rglob("lightning_logs/version_0/metrics.csv"))
    return rid


def check_hydra(home: Path, cwd: Path, reach: tuple[str, ...]) -> str:
    done = run_cli("run", *reach, "--nodes", "2", "--", "python", "train.py", "trainer.steps=2", cwd=cwd,
                   timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    rid, _ = finished(home)
    # one per process, each on its node: under workdir/node-N/outputs/ where the node's output folder is
    # elsewhere (local), in the output folder itself where it is the script folder's outputs/ (ssh)
    logs = sorted((home / "runs" / rid / "outputs").rglob("*-rank[01]/train.log"))
    assert len(logs) == 2, sorted((home / "runs" / rid / "outputs").rglob("*"))
    assert all("vocab 9" in p.read_text() for p in logs)
    assert len(list((home / "runs" / rid / "outputs").rglob("*-rank[01]/.hydra/config.yaml"))) == 2
    assert not list(workdir(home, rid).rglob("vocab.txt"))  # shipped, unchanged: not an output
    return rid


def check_nanogpt(home: Path, cwd: Path, reach: tuple[str, ...]) -> str:
    prep = subprocess.run(["python", "data/shakespeare_char/prepare.py"], cwd=cwd, capture_output=True, text=True)
    assert prep.returncode == 0, prep.stderr  # the documented first step, on the user's machine
    setup = ("--setup", "python data/shakespeare_char/prepare.py")  # and on each node: the .bin files are not shipped
    first = run_cli("run", *reach, "--nodes", "2", *setup, "--", "python", "train.py", "--max_iters=4", cwd=cwd,
                    timeout=300)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    assert "data/shakespeare_char/train.bin" in " ".join(first.stdout.split()), first.stdout[:3000]  # named as left out
    rid, _ = finished(home)
    assert len(list(workdir(home, rid).rglob("out/ckpt.pt"))) == 1  # the master process's
    # what --setup makes in the working folder counts as the job's and comes back (README, known limits)
    second = run_cli("run", *reach, "--nodes", "2", *setup, "--resume", rid, "--", "python", "train.py",
                     "--init_from=resume", "--max_iters=6", cwd=cwd, timeout=300)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    rid2, _ = finished(home, {rid})
    logs = "".join(p.read_text() for p in (home / "runs" / rid2).glob("node-*.log"))
    assert "Resuming training from out at iter 4" in logs and "iter 6: loss" in logs, logs[-2000:]
    import torch

    ckpt = next(workdir(home, rid2).rglob("out/ckpt.pt"))
    assert torch.load(ckpt)["iter_num"] == 6
    return rid2


def nothing_on_hosts(rids: list[str]) -> None:
    """The hosts of tests/sshd.py are this machine: their run folders are under this user's home."""
    for rid in rids:
        assert not (Path.home() / ".gpucluster" / "runs" / rid).exists(), rid
        assert run_processes(rid) == [], rid
    os.sync()
