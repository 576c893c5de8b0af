"""Runs on real sshd hosts that end badly: a host's processes die, the connection to a host
drops, the user presses Ctrl-C. Every case must stop the run quickly and leave nothing behind on
any host (all hosts are this machine, so /proc here shows every remote process).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from sshd import (  # noqa: E402
    Recorder, assert_nothing_left, cluster_of, free_port, hosts, make_launcher,  # noqa: F401
    remote_dir, run_processes, skip_unless_usable, user_job_dir,  # noqa: F401
)

skip_unless_usable()
pytestmark = [pytest.mark.sshd, pytest.mark.slow]

from gpucluster.watch.launch import JobSpec  # noqa: E402


def long_run(hosts, remote_dir, tmp_path, monkeypatch, run_id, fault):
    """A 3-host run of a job that would go on for minutes; `fault(run_id)` is called once, on
    the first training step. Returns (cluster, result, seconds from the fault to the return)."""
    user_job_dir(tmp_path, monkeypatch)
    cluster = cluster_of(hosts, 3)
    fired: list[float] = []

    def on_line(node_rank, line):
        if not fired and '"kind":"step"' in line:
            fired.append(time.monotonic())
            fault(run_id)

    job = JobSpec(run_id, command=("python", "train.py", "--steps", "100000", "--sleep", "0.02"),
                  rdzv_port=free_port(), max_seconds=120)
    result = make_launcher(hosts, remote_dir).launch(cluster, job, Recorder(on_line), tmp_path / "logs")
    return cluster, result, time.monotonic() - fired[0]


def test_losing_one_hosts_processes_fails_fast_and_leaves_nothing(hosts, remote_dir, tmp_path, monkeypatch):
    def kill_node_1(run_id):
        victims = run_processes(run_id, node_rank=1)
        assert victims
        for pid in victims:
            os.kill(pid, signal.SIGKILL)

    run_id = f"rk-{os.getpid()}"
    cluster, result, took = long_run(hosts, remote_dir, tmp_path, monkeypatch, run_id, kill_node_1)
    assert not result.ok and not result.timed_out
    # the job's own failure, or (issue 30) its node lost: the session cut, the agent killed
    assert result.failed_node is not None and ("exited with code" in result.failure or " lost: " in result.failure)
    assert took < 20, f"the failure took {took:.1f} s to stop the run"
    assert result.metrics.finals == {}
    assert_nothing_left(hosts, cluster, run_id, remote_dir)


def test_dropped_connection_fails_fast_and_the_host_is_cleaned_over_a_new_one(hosts, remote_dir, tmp_path,
                                                                            monkeypatch):
    """The ssh connection to host 1 dies (its sshd connection processes are killed) while the
    job there keeps running: the run fails at once, and the stop reconnects to host 1 and kills
    the orphaned torchrun there too."""
    psutil = pytest.importorskip("psutil")
    orphans: list[dict] = []

    def cut_host_1(run_id):
        for child in psutil.Process(hosts.procs[1].pid).children(recursive=True):
            if child.name() == "sshd":
                child.kill()
        orphans.append(run_processes(run_id, node_rank=1))

    run_id = f"rc-{os.getpid()}"
    cluster, result, took = long_run(hosts, remote_dir, tmp_path, monkeypatch, run_id, cut_host_1)
    assert orphans[0], "host 1's job should have outlived its connection"
    assert not result.ok and ("exited with code" in result.failure or " lost: " in result.failure), result.failure
    assert took < 25, f"the failure took {took:.1f} s to stop the run"
    assert_nothing_left(hosts, cluster, run_id, remote_dir)


def test_ctrl_c_kills_every_remote_process_group(hosts, remote_dir, tmp_path, monkeypatch):
    running: list[dict] = []

    def interrupt(run_id):
        running.append(run_processes(run_id))
        # Ctrl-C as the terminal delivers it: SIGINT to this process, raised in the main thread
        # wherever the launcher is (log lines are handled off the main thread)
        os.kill(os.getpid(), signal.SIGINT)

    run_id = f"ri-{os.getpid()}"
    with pytest.raises(KeyboardInterrupt):
        long_run(hosts, remote_dir, tmp_path, monkeypatch, run_id, interrupt)
    # agents and workers of all three nodes were running (workers in sessions of their own)
    assert len(running[0]) >= 6
    assert [_alive(pid) for pid in running[0] if _alive(pid)] == []
    assert_nothing_left(hosts, cluster_of(hosts, 3), run_id, remote_dir)


def _alive(pid: int) -> str | None:
    """The process's state letter and command line, None when gone (or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0].decode()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    return None if stat == "Z" else f"{stat} {cmd}"


def test_a_hung_job_on_ssh_hosts_is_stopped_by_the_stall_guard_with_its_last_lines(hosts, remote_dir, tmp_path,
                                                                                 monkeypatch):
    """Issue 48 item 2 on real sshd hosts: a script that prints one line and then sleeps on every
    rank. --stall-minutes 0.05 (3 s): the run fails "stalled for 0.05 min" well before its time
    limit, the last line is in the node's tail, and nothing is left on any host."""
    job_dir = user_job_dir(tmp_path, monkeypatch)
    (job_dir / "hang.py").write_text("import time\nprint('about to hang', flush=True)\ntime.sleep(600)\n")
    cluster = cluster_of(hosts, 2)
    run_id = f"rs-{os.getpid()}"
    job = JobSpec(run_id, command=("python", "hang.py"), rdzv_port=free_port(), max_seconds=120, stall_s=3.0)
    t0 = time.monotonic()
    result = make_launcher(hosts, remote_dir).launch(cluster, job, Recorder(None), tmp_path / "logs")
    assert not result.ok and result.failure.startswith("stalled for 0.05 min"), result.failure
    assert result.stopped_by == "stall" and time.monotonic() - t0 < 60
    assert any("about to hang" in ln for n in result.nodes for ln in n.last_lines), [n.last_lines[-6:] for n in result.nodes]
    assert_nothing_left(hosts, cluster, run_id, remote_dir)
