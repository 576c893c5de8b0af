"""Resume (issue 14 item 4): the built-in workloads checkpoint after every epoch into their output
folder; `gpucluster run --resume RUN_ID` stages RUN_ID's collected outputs as GPUCLUSTER_RESUME_DIR
and the workload goes on after the epoch saved; the ledger links the runs and `cost report
--group-by chain` sums a chain as one job.

Real runs on the local backend (2 nodes, digits, few epochs) through the CLI; the workloads'
checkpoint code in-process; chains and grouping as units. (ssh: tests/test_ssh_resume.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

sys.path.insert(0, str(Path(__file__).parent))
from conftest import ROOT, gpucluster_argv, needs_torch, run_cli  # noqa: E402
from gpucluster.ledger.chains import ResumeLinks, ancestors, members, root_of  # noqa: E402
from gpucluster.costing.report import report  # noqa: E402
from gpucluster.ledger.store import Ledger  # noqa: E402
from gpucluster.ledger.records import RunRecord  # noqa: E402


# -- chains and the report's grouping (units) ------------------------------------------------
LINKS = {"a": (None, 1.0), "b": ("a", 2.0), "c": ("b", 3.0), "d": ("a", 4.0), "x": (None, 0.5), "y": ("x", 9.0)}


def test_chain_roots_members_and_ancestors():
    assert [root_of(r, LINKS) for r in "abcdxy"] == ["a", "a", "a", "a", "x", "x"]
    assert members("c", LINKS) == ["a", "b", "c", "d"]  # a branch (d also resumed a) is the same job
    assert members("x", LINKS) == ["x", "y"]
    assert ancestors("c", LINKS) == ["b", "a"] and ancestors("a", LINKS) == []
    assert root_of("lonely", LINKS) == "lonely" and members("lonely", {}) == ["lonely"]
    # a first run no longer in the ledger is still the chain's name; a hand-made loop ends
    assert root_of("q", {"q": ("gone", 1.0)}) == "gone"
    assert root_of("m", {"m": ("n", 1.0), "n": ("m", 2.0)}) in ("m", "n")
    assert ancestors("m", {"m": ("n", 1.0), "n": ("m", 2.0)}) == ["n"]


def test_indexed_links_give_the_same_chains():
    """Ledger.resume_links() gives a ResumeLinks: its chains are found once, with the answers of
    the plain walk over the links."""
    indexed = ResumeLinks(LINKS)
    for r in [*LINKS, "lonely"]:
        assert members(r, indexed) == members(r, LINKS)
    gone = {"q": ("gone", 1.0), "p": ("gone", 0.5)}  # the root is no longer in the ledger
    assert members("q", ResumeLinks(gone)) == members("q", gone) == ["gone", "p", "q"]


def test_cost_report_by_chain_is_linear_in_the_runs(home, monkeypatch):
    """`cost report --group-by chain` over a ledger of 2-run chains reads the resume links once and
    walks them a bounded number of times per run: reading them again for each run of each chain
    (chain_attempts) and walking every link for each chained run (members) made it quadratic:
    41 s of CPU with 10,000 runs, against 22 s for the plain report (benchmarks/ledger_scale.py)."""
    import gpucluster.ledger.chains as chains
    from click.testing import CliRunner

    from gpucluster.cli.cost import cost

    home.mkdir(parents=True)
    ledger = Ledger(home / "ledger.sqlite3")
    n = 300
    for i in range(n):
        rid = f"r{i:04d}"
        ledger.create_run(rid, cloud="local", cluster="c", nodes=1, gpus_per_node=0, command=["true"], spec={},
                          resumed_from=f"r{i - 1:04d}" if i % 2 else None, now=1000.0 + i)
        ledger.finish_run(rid, status="succeeded", exit_code=0, now=1000.5 + i)
    ledger.close()
    reads, walks = [], []
    real_links, real_root = Ledger.resume_links, chains.root_of
    monkeypatch.setattr(Ledger, "resume_links", lambda self: reads.append(1) or real_links(self))
    monkeypatch.setattr(chains, "root_of", lambda *a: walks.append(1) or real_root(*a))
    res = CliRunner().invoke(cost, ["report", "--group-by", "chain", "--json"])
    assert res.exit_code == 0, res.output
    groups = json.loads(res.stdout)["groups"]
    assert len(groups) == n // 2 and all(g["runs"] == 2 for g in groups)
    assert groups[0]["chain"] == "r0000" and groups[0]["run_ids"] == ["r0000", "r0001"]
    assert len(reads) == 1, f"the resume links were read {len(reads)} times for {n} runs"
    assert len(walks) <= 5 * n, f"{len(walks)} walks of the links for {n} runs: more than linear"


def _run(rid, created, cost, resumed_from=None, cloud="aws"):
    return RunRecord.from_dict({"id": rid, "created_at": created, "ended_at": created + 100, "cloud": cloud,
                                "cluster": "c", "status": "succeeded", "nodes": 2, "resumed_from": resumed_from,
                                "cost": {"total": cost, "still_billing": False, "notes": []}})


def test_report_groups_a_chain_as_one_job():
    runs = [_run("a", 1000, "1.25"), _run("b", 2000, "2.50", "a"), _run("c", 3000, "0.05", "b"),
            _run("z", 1500, "7")]
    rep = report(runs, backends={}, group_by="chain")  # every run holds its cost: no backend is asked
    groups = {g["chain"]: g for g in rep["groups"]}
    assert groups["a"]["run_ids"] == ["a", "b", "c"] and groups["a"]["runs"] == 3
    assert Decimal(groups["a"]["cost"]) == Decimal("3.80") and groups["a"]["wall_s"] == 300
    assert groups["z"]["run_ids"] == ["z"] and Decimal(groups["z"]["cost"]) == 7
    assert Decimal(rep["total"]) == Decimal("10.80")
    assert [r["resumed_from"] for r in rep["runs"]] == [None, None, "a", "b"]
    # --since left the first run out: the ledger's links still name the chain by it
    later = report(runs[1:3], backends={}, group_by="chain",
                   links={"a": (None, 1000), "b": ("a", 2000), "c": ("b", 3000)})
    assert [(g["chain"], g["run_ids"]) for g in later["groups"]] == [("a", ["b", "c"])]
    assert report(runs, backends={}, group_by="cloud")["groups"][0].get("run_ids") is None


def test_ledger_migration_adds_the_link_to_an_old_ledger(tmp_path):
    from conftest import write_old_ledger
    from gpucluster.ledger.schema import MIGRATIONS

    path = tmp_path / "old.sqlite3"
    write_old_ledger(path, 3)
    ledger = Ledger(path)
    assert ledger.schema_version == MIGRATIONS[-1][0] >= 4  # every later migration applied too
    assert ledger.get_run("old").to_dict()["resumed_from"] is None and ledger.get_run("old").to_dict()["chain"] == ["old"]
    ledger.create_run("new", cloud="local", cluster="c", nodes=2, gpus_per_node=0, command=[], spec={},
                      resumed_from="old")
    assert ledger.resume_links() == {"old": (None, 1.0), "new": ("old", ledger.get_run("new").to_dict()["created_at"])}
    assert ledger.get_run("new").to_dict()["chain"] == ["old", "new"] and ledger.get_run("old").to_dict()["chain"] == ["old", "new"]


# -- the workloads' checkpoints, in-process (one process, no process group) ------------------
@needs_torch
def test_checkpoint_missing_damaged_or_foreign_fails_in_one_line(tmp_path, monkeypatch, capsys):
    from gpucluster.workloads import digits, synthetic

    monkeypatch.setenv("GPUCLUSTER_OUTPUT_DIR", str(tmp_path / "a" / "node-0"))
    synthetic.main(["--epochs", "2", "--steps", "2", "--width", "32", "--warmup", "0"])
    ckpt = tmp_path / "a" / "node-0" / "checkpoint.pt"
    assert ckpt.is_file() and not list(ckpt.parent.glob("*.tmp*"))  # written whole, then renamed
    records = _records(capsys.readouterr().out)
    assert [r["epoch"] for r in records if r["kind"] == "checkpoint"] == [1, 2]

    monkeypatch.delenv("GPUCLUSTER_OUTPUT_DIR")
    monkeypatch.setenv("GPUCLUSTER_RESUME_DIR", str(tmp_path / "a"))
    with pytest.raises(SystemExit) as exc:  # a synthetic checkpoint is not a digits one
        digits.main(["--epochs", "3"])
    assert "workload 'synthetic', not 'digits'" in str(exc.value) and "\n" not in str(exc.value)

    synthetic.main(["--epochs", "2", "--steps", "2", "--width", "32", "--warmup", "0"])  # nothing left to do
    out = capsys.readouterr().out
    assert "checkpoint is at epoch 2, --epochs is 2: nothing left to train" in out
    assert [r for r in _records(out) if r["kind"] == "epoch"] == []
    assert _records(out)[0]["resumed_from_epoch"] == 2

    with pytest.raises(SystemExit) as exc:  # the model's shape differs: no silent fresh start
        synthetic.main(["--epochs", "3", "--steps", "2", "--width", "16", "--warmup", "0"])
    assert "does not fit this model" in str(exc.value)

    ckpt.write_bytes(ckpt.read_bytes()[:200])  # cut short
    with pytest.raises(SystemExit) as exc:
        synthetic.main(["--epochs", "3", "--steps", "2", "--width", "32", "--warmup", "0"])
    assert f"{ckpt} cannot be read" in str(exc.value) and "\n" not in str(exc.value)

    monkeypatch.setenv("GPUCLUSTER_RESUME_DIR", str(tmp_path / "empty"))
    (tmp_path / "empty" / "node-0").mkdir(parents=True)
    with pytest.raises(SystemExit) as exc:
        synthetic.main(["--epochs", "3"])
    assert "no checkpoint.pt in" in str(exc.value)


def _records(text: str) -> list[dict]:
    prefix = "@gpucluster-metric "
    return [json.loads(ln[ln.index(prefix) + len(prefix):]) for ln in text.splitlines() if prefix in ln]


# -- real runs on the local backend ------------------------------------------------------------
def _epochs(ledger: Ledger, run_id: str, kind: str = "epoch") -> list[int]:
    return [r["epoch"] for r in ledger.metrics(run_id, kind)]


def _checkpoint_epoch(path: Path) -> int:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)["epoch"]


def _only_new(ledger: Ledger, known: set[str]) -> str:
    new = [r.id for r in ledger.list_runs() if r.id not in known]
    assert len(new) == 1, new
    return new[0]


@needs_torch
@pytest.mark.slow
def test_ctrl_c_costs_at_most_one_epoch_resume_goes_on_and_the_chain_is_one_job(home):
    """Run A is stopped by Ctrl-C after its second checkpoint; `--resume A` trains only the epochs
    after the last one saved; the ledger links the two, `show` and `cost report --group-by chain`
    say so. (Two real runs: a resume after a clean finish runs over ssh in test_ssh_resume.py.)"""
    env = dict(os.environ, COLUMNS="200")
    proc = subprocess.Popen(gpucluster_argv("run", "--nodes", "2", "--epochs", "200"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT, start_new_session=True)
    seen, deadline = [], time.monotonic() + 150
    for line in proc.stdout:
        seen.append(line)
        if "checkpoint" in line and "epoch 2" in line:
            break
        assert time.monotonic() < deadline, "".join(seen)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 130, out[-2000:]
    ledger = Ledger(home / "ledger.sqlite3")
    a = _only_new(ledger, set())
    assert ledger.get_run(a).to_dict()["status"] == "interrupted"
    saved = [r["epoch"] for r in ledger.metrics(a, "checkpoint") if r["node_rank"] == 0 and r["reason"] == "epoch"]
    k = saved[-1]  # the last epoch saved before Ctrl-C (>= 2): one checkpoint after every epoch
    assert k >= 2 and saved == list(range(1, k + 1)) and _epochs(ledger, a)[:k] == saved
    # every node keeps a copy; on the SIGTERM that Ctrl-C sends the ranks, each saves where it is
    assert {r["node_rank"] for r in ledger.metrics(a, "checkpoint")} == {0, 1}
    ckpt = home / "runs" / a / "outputs" / "node-0" / "checkpoint.pt"
    assert _checkpoint_epoch(ckpt) == k

    again = run_cli("run", "--nodes", "2", "--epochs", str(k + 2), "--resume", a[:12], "--json")
    assert again.returncode == 0, again.stderr[-3000:]
    b = json.loads(again.stdout)["id"]
    assert _only_new(ledger, {a}) == b
    assert _epochs(ledger, b) == [k + 1, k + 2]  # epochs 1..k were not trained again
    start = ledger.metrics(b, "start")[0]
    assert start["resumed_from_epoch"] == k and start["resumed_from"] == str(ckpt)  # local: used in place
    assert _checkpoint_epoch(home / "runs" / b / "outputs" / "node-0" / "checkpoint.pt") == k + 2
    run_b = ledger.get_run(b).to_dict()
    assert run_b["resumed_from"] == a and run_b["chain"] == [a, b] and run_b["status"] == "succeeded"
    assert run_b["metrics"]["accuracy"] > 0.5
    shown = run_cli("show", b)
    assert f"resumed from {a}" in shown.stdout and f"chain: {a} -> {b} (this run)" in shown.stdout
    assert json.loads(run_cli("show", a, "--json").stdout)["chain"] == [a, b]

    rep = json.loads(run_cli("cost", "report", "--group-by", "chain", "--json").stdout)
    assert [(g["chain"], g["run_ids"], g["runs"]) for g in rep["groups"]] == [(a, [a, b], 2)]
    text = run_cli("cost", "report", "--group-by", "chain").stdout
    assert "By chain" in text and f"{a}, {b}" in text
