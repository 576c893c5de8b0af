"""Issue 42: the nodes' root volume is sized for the image unless the user gave a size.

EC2 refuses a root volume smaller than the image's root snapshot (InvalidBlockDeviceMapping "Volume of
size 50GB is smaller than snapshot ..., expect size >= 75GB"; EBS User Guide, "Create a volume from a
snapshot"; tests/test_aws_root_disk.py models it end to end). So the default is not a fixed 100 GB but
max(100, the snapshot that `aws.ec2.get_ami` reports + 25) (infra/aws/rootdisk.py), read by the REAL
program under Pulumi's mock runtime here, whose DLAMI has a 75 GB root snapshot like the real ones. A
size the user gave is used as given: below the snapshot the preflight refuses it before anything is
made (tests/test_aws_preflight.py). The fleet carries the size in a tag, for the cost records.
"""

from __future__ import annotations

import pytest

pytest.importorskip("pulumi_aws")

from gpucluster.infra.aws import mock_runtime  # noqa: E402
from gpucluster.infra.aws.mock_runtime import build  # noqa: E402
from gpucluster.infra.aws.rootdisk import root_disk_gb  # noqa: E402
from gpucluster.spec import ClusterSpec  # noqa: E402

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def _root(snapshot_gb: int, monkeypatch, **kw) -> tuple[int, str]:
    monkeypatch.setattr(mock_runtime, "MOCK_AMI_SNAPSHOT_GB", snapshot_gb)
    built = build(ClusterSpec(cloud="aws", nodes=2, name="rd", region="us-east-1", instance_type="g5.xlarge",
                              ssh_cidr="203.0.113.7/32", **kw))
    assert built.error is None
    (lt,) = built.recorder.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    fleet = built.recorder.fleet()
    return lt.inputs["blockDeviceMappings"][0]["ebs"]["volumeSize"], fleet.inputs["tags"]["gpucluster-root-gb"]


def test_the_default_root_follows_the_images_snapshot(monkeypatch):
    assert _root(75, monkeypatch) == (100, "100")  # today's DLAMI: the default as it always was
    assert _root(90, monkeypatch) == (115, "115")  # a grown image keeps its 25 GB free instead of failing


def test_a_given_size_is_used_as_given_never_raised(monkeypatch):
    assert _root(90, monkeypatch, disk_gb=80) == (80, "80")  # the preflight refuses it, the program does not hide it
    assert _root(75, monkeypatch, disk_gb=500) == (500, "500")


def test_the_rule():
    assert root_disk_gb(None, None) == 100 and root_disk_gb(None, 30) == 100 and root_disk_gb(None, 76) == 101
    assert root_disk_gb(40, 75) == 40
