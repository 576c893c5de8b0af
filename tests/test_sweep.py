"""`gpucluster sweep`: a real local sweep over 1 and 2 nodes of the synthetic workload, and bad input."""

import json

import pytest

from conftest import needs_torch, run_cli
from gpucluster.infra.local.catalog import gpus_present
from gpucluster.cli.main import main
from gpucluster.ledger.store import Ledger
from test_plots import assert_sensible_png

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

SMALL = "--epochs 2 --steps 5 --width 256"


@needs_torch
@pytest.mark.slow
def test_real_local_sweep_one_and_two_nodes(home, tmp_path):
    pytest.importorskip("matplotlib")
    report = tmp_path / "report"
    r = run_cli("sweep", "--nodes", "1,2", "--workload", "synthetic", "--workload-args", SMALL, "--threads-per-proc",
                "1", "--json", "--report", str(report), "--setup", "echo sweep-setup-ran on $GPUCLUSTER_NODE_RANK",
                "--data", str(tmp_path), env={"GPUCLUSTER_UTIL_INTERVAL": "0.2"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    sizes = {s["nodes"]: s for s in out["sizes"]}
    assert sorted(sizes) == [1, 2]
    for n, s in sizes.items():
        assert s["world_size"] == n and s["failed"] == [] and len(s["runs"]) == 1
        assert s["samples_per_s"]["median"] > 0 and s["train_s"]["median"] > 0
        assert s["epochs"] == 2 and s["loss"]["median"] > 0
        assert s["cost_usd"]["median"] == "0" and s["cost_per_epoch_usd"]["median"] == "0"
        assert {"provision", "setup", "rendezvous", "train", "teardown"} <= set(s["phases"])
        assert s["baseline_nodes"] == 1 and s["efficiency_basis"] == "samples/s"
    assert sizes[1]["efficiency"] == pytest.approx(1.0)
    expected = sizes[2]["samples_per_s"]["median"] / (2 * sizes[1]["samples_per_s"]["median"])
    assert sizes[2]["efficiency"] == pytest.approx(expected)
    # The tiny job is dominated by start-up; whatever the verdict, each finding names a known rule.
    from gpucluster.sweep.diagnose import RULES

    assert all(f["rule"] in RULES and f["message"] for f in out["findings"])

    # Every run is in the ledger under the sweep id, with utilisation records from every node.
    ledger = Ledger(home / "ledger.sqlite3")
    runs = [r.to_dict() for r in ledger.list_runs(sweep_id=out["sweep_id"])]
    assert sorted(x["nodes"] for x in runs) == [1, 2]
    assert all(x["status"] == "succeeded" and x["teardown"] == "verified" for x in runs)
    two = next(x for x in runs if x["nodes"] == 2)
    for rank in (0, 1):  # --setup ran on every node of every run, before training
        assert f"sweep-setup-ran on {rank}" in (home / "runs" / two["id"] / f"node-{rank}.log").read_text()
    util = ledger.metrics(two["id"], "util")
    assert {u["node_rank"] for u in util} == {0, 1}
    assert all(0 <= u["cpu_percent"] <= 100 for u in util if u["cpu_percent"] is not None)

    # Every figure and the summary.
    md = (report / "summary.md").read_text()
    pngs = sorted(report.glob("*.png"))
    names = {p.name for p in pngs}
    assert {"time_vs_nodes.png", "cost_vs_nodes.png", "efficiency_vs_nodes.png", "throughput_vs_nodes.png"} <= names
    assert {f"util_{x['id']}.png" for x in runs} <= names
    for p in pngs:
        assert_sensible_png(p)
        assert f"]({p.name})" in md
    assert out["report"] == str(report / "summary.md")

    # The terminal table renders from the ledger too (no --json).
    from gpucluster.cli.sweep import report as render_report
    from gpucluster.infra.registry import plugin
    from rich.console import Console

    con = Console(width=200, record=True)
    assert render_report(con, ledger, out["sweep_id"], 0.7, plugin("local"), as_json=False, report_dir=None) == 0
    text = con.export_text()
    assert "efficiency" in text and "wall time per phase" in text


@pytest.mark.parametrize("args,needle", [
    (["--nodes", "1,x"], "nodes 'x' is not allowed"),
    (["--nodes", "0"], "nodes '0' is not allowed"),
    (["--nodes", "1,1"], "repeated"),
    (["--nodes", "1,,2"], "comma-separated"),
    (["--nodes", ""], "comma-separated"),
    (["--nodes", "17"], "from 1 to 16"),
    (["--repeat", "0"], "repeat '0' is not allowed"),
    (["--threshold", "1.5"], "threshold '1.5' is not allowed"),
    (["--threshold", "abc"], "threshold 'abc' is not allowed"),
    (["--gpus-per-node", "0,-1"], "gpus per node '-1' is not allowed"),
    (["--workload", "synthetc"], 'did you mean "synthetic"'),
    (["--cloud", "azure"], "cloud 'azure' is not allowed"),
    (["--workload", "digits", "--", "python", "x.py"], "either --workload or a command"),
])
def test_bad_input_is_one_line_exit_2(home, capsys, args, needle):
    assert main(["sweep", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpucluster: error:") and needle in err[0], err
    assert not (home / "ledger.sqlite3").exists() or Ledger(home / "ledger.sqlite3").list_runs() == []


@pytest.mark.skipif(gpus_present() > 0, reason="this machine has GPUs: the comparison would run")
@pytest.mark.parametrize("args", [["--compare-cpu"], ["--gpus-per-node", "0,1"]])
def test_compare_cpu_refused_without_gpus(home, capsys, args):
    assert main(["sweep", "--nodes", "1", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "there is no GPU to compare against" in err[0]


@pytest.mark.skipif(gpus_present() > 0, reason="needs a machine without GPUs")
def test_every_size_is_validated_before_anything_runs(tmp_path):
    from gpucluster.infra.contract import LaunchOptions
    from gpucluster.infra.registry import plugin
    from gpucluster.errors import SpecError
    from gpucluster.watch.launch import JobSpec
    from gpucluster.spec import ClusterSpec
    from gpucluster.sweep.runner import run_sweep

    ledger = Ledger(tmp_path / "l.sqlite3")
    with pytest.raises(SpecError, match="no NVIDIA GPU"):
        run_sweep(ClusterSpec(cloud="local", nodes=1), JobSpec(run_id="t", workload="synthetic"), [1, 2], [0, 1], 1,
                  ledger, plugin("local").transport.make(LaunchOptions()), plugin=plugin("local"))
    assert ledger.list_runs() == []


def test_plan_interleaves_repeats():
    from gpucluster.sweep.runner import plan_sizes

    assert plan_sizes([1, 2], [0, 1], 2) == [(1, 0, 1), (2, 0, 1), (1, 1, 1), (2, 1, 1),
                                             (1, 0, 2), (2, 0, 2), (1, 1, 2), (2, 1, 2)]


def test_help_lists_the_options():
    r = run_cli("sweep", "--help")
    assert r.returncode == 0
    for opt in ("--nodes", "--gpus-per-node", "--repeat", "--compare-cpu", "--json", "--report", "--threshold"):
        assert opt in r.stdout
