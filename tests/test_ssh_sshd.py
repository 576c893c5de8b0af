"""The ssh launcher against real OpenSSH servers on loopback (tests/sshd.py starts them).

Every "host" is an sshd on 127.0.0.1 with its own port and host key; the remote side runs this
test's Python (which has torch). Because all hosts are this machine, /proc here shows every
remote process, which is how the tests check that nothing of a run is left.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from sshd import (  # noqa: E402
    Recorder, assert_nothing_left, cluster_of, free_port, hosts, leaked_ssh_masters, make_launcher,  # noqa: F401
    remote_dir, skip_unless_usable, user_job_dir,  # noqa: F401
)

skip_unless_usable()
pytestmark = [pytest.mark.sshd, pytest.mark.slow]

from gpucluster.errors import LaunchError  # noqa: E402
from gpucluster.domain import Cluster, Node, NullEvents  # noqa: E402
from gpucluster.infra.ssh.provider import SshProvider  # noqa: E402
from gpucluster.watch.launch import JobSpec  # noqa: E402
from gpucluster.spec import ClusterSpec  # noqa: E402
from gpucluster.infra.ssh.launch import SshLauncher  # noqa: E402

def test_script_run_across_hosts_ranks_env_and_shipped_folder(hosts, remote_dir, tmp_path, monkeypatch):
    """`gpucluster run --cloud ssh -- python train.py`: the script's folder goes to every node."""
    n = 2  # three hosts run in test_ssh_faults.py and test_ssh_digits.py
    user_job_dir(tmp_path, monkeypatch)
    cluster = cluster_of(hosts, n)
    run_id = f"rt-{n}-{os.getpid()}"
    note = "it's $HOME `id` \"quoted\" ;|&"
    # `python -u`: torchrun runs it as a plain command; "python" becomes the nodes' Python
    job = JobSpec(run_id, command=("python", "-u", "train.py", "--steps", "3"), rdzv_port=free_port(),
                  env=(("GPUCLUSTER_NOTE", note),), max_seconds=120)
    events = Recorder()
    result = make_launcher(hosts, remote_dir).launch(cluster, job, events, tmp_path / "logs")

    assert result.ok, (result.failure, events.lines[-20:])
    assert [nr.exit_code for nr in result.nodes] == [0] * n
    assert sorted(result.metrics.finals) == list(range(n))
    assert {f["all_reduce_sum"] for f in result.metrics.finals.values()} == {n * (n + 1) / 2}
    assert events.phases == ["ready", "rendezvous", "train"]
    envs = events.envs()
    assert sorted(int(e["RANK"]) for _, e in envs) == list(range(n))
    assert sorted(node_rank for node_rank, _ in envs) == list(range(n))
    for node_rank, env in envs:
        # The node rank is the host's place in the list (head first). torchrun's c10d rendezvous
        # orders the global ranks by (address, pid) instead, so RANK is any of 0..n-1.
        assert env["GPUCLUSTER_NODE_RANK"] == str(node_rank)
        assert env["GPUCLUSTER_RUN_ID"] == run_id
        assert env["GPUCLUSTER_NUM_NODES"] == str(n) and env["WORLD_SIZE"] == str(n)
        assert env["GPUCLUSTER_NODE_IPS"] == ",".join(["127.0.0.1"] * n)
        assert env["GPUCLUSTER_NOTE"] == note  # survives two shells untouched
        # the user's folder was shipped (without .git) into a folder of the node's own
        assert env["cwd"] == str(remote_dir / run_id / f"node-{node_rank}" / "code")
        assert env["GPUCLUSTER_OUTPUT_DIR"] == env["cwd"] + "/outputs"
        assert env["files"] == ["labels.txt", "outputs", "train.py"]  # outputs/: GPUCLUSTER_OUTPUT_DIR
    for i in range(n):
        assert (tmp_path / "logs" / f"node-{i}.log").read_text().count("ENV ") == 1
    assert_nothing_left(hosts, cluster, run_id, remote_dir)


def test_unknown_or_wrong_host_key_is_refused(hosts, remote_dir, tmp_path):
    cluster = cluster_of(hosts, 2)
    partial = hosts.write_known_hosts(tmp_path / "kh_partial", indexes=[0])
    launcher = make_launcher(hosts, remote_dir, known_hosts=str(partial))
    with pytest.raises(LaunchError) as exc:
        launcher.launch(
            cluster, JobSpec("rh-1", workload="digits"), Recorder(), tmp_path / "logs")
    msg = str(exc.value)
    assert f"node 1 ({hosts.hosts[1]})" in msg and "host key refused" in msg
    assert f"[127.0.0.1]:{hosts.ports[1]}" in msg and str(partial) in msg
    assert "node 0" not in msg  # node 0's key is known: only node 1 is named
    assert not remote_dir.exists()  # nothing was shipped anywhere
    # nothing was started, so the teardown check has nothing to ask (and no unreachable node
    # to report as unverified)
    provider = SshProvider(launcher=launcher)
    provider.up(ClusterSpec(cloud="ssh", nodes=2, name="loopback", hosts=tuple(hosts.hosts[:2])), NullEvents())
    assert provider.leftovers("loopback", "rh-1").verified

    swapped = hosts.write_known_hosts(tmp_path / "kh_swapped", keys=[hosts.host_keys[1], hosts.host_keys[0]])
    ready = make_launcher(hosts, remote_dir, known_hosts=str(swapped)).probe(cluster)
    assert [r.ok for r in ready] == [False, False]
    assert all("host key refused" in r.problems[0] for r in ready)
    assert leaked_ssh_masters() == []


def test_pinned_host_keys_and_cluster_key_as_cloud_nodes_use_them(hosts, remote_dir, tmp_path):
    """The EC2 path: no known_hosts file, the nodes carry their host keys, the cluster its key."""
    base = cluster_of(hosts, 2)
    key = hosts.identity.read_text()

    def cloud(keys):
        nodes = tuple(Node(n.rank, n.host, n.private_ip, n.user, n.port, host_keys=(k,)) for n, k in zip(base.nodes, keys))
        return Cluster("c", "aws", nodes, ssh_private_key=key)

    launcher = SshLauncher(remote_dir=str(remote_dir), python=sys.executable)
    ready = launcher.probe(cloud(hosts.host_keys[:2]))
    assert [r.ok for r in ready] == [True, True], [r.problems for r in ready]
    assert ready[0].torch and ready[0].home
    ready = launcher.probe(cloud([hosts.host_keys[0], hosts.host_keys[2]]))  # node 1 pinned to a wrong key
    assert [r.ok for r in ready] == [True, False] and "host key refused" in ready[1].problems[0]


def test_readiness_names_missing_gpus_and_torch(hosts, remote_dir, tmp_path):
    smi = hosts.bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA A10G, 37, 1024, 23028'\n")
    smi.chmod(0o755)
    try:
        ready = make_launcher(hosts, remote_dir).probe(cluster_of(hosts, 2, gpus_per_node=1))
        assert [r.ok for r in ready] == [True, True] and ready[1].gpu_names == ["NVIDIA A10G"]
        assert ready[0].gpu_state == [{"name": "NVIDIA A10G", "util": 37.0, "mem_used_mib": 1024.0,
                                       "mem_total_mib": 23028.0}]
        with pytest.raises(LaunchError, match=r"2 of 2 node\(s\) not ready: node 0 .*1 GPU\(s\) visible to nvidia-smi, expected 4"):
            make_launcher(hosts, remote_dir).launch(cluster_of(hosts, 2, gpus_per_node=4),
                                                    JobSpec("rg-1", workload="digits"), Recorder(), tmp_path / "l")
    finally:
        smi.unlink()
    bare = tmp_path / "bare"  # a Python without torch
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    ready = make_launcher(hosts, remote_dir, python=str(bare / "bin" / "python")).probe(cluster_of(hosts, 1))
    assert not ready[0].ok and f"torch is not importable by {bare}/bin/python" in ready[0].problems[0]
    ready = make_launcher(hosts, remote_dir, python="no-such-python").probe(cluster_of(hosts, 1))
    assert ready[0].problems == ["no-such-python not found on the remote PATH"]


def test_leftover_check_reports_an_unreachable_host_as_unverified(hosts, tmp_path):
    from gpucluster.infra.ssh.cleanup import remote_leftovers

    dead = free_port()  # nothing listens there
    cluster = cluster_of(hosts, 1)
    cluster = Cluster("c", "ssh", (cluster.head, Node(1, "127.0.0.1", "127.0.0.1", hosts.user, dead)))
    found = remote_leftovers(cluster, "rz-1", identity=str(hosts.identity), known_hosts=str(hosts.known_hosts))
    assert [(lo.kind, lo.id) for lo in found] == [("unverified", f"{hosts.user}@127.0.0.1:{dead}")]
    assert "Connection refused" in found[0].detail


def test_wait_for_ready_fails_at_once_on_a_marker_that_says_not_ok(hosts, tmp_path):
    """A ready marker with ok=false (e.g. 1 of 4 GPUs, no torch) ends the wait at once, naming
    the node and what its check found; nodes are reached with backoff until then."""
    import json
    import time

    from gpucluster.errors import LaunchError
    from gpucluster.infra.ssh.session import Session

    cluster = cluster_of(hosts, 1)
    state = tmp_path / "state"
    state.mkdir()
    marker = state / "ready"
    marker.write_text(json.dumps({"ok": False, "gpus": 1, "expected_gpus": 4, "torch": "",
                                  "error": "torch is not importable by /opt/pytorch/bin/python"}))
    launcher = make_launcher(hosts, tmp_path / "remote")
    start = time.monotonic()
    with Session(launcher, cluster) as session:
        with pytest.raises(LaunchError) as err:
            session.wait_ready(str(marker), 60, NullEvents())
    assert time.monotonic() - start < 30
    assert "node 0 (" in str(err.value) and "1 of 4 GPU(s), torch missing" in str(err.value)
    assert "torch is not importable" in str(err.value)
    # a marker that never appears: the deadline names the node and what was last seen
    with Session(launcher, cluster) as session:
        with pytest.raises(LaunchError, match=r"not ready after 3 s; last seen: sshd answers; .* not written yet"):
            session.wait_ready(str(tmp_path / "absent" / "ready"), 3, NullEvents())


def test_a_busy_rendezvous_port_on_the_head_is_checked_and_another_used(hosts, remote_dir, tmp_path, monkeypatch):
    """Issue 32 item 9: another process (here: this test, as a second run on the same hosts
    would be) listens on the rendezvous port on the head. Today's launcher starts torchrun there
    and the run fails with "node 0 exited with code 1". Now the port is checked first, the holder
    named, and a free port nearby used."""
    import socket

    user_job_dir(tmp_path, monkeypatch)
    cluster = cluster_of(hosts, 2)
    port = free_port()
    listener = socket.socket()
    listener.bind(("127.0.0.1", port))
    listener.listen()
    try:
        run_id = f"busy-{os.getpid()}"
        job = JobSpec(run_id, command=("python", "-u", "train.py", "--steps", "2"), rdzv_port=port, max_seconds=120)

        class Saying(Recorder):
            messages: list = []

            def message(self, text):
                self.messages.append(text)

        events = Saying()
        result = make_launcher(hosts, remote_dir).launch(cluster, job, events, tmp_path / "logs")
        assert result.ok, (result.failure, events.lines[-10:])
        said = [m for m in events.messages if f"rendezvous port {port}" in m]
        assert len(said) == 1 and f"pid {os.getpid()}" in said[0] and "using port" in said[0], events.messages
        recorded = [m for _, m in events.metrics if m.get("kind") == "rdzv_port"]
        assert len(recorded) == 1 and recorded[0]["busy_port"] == port and recorded[0]["port"] > port
        assert_nothing_left(hosts, cluster, run_id, remote_dir)
    finally:
        listener.close()


def test_the_port_check_names_the_holder_and_a_free_port():
    """The head-side program alone: a listener's port is busy, its holder named; a free port is free."""
    import json
    import socket

    from gpucluster.infra.ssh import launch

    program = Path(launch.__file__).with_name("node_port.py")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        got = json.loads(subprocess.run([sys.executable, str(program), str(port)], capture_output=True,
                                        text=True, check=True).stdout)
        assert got["free"] is False and got["holder"].startswith(f"pid {os.getpid()} (")
        assert isinstance(got["alternative"], int) and got["alternative"] > port
    finally:
        listener.close()
    got = json.loads(subprocess.run([sys.executable, str(program), str(port)], capture_output=True,
                                    text=True, check=True).stdout)
    assert got["free"] is True and got["holder"] is None


def test_a_killed_reaper_and_a_daemon_holding_the_session_cannot_hang_the_run(hosts, remote_dir, tmp_path,
                                                                             monkeypatch):
    """Issue 32 item 2 on ssh: the job starts a detached daemon that keeps the session's output
    open (`setsid -f env -i sleep`: re-parented, empty environment) and kills its node's reaper.
    Today the ssh session never ends (the daemon holds its stdout) and the run hangs. Now the
    node's shell reports the reaper's end, the session is cut after a bounded wait, and the node
    has no witness: both reasons are in the result, for the verdict."""
    import shutil
    import time

    from conftest import FIXTURES
    from gpucluster.watch.supervisor import DRAIN_S
    from test_reaper import daemons, new_marker

    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(FIXTURES / "reaper_killer.py", project / "killer.py")
    monkeypatch.chdir(project)
    marker = new_marker()
    cluster = cluster_of(hosts, 1)
    run_id = f"killer-{os.getpid()}"
    job = JobSpec(run_id, command=("python", "-u", "killer.py", marker), rdzv_port=free_port(), max_seconds=120)
    events = Recorder()
    t0 = time.monotonic()
    try:
        result = make_launcher(hosts, remote_dir).launch(cluster, job, events, tmp_path / "logs")
        took = time.monotonic() - t0
        assert took < 60 + DRAIN_S, took  # the job's own limit is 120 s
        assert not result.timed_out
        assert any("its reaper ended without finishing its final pass" in u for u in result.unwitnessed), \
            (result.unwitnessed, events.lines[-10:])
        # the session the daemon holds is cut (said), or the node is lost at once: its shell said 137
        # and its reaper never said reaper_done, so it was the reaper that was killed (issue 45 item 13:
        # it was said "its agent was killed"), and nothing waits for the session
        assert any("its session stayed open" in u for u in result.unwitnessed) or \
            " lost: its reaper (the node's supervisor) was killed by SIGKILL" in (result.failure or ""), \
            (result.unwitnessed, result.failure)
        assert "its agent was killed" not in (result.failure or ""), result.failure
        assert len(daemons(marker)) == 1  # the daemon did survive: "not verified" is the truth
    finally:
        for p in daemons(marker):
            p.kill()
    assert leaked_ssh_masters() == []


def test_forged_control_lines_from_the_job_change_nothing(hosts, remote_dir, tmp_path, monkeypatch):
    """Issue 32 on real sshd: a --setup command and then the job print every control record (plain,
    with a made-up key, and copies of the keyed lines in their node log, rewritten to every kind),
    the job trains 14 s and then kills its reaper after starting a daemon that holds the session.
    The forged setup_end must not release the rendezvous (the setup takes 5 s more); the forged
    node_exit must not cut the node (it would, 10 s after it, with exit 0); the forged reaper_done
    must not stand for the witness: the node has none, and its session is cut only once its shell
    (keyed) said the reaper ended."""
    import re
    import shutil
    import time

    from conftest import FIXTURES
    from gpucluster.domain import UNWITNESSED
    from gpucluster.watch.supervisor import DRAIN_S
    from test_reaper import daemons, new_marker

    class Timed(Recorder):
        def __init__(self):
            super().__init__()
            self.at: dict[str, float] = {}

        def on_phase(self, phase):
            super().on_phase(phase)
            self.at[str(phase)] = time.monotonic()

    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(FIXTURES / "forger.py", project / "forger.py")
    monkeypatch.chdir(project)
    marker = new_marker()
    log = tmp_path / "logs" / "node-0.log"  # every host is this machine: the job can read it
    cluster = cluster_of(hosts, 1)
    run_id = f"forge-{os.getpid()}"
    job = JobSpec(run_id, command=("python", "-u", "forger.py", "--seconds", "14", "--kill-reaper", marker,
                                   "--log", str(log)),
                  setup=(f"python forger.py --log {log} && sleep 5",), rdzv_port=free_port(), max_seconds=150)
    events = Timed()
    t0 = time.monotonic()
    try:
        result = make_launcher(hosts, remote_dir).launch(cluster, job, events, tmp_path / "logs")
        assert time.monotonic() - t0 < 90 + DRAIN_S and not result.timed_out
        assert events.at["rendezvous"] - events.at["setup"] >= 5, events.at  # released by the real setup_end
        text = log.read_text()
        assert text.count("still training") >= 13, text[-3000:]  # not cut 10 s after a forged node_exit
        assert "forger: killed the reaper" in text, text[-3000:]
        assert re.search(r"forged every control record \([1-9]\d* copies", text), text[-3000:]
        kinds = [r["kind"] for _, r in events.metrics]
        # the node programs' own records, once each; the shell's node_exit (keyed) after the reaper was killed
        assert [kinds.count(k) for k in ("setup_start", "setup_end", "reaper_start", "node_exit")] == [1] * 4, kinds
        assert "reaper_done" not in kinds and "rdzv_port" not in kinds and "resume_files" not in kinds, kinds
        assert kinds.count("stage") <= 1, kinds  # the launcher's own, at most
        assert result.metrics.refused > 50, result.metrics.summary()
        assert any(u.startswith(UNWITNESSED) and "its reaper ended without finishing" in u
                   for u in result.unwitnessed), result.unwitnessed
        assert len(daemons(marker)) == 1  # the daemon did survive: "not verified" is the truth
    finally:
        for p in daemons(marker):
            p.kill()
    assert leaked_ssh_masters() == []
