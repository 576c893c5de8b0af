"""The nodes' root volume size: the one the user gave, else sized for the image.

- EC2 refuses a root volume smaller than the image's root snapshot: RunInstances answers
  `InvalidBlockDeviceMapping` "Volume of size 50GB is smaller than snapshot 'snap-...', expect size >=
  75GB" (EBS User Guide, "Create a volume from a snapshot": the volume must be at least the snapshot's
  size). The snapshot size is what DescribeImages says of the root device
  (`BlockDeviceMappings[RootDeviceName].Ebs.VolumeSize`; the Pulumi program reads the same field of
  `aws.ec2.get_ami`).
- The GPU DLAMIs' root snapshots are about 75 GB today (FACTS.md, issue 42; public launch logs quote
  "expect size >= 75GB"); the default of 100 GB leaves them 25 GB free for the run folder, pip and the
  checkpoints. A default that stayed 100 GB whatever the image would fail a launch of an image whose
  snapshot grew past it, and leave no room on one that grew near it: so the default is
  max(DEFAULT_DISK_GB, snapshot + HEADROOM_GB), the same 25 GB free as today's DLAMI has.
- Datasets of the P shapes do not need a bigger root: the DLAMI mounts the instance store (p4d/p4de:
  8 x 1,000 GB NVMe; p5/p5e/p5en/p6-b200: 8 x 3,800 GB; moto 5.2.5's DescribeInstanceTypes dump,
  InstanceStorageInfo) at /opt/dlami/nvme (DLAMI developer guide, FACTS.md). So one rule for every family.
- A size the user gave (`--disk-gb`, `gpucluster:diskGb`, task file `resources.disk_gb`) is never raised:
  one below the snapshot is refused by the preflight before anything is created (preflight.py).
"""

from __future__ import annotations

from typing import Sequence

from gpucluster.spec import DEFAULT_DISK_GB
from gpucluster.states import JsonMapping

# the fleet's tag holding the nodes' root size, for the cost records (engine.resource_detail)
ROOT_GB_TAG = "gpucluster-root-gb"
HEADROOM_GB = 25  # free space on the root above the image: today's default over today's DLAMI snapshot


def root_disk_gb(given: int | None, snapshot_gb: int | None) -> int:
    """The root volume in GB: `given` when the user gave one, else the default sized for the image."""
    if given is not None:
        return int(given)
    return max(DEFAULT_DISK_GB, (snapshot_gb or 0) + HEADROOM_GB) if snapshot_gb else DEFAULT_DISK_GB


def snapshot_gb(root_device: str | None, mappings: Sequence[JsonMapping]) -> int | None:
    """The root snapshot's size from DescribeImages' BlockDeviceMappings (boto3 keys), None if unknown."""
    for m in mappings:
        ebs = m.get("Ebs") or {}
        if m.get("DeviceName") == root_device and ebs.get("VolumeSize"):
            return int(ebs["VolumeSize"])
    return None


def why(given: int | None, snapshot: int | None) -> str:
    """How the size was chosen, for the preflight's line and the dry run."""
    if given is not None:
        return "given"
    if snapshot is None:
        return f"default {DEFAULT_DISK_GB} GB (root snapshot size unknown)"
    return f"default: max({DEFAULT_DISK_GB}, root snapshot {snapshot} + {HEADROOM_GB})"
