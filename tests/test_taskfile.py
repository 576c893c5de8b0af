"""Task files (gpucluster/plan/taskfile.py, cli/taskopts.py): every key reaches its flag, flags win, the
same file serves run, up, sweep and cost estimate, and every error names the key and the line (exit 2,
one line, nothing created). The commands are stopped where the one prepare step would start: what
they would prepare is the `Request` they hand it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from gpucluster.lifecycle import prepare as prepare_module
from gpucluster.plan import taskfile
from gpucluster.cli.main import main

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


class Stop(Exception):
    pass


@pytest.fixture
def captured(monkeypatch, home):
    """The Request each command hands the prepare step (then it stops)."""
    got = []

    def fake_prepare(req, backend, **kw):
        got.append(req)
        raise Stop

    monkeypatch.setattr(prepare_module, "prepare", fake_prepare)
    return got


def write(folder: Path, text: str, name: str = "task.yaml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def request(captured, *argv: str):
    with pytest.raises(Stop):
        main(list(argv))
    return captured[-1]


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder: a script, a data folder, an env file, ssh files; the shell is elsewhere."""
    p = tmp_path / "project"
    (p / "shards").mkdir(parents=True)
    (p / "train.py").write_text("print('hi')\n")
    (p / ".env").write_text("# settings\nexport SEED=7\nNAME='two words'\n")
    (p / "id_key").write_text("key\n")
    (p / "known").write_text("")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("GC_TOKEN", "s3cret-value")
    return p


LOCAL = """\
name: demo-task
resources:
  cloud: local
  nodes: 3
  gpus_per_node: 0
python: {python}
workdir: .
setup:
  - pip --version
  - echo ready
run: python train.py --epochs 2
procs_per_node: 2
threads_per_proc: 1
data: [shards]
env:
  WANDB_MODE: offline
  LR: 0.1
env_file: .env
secrets: [GC_TOKEN]
outputs:
  dir: out
  collect: ["*.pt", logs]
  limit: 500MB
limits:
  max_minutes: 30
  max_restarts: 1
"""


def test_every_local_key_reaches_its_flag_and_paths_are_the_task_folders(captured, project):
    task = write(project, LOCAL.format(python=sys.executable))
    req = request(captured, "run", str(task))
    assert req.cloud == "local" and req.name == "demo-task" and req.nodes == 3 and req.gpus_per_node == 0
    assert req.python == sys.executable
    assert req.setup == ("pip --version", "echo ready")
    assert req.command == ("python", "train.py", "--epochs", "2")
    assert req.procs_per_node == 2 and req.threads_per_proc == 1 and req.max_restarts == 1
    assert req.data == ("shards",) and req.output == "out"
    assert req.collect == ("*.pt", "logs") and req.collect_limit == "500MB"
    assert req.env == ("WANDB_MODE=offline", "LR=0.1") and req.env_file == (".env",) and req.secret == ("GC_TOKEN",)
    assert req.max_minutes == 30.0
    # the command ran from the task's workdir (the file's folder), and came back
    assert Path.cwd().name == "elsewhere"


def test_the_builtin_workload_keys(captured, project):
    task = write(project, "resources: {cloud: local}\nworkload: mnist\nepochs: 3\nworkload_args: --batch-size 64\n"
                          "resume: r20261122-101500-ab12cd\n")
    req = request(captured, "run", "-f", str(task))
    assert (req.workload, req.epochs, req.workload_args) == ("mnist", 3, "--batch-size 64")
    assert req.resume == "r20261122-101500-ab12cd" and req.command == ()


def test_every_aws_key_reaches_its_flag(captured, project):
    task = write(project, """\
resources:
  cloud: aws
  region: us-west-2
  zone: us-west-2b
  instance_type: g5.12xlarge
  nodes: 4
  spot: true
  disk_gb: 200
  ssh_cidr: 203.0.113.7/32
  tags: {team: vision, cost-center: 42}
  options: {efa: true, image: base}
ssh:
  remote_python: /opt/pytorch/bin/python
limits:
  max_lifetime: 120
  ready_timeout: 900
  max_cost: 40
  stall_minutes: 12
keep: true
run: [python, train.py]
""")
    req = request(captured, "run", str(task))
    assert (req.cloud, req.region, req.zone, req.instance_type, req.nodes) == (
        "aws", "us-west-2", "us-west-2b", "g5.12xlarge", 4)
    assert req.spot is True and req.disk_gb == 200 and req.ssh_cidr == "203.0.113.7/32"
    assert req.tags == ("team=vision", "cost-center=42") and req.options == ("efa=true", "image=base")
    assert req.remote_python == "/opt/pytorch/bin/python"
    assert req.max_lifetime == 120 and req.ready_timeout == 900
    assert (req.max_cost, req.stall_minutes) == (40.0, 12.0)  # issue 48: the money guards
    assert captured and req.command == ("python", "train.py")


def test_the_gpu_key_reaches_its_flag(captured, project):
    # issue 42: resources.gpu is --gpu TYPE[:COUNT] (the cloud picks the machine)
    task = write(project, "resources:\n  cloud: aws\n  gpu: H100:8\n  nodes: 2\nrun: python train.py\n", "gpu.yaml")
    req = request(captured, "run", str(task))
    assert (req.gpu, req.instance_type) == ("H100:8", None)
    assert request(captured, "run", str(task), "--gpu", "L4:4").gpu == "L4:4"  # the flag wins


def test_every_ssh_and_gcp_key_reaches_its_flag(captured, project):
    task = write(project, "resources:\n  cloud: ssh\n  hosts: [ubuntu@10.0.0.5, 'ubuntu@10.0.0.6:2222']\n"
                          "ssh:\n  identity: id_key\n  known_hosts: known\nrun: python train.py\n")
    req = request(captured, "run", str(task))
    assert req.hosts == "ubuntu@10.0.0.5,ubuntu@10.0.0.6:2222"
    assert (req.identity, req.known_hosts) == ("id_key", "known")
    task = write(project, "resources:\n  cloud: gcp\n  project: my-proj-123\nlimits:\n  start_deadline: 30\n"
                          "run: python train.py\n", "gcp.yaml")
    req = request(captured, "run", str(task))
    assert (req.cloud, req.project, req.start_deadline) == ("gcp", "my-proj-123", 30)


def test_the_check_and_recovery_keys_reach_their_flags_and_flags_win(captured, project):
    task = write(project, """\
resources: {cloud: aws, instance_type: g5.xlarge, nodes: 2, spot: true, ssh_cidr: 203.0.113.7/32}
workload: digits
epochs: 8
check: false
recover: 5
fallback: on-demand
fallback_after: 1
checkpoint_every: 200
""")
    req = request(captured, "run", str(task))
    assert (req.check, req.recover, req.fallback, req.fallback_after, req.checkpoint_every) == (
        False, 5, "on-demand", 1, 200)
    req = request(captured, "run", str(task), "--check", "--recover", "0", "--checkpoint-every", "50")
    assert (req.check, req.recover, req.checkpoint_every) == (True, 0, 50)  # the flags win
    assert (req.fallback, req.fallback_after) == ("on-demand", 1)  # the rest stay the file's
    # not in the file: the defaults (None: the backend's or --spot's default, decided by the core)
    req = request(captured, "run", str(write(project, "resources: {cloud: local}\nworkload: digits\n", "b.yaml")))
    assert (req.check, req.recover, req.fallback, req.fallback_after, req.checkpoint_every) == (None,) * 5


def test_the_tests_above_cover_every_key():
    text = Path(__file__).read_text() + Path(__file__).with_name("test_kube_backend.py").read_text()  # kubernetes'
    for key in taskfile.KEYS:
        leaf = key.split(".")[-1]
        assert f"{leaf}:" in text or f"{leaf}: " in text, key


def test_flags_win_lists_are_replaced_and_env_adds_up(captured, project):
    task = write(project, LOCAL.format(python=sys.executable))
    (project / "other").mkdir()
    req = request(captured, "run", str(task), "--nodes", "2", "--data", str(project / "other"), "--env", "LR=0.5",
                  "--secret", "GC_TOKEN", "--", "python", "train.py")
    assert req.nodes == 2
    assert req.data == (str(project / "other"),)  # the flag's list replaces the file's
    assert req.env == ("WANDB_MODE=offline", "LR=0.1", "LR=0.5")  # file first, the flag wins for LR
    assert req.command == ("python", "train.py")
    # the option order does not matter: the file may come after options
    req = request(captured, "run", "--nodes", "4", str(task))
    assert req.nodes == 4 and req.name == "demo-task"


def test_relative_flags_stay_relative_to_the_shell(captured, project, tmp_path):
    task = write(project, LOCAL.format(python=sys.executable))
    (tmp_path / "elsewhere" / "mine").mkdir()
    req = request(captured, "run", str(task), "--data", "mine:d", "--output", "o2")
    assert req.data == (str(tmp_path / "elsewhere" / "mine") + ":d",)
    assert req.output == str(tmp_path / "elsewhere" / "o2")


def test_up_sweep_and_cost_estimate_take_the_same_file(captured, project, capsys):
    task = write(project, """\
name: shared
resources: {cloud: aws, region: us-east-1, instance_type: g5.xlarge, nodes: 2, spot: false}
run: python train.py
limits: {max_minutes: 30}
""")
    up = request(captured, "up", str(task), "--dry-run")
    assert (up.cloud, up.name, up.instance_type, up.nodes, up.job) == ("aws", "shared", "g5.xlarge", 2, False)
    sweep = request(captured, "sweep", "-f", str(task), "--nodes", "1,2", "--yes")
    assert (sweep.cloud, sweep.region, sweep.instance_type, sweep.command) == (
        "aws", "us-east-1", "g5.xlarge", ("python", "train.py"))
    capsys.readouterr()
    assert main(["cost", "estimate", str(task), "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert est["nodes"] == 2 and est["hours"] == "0.5" and est["region"] == "us-east-1"


# -- the user config and the environment ---------------------------------------------------------
def test_precedence_flag_task_env_config_builtin(captured, project, monkeypatch, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("cloud: aws\naws:\n  region: eu-west-1\n  ssh_cidr: 198.51.100.0/24\n")
    monkeypatch.setenv("GPUCLUSTER_CONFIG", str(config))
    bare = write(project, "run: python train.py\n", "bare.yaml")
    req = request(captured, "run", str(bare))
    assert (req.cloud, req.region, req.ssh_cidr) == ("aws", "eu-west-1", "198.51.100.0/24")  # config
    monkeypatch.setenv("GPUCLUSTER_REGION", "us-west-2")
    assert request(captured, "run", str(bare)).region == "us-west-2"  # env > config
    placed = write(project, "resources: {region: us-east-1}\nrun: python train.py\n", "placed.yaml")
    assert request(captured, "run", str(placed)).region == "us-east-1"  # task > env
    assert request(captured, "run", str(placed), "--region", "eu-west-1").region == "eu-west-1"  # flag > task
    # a config for aws says nothing to a local run (its section is aws's), nor does GPUCLUSTER_REGION
    req = request(captured, "run", "--cloud", "local", "--", "python", str(project / "train.py"))
    assert (req.cloud, req.region, req.ssh_cidr) == ("local", None, None)
    monkeypatch.setenv("GPUCLUSTER_CONFIG", "")
    monkeypatch.delenv("GPUCLUSTER_REGION")
    assert request(captured, "run", "--", "python", str(project / "train.py")).cloud == "local"  # built-in


def test_run_and_up_default_the_same_way(captured, monkeypatch, tmp_path, capsys):
    assert main(["up"]) == 2
    assert "give --cloud" in capsys.readouterr().err  # no default: a bare `up` keeps nothing, not even local nodes
    monkeypatch.setenv("GPUCLUSTER_CLOUD", "gcp")
    assert request(captured, "up", "--dry-run").cloud == "gcp"
    assert request(captured, "run", "--dry-run").cloud == "gcp"


def test_the_config_file_location_and_state_backend(monkeypatch, tmp_path):
    from gpucluster.plan import userconfig

    monkeypatch.delenv("GPUCLUSTER_CONFIG")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert userconfig.config_path() == tmp_path / "xdg" / "gpucluster" / "config.yaml"
    assert userconfig.state_backend() is None  # no file: no defaults
    userconfig.config_path().parent.mkdir(parents=True)
    userconfig.config_path().write_text("state: s3://team-bucket/pulumi\n")
    assert userconfig.state_backend() == "s3://team-bucket/pulumi"
    monkeypatch.setenv("GPUCLUSTER_STATE", "gs://other")
    assert userconfig.state_backend() == "gs://other"  # the environment wins over the file
    monkeypatch.setenv("GPUCLUSTER_CONFIG", str(tmp_path / "mine.yaml"))
    assert userconfig.config_path() == tmp_path / "mine.yaml"


@pytest.mark.parametrize("text, expected", [
    ("clod: aws\n", "line 1: unknown key 'clod' (did you mean \"cloud\"?)"),
    ("aws:\n  regoin: x\n", "line 2: unknown key 'aws.regoin' (did you mean \"region\"?)"),
    ("aws:\n  project: p\n", "line 2: aws.project: aws does not take --project"),
    ("cloud: azure\n", "line 1: cloud: 'azure' is not a cloud"),
    ("cloud: aws\ncloud: gcp\n", "line 2: cloud is given twice"),
    ("aws: us-east-1\n", "line 1: aws: a mapping of settings"),
    ("cloud: [aws]\n", "line 1: cloud: a string is needed here"),
    ("cloud: : :\n", "line 1: not valid YAML"),
])
def test_config_file_errors_name_the_key_and_line(text, expected, tmp_path, monkeypatch, capsys):
    config = tmp_path / "config.yaml"
    config.write_text(text)
    monkeypatch.setenv("GPUCLUSTER_CONFIG", str(config))
    assert main(["run", "--cloud", "local"]) == 2
    err = capsys.readouterr().err
    assert expected in err and str(config) in err and len(err.strip().splitlines()) == 1, err


def test_a_config_file_named_by_the_environment_must_exist(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPUCLUSTER_CONFIG", str(tmp_path / "nope.yaml"))
    assert main(["run"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_bad_cloud_in_the_environment_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPUCLUSTER_CLOUD", "azure")
    assert main(["run"]) == 2
    assert "GPUCLUSTER_CLOUD 'azure' is not allowed" in capsys.readouterr().err


# -- every error names the key and the line --------------------------------------------------
ERRORS = [
    # shape
    ("clod: local\n", 1, "unknown key 'clod' at the top"),
    ("resources:\n  nodez: 2\n", 2, "unknown key 'resources.nodez' in resources (did you mean \"nodes\"?)"),
    ("resources: local\n", 1, "resources: a mapping of cloud, region"),
    ("- run\n", 1, "the file must be a mapping of keys"),
    ("name: a\nname: b\n", 2, "name is given twice (first on line 1)"),
    ("base: &b {nodes: 2}\n", 1, "unknown key 'base'"),
    ("resources:\n  <<: {nodes: 2}\n", 2, "YAML merge keys"),
    ("run: python x.py\n  bad: indent\n", 2, "not valid YAML"),
    # kinds
    ("resources:\n  nodes: two\n", 2, "resources.nodes: an integer, not 'two'"),
    ("resources:\n  nodes: 2.5\n", 2, "resources.nodes: an integer, not 2.5"),
    ("resources:\n  spot: maybe\n", 2, "resources.spot: true or false, not 'maybe'"),
    ("name: yes\n", 1, "name: a string, not true (quote it if it is text)"),
    ("name: [a, b]\n", 1, "name: a string, not a list"),
    ("name: ''\n", 1, "name: a string that is not empty"),
    ("setup: {a: b}\n", 1, "setup: a list of strings (or one string), not a mapping"),
    ("data: [shards, [x]]\n", 1, "data: a list of strings (or one string); an item is a list"),
    ("env: [A=1]\n", 1, "env: a mapping of KEY: value, not a list"),
    ("env:\n  A: [1]\n", 2, "env.A: one value"),
    ("limits:\n  max_minutes: soon\n", 2, "limits.max_minutes: a number, not 'soon'"),
    ("run: \"python 'x.py\"\n", 1, "run: a command that splits into arguments"),
    ("run: []\n", 1, "run: a command, e.g. python train.py"),
    # values, checked as the flags check them
    ("resources:\n  nodes: 0\n", 2, "resources.nodes: nodes 0 is not allowed: an integer"),
    ("resources:\n  nodes: 17\n", 2, "resources.nodes: nodes 17 is not allowed: an integer from 1 to 16"),
    ("resources:\n  gpus_per_node: 99\n", 2, "resources.gpus_per_node: gpus per node 99 is not allowed"),
    ("resources:\n  cloud: azure\n", 2, "resources.cloud: cloud 'azure' is not allowed"),
    ("resources:\n  region: us-east-1\n", 2, "resources.region: not used with cloud local (only with aws or gcp)"),
    ("limits:\n  max_minutes: -1\n", 2, "limits.max_minutes: max minutes -1 is not allowed"),
    ("limits:\n  max_restarts: 99\n", 2, "limits.max_restarts: max restarts 99 is not allowed"),
    ("workload: resnet\n", 1, "workload: workload 'resnet' is not allowed"),
    ("data: [missing]\n", 1, "data: --data 'missing': the folder 'missing' does not exist"),
    ("setup: ['  ']\n", 1, "setup: a list of strings (or one string); an item is '  '"),
    ("outputs:\n  limit: lots\n", 2, "outputs.limit: --collect-limit 'lots' is not allowed"),
    ("env:\n  '1X': a\n", 2, "env: --env '1X' is not allowed: a variable name"),
    ("env:\n  GPUCLUSTER_RUN_ID: x\n", 2, "env: --env 'GPUCLUSTER_RUN_ID' is not allowed: gpucluster or torchrun"),
    ("env_file: nope.env\n", 1, "env_file: --env-file 'nope.env' does not exist"),
    ("secrets: [GC_NOT_SET_ANYWHERE]\n", 1, "secrets: --secret 'GC_NOT_SET_ANYWHERE': GC_NOT_SET_ANYWHERE is not set"),
    ("secrets: ['GC_TOKEN=abc']\n", 1, "secrets: --secret GC_TOKEN=... is not allowed: give only the NAME"),
    ("run: python missing.py\n", 1, "run: script 'missing.py' is not allowed"),
    ("workdir: nowhere\n", 1, "workdir: the folder 'nowhere'"),
    ("resources:\n  cloud: aws\n  tags: {managed-by: me}\n", 3, "resources.tags: --tag key 'managed-by' is reserved"),
    ("run: python train.py\nworkload: digits\n", 2, "run and workload: give one"),
    # the health check and recovery, checked as --check, --recover, --fallback ... are
    ("check: maybe\n", 1, "check: true or false, not 'maybe'"),
    ("recover: three\n", 1, "recover: an integer, not 'three'"),
    ("recover: 21\n", 1, "recover: recover 21 is not allowed"),
    ("fallback: spot\n", 1, "fallback: --fallback 'spot' is not allowed; allowed: on-demand"),
    ("fallback_after: 0\n", 1, "fallback_after: fallback after 0 is not allowed"),
    ("checkpoint_every: 0\n", 1, "checkpoint_every: checkpoint every 0 is not allowed"),
    ("checkpoint_every: 2.5\n", 1, "checkpoint_every: an integer, not 2.5"),
    # ... and together with the rest of the run (the checks the prepare step makes)
    ("workload: digits\nfallback: on-demand\nrecover: 2\n", 2, "fallback: --fallback on-demand is for --spot runs"),
    ("run: python train.py\ncheckpoint_every: 100\n", 2,
     "checkpoint_every: --checkpoint-every is for built-in workloads"),
]


@pytest.mark.parametrize("text, line, expected", ERRORS, ids=[e[2][:40] for e in ERRORS])
def test_every_error_names_the_key_and_line_and_creates_nothing(text, line, expected, project, home, capsys):
    task = write(project, text)
    assert main(["run", str(task), "--yes"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpucluster: error: task file {str(task)!r}, line {line}: "), err
    assert expected in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (home / "ledger.sqlite3").exists()  # nothing recorded


@pytest.mark.parametrize("case", ["missing", "empty", "huge", "laughs", "deep", "binary", "folder", "twice"])
def test_file_level_errors(case, project, capsys):
    task = project / "task.yaml"
    argv = ["run", str(task)]
    expected = {"missing": "does not exist", "empty": "is empty", "huge": "bytes are read",
                "laughs": "expands to more than", "deep": "nested too deeply", "binary": "is not UTF-8",
                "folder": "is a folder", "twice": "give the task file once"}[case]
    if case == "empty":
        task.write_text("# nothing\n")
    elif case == "huge":
        task.write_text("name: x\n" + "#" * (taskfile.MAX_TASK_BYTES + 1))
    elif case == "laughs":
        rows = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
        rows += [f"a{i}: &a{i} [*a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}]" for i in range(1, 8)]
        task.write_text("\n".join(rows) + "\n")
    elif case == "deep":
        task.write_text("env: " + "[" * 40 + "]" * 40 + "\n")
    elif case == "binary":
        task.write_bytes(b"name: \xff\xfe\n")
    elif case == "folder":
        task.mkdir()
    elif case == "twice":
        task.write_text("name: x\n")
        argv = ["run", "-f", str(task), str(task)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("text, line, tag", [
    ("name: !custom demo\n", 1, "!custom"),
    ("resources:\n  nodes: !!python/name:os.system 1\n", 2, "!!python/name:os.system"),
    ("env:\n  - !!python/object/apply:os.system [id]\n", 2, "!!python/object/apply:os.system"),
    ("name: !!binary aGVsbG8=\n", 1, "!!binary"),
])
def test_a_yaml_tag_is_refused_in_one_line_naming_file_line_and_tag(text, line, tag, project, home, capsys):
    """Issue 45 item 9: before, PyYAML's ConstructorError came out as a 30-line traceback."""
    task = write(project, text)
    assert main(["run", str(task), "--yes"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"gpucluster: error: task file {str(task)!r}, line {line}: the YAML tag {tag!r} is not "
                           "allowed (plain values only: strings, numbers, booleans, lists and mappings)")
    assert not (home / "ledger.sqlite3").exists()


@pytest.mark.parametrize("run, op", [("python train.py | tee log", "|"), ("python train.py > out.txt", ">"),
                                     ("python prep.py && python train.py", "&&"), ("python train.py; echo done", ";"),
                                     ("python train.py 2>err.txt", "2>")])
def test_a_shell_line_in_run_is_refused_naming_the_operator(run, op, project, home, capsys):
    """Issue 45 item 10: `run: python train.py | tee log` gave the script `|`, `tee` and `log` as
    arguments (no shell runs the command; docs/tasks.md says so)."""
    task = write(project, f"run: {run}\n")
    assert main(["run", str(task), "--yes"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"gpucluster: error: task file {str(task)!r}, line 1: ") and f"{op!r} is a shell operator" in err
    assert not (home / "ledger.sqlite3").exists()


def test_quoted_operators_and_a_list_are_arguments(project):
    for text in ("run: python -c \"print(1 | 2)\"\n", "run: [bash, -c, 'python train.py | tee log']\n",
                 "run: python train.py --sep '|'\n"):
        task = write(project, text)
        assert taskfile.load(task).values["command"][0] in ("python", "bash")


def test_plain_yaml_with_aliases_merge_keys_and_dates_is_still_read(project):
    task = write(project, "name: &n demo\nenv:\n  A: *n\n  B: 2026-11-28\n")
    assert taskfile.load(task).values["name"] == "demo"


def test_a_yaml_tag_in_the_config_file_is_refused(home, tmp_path, monkeypatch, capsys):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("cloud: local\nnodes: !foo 2\n")
    monkeypatch.setenv("GPUCLUSTER_CONFIG", str(cfg))
    assert main(["cost", "estimate", "--nodes", "1"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"gpucluster: error: config file {str(cfg)!r}, line 2: the YAML tag '!foo' is not allowed (plain values "
        "only: strings, numbers, booleans, lists and mappings)")


def test_a_yaml_value_after_dashes_is_the_commands_not_a_task_file(captured, project):
    (project / "conf.yaml").write_text("lr: 1\n")
    req = request(captured, "run", "--cloud", "local", "--", "python", str(project / "train.py"),
                  str(project / "conf.yaml"))
    assert req.command[-1].endswith("conf.yaml")


def test_a_deeper_error_about_a_file_value_names_its_line(project, home, capsys, monkeypatch):
    """A check that only the prepare step makes (here: --collect) still names the file's key and line."""
    task = write(project, "resources: {cloud: local}\nrun: python train.py\noutputs:\n  collect: ['/abs']\n")
    monkeypatch.chdir(project)
    assert main(["run", str(task), "--yes"]) == 2
    err = capsys.readouterr().err
    assert f"task file {str(task)!r}, line 4: outputs.collect: --collect '/abs' is not allowed" in err, err


def test_help_is_grouped_under_headings_and_imports_no_yaml():
    import subprocess

    code = ("import sys; from gpucluster.cli.main import main; main(['run', '--help']); "
            "print('YAML', 'yaml' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, COLUMNS="80")).stdout
    for heading in ("Task file:", "Cluster:", "Job:", "Environment:", "Reaching the nodes:", "Limits:",
                    "Outputs:", "Behaviour:"):
        assert f"\n{heading}\n" in out, heading
    assert out.index("Cluster:") < out.index("Job:") < out.index("Limits:")
    assert "YAML False" in out


def test_docs_list_every_key_and_the_config_settings():
    from gpucluster.plan.userconfig import CLOUD_KEYS, ENV_VARS

    doc = (Path(__file__).resolve().parent.parent / "docs" / "tasks.md").read_text()
    for key, spec in taskfile.KEYS.items():
        assert f"| `{key}` |" in doc, key
    for name in CLOUD_KEYS:
        assert f"`{name}`" in doc, name
    for var in ENV_VARS:
        assert var in doc, var
