"""`run --cloud aws` end to end, as one piece, without AWS, on "EC2 nodes" that behave like
FRESH instances, not helpful ones.

The real lifecycle drives the real Automation API driver against the FAKE Pulumi CLI
(tests/pulumi_fake.py). When the fake `up` succeeds, the REAL Pulumi program (`infra.program`,
under Pulumi's mock runtime) is run for the spec the driver was given, and two "instances" boot
from what it declares: real OpenSSH servers on a pair of loopback addresses (127.0.0.2 and
127.0.0.3, or another pair of ADDRESS_PAIRS), port 22, with the stack's key. How each node
behaves, and the public source for it:

- sshd answers only some seconds after `up` returns: Pulumi's `aws.ec2.Instance` is created once
  EC2 reports the instance "running", and the EC2 user guide (instance lifecycle,
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-lifecycle.html) says a running
  instance still boots its OS; "it can take a few minutes for the instance to be ready so that
  you can connect to it" (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/connect-to-linux-instance.html).
  Here: SSHD_DELAY_S after `up` returns.
- the ready marker appears later still: cloud-init runs user data's `runcmd` in its final stage,
  after boot (https://cloudinit.readthedocs.io/en/latest/explanation/boot.html). Here: the
  node's user data runs MARKER_DELAY_S after sshd starts.
- the node's `python3` has no torch (the DLAMI's system Python; torch lives only at the
  documented `python_location`, /opt/pytorch/bin/python, AWS DLAMI release notes,
  https://docs.aws.amazon.com/dlami/latest/devguide/appendix-ami-release-notes.html). Here:
  the node's PATH has the system Python (no torch) and /opt/pytorch/bin/python runs this
  test's interpreter.
- port 22 answers only if the security group the program DECLARED allows the caller's address
  (security groups deny inbound traffic that no rule allows,
  https://docs.aws.amazon.com/vpc/latest/userguide/vpc-security-groups.html). Here: the
  declared ingress rules on port 22 are read from the mock runtime's records; sshd is not
  started when none contains the caller's address, and `AllowUsers` carries the same CIDRs.
- the node runs the user-data script the program declared: its `write_files` land under a
  per-node sandbox root, its `runcmd` runs there with `systemctl` (runs the unit's ExecStart),
  `shutdown` (logs) and `nvidia-smi` (one A10G) stubbed, so the ready marker and the dead-man
  switch come from the real scripts. cloud-init's `ssh_keys` part is not executed: sshd uses the
  host key the test generated, exported as the pinned key.
- `destroy` terminates the instances (sshd stops); an `up` after a `destroy` boots NEW instances:
  a fresh root for each node (nothing of the old disk), new sshd servers on the same addresses
  (the recovery tests, tests/test_recovery_cloud.py, provision again after an interruption).

Reverting a fix makes this fail (checked once by hand, 2026-11-22): without the launcher's wait
for the ready marker, "2 of 2 node(s) not ready: node 0 (root@127.0.0.2): cannot connect over
ssh: ... Connection refused"; with the old default Python (`python3`), "torch is not importable
by python3 3.11.7".
"""

from __future__ import annotations

from gpucluster.infra.registry import plugin as backend_of
from gpucluster.infra.registry import plugin as _plugin

import base64
import contextlib
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
import sshd  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.sshd]
# Port 22 is one per address: each test that boots "instances" holds one of these pairs (its lock
# file) for its whole life, so up to three such tests run at once in parallel workers. test_kept.py
# uses 127.0.0.6/7 and test_health_ssh.py 127.0.0.5-7 on other ports.
ADDRESS_PAIRS = [["127.0.0.2", "127.0.0.3"], ["127.0.0.8", "127.0.0.9"], ["127.0.0.10", "127.0.0.11"]]
ADDRESSES = ADDRESS_PAIRS[0]  # the first pair (benchmarks/recovery.py runs alone)
CALLER = "127.0.0.1"  # the source address the "nodes" see (loopback's src), as checkip reports it
SSHD_DELAY_S = 4.0
MARKER_DELAY_S = 3.0
DLAMI_PYTHON = Path("/opt/pytorch/bin/python")


def _port_22_free(addresses: list[str] = ADDRESSES) -> bool:
    for a in addresses:
        with socket.socket() as s:
            # as sshd binds (SO_REUSEADDR): the previous test's connections in TIME_WAIT do not count
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((a, 22))
            except OSError:
                return False
    return True


@pytest.fixture
def checkip(monkeypatch):
    """Stand-in for https://checkip.amazonaws.com: the caller's IPv4 and a newline."""

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.end_headers()
            self.wfile.write(f"{CALLER}\n".encode())

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("GPUCLUSTER_CHECKIP_URL", f"http://127.0.0.1:{srv.server_address[1]}/")
    yield
    srv.shutdown()


@pytest.fixture
def dlami_python():
    """/opt/pytorch/bin/python runs this test's interpreter (torch installed), like the DLAMI's.
    Tests in parallel workers share it: each holds a shared lock for its life, and the last one out
    (it gets the lock exclusively) removes it, if a test made it."""
    import fcntl

    made_by_tests = "# made by gpucluster's tests\n"
    with open(os.path.join(tempfile.gettempdir(), "gpucluster-tests-dlami.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not DLAMI_PYTHON.exists():
            DLAMI_PYTHON.parent.mkdir(parents=True, exist_ok=True)
            tmp = DLAMI_PYTHON.with_name(f".python.{os.getpid()}")
            tmp.write_text(f'#!/bin/sh\n{made_by_tests}exec {sys.executable} "$@"\n')
            tmp.chmod(0o755)
            tmp.replace(DLAMI_PYTHON)
        fcntl.flock(lock, fcntl.LOCK_SH)
        yield str(DLAMI_PYTHON)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another test still runs nodes on it
        if DLAMI_PYTHON.exists() and made_by_tests in DLAMI_PYTHON.read_text():
            shutil.rmtree("/opt/pytorch", ignore_errors=True)


STUBS = {
    # one A10G; the ready script asks for driver_version, the launcher for name,util,mem
    "nvidia-smi": 'case "$*" in *driver_version*) echo 550.127.05;; *) echo "NVIDIA A10G, 0, 0, 22888";; esac\n',
    "shutdown": 'echo "$@" >> "$NODE_ROOT/shutdown.log"\n',
    # `systemctl enable --now --no-block UNIT`: run the unit's ExecStart inside the sandbox
    "systemctl": ('unit="$NODE_ROOT/etc/systemd/system/$(for a; do :; done; echo "$a")"\n'
                  'exec "$NODE_ROOT$(sed -n "s/^ExecStart=//p" "$unit")"\n'),
}


class Ec2Like:
    """Two deferred sshd "instances" that boot from the real program's declarations."""

    def __init__(self, root: Path, addresses: list[str] = ADDRESSES):
        self.root = root
        self.addresses = list(addresses)
        self.boots = 0  # how many times instances were made (each `up` after a `destroy` makes new ones)
        self.node_roots = [root / f"node{i}" for i in range(len(self.addresses))]
        stub_bin = root / "stubs"
        stub_bin.mkdir()
        for name, body in STUBS.items():
            (stub_bin / name).write_text("#!/bin/sh\n" + body)
            (stub_bin / name).chmod(0o755)
        self.stub_bin = stub_bin
        self.hosts: sshd.SshdHosts | None = None
        self.threads: list[threading.Thread] = []
        self.ssh_cidrs: list[str] = []
        self.booted: list[str] = []
        self.errors: list[str] = []
        self.terminated = threading.Event()
        self.node_env: dict[str, str] = {}  # more environment for every node's ssh sessions
        self.node_envs: list[dict[str, str]] = [{} for _ in self.addresses]  # ... and for node i's only
        self.console = None  # the fake GetConsoleOutput of the instances `up` made last
        self.restore: list = []  # undone when the test ends

    def prepare(self, cidrs: list[str]) -> None:
        import ipaddress

        self.ssh_cidrs = cidrs
        self.boots += 1
        if self.boots > 1:  # new instances: new disks
            self.node_roots = [self.root / f"boot{self.boots}" / f"node{i}" for i in range(len(self.addresses))]
        if self.terminated.is_set():  # a `destroy` came before (a failed `up` is destroyed too): new instances run
            self.terminated = threading.Event()
        allow = " ".join(f"*@{c}" for c in cidrs) or "nobody@255.255.255.255"
        self.hosts = sshd.SshdHosts.start(
            self.root / ("sshd" if self.boots == 1 else f"sshd-{self.boots}"), 2, addresses=self.addresses, port=22,
            defer=True, path=[str(self.stub_bin), "/usr/bin", "/bin"],  # python3 here is the system one: no torch
            extra_config=[f"AllowUsers {allow}"] * 2,
            env=[{"GPUCLUSTER_STATE_DIR": str(r / "var/lib/gpucluster"), **self.node_env, **self.node_envs[i]}
                 for i, r in enumerate(self.node_roots)])
        self.reachable = any(ipaddress.ip_address(CALLER) in ipaddress.ip_network(c) for c in cidrs)

    def boot(self, rank: int, user_data: str) -> None:
        try:
            if self.terminated.wait(SSHD_DELAY_S):
                return
            if self.reachable:  # else the security group drops the caller's packets: never answers
                self.hosts.launch(rank)
                self.booted.append(self.addresses[rank])
            if self.terminated.wait(MARKER_DELAY_S):
                return
            self._run_user_data(rank, user_data)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(f"node {rank}: {exc}")

    def _run_user_data(self, rank: int, user_data: str) -> None:
        assert user_data.startswith("#cloud-config\n")
        doc = yaml.safe_load(user_data)
        root = self.node_roots[rank]
        for f in doc["write_files"]:
            target = root / f["path"].lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(f["content"])
            target.chmod(int(f["permissions"], 8))
        env = {"PATH": f"{self.stub_bin}:/usr/bin:/bin", "NODE_ROOT": str(root),
               "GPUCLUSTER_STATE_DIR": str(root / "var/lib/gpucluster"), "GPUCLUSTER_READY_TRIES": "1"}
        # the node's own host key (sshd's, made by the test) where cloud-init writes it, and its
        # serial console a file the fake GetConsoleOutput serves
        pub = root / "etc/ssh/ssh_host_ed25519_key.pub"
        pub.parent.mkdir(parents=True, exist_ok=True)
        pub.write_text(self.hosts.host_keys[rank] + " root@ip-10-42-0-1" + str(rank) + "\n")
        for cmd in doc["runcmd"]:
            if cmd[:2] == ["sh", "-c"]:
                cmd = ["sh", "-c", cmd[2].replace("/etc/ssh/", f"{root}/etc/ssh/")
                       .replace("/dev/console", f"{root}/console")]
            argv = [str(root / cmd[0].lstrip("/")) if cmd[0].startswith("/") else cmd[0], *cmd[1:]]
            subprocess.run(argv, env=env, check=True, timeout=60)

    def console_client(self, instance_ids: list[str]) -> "FakeConsole":
        return FakeConsole(self, instance_ids)

    def terminate(self) -> None:
        self.terminated.set()
        for t in self.threads:
            t.join(timeout=30)
        if self.hosts:
            self.hosts.stop()


class FakeConsole:
    """EC2 GetConsoleOutput for the loopback "instances": what each node's serial console holds so far.
    As AWS's: base64 text (EC2 API reference, GetConsoleOutput), boot noise first, and the host key
    block only once the node's user data printed it, i.e. late (after SSHD_DELAY_S + MARKER_DELAY_S
    here; on EC2 after the boot and cloud-init's init stage); before that, no block at all."""

    def __init__(self, nodes: "Ec2Like", instance_ids: list[str]):
        self.nodes, self.ids = nodes, list(instance_ids)
        self.calls: list[str] = []

    def get_console_output(self, InstanceId: str, Latest: bool = False) -> dict:
        self.calls.append(InstanceId)
        rank = self.ids.index(InstanceId)
        console = self.nodes.node_roots[rank] / "console"
        text = "[    0.000000] Linux version 6.8.0-1019-aws\r\n" + (console.read_text() if console.exists() else "")
        return {"InstanceId": InstanceId, "Output": base64.b64encode(text.encode()).decode()}


@pytest.fixture
def ec2(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("pulumi.automation")
    pytest.importorskip("pulumi_aws")
    reason = sshd.missing_reason()
    if reason:
        pytest.skip(reason)
    import fcntl

    with _address_pair() as addresses:
        if os.geteuid() != 0 or not _port_22_free(addresses):
            pytest.skip(f"needs root and a free port 22 on {'/'.join(addresses)} to look like EC2 nodes")
        (tmp_path / "ec2").mkdir()
        nodes = Ec2Like(tmp_path / "ec2", addresses)
        yield nodes
        nodes.terminate()
        for undo in nodes.restore:
            undo()


@contextlib.contextmanager
def _address_pair():
    """One of ADDRESS_PAIRS, held (an flock on its own file) until the block ends: a free pair at
    once if any, else the first pair once its holder is done."""
    import fcntl

    files = [open(os.path.join(tempfile.gettempdir(), f"gpucluster-tests-port22-{a[0]}.lock"), "w")
             for a in ADDRESS_PAIRS]
    try:
        for f, pair in zip(files, ADDRESS_PAIRS):
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            yield pair
            return
        fcntl.flock(files[0], fcntl.LOCK_EX)
        yield ADDRESS_PAIRS[0]
    finally:
        for f in files:
            f.close()


def _provider_and_fake(ec2: Ec2Like, **fake_kw):
    """The real driver on the fake CLI; `up` runs the real program under mocks for the spec the
    driver got, and boots the nodes from what it declared."""
    from pulumi_fake import FakePulumiCommand

    from gpucluster.infra.aws import mock_runtime as aws_mocks
    from gpucluster.infra.pulumi.engine import PulumiDriver
    from gpucluster.infra.pulumi.provider import PulumiProvider

    seen: dict = {}

    class Driver(PulumiDriver):
        def up(self, spec, events=None):
            seen["spec"] = spec
            return super().up(spec, events)

    def on_up(stack):
        built = aws_mocks.build(seen["spec"])
        assert built.error is None, built.error
        rec = built.recorder
        rules = [r.inputs for r in rec.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
                 if r.inputs.get("ipProtocol") in ("tcp", "-1") and r.inputs.get("cidrIpv4")
                 and (r.inputs["ipProtocol"] == "-1" or int(r.inputs["fromPort"]) <= 22 <= int(r.inputs["toPort"]))]
        ec2.prepare([r["cidrIpv4"] for r in rules])
        addresses = ec2.addresses
        outputs = dict(built.outputs)
        # what EC2 would have assigned: the loopback "instances", their host keys, our login key
        # what EC2 would have assigned: the loopback "instances", our login key; no host keys in the
        # outputs: the launcher reads each from the node's console (FakeConsole)
        # new instances get new ids (EC2 never reuses an instance id), so a key pinned for an
        # earlier boot's instance is never offered for a new one
        ids = [f"i-{ec2.boots - 1:016x}a", f"i-{ec2.boots - 1:016x}b"]
        outputs.update(private_ips=addresses, public_ips=addresses, ssh_user=ec2.hosts.user,
                       ssh_private_key=ec2.hosts.identity.read_text(), instance_ids=ids)
        assert "host_public_keys" not in outputs
        ec2.console = ec2.console_client(ids)
        fake.scripted_outputs = outputs
        template = rec.node_template()  # one user data for every node of the fleet
        count = int(rec.fleet().inputs["targetCapacitySpecification"]["totalTargetCapacity"])
        assert count == len(addresses)
        for rank in range(count):
            user_data = base64.b64decode(aws_mocks.unwrap(template.inputs["userData"])).decode()
            t = threading.Thread(target=ec2.boot, args=(rank, user_data), daemon=True)
            t.start()
            ec2.threads.append(t)

    from gpucluster.infra.aws import hostkeys

    hostkeys_client, hostkeys.client_for = hostkeys.client_for, lambda region: ec2.console
    ec2.restore.append(lambda: setattr(hostkeys, "client_for", hostkeys_client))
    from pulumi_fake import AWS_FLEET_RESOURCES

    fake_kw.setdefault("resources", AWS_FLEET_RESOURCES)
    fake = FakePulumiCommand(on_up=on_up, on_destroy=lambda stack: ec2.terminate(), **fake_kw)
    found: list = []
    provider = PulumiProvider(_plugin("aws"), driver=Driver(pulumi_command=fake, program_runner=lambda s: None),
                              find=lambda cloud, name=None, run_id=None, **kw: found.append(name) or [],
                              delete=lambda items: [])
    return provider, fake, found


def _launcher(tmp_path, ready_timeout: float):
    from gpucluster.infra.contract import LaunchOptions

    _, launcher = _plugin("aws").transport.make(LaunchOptions(ready_timeout=ready_timeout))  # the aws defaults: DLAMI python
    launcher.remote_dir = str(tmp_path / "remote")
    launcher.grace = 2.0
    launcher.diagnose = None  # no EC2 API here (GetConsoleOutput is tested with moto elsewhere)
    return launcher


def test_aws_run_end_to_end_on_fresh_ec2_like_nodes(home, tmp_path, ec2, checkip, dlami_python, monkeypatch):
    from gpucluster.watch.launch import JobSpec
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.steps import execute
    from gpucluster.spec import ClusterSpec, new_run_id
    from specs import validate

    provider, fake, found = _provider_and_fake(ec2)
    launcher = _launcher(tmp_path, ready_timeout=90)
    assert launcher.python == "/opt/pytorch/bin/python"
    run_id = new_run_id()
    # no ssh CIDR given: the caller's address is detected (as `run` does) and becomes the rule
    spec = ClusterSpec(cloud="aws", nodes=2, name="e2e", region="us-east-1", instance_type="g5.xlarge", run_id=run_id)
    validate(spec)
    spec, _ = provider.plugin.spec.prepare(spec)
    assert spec.ssh_cidr == f"{CALLER}/32" and spec.gpus_per_node == 1
    ledger = Ledger(home / "ledger.sqlite3")
    # a job with a secret (issue 29 item 2): its value goes to the ranks over ssh's stdin, never
    # into the Pulumi program, its config, its state, the user data or any argv of the Pulumi CLI
    secret_mark = "gcmark-" + os.urandom(12).hex()
    monkeypatch.setenv("GC_MARK", secret_mark)
    job = JobSpec(run_id=run_id, workload="digits", workload_args=("--epochs", "3"), threads_per_proc=1,
                  nproc_per_node=spec.gpus_per_node, env=(("PLAIN_SETTING", "visible"),), secrets=("GC_MARK",),
                  rdzv_port=sshd.free_port())  # the nodes are this machine: not the port a parallel test uses
    t0 = time.monotonic()
    outcome = execute(spec, job, backend=backend_of(spec.cloud), ledger=ledger, provider=provider, launcher=launcher)

    run = ledger.get_run(run_id).to_dict()
    assert ec2.errors == []
    assert outcome.status == "succeeded", (run["failure"], [n["last_lines"][-5:] for n in run["node_results"]])
    assert ec2.booted and sorted(ec2.booted) == ec2.addresses
    assert time.monotonic() - t0 > SSHD_DELAY_S + MARKER_DELAY_S  # the launcher did wait
    # the ready markers and the dead-man switch came from the real user-data scripts
    for rank, root in enumerate(ec2.node_roots):
        marker = json.loads((root / "var/lib/gpucluster/ready").read_text())
        assert marker["ok"] is True and marker["torch"]
        assert (root / "shutdown.log").read_text().startswith("-P +240 ")
    ready = [p for p in run["phases"] if p["name"] == "ready"]
    assert ready and ready[0]["status"] == "ok"
    assert [n["exit_code"] for n in run["node_results"]] == [0, 0]
    assert [ec2.addresses[0] in n["host"] for n in run["node_results"]] == [True, False]  # head first
    assert run["metrics"]["world_size"] == 2 and run["metrics"]["final_records"] == 2
    verbs = fake.verbs()
    assert verbs.index("up") < verbs.index("refresh") < verbs.index("destroy")
    kinds = {r["kind"] for r in run["resources"]}
    assert {"fleet", "launch-template", "process"} <= kinds and "instance" not in kinds
    (fleet_row,) = [r for r in run["resources"] if r["kind"] == "fleet"]
    assert fleet_row["detail"]["node_count"] == 2 and fleet_row["detail"]["instance_type"] == "g5.xlarge"
    # the host keys were read from each node's console, late (the block came with the user data)
    assert set(ec2.console.calls) == {"i-0000000000000000a", "i-0000000000000000b"}
    assert all(r["confirmed_gone"] for r in run["resources"])
    assert run["teardown"] == "verified" and found and set(found) == {"e2e"}
    assert sshd.run_processes(run_id) == {}
    assert sshd.leaked_ssh_masters() == []
    assert run["cost"] and run["cost"]["local"] is False and float(run["cost"]["total"]) > 0
    # the secret: in no argv the Pulumi CLI was given, no file under the home (ledger, Pulumi work
    # folders and state) and no file on the nodes (the user data's files included)
    assert not [c for c in fake.calls if any(secret_mark in str(a) for a in c)]
    for root in (home, tmp_path / "remote", *ec2.node_roots):
        for path in Path(root).rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert secret_mark.encode() not in path.read_bytes(), path


def test_a_node_the_declared_security_group_does_not_open_fails_the_run_naming_it(
        home, tmp_path, ec2, checkip, dlami_python):
    from gpucluster.watch.launch import JobSpec
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.steps import execute
    from gpucluster.spec import ClusterSpec, new_run_id
    from specs import validate

    provider, fake, found = _provider_and_fake(ec2)
    launcher = _launcher(tmp_path, ready_timeout=12)
    # the run names the last console lines of each node that never got ready: the real console_tail
    # against a stand-in of EC2 GetConsoleOutput (the text base64-encoded, as the EC2 API reference says)
    from gpucluster.infra.aws.outputs import console_tail

    asked = []

    class Console:
        def get_console_output(self, InstanceId, Latest):  # noqa: N803 - boto3's parameter names
            asked.append((InstanceId, Latest))
            text = f"[   12.1] cloud-init[901]: sshd: no hostkeys available\nci-info: {InstanceId} up\n"
            return {"InstanceId": InstanceId, "Output": base64.b64encode(text.encode()).decode()}

    launcher.diagnose = lambda cluster, node: console_tail(cluster, node, client=Console())
    run_id = new_run_id()
    # SSH opened to someone else: the program declares 203.0.113.7/32, so the caller is dropped
    spec = ClusterSpec(cloud="aws", nodes=2, name="e2e", region="us-east-1", instance_type="g5.xlarge",
                       ssh_cidr="203.0.113.7/32", gpus_per_node=1, run_id=run_id)
    validate(spec)
    ledger = Ledger(home / "ledger.sqlite3")
    job = JobSpec(run_id=run_id, workload="digits", workload_args=("--epochs", "1"), threads_per_proc=1,
                  rdzv_port=sshd.free_port())
    outcome = execute(spec, job, backend=backend_of(spec.cloud), ledger=ledger, provider=provider, launcher=launcher)
    run = ledger.get_run(run_id).to_dict()
    assert ec2.ssh_cidrs == ["203.0.113.7/32"] and ec2.booted == []
    assert outcome.status == "failed"
    assert "node 0 (" in run["failure"] and "node 1 (" in run["failure"]
    assert "not ready after 12 s; last seen: cannot connect over ssh" in run["failure"]
    assert "i-0000000000000000a" in run["failure"]
    assert ("console output of i-0000000000000000a (last 2 lines): [   12.1] cloud-init[901]: sshd: no hostkeys "
            "available | ci-info: i-0000000000000000a up") in run["failure"]
    assert sorted(asked) == [("i-0000000000000000a", True), ("i-0000000000000000b", True)]
    assert run["teardown_verified"] is True and set(found) == {"e2e"}
