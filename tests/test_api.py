"""Issue 47, items 1 and 5: the Python API (`import gpucluster`; docs/python.md) checks input as the
CLI does and raises the CLI's errors, imports nothing heavy, and reads the ledger as `runs`/`show`/
`logs` do. In process, nothing started (the runs themselves: tests/test_api_local.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal

import pytest

import gpucluster
from gpucluster.cli.main import main
from gpucluster.errors import SpecError, UsageError

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def _cli_error(capsys, *argv: str) -> str:
    """The one-line error `gpucluster ARGV` prints (exit 2)."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    return err[0].removeprefix("gpucluster: error: ")


def test_import_gpucluster_and_its_api_import_nothing_heavy():
    heavy = ("torch", "boto3", "botocore", "pulumi", "pulumi_aws", "pulumi_gcp", "kubernetes", "google", "numpy",
             "matplotlib", "rich", "gpucluster.lifecycle.steps")
    code = ("import sys, json\nimport gpucluster\nnames = [gpucluster.run, gpucluster.up, gpucluster.runs, "
            "gpucluster.show, gpucluster.logs, gpucluster.estimate, gpucluster.down, gpucluster.Cluster]\n"
            f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []


def test_the_api_is_typed_for_a_checker():
    import gpucluster.api

    assert set(gpucluster.API) == set(gpucluster.api.__all__)
    with pytest.raises(AttributeError, match="no attribute 'walk'"):
        getattr(gpucluster, "walk")


def test_bad_input_raises_the_usage_error_the_cli_prints(capsys, home):
    cases = [
        (dict(nodes=0), ("--nodes", "0")),
        (dict(nodes=17), ("--nodes", "17")),
        (dict(cloud="lokal"), ("--cloud", "lokal")),
        (dict(region="us-east-1"), ("--region", "us-east-1")),
        (dict(max_minutes=0), ("--max-minutes", "0")),
        (dict(epochs=0), ("--epochs", "0")),
        (dict(workload="digits", command=["python", "x.py"]), ("--workload", "digits", "--", "python", "x.py")),
    ]
    for kwargs, flags in cases:
        kwargs = {"cloud": "local", **kwargs}
        with pytest.raises(UsageError) as caught:
            gpucluster.run(**kwargs)
        assert caught.value.message == _cli_error(capsys, "run", *(["--cloud", "local"] if "--cloud" not in flags
                                                                   else []), *flags), kwargs
    with pytest.raises(SpecError):  # the spec's own class, as the CLI raises it (exit 2)
        gpucluster.run(nodes=0)
    assert not (home / "ledger.sqlite3").exists() or not gpucluster.runs()  # nothing recorded


def test_unknown_keywords_and_wrong_types_are_refused_by_name(home):
    with pytest.raises(UsageError, match=r"unknown keyword 'nodez' \(did you mean \"nodes\"\?\)"):
        gpucluster.run(nodez=2)
    with pytest.raises(UsageError, match="unknown keyword 'provisioning'"):
        gpucluster.run(provisioning=("aws",))
    with pytest.raises(UsageError, match="dry_run= is not allowed"):
        gpucluster.run(dry_run=True)
    with pytest.raises(UsageError, match="spot=1 is not allowed: True or False"):
        gpucluster.run(spot=1)
    with pytest.raises(UsageError, match="--notify 'slack'"):
        gpucluster.run(notify="slack")
    with pytest.raises(UsageError, match="idle minutes"):
        gpucluster.run(keep=True, idle_minutes=0)


def test_up_and_estimate_refuse_as_the_cli_does(capsys, home):
    with pytest.raises(UsageError) as caught:
        gpucluster.up(cloud="kubernetes")
    assert caught.value.message == _cli_error(capsys, "up", "--cloud", "kubernetes")
    with pytest.raises(UsageError) as caught:
        gpucluster.estimate(cloud="aws", nodes=0)
    assert caught.value.message == _cli_error(capsys, "cost", "estimate", "--cloud", "aws", "--nodes", "0")
    with pytest.raises(UsageError) as caught:
        gpucluster.estimate(cloud="aws", hours=-1)
    assert "hours" in caught.value.message


def test_estimate_is_the_cli_estimate(capsys):
    est = gpucluster.estimate(cloud="aws", instance_type="g5.xlarge", nodes=2, hours=3)
    assert isinstance(est.hourly, Decimal) and abs(est.total - est.hourly * 3) < Decimal("0.01") and est.lines
    assert main(["cost", "estimate", "--cloud", "aws", "--instance-type", "g5.xlarge", "--nodes", "2", "--hours", "3",
                 "--json"]) in (0, None)
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(est.to_dict()))


def test_runs_show_and_logs_read_the_ledger(home, capsys):
    from gpucluster.ledger.store import Ledger

    ledger = Ledger.open_default()
    log_dir = home / "runs" / "r1" / "logs"
    log_dir.mkdir(parents=True)
    (log_dir / "node-0.log").write_text('hello 0\n@gpucluster-metric {"kind": "util", "cpu_percent": 5}\nbye 0\n')
    (log_dir / "node-1.log").write_text("hello 1\n")
    ledger.create_run("r1", cloud="local", cluster="c1", nodes=2, gpus_per_node=0, command=["python", "x.py"],
                      spec={}, workload="x.py", log_dir=str(log_dir))
    ledger.finish_run("r1", status="succeeded", exit_code=0)
    assert [r.id for r in gpucluster.runs()] == ["r1"]
    assert gpucluster.show("r1").run.status == "succeeded"
    assert list(gpucluster.logs("r1")) == ["hello 0", "bye 0", "hello 1"]
    assert list(gpucluster.logs("r1", node=1)) == ["hello 1"]
    assert len(list(gpucluster.logs("r1", raw=True))) == 4
    assert list(gpucluster.logs("r1", follow=True)) == ["hello 0", "bye 0", "hello 1"]  # ended: no waiting
    for call, flags in [(lambda: gpucluster.show("r9"), ("show", "r9")),
                        (lambda: gpucluster.logs("r9"), ("logs", "r9")),
                        (lambda: gpucluster.logs("r1", node=5), ("logs", "r1", "--node", "5"))]:
        with pytest.raises(UsageError) as caught:
            call()
        assert caught.value.message == _cli_error(capsys, *flags)
    with pytest.raises(UsageError, match="status 'done' is not allowed"):
        gpucluster.runs(status="done")
    with pytest.raises(UsageError) as caught:
        gpucluster.down("nope")
    assert caught.value.message == _cli_error(capsys, "down", "nope")


def test_an_old_ledger_is_migrated_and_a_newer_one_refused_as_the_cli_does(home, capsys):
    import sqlite3

    from conftest import write_old_ledger
    from gpucluster.errors import ConfigError
    from gpucluster.ledger.schema import MIGRATIONS

    home.mkdir(parents=True)
    path = home / "ledger.sqlite3"
    write_old_ledger(path, 3)
    assert [r.id for r in gpucluster.runs()] == ["old"] and gpucluster.show("old").status == "succeeded"
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == MIGRATIONS[-1][0]  # moved forward
    db.execute(f"PRAGMA user_version = {MIGRATIONS[-1][0] + 5}")
    db.commit()
    db.close()
    with pytest.raises(ConfigError) as caught:
        gpucluster.runs()
    assert "newer" in caught.value.message
    assert main(["runs"]) == 2 and caught.value.message in capsys.readouterr().err
    with pytest.raises(ConfigError, match="newer"):
        gpucluster.run(["true"], nodes=1)  # refused before anything is recorded or started


def test_a_run_past_the_budget_is_refused_by_the_api_as_by_the_cli(home, tmp_path, monkeypatch, capsys):
    """config.yaml's budget (issue 48) holds for the API too: the same check in the same place."""
    from test_money_guards import _spent_ledger

    home.mkdir(mode=0o700)
    _spent_ledger(home).close()
    (tmp_path / "config.yaml").write_text("budget:\n  daily: 5\n")
    monkeypatch.setenv("GPUCLUSTER_CONFIG", str(tmp_path / "config.yaml"))
    with pytest.raises(UsageError) as caught:
        gpucluster.run(cloud="aws", nodes=2, gpu="A10G", max_minutes=60, ssh_cidr="203.0.113.7/32")
    assert caught.value.message.startswith("the daily budget is $5.00: $4.20 spent")
    assert caught.value.message == _cli_error(capsys, "run", "--cloud", "aws", "--nodes", "2", "--gpu", "A10G",
                                              "--max-minutes", "60", "--ssh-cidr", "203.0.113.7/32", "--yes")
    assert [r.id for r in gpucluster.runs()] == ["r-spent"]  # nothing recorded
