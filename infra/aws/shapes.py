"""EC2 GPU shapes: the instance types gpucluster can create, by GPU, with the zones offering them.

Shipped data, no SDK. Sources, read 2026-11-28:

- Instance facts (GPU name, count and memory per GPU as the driver reports it, vCPUs, memory, the
  most EFA interfaces, network performance): the EC2 DescribeInstanceTypes dump bundled in moto
  5.2.5 (`moto/ec2/resources/instance_types.json.gz`); they agree with SkyPilot's catalog
  (skypilot-org/skypilot-catalog catalogs/v8/aws/vms.csv, read 2026-11-28). moto names the p4de GPU
  "A100" with 81920 MiB: it is the A100 80 GB (`A100-80GB` here).
- Zones per region: the DescribeInstanceTypeOfferings dumps (LocationType availability-zone) bundled
  in moto 5.2.5 (`moto/ec2/resources/instance_type_offerings/availability-zone/*.json.gz`), as zone
  letters. Offerings change and differ per account: the fleet's zone failover stays inside these
  zones, and a region not listed is refused unless option allowUnlistedRegion=true.
- Quota classes: EC2 counts "Running On-Demand G and VT instances" (L-DB2E81BA) and "All G and VT
  Spot Instance Requests" (L-3819A6DF) for g*, "Running On-Demand P instances" (L-417A185B) and "All
  P Spot Instance Requests" (L-7212CCBC) for p*, all in vCPUs (EC2 User Guide, "Amazon EC2 instance
  type quotas", https://docs.aws.amazon.com/ec2/latest/instancetypes/ec2-instance-quotas.html).
- Images: the DLAMI "Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.x" release notes list G5,
  G6, G6e, P4d, P4de, P5, P5e, P5en and P6-B200 among the supported instances (AWS DLAMI developer
  guide, release notes, https://docs.aws.amazon.com/dlami/latest/devguide/appendix-ami-release-notes.html).
- EFA: the P shapes are made for multi-node training over EFA (p4d/p4de 4, p5/p5e 32, p5en 16,
  p6-b200 8 interfaces, one per network card); `efa_default` turns EFA on for them, on every card
  (efa.py: then an Elastic IP per node).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from gpucluster.catalog.gpus import GPUS

SOURCE = "moto 5.2.5 bundled EC2 DescribeInstanceTypes/DescribeInstanceTypeOfferings data"
SOURCE_DATE = "2026-11-28"

# region -> zone letters, per family (p5.4xlarge is offered in fewer zones than p5.48xlarge)
ZONES: dict[str, dict[str, str]] = {
    'g5': {
        'ap-east-1': 'ab', 'ap-northeast-1': 'ac', 'ap-northeast-2': 'acd', 'ap-south-1': 'ab',
        'ap-southeast-2': 'bc', 'ap-southeast-3': 'ac', 'ca-central-1': 'ab', 'eu-central-1': 'abc',
        'eu-north-1': 'bc', 'eu-south-2': 'abc', 'eu-west-1': 'abc', 'eu-west-2': 'ab', 'eu-west-3': 'abc',
        'il-central-1': 'abc', 'me-central-1': 'ab', 'sa-east-1': 'ab', 'us-east-1': 'abcdf', 'us-east-2': 'abc',
        'us-west-2': 'abc',
    },
    'g6': {
        'ap-northeast-1': 'ac', 'ap-northeast-2': 'acd', 'ap-south-1': 'ab', 'ap-south-2': 'ab',
        'ap-southeast-2': 'abc', 'ap-southeast-5': 'ab', 'ca-central-1': 'abd', 'eu-central-1': 'abc',
        'eu-central-2': 'bc', 'eu-north-1': 'ab', 'eu-south-2': 'abc', 'eu-west-2': 'abc', 'eu-west-3': 'bc',
        'me-central-1': 'ab', 'sa-east-1': 'ab', 'us-east-1': 'abcdf', 'us-east-2': 'abc', 'us-west-2': 'abcd',
    },
    'g6e': {
        'ap-northeast-1': 'ac', 'ap-northeast-2': 'ab', 'ap-northeast-3': 'bc', 'ap-south-1': 'ab',
        'ap-south-2': 'ab', 'eu-central-1': 'abc', 'eu-north-1': 'ab', 'eu-south-2': 'bc', 'me-central-1': 'ab',
        'us-east-1': 'abcd', 'us-east-2': 'abc', 'us-west-2': 'abcd',
    },
    'p4d': {
        'ap-northeast-1': 'ac', 'ap-northeast-2': 'bd', 'ap-south-1': 'abc', 'ap-southeast-2': 'bc',
        'ca-central-1': 'ab', 'eu-central-1': 'abc', 'eu-north-1': 'c', 'eu-west-1': 'c', 'eu-west-2': 'ab',
        'sa-east-1': 'ac', 'us-east-1': 'abcd', 'us-east-2': 'abc', 'us-west-2': 'abcd',
    },
    'p4de': {
        'ap-northeast-1': 'ac', 'ap-southeast-1': 'bc', 'eu-central-1': 'ac', 'il-central-1': 'abc',
        'us-east-1': 'bc', 'us-west-2': 'abc',
    },
    'p5': {
        'ap-northeast-1': 'ac', 'ap-northeast-2': 'a', 'ap-south-1': 'abc', 'ap-southeast-2': 'abc',
        'ap-southeast-3': 'a', 'ca-central-1': 'd', 'eu-north-1': 'abc', 'eu-west-2': 'abc', 'sa-east-1': 'c',
        'us-east-1': 'abcdef', 'us-east-2': 'abc', 'us-west-1': 'ab', 'us-west-2': 'abcd',
    },
    'p5.4xlarge': {
        'ap-northeast-1': 'c', 'ap-south-1': 'abc', 'ap-southeast-2': 'a', 'ap-southeast-3': 'a',
        'eu-north-1': 'abc', 'eu-west-2': 'abc', 'sa-east-1': 'c', 'us-east-1': 'abcdef', 'us-east-2': 'abc',
        'us-west-2': 'abcd',
    },
    'p5e': {
        'ap-southeast-2': 'a', 'ap-southeast-3': 'ac', 'eu-north-1': 'a', 'eu-west-2': 'a', 'sa-east-1': 'bc',
        'us-east-2': 'abc', 'us-west-2': 'c',
    },
    'p5en': {
        'ap-northeast-1': 'a', 'ap-northeast-2': 'a', 'ap-south-1': 'ab', 'ap-southeast-3': 'bc',
        'eu-north-1': 'ac', 'eu-south-2': 'ab', 'me-central-1': 'ac', 'us-east-1': 'ac', 'us-east-2': 'abc',
        'us-west-1': 'b', 'us-west-2': 'acd',
    },
    'p6-b200': {
        'ap-south-1': 'c', 'ap-south-2': 'b', 'eu-north-1': 'b', 'eu-west-3': 'a', 'us-east-1': 'c',
        'us-east-2': 'abc', 'us-west-2': 'abd',
    },
}


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpus: int
    gpu_memory_mib: int  # per GPU, as the driver reports it
    vcpus: int
    memory_gib: int
    efa: bool
    network: str
    regions: tuple[str, ...] = ()
    gpu_model: str = "A10G"
    efa_interfaces: int = 0  # the most EFA interfaces (one per network card)
    zones: Mapping[str, str] = field(default_factory=dict)  # region -> zone letters

    @property
    def total_gpu_memory_mib(self) -> int:
        return self.gpus * self.gpu_memory_mib

    @property
    def family(self) -> str:
        return self.name.split(".")[0]

    @property
    def quota_class(self) -> str:
        """'P' (the P-instance quotas) or 'G' (G and VT)."""
        return "P" if self.family.startswith("p") else "G"

    @property
    def efa_default(self) -> bool:
        """EFA on unless the stack says otherwise: the multi-node P shapes are made for it."""
        return self.quota_class == "P" and self.efa_interfaces > 1

    def zones_in(self, region: str) -> tuple[str, ...]:
        return tuple(region + letter for letter in self.zones.get(region, ""))


def _t(name: str, gpu: str, count: int, mib: int, vcpus: int, gib: int, efa: int, network: str,
       zone_key: str) -> InstanceType:
    model = "A100-80GB" if gpu == "A100" and mib > 40960 else gpu
    assert model in GPUS, model
    zones = ZONES[zone_key]
    return InstanceType(name, count, mib, vcpus, gib, efa > 0, network, tuple(sorted(zones)), model, efa, zones)


INSTANCE_TYPES: dict[str, InstanceType] = {
    t.name: t
    for t in (
    _t('g5.xlarge', 'A10G', 1, 22888, 4, 16, 0, 'Up to 10 Gigabit', 'g5'),
    _t('g5.2xlarge', 'A10G', 1, 22888, 8, 32, 0, 'Up to 10 Gigabit', 'g5'),
    _t('g5.4xlarge', 'A10G', 1, 22888, 16, 64, 0, 'Up to 25 Gigabit', 'g5'),
    _t('g5.8xlarge', 'A10G', 1, 22888, 32, 128, 1, '25 Gigabit', 'g5'),
    _t('g5.12xlarge', 'A10G', 4, 22888, 48, 192, 1, '40 Gigabit', 'g5'),
    _t('g5.16xlarge', 'A10G', 1, 22888, 64, 256, 1, '25 Gigabit', 'g5'),
    _t('g5.24xlarge', 'A10G', 4, 22888, 96, 384, 1, '50 Gigabit', 'g5'),
    _t('g5.48xlarge', 'A10G', 8, 22888, 192, 768, 1, '100 Gigabit', 'g5'),
    _t('g6.xlarge', 'L4', 1, 22888, 4, 16, 0, 'Up to 10 Gigabit', 'g6'),
    _t('g6.2xlarge', 'L4', 1, 22888, 8, 32, 0, 'Up to 10 Gigabit', 'g6'),
    _t('g6.4xlarge', 'L4', 1, 22888, 16, 64, 0, 'Up to 25 Gigabit', 'g6'),
    _t('g6.8xlarge', 'L4', 1, 22888, 32, 128, 1, '25 Gigabit', 'g6'),
    _t('g6.12xlarge', 'L4', 4, 22888, 48, 192, 1, '40 Gigabit', 'g6'),
    _t('g6.16xlarge', 'L4', 1, 22888, 64, 256, 1, '25 Gigabit', 'g6'),
    _t('g6.24xlarge', 'L4', 4, 22888, 96, 384, 1, '50 Gigabit', 'g6'),
    _t('g6.48xlarge', 'L4', 8, 22888, 192, 768, 1, '100 Gigabit', 'g6'),
    _t('g6e.xlarge', 'L40S', 1, 45776, 4, 32, 0, 'Up to 20 Gigabit', 'g6e'),
    _t('g6e.2xlarge', 'L40S', 1, 45776, 8, 64, 0, 'Up to 20 Gigabit', 'g6e'),
    _t('g6e.4xlarge', 'L40S', 1, 45776, 16, 128, 0, '20 Gigabit', 'g6e'),
    _t('g6e.8xlarge', 'L40S', 1, 45776, 32, 256, 1, '25 Gigabit', 'g6e'),
    _t('g6e.12xlarge', 'L40S', 4, 45776, 48, 384, 1, '100 Gigabit', 'g6e'),
    _t('g6e.16xlarge', 'L40S', 1, 45776, 64, 512, 1, '35 Gigabit', 'g6e'),
    _t('g6e.24xlarge', 'L40S', 4, 45776, 96, 768, 2, '200 Gigabit', 'g6e'),
    _t('g6e.48xlarge', 'L40S', 8, 45776, 192, 1536, 4, '400 Gigabit', 'g6e'),
    _t('p4d.24xlarge', 'A100', 8, 40960, 96, 1152, 4, '4x 100 Gigabit', 'p4d'),
    _t('p4de.24xlarge', 'A100', 8, 81920, 96, 1152, 4, '4x 100 Gigabit', 'p4de'),
    _t('p5.4xlarge', 'H100', 1, 81920, 16, 256, 1, '100 Gigabit', 'p5.4xlarge'),
    _t('p5.48xlarge', 'H100', 8, 81920, 192, 2048, 32, '3200 Gigabit', 'p5'),
    _t('p5e.48xlarge', 'H200', 8, 144384, 192, 2048, 32, '3200 Gigabit', 'p5e'),
    _t('p5en.48xlarge', 'H200', 8, 144384, 192, 2048, 16, '3200 Gigabit', 'p5en'),
    _t('p6-b200.48xlarge', 'B200', 8, 183359, 192, 2048, 8, '3200 Gigabit', 'p6-b200'),
    )
}


def shapes_for(gpu: str, count: int | None = None) -> list[InstanceType]:
    """Every type carrying `gpu` (canonical name), with exactly `count` of them when given."""
    return [t for t in INSTANCE_TYPES.values() if t.gpu_model == gpu and (count is None or t.gpus == count)]


def gpu_shapes() -> list[dict[str, object]]:
    """`SpecRules.gpu_shapes`: every type, as `--gpu` chooses among them (all on demand)."""
    return [{"machine": t.name, "gpu": t.gpu_model, "gpus": t.gpus, "regions": t.regions, "on_demand": True}
            for t in INSTANCE_TYPES.values()]
