"""The internal price of a run on machines gpucluster does not rent (issue 44, item 4): a core rule, not
a backend hook. A backend whose spec takes the option `pricePerGpuHour` (it is among its
`SpecRules.options`; kubernetes: `--option price-per-gpu-hour`) has its runs priced at that many
dollars per GPU-hour for the time they held the spec's GPUs, said in place of $0. The option
`priceSource` "config" says the price is config.yaml's for the run's context (`contexts.<context>`),
which the backend's `prepare` wrote into the spec; else it was given with `--option`. Not a bill from
any cloud."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Mapping, Protocol

from gpucluster.errors import SpecError, not_allowed

if TYPE_CHECKING:
    from gpucluster.infra.contract import Plugin

PRICE_OPTION = "pricePerGpuHour"  # the option a backend declares to take an internal price
SOURCE_OPTION = "priceSource"  # set by the backend's `prepare`, not by the user
PRICE_FROM_CONFIG = "config"  # priceSource: the price came from config.yaml's `<backend>.contexts.<context>`


class OptionSource(Protocol):
    """What the option readers ask of a spec: an option by key (`ClusterSpec`, or a backend's view of one)."""

    def option(self, key: str) -> object:
        ...


def _text(spec: OptionSource, key: str) -> str | None:
    raw = spec.option(key)
    return None if raw is None or str(raw).strip() == "" else str(raw).strip()


def price_per_gpu_hour(spec: OptionSource) -> Decimal | None:
    """The internal price given, or None ($0: the machines are not rented by gpucluster)."""
    value = _text(spec, PRICE_OPTION)
    if value is None:
        return None
    try:
        price = Decimal(value)
    except InvalidOperation:
        price = Decimal(-1)
    if not price.is_finite() or price < 0 or price > 1000:
        raise SpecError(not_allowed(f"option {PRICE_OPTION}", value, "dollars per GPU-hour, 0 to 1000, e.g. 2.50"))
    return price


def price_source(spec: OptionSource) -> str:
    """Where the internal price came from, for the plan and the report."""
    if _text(spec, SOURCE_OPTION) == PRICE_FROM_CONFIG:
        return f"config.yaml, context {spec.option('context') or '(current)'}"
    return "--option price-per-gpu-hour"


def takes_internal_price(backend: Plugin | None) -> bool:
    """Whether the backend's spec takes the option (`SpecRules.options`); None (a cloud not registered): no."""
    return backend is not None and PRICE_OPTION in backend.spec.options


def internal_cost(backend: Plugin | None, spec: Mapping[str, object], seconds: float) -> tuple[Decimal, str] | None:
    """A run's internal price: (USD, what it is) for its recorded spec (JSON) holding the machines `seconds`,
    or None ($0) where the backend takes no such price, none was given, or the stored spec is odd."""
    if not takes_internal_price(backend):
        return None
    from gpucluster.spec import ClusterSpec

    try:
        parsed = ClusterSpec.from_dict(dict(spec))
        price = price_per_gpu_hour(parsed)
        gpus = int(parsed.gpus_per_node or 0) * int(parsed.nodes)
    except Exception:  # noqa: BLE001 - an odd stored spec: no internal price
        return None
    if price is None:
        return None
    amount = (price * gpus * Decimal(str(seconds)) / 3600).quantize(Decimal("0.0001"))
    return amount, (f"an internal price of ${price}/GPU-hour ({price_source(parsed)}) × {gpus} GPU(s) × "
                    f"{seconds / 3600:.4f} h = ${amount}; not a bill from any cloud")
