"""`show --json`, `run --json` (the same record) and `runs --json` print the ledger's run records
byte for byte as they always have: scripts read these keys. Written against the dict records, kept
when `Ledger.get_run` became a typed record (issue 23 item 5), and when run statuses and verdicts
became enums (issue 39 item 3): `status --json`'s rows and the text run report (`show`) are pinned too.
The output verdicts written here are ones the code writes (complete, failed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpucluster.cli.main import cli
from gpucluster.ledger.store import Ledger

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

GOLDEN = Path(__file__).parent / "fixtures" / "json_records.txt"
T = 1_763_800_000.0

RUN_KEYS = ["id", "created_at", "ended_at", "status", "cloud", "cluster", "nodes", "gpus_per_node", "workload",
            "command", "spec", "prices", "failure", "exit_code", "metrics", "teardown_verified", "leftovers",
            "cost", "sweep_id", "log_dir", "teardown", "unchecked", "resumed_from"]
# issue 28 added "resume_files" (the working-folder files a --resume laid back) and each output row's
# "workdir_files"/"workdir_bytes" (what came back from the job's working folder): added keys, at the end
# issue 46 added "warnings" (the report's lines on whether the run trained: no rank joined a process group, ...)
RECORD_KEYS = RUN_KEYS + ["phases", "node_results", "outputs", "resources", "resumed_chain", "chain", "staging",
                          "setup", "resume_files", "warnings"]


def _fill(ledger: Ledger) -> None:
    spec = {"cloud": "aws", "name": "c1", "nodes": 2, "options": {"project": None}}
    ledger.create_run("r-old", cloud="aws", cluster="c1", nodes=2, gpus_per_node=1, command=["python", "t.py"],
                      spec=spec, workload="t.py", prices={"instance": "1.5"}, now=T)
    ledger.finish_run("r-old", status="interrupted", exit_code=130, failure="stopped by Ctrl-C",
                      teardown="verified", now=T + 50)
    ledger.create_run("r-new", cloud="aws", cluster="c1", nodes=2, gpus_per_node=1, command=["python", "t.py"],
                      spec=spec, workload="t.py", prices={"instance": "1.5"}, sweep_id="s1", log_dir="/logs/r-new",
                      resumed_from="r-old", now=T + 100)
    for i, phase in enumerate(("prepare", "provision", "stage", "setup", "train", "teardown")):
        ledger.phase_start("r-new", phase, now=T + 101 + i)
        ledger.phase_end("r-new", phase, "failed" if phase == "teardown" else "ok",
                         "1 leftover" if phase == "teardown" else None, now=T + 101.5 + i)
    rid = ledger.resource_requested("r-new", "instance", "c1-node-0", region="us-east-1",
                                    detail={"type": "g5.xlarge", "spot": False}, now=T + 102)
    assert rid == 1
    ledger.resource_created("r-new", "instance", "c1-node-0", "i-0abc", now=T + 103)
    ledger.resource_requested("r-new", "volume", "c1-vol", now=T + 102)
    ledger.resource_deleted("r-new", "volume", "c1-vol", now=T + 110)
    ledger.record_node("r-new", 0, "10.0.0.1", 0, ["epoch 1", "done"])
    ledger.record_node("r-new", 1, "10.0.0.2", 1, None)
    ledger.record_outputs("r-new", [{"node_rank": 0, "path": "/o/node-0", "files": 2, "bytes": 10, "seconds": 0.5,
                                     "verdict": "complete", "detail": None},
                                    {"node_rank": 1, "verdict": "failed", "detail": "no folder"}])
    ledger.add_metrics("r-new", [(0, {"kind": "stage", "time": T + 104, "mount": "/data", "bytes": 5}),
                                 (1, {"kind": "setup_end", "time": T + 105, "exit_code": 0}),
                                 (0, {"kind": "epoch", "time": T + 106, "loss": 0.5, "accuracy": 0.9})])
    ledger.finish_run("r-new", status="failed", exit_code=3, failure="node 1 exited 1",
                      metrics={"accuracy": 0.9, "epochs": 1}, teardown="leftovers",
                      leftovers=[{"kind": "instance", "name": "c1-node-0"}], unchecked=["s3 scan"], now=T + 120)
    ledger.set_cost("r-new", {"total": "0.12", "currency": "USD", "lines": [{"kind": "instance", "usd": "0.12"}]})
    # a kept cluster (`up`): its run succeeded, its teardown verdict "kept", one instance still up
    ledger.create_run("r-kept", cloud="aws", cluster="c2", nodes=1, gpus_per_node=1, command=["python", "k.py"],
                      spec={**spec, "name": "c2", "nodes": 1}, workload="k.py", prices={"instance": "1.5"}, now=T + 130)
    ledger.resource_requested("r-kept", "instance", "c2-node-0", region="us-east-1", now=T + 131)
    ledger.resource_created("r-kept", "instance", "c2-node-0", "i-0def", now=T + 132)
    ledger.finish_run("r-kept", status="succeeded", exit_code=0, teardown="kept", now=T + 140)


def _outputs(home: Path) -> dict[str, str]:
    ledger = Ledger(home / "ledger.sqlite3")
    _fill(ledger)
    ledger.close()
    runner = CliRunner()
    out = {}
    for name, args in (("show --json", ["show", "r-new", "--json"]), ("show old --json", ["show", "r-old", "--json"]),
                       ("runs --json", ["runs", "--json"]),
                       ("show (the run report)", ["show", "r-old"]), ("show kept", ["show", "r-kept"]),
                       ("cost report --json", ["cost", "report", "--json"])):
        res = runner.invoke(cli, args, catch_exceptions=False)
        assert res.exit_code == 0, res.output
        out[name] = res.output
    from gpucluster.cli.status import cluster_rows  # `status --json`'s rows, at a fixed time

    ledger = Ledger(home / "ledger.sqlite3")
    rows = [{k: ("(priced)" if k in ("hourly_usd", "accrued_usd") else v) for k, v in r.items()}  # not the catalog's prices
            for r in cluster_rows(ledger, now=T + 200, observe=False)]
    out["status --json"] = json.dumps(rows, indent=2, default=str) + "\n"
    ledger.close()
    return out


def test_show_json_keys_are_pinned(home):
    shown = json.loads(_outputs(home)["show --json"])
    assert list(shown) == RECORD_KEYS + ["metric_records"]
    assert [list(p) for p in shown["phases"]][0] == ["name", "started_at", "ended_at", "status", "detail"]
    assert [list(n) for n in shown["node_results"]] == [["node_rank", "host", "exit_code", "last_lines"]] * 2
    assert [list(o) for o in shown["outputs"]] == [["node_rank", "path", "files", "bytes", "seconds", "verdict",
                                                    "detail", "workdir_files", "workdir_bytes"]] * 2
    assert list(shown["resources"][0]) == ["id", "run_id", "kind", "name", "cloud_id", "region", "detail",
                                           "requested_at", "created_at", "deleted_at", "confirmed_gone"]
    assert shown["resources"][1]["confirmed_gone"] is True and shown["resources"][0]["confirmed_gone"] is False
    assert shown["teardown_verified"] is False and shown["unchecked"] == ["s3 scan"]
    assert shown["staging"] == [{"kind": "stage", "time": T + 104, "mount": "/data", "bytes": 5, "node_rank": 0}]
    assert shown["setup"] == [{"kind": "setup_end", "time": T + 105, "exit_code": 0, "node_rank": 1}]
    assert [m["kind"] for m in shown["metric_records"]] == ["stage", "setup_end", "epoch"]
    assert shown["resumed_chain"] == ["r-old"] and shown["chain"] == ["r-old", "r-new"]


def test_runs_json_keys_are_pinned(home):
    rows = json.loads(_outputs(home)["runs --json"])
    assert [r["id"] for r in rows] == ["r-kept", "r-new", "r-old"]
    assert all(list(r) == RUN_KEYS for r in rows)
    assert rows[1]["cost"]["total"] == "0.12" and rows[2]["cost"] is None and rows[2]["teardown_verified"] is True
    assert [(r["status"], r["teardown"]) for r in rows] == [("succeeded", "kept"), ("failed", "leftovers"),
                                                            ("interrupted", "verified")]


def test_json_outputs_are_byte_for_byte_as_before(home):
    got = _outputs(home)
    text = "".join(f"== {name}\n{out}" for name, out in got.items())
    assert text == GOLDEN.read_text(), "a --json output changed: scripts read these bytes"


def test_records_are_typed_and_round_trip(home):
    from gpucluster.ledger.records import NodeRow, PhaseRow, RunRecord, RunRow, StoredRun

    ledger = Ledger(home / "ledger.sqlite3")
    _fill(ledger)
    rec = ledger.get_run("r-new", with_metrics=True)
    assert isinstance(rec, RunRecord) and isinstance(rec.run, RunRow)
    assert (rec.id, rec.run.status, rec.run.exit_code, rec.run.wall_s) == ("r-new", "failed", 3, 20.0)
    assert rec.phases[0] == PhaseRow("prepare", T + 101, T + 101.5, "ok", None) and rec.phases[0].seconds == 0.5
    assert rec.phase("teardown").detail == "1 leftover" and rec.phase("outputs") is None
    assert rec.nodes == [NodeRow(0, "10.0.0.1", 0, ["epoch 1", "done"]), NodeRow(1, "10.0.0.2", 1, None)]
    assert [(o.node_rank, o.verdict, o.files) for o in rec.outputs] == [(0, "complete", 2), (1, "failed", None)]
    assert [(r.kind, r.cloud_id, r.confirmed_gone) for r in rec.resources] == [("instance", "i-0abc", False),
                                                                                ("volume", None, True)]
    assert (rec.staging[0].bytes, rec.staging[0].sent_bytes, rec.setup[0].node_rank) == (5, 0, 1)
    assert rec.cost["total"] == "0.12" and rec.chain == ["r-old", "r-new"]
    assert RunRecord.from_dict(rec.to_dict()) == rec and RunRecord.from_dict(rec.to_dict()).to_dict() == rec.to_dict()
    rows = ledger.list_runs()
    assert [type(r) for r in rows] == [StoredRun] * 3 and rows[2].teardown_verified is True
