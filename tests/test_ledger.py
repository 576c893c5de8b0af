import sqlite3

import pytest

from gpucluster.errors import ConfigError, UsageError
from gpucluster.ledger.store import SCHEMA_VERSION, Ledger

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def make_run(ledger, run_id="r1", **kw):
    ledger.create_run(run_id, cloud="aws", cluster="c1", nodes=2, gpus_per_node=1, command=["python", "t.py"],
                      spec={"cloud": "aws"}, workload="digits", **kw)


def test_fresh_ledger_is_migrated(tmp_path):
    led = Ledger(tmp_path / "l.db")
    assert led.schema_version == SCHEMA_VERSION
    tables = {r[0] for r in sqlite3.connect(tmp_path / "l.db").execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"runs", "phases", "nodes", "metrics", "resources"} <= tables
    # Re-opening does not migrate twice.
    assert Ledger(tmp_path / "l.db").schema_version == SCHEMA_VERSION


def test_newer_schema_is_refused(tmp_path):
    db = sqlite3.connect(tmp_path / "l.db")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    db.commit()
    db.close()
    with pytest.raises(ConfigError, match="newer"):
        Ledger(tmp_path / "l.db")


def test_corrupt_ledger_is_a_clear_error(tmp_path):
    (tmp_path / "l.db").write_bytes(b"not a database at all" * 100)
    with pytest.raises(ConfigError, match="is damaged: file is not a database; move it aside"):
        Ledger(tmp_path / "l.db")


def test_crash_leaves_a_row_that_says_what_may_exist(tmp_path):
    led = Ledger(tmp_path / "l.db")
    make_run(led)
    led.phase_start("r1", "provision", now=100.0)
    led.resource_requested("r1", "instance", "node-0", region="us-east-1", detail={"instance_type": "g5.xlarge"}, now=100.0)
    led.resource_created("r1", "instance", "node-0", "i-123", now=130.0)
    led.resource_requested("r1", "instance", "node-1", now=100.0)
    # ... the process dies here. A new process reads what is open:
    again = Ledger(tmp_path / "l.db")
    run = again.get_run("r1").to_dict()
    assert run["status"] == "running" and run["ended_at"] is None
    assert run["phases"][0]["ended_at"] is None
    open_res = again.open_resources("c1")
    assert {(r["name"], r["cloud_id"]) for r in open_res} == {("node-0", "i-123"), ("node-1", None)}
    again.resource_deleted("r1", "instance", "node-0", now=200.0)
    assert [r["name"] for r in again.open_resources()] == ["node-1"]


def test_finish_and_read_back(tmp_path):
    led = Ledger(tmp_path / "l.db")
    make_run(led, prices={"g5.xlarge": "1.006"})
    led.add_metrics("r1", [(0, {"kind": "epoch", "epoch": 1, "loss": 0.5, "time": 1.0}),
                           (1, {"kind": "final", "rank": 1, "time": 2.0})])
    led.record_node("r1", 0, "10.0.0.1", 0, ["ok"])
    led.finish_run("r1", status="failed", exit_code=1, failure="node 1 died", metrics={"loss": 0.5},
                   teardown="verified", leftovers=[])
    run = led.get_run("r1", with_metrics=True).to_dict()
    assert run["status"] == "failed" and run["failure"] == "node 1 died"
    assert run["prices"] == {"g5.xlarge": "1.006"}
    assert run["teardown"] == "verified"
    assert [m["kind"] for m in run["metric_records"]] == ["epoch", "final"]
    assert run["metric_records"][1]["node_rank"] == 1
    assert run["node_results"] == [{"node_rank": 0, "host": "10.0.0.1", "exit_code": 0, "last_lines": ["ok"]}]
    with pytest.raises(ValueError):
        led.finish_run("r1", status="weird", exit_code=1)


def test_prefix_lookup_and_filters(tmp_path):
    led = Ledger(tmp_path / "l.db")
    make_run(led, "r20261122-aaa", now=10.0)
    make_run(led, "r20261122-bbb", now=20.0)
    assert led.get_run("r20261122-a").to_dict()["id"] == "r20261122-aaa"
    with pytest.raises(UsageError, match="r20261122-bbb, r20261122-aaa"):  # ambiguous: the matches are listed
        led.get_run("r20261122")
    # Literal matching: SQL LIKE wildcards are plain characters.
    assert led.get_run("%") is None and led.get_run("_2026") is None and led.get_run("r2026112_-aaa") is None
    assert [r.id for r in led.list_runs()] == ["r20261122-bbb", "r20261122-aaa"]
    assert [r.id for r in led.list_runs(since=15.0)] == ["r20261122-bbb"]
    assert led.list_runs(cloud="gcp") == []


def test_duplicate_run_id_is_rejected_atomically(tmp_path):
    led = Ledger(tmp_path / "l.db")
    make_run(led)
    with pytest.raises(sqlite3.IntegrityError):
        make_run(led)
    assert len(led.list_runs()) == 1


def test_check_accepts_what_python_json_writes_and_names_a_bad_row(tmp_path):
    """NaN/Infinity (a diverged loss) are what json.dumps writes: not damage. A truncated row is."""
    led = Ledger(tmp_path / "l.db")
    make_run(led, "r-nan")
    led.finish_run("r-nan", status="failed", exit_code=1, metrics={"loss": float("nan"), "best": float("inf")})
    led.add_metrics("r-nan", [(0, {"kind": "epoch", "loss": float("nan")})])
    led.check()
    assert led.get_run("r-nan", with_metrics=True).to_dict()["metrics"]["best"] == float("inf")
    led._db.execute("UPDATE runs SET cost = '{\"total\": ' WHERE id = 'r-nan'")
    with pytest.raises(ConfigError, match="is damaged: runs row 'r-nan' holds bad JSON in column 'cost'; move it aside"):
        led.check()
    with pytest.raises(ConfigError, match="runs row 'r-nan' holds bad JSON in column 'cost'"):
        led.list_runs()


def test_writes_from_several_threads_never_collide_in_one_transaction(tmp_path):
    # The launcher's reader threads record metrics while the main thread records phases on the
    # same connection (seen: a Ctrl-C'd ssh run failed its teardown write with "cannot start a
    # transaction within a transaction"). Every public method takes the ledger's lock.
    import threading

    from gpucluster.ledger.store import Ledger

    ledger = Ledger(tmp_path / "l.sqlite3")
    ledger.create_run("r1", cloud="local", cluster="c", nodes=2, gpus_per_node=0, spec={}, command=["x"])
    errors = []

    def metrics():
        try:
            for i in range(400):
                ledger.add_metrics("r1", [(0, {"kind": "epoch", "epoch": i})])
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    t = threading.Thread(target=metrics)
    t.start()
    for i in range(400):
        ledger.phase_start("r1", f"p{i}")
        ledger.phase_end("r1", f"p{i}", "ok")
    t.join()
    assert errors == []
    assert len(ledger.metrics("r1")) == 400


@pytest.mark.integration  # a real process or server: not in `make test-fast`
def test_simultaneous_first_commands_in_a_new_home_all_succeed(tmp_path):
    """100 `gpucluster runs` started at once in a home with no ledger yet (issue 32 item 6): each
    one migrates or waits for the one that does; none fails with "table runs already exists",
    "duplicate column name" or "database is locked"."""
    import os
    import subprocess
    import sys

    home = tmp_path / "home"
    env = dict(os.environ, GPUCLUSTER_HOME=str(home), COLUMNS="200")
    # the 100 processes import first, then wait at one barrier (a file appearing), then open the ledger
    go = tmp_path / "go"
    ready = tmp_path / "ready"
    ready.mkdir()
    code = ("import os, sys, time\n"
            "from gpucluster.cli.main import main\n"
            "import gpucluster.cli.runs, gpucluster.ledger.store, platformdirs, rich.table\n"
            f"open(os.path.join({str(ready)!r}, str(os.getpid())), 'w').close()\n"
            f"while not os.path.exists({str(go)!r}): time.sleep(0.002)\n"
            "sys.exit(main(['runs']))\n")
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(100)]
    import time

    end = time.monotonic() + 180
    while len(list(ready.iterdir())) < len(procs) and time.monotonic() < end:
        time.sleep(0.1)
    go.write_text("")
    failed = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        if p.returncode != 0:
            failed.append(err.strip().splitlines()[-1:] if err.strip() else p.returncode)
    assert failed == [], f"{len(failed)} of 100 failed: {failed[:5]}"
    assert Ledger(home / "ledger.sqlite3").schema_version == SCHEMA_VERSION


class _BusyAtOpen(sqlite3.Connection):
    """A connection whose first statements meet what SQLite answers while a WAL database's last
    connection is closing: SQLITE_BUSY at once, whatever the busy timeout
    (https://www.sqlite.org/wal.html, "Sometimes Queries Return SQLITE_BUSY In WAL Mode")."""

    busy_left = 0

    def execute(self, sql, *args):
        if sql.startswith("PRAGMA journal_mode") and type(self).busy_left > 0:
            type(self).busy_left -= 1
            raise sqlite3.OperationalError("database is locked")
        return super().execute(sql, *args)


def _connect_busy(monkeypatch, times):
    import gpucluster.ledger.store as ledger_mod

    real = sqlite3.connect
    _BusyAtOpen.busy_left = times
    monkeypatch.setattr(ledger_mod.sqlite3, "connect", lambda *a, **kw: real(*a, factory=_BusyAtOpen, **kw))


def test_a_busy_answer_while_opening_is_tried_again(tmp_path, monkeypatch):
    _connect_busy(monkeypatch, 3)
    led = Ledger(tmp_path / "l.db")
    assert _BusyAtOpen.busy_left == 0
    assert led.schema_version == SCHEMA_VERSION


def test_a_ledger_busy_for_longer_than_the_bound_is_one_line(tmp_path, monkeypatch):
    import gpucluster.ledger.store as ledger_mod

    _connect_busy(monkeypatch, 10**9)
    monkeypatch.setattr(ledger_mod, "OPEN_BUSY_S", 0.3)
    with pytest.raises(ConfigError, match="locked by another process for too long"):
        Ledger(tmp_path / "l.db")
