"""The state enums and the output destination (issue 39 item 3): each member is the very string the
ledger stores and `--json` prints; records read from the ledger hold members; `JobSpec.output`
classifies `--output` once."""

from __future__ import annotations

import json
import sqlite3

import pytest

from gpucluster.watch.launch import JobSpec
from gpucluster.ledger.store import Ledger
from gpucluster.ledger.schema import PHASES, RUN_STATES, TEARDOWN_STATES
from gpucluster.states import (DestKind, OutputDest, OutputVerdict, Phase, PhaseStatus, RunStatus, TeardownVerdict,
                               parse)

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def test_the_values_are_the_stored_strings():
    assert RUN_STATES == ("running", "succeeded", "failed", "interrupted", "stopped")
    assert TEARDOWN_STATES == ("verified", "leftovers", "not verified", "kept")
    assert PHASES == ("prepare", "provision", "ready", "check", "stage", "setup", "rendezvous", "train", "outputs",
                      "teardown")
    assert [s.value for s in PhaseStatus] == ["ok", "failed", "interrupted"]
    assert [s.value for s in OutputVerdict] == ["complete", "partial", "failed"]


@pytest.mark.parametrize("member", [RunStatus.SUCCEEDED, TeardownVerdict.NOT_VERIFIED, PhaseStatus.OK,
                                    OutputVerdict.PARTIAL, Phase.TRAIN])
def test_a_member_is_its_string_everywhere(member):
    value = member.value
    assert member == value and isinstance(member, str) and hash(member) == hash(value)
    assert str(member) == f"{member}" == "%s" % member == value and f"{member:>14}" == f"{value:>14}"
    assert json.dumps({"v": member}) == json.dumps({"v": value}) and json.dumps([member], indent=2) == json.dumps([value], indent=2)
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (v TEXT)")
    db.execute("INSERT INTO t VALUES (?)", (member,))
    assert db.execute("SELECT v, typeof(v) FROM t").fetchone() == (value, "text")
    assert type(member)(value) is member and parse(type(member), value) is member and parse(type(member), None) is None


def test_records_hold_members(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    ledger.create_run("r1", cloud="local", cluster="c", nodes=1, gpus_per_node=None, command=["x"], spec={})
    ledger.phase_start("r1", "train")
    ledger.phase_end("r1", "train", "failed", "exit 1")
    ledger.record_outputs("r1", [{"node_rank": 0, "path": "/o/node-0", "verdict": "partial", "detail": "1 missing"}])
    assert ledger.list_runs()[0].status is RunStatus.RUNNING
    ledger.finish_run("r1", status=RunStatus.FAILED, exit_code=1, teardown=TeardownVerdict.NOT_VERIFIED)
    rec = ledger.get_run("r1")
    assert rec.status is RunStatus.FAILED and rec.teardown is TeardownVerdict.NOT_VERIFIED
    assert rec.phases[0].status is PhaseStatus.FAILED and rec.outputs[0].verdict is OutputVerdict.PARTIAL
    assert ledger.list_runs()[0].status is RunStatus.FAILED and ledger.list_runs()[0].teardown_verified is False
    with pytest.raises(ValueError):
        parse(RunStatus, "weird")


@pytest.mark.parametrize("value, kind, remote", [("/tmp/out", DestKind.LOCAL, False), ("out", DestKind.LOCAL, False),
                                                 ("s3://b/p", DestKind.S3, True), ("GS://b", DestKind.GS, True)])
def test_output_destination(value, kind, remote):
    dest = OutputDest.of(value)
    assert (dest.kind, dest.remote, str(dest)) == (kind, remote, value)
    assert JobSpec(run_id="r", output_dir=value).output == dest and JobSpec(run_id="r").output is None


def test_output_destination_refuses_other_schemes():
    with pytest.raises(ValueError, match="not an output destination"):
        OutputDest.of("ftp://host/x")
