"""Control records cannot be forged by the job's own output (issue 32, item 2 and item 4).

gpucluster acts on a few records its own node programs print on the node's stream (a reaper's start
and end, a node shell's exit, a setup's start and end). The job prints on the same stream. Each such
record carries a one-time key per node and kind (gpucluster/watch/control.py); a line without it is data.
These drive the real NodeSupervisor with a real child process writing into a real pipe, and the
real reaper and setup wrapper; the full runs (local and real sshd) are in test_reaper.py and
test_ssh_sshd.py."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from conftest import FIXTURES
from gpucluster.watch import control
from gpucluster.node import reaper
from gpucluster.watch import supervisor
from gpucluster.watch.control import Gate, NodeKeys
from gpucluster.domain import UNWITNESSED
from gpucluster.events import NullEvents
from gpucluster.watch.launch import JobSpec
from gpucluster.watch.staging import setup_wrapped
from gpucluster.watch.supervisor import NodeSupervisor

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

FORGER = str(FIXTURES / "forger.py")


class Events(NullEvents):
    def __init__(self):
        self.metrics: list[tuple[int, dict]] = []
        self.messages: list[str] = []
        self.phases: list[str] = []

    def on_metric(self, node_rank, record):
        self.metrics.append((node_rank, record))

    def message(self, text):
        self.messages.append(text)

    def on_phase(self, phase):
        self.phases.append(str(phase))


def test_the_gate_takes_a_record_only_with_its_nodes_key_and_once():
    keys = {0: NodeKeys.new(), 1: NodeKeys.new()}
    gate = Gate(keys)
    k0 = keys[0].keys
    assert gate.admit(0, {"kind": "node_exit", "rc": 0}) is not None  # no key
    assert gate.admit(0, {"kind": "node_exit", "rc": 0, "key": "0" * 32}) is not None  # a made-up key
    assert gate.admit(0, {"kind": "node_exit", "rc": 0, "key": keys[1].keys["node_exit"]}) is not None  # node 1's
    assert gate.admit(0, {"kind": "node_exit", "rc": 0, "key": k0["reaper_start"]}) is not None  # another kind's
    assert gate.admit(0, {"kind": "node_exit", "rc": 0, "key": 5}) is not None  # not a string
    record = {"kind": "node_exit", "rc": 0, "key": k0["node_exit"]}
    assert gate.admit(0, record) is None and "key" not in record  # taken; the key is not kept
    assert "second" in gate.admit(0, {"kind": "node_exit", "rc": 0, "key": k0["node_exit"]})  # a replay
    for kind in control.LAUNCHER_ONLY:  # never from a node's stream, key or not
        assert gate.admit(0, {"kind": kind}) is not None and Gate(None).admit(0, {"kind": kind}) is not None
    assert gate.admit(0, {"kind": "epoch", "epoch": 1}) is None  # the job's own metrics are its own
    assert Gate(None).admit(0, {"kind": "setup_end", "rc": 0}) is None  # a launcher that gives no keys


def test_every_key_is_new_and_the_lines_hold_them_in_order():
    a, b = NodeKeys.new(), NodeKeys.new()
    assert len({*a.keys.values(), *b.keys.values()}) == 2 * len(control.KEYED)
    assert a.reaper_line(False).split() == [a.keys[k].encode() for k in ("reaper_start", "reaper_done", "agent_exit")]
    assert a.shell_line(True).decode().split() == [a.keys[k] for k in
                                                   ("node_exit", "node_notice", "reaper_start", "reaper_done",
                                                    "agent_exit", "setup_start", "setup_end")]


def _supervise(tmp_path, argv, keys, job=None, stdin=None):
    events = Events()
    job = job or JobSpec("t", command=("x",), max_seconds=120)
    sup = NodeSupervisor(job, events, tmp_path, ["n0"], reaper=True, keys=keys)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    control.give_keys(proc, stdin or b"")
    sup.attach(0, proc.stdout)
    t0 = time.monotonic()
    try:
        result = sup.run({0: proc}, stop=lambda: None)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return result, events, time.monotonic() - t0, sup


def _copied(log) -> list[int]:
    """How many copies of gpucluster's keyed lines (from the node log) each of the forger's rounds printed."""
    import re

    return [int(n) for n in re.findall(r"forger: forged every control record \((\d+) copies", log.read_text())
            if int(n)]


def test_forged_control_lines_under_the_real_reaper_are_counted_and_change_nothing(tmp_path, monkeypatch):
    """The job, under the real reaper given its keys, prints every control record (plain, with a
    made-up key, and as copies of the reaper's own keyed line from its log, rewritten to every
    kind), then goes on for 3 s. A forged node_exit would cut the node after DRAIN_S (0.5 s here)
    and report exit 0; a forged reaper_done would stand for the witness. Neither happens: the run
    lasts the job's 3 s, the real reaper's start and end are the only control records taken."""
    monkeypatch.setattr(supervisor, "DRAIN_S", 0.5)
    keys = {0: NodeKeys.new()}
    log = tmp_path / "node-0.log"
    argv = [sys.executable, reaper.__file__, "--grace", "1", "--keyed", "--",
            sys.executable, "-u", FORGER, "--seconds", "3", "--log", str(log)]
    result, events, took, sup = _supervise(tmp_path, argv, keys, stdin=keys[0].reaper_line(False))
    assert result.ok and result.nodes[0].exit_code == 0, result.failure
    assert took >= 3, took  # not cut short
    assert "forger: done" in result.nodes[0].last_lines
    taken = [r["kind"] for _, r in events.metrics]
    assert taken == ["reaper_start", "reaper_done"], taken  # the real reaper's, nothing else
    assert sup.reapers == {0: "done"} and sup.node_exits == {} and result.unwitnessed == []
    assert len(_copied(log)) >= 2, log.read_text()[-2000:]  # the real reaper_start line, copied and rewritten
    summary = result.metrics.summary()
    assert summary["refused_metric_lines"] >= 4 * (2 * len(control.KEYED) + 3), summary
    assert len([m for m in events.messages if "metric line was ignored" in m]) == 1


def test_a_forged_reaper_done_does_not_stand_for_a_killed_reaper(tmp_path):
    """The job prints a forged reaper_done (and copies of the real reaper_start, rewritten), then
    the reaper dies without its final pass: the node has no witness."""
    keys = {0: NodeKeys.new()}
    log = tmp_path / "node-0.log"
    script = ("import os, signal, subprocess, sys\n"
              f"subprocess.run([sys.executable, {FORGER!r}, '--log', {str(log)!r}])\n"
              "os.kill(os.getppid(), signal.SIGKILL)\n")
    argv = [sys.executable, reaper.__file__, "--grace", "1", "--keyed", "--", sys.executable, "-c", script]
    result, events, _, sup = _supervise(tmp_path, argv, keys, stdin=keys[0].reaper_line(False))
    assert [r["kind"] for _, r in events.metrics] == ["reaper_start"]
    assert sup.reapers == {0: "started"}
    assert len(result.unwitnessed) == 1 and result.unwitnessed[0].startswith(UNWITNESSED + "node 0"), result.unwitnessed


def test_a_forged_setup_end_does_not_release_the_rendezvous(tmp_path):
    """The setup wrapper under the real reaper: a setup command prints forged setup_end records
    (plain, made-up key, copies of the wrapper's own keyed setup_start rewritten) and then takes
    2 s. The rendezvous is released only by the wrapper's own setup_end, after those 2 s."""
    keys = {0: NodeKeys.new()}
    log = tmp_path / "node-0.log"
    go = tmp_path / "go"
    dump = tmp_path / "proc.txt"  # every command line and environment this user's processes show
    setup = (f"{sys.executable} {FORGER} --log {log} && cat /proc/[0-9]*/cmdline /proc/[0-9]*/environ "
             f"> {dump} 2>/dev/null; sleep 2")
    wrapped = setup_wrapped([sys.executable, "-c", "print('torchrun would start')"], [setup], str(go), keyed=True)
    argv = [sys.executable, reaper.__file__, "--grace", "1", "--keyed", "--", *wrapped]
    released: list[float] = []
    t0 = time.monotonic()

    events = Events()
    job = JobSpec("t", command=("x",), max_seconds=60, setup=(setup,))
    sup = NodeSupervisor(job, events, tmp_path, ["n0"], reaper=True, keys=keys)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    control.give_keys(proc, keys[0].reaper_line(True))
    sup.attach(0, proc.stdout)

    def release():
        released.append(time.monotonic() - t0)
        go.touch()

    try:
        result = sup.run({0: proc}, stop=lambda: None, release=release)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert result.ok, (result.failure, result.nodes[0].last_lines[-10:])
    assert len(released) == 1 and released[0] >= 2, released
    setup_ends = [r for _, r in events.metrics if r["kind"] == "setup_end"]
    assert len(setup_ends) == 1 and setup_ends[0]["rc"] == 0 and "key" not in setup_ends[0]
    assert "torchrun would start" in result.nodes[0].last_lines
    assert _copied(log), log.read_text()[-2000:]  # the wrapper's own keyed setup_start line, copied and rewritten
    # while the setup ran, no command line or environment on this machine showed a key
    shown = dump.read_bytes()
    assert len(shown) > 1000 and not any(k.encode() in shown for k in keys[0].keys.values())


def test_worker_start_before_the_nodes_setup_ended_is_the_jobs_own_line(tmp_path):
    """worker_start carries no key (the announcer is the worker itself): before the node's setup
    said, with its key, that it ended, a worker_start is a setup command's line: refused."""
    events = Events()
    sup = NodeSupervisor(JobSpec("t", command=("x",), setup=("true",)), events, tmp_path, ["n0"], keys={0: NodeKeys.new()})
    sup._handle(0, '@gpucluster-metric {"kind": "worker_start", "rank": 0, "local_rank": 0, "pid": 1}')
    assert events.metrics == [] and sup.train_started_at is None and sup.metrics.refused == 1
    sup.setup_done.add(0)
    sup._handle(0, '@gpucluster-metric {"kind": "worker_start", "rank": 0, "local_rank": 0, "pid": 1}')
    assert [r["kind"] for _, r in events.metrics] == ["worker_start"] and sup.train_started_at is not None
