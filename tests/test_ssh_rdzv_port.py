"""Issue 45 item 6: the rendezvous port taken between the launcher's check and torchrun's bind, on
real sshd hosts on loopback (tests/sshd.py; every host is this machine, so a socket bound here is
bound on node 0).

The race, as it happens: the launcher asks node 0 whether the port is free (node_port.py), then
starts torchrun there over ssh; torchrun binds the port once ssh, Python and torch have started,
seconds later. Here another process (this test) binds and listens on the port in that window: the
moment the launcher has started node 0's ssh client (`RunEvents.on_spawn`), which is before the
remote Python has even started. torch's store then fails with "code: -98, name: EADDRINUSE"
(torch/csrc/distributed/c10d/socket.cpp), as the campaign saw. Linux refuses a second bind of a
port a listening socket holds (bind(2): EADDRINUSE "The given address is already in use"; a
wildcard bind conflicts with a socket bound to one address of it, socket(7) SO_REUSEADDR).

Before the fix the run failed in `rendezvous` with the cause only in node 0's log; now it runs once
more on a free port and succeeds, and when that port is taken too the failure names EADDRINUSE and
both ports.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from sshd import (  # noqa: E402
    Recorder, cluster_of, free_port, hosts, make_launcher, remote_dir, run_processes,  # noqa: F401
    skip_unless_usable, user_job_dir,
)

skip_unless_usable()
pytestmark = [pytest.mark.sshd, pytest.mark.slow]

from gpucluster.watch.launch import JobSpec  # noqa: E402


class Grabber(Recorder):
    """Binds the run's rendezvous port as soon as node 0's process is started, `times` times: the
    first port, then the one the launcher moves to (its `rdzv_port` record)."""

    def __init__(self, port: int, times: int):
        super().__init__()
        self.port, self.times, self.held = port, times, []

    def on_spawn(self, node_rank, kind, ident):
        if node_rank == 0 and len(self.held) < self.times:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("0.0.0.0", self.port))
            s.listen()
            self.held.append(s)

    def on_metric(self, node_rank, record):
        super().on_metric(node_rank, record)
        if record.get("kind") == "rdzv_port":
            self.port = int(record["port"])

    def close(self):
        for s in self.held:
            s.close()


@pytest.mark.parametrize("times", [1, 2])
def test_a_rendezvous_port_taken_before_torchrun_binds_it_is_retried_once(hosts, remote_dir, tmp_path, monkeypatch,
                                                                          times):
    user_job_dir(tmp_path, monkeypatch)
    cluster = cluster_of(hosts, 2)
    run_id = f"rp{times}-{os.getpid()}"
    port = free_port()
    job = JobSpec(run_id, command=("python", "train.py", "--steps", "3"), rdzv_port=port, max_seconds=120)
    events = Grabber(port, times)
    try:
        result = make_launcher(hosts, remote_dir).launch(cluster, job, events, tmp_path / "logs")
    finally:
        events.close()
    moved = [r for _, r in events.metrics if r.get("kind") == "rdzv_port"]
    assert len(events.held) == times
    if times == 1:
        assert result.ok, result.failure
        assert len(moved) == 1 and moved[0]["busy_port"] == port and moved[0]["port"] != port, moved
        assert "EADDRINUSE" in moved[0]["holder"]
    else:
        assert not result.ok
        assert "EADDRINUSE" in result.failure and str(port) in result.failure, result.failure
        assert str(moved[0]["port"]) in result.failure, result.failure
    assert run_processes(run_id) == {}
    assert not (remote_dir / run_id).exists()
