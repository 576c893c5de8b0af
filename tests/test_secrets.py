"""--env, --env-file and --secret (gpucluster/plan/jobenv.py): every rank and every --setup command gets
them, and a secret's value is found nowhere else. The leak tests run a job with a marker secret
(local and real sshd, through the CLI as a user would) while a watcher reads, every 50 ms, every
process's command line (/proc/PID/cmdline) and every file under $GPUCLUSTER_HOME and the nodes' run
folders; afterwards the ledger, `show --json` and all the CLI printed are searched too. (The
job's own processes carry the value in their environment, /proc/PID/environ, which only the same
user and root can read: that is where a secret has to be for the job to use it.) gcp: the fake API
server (tests/k8s_fake.py) resolves the pods' secretKeyRef as the kubelet does.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

sys.path.insert(0, str(Path(__file__).parent))
from conftest import run_cli  # noqa: E402

from gpucluster.errors import LaunchError, UsageError  # noqa: E402
from gpucluster.plan.jobenv import job_env, parse_secrets, read_env_file  # noqa: E402

CHECK = """\
import hashlib, os, sys, time
v = os.environ.get("GC_MARK")
sha = hashlib.sha256(v.encode()).hexdigest() if v is not None else None
# one write() per line: ranks run under `python -u`, where print() writes the text and its newline
# apart, so two ranks' lines on one node's stream could interleave
sys.stdout.write(f"ENVCHECK {sys.argv[1]} sha={sha} plain={os.environ.get('PLAIN_SETTING')} "
                 f"filed={os.environ.get('FROM_FILE')}\\n")
sys.stdout.flush()
if sys.argv[1] == "train":
    time.sleep(1.5)  # the watcher reads the processes meanwhile
"""


class Watcher:
    """Reads every process's command line and every file under `roots` until stopped."""

    def __init__(self, marker: str, roots: list[Path]):
        self.marker = marker.encode()
        self.roots = roots
        self.hits: list[str] = []
        self.torchruns = 0  # command lines of the run's torchrun seen (the watch was not idle)
        self.files_read = 0
        self.scans = 0
        self.errors: list[str] = []
        self.read_under: set[Path] = set()  # roots where files were read (the nodes' folders existed)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "Watcher":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.thread.join()
        self.scan()  # once more, after the run
        assert self.errors == [] and self.scans > 5, f"the watch did not run through: {self.errors}"

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.scan()
            except Exception as exc:  # noqa: BLE001 - any failure of the watch fails the test (at exit)
                self.errors.append(repr(exc))
                return
            self.scans += 1
            time.sleep(0.05)

    def scan(self) -> None:
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                cmd = Path(f"/proc/{d}/cmdline").read_bytes()
            except OSError:
                continue
            if self.marker in cmd:
                self.hits.append(f"argv of pid {d}: {cmd[:200]!r}")
            if b"torch.distributed.run" in cmd:
                self.torchruns += 1
        for root in self.roots:
            for top, _dirs, files in os.walk(root):  # folders vanish as runs end: os.walk skips them
                for name in files:
                    path = Path(top) / name
                    try:
                        if path.is_symlink() or path.stat().st_size > 50_000_000:
                            continue
                        data = path.read_bytes()
                    except OSError:
                        continue
                    self.files_read += 1
                    self.read_under.add(root)
                    if self.marker in data:
                        self.hits.append(f"file {path}")


def marker_value() -> str:
    return "gcmark-" + secrets.token_hex(12)


def project(tmp_path: Path) -> Path:
    p = tmp_path / "project"
    p.mkdir()
    (p / "check_env.py").write_text(CHECK)
    (p / "settings.env").write_text("# from a file\nFROM_FILE='file value'\n")
    return p


def node_logs(home: Path) -> str:
    """Every node log of the home's runs: each line the nodes printed (the console may leave some
    out when lines come faster than it shows them; the logs keep them all)."""
    return "\n".join(p.read_text(errors="replace") for p in sorted((home / "runs").rglob("node-*.log")))


def assert_every_rank_got_them(out: str, marker: str, nodes: int, procs: int = 1) -> None:
    sha = hashlib.sha256(marker.encode()).hexdigest()
    lines = [ln for ln in out.splitlines() if "ENVCHECK" in ln]
    train = [ln for ln in lines if "ENVCHECK train" in ln]
    setup = [ln for ln in lines if "ENVCHECK setup" in ln]
    assert len(train) == nodes * procs and len(setup) == nodes, lines
    for ln in lines:
        assert f"sha={sha}" in ln and "plain=visible" in ln and "filed=file value" in ln, ln


def assert_nowhere(marker: str, home: Path, *texts: str) -> None:
    for text in texts:
        assert marker not in text
    for path in home.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert marker.encode() not in path.read_bytes(), path


# -- parsing ------------------------------------------------------------------------------------
def test_env_files_secrets_and_their_errors(tmp_path, monkeypatch):
    f = tmp_path / "a.env"
    f.write_text("# c\n\nexport A=1\nB = 'two words'\nC=\"x=y\"\nD=\n")
    assert read_env_file(str(f)) == {"A": "1", "B": "two words", "C": "x=y", "D": ""}
    f.write_text("A=1\nnot a setting\n")
    with pytest.raises(UsageError, match=r"line 2 is not KEY=VALUE \(a line of 13 characters without '='; not "
                                         r"shown here, it may hold a secret\)$"):
        read_env_file(str(f))
    f.write_text("RANK=3\n")
    with pytest.raises(UsageError, match="line 1: variable 'RANK' is not allowed: gpucluster or torchrun sets it"):
        read_env_file(str(f))
    monkeypatch.setenv("GC_MARK", "v")
    assert parse_secrets(["GC_MARK", "GC_MARK"]) == ("GC_MARK",)
    with pytest.raises(UsageError, match="--secret GC_MARK=... is not allowed: give only the NAME") as exc:
        parse_secrets(["GC_MARK=typed-value"])
    assert "typed-value" not in exc.value.message
    with pytest.raises(UsageError, match="both|also given a value"):
        job_env(["GC_MARK=1"], [], ["GC_MARK"])
    with pytest.raises(UsageError, match="at most 100000"):
        job_env([f"BIG={'x' * 100_001}"], [], [])
    env, names = job_env(["A=2"], [str(tmp_path / "b.env")] if (tmp_path / "b.env").write_text("A=1\nZ=9\n") else [],
                         ["GC_MARK"])
    assert env == (("A", "2"), ("Z", "9")) and names == ("GC_MARK",)


def test_a_secret_unset_before_launch_fails_naming_it_not_showing_it(monkeypatch):
    from gpucluster.plan.jobenv import secret_values
    from gpucluster.watch.launch import JobSpec

    monkeypatch.setenv("GC_MARK", "v")
    assert secret_values(JobSpec("r1", secrets=("GC_MARK",))) == {"GC_MARK": "v"}
    monkeypatch.delenv("GC_MARK")
    with pytest.raises(LaunchError, match="secret GC_MARK is no longer set"):
        secret_values(JobSpec("r1", secrets=("GC_MARK",)))


def test_the_plan_names_secrets_and_dry_run_shows_plain_values_only(home, tmp_path):
    marker = marker_value()
    p = project(tmp_path)
    r = run_cli("run", "--cloud", "aws", "--nodes", "2", "--dry-run", "--ssh-cidr", "203.0.113.7/32",
                "--env", "PLAIN_SETTING=visible", "--env-file", str(p / "settings.env"), "--secret", "GC_MARK",
                "--", "python", str(p / "check_env.py"), "train", env={"GC_MARK": marker})
    assert r.returncode == 0, r.stderr
    assert "env: FROM_FILE, PLAIN_SETTING" in r.stdout and "secrets: GC_MARK" in r.stdout
    assert marker not in r.stdout + r.stderr
    # the dry run's node commands show plain settings, and only a secret's name
    assert "PLAIN_SETTING=visible" in r.stdout and "'GC_MARK=<secret: " in r.stdout


# -- local: the real thing -------------------------------------------------------------------------
@pytest.mark.slow
def test_local_run_every_rank_gets_them_and_the_secret_is_nowhere(home, tmp_path):
    pytest.importorskip("torch")
    marker = marker_value()
    p = project(tmp_path)
    (p / "task.yaml").write_text("""\
resources: {cloud: local, nodes: 2}
procs_per_node: 2
setup: python check_env.py setup
run: python check_env.py train
env: {PLAIN_SETTING: visible}
env_file: settings.env
secrets: [GC_MARK]
""")
    with Watcher(marker, [home]) as watch:
        r = run_cli("run", str(p / "task.yaml"), "--yes", env={"GC_MARK": marker})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert_every_rank_got_them(node_logs(home), marker, nodes=2, procs=2)
    assert watch.torchruns > 0 and watch.files_read > 0, "the watcher saw nothing of the run"
    assert watch.hits == []
    run_id = next(ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("run r"))
    shown = run_cli("show", run_id, "--json")
    assert shown.returncode == 0
    assert "secrets: GC_MARK" in r.stdout  # the plan names it
    assert_nowhere(marker, home, r.stdout, r.stderr, shown.stdout)


# -- ssh: real sshd on loopback ----------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.sshd
def test_ssh_run_every_rank_gets_them_over_stdin_and_the_secret_is_nowhere(home, tmp_path, tmp_path_factory):
    from sshd import SshdHosts, skip_unless_usable

    skip_unless_usable()
    h = SshdHosts.start(tmp_path_factory.mktemp("sshd-secrets"), 2)
    try:
        marker = marker_value()
        p = project(tmp_path)
        remote_runs = Path.home() / ".gpucluster" / "runs"
        with Watcher(marker, [home, remote_runs]) as watch:
            r = run_cli("run", "--cloud", "ssh", "--hosts", ",".join(h.hosts), "--identity", str(h.identity),
                        "--known-hosts", str(h.known_hosts), "--remote-python", sys.executable,
                        "--env", "PLAIN_SETTING=visible", "--env-file", str(p / "settings.env"),
                        "--secret", "GC_MARK", "--setup", "python check_env.py setup",
                        "--", "python", str(p / "check_env.py"), "train", env={"GC_MARK": marker})
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        assert_every_rank_got_them(node_logs(home), marker, nodes=2)
        assert watch.torchruns > 0 and watch.read_under == {home, remote_runs}, "the watcher saw nothing of the run"
        assert watch.hits == []
        run_id = next(ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("run r"))
        shown = run_cli("show", run_id, "--json")
        assert_nowhere(marker, home, r.stdout, r.stderr, shown.stdout)
        assert not (remote_runs / run_id).exists()
    finally:
        h.stop()


def test_the_reaper_reads_the_environment_line_and_gives_its_command_no_stdin(tmp_path):
    import subprocess

    from gpucluster.node import reaper

    code = "import os,sys; print(os.environ['GC_A'], repr(sys.stdin.read()))"
    proc = subprocess.run([sys.executable, reaper.__file__, "--grace", "1", "--env-stdin", "--", sys.executable,
                           "-c", code], input=json.dumps({"GC_A": "it's \"x\"\nnext"}).encode() + b"\nmore input\n",
                          capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode() == "it's \"x\"\nnext ''\n"  # the value whole; stdin is /dev/null afterwards
    bad = subprocess.run([sys.executable, reaper.__file__, "--env-stdin", "--", "true"], input=b"[1]\n",
                         capture_output=True, timeout=30)
    assert bad.returncode == 2 and b"expected one JSON object" in bad.stderr


# -- gcp: the run's own Kubernetes Secret, on the fake API server ------------------------------------
def test_gcp_pods_get_secrets_from_the_runs_own_secret_deleted_with_it(tmp_path, monkeypatch):
    pytest.importorskip("kubernetes")
    import base64

    from k8s_fake import FakeKubeApi
    from kubernetes.client import ApiClient
    from test_k8s_launcher import launch, healthy

    marker = marker_value()
    monkeypatch.setenv("GC_MARK", marker)
    fake = FakeKubeApi({0: healthy(0), 1: healthy(1)})
    sent, pods = [], []
    real_create, real_job = fake._create, fake.create_namespaced_job
    fake._create = lambda kind, ns, body: (sent.append((kind, body)), real_create(kind, ns, body))[1]

    def job(namespace, body, **kw):
        out = real_job(namespace, body, **kw)
        pods.extend(fake.pods.values())
        return out

    fake.create_namespaced_job = job
    result, _, _ = launch(fake, tmp_path, env=(("PLAIN_SETTING", "visible"),), secrets=("GC_MARK",))
    assert result.ok, result.failure
    # the Secret first, then what uses it; deleted last
    assert [c[1] for c in fake.of("create")] == ["secret", "configmap", "service", "job"]
    assert [d[1] for d in fake.of("delete")] == ["job", "service", "configmap", "secret"]
    # every pod's container got the value through secretKeyRef (the kubelet's env), the plain one as a value
    assert len(pods) == 2 and [p.env["GC_MARK"] for p in pods] == [marker, marker]
    assert all(p.env["PLAIN_SETTING"] == "visible" for p in pods)
    # the value (plain or base64) is in no other object the run sent
    encoded = base64.b64encode(marker.encode()).decode()
    for kind, body in sent:
        text = json.dumps(ApiClient().sanitize_for_serialization(body))
        assert marker not in text
        assert (encoded in text) == (kind == "secret"), kind
    fake.settle()
    assert fake.objects == {}


def test_gcp_a_pod_whose_secret_is_gone_cannot_start_and_the_run_says_why(tmp_path, monkeypatch):
    """The kubelet reads the Secret when it starts the container: one deleted meanwhile keeps the pod
    in CreateContainerConfigError, which fails the run with the kubelet's message."""
    pytest.importorskip("kubernetes")
    from k8s_fake import FakeKubeApi
    from test_k8s_launcher import healthy, launch

    monkeypatch.setenv("GC_MARK", marker_value())
    fake = FakeKubeApi({0: healthy(0), 1: healthy(1)})
    real_job = fake.create_namespaced_job

    def job_then_secret_gone(namespace, body, **kw):
        out = real_job(namespace, body, **kw)
        fake.objects.pop(("secret", body.metadata.name))  # e.g. removed by hand meanwhile
        return out

    fake.create_namespaced_job = job_then_secret_gone
    result, _, _ = launch(fake, tmp_path, secrets=("GC_MARK",), max_seconds=30)
    assert not result.ok
    assert "CreateContainerConfigError" in result.failure and 'secret "' in result.failure
