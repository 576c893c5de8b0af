"""The ssh backend without a server: host parsing, the provider, what gets shipped and how.

The runs against real sshd servers are in test_ssh_sshd.py.
"""

from __future__ import annotations

import io
import tarfile

import pytest

from gpucluster.errors import ConfigError, LaunchError, SpecError
from gpucluster.domain import Node, NullEvents, Provider
from gpucluster.infra.ssh.provider import SshProvider, format_host, parse_host, parse_hosts
from gpucluster.watch.launch import JobSpec
from gpucluster.spec import ClusterSpec
from specs import validate
from gpucluster.infra.ssh.launch import SshLauncher
from gpucluster.infra.ssh.session import gpu_row, node_label
from gpucluster.infra.ssh.ship import bundle, check_run_id, user_program

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("ubuntu@10.0.0.5", ("ubuntu", "10.0.0.5", 22)),
        ("ubuntu@10.0.0.5:2222", ("ubuntu", "10.0.0.5", 2222)),
        ("gpu-1.example.com", (None, "gpu-1.example.com", 22)),
        ("ec2-user@gpu1:22", ("ec2-user", "gpu1", 22)),
        ("root@[fe80::1]:2200", ("root", "fe80::1", 2200)),
        ("root@fe80::1", ("root", "fe80::1", 22)),
        ("  alice@h  ", ("alice", "h", 22)),
    ],
)
def test_parse_host_accepts(text, expected):
    assert parse_host(text) == expected


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("ubuntu@10.0.0.5:0", "port"),
        ("ubuntu@10.0.0.5:70000", "port"),
        ("ubuntu@host:ssh", "port"),
        ("bad user@host", "user"),
        ("ubuntu@-oProxyCommand=x", "ssh host"),
        ("ubuntu@[10.0.0.1]:22", "IPv6"),
        ("ubuntu@host_name", "ssh host"),
        ("ubuntu@", "ssh host"),
        ("", "ssh host"),
        ("u@999.1.1.1", "ssh host"),
    ],
)
def test_parse_host_refuses_naming_the_value(text, fragment):
    with pytest.raises(SpecError) as exc:
        parse_host(text)
    assert fragment in str(exc.value)
    assert repr(text) in str(exc.value)


def test_parse_hosts_canonical_head_first_and_refuses_repeats_and_empties():
    assert parse_hosts("ubuntu@h1, ubuntu@h2:2222,root@[::1]:22") == ("ubuntu@h1", "ubuntu@h2:2222", "root@::1")
    assert format_host("root", "::1", 2200) == "root@[::1]:2200"
    with pytest.raises(SpecError, match="listed twice"):
        parse_hosts("a@h1,b@H1:22")
    assert parse_hosts("a@h1:22,a@h1:2222") == ("a@h1", "a@h1:2222")  # same machine, two servers
    with pytest.raises(SpecError, match="empty"):
        parse_hosts("a@h1,,a@h2")
    with pytest.raises(SpecError, match="--hosts"):
        parse_hosts(" , ")


def spec(**kw):
    base = dict(cloud="ssh", nodes=2, name="lab", hosts=("ubuntu@10.0.0.5", "ubuntu@gpu2:2222"))
    base.update(kw)
    return ClusterSpec(**base)


def test_provider_up_builds_nodes_head_first_and_creates_nothing():
    created = []

    class Events(NullEvents):
        def resource_requested(self, kind, name, **detail):
            created.append(name)

        def resource_created(self, kind, name, cloud_id=None, **detail):
            created.append(name)

    p = SshProvider()
    assert isinstance(p, Provider)
    cluster = p.up(spec(gpus_per_node=4), Events())
    assert created == []
    assert [n.rank for n in cluster.nodes] == [0, 1]
    assert cluster.head == Node(0, "10.0.0.5", "10.0.0.5", "ubuntu", 22, gpus=4)
    assert cluster.nodes[1].port == 2222 and cluster.nodes[1].private_ip == "gpu2"
    assert cluster.gpus_per_node == 4 and cluster.cloud == "ssh"
    # never brought up here: its hosts are unknown, so nothing could be checked, and it says so
    assert p.leftovers("other", "r1").verdict == "not verified"
    p.down("lab", NullEvents())
    p.down("lab", NullEvents())  # idempotent


def test_private_ips_option():
    cluster = SshProvider().up(spec(options=(("private_ips", "192.168.0.1, 192.168.0.2"),)), NullEvents())
    assert cluster.node_ips == ["192.168.0.1", "192.168.0.2"]
    assert cluster.head.host == "10.0.0.5"
    with pytest.raises(SpecError, match="one address per host"):
        SshProvider().up(spec(options=(("private_ips", "192.168.0.1"),)), NullEvents())
    with pytest.raises(SpecError, match="'not an ip!'"):
        SshProvider().up(spec(options=(("private_ips", "192.168.0.1,not an ip!"),)), NullEvents())


def test_validate_dispatches_to_the_ssh_checks():
    warnings = validate(spec(gpus_per_node=1))
    assert warnings == []
    assert any("GPU" in w for w in validate(spec()))
    assert any("instance_type is ignored" in w for w in validate(spec(instance_type="g5.xlarge", gpus_per_node=1)))
    with pytest.raises(SpecError, match="does not match the 2 ssh host"):
        validate(spec(nodes=3))
    with pytest.raises(SpecError, match="needs --hosts"):
        validate(spec(hosts=()))
    with pytest.raises(SpecError, match='did you mean "private_ips"'):
        validate(spec(options=(("private_ip", "1.2.3.4"),)))


def test_user_program_ships_the_scripts_folder(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    monkeypatch.chdir(tmp_path)
    d, prog = user_program(JobSpec("r1", command=("python", "train.py", "--epochs", "3")))
    assert d == tmp_path and prog == ["train.py", "--epochs", "3"]
    d, prog = user_program(JobSpec("r1", command=("python3", str(tmp_path / "train.py"))))
    assert d == tmp_path and prog == ["train.py"]
    d, prog = user_program(JobSpec("r1", command=("./run.sh", "x")))
    assert d == tmp_path and prog == ["--no-python", "./run.sh", "x"]
    d, prog = user_program(JobSpec("r1", command=("python", "-u", "train.py", "-x")), "/opt/py/bin/python")
    assert d == tmp_path and prog == ["--no-python", "/opt/py/bin/python", "-u", "train.py", "-x"]
    d, prog = user_program(JobSpec("r1", command=("bash", "run.sh")))
    assert d == tmp_path and prog == ["--no-python", "bash", "run.sh"]
    assert user_program(JobSpec("r1", command=("python", "-u", "-m", "pkg")), "py3") == (
        None, ["--no-python", "py3", "-u", "-m", "pkg"])
    assert user_program(JobSpec("r1", command=("nvidia-smi",))) == (None, ["--no-python", "nvidia-smi"])
    d, prog = user_program(JobSpec("r1", command=("/usr/bin/python3", "-u", "train.py")), "/opt/py/bin/python")
    assert d == tmp_path and prog == ["--no-python", "/opt/py/bin/python", "-u", "train.py"]
    assert user_program(JobSpec("r1", command=("python", "-m", "pkg.train"))) == (None, None)
    assert user_program(JobSpec("r1", command=("python", "missing.py"))) == (None, None)  # a path on the node
    assert user_program(JobSpec("r1", workload="digits")) == (None, None)
    # an option's value is not the script: `python -X faulthandler train.py` still ships train.py
    d, prog = user_program(JobSpec("r1", command=("python", "-X", "faulthandler", "-W", "ignore", "train.py")), "py3")
    assert d == tmp_path and prog == ["--no-python", "py3", "-X", "faulthandler", "-W", "ignore", "train.py"]


def test_bundle_holds_workloads_and_code_without_vcs_or_caches(tmp_path):
    (tmp_path / "train.py").write_text("x = 1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "data.txt").write_text("d\n")
    for junk in (".git", "__pycache__", ".venv"):
        (tmp_path / junk).mkdir()
        (tmp_path / junk / "f").write_text("junk\n")
    names = tarfile.open(fileobj=io.BytesIO(bundle(tmp_path))).getnames()
    assert "workloads/protocol.py" in names and "workloads/__init__.py" in names
    assert "code/train.py" in names and "code/sub/data.txt" in names
    assert not any(n.startswith(("code/.git", "code/__pycache__", "code/.venv")) for n in names)
    names = tarfile.open(fileobj=io.BytesIO(bundle(None))).getnames()
    assert not any(n.startswith("code/") for n in names)


def test_run_ids_and_options_are_checked():
    check_run_id("r20261122-031500-ab12cd")
    for bad in ("../x", "a b", "", ".hidden", "x;rm -rf ~"):
        with pytest.raises(LaunchError, match="run id"):
            check_run_id(bad)
    with pytest.raises(ConfigError, match="Key=Value"):
        SshLauncher(ssh_options=("-oProxyCommand=evil",))
    with pytest.raises(ConfigError, match="host key checking"):
        SshLauncher(ssh_options=("StrictHostKeyChecking=no",))
    assert SshLauncher(ssh_options=("ProxyJump=bastion",)).ssh_options == ("ProxyJump=bastion",)
    with pytest.raises(ConfigError, match="remote python"):
        SshLauncher(python="python3 -c evil")
    assert node_label(Node(0, "h", "h", "u", 2222)) == "u@h:2222"
    assert node_label(Node(0, "::1", "::1", None, 2222)) == "[::1]:2222"


def test_missing_files_are_config_errors(tmp_path):
    from gpucluster.domain import Cluster

    cluster = Cluster("c", "ssh", (Node(0, "127.0.0.1", "127.0.0.1", "u", 1),))
    with pytest.raises(ConfigError, match="known_hosts file"):
        SshLauncher(known_hosts=str(tmp_path / "nope")).probe(cluster)
    with pytest.raises(ConfigError, match="identity file"):
        SshLauncher(identity=str(tmp_path / "nope")).probe(cluster)


def test_missing_ssh_client_is_a_clear_error():
    from gpucluster.errors import MissingDependency
    from gpucluster.domain import Cluster

    cluster = Cluster("c", "ssh", (Node(0, "127.0.0.1", "127.0.0.1", "u", 1),))
    with pytest.raises(MissingDependency, match="OpenSSH client 'no-such-ssh'"):
        SshLauncher(ssh="no-such-ssh").probe(cluster)


def test_gpu_rows_from_nvidia_smi():
    assert gpu_row("Tesla V100-SXM2-16GB, 0, 0, 16384") == {
        "name": "Tesla V100-SXM2-16GB", "util": 0.0, "mem_used_mib": 0.0, "mem_total_mib": 16384.0}
    assert gpu_row("NVIDIA A10G, [N/A], 5, 23028")["util"] is None
    assert gpu_row("Some GPU") == {"name": "Some GPU"}


def test_hosts_given_are_one_node_each_and_a_bad_list_is_refused_first(home):
    """`--hosts` (`prepare.given_hosts`): the node count defaults to the hosts given, the spec records them in
    their one form (ssh's `resolve`), and a missing or bad list is refused by ssh's `validate` with the text as
    given, before any other flag is checked (a bad name, `--gpu`)."""
    from gpucluster.errors import UsageError
    from gpucluster.infra.registry import plugin
    from gpucluster.lifecycle.prepare import Request, prepare

    ssh = plugin("ssh")
    plan = prepare(Request(cloud="ssh", hosts=" u@h1, u@h2:22 ", job=False), ssh)
    assert (plan.spec.nodes, plan.spec.hosts) == (2, ("u@h1", "u@h2"))
    for hosts, other, said in [
        (None, {}, "the ssh backend needs --hosts user@host1,user@host2[:port] (head first)"),
        ("", {"gpu": "L4:1"}, "the ssh backend needs --hosts user@host1,user@host2[:port] (head first)"),
        ("a,,b", {"name": "BAD"}, "--hosts 'a,,b' is not allowed: no empty entries between commas"),
        ("a,a", {"nodes": 99}, "ssh host 'a' is listed twice (as 'a' too); each node must be a different host or port"),
    ]:
        with pytest.raises(UsageError) as caught:
            prepare(Request(cloud="ssh", hosts=hosts, job=False, **other), ssh)
        assert caught.value.message == said and caught.value.exit_code == 2
    with pytest.raises(UsageError, match="does not match the 2 ssh host"):
        prepare(Request(cloud="ssh", hosts="a,b", nodes=3, job=False), ssh)
