"""Issue 45 item 13: a recovered chain whose first attempt's teardown stayed "not verified" (a lost
node without a witness) and whose last attempt succeeded, verified, exits 3 (recovery.ChainOutcome:
an earlier attempt may have left something billing). The report above ends on the last attempt's
"SUCCEEDED ... teardown: verified"; the last line must say why the exit is 3, naming the attempt."""

from __future__ import annotations

import pytest

from gpucluster.errors import ExitCode
from gpucluster.lifecycle.steps import RunOutcome
from gpucluster.lifecycle.recovery import Attempt, ChainOutcome

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def _outcome(run_id, exit_code, teardown, unchecked=()):
    return RunOutcome(run_id=run_id, status="failed" if exit_code else "succeeded", exit_code=exit_code,
                      failure=None, result=None, teardown=teardown, unchecked=list(unchecked))


def test_the_exit_3_of_an_earlier_attempt_is_said_last(capsys):
    from rich.console import Console

    from gpucluster.cli.run import _said_after

    lost = "no witness: node 1 (me@127.0.0.1:2222): its reaper ended without finishing its final pass"
    chain = ChainOutcome([Attempt("r-1", _outcome("r-1", ExitCode.LEFTOVERS, "not verified", [lost]), False),
                          Attempt("r-2", _outcome("r-2", ExitCode.OK, "verified"), False)])
    assert chain.exit_code == ExitCode.LEFTOVERS
    _said_after(Console(file=None), chain, "lab", as_json=False)
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "exit 3" in err[-1] and "r-1" in err[-1] and "not verified" in err[-1] and "node 1" in err[-1], err
    assert "gpucluster down lab" in err[-1]


def test_nothing_is_said_when_the_last_attempt_is_the_one(capsys):
    from rich.console import Console

    from gpucluster.cli.run import _said_after

    chain = ChainOutcome([Attempt("r-1", _outcome("r-1", ExitCode.FAILURE, "verified"), False),
                          Attempt("r-2", _outcome("r-2", ExitCode.OK, "verified"), False)])
    _said_after(Console(file=None), chain, "lab", as_json=False)
    assert capsys.readouterr().err == ""


def test_a_run_whose_record_could_not_be_written_is_reported_as_it_ended(tmp_path):
    """Issue 45 item 13: the ledger's row stayed `running` (its last writes failed: a full home);
    the report above the last line must not say `RUNNING ... teardown: not run` for a run that
    ended and tore down, verified."""
    from rich.console import Console

    from gpucluster.cli.render import run_report
    from gpucluster.cli.run import as_ended
    from gpucluster.ledger.store import Ledger

    ledger = Ledger(tmp_path / "ledger.sqlite3")
    ledger.create_run("r-full", cloud="local", cluster="c", nodes=2, gpus_per_node=0, command=["python", "t.py"],
                      spec={"cloud": "local", "name": "c", "nodes": 2})
    outcome = _outcome("r-full", ExitCode.LEFTOVERS, "verified")
    outcome.status, outcome.record_error = "succeeded", "the disk is full"
    con = Console(record=True, width=200)
    run_report(con, as_ended(ledger.get_run("r-full"), outcome))
    text = con.export_text()
    assert "RUNNING" not in text and "not run" not in text, text
    assert "SUCCEEDED" in text and "teardown: verified" in text, text
    assert as_ended(ledger.get_run("r-full"), _outcome("r-full", ExitCode.OK, "verified")).run.status == "running"
