"""Issue 42: a root volume smaller than the image's root snapshot, as EC2 treats it.

EC2 refuses it (InvalidBlockDeviceMapping, "Volume of size 50GB is smaller than snapshot 'snap-...', expect
size >= 75GB"; EBS User Guide, "Create a volume from a snapshot"; the GPU DLAMIs' snapshots are about 75 GB
as public launch logs quote them): the instant fleet launches nothing and lists that error. The EC2 that
keeps time (tests/ec2_timed.py) now does the same; before, it launched the nodes whatever the volume
size, so a program that asked for too small a disk passed here and failed in AWS. The preflight refuses
the same spec before anything is made, from DescribeImages (tests/test_aws_preflight.py), so this is the
cloud's own refusal, checked end to end through the real provider: one line naming the code, the sizes
and the snapshot, and what the attempt made destroyed.
"""

from __future__ import annotations

import pytest

pytest.importorskip("moto")
pytest.importorskip("pulumi_aws")

from aws_account import REGION, _Quiet, _spec, accounts  # noqa: E402

from gpucluster.errors import ProvisionError  # noqa: E402

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

DLAMI_SNAPSHOT = ("snap-0dlami0000075", 75)  # what DescribeImages says of a GPU DLAMI's root device (moto has none)


@pytest.fixture
def account(home, monkeypatch):
    yield from accounts(monkeypatch, 100.0)


def _left(account) -> tuple[list[str], list[str]]:
    ec2 = account.session.client("ec2", region_name=REGION)
    live = [i["InstanceId"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
            if i["State"]["Name"] not in ("terminated", "shutting-down")]
    vpcs = [v["VpcId"] for v in ec2.describe_vpcs()["Vpcs"] if not v["IsDefault"]]
    return live, vpcs


def test_a_root_volume_below_the_images_snapshot_launches_nothing_and_says_why(account):
    account.timed.images["ami-12c6146b"] = DLAMI_SNAPSHOT  # the image the applied program launches
    with pytest.raises(ProvisionError) as err:
        account.provider().up(_spec("rd42", disk_gb=50), _Quiet())
    msg = str(err.value)
    assert "InvalidBlockDeviceMapping: Volume of size 50GB is smaller than snapshot 'snap-0dlami0000075', " \
           "expect size >= 75GB" in msg, msg
    assert "\n" not in msg and "has been destroyed" in msg
    assert ("CreateFleet", ) == tuple({r[0] for r in account.timed.refused if r[2] == "InvalidBlockDeviceMapping"})
    assert _left(account) == ([], [])  # no node ever launched; the network the attempt made is gone


def test_a_root_volume_of_the_snapshots_size_launches(account):
    account.timed.images["ami-12c6146b"] = DLAMI_SNAPSHOT
    result = account.provider().up(_spec("rd43", disk_gb=75), _Quiet())
    assert len(result.nodes) == 2
    assert not [r for r in account.timed.refused if r[2] == "InvalidBlockDeviceMapping"]
