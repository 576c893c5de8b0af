"""Kept clusters end to end, each command its own process, as a user types them: `up` (the FAKE
Pulumi CLI whose stack outputs point at two real OpenSSH servers on 127.0.0.6 and 127.0.0.7, port
22, like EC2 nodes), `exec` twice (the real ssh launcher; the second finds the data in the nodes'
cache), `ssh` (a command on node 1, a tunnel, --ssh-config used by the real ssh client), `down`.

The nodes behave as EC2 nodes do for this: reached on port 22 with the host key the stack pinned
(cloud-init writes the pinned key: infra/aws/user_data.py) and the login key the stack made; each
node has a home folder of its own (the run folders and the data cache live there).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import sshd  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.sshd]
ADDRESSES = ["127.0.0.6", "127.0.0.7"]
HERE = Path(__file__).parent


def _port_22_free() -> bool:
    for a in ADDRESSES:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((a, 22))
            except OSError:
                return False
    return True


class Cloud:
    """The two "instances", the fake Pulumi state, and the CLI run as a user would."""

    def __init__(self, root: Path, home: Path):
        self.root, self.home = root, home
        self.homes = [root / f"nodehome{i}" for i in range(2)]
        for h in self.homes:
            h.mkdir(parents=True)
        self.hosts = sshd.SshdHosts.start(root / "sshd", 2, addresses=ADDRESSES, port=22,
                                          env=[{"HOME": str(h), "NODE_NAME": f"node{i}"} for i, h in enumerate(self.homes)])
        self.state = root / "pulumi-state.json"
        self.outputs_file = root / "outputs.json"
        self.write_outputs()

    def write_outputs(self, host_keys: list[str] | None = None) -> None:
        self.outputs_file.write_text(json.dumps({
            "cluster_name": "kept", "instance_ids": ["i-0000000000000000c", "i-0000000000000000d"],
            "private_ips": ADDRESSES, "public_ips": ADDRESSES, "host_public_keys": host_keys or self.hosts.host_keys,
            "ssh_user": self.hosts.user, "ssh_private_key": self.hosts.identity.read_text(), "region": "us-east-1",
            "availability_zone": "us-east-1a", "instance_type": "g5.xlarge", "gpus_per_node": 0}))

    def env(self, **extra: str) -> dict[str, str]:
        return dict(os.environ, GPUCLUSTER_HOME=str(self.home), FAKE_PULUMI_STATE=str(self.state),
                    FAKE_PULUMI_OUTPUTS=str(self.outputs_file), COLUMNS="200", **extra)

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, str(HERE / "kept_cli.py"), *args]

    def cli(self, *args: str, cwd: Path | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(*args), capture_output=True, text=True, env=self.env(), cwd=cwd,
                              timeout=timeout)

    def stop(self) -> None:
        self.hosts.stop()


@pytest.fixture
def cloud(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("pulumi.automation")
    reason = sshd.missing_reason()
    if reason:
        pytest.skip(reason)
    with open(os.path.join(tempfile.gettempdir(), "gpucluster-tests-port22-127.0.0.6.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # port 22 is one per address; tests that use it take turns
        if os.geteuid() != 0 or not _port_22_free():
            pytest.skip("needs root and a free port 22 on 127.0.0.6/7 to look like EC2 nodes")
        c = Cloud(tmp_path / "cloud", tmp_path / "home")
        yield c
        c.stop()


def _up(cloud: Cloud) -> None:
    r = cloud.cli("up", "--cloud", "aws", "--name", "kept", "--nodes", "2", "--instance-type", "g5.xlarge",
                  "--region", "us-east-1", "--ssh-cidr", "203.0.113.7/32", "--yes")
    assert r.returncode == 0, r.stdout + r.stderr


def _project(tmp_path: Path) -> Path:
    """A script folder, and beside it (not shipped with it) a data folder of 5 files."""
    job = tmp_path / "project"
    job.mkdir(parents=True)
    (job / "train.py").write_text(
        "import os, pathlib, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "data = pathlib.Path(os.environ['GPUCLUSTER_DATA'])\n"
        "n = sum(1 for _ in data.iterdir())\n"
        "out = pathlib.Path(os.environ['GPUCLUSTER_OUTPUT_DIR'])\n"
        "node = os.environ['GPUCLUSTER_NODE_RANK']\n"
        "(out / f'seen-{node}.txt').write_text(f'{n} files on {os.environ[\"NODE_NAME\"]}\\n')\n"
        "print('node', node, 'saw', n, 'files', flush=True)\n"
        # every rank waits for the others before it leaves: a rank that exits as soon as its own side
        # of gloo's mesh is up closes the pairs a slower rank is still connecting, and that rank fails
        # with "connectFullMesh failed ... Connection closed by peer" (seen here under load)
        "dist.barrier()\n"
        "dist.destroy_process_group()\n")
    data = tmp_path / "dataset"
    data.mkdir()
    for i in range(5):
        (data / f"part-{i}.bin").write_bytes(os.urandom(20000))
    return job


def test_exec_runs_jobs_on_a_kept_cluster_and_keeps_it(cloud, tmp_path):
    from gpucluster.ledger.store import Ledger

    _up(cloud)
    job = _project(tmp_path)
    runs = []
    for attempt in range(2):
        r = cloud.cli("exec", "kept", "--remote-python", sys.executable, "--data", str(tmp_path / "dataset"), "--",
                      "python", "train.py", cwd=job)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert "exec on kept cluster kept (2 node(s) on aws" in r.stdout
        assert "the nodes bill to cluster kept" in r.stdout
        runs.append(r.stdout)
    ledger = Ledger(cloud.home / "ledger.sqlite3")
    listed = ledger.list_runs(limit=None)
    up_run, first, second = sorted(listed, key=lambda x: x.created_at)
    assert [x.cluster for x in (up_run, first, second)] == ["kept"] * 3
    for run in (first, second):
        rec = ledger.get_run(run.id)
        assert rec.run.status == "succeeded" and rec.run.teardown == "kept", rec.run.failure
        assert rec.run.command == ["python", "train.py"]
        # its own rows: where its processes lived and how the nodes were reached, all closed
        assert {r.kind for r in rec.resources} == {"process", "ssh-run"}
        assert all(r.confirmed_gone for r in rec.resources)
        outs = Path(rec.run.log_dir) / "outputs"
        assert (outs / "node-0" / "seen-0.txt").read_text() == "5 files on node0\n"
        assert (outs / "node-1" / "seen-1.txt").read_text() == "5 files on node1\n"
    # the second job found every data file in the nodes' cache: nothing sent again
    stage1 = [m for m in ledger.metrics(first.id, "stage")]
    stage2 = [m for m in ledger.metrics(second.id, "stage")]
    assert len(stage1) == len(stage2) == 2
    assert all(m["sent_files"] == 5 for m in stage1) and all(m["sent_files"] == 0 for m in stage2), (stage1, stage2)
    assert "10 of 10 file(s) were in the nodes' cache" in runs[1]  # 5 files on each of 2 nodes
    # the cluster is still up: only the `up` run's rows are open, and it says "kept"
    open_rows = ledger.open_resources("kept")
    assert open_rows and {r["run_id"] for r in open_rows} == {up_run.id}
    status = json.loads(cloud.cli("status", "--json").stdout)
    assert [s["cluster"] for s in status] == ["kept"] and status[0]["state"] == "kept"
    # nothing of the jobs is left on the nodes (all this machine) or here
    for run in (first, second):
        assert sshd.run_processes(run.id) == {}
    assert sshd.leaked_ssh_masters() == []
    for h in cloud.homes:
        assert list((h / ".gpucluster" / "runs").iterdir()) == []
        assert (h / ".cache" / "gpucluster" / "data").is_dir()  # the cache stays with the nodes
    down = cloud.cli("down", "kept", "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    assert ledger.open_resources("kept") == []
    again = cloud.cli("exec", "kept", "--", "python", "train.py", cwd=job)
    assert again.returncode == 2 and "cluster 'kept' is not up" in again.stderr and "Traceback" not in again.stderr


def test_exec_refuses_what_cannot_run_before_recording_anything(cloud, tmp_path):
    from gpucluster.ledger.store import Ledger

    _up(cloud)
    job = _project(tmp_path)
    ledger = Ledger(cloud.home / "ledger.sqlite3")
    before = [r.id for r in ledger.list_runs(limit=None)]
    cases = [
        (("exec", "kep", "--", "python", "train.py"), 'not in the ledger (did you mean "kept"?)'),
        (("exec", "kept", "--max-minutes", "100000", "--", "python", "train.py"), "power themselves off in"),
        (("exec", "kept", "--", "python", "missing.py"), "missing.py"),
        (("exec", "kept", "--data", "s3://bucket/x", "--", "python", "train.py"), "s3://bucket/x"),
    ]
    for args, needle in cases:
        r = cloud.cli(*args, cwd=job)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert needle in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    assert [r.id for r in ledger.list_runs(limit=None)] == before


def test_ssh_command_tunnel_and_config(cloud, tmp_path):
    _up(cloud)
    r = cloud.cli("ssh", "kept", "1", "--", "sh", "-c", "echo on $NODE_NAME")
    assert r.returncode == 0 and r.stdout.strip() == "on node1", r.stdout + r.stderr
    r = cloud.cli("ssh", "kept", "--", "sh", "-c", "exit 7")
    assert r.returncode == 7  # the remote command's exit code
    bad = cloud.cli("ssh", "kept", "2")
    assert bad.returncode == 2 and "node 2 is not allowed" in bad.stderr

    # a tunnel: this machine's port to a server the node sees on its own localhost
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    remote_port = server.getsockname()[1]
    threading.Thread(target=lambda: _echo_once(server), daemon=True).start()
    local_port = sshd.free_port()
    # this command's own TMPDIR (short: ssh's control socket goes there, and a socket path has a
    # 108-byte limit): other tests' folders are not its own
    own_tmp = Path(tempfile.mkdtemp(prefix="gk", dir="/tmp"))
    tunnel = subprocess.Popen(cloud.argv("ssh", "kept", "-L", f"{local_port}:localhost:{remote_port}"),
                              env={**cloud.env(), "TMPDIR": str(own_tmp)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        got = _talk(local_port, b"ping\n")
        assert got == b"pong ping\n"
    finally:
        os.killpg(tunnel.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the foreground group
        out, err = tunnel.communicate(timeout=30)
    assert tunnel.returncode == 0, err
    assert f"forwarding 127.0.0.1:{local_port} -> localhost:{remote_port} on node 0 of kept" in err
    assert "Traceback" not in err
    assert list(own_tmp.glob("gcssh-*")) == []  # its folder (the key copy) is gone
    own_tmp.rmdir()
    assert sshd.leaked_ssh_masters() == []

    # --ssh-config: host aliases the real ssh client uses, trusting only the pinned keys
    r = cloud.cli("ssh", "kept", "--ssh-config")
    assert r.returncode == 0, r.stderr
    include = [ln.strip() for ln in r.stdout.splitlines() if ln.strip().startswith("Include ")]
    assert len(include) == 1
    config = Path(include[0].split(" ", 1)[1])
    assert config.is_file() and (config.parent / "id_cluster").stat().st_mode & 0o777 == 0o600
    for alias, name in (("kept-1", "node1"), ("kept", "node0")):
        cp = subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", alias, "echo $NODE_NAME"],
                            capture_output=True, text=True, timeout=30)
        assert cp.returncode == 0 and cp.stdout.strip() == name, cp.stderr
    assert cloud.cli("down", "kept", "--yes").returncode == 0
    assert not config.parent.exists()  # down removed the aliases, the pinned keys and the key copy


def test_ssh_refuses_a_node_whose_host_key_is_not_the_pinned_one(cloud):
    _up(cloud)
    cloud.write_outputs(host_keys=[cloud.hosts.host_keys[1], cloud.hosts.host_keys[0]])  # swapped
    state = json.loads(cloud.state.read_text())
    state["outputs"]["kept"]["host_public_keys"] = [cloud.hosts.host_keys[1], cloud.hosts.host_keys[0]]
    cloud.state.write_text(json.dumps(state))
    r = cloud.cli("ssh", "kept", "--", "true")
    assert r.returncode == 255, r.stdout + r.stderr
    assert "Host key verification failed" in r.stderr or "REMOTE HOST IDENTIFICATION" in r.stderr


@pytest.mark.alone  # the real watcher counts every job and ssh session on this machine, other tests' too
def test_a_job_started_by_exec_resets_the_idle_stop(cloud, tmp_path):
    """The real watcher (as the unit runs it: --ssh-sessions) stands for the nodes' (both are this
    machine), its minute scaled to 10 s: a job run by `exec` holds the stop off, and the count starts
    again from the job's end. `status` says the time left."""
    minute = 10  # seconds (it was 20: this test alone took 49 s of `make test`'s serial step)
    _up_idle = cloud.cli("up", "--cloud", "aws", "--name", "kept", "--nodes", "2", "--instance-type", "g5.xlarge",
                         "--region", "us-east-1", "--ssh-cidr", "203.0.113.7/32", "--idle-minutes", "1", "--yes")
    assert _up_idle.returncode == 0, _up_idle.stderr
    rows = json.loads(cloud.cli("status", "--json").stdout)
    assert rows[0]["idle_minutes"] == 1 and 0 < rows[0]["idle_stop_in_s"] <= 60
    assert "idle stop in 1 min" in rows[0]["state"]
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "shutdown").write_text(f'#!/bin/sh\necho "$(date +%s.%N) $*" >> {tmp_path}/shutdown.log\n')
    (stubs / "shutdown").chmod(0o755)
    env = dict(os.environ, PATH=f"{stubs}:/usr/bin:/bin", GPUCLUSTER_STATE_DIR=str(tmp_path / "state"),
               GPUCLUSTER_IDLE_SCALE=str(minute))
    watcher = subprocess.Popen(["/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable,
                                str(HERE.parent / "infra" / "aws" / "node_idle.py"), "--minutes", "1", "--poll", "0.2",
                                "--ssh-sessions"], env=env, stdout=subprocess.DEVNULL)
    t0 = time.time()
    try:
        job = tmp_path / "job"
        job.mkdir()
        (job / "sleepy.py").write_text(f"import time\nprint('working', flush=True)\ntime.sleep({minute + 2})\n")
        r = cloud.cli("exec", "kept", "--remote-python", sys.executable, "--", "python", "sleepy.py", cwd=job)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        log = tmp_path / "shutdown.log"
        assert not log.exists(), "powered off while the job ran"
        from gpucluster.ledger.store import Ledger

        run = Ledger(cloud.home / "ledger.sqlite3").list_runs(limit=1)[0]
        train = next(p for p in Ledger(cloud.home / "ledger.sqlite3").get_run(run.id).phases if p.name == "train")
        assert train.ended_at - t0 > minute  # the job outlived the idle time counted from the watcher's start
        watcher.wait(timeout=90)
        fired = float(log.read_text().split()[0])
        assert fired >= train.ended_at + minute - 1.5, (fired - train.ended_at)  # counted again from the job's end
        assert fired <= run.ended_at + minute + 15
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()


def _echo_once(server: socket.socket) -> None:
    conn, _ = server.accept()
    with conn:
        data = conn.recv(100)
        conn.sendall(b"pong " + data)


def _talk(port: int, data: bytes) -> bytes:
    end = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(data)
                got = s.recv(100)
                if got:
                    return got
        except OSError:
            pass
        if time.monotonic() > end:
            raise AssertionError("the tunnel never answered")
        time.sleep(0.3)



def test_exec_takes_a_task_file_with_env_and_a_secret_found_nowhere(cloud, tmp_path):
    """`exec CLUSTER task.yaml`: the file's job keys (run, setup, env, env_file, secrets, ssh) apply,
    a flag wins over the file, its cluster keys are the kept cluster's; every rank and every setup
    command gets the environment, and the secret's value is in no process's command line and no
    file here or in the nodes' run folders, during the job or after it (tests/test_secrets.py)."""
    from test_secrets import CHECK, Watcher, assert_every_rank_got_them, assert_nowhere, marker_value, node_logs

    from gpucluster.ledger.store import Ledger

    _up(cloud)
    job = tmp_path / "task"
    job.mkdir()
    (job / "check_env.py").write_text(CHECK)
    (job / "settings.env").write_text("FROM_FILE='file value'\n")
    (job / "task.yaml").write_text(
        "resources:\n  cloud: aws\n  nodes: 2\n"  # the cluster's already: not used by exec
        f"ssh:\n  remote_python: {sys.executable}\n"
        "setup: python check_env.py setup\n"
        "run: python check_env.py train\n"
        "env:\n  PLAIN_SETTING: from-the-file\n"  # the --env flag below wins
        "env_file: [settings.env]\n"
        "secrets: [GC_MARK]\n")
    marker = marker_value()
    elsewhere = tmp_path / "elsewhere"  # the file's paths are the task folder's, wherever the shell is
    elsewhere.mkdir()
    remote = [h / ".gpucluster" / "runs" for h in cloud.homes]
    with Watcher(marker, [cloud.home, *remote]) as watch:
        r = subprocess.run(cloud.argv("exec", "kept", str(job / "task.yaml"), "--env", "PLAIN_SETTING=visible"),
                           capture_output=True, text=True, env=cloud.env(GC_MARK=marker), cwd=elsewhere, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "exec on kept cluster kept (2 node(s) on aws" in r.stdout
    assert_every_rank_got_them(node_logs(cloud.home), marker, nodes=2)
    assert watch.torchruns > 0 and watch.hits == [], watch.hits
    ledger = Ledger(cloud.home / "ledger.sqlite3")
    run = max(ledger.list_runs(limit=None), key=lambda x: x.created_at)
    assert run.cluster == "kept" and run.command == ["python", "check_env.py", "train"] and run.teardown == "kept"
    shown = cloud.cli("show", run.id, "--json")
    assert_nowhere(marker, cloud.home, r.stdout, r.stderr, shown.stdout)
    # -f works too, and a task file's error names its line; nothing is recorded
    (job / "bad.yaml").write_text("run: python check_env.py train\nenv_fil: [settings.env]\n")
    before = [x.id for x in ledger.list_runs(limit=None)]
    bad = cloud.cli("exec", "kept", "-f", str(job / "bad.yaml"), cwd=elsewhere)
    assert bad.returncode == 2 and "line 2: unknown key 'env_fil'" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    assert [x.id for x in ledger.list_runs(limit=None)] == before
    assert cloud.cli("down", "kept", "--yes").returncode == 0
