"""GKE GPU node shapes: every (machine type, GPU, count) gpucluster can put in a GPU pool, with the
zones offering it, its GKE accelerator name and its quota metrics.

Shipped data, no SDK. Sources, read 2026-11-28:

- Machine shapes (vCPUs, memory in GB, GPUs attached): Google Cloud docs, "GPU machine types"
  (https://cloud.google.com/compute/docs/gpus) and "Accelerator-optimized machine family"
  (https://cloud.google.com/compute/docs/accelerator-optimized-machines): G2 (L4), A2 highgpu (A100
  40 GB), A2 ultragpu (A100 80 GB), A3 highgpu (H100 80 GB), A3 ultragpu (H200 141 GB); N1 hosts with
  attached T4 or V100 (the N1 table's per-count limits). They agree with SkyPilot's catalog
  (skypilot-org/skypilot-catalog catalogs/v8/gcp/vms.csv), whose rows give the zones below.
- A3 highgpu 1g/2g/4g are offered as Spot VMs or through flex-start (DWS) only, not on demand (the
  accelerator-optimized machines page, A3 High "a3-highgpu-1g, -2g, -4g: only with Spot VMs or
  Flex-start VMs"): `on_demand=False` refuses them without --spot, with that reason.
- Quota metrics (Compute `regions.get` quotas[], per GPU, PREEMPTIBLE_ for spot): the Compute v1
  `Quota.Metric` enum (NVIDIA_T4_GPUS, NVIDIA_V100_GPUS, NVIDIA_L4_GPUS, NVIDIA_A100_GPUS,
  NVIDIA_A100_80GB_GPUS, NVIDIA_H100_GPUS; https://cloud.google.com/compute/docs/reference/rest/v1/regions).
  The enum has no H200 value as read: NVIDIA_H200_GPUS is the name the Cloud Quotas console shows;
  a region whose quotas[] lacks it reports the check as not done (preflight), never as passed.
- vCPU quota per machine family (regions.get quotas[]): N1 and E2 draw on the regional `CPUS`; the
  other series each on their own family metric, A2 on `A2_CPUS` (the Compute v1 `Quota.Metric` enum:
  CPUS "Guest CPUs", A2_CPUS, N2_CPUS, E2_CPUS, ...; GoogleCloudPlatform/gcpdiag
  gcpdiag/lint/gce/warn_2022_005_cpu_quota.py checks compute.googleapis.com/cpus beside a2_cpus,
  n2_cpus, ...; Cloud Quotas terminology, "CPUS-PER-VM-FAMILY-per-project-region": "the number of
  Compute Engine vCPUs available to your project for a specific VM family in a particular region").
  G2 and A3 draw on `G2_CPUS` and `A3_CPUS`: the names regions.get lists for them (the v1 enum as
  read stops at A2 and C3, as it lacks NVIDIA_H200_GPUS); a region that does not list the family's
  metric is reported as not checked, never as passed (preflight).
- Boot disk types per series (the node pool's `disk_type`; Google Cloud docs, accelerator-optimized
  machines, each series' "Supported disk types", and general-purpose machines for N1; as recalled
  2026-11-28: the page bodies could not be read from here, see docs/gcp.md): N1 and A2 take pd-standard,
  pd-balanced and pd-ssd; G2 and A3 High no pd-standard (pd-balanced, pd-ssd; A3 High also Hyperdisk
  Balanced); A3 Ultra Hyperdisk only (hyperdisk-balanced: its default here). Hyperdisk Balanced draws on
  the regional HDB_TOTAL_GB quota (the metric Compute Engine names when refusing it: "Quota
  'HDB_TOTAL_GB' exceeded. Limit: 500.0 in region us-central1", as public projects quote it).
- Zones offering each shape: SkyPilot's catalog rows for the machine type (G2, A2, A3) or for the
  GPU (N1 + T4/V100). Offerings differ per project: option `gpuZones` ("us-central1-a,...")
  replaces the list for a stack (`v100Zones`, the older spelling, still works for V100).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpucluster.catalog.gpus import GPUS

SOURCE_DATE = "2026-11-28"


@dataclass(frozen=True)
class Shape:
    name: str  # the node pool's machine type
    gpu_model: str  # gpucluster.catalog.gpus name
    gpus: int
    vcpus: int
    memory_gb: float
    zones: tuple[str, ...]
    on_demand: bool = True  # False: spot or flex-start only

    @property
    def regions(self) -> tuple[str, ...]:
        return tuple(sorted({z.rsplit("-", 1)[0] for z in self.zones}))

    @property
    def family(self) -> str:
        return "n1" if self.name.startswith("n1-") else self.name.split("-")[0]

    @property
    def accelerator(self) -> str:
        return ACCELERATORS[self.gpu_model]

    @property
    def attached(self) -> bool:
        """N1 takes the GPUs as guest accelerators of the chosen count; G2/A2/A3 come with them."""
        return self.family == "n1"


# GKE's accelerator type per GPU (node pool guest_accelerators[].type; the GKE "GPUs" docs)
ACCELERATORS = {"T4": "nvidia-tesla-t4", "V100": "nvidia-tesla-v100", "L4": "nvidia-l4", "A100": "nvidia-tesla-a100",
                "A100-80GB": "nvidia-a100-80gb", "H100": "nvidia-h100-80gb", "H200": "nvidia-h200-141gb"}
# the regional quota metric per GPU; spot VMs draw from PREEMPTIBLE_<metric> where the project has it
QUOTA_METRICS = {"T4": "NVIDIA_T4_GPUS", "V100": "NVIDIA_V100_GPUS", "L4": "NVIDIA_L4_GPUS",
                 "A100": "NVIDIA_A100_GPUS", "A100-80GB": "NVIDIA_A100_80GB_GPUS", "H100": "NVIDIA_H100_GPUS",
                 "H200": "NVIDIA_H200_GPUS"}


# the regional vCPU quota each machine family draws on (see above); any family not named: its own <FAMILY>_CPUS
SHARED_CPU_FAMILIES = ("n1", "e2", "f1", "g1")


def cpu_quota_metric(machine_type: str) -> str:
    """`CPUS` for N1/E2 (and the shared-core f1/g1), `A2_CPUS` for a2-highgpu-8g, `G2_CPUS`, `A3_CPUS`, ..."""
    family = machine_type.split("-", 1)[0].lower()
    return "CPUS" if family in SHARED_CPU_FAMILIES else f"{family.upper()}_CPUS"


# boot disk types a node of each series may have (above); the first one listed that is pd-balanced, else the first
BOOT_DISK_TYPES: dict[str, tuple[str, ...]] = {
    "n1": ("pd-standard", "pd-balanced", "pd-ssd"),
    "a2": ("pd-standard", "pd-balanced", "pd-ssd"),
    "g2": ("pd-balanced", "pd-ssd"),
    "a3-highgpu": ("pd-balanced", "pd-ssd", "hyperdisk-balanced"),
    "a3-ultragpu": ("hyperdisk-balanced",),
}
BOOT_DISK_SOURCE = ("Google Cloud docs, accelerator-optimized machine family, supported disk types "
                    "(https://cloud.google.com/compute/docs/accelerator-optimized-machines)")


def boot_disk_types(machine_type: str) -> tuple[str, ...] | None:
    """The boot disk types of `machine_type`'s series (a3-ultragpu-8g: hyperdisk-balanced only), None if not known."""
    for series in sorted(BOOT_DISK_TYPES, key=len, reverse=True):
        if machine_type == series or machine_type.startswith(series + "-"):
            return BOOT_DISK_TYPES[series]
    return None


def default_boot_disk_type(machine_type: str, fallback: str) -> str:
    """pd-balanced where the series takes it (`fallback`), else the series' first type (A3 Ultra: hyperdisk-balanced)."""
    allowed = boot_disk_types(machine_type)
    return fallback if allowed is None or fallback in allowed else allowed[0]


def _zones(spec: str) -> tuple[str, ...]:
    """'us-central1:abc europe-west4:ab' -> the zone names."""
    return tuple(f"{region}-{z}" for part in spec.split() for region, letters in [part.split(":")] for z in letters)


V100_ZONES = _zones("us-central1:abcf us-east1:bc us-west1:ab europe-west4:abc asia-east1:c")
T4_ZONES = _zones("us-central1:abcf us-east1:bcd us-east4:abc us-west1:ab us-west2:bc us-west3:b us-west4:ab "
                  "europe-west1:bcd europe-west2:ab europe-west3:b europe-west4:abc europe-central2:bc me-west1:bc "
                  "asia-east1:ac asia-east2:ac asia-northeast1:ac asia-northeast3:bc asia-south1:ab asia-southeast1:abc "
                  "asia-southeast2:ab australia-southeast1:ac northamerica-northeast1:c southamerica-east1:abc")
G2_ZONES = _zones("us-central1:abc us-east1:bcd us-east4:ac us-west1:abc us-west4:ac europe-west1:bc europe-west2:ab "
                  "europe-west3:ab europe-west4:abc europe-west6:bc me-central2:ac asia-east1:abc asia-northeast1:abc "
                  "asia-northeast3:ab asia-south1:abc asia-southeast1:abc northamerica-northeast1:bc "
                  "northamerica-northeast2:ab")
A2_HIGH_ZONES = _zones("us-central1:abcf us-east1:b us-west1:b us-west3:b us-west4:b europe-west4:ab me-west1:ac "
                       "asia-northeast1:ac asia-northeast3:ab asia-southeast1:abc")
A2_ULTRA_ZONES = _zones("us-central1:ac us-east4:c us-east5:ab europe-west4:a asia-southeast1:c")
A3_HIGH_ZONES = _zones("us-central1:abc us-east4:abc us-east5:a us-west1:ab us-west4:a europe-west1:bc europe-west3:c "
                       "europe-west4:bc europe-west8:c europe-west9:c europe-north1:c asia-east1:c asia-northeast1:b "
                       "asia-south1:c asia-south2:b asia-southeast1:bc australia-southeast1:c")
A3_ULTRA_ZONES = _zones("us-central1:b us-east4:b us-east5:a us-south1:b us-west1:c europe-west1:b europe-west4:a "
                        "asia-south1:b asia-south2:c")


def _n1(gpu: str, count: int, vcpus: int, zones: tuple[str, ...]) -> Shape:
    return Shape(f"n1-standard-{vcpus}", gpu, count, vcpus, vcpus * 3.75, zones)


SHAPES: tuple[Shape, ...] = (
    # N1 + guest accelerators: the default N1 type per count, 4 vCPUs per GPU (seed 003's starvation lesson)
    _n1("V100", 1, 4, V100_ZONES), _n1("V100", 2, 8, V100_ZONES), _n1("V100", 4, 16, V100_ZONES),
    _n1("V100", 8, 32, V100_ZONES),
    _n1("T4", 1, 4, T4_ZONES), _n1("T4", 2, 8, T4_ZONES), _n1("T4", 4, 16, T4_ZONES),
    Shape("g2-standard-4", "L4", 1, 4, 16, G2_ZONES), Shape("g2-standard-8", "L4", 1, 8, 32, G2_ZONES),
    Shape("g2-standard-12", "L4", 1, 12, 48, G2_ZONES), Shape("g2-standard-16", "L4", 1, 16, 64, G2_ZONES),
    Shape("g2-standard-32", "L4", 1, 32, 128, G2_ZONES), Shape("g2-standard-24", "L4", 2, 24, 96, G2_ZONES),
    Shape("g2-standard-48", "L4", 4, 48, 192, G2_ZONES), Shape("g2-standard-96", "L4", 8, 96, 384, G2_ZONES),
    Shape("a2-highgpu-1g", "A100", 1, 12, 85, A2_HIGH_ZONES), Shape("a2-highgpu-2g", "A100", 2, 24, 170, A2_HIGH_ZONES),
    Shape("a2-highgpu-4g", "A100", 4, 48, 340, A2_HIGH_ZONES), Shape("a2-highgpu-8g", "A100", 8, 96, 680, A2_HIGH_ZONES),
    Shape("a2-ultragpu-1g", "A100-80GB", 1, 12, 170, A2_ULTRA_ZONES),
    Shape("a2-ultragpu-2g", "A100-80GB", 2, 24, 340, A2_ULTRA_ZONES),
    Shape("a2-ultragpu-4g", "A100-80GB", 4, 48, 680, A2_ULTRA_ZONES),
    Shape("a2-ultragpu-8g", "A100-80GB", 8, 96, 1360, A2_ULTRA_ZONES),
    Shape("a3-highgpu-1g", "H100", 1, 26, 234, A3_HIGH_ZONES, on_demand=False),
    Shape("a3-highgpu-2g", "H100", 2, 52, 468, A3_HIGH_ZONES, on_demand=False),
    Shape("a3-highgpu-4g", "H100", 4, 104, 936, A3_HIGH_ZONES, on_demand=False),
    Shape("a3-highgpu-8g", "H100", 8, 208, 1872, A3_HIGH_ZONES),
    Shape("a3-ultragpu-8g", "H200", 8, 224, 2952, A3_ULTRA_ZONES),
)
BY_NAME: dict[str, Shape] = {s.name: s for s in SHAPES if not s.attached}  # the machine types that carry GPUs
assert all(s.gpu_model in GPUS for s in SHAPES)

ON_DEMAND_REFUSAL = ("{name} is offered as Spot VMs or through flex-start only, not on demand (Google Cloud docs, "
                     "accelerator-optimized machines, A3 High): add --spot, or use a3-highgpu-8g (H100:8)")


def shapes_for(gpu: str, count: int | None = None) -> list[Shape]:
    return [s for s in SHAPES if s.gpu_model == gpu and (count is None or s.gpus == count)]


def shape_of(machine_type: str, gpu: str | None, count: int | None) -> Shape | None:
    """The shape a pool of `machine_type` (with `gpu` x `count` for N1) is, None when none fits."""
    if machine_type in BY_NAME:
        return BY_NAME[machine_type]
    return next((s for s in SHAPES if s.attached and s.gpu_model == gpu and s.gpus == count), None)


def gpu_shapes() -> list[dict[str, object]]:
    """`SpecRules.gpu_shapes`: every shape, as `--gpu` chooses among them."""
    return [{"machine": s.name, "gpu": s.gpu_model, "gpus": s.gpus, "regions": s.regions, "on_demand": s.on_demand,
             "zones": s.zones} for s in SHAPES]
