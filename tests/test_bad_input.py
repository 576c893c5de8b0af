"""Bad input: one line naming the value and what is allowed, exit 2, no traceback, nothing created."""

import os
import stat

import pytest

from conftest import run_cli


def assert_clean_refusal(result, *needles, code=2):
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    err = result.stderr.strip()
    assert "Traceback" not in result.stderr + result.stdout
    assert len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, err


def assert_no_run_recorded(home):
    ledger = home / "ledger.sqlite3"
    if ledger.exists():
        from gpucluster.ledger import Ledger

        assert Ledger(ledger).list_runs() == []
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())


@pytest.mark.parametrize("nodes,needle", [("0", "'0'"), ("-3", "'-3'"), ("abc", "'abc'"), ("17", "'17'"),
                                          ("100000", "'100000'")])
def test_bad_nodes(home, nodes, needle):
    r = run_cli("run", "--cloud", "local", "--nodes", nodes)
    assert_clean_refusal(r, "nodes", needle, "1 to 16")
    assert_no_run_recorded(home)


def test_unknown_cloud_suggests(home):
    r = run_cli("run", "--cloud", "awz", "--nodes", "2")
    assert_clean_refusal(r, "'awz'", 'did you mean "aws"', "local")
    assert_no_run_recorded(home)


def test_unknown_workload(home):
    r = run_cli("run", "--workload", "digts")
    assert_clean_refusal(r, "'digts'", 'did you mean "digits"')
    assert_no_run_recorded(home)


def test_missing_command(home):
    r = run_cli("run", "--nodes", "2", "--", "no-such-program-xyz", "--flag")
    assert_clean_refusal(r, "no-such-program-xyz")
    assert_no_run_recorded(home)


def test_missing_script(home):
    r = run_cli("run", "--nodes", "2", "--", "python", "does_not_exist.py")
    assert_clean_refusal(r, "does_not_exist.py")
    assert_no_run_recorded(home)


def test_bad_epochs_and_minutes(home):
    assert_clean_refusal(run_cli("run", "--epochs", "0"), "epochs", "'0'")
    assert_clean_refusal(run_cli("run", "--max-minutes", "-1"), "max minutes", "'-1'")
    assert_no_run_recorded(home)


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_home_non_root(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    r = run_cli("run", "--nodes", "2", env={"GPUCLUSTER_HOME": str(ro / "home")})
    assert_clean_refusal(r, "GPUCLUSTER_HOME", str(ro / "home"))


def test_unwritable_home(tmp_path):
    # A regular file where the directory should be: unwritable for root too.
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = run_cli("run", "--nodes", "2", env={"GPUCLUSTER_HOME": str(blocker / "home")})
    assert_clean_refusal(r, "GPUCLUSTER_HOME", str(blocker / "home"))


def test_show_unknown_run(home):
    assert_clean_refusal(run_cli("show", "r-nope"), "'r-nope'")


def test_workload_and_command_together(home):
    assert_clean_refusal(run_cli("run", "--workload", "digits", "--", "python", "x.py"), "not both")
