"""`run --cloud aws` end to end, as one piece, without AWS: the real lifecycle drives the real
Automation API driver against the FAKE Pulumi CLI (tests/pulumi_fake.py), whose scripted stack
outputs describe two "EC2 nodes" that are real OpenSSH servers on 127.0.0.2 and 127.0.0.3, port
22, with the host keys the stack pinned and the stack's own private key. The real ssh launcher
then trains `digits` on them, and teardown destroys the (fake) stack and checks for leftovers.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import sshd  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.sshd]
ADDRESSES = ["127.0.0.2", "127.0.0.3"]


def _port_22_free() -> bool:
    for a in ADDRESSES:
        with socket.socket() as s:
            try:
                s.bind((a, 22))
            except OSError:
                return False
    return True


@pytest.fixture(scope="module")
def ec2_like_hosts(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("pulumi.automation")
    reason = sshd.missing_reason()
    if reason:
        pytest.skip(reason)
    if os.geteuid() != 0 or not _port_22_free():
        pytest.skip("needs root and a free port 22 on 127.0.0.2/3 to look like EC2 nodes")
    h = sshd.SshdHosts.start(tmp_path_factory.mktemp("ec2"), 2, addresses=ADDRESSES, port=22)
    yield h
    h.stop()


def test_aws_run_end_to_end_on_fake_pulumi_and_real_ssh(home, tmp_path, ec2_like_hosts):
    from pulumi_fake import FakePulumiCommand

    from gpucluster.infra.automation import PulumiDriver
    from gpucluster.infra.cloud import PulumiProvider
    from gpucluster.launch import JobSpec
    from gpucluster.ledger import Ledger
    from gpucluster.lifecycle import execute
    from gpucluster.spec import ClusterSpec, new_run_id, validate
    from gpucluster.sshlaunch import SshLauncher

    h = ec2_like_hosts
    outputs = {
        "cluster_name": "e2e", "instance_ids": ["i-0000000000000000a", "i-0000000000000000b"],
        "private_ips": ADDRESSES, "public_ips": ADDRESSES, "host_public_keys": h.host_keys,
        "ssh_user": h.user, "ssh_private_key": h.identity.read_text(), "region": "us-east-1",
        "availability_zone": "us-east-1a", "instance_type": "g5.xlarge", "gpus_per_node": 0,
    }
    fake = FakePulumiCommand(outputs=outputs)
    found = []
    provider = PulumiProvider("aws", driver=PulumiDriver(pulumi_command=fake, program_runner=lambda s: None),
                              find=lambda cloud, name=None, run_id=None, **kw: found.append(name) or [],
                              delete=lambda items: [])
    # Not the user's known_hosts: only the host keys pinned by the stack may be trusted.
    empty_known_hosts = tmp_path / "known_hosts"
    empty_known_hosts.write_text("")
    launcher = SshLauncher(known_hosts=str(empty_known_hosts), python=sys.executable,
                           remote_dir=str(tmp_path / "remote"), grace=2.0)
    run_id = new_run_id()
    spec = ClusterSpec(cloud="aws", nodes=2, name="e2e", region="us-east-1", instance_type="g5.xlarge",
                       ssh_cidr="203.0.113.7/32", run_id=run_id)
    validate(spec)
    ledger = Ledger(home / "ledger.sqlite3")
    job = JobSpec(run_id=run_id, workload="digits", workload_args=("--epochs", "3"), threads_per_proc=1)
    outcome = execute(spec, job, ledger=ledger, provider=provider, launcher=launcher)

    run = ledger.get_run(run_id)
    assert outcome.status == "succeeded", (run["failure"], [n["last_lines"][-5:] for n in run["node_results"]])
    assert [n["exit_code"] for n in run["node_results"]] == [0, 0]
    assert ["127.0.0.2" in n["host"] for n in run["node_results"]] == [True, False]  # head first
    assert run["metrics"]["world_size"] == 2 and run["metrics"]["final_records"] == 2
    # the Pulumi sequence: up, outputs with secrets, then refresh / destroy / stack rm
    verbs = fake.verbs()
    assert verbs.index("up") < verbs.index("refresh") < verbs.index("destroy")
    # every cloud resource the fake engine reported was recorded and is confirmed gone; the run's
    # processes on the nodes too; the leftover check by tag ran for this cluster
    kinds = {r["kind"] for r in run["resources"]}
    assert {"instance", "process"} <= kinds
    assert all(r["confirmed_gone"] for r in run["resources"])
    assert run["teardown"] == "verified" and found and set(found) == {"e2e"}
    assert sshd.run_processes(run_id) == {}
    assert sshd.leaked_ssh_masters() == []
    # the run is priced from the snapshot-less resource lifetimes (today's catalog, noted as such)
    assert run["cost"] and run["cost"]["local"] is False and float(run["cost"]["total"]) > 0
