"""A fault-matrix case of issue 45 item 1: an ssh host frozen (SIGSTOP to its sshd listener and
everything under it: a machine that stops answering, its TCP connections open and silent) while
the run is in its `check` or `stage` phase, on real sshd "hosts" on loopback (tests/sshd.py).

What a frozen machine does (and what the fault does here, tests/recovery_faults.py `freeze_host`):
its processes stop where they are and keep their files; the kernel still completes TCP handshakes
into the listen backlog, but nothing answers. OpenSSH's client then gives up on an open session
after ServerAliveInterval x ServerAliveCountMax seconds without a reply (ssh_config(5):
"ServerAliveCountMax ... If this threshold is reached while server alive messages are being sent,
ssh will disconnect from the server"; the launcher sets 5 x 3, infra/ssh/session.py) and on a new
connection after ConnectTimeout, which covers the banner exchange and key exchange too (ssh_config(5)
ConnectTimeout: "applied both to establishing the connection and to performing the initial SSH
protocol handshake and key exchange").

Before the fix the run said "teardown: verified" within milliseconds, never asking the frozen host
(the launcher had started no torchrun there, so the provider's check skipped every node), and the
frozen node's `ssh-run` ledger row was closed as gone while its check program and its run folder
were still on it. Now: exit 3, "not verified" naming the host, its row open; once the host thaws,
`down`'s cleanup of the recorded hosts (infra/ssh/cleanup.py) removes what the run left there.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from gpucluster.errors import ExitCode

sys.path.insert(0, str(Path(__file__).parent))
import sshd  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.sshd]
sshd.skip_unless_usable()


hosts = sshd.hosts_fixture(2)  # the module's two sshd hosts


@pytest.mark.parametrize("phase", ["check", "stage"])
def test_a_host_frozen_before_the_job_starts_is_never_verified(home, tmp_path, hosts, monkeypatch, phase):
    from recovery_faults import Fault, Interrupting, freeze_host
    from test_recovery import _digits_job

    from gpucluster.watch.health import HealthSpec
    from gpucluster.infra.registry import plugin
    from gpucluster.infra.ssh.cleanup import clean_recorded_hosts
    from gpucluster.infra.ssh.provider import SshProvider
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.steps import execute
    from gpucluster.spec import ClusterSpec, new_run_id

    monkeypatch.chdir(tmp_path)
    remote = tmp_path / "remote"
    launcher = sshd.make_launcher(hosts, remote, connect_timeout=5)
    spec = ClusterSpec(cloud="ssh", nodes=2, name=f"frozen-{phase}", gpus_per_node=0, run_id=new_run_id(),
                       hosts=tuple(hosts.hosts[:2]))
    extra: dict = {"check": HealthSpec(timeout_s=30)}
    if phase == "stage":
        from gpucluster.watch.staging import parse_data

        data = tmp_path / "data"
        data.mkdir()
        (data / "x.bin").write_bytes(os.urandom(20_000_000))  # a copy that is under way when the host freezes
        extra = {"data": parse_data((str(data),), plugin("ssh"))}
    stopped: list[int] = []
    fault = Fault(lambda: stopped.extend(freeze_host(hosts, 1)))
    ledger = Ledger(home / "ledger.sqlite3")
    rid = spec.run_id
    try:
        outcome = execute(spec, _digits_job(rid, epochs=1, **extra), ledger=ledger,
                          provider=SshProvider(launcher=launcher), launcher=Interrupting(launcher, phase, fault),
                          backend=plugin("ssh"), workload="digits")
        assert fault.fired_at is not None, "the fault never fired"
        frozen = f"127.0.0.1:{hosts.ports[1]}"
        said = " | ".join(outcome.unchecked + [str(x) for x in outcome.leftovers])
        assert outcome.status == "failed", outcome.failure
        assert outcome.teardown == "not verified", (outcome.teardown, said)
        assert outcome.exit_code == ExitCode.LEFTOVERS
        assert frozen in said and f"127.0.0.1:{hosts.ports[0]}" not in said, said
        row = ledger.get_run(rid)
        assert row.run.teardown == "not verified"
        gone = {r.name: r.confirmed_gone for r in row.resources if r.kind == "ssh-run"}
        assert gone == {"node-0": True, "node-1": False}, gone  # the frozen node's row stays open for `down`
        if phase == "check":
            lost = ledger.metrics(rid, kind="node_lost")
            assert lost and lost[0]["node_rank"] == 1 and lost[0]["phase"] == "check", lost
    finally:
        for pid in stopped:  # the machine thaws: its processes go on where they stopped
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    # `down` after the thaw: the recorded host is reached, the run's processes and folder removed
    left = clean_recorded_hosts(ledger.open_resources(spec.name))
    assert left == [], left
    assert sshd.run_processes(rid) == {}
    assert not (remote / rid).exists(), list((remote / rid).rglob("*"))
    assert sshd.leaked_ssh_masters() == []
