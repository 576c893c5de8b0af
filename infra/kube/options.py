"""The `--option K=V` keys of `--cloud kubernetes`, each checked for form before anything is looked up
(one line naming the bad value and what is allowed), and the typed values the other modules read.

Forms, from the Kubernetes docs: names of namespaces are DNS-1123 labels ("Namespaces"); names of
service accounts, Secrets and PriorityClasses DNS-1123 subdomains ("Object Names and IDs"); label keys
an optional DNS-subdomain prefix and a name of at most 63 characters, label values at most 63 characters
of [A-Za-z0-9._-] beginning and ending alphanumeric ("Labels and Selectors"); extended resources such
as `nvidia.com/gpu` a domain-prefixed name ("Resource Management for Pods and Containers"); taint effects
NoSchedule, PreferNoSchedule and NoExecute ("Taints and Tolerations"); a Kueue LocalQueue is named by
the `kueue.x-k8s.io/queue-name` label on the Job (Kueue docs, "Run a Job"), so its name is a label value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

# the internal price is the core's rule for any backend whose options take pricePerGpuHour: read here to check
# the options, by the plan line and by `prepare` (which writes config.yaml's price for the context into them)
from gpucluster.costing.internal import PRICE_FROM_CONFIG, price_per_gpu_hour, price_source  # noqa: F401
from gpucluster.errors import SpecError, not_allowed

from .gpus import PRODUCT_LABEL  # set on GPU nodes by NVIDIA GPU feature discovery (gpus.py)

if TYPE_CHECKING:
    from gpucluster.spec import ClusterSpec


class OptionSource(Protocol):
    """What the option readers ask of a spec: an option by key (`ClusterSpec`, `platform.OptionView`)."""

    def option(self, key: str) -> object:
        ...

OPTIONS = (
    "context",  # --context: the kubeconfig context [default: its current context]
    "namespace",  # --namespace: [default: the context's namespace, else default]
    "createNamespace",  # --create-namespace: make a missing namespace (removed after the run)
    "image",
    "launcher",  # job (Indexed Job + headless Service) | pytorchjob (Kubeflow)
    "gpuResource",  # the extended resource the pods request [default: nvidia.com/gpu]
    "gpuProduct",  # only nodes labelled nvidia.com/gpu.product=VALUE (GPU feature discovery)
    "pricePerGpuHour",  # an internal price per GPU-hour (gpucluster.costing.internal) [default: config.yaml's for the context, else 0]
    "priceSource",  # set by `provider.prepare` (config: the price is config.yaml's for the context), not by the user
    "queue",  # a Kueue LocalQueue: the Job waits for its admission within the start deadline
    "priorityClass",
    "nodeSelector",  # k=v[,k=v]
    "tolerations",  # key[=value]:Effect[,...] (as kubectl taint writes a taint)
    "serviceAccount",
    "imagePullSecret",
)
LAUNCHERS = ("job", "pytorchjob")
GPU_RESOURCE = "nvidia.com/gpu"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
DEFAULT_NAMESPACE = "default"

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}$")
_VALUE = re.compile(rf"^({_NAME})?$")
_RESOURCE = re.compile(rf"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+/{_NAME}$")


def _text(spec: OptionSource, key: str) -> str | None:
    raw = spec.option(key)
    return None if raw is None or str(raw).strip() == "" else str(raw).strip()


def _named(spec: OptionSource, key: str, pattern: re.Pattern[str], allowed: str) -> str | None:
    value = _text(spec, key)
    if value is not None and not pattern.match(value):
        raise SpecError(not_allowed(f"option {key}", value, allowed))
    return value


def namespace(spec: OptionSource) -> str | None:
    """The namespace given (--namespace), or None: the context's, else `default` (access.py)."""
    return _named(spec, "namespace", _LABEL, "a DNS-1123 label: lowercase letters, digits and '-', at most 63")


def create_namespace(spec: OptionSource) -> bool:
    from gpucluster.spec import parse_bool

    return parse_bool("option createNamespace", spec.option("createNamespace"), False)


def gpu_resource(spec: OptionSource) -> str:
    return _named(spec, "gpuResource", _RESOURCE, "an extended resource such as nvidia.com/gpu or amd.com/gpu") \
        or GPU_RESOURCE


def gpu_product(spec: OptionSource) -> str | None:
    return _named(spec, "gpuProduct", _VALUE, "a label value such as NVIDIA-A100-SXM4-80GB")


def labels(text: str, key: str) -> dict[str, str]:
    """`k=v[,k=v]`, each key and value of label form."""
    out: dict[str, str] = {}
    for part in text.split(","):
        k, eq, v = part.strip().partition("=")
        if not eq or not _KEY.match(k.strip()) or not _VALUE.match(v.strip()):
            raise SpecError(not_allowed(f"option {key}", text, "label pairs k=v[,k=v] (Kubernetes label syntax)"))
        out[k.strip()] = v.strip()
    return out


@dataclass(frozen=True)
class Toleration:
    key: str
    value: str | None
    effect: str


def tolerations(text: str) -> list[Toleration]:
    """`key[=value]:Effect[,...]` (kubectl taint's syntax): Equal with a value, Exists without."""
    out = []
    allowed = f"key[=value]:Effect[,...] with Effect one of {', '.join(EFFECTS)}"
    for part in text.split(","):
        body, colon, effect = part.strip().rpartition(":")
        k, eq, v = body.partition("=")
        if not colon or effect not in EFFECTS or not _KEY.match(k) or (eq and not _VALUE.match(v)):
            raise SpecError(not_allowed("option tolerations", text, allowed))
        out.append(Toleration(k, v if eq else None, effect))
    return out


@dataclass(frozen=True)
class Passthrough:
    """What the user's options add to the run's objects (platform.shape)."""

    queue: str | None = None
    priority_class: str | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    service_account: str | None = None
    image_pull_secret: str | None = None


def passthrough(spec: OptionSource) -> Passthrough:
    sub = "a DNS-1123 subdomain: lowercase letters, digits, '-' and '.'"
    selector = _text(spec, "nodeSelector")
    tol = _text(spec, "tolerations")
    product = gpu_product(spec)
    chosen = labels(selector, "nodeSelector") if selector else {}
    if product:
        chosen[PRODUCT_LABEL] = product
    return Passthrough(
        queue=_named(spec, "queue", _VALUE, "a Kueue LocalQueue name (a label value, at most 63 characters)"),
        priority_class=_named(spec, "priorityClass", _SUBDOMAIN, sub),
        node_selector=tuple(sorted(chosen.items())),
        tolerations=tuple(tolerations(tol)) if tol else (),
        service_account=_named(spec, "serviceAccount", _SUBDOMAIN, sub),
        image_pull_secret=_named(spec, "imagePullSecret", _SUBDOMAIN, sub),
    )


def validate_spec(spec: ClusterSpec) -> list[str]:
    """Every option checked for form; the cluster itself is asked only by the provider's preflight."""
    namespace(spec)
    create_namespace(spec)
    gpu_resource(spec)
    price_per_gpu_hour(spec)
    source = _text(spec, "priceSource")
    if source is not None and (source != PRICE_FROM_CONFIG or price_per_gpu_hour(spec) is None):
        raise SpecError(not_allowed("option priceSource", source, "set by gpucluster only (a price from config.yaml)"))
    passthrough(spec)
    launcher = (_text(spec, "launcher") or "job").lower()
    if launcher not in LAUNCHERS:
        raise SpecError(not_allowed("option launcher", launcher, LAUNCHERS))
    if spec.spot:
        raise SpecError("--spot is not allowed with --cloud kubernetes: the cluster's nodes are not rented by gpucluster")
    check_gpu(spec)
    return []


def gpu(spec: ClusterSpec) -> str | None:
    """The catalog's name of the GPU `--gpu` (or a task file's `gpu:`, a stack's `accelerator`) asks for."""
    from gpucluster.catalog.gpus import lookup

    known = lookup(spec.accelerator) if spec.accelerator else None
    return known.name if known else None


def pinned_product(spec: OptionSource) -> str | None:
    """The exact product label value the user gave: --option gpu-product, else node-selector's."""
    selector = _text(spec, "nodeSelector")
    return gpu_product(spec) or (labels(selector, "nodeSelector").get(PRODUCT_LABEL) if selector else None)


def check_gpu(spec: ClusterSpec) -> None:
    """--gpu TYPE against the options that also choose the nodes' GPU: each contradiction named, both sides."""
    from gpucluster.catalog.gpus import GPUS

    from .gpus import names_other

    selector = _text(spec, "nodeSelector")
    chosen = labels(selector, "nodeSelector").get(PRODUCT_LABEL) if selector else None
    product = gpu_product(spec)
    if product and chosen and product != chosen:
        raise SpecError(f"--option gpu-product={product} and --option node-selector={PRODUCT_LABEL}={chosen} name "
                        "different nodes: give one of them")
    if spec.accelerator is None:
        return
    name = gpu(spec)
    if name is None:
        raise SpecError(not_allowed("--gpu", spec.accelerator, f"a GPU of the catalog: {', '.join(GPUS)}"))
    resource = gpu_resource(spec)
    if not resource.startswith("nvidia.com/"):
        raise SpecError(f"--gpu {name} chooses nodes by NVIDIA's {PRODUCT_LABEL} label, and --option "
                        f"gpu-resource={resource} is not an NVIDIA resource: give one of them")
    for flag, value in ((f"--option gpu-product={product}", product),
                        (f"--option node-selector={PRODUCT_LABEL}={chosen}", chosen)):
        if value and names_other(name, value):
            raise SpecError(f"--gpu {name} and {flag} name different GPUs: give one of them (--gpu alone "
                            f"selects the nodes whose {PRODUCT_LABEL} names {name})")


def resolve(spec: ClusterSpec) -> ClusterSpec:
    """GPUs per node: 1 unless given (a shared cluster is asked for what the job needs, not a whole node)."""
    return spec.replace(gpus_per_node=1 if spec.gpus_per_node is None else spec.gpus_per_node)
