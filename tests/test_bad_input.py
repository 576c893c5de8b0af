"""Bad input: one line naming the value and what is allowed, exit 2, no traceback, nothing created."""

import json
import os
import stat

import pytest

from conftest import run_cli

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)


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
        from gpucluster.ledger.store import Ledger

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
    assert_no_run_recorded(home)


# -- helpers for the cases below -----------------------------------------------------------------
import functools  # noqa: E402
import shutil  # noqa: E402
import sqlite3  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

from conftest import ROOT, gpucluster_argv  # noqa: E402


def ledger_rows(home) -> list[tuple[str, str]]:
    """(id, status) of every run row, read with plain sqlite3 (Ledger() refuses a damaged file)."""
    path = home / "ledger.sqlite3"
    if not path.exists():
        return []
    db = sqlite3.connect(str(path))
    try:
        return sorted(db.execute("SELECT id, status FROM runs").fetchall())
    finally:
        db.close()


def seed_runs(home, *ids: str) -> None:
    """Finished local runs in a fresh ledger under `home`."""
    from gpucluster.ledger.store import Ledger

    led = Ledger(home / "ledger.sqlite3")
    for i, rid in enumerate(ids):
        led.create_run(rid, cloud="local", cluster="gpucluster-local", nodes=1, gpus_per_node=0,
                       command=["workload:digits"], spec={"cloud": "local", "nodes": 1}, now=1000.0 + i)
        led.finish_run(rid, status="succeeded", exit_code=0, teardown="verified", now=1001.0 + i)
    led.close()


def assert_nothing_started(home, before=()):
    """No new ledger row, no row left at "running", no run folder."""
    rows = ledger_rows(home)
    assert [r for r in rows if r[0] not in {b[0] for b in before}] == [], rows
    assert all(status != "running" for _, status in rows), rows
    runs = home / "runs"
    assert not runs.exists() or not any(runs.iterdir()), list(runs.iterdir())


# -- item 10: reserved tags ----------------------------------------------------------------------
RESERVED = ["managed-by=me", "gpucluster-cluster=x", "gpucluster-run=r1", "gpucluster-rank=0", "Managed-By=me"]


@pytest.mark.parametrize("tag", RESERVED)
@pytest.mark.parametrize("cmd", [("up", "--cloud", "aws", "--yes"), ("up", "--cloud", "gcp", "--yes"),
                                 ("run", "--cloud", "aws", "--yes")])
def test_reserved_tag_flag(home, cmd, tag):
    r = run_cli(*cmd, "--tag", tag)
    assert_clean_refusal(r, repr(tag.split("=")[0]), "reserved")
    assert not (home / "ledger.sqlite3").exists()  # refused before the ledger is opened
    assert_nothing_started(home)


def write_stack(tmp_path, body: bytes, name="Pulumi.bad.yaml"):
    p = tmp_path / name
    p.write_bytes(body)
    return p


@pytest.mark.parametrize("key", ["managed-by", "gpucluster-cluster", "gpucluster-run"])
def test_reserved_tag_in_stack_yaml(home, tmp_path, key):
    stack = write_stack(tmp_path, f"config:\n  gpucluster:cloud: aws\n  gpucluster:tags:\n    {key}: me\n".encode())
    r = run_cli("cost", "estimate", "--stack", str(stack))
    assert_clean_refusal(r, repr(key), "reserved")


def test_reserved_tag_in_pulumi_program_config():
    """The Pulumi program's reader (infra/program.py), which `pulumi up` and the Automation API run."""
    from gpucluster.errors import UsageError
    from gpucluster.infra.program import spec_from_config

    for key in ("managed-by", "gpucluster-cluster", "gpucluster-run"):
        with pytest.raises(UsageError, match=f"'{key}' is reserved"):
            spec_from_config({"cloud": "aws", "tags": {key: "me"}}, "dev")
        with pytest.raises(UsageError, match=f"'{key}' is reserved"):  # as Pulumi passes it: a JSON string
            spec_from_config({"cloud": "aws", "tags": f'{{"{key}": "me"}}'}, "dev")
    assert spec_from_config({"cloud": "aws", "tags": {"team": "ml"}}, "dev").tag_dict == {"team": "ml"}


def test_reserved_tags_cannot_be_overridden_in_managed_tags():
    """Defence in depth: a spec built around the CLI and readers still cannot replace them."""
    from gpucluster.errors import SpecError
    from gpucluster.spec import ClusterSpec
    from specs import validate

    spec = ClusterSpec(cloud="aws", nodes=1, name="c1", run_id="r1",
                       tags=(("gpucluster-cluster", "x"), ("gpucluster-run", "y"), ("managed-by", "me"), ("team", "ml")))
    assert spec.managed_tags() == {"managed-by": "gpucluster", "gpucluster-cluster": "c1", "gpucluster-run": "r1",
                                   "team": "ml"}
    with pytest.raises(SpecError, match="'gpucluster-cluster' is reserved"):
        validate(spec)


# -- item 12: bad input is found before anything starts ------------------------------------------
def test_sweep_report_under_a_file_fails_before_the_first_run(home, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("keep me")
    r = run_cli("sweep", "--nodes", "1", "--workload", "synthetic", "--report", str(blocker / "report"))
    assert_clean_refusal(r, str(blocker / "report"), "is a file")
    assert blocker.read_text() == "keep me"
    assert_nothing_started(home)


def test_sweep_report_that_is_a_file(home, tmp_path):
    f = tmp_path / "report"
    f.write_text("x")
    r = run_cli("sweep", "--nodes", "1", "--report", str(f))
    assert_clean_refusal(r, str(f))
    assert_nothing_started(home)


def _sys_is_read_only() -> bool:
    try:
        os.rmdir(tempfile.mkdtemp(dir="/sys"))
    except OSError:
        return True
    return False


@pytest.mark.skipif(not _sys_is_read_only(), reason="/sys accepts new folders here")
def test_sweep_report_on_read_only_file_system(home):
    # /sys is mounted read-only in containers (sysfs refuses mkdir even to root): writability is probed,
    # not guessed from permission bits, which root ignores.
    r = run_cli("sweep", "--nodes", "1", "--report", "/sys/gpucluster-report")
    assert_clean_refusal(r, "/sys/gpucluster-report", "not writable")
    assert not os.path.exists("/sys/gpucluster-report")
    assert_nothing_started(home)


WORKLOAD_ARGS = [
    ("digits", "--bogus-flag 3", "unrecognized arguments: --bogus-flag 3"),
    ("digits", "--epochs zero", "argument --epochs: invalid int value: 'zero'"),
    ("mnist", "--limit many", "argument --limit: invalid int value: 'many'"),
    ("mnist", "--width 10", "unrecognized arguments: --width 10"),  # synthetic's flag, not mnist's
    ("synthetic", "--width abc", "argument --width: invalid int value: 'abc'"),
    ("synthetic", "--backend mpi", "argument --backend: invalid choice: 'mpi'"),
    ("digits", "--help", "--help prints the workload's help and trains nothing"),
]


@pytest.mark.parametrize("workload,args,reason", WORKLOAD_ARGS)
def test_workload_args_checked_before_launch(home, workload, args, reason):
    r = run_cli("run", "--nodes", "2", "--workload", workload, "--workload-args", args)
    assert_clean_refusal(r, f"--workload-args {args!r}", f"the {workload} workload", reason)
    assert_nothing_started(home)


def test_sweep_workload_args_checked_before_the_first_run(home):
    r = run_cli("sweep", "--nodes", "1", "--workload", "synthetic", "--workload-args", "--bogus-flag 3")
    assert_clean_refusal(r, "unrecognized arguments: --bogus-flag 3")
    assert_nothing_started(home)


def test_good_workload_args_pass_the_check():
    """The same parser the workload uses accepts what it accepts (so the check refuses only real errors)."""
    from gpucluster.workloads.args import check_args

    assert check_args("digits", ["--epochs", "2", "--batch-size", "16", "--no-shard"]) is None
    assert check_args("mnist", ["--limit", "100", "--download"]) is None
    assert check_args("synthetic", ["--width", "64", "--depth", "2", "--steps", "3"]) is None


def test_workload_arg_check_does_not_import_torch():
    code = ("import sys, time; t = time.perf_counter(); import gpucluster.workloads.args as a; "
            "a.check_args('digits', ['--bogus']); print(time.perf_counter() - t, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[1] == "False"
    assert float(out[0]) < 0.5, out  # argparse only; torch alone takes seconds to import


@pytest.mark.parametrize("cmd", ["run", "sweep"])
@pytest.mark.parametrize("args", ['--lr "0.1', "--data-file 'x", "--lr 0.1\\"])
def test_workload_args_quoting_error(home, cmd, args):
    r = run_cli(cmd, "--nodes", "1", "--workload-args", args)
    assert_clean_refusal(r, "--workload-args", "check the quotes")
    assert_nothing_started(home)


@pytest.mark.parametrize("cmd", ["run", "sweep"])
@pytest.mark.parametrize("flag", [("--workload-args", "--lr 0.1"), ("--epochs", "2")])
def test_workload_flags_with_a_command(home, cmd, flag):
    r = run_cli(cmd, "--nodes", "1", *flag, "--", "python", "-c", "pass")
    assert_clean_refusal(r, flag[0], "built-in workloads")
    assert_nothing_started(home)


@pytest.mark.parametrize("flag,value,needle", [
    ("--identity", "/nonexistent/id_ed25519", "does not exist"),
    ("--known-hosts", "/nonexistent/known_hosts", "does not exist"),
])
def test_ssh_files_must_exist_before_the_ledger_row(home, flag, value, needle):
    r = run_cli("run", "--cloud", "ssh", "--hosts", "u@127.0.0.2,u@127.0.0.3", flag, value)
    assert_clean_refusal(r, flag, repr(value), needle)
    assert not (home / "ledger.sqlite3").exists()
    assert_nothing_started(home)


def test_ssh_identity_that_is_a_directory(home, tmp_path):
    r = run_cli("run", "--cloud", "ssh", "--hosts", "u@127.0.0.2", "--identity", str(tmp_path))
    assert_clean_refusal(r, "--identity", "directory")
    assert_nothing_started(home)


def _flag_cases():
    """(cloud, flag argv) for every flag the cloud would silently ignore."""
    values = {"--region": ["--region", "us-east-1"], "--zone": ["--zone", "us-east-1a"],
              "--instance-type": ["--instance-type", "g5.xlarge"], "--machine-type": ["--machine-type", "n1-standard-8"],
              "--spot": ["--spot"], "--disk-gb": ["--disk-gb", "50"], "--max-lifetime": ["--max-lifetime", "60"],
              "--ssh-cidr": ["--ssh-cidr", "203.0.113.7/32"], "--tag": ["--tag", "team=ml"],
              "--hosts": ["--hosts", "u@127.0.0.2"], "--identity": ["--identity", "ID"],
              "--known-hosts": ["--known-hosts", "KH"], "--remote-python": ["--remote-python", "python3"],
              "--keep": ["--keep"], "--ready-timeout": ["--ready-timeout", "600"],
              "--project": ["--project", "my-project"], "--start-deadline": ["--start-deadline", "20"],
              "--data": ["--data", "tests"], "--setup": ["--setup", "true"],
              "--resume": ["--resume", "r20261122-000001-aaaaaa"], "--python": ["--python", "python3"],
              "--state": ["--state", "file:///tmp/gpucluster-state"], "--context": ["--context", "lab"],
              "--namespace": ["--namespace", "team-a"], "--create-namespace": ["--create-namespace"]}
    cloud_only = ["--region", "--zone", "--instance-type", "--machine-type", "--spot", "--disk-gb", "--max-lifetime",
                  "--ssh-cidr", "--tag", "--keep", "--state"]
    cases = [("local", values[f]) for f in cloud_only + ["--hosts", "--identity", "--known-hosts", "--remote-python"]]
    cases += [("ssh", values[f]) for f in cloud_only]
    cases += [(cloud, values[f]) for cloud in ("local", "ssh") for f in ("--ready-timeout", "--project",
                                                                       "--start-deadline")]
    cases += [("aws", values[f]) for f in ("--project", "--start-deadline")]
    cases += [("aws", values[f]) for f in ("--hosts", "--identity", "--known-hosts")]
    cases += [("gcp", values[f]) for f in ("--hosts", "--identity", "--known-hosts", "--remote-python", "--ssh-cidr",
                                           "--max-lifetime", "--ready-timeout")]
    cases += [(cloud, values["--python"]) for cloud in ("ssh", "aws", "gcp")]  # local only (issue 28)
    # an existing Kubernetes cluster (issue 44): its context and namespace flags are its own; it provisions
    # nothing, so every flag that shapes or places machines, and every ssh flag, is refused there
    cases += [(cloud, values[f]) for cloud in ("local", "ssh", "aws", "gcp")
              for f in ("--context", "--namespace", "--create-namespace")]
    cases += [("kubernetes", values[f]) for f in ("--region", "--zone", "--instance-type", "--spot", "--disk-gb",
                                                  "--max-lifetime", "--ssh-cidr", "--tag", "--keep", "--state",
                                                  "--hosts", "--identity", "--known-hosts", "--remote-python",
                                                  "--ready-timeout", "--project", "--python")]
    return cases


def test_flag_cases_cover_the_table():
    """The hand-written cases above and the CLI's table agree: every (cloud, flag) the table refuses is tried."""
    from gpucluster.cli.args import cloud_only_flags
    from gpucluster.infra.registry import NAMES as CLOUDS

    by_flag = {"--instance-type": "instance_type", "--machine-type": "instance_type"}
    tried = {(cloud, by_flag.get(flag[0], flag[0][2:].replace("-", "_").replace("tag", "tags")))
             for cloud, flag in _flag_cases()}
    table = {(cloud, param) for param, clouds in cloud_only_flags().items() for cloud in CLOUDS
             if cloud not in clouds}
    assert tried == table


@pytest.mark.parametrize("cloud,flag", _flag_cases(), ids=lambda v: v if isinstance(v, str) else v[0])
def test_flag_the_cloud_would_ignore(home, tmp_path, cloud, flag):
    key = tmp_path / "id"
    key.write_text("key")
    flag = [str(key) if a in ("ID", "KH") else a for a in flag]
    extra = ["--hosts", "u@127.0.0.2"] if cloud == "ssh" else []
    r = run_cli("run", "--cloud", cloud, *extra, "--yes", *flag)
    shown = "--instance-type/--machine-type" if flag[0] in ("--instance-type", "--machine-type") else flag[0]
    assert_clean_refusal(r, shown, f"--cloud {cloud}")
    assert not (home / "ledger.sqlite3").exists()
    assert_nothing_started(home)


def test_up_gcp_refuses_ssh_cidr(home):
    r = run_cli("up", "--cloud", "gcp", "--yes", "--ssh-cidr", "203.0.113.7/32")
    assert_clean_refusal(r, "--ssh-cidr", "--cloud gcp")
    assert not (home / "ledger.sqlite3").exists()


# -- item 13: no tracebacks ----------------------------------------------------------------------
@pytest.mark.parametrize("plot,needle", [
    ("util.txt", "ending in .png"),
    ("{tmp}/missing-folder/u.png", "does not exist"),
    ("{tmp}/a-file/u.png", "is not a directory"),
    ("{tmp}", "is a directory"),  # Click's own check (dir_okay=False), also one line
    ("{tmp}/dir.png", "is a directory"),
])
def test_show_plot_bad_path(home, tmp_path, plot, needle):
    seed_runs(home, "r20261122-000001-aaaaaa")
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "dir.png").mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    r = run_cli("show", "r20261122-000001-aaaaaa", "--plot", plot.format(tmp=tmp_path), cwd=tmp_path)
    assert_clean_refusal(r, "--plot", needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written or created


@pytest.mark.parametrize("plot,needle", [("/nonexistent/c.png", "does not exist"), ("c.txt", "ending in .png"),
                                         ("{tmp}/a-file/c.png", "is not a directory")])
def test_cost_report_plot_bad_path(home, tmp_path, plot, needle):
    seed_runs(home, "r20261122-000001-aaaaaa")
    (tmp_path / "a-file").write_text("x")
    r = run_cli("cost", "report", "--plot", plot.format(tmp=tmp_path), cwd=tmp_path)
    assert_clean_refusal(r, "--plot file", needle)
    assert not os.path.exists("/nonexistent")


@pytest.mark.parametrize("body,needle", [
    (b"config:\n  gpucluster:cloud: aws\n  gpucluster:region:\n    a: b\n", "gpucluster:region"),
    (b"config:\n  gpucluster:cloud: aws\n  gpucluster:name: {x: 1}\n", "gpucluster:name"),
    (b"config:\n  gpucluster:cloud: aws\n  gpucluster:instanceType: [g5.xlarge]\n", "gpucluster:instanceType"),
    (b"config:\n  gpucluster:cloud: aws\n  gpucluster:tags: [a, b]\n", "gpucluster:tags"),
    (b"config:\n  gpucluster:cloud: aws\n  gpucluster:tags:\n    team: {x: 1}\n", "gpucluster:tags.team"),
    (b"config:\n  gpucluster:cloud: aws\n  gpucluster:name: \"\xff\xfe\"\n", "not UTF-8"),
    (b"\xef\xbb\xbfconfig:\n  gpucluster:cloud: \xe9\n", "not UTF-8"),
])
def test_bad_stack_yaml(home, tmp_path, body, needle):
    stack = write_stack(tmp_path, body)
    r = run_cli("cost", "estimate", "--stack", str(stack))
    assert_clean_refusal(r, needle)


def test_bad_values_in_pulumi_program_config():
    from gpucluster.errors import UsageError
    from gpucluster.infra.program import spec_from_config

    for key in ("region", "name", "zone", "instanceType", "nodes", "spot"):
        with pytest.raises(UsageError, match=f"gpucluster:{key} is a mapping"):
            spec_from_config({"cloud": "aws", key: {"a": "b"}}, "dev")
    with pytest.raises(UsageError, match="gpucluster:region is a list"):
        spec_from_config({"cloud": "aws", "region": ["us-east-1"]}, "dev")


@functools.lru_cache(maxsize=None)
def _as_nobody_available() -> bool:
    """Root, setpriv, and this Python able to start as uid 65534 at all (a pyenv build with a shared
    libpython under /root, e.g. 3.10.13 here, cannot: the loader finds no libpython3.10.so)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return False
    probe = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", sys.executable,
                            "-c", "pass"], capture_output=True, timeout=60)
    return probe.returncode == 0


def run_as_nobody(*args, home):
    """The CLI as uid/gid 65534: file permissions then bind (root ignores them)."""
    env = dict(os.environ, COLUMNS="200", GPUCLUSTER_HOME=str(home), HOME=str(home.parent))
    cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", *gpucluster_argv(*args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


@pytest.fixture
def shared_home():
    """A GPUCLUSTER_HOME that uid 65534 can reach (pytest's tmp_path is private to root)."""
    top = tempfile.mkdtemp(prefix="gpucluster-ro-")
    os.chmod(top, 0o755)
    home = __import__("pathlib").Path(top) / "home"
    home.mkdir()
    yield home
    shutil.rmtree(top, ignore_errors=True)


@pytest.mark.skipif(not _as_nobody_available(), reason="needs root, setpriv and a Python that uid 65534 can start "
                                                      "to run the CLI as another user")
@pytest.mark.parametrize("layout", ["read-only file", "read-only folder"])
@pytest.mark.parametrize("cmd", [("run", "--cloud", "local", "--nodes", "1"), ("sweep", "--nodes", "1")])
def test_read_only_ledger_is_refused_before_a_run_starts(shared_home, layout, cmd):
    seed_runs(shared_home, "r20261122-000001-aaaaaa")
    before = ledger_rows(shared_home)
    ledger = shared_home / "ledger.sqlite3"
    if layout == "read-only file":
        os.chmod(shared_home, 0o777)  # the folder is writable; the ledger file is not
        os.chmod(ledger, 0o444)
    else:
        os.chmod(shared_home, 0o755)  # owned by root: uid 65534 can read, not write
        os.chmod(ledger, 0o644)
    # the nodes' Python is checked (torch there) before the ledger is opened; uid 65534 cannot start this
    # Python as a child (its binary is under /root, 0700), so a stand-in that answers the check
    ok_python = shared_home.parent / "python-ok"
    ok_python.write_text("#!/bin/sh\nexit 0\n")
    ok_python.chmod(0o755)
    r = run_as_nobody(*cmd, "--python", str(ok_python), home=shared_home)
    assert_clean_refusal(r)
    assert "read-only" in r.stderr or "not a writable directory" in r.stderr, r.stderr
    assert ledger_rows(shared_home) == before
    assert_nothing_started(shared_home, before)


@pytest.mark.skipif(not _as_nobody_available(), reason="needs root, setpriv and a Python that uid 65534 can start "
                                                      "to run the CLI as another user")
def test_read_only_ledger_still_readable(shared_home):
    """Reading commands keep working on a ledger one may not write."""
    seed_runs(shared_home, "r20261122-000001-aaaaaa")
    os.chmod(shared_home, 0o777)
    os.chmod(shared_home / "ledger.sqlite3", 0o444)
    r = run_as_nobody("show", "r20261122-000001", home=shared_home)
    assert r.returncode == 0, r.stderr
    assert "r20261122-000001-aaaaaa" in r.stdout


def damage(home, how: str) -> None:
    db = sqlite3.connect(str(home / "ledger.sqlite3"))
    if how == "missing table":
        db.execute("DROP TABLE phases")
    elif how == "bad JSON in runs":
        db.execute("UPDATE runs SET spec = '{\"cloud\": \"local\", ' WHERE id = 'r20261122-000001-aaaaaa'")
    elif how == "bad JSON in metrics":
        db.execute("INSERT INTO metrics (run_id, node_rank, kind, time, data) VALUES "
                   "('r20261122-000001-aaaaaa', 0, 'util', 1.0, '{\"kind\": ')")
    elif how == "bad JSON in resources":
        db.execute("INSERT INTO resources (run_id, kind, name, detail, requested_at) VALUES "
                   "('r20261122-000001-aaaaaa', 'process', 'p', 'not json', 1.0)")
    db.commit()
    db.close()


DAMAGE = {"missing table": "table 'phases' is missing",
          "bad JSON in runs": "runs row 'r20261122-000001-aaaaaa' holds bad JSON in column 'spec'",
          "bad JSON in resources": "resources row 'r20261122-000001-aaaaaa' holds bad JSON in column 'detail'",
          "bad JSON in metrics": "metrics row 'r20261122-000001-aaaaaa' holds bad JSON in column 'data'"}


@pytest.mark.parametrize("how", [h for h in DAMAGE if h != "bad JSON in metrics"])  # metrics: read, not checked
def test_damaged_ledger_refuses_a_run_and_keeps_no_row_running(home, how):
    seed_runs(home, "r20261122-000001-aaaaaa")
    damage(home, how)
    before = ledger_rows(home)
    r = run_cli("run", "--cloud", "local", "--nodes", "1")
    assert_clean_refusal(r, f"ledger {str(home / 'ledger.sqlite3')!r} is damaged", DAMAGE[how], "move it aside")
    assert ledger_rows(home) == before  # no new row, so none stuck at "running"
    assert_nothing_started(home, before)


@pytest.mark.parametrize("how,cmd", [
    ("missing table", ("runs",)), ("missing table", ("show", "r20261122-000001")),
    ("bad JSON in runs", ("runs",)), ("bad JSON in runs", ("show", "r20261122-000001-aaaaaa")),
    ("bad JSON in runs", ("runs", "--json")), ("bad JSON in resources", ("show", "r20261122-000001-aaaaaa")),
    ("bad JSON in runs", ("cost", "report")), ("bad JSON in resources", ("status",)),
    ("bad JSON in metrics", ("show", "r20261122-000001-aaaaaa", "--json")),
])
def test_damaged_ledger_reading_commands(home, how, cmd):
    seed_runs(home, "r20261122-000001-aaaaaa")
    damage(home, how)
    r = run_cli(*cmd)
    assert_clean_refusal(r, "is damaged", DAMAGE[how], "move it aside")


# -- item 14: run ids are matched literally; an ambiguous prefix lists its matches -----------------
@pytest.mark.parametrize("pattern", ["%", "_2026", "r2026112_", "r%", "r20261122-00000_-aaaaaa"])
def test_show_does_not_treat_like_wildcards_as_wildcards(home, pattern):
    seed_runs(home, "r20261122-000001-aaaaaa")
    r = run_cli("show", pattern)
    assert_clean_refusal(r, repr(pattern), "not in the ledger")


def test_show_ambiguous_prefix_lists_the_matches(home):
    seed_runs(home, "r20261122-000001-aaaaaa", "r20261122-000002-bbbbbb", "r20261123-000003-cccccc")
    r = run_cli("show", "r20261122")
    assert_clean_refusal(r, "'r20261122' is ambiguous", "r20261122-000002-bbbbbb", "r20261122-000001-aaaaaa")
    assert "r20261123" not in r.stderr
    ok = run_cli("show", "r20261122-000002")  # a unique prefix still works
    assert ok.returncode == 0 and "r20261122-000002-bbbbbb" in ok.stdout, ok.stderr
    logs = run_cli("logs", "r2026112")
    assert_clean_refusal(logs, "is ambiguous")


# -- --data and --setup (issue 14): refused before anything is created ------------------------
@pytest.mark.parametrize("value,needles", [
    ("no-such-folder-xyz", ["'no-such-folder-xyz'", "does not exist"]),
    ("README.md", ["'README.md'", "is a file, not a folder"]),
    ("tests:/abs/dest", ["'/abs/dest'", "relative path", "'..'"]),
    ("tests:../../up", ["'../../up'", "relative path", "one level up"]),  # ../data is allowed (issue 28)
    ("tests:../code", ["'../code'", "already holds 'code'"]),
    ("tests:a/../../b", ["'a/../../b'", "relative path"]),
    ("tests:", ["''", "relative path"]),
    ("s3://bucket/prefix", ["'s3://bucket/prefix'", "not supported yet", "local folder"]),
    ("gs://bucket/prefix", ["'gs://bucket/prefix'", "not supported yet"]),
])
def test_bad_data(home, value, needles):
    r = run_cli("run", "--nodes", "2", "--data", value)
    assert_clean_refusal(r, "--data", *needles)
    assert_no_run_recorded(home)


# -- object storage (issue 14): s3:// only where the backend declares it (aws), and well-formed ---------
@pytest.mark.parametrize("args,needles", [
    (("--cloud", "aws", "--data", "s3://Bad_Bucket/x"), ["--data 's3://Bad_Bucket/x'", "lowercase"]),
    (("--cloud", "aws", "--data", "s3://10.0.0.1/x"), ["'10.0.0.1'", "IP address"]),
    (("--cloud", "aws", "--output", "s3://ab"), ["--output 's3://ab'", "3-63"]),
    (("--cloud", "aws", "--data", "s3://bucket/a*:in"), ["'*'", "widen"]),
    (("--cloud", "aws", "--data", "s3://bucket/p:../../x"), ["'../../x'", "relative path"]),
    (("--cloud", "aws", "--output", "gs://bucket/p"), ["'gs://bucket/p'", "not supported yet"]),
    (("--cloud", "ssh", "--hosts", "u@h1,u@h2", "--data", "s3://bucket/p"),
     ["not supported yet with --cloud ssh", "--cloud aws"]),
    (("--cloud", "gcp", "--project", "p-123456", "--output", "s3://bucket/p"),
     ["not supported yet with --cloud gcp", "--cloud aws"]),
    (("--cloud", "gcp", "--project", "p-123456", "--data", "gs://google-data/x"), ["'gs://google-data/x'", "'google'"]),
    (("--cloud", "gcp", "--project", "p-123456", "--output", "gs://bucket/a#b"), ["--output 'gs://bucket/a#b'", "'#'"]),
])
def test_bad_object_storage_urls(home, args, needles):
    r = run_cli("run", "--nodes", "2", *args)
    assert_clean_refusal(r, *needles)
    assert_no_run_recorded(home)


def test_duplicate_data_dest(home):
    r = run_cli("run", "--nodes", "2", "--data", "tests:inputs", "--data", "docs:inputs")
    assert_clean_refusal(r, "'docs:inputs'", "'inputs'", "overlaps", "own DEST")
    assert_no_run_recorded(home)
    # two folders of the same name get the same default DEST (data/NAME)
    r = run_cli("run", "--nodes", "2", "--data", "tests/fixtures", "--data", "tests/fixtures")
    assert_clean_refusal(r, "'data/fixtures'", "own DEST")
    assert_no_run_recorded(home)


def test_empty_setup(home):
    r = run_cli("run", "--nodes", "2", "--setup", "  ")
    assert_clean_refusal(r, "--setup", "non-empty shell command")


def test_empty_setup_on_gcp(home):
    """gcp takes --setup; an empty one is refused there too, before anything is created."""
    r = run_cli("run", "--cloud", "gcp", "--project", "my-project", "--yes", "--setup", "true", "--setup", "")
    assert_clean_refusal(r, "--setup", "non-empty shell command")
    assert_no_run_recorded(home)


# -- --resume (issue 14): an unknown run, or one with nothing to resume from ------------------------
def _ended_run(home, run_id, outputs=None, status="interrupted"):
    from gpucluster.ledger.store import Ledger

    ledger = Ledger(home / "ledger.sqlite3")
    ledger.create_run(run_id, cloud="local", cluster="c", nodes=2, gpus_per_node=0, command=["x"], spec={})
    if status != "running":
        ledger.finish_run(run_id, status=status, exit_code=130)
    if outputs:
        ledger.record_outputs(run_id, outputs)
    ledger.close()


def _rows(home, run_id, files, verdict="complete", make=True):
    rows = []
    for n, (count, v) in enumerate(zip(files, verdict if isinstance(verdict, list) else [verdict] * len(files))):
        path = home / "runs" / run_id / "outputs" / f"node-{n}"
        if make:
            path.mkdir(parents=True)
            for i in range(count):
                (path / f"f{i}").write_text("x")
        rows.append({"node_rank": n, "path": str(path), "files": count, "bytes": count, "verdict": v})
    return rows


RESUME_CASES = {  # name: (ledger set-up, --resume value, needles)
    "no ledger yet": (lambda h: None, "r20261122-000001-aaaaaa", ["'r20261122-000001-aaaaaa'", "no such run"]),
    "unknown id": (lambda h: _ended_run(h, "r20261122-000001-aaaaaa"), "r20261122-000009-zzzzzz",
                   ["'r20261122-000009-zzzzzz'", "no such run", "gpucluster runs"]),
    "empty id": (lambda h: None, "", ["--resume ''", "id of an earlier run"]),
    "no outputs recorded": (lambda h: _ended_run(h, "r20261122-000001-aaaaaa"), "r20261122-000001",
                            ["'r20261122-000001-aaaaaa'", "no outputs were collected"]),
    "outputs came back empty": (
        lambda h: _ended_run(h, "r20261122-000001-aaaaaa", _rows(h, "r20261122-000001-aaaaaa", [0, 0])),
        "r20261122-000001-aaaaaa", ["'r20261122-000001-aaaaaa'", "came back empty or failed", "node 0 complete"]),
    "outputs failed": (
        lambda h: _ended_run(h, "r20261122-000001-aaaaaa",
                             _rows(h, "r20261122-000001-aaaaaa", [0, 0], ["failed", "failed"])),
        "r20261122-000001-aaaaaa", ["came back empty or failed", "node 1 failed"]),
    "outputs folder gone": (
        lambda h: _ended_run(h, "r20261122-000001-aaaaaa", _rows(h, "r20261122-000001-aaaaaa", [2, 0], make=False)),
        "r20261122-000001-aaaaaa", ["'r20261122-000001-aaaaaa'", "is gone from this machine"]),
    "outputs went to s3": (
        lambda h: _ended_run(h, "r20261122-000001-aaaaaa", [
            {"node_rank": n, "path": f"s3://bucket/out/r20261122-000001-aaaaaa/node-{n}", "files": 2, "bytes": 9,
             "verdict": "complete"} for n in (0, 1)]),
        "r20261122-000001-aaaaaa", ["'r20261122-000001-aaaaaa'", "object storage (s3://bucket/out/r20261122-000001-aaaaaa)",
                                    "not supported yet with --cloud local", "s3:// works with --cloud aws"]),
    "still running": (lambda h: _ended_run(h, "r20261122-000001-aaaaaa", status="running"),
                      "r20261122-000001-aaaaaa", ["'r20261122-000001-aaaaaa'", "still running"]),
}


@pytest.mark.parametrize("case", list(RESUME_CASES))
def test_bad_resume(home, case):
    setup, value, needles = RESUME_CASES[case]
    home.mkdir(parents=True, exist_ok=True)
    setup(home)
    before = sorted(p.name for p in (home / "runs").iterdir()) if (home / "runs").exists() else []
    had_ledger = (home / "ledger.sqlite3").exists()
    r = run_cli("run", "--nodes", "2", "--epochs", "2", "--resume", value)
    assert_clean_refusal(r, "--resume", *needles)
    if not had_ledger:
        assert not (home / "ledger.sqlite3").exists()  # looking the run up created nothing
    else:
        from gpucluster.ledger.store import Ledger

        assert len(Ledger(home / "ledger.sqlite3").list_runs()) == 1  # only the run set up here
    after = sorted(p.name for p in (home / "runs").iterdir()) if (home / "runs").exists() else []
    assert after == before


def test_resume_dest_is_not_a_data_dest(home):
    _ended_run(home, "r20261122-000001-aaaaaa", _rows(home, "r20261122-000001-aaaaaa", [1, 0]))
    r = run_cli("run", "--nodes", "2", "--data", "tests:resume", "--resume", "r20261122-000001-aaaaaa")
    assert_clean_refusal(r, "tests:resume'", "DEST 'resume'", "where --resume stages", "another DEST")


# -- issue 32 item 8: input that cannot work is refused before the ledger row --------------------
def _data_with_link(tmp_path, how):
    top = tmp_path / "shards"
    (top / "sub").mkdir(parents=True)
    (top / "a.bin").write_bytes(b"x")
    if how == "broken":
        (top / "gone").symlink_to(tmp_path / "no-such-file")
    elif how == "self-loop":
        (top / "loop").symlink_to(top / "loop")
    else:  # a folder link back to an ancestor: a copy following links never ends
        (top / "sub" / "up").symlink_to(top)
    return top


@pytest.mark.parametrize("how,name", [("broken", "gone"), ("self-loop", "loop"), ("cycle", "sub/up")])
def test_data_folder_with_a_link_that_cannot_be_copied(home, tmp_path, how, name):
    top = _data_with_link(tmp_path, how)
    r = run_cli("run", "--nodes", "1", "--data", str(top))
    assert_clean_refusal(r, f"--data {str(top)!r}", repr(str(top / name)), "symbolic link")
    assert_nothing_started(home)


def test_data_folder_with_good_links_is_taken(tmp_path):
    from gpucluster.watch.staging import bad_link

    top = tmp_path / "shards"
    (top / "sub").mkdir(parents=True)
    (top / "a.bin").write_bytes(b"x")
    (top / "same").symlink_to(top / "a.bin")
    (tmp_path / "elsewhere").mkdir()
    (top / "other").symlink_to(tmp_path / "elsewhere")  # a folder outside the tree: followed, no loop
    (top / "sub" / "again").symlink_to(tmp_path / "elsewhere")  # the same folder twice is no loop either
    assert bad_link(top) is None
    (top / "sub" / "up").symlink_to(tmp_path)  # tmp_path holds the tree: an endless copy
    assert bad_link(top) == str(top / "sub" / "up")


# a command after `--` that cannot run: (argv after --, needles)
NOT_RUNNABLE = [
    (["--"], ["command after --", "'--'"]),
    (["tests"], ["command 'tests'", "it is a folder"]),
    (["python", "tests"], ["script 'tests'", "not a folder"]),
    (["python"], ["command 'python'", "python alone"]),
    (["python3", "-m"], ["'python3 -m'", "followed by its module"]),
    (["python", "-c"], ["'python -c'", "followed by its code"]),
    # interpreter options and no program (issue 32 item 8): they ran, and "succeeded" doing nothing
    (["python", "-u"], ["'python -u'", "options only"]),
    (["python", "-X", "dev"], ["'python -X dev'", "options only"]),
    (["python", "-"], ["'python -'", "reads the program from stdin"]),
    (["python", "-u", "-"], ["'python -u -'", "reads the program from stdin"]),
    (["python", "--version"], ["'python --version'", "prints and exits"]),
    (["python", "-u", "no-such-script.py"], ["script 'no-such-script.py'", "a Python file that exists"]),
    (["python", "-B", "tests"], ["script 'tests'", "not a folder"]),
    (["python", "-W", "ignore", "-m", "no_such_module_xyz"], ["python module 'no_such_module_xyz'"]),
]


@pytest.mark.parametrize("argv,needles", NOT_RUNNABLE, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
@pytest.mark.parametrize("cmd", ["run", "sweep"])
def test_command_that_cannot_run(home, cmd, argv, needles):
    r = run_cli(cmd, "--nodes", "1", "--", *argv)
    assert_clean_refusal(r, *needles)
    assert_nothing_started(home)


def test_runnable_commands_pass_the_check(tmp_path):
    from gpucluster.lifecycle.prepare import check_command

    check_command(("python", "-c", "pass"))
    check_command(("python", "-m", "json.tool"))
    check_command(("true",))
    check_command(("python", "-u", "tests/conftest.py"))
    check_command(("python", "-X", "dev", "-W", "ignore", "-m", "json.tool"))
    check_command(("python3", "-uc", "pass"))
    check_command(("python", "-Xdev", "--", "tests/conftest.py"))


@pytest.mark.parametrize("dest", ["/proc/gpucluster-out", "/sys/gpucluster-out", "/proc/self"])
def test_output_on_a_virtual_file_system(home, dest):
    r = run_cli("run", "--nodes", "1", "--output", dest)
    assert_clean_refusal(r, f"output {dest!r}", "file system the kernel makes up")
    assert_nothing_started(home)


def test_ssh_script_folder_over_the_size_limit(home, tmp_path):
    from gpucluster.infra.ssh.ship import MAX_SHIP_BYTES

    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('hi')\n")
    with open(code / "weights.bin", "wb") as f:  # sparse: its size counts, no disk is used
        f.truncate(MAX_SHIP_BYTES + 1)
    r = run_cli("run", "--cloud", "ssh", "--hosts", "u@127.0.0.2", "--", "python", str(code / "train.py"))
    # the message names the largest files, so they can go to .gpuclusterignore
    assert_clean_refusal(r, repr(str(code)), f"over the {MAX_SHIP_BYTES >> 20}.0 MiB limit; largest: weights.bin "
                                             "(200.0 MiB), train.py (12 B)")
    assert ".gpuclusterignore" in r.stderr
    assert_nothing_started(home)


@pytest.mark.parametrize("cloud", ["ssh", "aws"])
def test_no_ssh_on_path(home, tmp_path, cloud):
    """ssh and aws runs launch over OpenSSH: without `ssh` on PATH nothing is recorded (exit 2, the fix)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)  # the command after -- resolves; ssh does not
    hosts = ["--hosts", "u@127.0.0.2"] if cloud == "ssh" else ["--ssh-cidr", "198.51.100.7/32", "--yes"]
    r = run_cli("run", "--cloud", cloud, *hosts, env={"PATH": str(bin_dir)})
    assert_clean_refusal(r, "`ssh` is not on PATH", "openssh")
    assert_nothing_started(home)


# -- issue 32 item 10: commands that create nothing refuse what `run` refuses, by the same checks --
SAME_CHECKS = [  # (argv, needles): each value is one `run` refuses
    (["run", "--cloud", "aws", "--dry-run", "--ssh-cidr", "198.51.100.7/32", "--threads-per-proc", "0"],
     ["threads per process '0'", "1 to 1024"]),
    (["run", "--cloud", "aws", "--dry-run", "--ssh-cidr", "198.51.100.7/32", "--", "python"], ["python alone"]),
    (["up", "--cloud", "aws", "--dry-run", "--ssh-cidr", "198.51.100.7/32", "--disk-gb", "5"],
     ["disk size (GB) '5'", "10 to 16384"]),
    (["cost", "estimate", "--cloud", "aws", "--disk-gb", "5"], ["disk size (GB) '5'", "10 to 16384"]),
    (["cost", "estimate", "--cloud", "local", "--nodes", "17"], ["nodes '17'", "1 to 16"]),
    (["cost", "estimate", "--cloud", "aws", "--gpus-per-node", "17"], ["gpus per node '17'", "0 to 16"]),
    (["cost", "estimate", "--cloud", "aws", "--gpus", "17"], ["gpus per node '17'", "0 to 16"]),  # the old spelling
    (["sweep", "--cloud", "local", "--region", "us-east-1"], ["--region does not apply to --cloud local"]),
    # issue 45 item 10: --state (read by its callback, not passed on) was taken and ignored on local
    (["run", "--cloud", "local", "--state", "file:///tmp/x", "--nodes", "1"], ["--state does not apply to --cloud local"]),
    (["sweep", "--cloud", "local", "--nodes", "1", "--report", ""], ["--report '' is not allowed"]),
    (["gc", "--cloud", "aws", "--region", "us-est-1"], ["'us-est-1'", 'did you mean "us-east-1"']),
    (["gc", "--project", "Not A Project"], ["'Not A Project'", "project ID"]),
    (["doctor", "--cloud", "aws", "--region", "us-est-1"], ["'us-est-1'", 'did you mean "us-east-1"']),
    (["doctor", "--cloud", "gcp", "--region", "us-east-1"], ["'us-east-1'", "no V100 zone"]),
    (["doctor", "--project", "Not A Project"], ["'Not A Project'", "project ID"]),
    (["doctor", "--cloud", "aws", "--instance-type", "g5.bogus"], ["'g5.bogus'", "g5.xlarge"]),
    (["doctor", "--cloud", "aws", "--region", "eu-west-1", "--instance-type", "g5.bogus"], ["'g5.bogus'"]),
]


@pytest.mark.parametrize("argv,needles", SAME_CHECKS, ids=lambda v: " ".join(v[:4]) if isinstance(v, list) else None)
def test_commands_that_create_nothing_refuse_what_run_refuses(home, argv, needles):
    r = run_cli(*argv)
    assert_clean_refusal(r, *needles)
    assert_nothing_started(home)


def test_an_empty_region_is_the_default_for_gc_as_for_run(home, tmp_path):
    """`run --region ''` uses the default region; `gc --region ''` passed '' to boto3 ("Invalid
    endpoint: https://ec2..amazonaws.com"). It now looks where `run` would have made the cluster.
    No credentials here (botocore's chain emptied): the checks cannot run, and say where."""
    env = {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_CONFIG_FILE": str(tmp_path / "none"),
           "AWS_EC2_METADATA_DISABLED": "true", "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
           "AWS_DEFAULT_REGION": "", "AWS_REGION": ""}
    r = run_cli("gc", "--cloud", "aws", "--region", "", "--json", env=env, timeout=120)
    assert r.returncode == 3 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-2000:])
    unchecked = json.loads(r.stdout)["unchecked"]
    assert unchecked and any("in us-east-1" in u for u in unchecked), unchecked
    assert not any("Invalid endpoint" in u for u in unchecked), unchecked


# -- issue 32 item 3: cloud credentials are checked before anything is recorded -------------------
NO_CREDENTIALS = {  # cloud: (flags, the environment without credentials, needles)
    # botocore's chain: environment, shared files, instance metadata (disabled)
    "aws": (["--ssh-cidr", "198.51.100.7/32"], {"AWS_SHARED_CREDENTIALS_FILE": "{tmp}/none",
                                                 "AWS_CONFIG_FILE": "{tmp}/none", "AWS_EC2_METADATA_DISABLED": "true"},
            ["aws credentials", "aws configure"]),
    # google.auth.default: GOOGLE_APPLICATION_CREDENTIALS naming a missing file is an error at once
    "gcp": (["--project", "my-project-123"], {"GOOGLE_APPLICATION_CREDENTIALS": "{tmp}/none.json",
                                              "CLOUDSDK_CONFIG": "{tmp}/gcloud", "GCE_METADATA_HOST": "127.0.0.1:9"},
            ["application-default credentials"]),
}


@pytest.mark.parametrize("command,cloud", [("run", c) for c in NO_CREDENTIALS] + [("up", "aws")])
def test_cloud_run_without_credentials_is_refused_before_the_row(home, tmp_path, command, cloud):
    """With the Pulumi CLI present (a stand-in answering `pulumi version` as the real one does:
    `v3.x.y` on stdout, https://www.pulumi.com/docs/iac/cli/commands/pulumi_version/) and no
    credentials for the cloud, `run` (and `up`, through the same preflight) stops with exit 2 and
    the fix, and no run row is written. Before, the run row was written and the run ended with
    exit 3, "not verified"."""
    flags, no_creds, needles = NO_CREDENTIALS[cloud]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "pulumi"
    fake.write_text("#!/bin/sh\n[ \"$1\" = version ] && echo v3.200.0 && exit 0\necho unexpected >&2; exit 1\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_", "CLOUDSDK_", "GCE_"))}
    env.update({k: v.format(tmp=tmp_path) for k, v in no_creds.items()})
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", COLUMNS="200", GPUCLUSTER_HOME=str(home))
    r = subprocess.run(gpucluster_argv(command, "--cloud", cloud, *flags, "--yes"), capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=300)
    assert_clean_refusal(r, *needles, "nothing was started")
    assert_nothing_started(home)


def _laughs() -> bytes:
    """The "billion laughs" file (https://en.wikipedia.org/wiki/Billion_laughs_attack) in YAML:
    nine levels of aliases, each repeating the one before ten times: about 2 KB that expands to
    10^9 strings."""
    lines = [b"a0: &a0 lol"]
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]".encode())
    return b"config:\n  gpucluster:cloud: aws\n  gpucluster:tags:\n" + b"".join(b"    " + ln + b"\n" for ln in lines)


@pytest.mark.parametrize("body,needle", [
    (_laughs(), "expands to more than"),
    (b"config:\n  gpucluster:cloud: aws\n  gpucluster:x: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested too deeply"),
    (b"config:\n  gpucluster:cloud: aws\n  gpucluster:x: " + b"{a: " * 40 + b"1" + b"}" * 40 + b"\n",
     "nested too deeply"),
    (b"config:\n  gpucluster:cloud: aws\n# " + b"x" * (2 << 20) + b"\n", "at most 1048576 bytes"),
])
def test_hostile_stack_yaml_is_bounded(home, tmp_path, body, needle):
    """Issue 32 items 4, 5: alias expansion and nesting are bounded before anything is built."""
    stack = write_stack(tmp_path, body)
    r = run_cli("cost", "estimate", "--stack", str(stack), timeout=60)
    assert_clean_refusal(r, needle)


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "folder"])
def test_a_stack_file_that_is_not_a_file_is_refused(home, tmp_path, kind):
    """Issue 32 item 5: the size bound is on the bytes read, not on what stat says: a link to
    /dev/zero (st_size 0, endless) and a FIFO (blocks until a writer comes) are refused, never read."""
    stack = tmp_path / "Pulumi.bad.yaml"
    if kind == "dev-zero":
        stack.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(stack)
    else:
        stack.mkdir()
    r = run_cli("cost", "estimate", "--stack", str(stack), timeout=60)
    assert_clean_refusal(r, "not a file")


# -- issue 32 item 5: every path in the home checked -------------------------------------------
@pytest.mark.parametrize("command", ["show", "logs"])
def test_empty_run_id(home, command):
    seed_runs(home, "r20261122-000001-aaaaaa")
    r = run_cli(command, "")
    assert_clean_refusal(r, "run id '' is empty")


@pytest.mark.parametrize("columns", ["abc", "0", "-5", "1e9"])
def test_odd_columns(home, columns):
    seed_runs(home, "r20261122-000001-aaaaaa")
    r = run_cli("runs", env={"COLUMNS": columns})
    assert_clean_refusal(r, f"COLUMNS {columns!r}", "20 to 10000")


def _local_run(*extra):
    return run_cli("run", "--cloud", "local", "--nodes", "1", *extra, "--", sys.executable, "-c", "pass", timeout=120)


@pytest.mark.parametrize("what,needle", [
    ("locks-file", "lock"), ("runs-file", "run folder"), ("lock-folder", "gpucluster-local-"),
])
def test_home_paths_of_the_wrong_kind(home, what, needle):
    """A file where a folder belongs, a folder where the lock file belongs: one line, exit 2,
    nothing recorded, no empty run folder left."""
    seed_runs(home, "r20261122-000001-aaaaaa")
    before = ledger_rows(home)
    if what == "locks-file":
        (home / "locks").write_text("x")
    elif what == "runs-file":
        (home / "runs").write_text("x")
    else:  # the lock of the default cluster, whose name carries this home's owner id
        from gpucluster.ownership import default_name, installation_id

        (home / "locks" / f"{default_name('local', installation_id(home))}.lock").mkdir(parents=True)
    r = _local_run()
    assert_clean_refusal(r, needle)
    assert ledger_rows(home) == before
    if (home / "runs").is_dir():
        assert list((home / "runs").iterdir()) == []


@pytest.mark.parametrize("argv", [
    ["doctor", "--cloud", "aws"],
    ["run", "--cloud", "aws", "--nodes", "1", "--ssh-cidr", "203.0.113.7/32", "--yes", "--", "python", "-c", "pass"],
    ["up", "--cloud", "aws", "--nodes", "1", "--ssh-cidr", "203.0.113.7/32", "--yes"],
], ids=["doctor", "run", "up"])
def test_pulumi_folder_that_is_a_file(home, argv):
    """Issue 32 item 5: $GPUCLUSTER_HOME/pulumi (the Pulumi state) is a file: one line naming it,
    exit 2, nothing recorded (a FileExistsError traceback before)."""
    seed_runs(home, "r20261122-000001-aaaaaa")
    before = ledger_rows(home)
    (home / "pulumi").write_text("x")
    r = run_cli(*argv, timeout=120)
    assert_clean_refusal(r, f"Pulumi state folder {str(home / 'pulumi')!r}", "File exists")
    assert ledger_rows(home) == before and (home / "pulumi").read_text() == "x"


def test_node_log_that_is_a_folder(home):
    seed_runs(home, "r20261122-000001-aaaaaa")
    from gpucluster.ledger.store import Ledger

    led = Ledger(home / "ledger.sqlite3")
    log_dir = home / "runs" / "r20261122-000002-bbbbbb"
    led.create_run("r20261122-000002-bbbbbb", cloud="local", cluster="gpucluster-local", nodes=1, gpus_per_node=0,
                   command=["x"], spec={"cloud": "local", "nodes": 1}, log_dir=str(log_dir))
    led.finish_run("r20261122-000002-bbbbbb", status="succeeded", exit_code=0, teardown="verified")
    (log_dir / "node-0.log").mkdir(parents=True)
    r = run_cli("logs", "r20261122-000002-bbbbbb")
    assert_clean_refusal(r, "node-0.log", "is not a file")



# -- sharing an account (issue 24): the state, its secrets, gc's owner limits ------------------------
NO_PULUMI_INSTALL = {"GPUCLUSTER_INSTALL_PULUMI": "no", "PULUMI_CONFIG_PASSPHRASE": "", "PULUMI_BACKEND_URL": ""}
AWS_RUN = ("--cloud", "aws", "--nodes", "1", "--ssh-cidr", "203.0.113.7/32", "--yes")


@pytest.mark.parametrize("args,needles", [
    (("run", *AWS_RUN, "--state", "ftp://bucket/x"), ("--state 'ftp://bucket/x' is not allowed", "s3://BUCKET")),
    (("up", *AWS_RUN, "--state", "file://relative/dir"), ("'file://relative/dir'", "absolute path")),
    (("up", *AWS_RUN, "--state", "s3://"), ("--state 's3://' is not allowed",)),
    (("down", "x", "--cloud", "aws", "--state", "gs:/bucket"), ("'gs:/bucket'",)),
    (("gc", "--cloud", "aws", "--any-owner", "--yes"), ("--any-owner also needs --older-than",)),
    (("gc", "--cloud", "aws", "--older-than", "3 weeks"), ("--older-than '3 weeks' is not allowed", "12h")),
    (("gc", "--cloud", "aws", "--any-owner", "--older-than", "-1d"), ("'-1d'",)),
])
def test_sharing_flags(home, args, needles):
    r = run_cli(*args, env={"GPUCLUSTER_HOME": str(home), **NO_PULUMI_INSTALL})
    assert_clean_refusal(r, *needles)
    assert_no_run_recorded(home)


@pytest.mark.parametrize("cmd", [("up", *AWS_RUN, "--name", "team-x"), ("run", *AWS_RUN, "--name", "team-x"),
                                 ("down", "team-x", "--cloud", "aws", "--yes")])
def test_shared_state_without_the_team_passphrase(home, tmp_path, cmd):
    """A shared state's secrets need the team's passphrase (or a KMS key): refused before anything,
    naming the state and the fix; the home's own passphrase file is not offered to teammates."""
    env = {"GPUCLUSTER_HOME": str(home), **NO_PULUMI_INSTALL, "GPUCLUSTER_STATE": f"file://{tmp_path}/team"}
    r = run_cli(*cmd, env=env)
    assert_clean_refusal(r, f"file://{tmp_path}/team", "needs a passphrase every teammate uses",
                         "PULUMI_CONFIG_PASSPHRASE")
    assert_no_run_recorded(home)
    assert not (tmp_path / "team").exists()


@pytest.mark.parametrize("setting,env,needles", [
    ("{", {}, ("config.json", "is not JSON")),
    ('{"stat": "s3://b"}', {}, ("key 'stat' is not allowed", "state, secrets_provider")),
    ('{"state": 5}', {}, ("state must be a string",)),
    ('{"state": "http://x"}', {}, ("config.json state 'http://x' is not allowed",)),
    ('{"state": "s3://team-b"}', {"GPUCLUSTER_SECRETS_PROVIDER": "rot13://x", "PULUMI_CONFIG_PASSPHRASE": "p"},
     ("GPUCLUSTER_SECRETS_PROVIDER 'rot13://x' is not allowed", "awskms://")),
])
def test_bad_state_settings(home, setting, env, needles):
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.json").write_text(setting)
    r = run_cli("up", *AWS_RUN, env={"GPUCLUSTER_HOME": str(home), **NO_PULUMI_INSTALL, **env})
    assert_clean_refusal(r, *needles)
    assert_no_run_recorded(home)


def test_damaged_installation_id(home):
    """The owner id file holding something else is named, not replaced (a new id would make this
    home's clusters look like another owner's)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "installation-id").write_text("not-an-id\n")
    r = run_cli("run", "--cloud", "local", "--nodes", "1", env={"GPUCLUSTER_HOME": str(home)})
    assert_clean_refusal(r, "installation-id", "'not-an-id'", "16 hex digits")
    assert_no_run_recorded(home)
    assert (home / "installation-id").read_text() == "not-an-id\n"


def test_gcp_data_above_the_working_folder_needs_a_shipped_script_and_stays_in_the_run_folder(home, tmp_path):
    """issue 28 item 7 on gcp: `--data SRC:../data` lands beside the pod's working copy of the script's
    folder; without a shipped script there is no such folder, and it may not land on the run folder's own."""
    r = run_cli("run", "--cloud", "gcp", "--project", "p-123456", "--nodes", "2", "--data", "tests:../data")
    assert_clean_refusal(r, "'../data'", "shipped script")
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("print(1)\n")
    r = run_cli("run", "--cloud", "gcp", "--project", "p-123456", "--nodes", "2", "--data",
                f"{ROOT / 'tests'}:../control", "--", "python", "train.py", cwd=project)
    assert_clean_refusal(r, "'../control'", "already holds")
    assert_no_run_recorded(home)


@pytest.mark.parametrize("cmd", [("up", "--cloud", "aws", "--yes"), ("run", "--cloud", "aws", "--yes")])
@pytest.mark.parametrize("tag,bad", [("team=ml,infra", "','"), ("cost-center=a;b", "';'"),
                                     ("note=#42", "'#'")])
def test_a_tag_iam_refuses_is_refused_before_a_run_that_makes_a_role(home, cmd, tag, bad):
    """Issue 40 item 10: IAM tag keys and values match [\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]* (IAM API
    reference, Tag), and a run with option ssm=true (or s3:// data) tags the role it creates: such a
    tag is refused before anything is created, naming it and what IAM allows."""
    r = run_cli(*cmd, "--tag", tag, "--option", "ssm=true")
    assert_clean_refusal(r, repr(tag.split("=", 1)[1]), bad, "IAM", "letters, digits, spaces and _ . : / = + - @")
    assert not (home / "ledger.sqlite3").exists()
    assert_nothing_started(home)


def test_the_same_tag_is_fine_on_a_run_without_a_role():
    """EC2 tags allow any character: without a role to tag, the tag passes validation."""
    from gpucluster.infra.registry import plugin
    from gpucluster.spec import ClusterSpec

    spec = ClusterSpec(cloud="aws", nodes=2, name="c40", region="us-east-1", instance_type="g5.xlarge",
                       tags=(("team", "ml,infra"),))
    plugin("aws").spec.validate(spec)
    from gpucluster.errors import SpecError

    with pytest.raises(SpecError, match="IAM"):
        plugin("aws").spec.validate(spec.replace(options=(("ssm", "true"),)))
    plugin("aws").spec.validate(spec.replace(options=(("ssm", "true"),), tags=(("team", "ml/infra ü@1"),)))
