"""GCP facts for GKE GPU node pools and `validate_spec`: N1 hosts with V100 or T4 attached, and the
accelerator-optimized G2 (L4), A2 (A100 40/80 GB) and A3 (H100, H200) machines (shapes.py holds
those shapes, their zones and quota metrics; `--gpu TYPE:COUNT` picks among them by price).

Everything here is shipped data (no cloud SDK, no network), gathered 2026-11-22:

- N1 predefined machine types (vCPU, memory in GB as Google states it): Google Cloud docs,
  "General-purpose machine family", N1 section
  (https://cloud.google.com/compute/docs/general-purpose-machines#n1_machines), read 2026-11-22.
- V100 per-VM limits (max vCPU / max GB of memory per GPU count) and the valid counts 1, 2, 4, 8:
  Google Cloud docs, "GPU machine types", N1 + V100 table
  (https://cloud.google.com/compute/docs/gpus#nvidia_v100), read 2026-11-22; the same figures
  are in reference/FACTS.md.
- Zones offering V100: SkyPilot's public catalog catalogs/v8/gcp/vms.csv (built from the Cloud
  Billing Catalog), read 2026-11-22 (reference/FACTS.md). Zone offerings change and differ per
  project: the list can be replaced per stack with the spec option `v100Zones`
  ("us-central1-a,us-central1-b").
- The starvation warning: the seed 003 GKE experiment, where n1-standard-4 hosting 4 V100 took
  2m34s per MNIST epoch against 39s on n1-standard-16 (reference/FACTS.md).

Defaults (documented in docs/gcp.md): accelerator `nvidia-tesla-v100`; `gpus_per_node` None
means 1 GPU; no machine type means, for V100/T4, the n1-standard type with 4 vCPUs per GPU, for the
other GPUs the cheapest machine carrying exactly that many (shapes.py, by the price catalog); a
machine type that carries GPUs (a3-highgpu-8g, ...) without a GPU named implies its GPUs; no zone
means the first zone of the region offering the shape (or `us-central1-a` without a region); disk
type `pd-balanced`. `resolve(spec)` applies them and writes GKE's accelerator name in the spec, so
validation and the Pulumi component see the same values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING

from gpucluster.errors import SpecError, not_allowed
from gpucluster.spec import ClusterSpec, parse_bool, parse_minutes
from gpucluster.states import JsonObject

from . import shapes

if TYPE_CHECKING:
    from gpucluster.catalog.select import Shape as Pickable

ACCELERATOR = "nvidia-tesla-v100"
ACCELERATORS = (ACCELERATOR,)
V100_COUNTS = (1, 2, 4, 8)

# GPU count -> (max vCPUs, max memory GB) of the N1 VM carrying them.
V100_LIMITS: dict[int, tuple[int, float]] = {1: (12, 78.0), 2: (24, 156.0), 4: (48, 312.0), 8: (96, 624.0)}

# T4 on N1, GPU count -> (max vCPUs, max memory GB) of the VM (Google Cloud docs, "GPU machine types",
# N1 + T4 table, https://cloud.google.com/compute/docs/gpus#t4-gpus, read 2026-11-28)
T4_LIMITS: dict[int, tuple[int, float]] = {1: (48, 312.0), 2: (48, 312.0), 4: (96, 624.0)}
N1_LIMITS = {"V100": V100_LIMITS, "T4": T4_LIMITS}

# Fewer vCPUs per GPU than this starves the input pipeline (seed 003: 2m34s vs 39s per epoch).
MIN_VCPUS_PER_GPU = 4

DEFAULT_V100_ZONES = (
    "us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f",
    "us-east1-b", "us-east1-c",
    "us-west1-a", "us-west1-b",
    "europe-west4-a", "europe-west4-b", "europe-west4-c",
    "asia-east1-c",
)
DEFAULT_ZONE = "us-central1-a"
DISK_TYPES = ("pd-standard", "pd-balanced", "pd-ssd", "hyperdisk-balanced")  # which series takes which: shapes.py
DEFAULT_DISK_TYPE = "pd-balanced"

# GKE settings the stack may choose (spec options); values as the GKE API spells them.
RELEASE_CHANNELS = ("RAPID", "REGULAR", "STABLE", "EXTENDED", "UNSPECIFIED")
DEFAULT_RELEASE_CHANNEL = "REGULAR"
GPU_DRIVER_VERSIONS = ("DEFAULT", "LATEST", "INSTALLATION_DISABLED")
DEFAULT_GPU_DRIVER_VERSION = "LATEST"
LAUNCHERS = ("job", "pytorchjob", "trainjob")
DEFAULT_SYSTEM_MACHINE_TYPE = "n1-standard-2"  # priced by the N1 unit prices; stays up after the switch
SYSTEM_DISK_GB = 50
# Every node of a GKE cluster without private nodes has one ephemeral external IPv4, billed while in use
# (GKE docs, "About cluster networking"; VPC pricing, "IP address pricing").
EXTERNAL_IPV4_PER_NODE = 1
SYSTEM_DISK_TYPE = "pd-balanced"


@dataclass(frozen=True)
class MachineType:
    name: str
    vcpus: int
    memory_gb: float


# n1-standard: 3.75 GB per vCPU; n1-highmem: 6.5 GB; n1-highcpu: 0.9 GB (Google's N1 table).
N1_GB_PER_VCPU = {"standard": Decimal("3.75"), "highmem": Decimal("6.5"), "highcpu": Decimal("0.9")}
N1_SIZES = {"standard": (1, 2, 4, 8, 16, 32, 64, 96), "highmem": (2, 4, 8, 16, 32, 64, 96),
            "highcpu": (2, 4, 8, 16, 32, 64, 96)}


def _family(kind: str) -> dict[str, MachineType]:
    gb_per_vcpu = float(N1_GB_PER_VCPU[kind])
    return {
        f"n1-{kind}-{n}": MachineType(f"n1-{kind}-{n}", n, round(n * gb_per_vcpu, 2)) for n in N1_SIZES[kind]
    }


N1_MACHINE_TYPES: dict[str, MachineType] = {**_family("standard"), **_family("highmem"), **_family("highcpu")}


def n1_machine_types() -> list[str]:
    """Every predefined N1 type, family by family, smallest first."""
    return list(N1_MACHINE_TYPES)


# A VM's egress within its VPC: 2 Gbit/s per vCPU for N1 ("an n1-standard-8 VM ... is limited to
# 16 Gbps", Google Cloud docs, "Network bandwidth"), at most 32 Gbit/s; a GKE node is such a VM.
N1_GBPS_PER_VCPU, N1_MAX_GBPS = 2.0, 32.0


def link_gbps(spec: ClusterSpec) -> float | None:
    """What the health check expects of every node pair: the sending VM's egress limit."""
    mt = N1_MACHINE_TYPES.get(spec.instance_type or "")
    return min(N1_GBPS_PER_VCPU * mt.vcpus, N1_MAX_GBPS) if mt else None


def n1_shape(machine_type: str) -> tuple[int, Decimal] | None:
    """(vCPUs, GiB as an exact Decimal) of a predefined N1 type, None if it is not one: what the
    N1 vCPU and memory unit prices are multiplied by."""
    mt = N1_MACHINE_TYPES.get(machine_type)
    if mt is None:
        return None
    kind = machine_type.split("-")[1]
    return mt.vcpus, N1_GB_PER_VCPU[kind] * mt.vcpus


def machine_shape(machine_type: str) -> tuple[int, Decimal] | None:
    """(vCPUs, memory as an exact Decimal, in the GB Google states) of a machine type a GPU pool may use:
    an N1 predefined type (`n1_shape`) or a G2/A2/A3 shape (shapes.py). None for any other. What pod
    requests and quota needs can be derived from for every GPU machine (issue 42)."""
    carried = shapes.BY_NAME.get(machine_type)
    if carried is not None:
        return carried.vcpus, Decimal(str(carried.memory_gb))
    return n1_shape(machine_type)


DEFAULT_MACHINE_TYPE = {1: "n1-standard-4", 2: "n1-standard-8", 4: "n1-standard-16", 8: "n1-standard-32"}

# The training image by the GPU's generation, when the option `image` names none (public PyTorch images,
# docker.io/pytorch/pytorch, torch only; tags chosen 2026-11-28). PyTorch 2.11's cu128/cu130 wheels dropped
# sm_70 (pytorch/pytorch#172352) and CUDA 13 dropped Volta (FACTS.md, "Volta is leaving"): V100 and T4 get a
# CUDA 12.6 build, which still targets sm_70 and sm_75; Ampere and later a CUDA 12.8 build (sm_80 to sm_100).
# Both run on the driver GKE installs (gpuDriverVersion LATEST/DEFAULT: R535 or later, CUDA 12 minor-version
# compatibility). Both tags exist on Docker Hub as written (checked 2026-11-28 from here without Docker Hub's
# API: public Dockerfiles pin them by digest, e.g. `pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime@sha256:c16f4c74...`
# and the linux/amd64 digest `sha256:2b59b1b9...` of the cuda12.6 tag; the tags follow the pytorch/pytorch
# release Dockerfile's `<version>-cuda<major.minor>-cudnn<major>-runtime` naming; linux/amd64 only).
LEGACY_GPU_IMAGE = "pytorch/pytorch:2.7.1-cuda12.6-cudnn9-runtime"
CURRENT_GPU_IMAGE = "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime"


_ZONE_RE = re.compile(r"^[a-z]+-[a-z]+\d+-[a-z]$")
_LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")


def region_of(zone: str) -> str:
    """us-central1-a -> us-central1."""
    return zone.rsplit("-", 1)[0]


def v100_zones(spec: ClusterSpec) -> tuple[str, ...]:
    """The shipped V100 zones, or the stack's own comma list in the option `v100Zones`."""
    raw = spec.option("v100Zones")
    if raw is None or not str(raw).strip():
        return DEFAULT_V100_ZONES
    zones = tuple(z.strip() for z in str(raw).split(",") if z.strip())
    for z in zones:
        if not _ZONE_RE.match(z):
            raise SpecError(not_allowed("v100Zones entry", z, "zone names such as us-central1-a"))
    return zones


# Options the GCP component and launcher understand, in their one spelling (as in stack config;
# `--option` may give the other form: `gpucluster.spec.normalize`); docs/gcp.md lists them. The
# stack options gcsRead/gcsWrite and project are lifted by `normalize` into the spec's fields.
OPTIONS = (
    "autoscale",
    "gke_free_tier",  # cost: count GKE's one free zonal cluster per billing account
    "gpuDriverVersion",
    "idleMinutes",  # `up --idle-minutes N`: the GPU nodes are released after N minutes without a job (idle.py)
    "image",
    "launcher",
    "minNodes",
    "namespace",
    "network",  # the VPC network the cluster goes on (default: `default`); checked before anything is created
    "subnetwork",  # its subnetwork in the region (needed in a custom-mode network)
    "releaseChannel",
    "systemMachineType",
    "gpuZones",  # the zones to use for the GPU pool's shape, replacing the shipped list (any GPU)
    "v100Zones",
)


def option_bool(spec: ClusterSpec, key: str, default: bool = False) -> bool:
    return parse_bool(f"option {key}", spec.option(key), default)


def option_choice(spec: ClusterSpec, key: str, choices: tuple[str, ...], default: str) -> str:
    raw = spec.option(key)
    if raw is None or str(raw).strip() == "":
        return default
    value = str(raw).strip()
    if value.upper() in choices:
        return value.upper()
    if value.lower() in choices:
        return value.lower()
    raise SpecError(not_allowed(f"option {key}", raw, choices))


def gpu_of(spec: ClusterSpec) -> str:
    """The spec's GPU by gpucluster's name (V100 when none is named; a machine type that carries GPUs
    names its own). UsageError for a name not known, with the known ones."""
    from gpucluster.catalog.gpus import normalize

    if spec.accelerator is not None:
        return normalize(str(spec.accelerator))
    carried = shapes.BY_NAME.get(spec.instance_type or "")
    return carried.gpu_model if carried else "V100"


def gpu_zones(spec: ClusterSpec, shape: shapes.Shape) -> tuple[str, ...]:
    """The zones the GPU pool may use: option gpuZones (v100Zones for V100), else the shape's."""
    raw = spec.option("gpuZones")
    if (raw is None or not str(raw).strip()) and shape.gpu_model == "V100":
        return v100_zones(spec)
    if raw is None or not str(raw).strip():
        return shape.zones
    zones = tuple(z.strip() for z in str(raw).split(",") if z.strip())
    for z in zones:
        if not _ZONE_RE.match(z):
            raise SpecError(not_allowed("gpuZones entry", z, "zone names such as us-central1-a"))
    return zones


def select_shape(spec: ClusterSpec, gpu: str, count: int, region: str) -> Pickable:
    """`--gpu TYPE:COUNT`: the cheapest shape in `region` carrying exactly COUNT (host + COUNT GPU rows of
    the price catalog, the spec's market); N1 (V100, T4): the default N1 type for the count."""
    from gpucluster.catalog.prices import load_catalog
    from gpucluster.catalog.select import pick

    prices = load_catalog()
    market = "spot" if spec.spot else "on-demand"
    candidates = [s for s in shapes.SHAPES if spec.spot or s.on_demand or s.gpu_model != gpu or s.gpus != count]

    def price_of(shape: shapes.Shape, where: str, market: str) -> Decimal | None:
        host = prices.find("gcp", where, "instance", shape.name, market)
        card = prices.find("gcp", where, "gpu", shape.gpu_model, market)
        return None if host is None or card is None else host.price + card.price * shape.gpus

    if not spec.spot and any(not s.on_demand for s in shapes.shapes_for(gpu, count)) and not [
            s for s in shapes.shapes_for(gpu, count) if s.on_demand]:
        raise SpecError(f"gpu {gpu}:{count} is not allowed on demand: "
                        + shapes.ON_DEMAND_REFUSAL.format(name=shapes.shapes_for(gpu, count)[0].name))
    return pick("gcp", gpu, count, region, candidates, price_of, market=market, catalog=prices)


def _default_machine(spec: ClusterSpec, gpu: str, gpus: int, region: str | None) -> str | None:
    """The machine type when none is given: N1 + attached GPUs (4 vCPUs per GPU), else the cheapest shape."""
    if gpu in N1_LIMITS:
        return DEFAULT_MACHINE_TYPE.get(gpus) if gpu == "V100" else next(
            (s.name for s in shapes.shapes_for(gpu, gpus)), None)
    return select_shape(spec, gpu, int(gpus), region or region_of(DEFAULT_ZONE)).name


def _default_zone(spec: ClusterSpec, gpu: str, shape: shapes.Shape | None, region: str | None) -> str:
    """The zone when none is given: the default one (or the first with the GPU), else the first of the region."""
    zones = gpu_zones(spec, shape) if shape is not None else v100_zones(spec)
    if region is None:
        return DEFAULT_ZONE if DEFAULT_ZONE in zones or shape is None else zones[0]
    in_region = [z for z in zones if region_of(z) == region]
    if not in_region:
        regions = sorted({region_of(z) for z in zones})
        raise SpecError(not_allowed(f"region (no {gpu} zone known there)", region, regions))
    return in_region[0]


def resolve(spec: ClusterSpec) -> ClusterSpec:
    """The spec with the GCP defaults filled in (accelerator, GPUs, machine type, zone, disk).

    Raises SpecError where a default cannot be chosen (a region without zones for the GPU, a zone
    that contradicts the region, a GPU count no machine carries); the remaining checks are
    `validate_spec`'s.
    """
    gpu = gpu_of(spec)
    carried = shapes.BY_NAME.get(spec.instance_type or "")
    gpus = spec.gpus_per_node if spec.gpus_per_node is not None else (carried.gpus if carried else 1)
    zone, region = spec.zone, spec.region
    if region is None and zone is not None:
        region = region_of(zone)
    machine = spec.instance_type if spec.instance_type is not None else _default_machine(spec, gpu, gpus, region)
    shape = shapes.shape_of(machine or "", gpu, gpus)
    if zone is None:
        zone = _default_zone(spec, gpu, shape, region)
    elif region is not None and region_of(zone) != region:
        raise SpecError(
            not_allowed("zone", zone, f"a zone of region {region} (or leave the region out)")
        )
    return spec.replace(
        accelerator=shapes.ACCELERATORS.get(gpu, spec.accelerator or ACCELERATOR),
        gpus_per_node=gpus,
        instance_type=machine,
        zone=zone,
        region=region_of(zone),
        disk_type=spec.disk_type or shapes.default_boot_disk_type(machine or "", DEFAULT_DISK_TYPE),
    )


def idle_minutes(spec: ClusterSpec) -> int | None:
    """Option idleMinutes: a whole number of minutes from 1 to the max lifetime, or None. Refused with a
    fixed-size pool (autoscale=false): nothing would remove its nodes once the hold is released."""
    value = spec.option("idleMinutes")
    minutes = parse_minutes("idle minutes", value, spec.max_lifetime_minutes)
    if minutes is None:
        return None
    if not option_bool(spec, "autoscale", True):
        raise SpecError(f"idle minutes {value!r} is not allowed with option autoscale=false: a fixed GPU pool keeps "
                        "its nodes whatever runs on them; drop autoscale=false (the GPU pool then scales to zero "
                        "once the idle stop releases it)")
    return minutes


def validate_spec(spec: ClusterSpec) -> list[str]:
    """GCP checks for a GKE GPU pool; raise SpecError on the first problem, return warnings."""
    idle_minutes(spec)  # checked before anything is declared
    system_machine_type(spec)
    gpu = gpu_of(spec)  # a GPU name not known: the known ones, with a did-you-mean
    _check_gpu(spec, gpu)
    r = resolve(spec)
    carried = shapes.BY_NAME.get(r.instance_type or "")
    if carried is not None:  # G2 / A2 / A3: the machine type fixes the GPU and its count
        _check_carried(spec, r, carried, gpu)
    else:
        _check_attached(spec, r, gpu)
    _check_disk_and_labels(spec, r)
    option_choice(spec, "releaseChannel", RELEASE_CHANNELS, DEFAULT_RELEASE_CHANNEL)
    option_choice(spec, "gpuDriverVersion", GPU_DRIVER_VERSIONS, DEFAULT_GPU_DRIVER_VERSION)
    option_choice(spec, "launcher", LAUNCHERS, "job")
    from .gcs import namespace_of, scopes

    if any(scopes(spec)):  # SpecError for a malformed gcsRead/gcsWrite URL (infra/gcp/gcs.py)
        namespace_of(spec)
    if option_bool(spec, "autoscale", True):
        _min_nodes(spec, r.nodes)
    return _warnings(spec, r, gpu)


def _check_gpu(spec: ClusterSpec, gpu: str) -> None:
    """A GPU GKE has, in a count an N1 VM takes it in, and a zone name that is one."""
    if gpu not in shapes.ACCELERATORS:  # refused with where the GPU is (another cloud) and at what price
        from gpucluster.catalog.prices import load_catalog
        from gpucluster.catalog.select import pick

        pick("gcp", gpu, int(spec.gpus_per_node or 1), spec.region or "", shapes.SHAPES, lambda *a: None,
             catalog=load_catalog())
    if gpu in N1_LIMITS and spec.gpus_per_node is not None and (
        isinstance(spec.gpus_per_node, bool) or spec.gpus_per_node not in N1_LIMITS[gpu]
    ) and spec.instance_type not in shapes.BY_NAME:
        raise SpecError(
            not_allowed(f"{gpu} GPUs per node", spec.gpus_per_node, [str(n) for n in N1_LIMITS[gpu]])
        )
    if spec.zone is not None and not _ZONE_RE.match(spec.zone):
        raise SpecError(not_allowed("zone", spec.zone, "a zone name such as us-central1-a"))


def _check_carried(spec: ClusterSpec, r: ClusterSpec, carried: shapes.Shape, gpu: str) -> None:
    """A machine type that carries its GPUs (G2 / A2 / A3): the GPU and count it has, on demand
    only where it is offered so, in a zone that has it."""
    if (carried.gpu_model, carried.gpus) != (gpu, r.gpus_per_node):
        with_gpu = [s.name for s in shapes.shapes_for(gpu, r.gpus_per_node) if not s.attached]
        raise SpecError(
            f"gpu {gpu}:{r.gpus_per_node} (--gpu, or accelerator/gpusPerNode) contradicts machine type "
            f"{carried.name} (--machine-type, {carried.gpus} × {carried.gpu_model}): give one of them"
            + (f"; machine types with {gpu}:{r.gpus_per_node}: {', '.join(with_gpu)}" if with_gpu else "")
        )
    if not carried.on_demand and not r.spot:
        raise SpecError(f"machine type {carried.name} is not allowed on demand: "
                        + shapes.ON_DEMAND_REFUSAL.format(name=carried.name))
    zones = gpu_zones(spec, carried)
    if r.zone not in zones:
        raise SpecError(not_allowed(f"zone (no {carried.name} there)", r.zone, zones))


def _gpus(r: ClusterSpec) -> int:
    """GPUs per node of a resolved spec (`resolve` always sets them)."""
    return int(r.gpus_per_node or 0)


def _check_attached(spec: ClusterSpec, r: ClusterSpec, gpu: str) -> None:
    """An N1 VM with attached GPUs (T4, V100): a zone that has the GPU, an N1 predefined type within
    the GPU count's vCPU and memory limits."""
    shape = shapes.shape_of(r.instance_type or "", gpu, r.gpus_per_node)
    zones = gpu_zones(spec, shape) if shape is not None else v100_zones(spec)
    if r.zone not in zones:
        raise SpecError(not_allowed(f"zone (no {gpu} there)", r.zone, zones))
    mt = N1_MACHINE_TYPES.get(r.instance_type or "")
    if mt is None or gpu not in N1_LIMITS:
        allowed = [*N1_MACHINE_TYPES] if gpu in N1_LIMITS else [s.name for s in shapes.shapes_for(gpu)]
        needs = "an N1 predefined type" if gpu in N1_LIMITS else "its own machine types"
        raise SpecError(
            not_allowed(f"machine type for accelerator {spec.accelerator or gpu!r} ({gpu} needs {needs})",
                        r.instance_type, allowed)
        )
    max_vcpus, max_gb = N1_LIMITS[gpu][_gpus(r)]
    if mt.vcpus > max_vcpus or mt.memory_gb > max_gb:
        raise SpecError(
            f"machine type {mt.name!r} ({mt.vcpus} vCPU, {mt.memory_gb:g} GB) is not allowed with "
            f"{r.gpus_per_node} {gpu}: at most {max_vcpus} vCPU and {max_gb:g} GB per VM; "
            f"use more GPUs per node or a smaller type such as n1-standard-{4 * _gpus(r)}"
        )


def _check_disk_and_labels(spec: ClusterSpec, r: ClusterSpec) -> None:
    if r.disk_type not in DISK_TYPES:
        raise SpecError(not_allowed("disk type", r.disk_type, DISK_TYPES))
    series_disks = shapes.boot_disk_types(r.instance_type or "")
    if series_disks is not None and r.disk_type not in series_disks:
        raise SpecError(f"disk type {r.disk_type!r} is not allowed as the boot disk of {r.instance_type} nodes; "
                        f"allowed: {', '.join(series_disks)} ({shapes.BOOT_DISK_SOURCE})")
    for key, value in spec.managed_tags().items():
        if not _LABEL_VALUE_RE.match(value):
            raise SpecError(
                not_allowed(f"label {key} value", value, "lowercase letters, digits, '_' and '-' (GCP labels)")
            )


def _warnings(spec: ClusterSpec, r: ClusterSpec, gpu: str) -> list[str]:
    """What holds but may hurt: too few vCPUs per GPU, a user's image on V100."""
    warnings: list[str] = []
    mt = N1_MACHINE_TYPES.get(r.instance_type or "")
    if mt is not None and mt.vcpus < MIN_VCPUS_PER_GPU * _gpus(r):
        warnings.append(
            f"{mt.name} has {mt.vcpus} vCPU for {r.gpus_per_node} {gpu} "
            f"({mt.vcpus / _gpus(r):g} per GPU, fewer than {MIN_VCPUS_PER_GPU}): the GPUs may "
            "starve; in seed 003 n1-standard-4 with 4 V100 took 2m34s per epoch against 39s on "
            f"n1-standard-16; consider n1-standard-{4 * _gpus(r)}"
        )
    image = str(spec.option("image") or "").strip()
    if image and gpu == "V100":  # the user's own image on Volta (sm_70): said before anything is created
        warnings.append(
            f"image {image} on V100: PyTorch's cu128 and cu130 builds (2.11 and later) have no kernels for the V100 "
            "(sm_70; pytorch/pytorch#172352) and CUDA 13 dropped Volta, so such an image fails the health check "
            "with 'no kernel image is available' after the nodes bill; use a CUDA 12.6 (cu126) build of PyTorch, "
            f"e.g. {LEGACY_GPU_IMAGE} (the default here), or another GPU (--gpu L4, A100)")
    return warnings


def _min_nodes(spec: ClusterSpec, nodes: int) -> int:
    raw = spec.option("minNodes", "0")
    try:
        n = int(str(raw).strip())
    except ValueError:
        n = -1
    if n < 0 or n > nodes:
        raise SpecError(not_allowed("option minNodes", raw, f"an integer from 0 to {nodes} (the node count)"))
    return n


def min_nodes(spec: ClusterSpec) -> int:
    """The autoscaling floor (option `minNodes`, default 0) for a spec with `autoscale` on."""
    return _min_nodes(spec, spec.nodes)


# Compute Engine machine type names (https://cloud.google.com/compute/docs/machine-resource):
# SERIES-TYPE-VCPUS (n2-standard-8, c3-highcpu-4-lssd), the shared-core types, and custom types
# SERIES-custom-VCPUS-MIB[-ext] (https://cloud.google.com/compute/docs/instances/creating-instance-with-custom-machine-type).
_MACHINE_RE = re.compile(r"^(?:[a-z][a-z0-9]*-[a-z]+-[1-9][0-9]*(?:-lssd)?"
                         r"|[a-z][a-z0-9]*-custom-[1-9][0-9]*-[1-9][0-9]*(?:-ext)?"
                         r"|e2-micro|e2-small|e2-medium|f1-micro|g1-small)$")


def system_machine_type(spec: ClusterSpec) -> str:
    """The option `systemMachineType` (the CPU system pool's machine), checked before anything is
    created: a Compute Engine machine type name, an N1 one among N1's predefined types, never a GPU
    machine (the pool runs no training)."""
    raw = spec.option("systemMachineType")
    if raw is None or str(raw).strip() == "":
        return DEFAULT_SYSTEM_MACHINE_TYPE
    value = str(raw).strip()
    allowed = f"a Compute Engine CPU machine type such as {DEFAULT_SYSTEM_MACHINE_TYPE}, e2-standard-2 or n2-standard-2"
    if not _MACHINE_RE.match(value) or (value.startswith("n1-") and "-custom-" not in value
                                        and value not in N1_MACHINE_TYPES):
        raise SpecError(not_allowed("option systemMachineType", raw, allowed))
    if value in shapes.BY_NAME:
        raise SpecError(not_allowed("option systemMachineType", raw, allowed + " (a GPU machine type bills its GPUs "
                                    "around the clock in a pool that runs no training)"))
    return value


def system_pool(spec: ClusterSpec) -> JsonObject:
    """The always-on CPU system pool the GKE component declares (a `node-pool` cost detail): it and
    the cluster fee keep billing after the dead-man switch has removed the GPU nodes."""
    return {"machine_type": system_machine_type(spec), "node_count": 1,
            "gpus_per_node": 0, "spot": False, "disk_gb": SYSTEM_DISK_GB, "disk_type": SYSTEM_DISK_TYPE,
            "external_ipv4": EXTERNAL_IPV4_PER_NODE}


def plan_line(spec: ClusterSpec, nproc_per_node: int, hourly: Decimal | None = None) -> str:
    """e.g. `2 × a3-highgpu-8g (8 × H100 each), 16 training processes, $86.38/h` (spec resolved)."""
    gpu = gpu_of(spec)
    line = (f"{spec.nodes} × {spec.instance_type} ({spec.gpus_per_node} × {gpu} each), "
            f"{spec.nodes * nproc_per_node} training processes")
    if hourly is not None:
        from gpucluster.costing.rules import money

        line += f", {money(hourly)}/h"
    return line


def pool_zones(spec: ClusterSpec) -> tuple[str, ...]:
    """The zones the spec's GPU pool may use (its shape's, or the stack's gpuZones/v100Zones): the
    capacity failover's and the quota hints' candidates."""
    r = spec if spec.instance_type else resolve(spec)
    shape = shapes.shape_of(r.instance_type or "", gpu_of(r), r.gpus_per_node)
    return gpu_zones(spec, shape) if shape is not None else v100_zones(spec)
