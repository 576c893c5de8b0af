"""The local rendezvous port taken by another process between its check and node 0's bind (issue
46 item 6): the failure said only "The connection to the C10d store has failed" while the cause,
EADDRINUSE, was on a line of node 0's log. Now the run starts once more on a free port, saying so;
a second taken port fails naming EADDRINUSE and both ports. The holder here is a listening socket
(bind(2): EADDRINUSE, "The given address is already in use")."""

from __future__ import annotations

import socket
import sys

import pytest

from conftest import needs_torch
from gpucluster.domain import Cluster, Node
from gpucluster.infra.local import launch as local_launch
from gpucluster.watch.launch import JobSpec
from sshd import Recorder

pytestmark = [needs_torch, pytest.mark.slow]


def _held() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def _run(tmp_path, monkeypatch, ports):
    (tmp_path / "train.py").write_text("print('trained')\n")
    monkeypatch.chdir(tmp_path)
    given = iter(ports)
    monkeypatch.setattr(local_launch, "free_port", lambda: next(given))
    cluster = Cluster(name="c", cloud="local", nodes=tuple(Node(rank=i, host="127.0.0.1", private_ip="127.0.0.1")
                                                           for i in range(2)))
    events = Recorder()
    job = JobSpec("rport1", command=("python", "train.py"), max_seconds=60)
    return local_launch.LocalLauncher(python=sys.executable).launch(cluster, job, events, tmp_path / "logs"), events


def test_a_taken_port_is_named_and_the_run_starts_once_more(tmp_path, monkeypatch):
    busy = _held()
    try:
        port = busy.getsockname()[1]
        result, events = _run(tmp_path, monkeypatch, [port, local_launch.free_port()])
        assert result.ok, (result.failure, events.lines[-10:])
        moved = [m for _, m in events.metrics if m.get("kind") == "rdzv_port"]
        assert moved and moved[0]["busy_port"] == port and "EADDRINUSE" in moved[0]["holder"]
    finally:
        busy.close()


def test_a_port_taken_twice_fails_naming_eaddrinuse_and_both_ports(tmp_path, monkeypatch):
    first, second = _held(), _held()
    try:
        ports = [first.getsockname()[1], second.getsockname()[1]]
        result, _ = _run(tmp_path, monkeypatch, ports)
        assert not result.ok and "EADDRINUSE" in result.failure, result.failure
        assert f"port {ports[0]}, then port {ports[1]}" in result.failure, result.failure
    finally:
        first.close()
        second.close()
