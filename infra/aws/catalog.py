"""The EC2 catalog (g5 A10G, g6 L4, g6e L40S, p4d/p4de A100, p5 H100, p5e/p5en H200, p6-b200 B200),
`--gpu` selection and the AWS part of spec validation.

Sources:

- Instance facts and the zones offering each type: shapes.py (the EC2 DescribeInstanceTypes and
  DescribeInstanceTypeOfferings dumps bundled in moto 5.2.5, read 2026-11-28). Regions that dump
  does not list for a type are refused here: pass the option `allowUnlistedRegion=true` to try one
  anyway.
- `--gpu TYPE:COUNT` picks the cheapest type in the region with exactly COUNT of that GPU, by the
  price catalog's row for the run's market (gpucluster/catalog/data/prices.json, dated rows).
- Spot inside a cluster placement group must terminate (not stop or hibernate) on interruption
  (FACTS.md, AWS EC2 user guide on placement groups).

Prices are not here: they live in the price catalog with their own source and date.
No cloud SDK is imported by this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Callable, overload

from gpucluster.errors import SpecError, did_you_mean, not_allowed
from gpucluster.spec import parse_bool, parse_minutes

if TYPE_CHECKING:  # pragma: no cover
    from gpucluster.spec import ClusterSpec

from .kms import KEYS_OPTION, bucket_keys, keys_of
from .s3 import scopes, split
from .sdk import AwsSession
from .shapes import SOURCE, SOURCE_DATE  # noqa: E402,F401

DEFAULT_REGION = "us-east-1"
DEFAULT_INSTANCE_TYPE = "g5.xlarge"
DEFAULT_DISK_TYPE = "gp3"
DISK_TYPES = ("gp3",)
ACCELERATOR = "nvidia-a10g"
SSH_USER = "ubuntu"  # the DLAMI Ubuntu images' login user

# Images (option `image`). AWS DLAMI release notes, "Deep Learning OSS Nvidia Driver AMI GPU
# PyTorch 2.x (Ubuntu 22.04)": supported EC2 instances include G5; `python_location` is
# /opt/pytorch/bin/python (https://docs.aws.amazon.com/dlami/latest/devguide/appendix-ami-release-notes.html).
# The Base OSS Nvidia Driver DLAMI ships the driver, CUDA, NCCL and EFA but no PyTorch: with
# image=base, user data installs torch into a venv at the same path before the ready marker.
# The Ubuntu releases are pinned to those checked (issue 40 item 11): "Ubuntu 2?.04" would also take
# a 26.04 DLAMI, whose OpenSSH (9.8 and later) runs sessions as `sshd-session`, and whatever else a new
# release changes (its python_location, its driver branch) is unchecked. A new release is added here
# once checked. EC2's DescribeImages takes several values of one filter (any of them matches).
UBUNTU_CHECKED = ("22.04", "24.04")
IMAGES = {
    "pytorch": tuple(f"Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.* (Ubuntu {r}) *" for r in UBUNTU_CHECKED),
    "base": ("Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)*",),
}
DEFAULT_IMAGE = "pytorch"
NODE_PYTHON = "/opt/pytorch/bin/python"  # the DLAMI's python_location (torch is importable there)


# Where `run`/`up` learn this machine's public IPv4 when no --ssh-cidr is given (5 s timeout).
CHECKIP_URL = "https://checkip.amazonaws.com"
CHECKIP_TIMEOUT_S = 5.0

# Spot inside a cluster placement group must terminate on interruption.
SPOT_INTERRUPTION_BEHAVIORS = ("terminate",)

# The shapes (every GPU family gpucluster creates) live in shapes.py with their sources and dates.
from .shapes import INSTANCE_TYPES, InstanceType, shapes_for  # noqa: E402,F401 - re-exported

G5_REGIONS: tuple[str, ...] = INSTANCE_TYPES["g5.xlarge"].regions


# One flow (a 5-tuple) between two instances of a cluster placement group (every gpucluster cluster
# has one: component.py) reaches up to 10 Gbit/s, and never more than the type's bandwidth ("Amazon
# EC2 instance network bandwidth", EC2 user guide, single-flow traffic).
FLOW_GBPS_IN_PLACEMENT_GROUP = 10.0


def link_gbps(spec: "ClusterSpec") -> float | None:
    """What the health check expects of every node pair: one flow, within the placement group."""
    import re

    t = INSTANCE_TYPES.get(spec.instance_type or "")
    m = re.search(r"(\d+(?:\.\d+)?) Gigabit", t.network) if t else None
    return min(float(m.group(1)), FLOW_GBPS_IN_PLACEMENT_GROUP) if m else None


@overload
def option(spec: "ClusterSpec", key: str) -> str | None: ...
@overload
def option(spec: "ClusterSpec", key: str, default: str) -> str: ...
def option(spec: "ClusterSpec", key: str, default: str | None = None) -> str | None:
    """An option by its name in `OPTIONS` (options are strings: `ClusterSpec.options`)."""
    return spec.option_dict.get(key, default)


def flag(spec: "ClusterSpec", key: str, default: bool = False) -> bool:
    """A boolean option; anything but a clear true/false is a SpecError."""
    return parse_bool(f"option {key}", option(spec, key), default)


def region_of(spec: "ClusterSpec") -> str:
    if spec.region:
        return spec.region
    if spec.zone and spec.zone[-1:].isalpha() and spec.zone[-2:-1].isdigit():  # us-east-1a -> us-east-1
        return spec.zone[:-1]
    return DEFAULT_REGION


def resolve(spec: "ClusterSpec") -> "ClusterSpec":
    """The spec with the region actually used filled in (the zone's region, else the default), so
    that the ledger, the teardown check and `gc` look where the cluster was created."""
    return spec if spec.region else spec.replace(region=region_of(spec))


def instance_type_of(spec: "ClusterSpec") -> InstanceType:
    """The spec's type: the one named, else the one `--gpu` picks (`select_type`), else the default."""
    if spec.instance_type is None and spec.accelerator is not None:
        return select_type(spec)
    name = spec.instance_type or DEFAULT_INSTANCE_TYPE
    try:
        return INSTANCE_TYPES[name]
    except KeyError:
        raise SpecError(not_allowed("aws instance type", name, list(INSTANCE_TYPES))) from None


def select_type(spec: "ClusterSpec") -> InstanceType:
    """`--gpu TYPE:COUNT`: the cheapest type in the spec's region with exactly COUNT of that GPU, by
    the price catalog's row for the spec's market (gpucluster.catalog.select.pick)."""
    from gpucluster.catalog import gpus
    from gpucluster.catalog.prices import load_catalog
    from gpucluster.catalog.select import pick

    gpu = gpus.normalize(str(spec.accelerator))
    prices = load_catalog()

    def price_of(t: InstanceType, region: str, market: str) -> Decimal | None:
        row = prices.find("aws", region, "instance", t.name, market)
        return None if row is None else row.price

    chosen = pick("aws", gpu, int(spec.gpus_per_node or 1), region_of(spec), list(INSTANCE_TYPES.values()),
                  price_of, market="spot" if spec.spot else "on-demand", catalog=prices)
    return INSTANCE_TYPES[chosen.name]


def efa_requested(spec: "ClusterSpec") -> bool:
    """Option efa; without it, on for a multi-node cluster of a shape made for EFA (the P shapes)."""
    return flag(spec, "efa", instance_type_of(spec).efa_default and spec.nodes > 1)


def idle_minutes(spec: "ClusterSpec") -> int | None:
    """Option idleMinutes: a whole number of minutes from 1 to the max lifetime, or None."""
    return parse_minutes("idle minutes", option(spec, "idleMinutes"), spec.max_lifetime_minutes)


# Options the AWS component understands, in their one spelling (camelCase, as in stack config;
# `--option` may give the snake_case form: `gpucluster.spec.normalize`). `gpucluster.spec.validate`
# refuses any other key. The stack options s3Read/s3Write are not among them: `normalize` lifts them
# into the spec's `reads`/`writes` fields (infra/aws/s3.py).
OPTIONS = (
    "allowOpenSsh",
    "allowUnlistedRegion",
    "ami",
    "efa",
    "idleMinutes",  # `up --idle-minutes N`: the nodes power off after N minutes without a job (node_idle.py)
    "image",
    "spotInterruptionBehavior",
    "s3KmsKeys",  # the KMS keys of SSE-KMS buckets the nodes read or write (infra/aws/kms.py; found by `prepare`)
    "ssm",  # an instance role with AmazonSSMManagedInstanceCore (Session Manager, Run Command)
    "sshPublicKey",
    "subnetId",
    "vpcCidr",
    "vpcId",
)


# Regions that are disabled until the account opts in (those of the shipped g5 catalog), from
# https://docs.aws.amazon.com/accounts/latest/reference/manage-acct-regions.html
OPT_IN_REGIONS = ("ap-east-1", "ap-southeast-3", "eu-south-2", "il-central-1", "me-central-1")


def region_note(region: str) -> str | None:
    """Opt-in regions are disabled until the account enables them (RunInstances: OptInRequired): a warning of
    `validate_spec`, which the cost engine also says with an unpriced region (`costing.plan.region_needs`)."""
    if region in OPT_IN_REGIONS:
        return (f"{region} is an opt-in region: enable it first with `aws account enable-region --region-name "
                f"{region}`")
    return None


IAM_TAG_EXTRA = "_.:/=+-@"  # besides letters, separators (spaces) and numbers


def _iam_tag_bad(text: str) -> str | None:
    """The first character of `text` IAM refuses in a tag: its keys and values match
    `[\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]*` (IAM API reference, Tag: Key and Value patterns; CreateRole
    answers ValidationError otherwise), unlike EC2's tags, which allow any character."""
    import unicodedata

    for ch in text:
        if ch not in IAM_TAG_EXTRA and unicodedata.category(ch)[0] not in "LZN":
            return ch
    return None


def role_reasons(spec: "ClusterSpec") -> list[str]:
    """Why the nodes need an instance role ([] for none: then no IAM is created)."""
    reads, writes = scopes(spec)
    why = []
    if reads:
        why.append("--data/--resume s3:// (read)")
    if writes:
        why.append("--output s3:// (write)")
    if flag(spec, "ssm"):
        why.append("option ssm=true")
    return why


def check_iam_tags(spec: "ClusterSpec") -> None:
    """A run that creates the nodes' IAM role and instance profile (`role_reasons`) puts
    every tag on them too: a key or value with a character IAM refuses fails `CreateRole` after the
    network is made. Refused here, before anything is created (SpecError: exit 2), naming the tag and
    what IAM allows. Key length 1-128 and value length up to 256 are IAM's as well."""
    why = role_reasons(spec)
    if not why:
        return
    for key, value in spec.managed_tags().items():
        for what, text, limit in (("key", key, 128), ("value", value, 256)):
            bad = _iam_tag_bad(text)
            if bad is not None or len(text) > limit:
                problem = f"character {bad!r}" if bad is not None else f"more than {limit} characters"
                raise SpecError(
                    f"tag {key}={value!r}: its {what} has {problem}, which IAM refuses on the node role this run "
                    f"creates ({', '.join(why)}); IAM tag keys and values allow letters, digits, spaces and "
                    f"{' '.join(IAM_TAG_EXTRA)} only (keys up to 128, values up to 256 characters)")


@dataclass(frozen=True)
class _Checking:
    """What every rule of `validate_spec` reads: the spec, its type and region, and the warnings so far."""

    spec: "ClusterSpec"
    itype: InstanceType
    region: str
    warnings: list[str]


def _check_region(c: _Checking) -> None:
    if c.region not in c.itype.regions:
        if flag(c.spec, "allowUnlistedRegion"):
            c.warnings.append(
                f"region {c.region!r} is not in the shipped catalog for {c.itype.name} ({SOURCE_DATE});"
                " trying it because allowUnlistedRegion=true"
            )
        else:
            raise SpecError(
                f"aws instance type {c.itype.name} is not offered in region {c.region!r}"
                f"{did_you_mean(c.region, c.itype.regions)}; regions: {', '.join(c.itype.regions)}"
                " (set option allowUnlistedRegion=true to try anyway)"
            )
    opt_in = region_note(c.region)
    if opt_in:
        c.warnings.append(opt_in)


def _check_zone(c: _Checking) -> None:
    zone, region = c.spec.zone, c.region
    if zone is not None:
        suffix = zone[len(region):]
        # zone letters run a-f: no region has more than six zones (us-east-1's are us-east-1a to -1f)
        if not (zone.startswith(region) and len(suffix) == 1 and suffix in "abcdef"):
            raise SpecError(
                not_allowed("aws availability zone", zone, f"a zone of {region}: {region}a to {region}f at most")
            )


def _check_accelerator(c: _Checking) -> None:
    spec, itype = c.spec, c.itype
    if spec.accelerator is None:
        return
    from gpucluster.catalog import gpus

    gpu = gpus.normalize(spec.accelerator)
    if gpu != itype.gpu_model:
        with_gpu = [t.name for t in INSTANCE_TYPES.values() if t.gpu_model == gpu]
        asked = f"{gpu}:{spec.gpus_per_node}" if spec.gpus_per_node else gpu
        raise SpecError(
            f"gpu {asked} (--gpu, or accelerator {spec.accelerator!r}) contradicts instance type {itype.name} "
            f"(--instance-type, {itype.gpus} × {itype.gpu_model}): give one of them"
            + (f"; types with {gpu}: {', '.join(with_gpu)}" if with_gpu else f"; aws has no {gpu}")
        )


def _check_gpu_count(c: _Checking) -> None:
    spec, itype = c.spec, c.itype
    if spec.gpus_per_node is not None and int(spec.gpus_per_node) != itype.gpus:
        sizes = [t.name for t in INSTANCE_TYPES.values()
                 if t.gpus == int(spec.gpus_per_node) and t.gpu_model == itype.gpu_model]
        allowed = f"{itype.gpus} (what {itype.name} carries)"
        if sizes:
            allowed += f"; types with {spec.gpus_per_node} GPUs: {', '.join(sizes)}"
        raise SpecError(not_allowed(f"gpus per node for {itype.name}", spec.gpus_per_node, allowed))


def _check_disk(c: _Checking) -> None:
    if c.spec.disk_type is not None and c.spec.disk_type not in DISK_TYPES:
        raise SpecError(not_allowed("aws root disk type", c.spec.disk_type, DISK_TYPES))


def _check_efa(c: _Checking) -> None:
    if option(c.spec, "efa") is not None and efa_requested(c.spec):
        if not c.itype.efa:
            efa_types = [t.name for t in INSTANCE_TYPES.values() if t.efa]
            raise SpecError(
                f"EFA was asked for (option efa=true) but {c.itype.name} does not support it;"
                f" types with EFA: {', '.join(efa_types)}"
            )
        if c.spec.nodes == 1:
            c.warnings.append("EFA on a single node brings nothing: it only speeds up traffic between nodes")


def _check_storage_and_role(c: _Checking) -> None:
    scopes(c.spec)  # SpecError for a malformed s3Read/s3Write URL
    _kms_keys(c.spec)  # SpecError for a value that is not a list of KMS key ARNs
    flag(c.spec, "ssm")  # SpecError for a value that is not true/false
    check_iam_tags(c.spec)


def _check_image(c: _Checking) -> None:
    image = option(c.spec, "image")
    if image is not None and image not in IMAGES:
        raise SpecError(not_allowed("option image", image, list(IMAGES)))
    if image is not None and option(c.spec, "ami") is not None:
        raise SpecError("option image selects the AMI lookup; it cannot be combined with option ami")


def _check_spot_behavior(c: _Checking) -> None:
    behavior = option(c.spec, "spotInterruptionBehavior")
    if behavior is None:
        return
    if not c.spec.spot:
        raise SpecError(
            f"option spotInterruptionBehavior={behavior!r} needs spot=true (this spec is on-demand)"
        )
    if behavior not in SPOT_INTERRUPTION_BEHAVIORS:
        raise SpecError(
            not_allowed(
                "spot interruption behavior",
                behavior,
                "terminate (spot instances in a cluster placement group must terminate on interruption)",
            )
        )


def _check_network(c: _Checking) -> None:
    vpc_id, subnet_id = option(c.spec, "vpcId"), option(c.spec, "subnetId")
    if vpc_id is not None and subnet_id is None:
        raise SpecError(f"option vpcId={vpc_id!r} needs subnetId too: the nodes go into one subnet")
    if subnet_id is not None and option(c.spec, "vpcCidr") is not None:
        raise SpecError("option vpcCidr only applies to a new VPC; it cannot be combined with subnetId")

    cidr = option(c.spec, "vpcCidr")
    if cidr is not None:
        _check_vpc_cidr(str(cidr), c.spec.nodes)


def _check_ssh_cidr(c: _Checking) -> None:
    spec = c.spec
    open_ssh = flag(spec, "allowOpenSsh")
    if spec.ssh_cidr is not None and ":" in str(spec.ssh_cidr):
        # the cluster's VPC, subnet and nodes have IPv4 addresses only: an IPv6 rule admits nobody
        raise SpecError(not_allowed("ssh CIDR", spec.ssh_cidr, "an IPv4 CIDR such as 203.0.113.7/32 (the cluster's "
                                                                  "VPC and nodes are IPv4 only)"))
    if spec.ssh_cidr is None:
        c.warnings.append("no ssh CIDR given: SSH is closed to everyone; set sshCidr to your address/32")
    elif _is_open(spec.ssh_cidr):
        if not open_ssh:
            raise SpecError(
                f"ssh CIDR {spec.ssh_cidr!r} opens SSH to the whole internet and is not allowed;"
                " give your own address (for example 203.0.113.7/32) or set option allowOpenSsh=true"
            )
        c.warnings.append(f"SSH is open to {spec.ssh_cidr} because allowOpenSsh=true")


def _check_ssh_key(c: _Checking) -> None:
    key = option(c.spec, "sshPublicKey")
    if key is not None and not str(key).startswith(("ssh-ed25519 ", "ssh-rsa ")):
        # EC2 imports ED25519 and RSA keys only (ImportKeyPair; "Create a key pair",
        # https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/create-key-pairs.html): ECDSA is refused
        raise SpecError(
            not_allowed("option sshPublicKey", str(key)[:20] + "...",
                        "an OpenSSH ssh-ed25519 or ssh-rsa public key line (EC2 imports no ECDSA keys)")
        )


# The rules of `validate_spec`, in the order they run (the first refusal is the one reported).
_SPEC_RULES: tuple[Callable[[_Checking], None], ...] = (
    _check_region, _check_zone, _check_accelerator, _check_gpu_count, _check_disk, _check_efa,
    _check_storage_and_role, _check_image, _check_spot_behavior, _check_network, _check_ssh_cidr, _check_ssh_key,
)


def validate_spec(spec: "ClusterSpec") -> list[str]:
    """AWS checks on top of `gpucluster.spec.validate`; raise SpecError or return warnings."""
    warnings: list[str] = []
    itype = instance_type_of(spec)
    idle_minutes(spec)  # checked here, before anything is declared
    if spec.instance_type is None:
        warnings.append(f"no instance type given: using {DEFAULT_INSTANCE_TYPE}")
    region = region_of(spec)
    if spec.region is None:
        warnings.append(f"no region given: using {region}")
    checking = _Checking(spec, itype, region, warnings)
    for rule in _SPEC_RULES:
        rule(checking)
    return warnings


def image_of(spec: "ClusterSpec") -> str:
    return str(option(spec, "image") or DEFAULT_IMAGE)


def zone_pinned(spec: "ClusterSpec") -> str | None:
    """Why a capacity failover cannot move this spec to another zone: with option subnetId the nodes
    launch in that subnet, and a subnet is in one zone (EC2 User Guide, "Subnets for your VPC": "Each
    subnet must reside entirely within one Availability Zone"), so a new --zone would retry the same
    zone while saying it tries another. None when the zone can change."""
    subnet = option(spec, "subnetId")
    if not subnet:
        return None
    return (f"option subnetId={subnet} fixes the zone (a subnet is in one zone): pass the subnetId of a subnet "
            "in another zone of the VPC, or leave subnetId (and vpcId) out for a new VPC in the next zone "
            "offering the type")


def ami_name_patterns(spec: "ClusterSpec") -> list[str]:
    """The AMI name filter's values (any of them matches; the newest match is taken)."""
    return list(IMAGES[image_of(spec)])


def ami_name_pattern(spec: "ClusterSpec") -> str:
    """The AMI name filter as one line, for messages."""
    return " or ".join(repr(p) for p in IMAGES[image_of(spec)])


def detect_public_ipv4(url: str | None = None, timeout: float = CHECKIP_TIMEOUT_S) -> str:
    """This machine's public IPv4 as the internet sees it (checkip.amazonaws.com answers with the
    caller's address and a newline). SpecError naming the URL and what to pass when it fails.
    GPUCLUSTER_CHECKIP_URL points elsewhere (tests use a local server)."""
    import ipaddress
    import os
    import urllib.error
    import urllib.request

    url = url or os.environ.get("GPUCLUSTER_CHECKIP_URL") or CHECKIP_URL
    hint = "pass --ssh-cidr YOUR.PUBLIC.IP/32 (who may SSH to the nodes)"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - fixed https URL
            text = resp.read(64).decode("ascii", "replace").strip()
    except (OSError, urllib.error.URLError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise SpecError(f"could not detect this machine's public IPv4 from {url} ({reason}); {hint}") from None
    try:
        addr = ipaddress.IPv4Address(text)
    except ValueError:
        raise SpecError(f"{url} answered {text[:40]!r}, not an IPv4 address; {hint}") from None
    return str(addr)


def detection_proxy() -> str | None:
    """The proxy urllib sends the address check through (from the environment, as urlopen does;
    None when there is none or NO_PROXY exempts the host), with any credentials left out."""
    import os
    import urllib.parse
    import urllib.request

    url = urllib.parse.urlsplit(os.environ.get("GPUCLUSTER_CHECKIP_URL") or CHECKIP_URL)
    proxy = urllib.request.getproxies().get(url.scheme)
    if not proxy or urllib.request.proxy_bypass(url.hostname or ""):
        return None
    where = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    return f"{where.scheme}://{where.hostname}" + (f":{where.port}" if where.port else "")


def prepare(spec: "ClusterSpec", *, dry_run: bool = False, detect=detect_public_ipv4) -> tuple["ClusterSpec", list[str]]:
    # detect=None: leave a missing SSH CIDR missing (a dry run after a failed detection); dry_run: the same
    # detection (its failure in a dry run is the core's note: gpucluster.lifecycle.prepare.prepare_spec)
    """What `run`/`up` fill in before the plan, so the cluster can be reached and fully used:
    GPUs per node from the catalog, and without an SSH CIDR this machine's public IPv4 as /32
    (a cluster the launcher cannot reach is never created). Returns (spec, notes)."""
    notes: list[str] = []
    itype = instance_type_of(spec)
    changes: dict[str, object] = {}
    if spec.gpus_per_node is None:
        changes["gpus_per_node"] = itype.gpus
    if spec.instance_type is None:
        changes["instance_type"] = itype.name
    if spec.ssh_cidr is None and detect is not None:
        ip = detect()
        changes["ssh_cidr"] = f"{ip}/32"
        notes.append(f"SSH allowed from {ip}/32 (this machine's public IPv4, detected; --ssh-cidr overrides)")
        proxy = detection_proxy()
        if proxy:
            notes.append(f"that address was detected through the proxy {proxy} (HTTPS_PROXY/https_proxy): it is the "
                         "proxy's public address, and ssh from this machine may come from another one; pass "
                         "--ssh-cidr with the address your ssh connections leave from")
    spec = spec.replace(**changes) if changes else spec
    if detect is not None:  # a real run: the buckets' KMS keys, read before anything is created
        spec, said = with_bucket_keys(spec)
        notes += said
    return spec, notes


def with_bucket_keys(spec: "ClusterSpec", session: AwsSession = None) -> tuple["ClusterSpec", list[str]]:
    """The spec with option s3KmsKeys naming the customer managed keys of the SSE-KMS buckets it reads
    or writes (none given, some found), and notes (infra/aws/kms.py)."""
    urls = [*spec.reads, *spec.writes]
    if not urls or option(spec, KEYS_OPTION) is not None:
        return spec, []
    import boto3

    arns, notes = bucket_keys([split(u)[0] for u in urls if u.startswith("s3://")],
                              session or boto3.session.Session(region_name=region_of(spec)))
    if arns:
        notes.append(f"the nodes' role may use the buckets' KMS key(s) {', '.join(arns)} (SSE-KMS: kms:Decrypt, "
                     "kms:GenerateDataKey)")
        spec = spec.replace(options=(*spec.options, (KEYS_OPTION, ",".join(arns))))
    return spec, notes


def _kms_keys(spec: "ClusterSpec") -> list[str]:
    keys = keys_of(option(spec, KEYS_OPTION))
    for key in keys:
        if not re.fullmatch(r"arn:aws(-cn|-us-gov)?:kms:[a-z0-9-]+:\d{12}:key/[A-Za-z0-9-]+", key):
            raise SpecError(not_allowed(f"option {KEYS_OPTION}", key, "KMS key ARNs "
                                        "(arn:aws:kms:REGION:ACCOUNT:key/ID), comma-separated"))
    return keys


# How long a node may take to be ready, from EC2's "running" to the ready marker (SpecRules.ready_within):
BOOT_S = 300  # cloud-init reaching runcmd (the DLAMI ships the driver; FACTS.md: GPU images 5-10 min with a driver install)
FIRST_IMPORT_S = 300  # the first `import torch` reads its libraries from a root volume restored lazily from the
# AMI's snapshot: the first read of each block is slow (EBS User Guide, "Initialize Amazon EBS volumes")
TORCH_INSTALL_S = 900  # image=base: apt-get update + python3-venv + pip install torch (~3 GB with its CUDA wheels)
# the node's ready check's own bound on the wait for the driver to list the GPUs: TRIES checks, PAUSE
# seconds apart (user_data.py renders them into node_ready.sh)
READY_TRIES, READY_PAUSE_S = 60, 10


def ready_within(spec: "ClusterSpec") -> tuple[int, str]:
    """(seconds, why) a node of `spec` may need to write its ready marker: boot, the ready check's own
    wait for the GPUs (the same for 1 or 8 of them), the first torch import, and with image=base the
    torch install before them. Only the image changes it: every g5 size runs the same steps."""
    gpu_wait = READY_TRIES * READY_PAUSE_S
    parts = [("boot", BOOT_S), ("the node's wait for its GPUs", gpu_wait), ("first torch import from the lazily "
                                                                             "restored disk", FIRST_IMPORT_S)]
    if image_of(spec) == "base" and option(spec, "ami") is None:
        parts.insert(1, ("image=base installs torch", TORCH_INSTALL_S))
    return sum(s for _, s in parts), " + ".join(f"{what} {s // 60} min" for what, s in parts)


def plan_line(spec: "ClusterSpec", nproc_per_node: int, hourly: Decimal | None = None) -> str:
    """e.g. `2 × g5.12xlarge (4 × A10G each), 8 training processes, $11.34/h`."""
    itype = instance_type_of(spec)
    line = (f"{spec.nodes} × {itype.name} ({itype.gpus} × {itype.gpu_model} each), "
            f"{spec.nodes * nproc_per_node} training processes")
    if hourly is not None:
        from gpucluster.costing.rules import money

        line += f", {money(hourly)}/h"
    return line


def _check_vpc_cidr(cidr: str, nodes: int) -> None:
    """A new VPC's CIDR (its one subnet uses all of it): IPv4, /16 to /28, room for every node.

    AWS allows VPC blocks from /16 to /28 and reserves 5 addresses in every subnet.
    """
    import ipaddress

    allowed = "a private IPv4 block from /16 to /28, such as 10.42.0.0/16"
    try:
        net = ipaddress.ip_network(cidr, strict=True)
    except ValueError:
        raise SpecError(not_allowed("option vpcCidr", cidr, allowed)) from None
    if net.version != 4 or not 16 <= net.prefixlen <= 28:
        raise SpecError(not_allowed("option vpcCidr", cidr, allowed))
    if net.num_addresses - 5 < nodes:
        raise SpecError(
            f"option vpcCidr {cidr!r} has {net.num_addresses - 5} usable addresses, fewer than {nodes} nodes"
        )


def _is_open(cidr: str) -> bool:
    import ipaddress

    return ipaddress.ip_network(cidr, strict=False).prefixlen == 0
