"""The DLAMI releases the program takes, and the idle watcher's test of a logged-in user (issue 40 item 11).

Ubuntu 26.04's OpenSSH (9.8 and later) runs each session as `sshd-session`, whose process title is
"sshd-session: USER@pts/0" (OpenSSH 9.8 release notes, 2024-07-01: "the sshd(8) binary is split
... sshd-session"); older releases title it "sshd: USER@pts/0". The AMI filter no longer takes an
unchecked Ubuntu release ("Ubuntu 2?.04" matched 26.04 too), and the watcher sees both titles.
"""

from __future__ import annotations

import fnmatch
import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

ROOT = Path(__file__).resolve().parent.parent


def _idle_module():
    spec = importlib.util.spec_from_file_location("node_idle", ROOT / "infra" / "aws" / "node_idle.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _proc(tmp_path: Path, *titles: bytes) -> Path:
    """A /proc with one process per title (its cmdline as the kernel shows a set title: NUL-ended)."""
    proc = tmp_path / "proc"
    for pid, title in enumerate(titles, start=100):
        d = proc / str(pid)
        d.mkdir(parents=True)
        (d / "cmdline").write_bytes(title + b"\0")
        (d / "environ").write_bytes(b"PATH=/usr/bin\0")
    return proc


@pytest.mark.parametrize("title", [b"sshd: ubuntu@pts/0", b"sshd: ubuntu@notty",
                                   b"sshd-session: ubuntu@pts/0", b"sshd-session: ubuntu@notty"])
def test_a_logged_in_user_counts_whatever_the_openssh_version(tmp_path, title):
    idle = _idle_module()
    proc = _proc(tmp_path, b"sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups", title)
    assert idle.job_running(str(proc), me=1, ssh_sessions=True) is True
    assert idle.job_running(str(proc), me=1, ssh_sessions=False) is False


@pytest.mark.parametrize("title", [b"sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups",
                                   b"sshd-session: ubuntu [priv]", b"sshd: ubuntu [priv]", b"sshd-auth: ubuntu [net]",
                                   b"/usr/bin/python3 -m http.server", b"sshd-session-helper: x@y"])
def test_the_listener_and_sessions_still_authenticating_do_not_count(tmp_path, title):
    idle = _idle_module()
    assert idle.job_running(str(_proc(tmp_path, title)), me=1, ssh_sessions=True) is False


def test_the_ami_filter_takes_only_the_checked_ubuntu_releases():
    from gpucluster.infra.aws import catalog
    from gpucluster.spec import ClusterSpec

    spec = ClusterSpec(cloud="aws", nodes=1, name="img40", region="us-east-1", instance_type="g5.xlarge")
    patterns = catalog.ami_name_patterns(spec)

    def takes(name: str) -> bool:  # EC2's name filter: * and ? wildcards, any value matches
        return any(fnmatch.fnmatchcase(name, p) for p in patterns)

    assert takes("Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.7 (Ubuntu 22.04) 20261120")
    assert takes("Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.8 (Ubuntu 24.04) 20261120")
    assert not takes("Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.9 (Ubuntu 26.04) 20270501")
    assert not takes("Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.9 (Ubuntu 20.04) 20240501")
