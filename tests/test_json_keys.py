

def test_records_are_typed_and_round_trip(home):
    from gpucluster.records import NodeRow, PhaseRow, RunRecord, RunRow

    ledger = Ledger(home / "ledger.sqlite3")
    _fill(ledger)
    rec = ledger.get_run("r-new", with_metrics=True)
    assert isinstance(rec, RunRecord) and isinstance(rec.run, RunRow)
    assert (rec.id, rec.run.status, rec.run.exit_code, rec.run.wall_s) == ("r-new", "failed", 3, 20.0)
    assert rec.phases[0] == PhaseRow("prepare", T + 101, T + 101.5, "ok", None) and rec.phases[0].seconds == 0.5
    assert rec.phase("teardown").detail == "1 leftover" and rec.phase("outputs") is None
    assert rec.nodes == [NodeRow(0, "10.0.0.1", 0, ["epoch 1", "done"]), NodeRow(1, "10.0.0.2", 1, None)]
    assert [(o.node_rank, o.verdict, o.files) for o in rec.outputs] == [(0, "copied", 2), (1, "missing", None)]
    assert [(r.kind, r.cloud_id, r.confirmed_gone) for r in rec.resources] == [("instance", "i-0abc", False),
                                                                                ("volume", None, True)]
    assert (rec.staging[0].bytes, rec.staging[0].sent_bytes, rec.setup[0].node_rank) == (5, 0, 1)
    assert rec.cost["total"] == "0.12" and rec.chain == ["r-old", "r-new"]
    assert RunRecord.from_dict(rec.to_dict()) == rec and RunRecord.from_dict(rec.to_dict()).to_dict() == rec.to_dict()
    rows = ledger.list_runs()
    assert [type(r) for r in rows] == [RunRow, RunRow] and rows[1].teardown_verified is True
