"""The report shows the real cause (issue 28 item 4): the last lines printed are those of the node
the failure names, not of the first node with a non-zero or missing exit code (a node gpucluster
stopped because of the other shows only the consequence); no empty `result:` line."""

from __future__ import annotations

from rich.console import Console

import pytest

from gpucluster.cli.render import run_report
from gpucluster.ledger.store import Ledger

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def _report(tmp_path, failure, metrics=None):
    ledger = Ledger(tmp_path / "l.db")
    ledger.create_run("r1", cloud="local", cluster="c", nodes=2, gpus_per_node=0, command=["python", "t.py"],
                      spec={}, workload=None)
    ledger.record_node("r1", 0, "local:0", None, ["epoch 3 loss 0.1", "Connection closed by peer"])
    ledger.record_node("r1", 1, "local:1", 1, ["Traceback (most recent call last):",
                                                "FileNotFoundError: [Errno 2] No such file: 'data/x'"])
    ledger.finish_run("r1", status="failed", exit_code=1, failure=failure, metrics=metrics)
    con = Console(record=True, width=200)
    run_report(con, ledger.get_run("r1"))
    return con.export_text()


def test_last_lines_are_those_of_the_node_the_failure_names(tmp_path):
    text = _report(tmp_path, "node 1 (local:1) exited with code 1")
    assert "last lines of node 1:" in text and "FileNotFoundError" in text
    assert "last lines of node 0:" not in text and "Connection closed by peer" not in text


def test_without_a_named_node_the_first_failed_node_is_shown(tmp_path):
    text = _report(tmp_path, "the run exceeded its time limit of 1 minutes")
    assert "last lines of node 0:" in text and "Connection closed by peer" in text


def test_no_empty_result_line(tmp_path):
    assert "result:" not in _report(tmp_path, "node 1 (local:1) exited with code 1", metrics={})


def test_logs_hide_the_tools_own_metric_lines_unless_asked(tmp_path, monkeypatch):
    """Issue 28 item 8: `logs` shows the job's output; the sampler's and announcer's records only
    with --metrics or --raw; a workload's own metric records are the job's, always shown."""
    from conftest import run_cli

    home = tmp_path / "home"
    monkeypatch.setenv("GPUCLUSTER_HOME", str(home))
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "node-0.log").write_text(
        "epoch 1 loss 0.5\n"
        '@gpucluster-metric {"kind":"util","node_rank":0,"cpu_percent":50}\n'
        '@gpucluster-metric {"kind":"worker_start","rank":0,"local_rank":0,"pid":1}\n'
        '@gpucluster-metric {"kind":"epoch","epoch":1,"loss":0.5}\n'
        "done\n")
    ledger = Ledger(home / "ledger.sqlite3")
    ledger.create_run("r20261125-000000-abcdef", cloud="local", cluster="c", nodes=1, gpus_per_node=0,
                      command=["python", "t.py"], spec={}, workload=None, log_dir=str(logs))
    ledger.finish_run("r20261125-000000-abcdef", status="succeeded", exit_code=0)
    ledger.close()
    quiet = run_cli("logs", "r20261125-000000-abcdef").stdout
    lines = quiet.splitlines()  # the workload's record is shown, summarised (`logs --raw`: as written)
    assert len(lines) == 3 and lines[0] == "epoch 1 loss 0.5" and lines[2] == "done", lines
    assert "epoch 1" in lines[1] and "loss 0.5" in lines[1] and "util" not in quiet and "worker_start" not in quiet
    for flag in ("--metrics", "--raw"):
        assert len(run_cli("logs", "r20261125-000000-abcdef", flag).stdout.splitlines()) == 5


def _staged_report(tmp_path, recs):
    ledger = Ledger(tmp_path / "s.db")
    ledger.create_run("r1", cloud="ssh", cluster="c", nodes=2, gpus_per_node=0, command=["python", "t.py"],
                      spec={}, workload=None)
    ledger.add_metrics("r1", [(i, {"kind": "stage", **r}) for i, r in enumerate(recs)])
    ledger.finish_run("r1", status="succeeded", exit_code=0)
    con = Console(record=True, width=250)
    run_report(con, ledger.get_run("r1"))
    return con.export_text()


def test_staging_line_names_cache_hits_only_when_there_were_some(tmp_path):
    """Issue 28 item 8: a cold cache sent every file (plus tar's headers: more bytes than the data);
    the line says no "% ... in the nodes' cache" then; a warm one says how many files were there."""
    cold = _staged_report(tmp_path, [{"files": 3, "bytes": 2000, "sent_files": 3, "sent_bytes": 10240,
                                      "seconds": 0.2}] * 2)
    assert "sent 20.0 KB," in cold and "cache" not in cold and "%" not in cold.split("data:")[1].split("\n")[0]
    (tmp_path / "w").mkdir()
    warm = _staged_report(tmp_path / "w", [{"files": 3, "bytes": 2000, "sent_files": 1, "sent_bytes": 3000,
                                            "seconds": 0.2}] * 2)
    assert "(4 of 6 file(s) were in the nodes' cache)" in warm


def test_a_multi_node_run_whose_workers_each_had_world_size_1_is_warned_about(tmp_path):
    """Issue 28 item 8: Lightning without num_nodes trains one job per node; its own start line says
    MEMBER: 1/1 on every node (the line Lightning logs when its process group starts, as its SLURM
    troubleshooting docs show: "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/4"), which becomes a
    `world` record; the report warns."""
    from gpucluster.watch.metrics import MetricsState
    from gpucluster.watch.supervisor import world_record

    state = MetricsState()
    for line in ("[rank: 0] Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/1",
                 "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/1"):
        state.update(world_record(line))
    assert state.summary()["world_size"] == 1
    text = _report(tmp_path, None, metrics=state.summary())
    assert "warning: every worker's world size was 1 on a 2-node run" in " ".join(text.split())
    good = MetricsState()
    for r in (0, 1):
        good.update(world_record(f"Initializing distributed: GLOBAL_RANK: {r}, MEMBER: {r + 1}/2"))
    (tmp_path / "g").mkdir()
    assert "warning: every worker" not in _report(tmp_path / "g", None, metrics=good.summary())
    assert world_record("epoch 1 loss 0.3") is None


START = '@gpucluster-metric {"kind": "worker_start", "rank": 0, "local_rank": 0, "pid": 1}'
UTIL = '@gpucluster-metric {"kind":"util","time":1.0,"node_rank":0,"gpu":[],"cpu_cores":0.2}'


def _succeeded(tmp_path, lines, metrics=None, files=0):
    ledger = Ledger(tmp_path / "l.db")
    ledger.create_run("r1", cloud="local", cluster="c", nodes=2, gpus_per_node=0, command=["python", "main.py"],
                      spec={}, workload=None)
    for rank in (0, 1):
        ledger.record_node("r1", rank, f"local:{rank}", 0, [UTIL, START, *lines, UTIL])
    ledger.record_outputs("r1", [{"node_rank": 0, "path": "/o/node-0", "files": 0, "bytes": 0, "verdict": "complete",
                                  "workdir_files": files, "workdir_bytes": files}])
    ledger.finish_run("r1", status="succeeded", exit_code=0, failure=None, metrics=metrics or {"final_records": 0})
    con = Console(record=True, width=200)
    run_report(con, ledger.get_run("r1"))
    return " ".join(con.export_text().split())


def test_a_script_that_exits_0_without_training_gets_a_warning(tmp_path):
    """minGPT-ddp exits 0 after one line when a node has fewer than 2 GPUs: SUCCEEDED, but the
    report (and `show`, the same report) asks whether it trained (issue 46 item 2)."""
    text = _succeeded(tmp_path, ["Unable to locate sufficient 2 gpus to run this example. Exiting."])
    assert "SUCCEEDED" in text
    assert ("warning: no sign of training: no rank reported a metric or a loss, no node wrote a file" in text
            and "node 0 last printed 'Unable to locate sufficient 2 gpus" in text and "Did the script train?" in text)
    # progress printed, a printed loss read as a metric, or many lines: no warning
    for i, (lines, metrics) in enumerate([([f"step {i}" for i in range(10)], None),
                                          (["epoch 1 loss 0.3"], {"loss": 0.3, "metrics_source": "text"}),
                                          (["hi"], {"world_size": 2})]):
        (tmp_path / str(i)).mkdir()
        assert "no sign of training" not in _succeeded(tmp_path / str(i), lines, metrics)
    (tmp_path / "f").mkdir()
    assert "no sign of training" not in _succeeded(tmp_path / "f", ["saved"], files=1)  # a file written: trained
