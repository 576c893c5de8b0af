"""`run`/`up --cloud aws` before anything is created: the SSH CIDR default, GPUs per node,
`--option`, and `--dry-run` (the real Pulumi program under Pulumi's mock runtime)."""

from __future__ import annotations

import http.server
import threading

import pytest

from conftest import run_cli
from test_bad_input import assert_clean_refusal, assert_no_run_recorded

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("pulumi_aws")


@pytest.fixture
def checkip():
    """A local stand-in for https://checkip.amazonaws.com, which answers with the caller's public
    IPv4 and a newline (and nothing else)."""

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"198.51.100.23\n")

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/"
    srv.shutdown()


def test_dry_run_of_a_default_two_node_run_declares_a_reachable_cluster_and_creates_nothing(home, checkip):
    # no credentials, no Pulumi CLI on PATH: a dry run needs neither
    env = {"GPUCLUSTER_CHECKIP_URL": checkip, "PATH": "/usr/bin:/bin", "AWS_ACCESS_KEY_ID": "",
           "AWS_SECRET_ACCESS_KEY": "", "AWS_PROFILE": "nonexistent-profile"}
    r = run_cli("run", "--cloud", "aws", "--nodes", "2", "--instance-type", "g5.12xlarge", "--dry-run", env=env)
    assert r.returncode == 0, r.stderr + r.stdout
    out = r.stdout
    assert "2 × g5.12xlarge (4 × A10G each), 8 training processes, $11.38/h" in out  # with 2 public IPv4
    assert "SSH allowed from 198.51.100.23/32" in out + r.stderr
    assert "security group ingress: tcp ports 22 from 198.51.100.23/32" in out
    assert "1 × aws:ec2/fleet:Fleet" in out and "aws:ec2/instance:Instance" not in out
    assert "one EC2 Fleet request (type instant), all or none: min target capacity 2" in out
    assert "Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.* (Ubuntu 22.04) *" in out
    assert "2?.04" not in out  # the releases checked, pinned (the full filter: test_aws_program.py)
    assert "/usr/local/sbin/gpucluster-ready" in out and "printed to the serial console and pinned from there" in out
    assert "BEGIN OPENSSH PRIVATE KEY" not in out
    node_lines = [ln for ln in out.splitlines() if ln.strip().startswith("node ")]
    assert len(node_lines) == 2
    for rank, ln in enumerate(node_lines):
        assert "/opt/pytorch/bin/python -m torch.distributed.run --nnodes=2 --nproc-per-node=4" in ln
        assert f"GPUCLUSTER_NODE_RANK={rank}" in ln and "--rdzv-endpoint=10.42.0.10:" in ln
    assert "nothing was created" in out
    assert not home.exists() or not (home / "ledger.sqlite3").exists()
    assert not (home / "pulumi").exists()


def test_failed_ip_detection_stops_a_real_run_before_anything_with_exit_2(home):
    r = run_cli("run", "--cloud", "aws", "--nodes", "2", "--yes",
                env={"GPUCLUSTER_CHECKIP_URL": "http://127.0.0.1:9/"})
    assert_clean_refusal(r, "could not detect this machine's public IPv4", "--ssh-cidr")
    assert_no_run_recorded(home)
    # the same failure in a dry run is a note, and the preview says there is no SSH rule
    r = run_cli("run", "--cloud", "aws", "--nodes", "2", "--dry-run", env={"GPUCLUSTER_CHECKIP_URL": "http://127.0.0.1:9/"})
    assert r.returncode == 0 and "tcp ports 22" not in r.stdout and "no SSH rule" in r.stdout + r.stderr


@pytest.mark.parametrize("args,needles", [
    (["--option", "efa"], ["option 'efa'", "KEY=VALUE"]),
    (["--option", "colour=red"], ["aws option 'colour'", "allowed:"]),
    (["--option", "image=ubuntu"], ["option image 'ubuntu'", "pytorch", "base"]),
    (["--option", "efa=true"], ["g5.xlarge does not support it"]),
    (["--ready-timeout", "soon"], ["ready timeout", "'soon'"]),
    # issue 25: inputs that cannot work on EC2 (IPv4-only VPC; ImportKeyPair takes no ECDSA key)
    (["--ssh-cidr", "2001:db8::/64"], ["ssh CIDR '2001:db8::/64'", "IPv4"]),
    (["--option", "sshPublicKey=ecdsa-sha2-nistp256 AAAAE2VjZHNh user@host"], ["sshPublicKey", "ECDSA"]),
])
def test_bad_options_are_refused_before_anything(home, args, needles):
    r = run_cli("run", "--cloud", "aws", "--ssh-cidr", "198.51.100.7/32", "--dry-run", *args)
    assert_clean_refusal(r, *needles)
    assert_no_run_recorded(home)


def test_options_reach_the_program_and_up_has_dry_run_too(home):
    r = run_cli("up", "--cloud", "aws", "--ssh-cidr", "198.51.100.7/32", "--instance-type", "g5.12xlarge",
                "--option", "efa=true", "--option", "image=base", "--dry-run")
    assert r.returncode == 0, r.stderr
    # efa=true on a one-card type: one launch template with an EFA interface and a public IPv4, no Elastic IPs
    # (issue 25; a type with several cards gets an Elastic IP per node: tests/test_aws_efa_public_ip.py)
    assert "1 × aws:ec2/launchTemplate:LaunchTemplate" in r.stdout and "aws:ec2/eip:Eip" not in r.stdout
    assert "Deep Learning Base OSS Nvidia Driver GPU AMI" in r.stdout  # image=base
    assert "/usr/local/sbin/gpucluster-setup-torch" in r.stdout
    assert not (home / "ledger.sqlite3").exists()


def test_sweep_takes_options_with_the_same_checks(home):
    r = run_cli("sweep", "--cloud", "aws", "--nodes", "1,2", "--option", "colour=red", "--yes")
    assert_clean_refusal(r, "aws option 'colour'", "allowed:")
    assert_no_run_recorded(home)
    r = run_cli("sweep", "--cloud", "aws", "--nodes", "1,2", "--yes", env={"GPUCLUSTER_CHECKIP_URL": "http://127.0.0.1:9/"})
    assert_clean_refusal(r, "could not detect this machine's public IPv4", "--ssh-cidr")
    assert_no_run_recorded(home)
