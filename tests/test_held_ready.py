"""Issue 46 done-means 2: `exec` on a kept ssh cluster skips the hosts' readiness questions (python,
torch, home, GPUs: 1-2 s a job, more under load) when the same hosts answered them less than a
minute ago, and asks again otherwise. Measured with benchmarks/exec_vs_run.py: the ready phase
3.3 s -> 1.4 s, exec/run 1.05 -> 0.81 on two loopback sshd hosts."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpucluster.infra.ssh import held
from gpucluster.infra.ssh.session import NodeReadiness

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


@dataclass(frozen=True)
class _Node:
    rank: int
    host: str
    user: str | None = "u"
    port: int = 22


@dataclass(frozen=True)
class _Cluster:
    name: str
    nodes: tuple
    gpus_per_node: int = 0


LAB = _Cluster("lab", (_Node(0, "10.0.0.1"), _Node(1, "10.0.0.2")))
READY = [NodeReadiness(0, "u@10.0.0.1", ok=True, home="/home/u", python="/usr/bin/python3", torch="2.13.0"),
         NodeReadiness(1, "u@10.0.0.2", ok=True, home="/home/u", python="/usr/bin/python3", torch="2.13.0")]


def test_answers_kept_at_up_are_used_within_the_minute_only(home):
    held.remember_ready(LAB, "python3", READY)
    path = held.ready_file("lab")
    assert path.is_file() and oct(path.parent.stat().st_mode & 0o777) == "0o700"
    import json

    at = json.loads(path.read_text())["at"]
    got = held.recent_ready(LAB, "python3", now=at + 30)
    assert [(r.rank, r.home, r.torch, r.ok) for r in got] == [(0, "/home/u", "2.13.0", True), (1, "/home/u", "2.13.0", True)]
    assert held.recent_ready(LAB, "python3", now=at + held.READY_FRESH_S + 1) is None  # stale: ask again
    assert held.recent_ready(LAB, "python3", now=at - 5) is None  # a clock that went back: ask again


@pytest.mark.parametrize("other", [
    _Cluster("lab", (_Node(0, "10.0.0.1"), _Node(1, "10.0.0.3"))),  # another host
    _Cluster("lab", (_Node(0, "10.0.0.1"),)),  # fewer hosts
    _Cluster("lab", LAB.nodes, gpus_per_node=1),  # GPUs now expected
])
def test_answers_for_other_hosts_or_gpus_are_not_used(home, other):
    held.remember_ready(LAB, "python3", READY)
    assert held.recent_ready(other, "python3") is None


def test_another_python_or_a_damaged_file_asks_the_hosts(home):
    held.remember_ready(LAB, "python3", READY)
    assert held.recent_ready(LAB, "/opt/py/bin/python") is None
    held.ready_file("lab").write_text("{not json")
    assert held.recent_ready(LAB, "python3") is None


def test_a_plain_run_on_the_same_hosts_keeps_nothing(home):
    held.remember_ready(_Cluster("ssh-1234", LAB.nodes), "python3", READY, only_if_kept=True)
    assert not held.ready_file("ssh-1234").exists()
