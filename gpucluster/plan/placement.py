"""Placement (docs/placement.md): `--cloud auto`, `--cloud aws,gcp`, `--region auto`, `--region A,B`.

Every (cloud, region) the request allows is a candidate. Each is prepared exactly as a run of that
one cloud and region is (`gpucluster.lifecycle.prepare.prepare`: the `--gpu` pick, validation, the estimate
`cost estimate` makes, fixed fees included) and priced for the run's limit; a real run also asks
the cloud's preflight (credentials, quotas, permissions, APIs). A candidate any of these refuse is
dropped with the reason; the rest are ranked by the estimate's total. A dry run reaches no cloud:
its candidates carry the preflight checks it could not run as "not checked", and none is dropped
for them.

Cloud-agnostic: the backends are passed in by the command (`backends`: name -> plugin).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from gpucluster.plan import egress as eg
from gpucluster.plan.egress import Egress
from gpucluster.errors import GpuclusterError, UsageError, not_allowed
from gpucluster.states import JsonMapping, JsonObject

if TYPE_CHECKING:
    from gpucluster.costing.estimate import Estimate
    from gpucluster.infra.contract import Plugin

AUTO = "auto"
NOT_CHECKED = ("credentials", "quota", "permissions", "enabled APIs")  # what a dry run's preflight skips


def wanted(cloud: str | None, region: str | None) -> bool:
    """Whether the flags ask for placement (a list or `auto` in --cloud or --region)."""
    return any(isinstance(v, str) and (v.strip() == AUTO or "," in v) for v in (cloud, region))


def split_list(flag: str, text: str) -> list[str]:
    parts = [p.strip() for p in text.split(",")]
    if not all(parts):
        raise UsageError(f"{flag} {text!r} is not allowed: a comma-separated list without empty items, or {AUTO}")
    return list(dict.fromkeys(parts))


def parse_clouds(text: str, placeable: Sequence[str]) -> tuple[str, ...]:
    """`auto` -> every cloud placement can create on; a list -> its names, each one of those."""
    if text.strip() == AUTO:
        return tuple(placeable)
    names = split_list("--cloud", text)
    for name in names:
        if name not in placeable:
            raise UsageError(not_allowed("--cloud", name, [*placeable, AUTO]) + " (a list or auto places on clouds "
                             "gpucluster creates and prices)")
    return tuple(names)


def parse_max_hourly(text: str | None) -> Decimal | None:
    """`--max-hourly 12.5` or `$12.50` -> Decimal; UsageError naming the value otherwise."""
    if text is None:
        return None
    try:
        value = Decimal(str(text).strip().lstrip("$"))
    except ArithmeticError:
        value = Decimal(-1)
    if not value.is_finite() or value <= 0:
        raise UsageError(f"--max-hourly {text!r} is not allowed: a price in dollars per hour above 0, e.g. 12.5")
    return value


@dataclass
class Candidate:
    cloud: str
    region: str | None
    zones: tuple[str, ...] = ()
    instance_type: str | None = None
    hourly: Decimal | None = None
    total: Decimal | None = None
    dropped: str | None = None  # why it is not ranked (None: ranked)
    not_checked: tuple[str, ...] = ()  # preflight checks a dry run could not make
    plan: Any = field(default=None, repr=False)  # the prepared plan (gpucluster.lifecycle.prepare.Prepared)
    egress: Egress | None = None  # what its data and outputs cost in transfer (in `total` where known)

    @property
    def where(self) -> str:
        return f"{self.cloud} {self.region or '-'}" + (f" ({', '.join(self.zones)})" if self.zones else "")

    def to_dict(self) -> JsonObject:
        money = (lambda v: None if v is None else str(v))
        return {"cloud": self.cloud, "region": self.region, "zones": list(self.zones),
                "instance_type": self.instance_type, "hourly": money(self.hourly), "total": money(self.total),
                "dropped": self.dropped, "not_checked": list(self.not_checked),
                "egress": None if self.egress is None else self.egress.to_dict()}


@dataclass
class Placement:
    ranked: list[Candidate]
    dropped: list[Candidate]
    hours: Decimal  # what `total` covers
    max_attempts: int | None = None

    @property
    def chosen(self) -> Candidate:
        return self.ranked[0]

    @property
    def tried(self) -> list[Candidate]:
        """The candidates failover goes through, in order (--max-attempts of them)."""
        return self.ranked[: self.max_attempts] if self.max_attempts else list(self.ranked)

    def to_dict(self) -> JsonObject:
        return {"candidates": [c.to_dict() for c in self.ranked], "dropped": [c.to_dict() for c in self.dropped],
                "chosen": self.chosen.to_dict(), "hours": str(self.hours), "max_attempts": self.max_attempts}


def _gpu_shapes(backend: Plugin, gpu: str | None) -> list[JsonMapping]:
    """The cloud's shapes carrying exactly the `--gpu` count (none without --gpu)."""
    if gpu is None:
        return []
    from gpucluster.catalog.gpus import parse

    name, count = parse(gpu)
    return [s for s in backend.spec.gpu_shapes() if s.get("gpu") == name and int(str(s.get("gpus") or 0)) == count]


def _regions(cloud: str, backend: Plugin, gpu: str | None, asked: str | None, shapes: list[JsonMapping]) -> list[str]:
    """The regions `asked` names that the cloud knows; `auto` or None: those priced (and selling the GPU)."""
    from gpucluster.catalog.prices import load_catalog

    if asked is not None and asked.strip() != AUTO:
        return [r for r in split_list("--region", asked) if knows_region(backend, cloud, r)]
    priced = {row.region for row in load_catalog().rows.values() if row.cloud == cloud and row.region}
    return sorted(priced) if gpu is None else sorted(
        {str(r) for s in shapes for r in s.get("regions") or () if r in priced})


def _zones(region: str, shapes: list[JsonMapping]) -> list[str]:
    return sorted({str(z) for s in shapes for z in s.get("zones") or () if str(z).startswith(f"{region}-")})


def places_for(cloud: str, backend: Plugin, gpu: str | None, asked: str | None,
               zone: str | None = None) -> list[tuple[str | None, str | None]]:
    """The (region, zone) pairs of `cloud` to try. Regions: those of `asked` (a list: only the ones this
    cloud knows; `auto` or None: every region where its catalog has the GPU, or that its price rows
    cover). Zones: where the cloud's shapes name zones (gcp: a zonal cluster), each zone of the region
    that sells the GPU, in order; else None (aws: the fleet and the provider choose among the region's)."""
    shapes = _gpu_shapes(backend, gpu)
    out: list[tuple[str | None, str | None]] = []
    for region in _regions(cloud, backend, gpu, asked, shapes):
        zones = _zones(region, shapes)
        out.extend((region, z) for z in (zones if zones and zone is None else [zone]))
    return out or [(None, zone)]


def knows_region(backend: Plugin, cloud: str, region: str) -> bool:
    from gpucluster.spec import ClusterSpec, resolve, validate

    try:
        validate(resolve(ClusterSpec(cloud=cloud, nodes=1, region=region), backend), backend)
    except UsageError:
        return False
    return True


def machines(backend: Plugin, gpu: str | None, region: str | None) -> list[str]:
    """Every machine of the cloud's catalog that carries exactly the `--gpu` count asked in `region`,
    in the catalog's order (each becomes a candidate where it prepares: offered and priced there)."""
    if gpu is None or region is None:
        return []
    from gpucluster.catalog.gpus import parse

    name, count = parse(gpu)
    shapes: list[JsonMapping] = list(backend.spec.gpu_shapes())  # the contract's JSON-shaped rows
    return [str(s["machine"]) for s in shapes if s.get("gpu") == name and s.get("machine")
            and int(str(s.get("gpus") or 0)) == count and region in (s.get("regions") or ())]


def candidates(req: Any, backends: Mapping[str, Plugin], *, prepare: Callable[[Any, Any], Any],
               preflight: Callable[[Any], None] | None, allow_egress: bool = False,
               facts: Callable[[str], eg.Facts | None] | None = None) -> list[Candidate]:
    """Every (cloud, region, zone, machine) of the request, each prepared as a run there
    (`prepare(request, backend)`), priced with what its data costs in transfer (gpucluster.plan.egress;
    `facts(cloud)`: that cloud's bucket lookup, asked in a real run), and (a real run: `preflight`
    given) checked against the cloud; unranked."""
    from gpucluster.catalog.prices import load_catalog

    catalog, readers = load_catalog(), dict(req.readers or {})
    known = {b.url: b for b in eg.looked_up(eg.buckets(req.data, req.output, (), (), readers),
                                            facts if preflight is not None else None)}
    out: list[Candidate] = []
    for cloud, backend in backends.items():
        foreign = [b for b in known.values() if b.cloud != cloud]
        if foreign:  # another cloud's bucket: egress at internet rates, or not readable at all
            b = foreign[0]
            readable = cloud in readers.get(b.url.split("://", 1)[0], ())
            if not (allow_egress and readable):
                out.append(Candidate(cloud, None, dropped=eg.refusal(b, cloud, None, catalog, readable)))
                continue
        seen: set[tuple[Any, ...]] = set()
        for region, zone in places_for(cloud, backend, req.gpu, req.region, req.zone):
            types = [None] if req.instance_type else [None, *machines(backend, req.gpu, region)]
            for machine in types:
                r = replace(req, cloud=cloud, region=region, zone=zone, instance_type=machine or req.instance_type)
                cand = Candidate(cloud, region, (zone,) if zone else (), instance_type=machine)
                try:
                    plan = prepare(r, backend)
                except GpuclusterError as exc:
                    if machine is None:  # the --gpu pick itself: said; another machine: not offered there
                        cand.dropped = exc.message
                        out.append(cand)
                        break
                    continue
                spec = plan.spec
                key = (spec.region, spec.zone, spec.instance_type or _priced_machine(plan.estimate))
                if key in seen:  # the --gpu pick, met again by name
                    continue
                seen.add(key)
                out.append(_priced(cand, plan, known, readers, catalog, allow_egress, facts, preflight))
    return out


def _priced_machine(est: Estimate | None) -> str | None:
    """The machine an estimate priced (`--gpu`'s pick), or None without an estimate."""
    return est.instance_type if est is not None else None


def _priced(cand: Candidate, plan: Any, known: dict[str, eg.Bucket], readers: Mapping[str, Sequence[str]], catalog: Any,
            allow_egress: bool, facts: Callable[[str], eg.Facts | None] | None,
            preflight: Callable[[Any], None] | None) -> Candidate:
    spec, est = plan.spec, plan.estimate
    cand.plan, cand.region = plan, spec.region
    cand.instance_type = spec.instance_type or _priced_machine(est)
    cand.zones = (spec.zone,) if spec.zone else ()
    cand.hourly, cand.total = (est.hourly, est.total) if est is not None else (None, None)
    more = [b for b in eg.buckets((), None, spec.reads, spec.writes, readers) if b.url not in known]
    for b in eg.looked_up(more, facts if preflight is not None else None):  # a resumed run's bucket
        known[b.url] = b
    found = [known[u] for u in dict.fromkeys(
        [b.url for b in eg.buckets((), None, spec.reads, spec.writes, readers)] + list(known))]
    crossed = [b for b in found if eg.crossing(b, cand.cloud, cand.region) is not None]
    if crossed and not allow_egress:
        cand.dropped = eg.refusal(crossed[0], cand.cloud, cand.region, catalog, True)
        return cand
    cand.egress = eg.priced(found, cand.cloud, cand.region, catalog)
    if cand.egress is not None and cand.egress.cost and cand.total is not None:
        cand.total += cand.egress.cost
    if est is None:
        cand.dropped = "not priced"
    elif preflight is None:
        cand.not_checked = NOT_CHECKED
    else:
        try:
            preflight(plan)
        except GpuclusterError as exc:
            cand.dropped = exc.message
    return cand


def rank(found: list[Candidate], hours: Decimal, *, max_hourly: Decimal | None = None,
         max_attempts: int | None = None) -> Placement:
    """Ranked by total (then $/h, cloud, region); above `max_hourly` dropped; none left: a UsageError
    naming every candidate and why it was dropped."""
    for c in found:
        if c.dropped is None and max_hourly is not None and c.hourly is not None and c.hourly > max_hourly:
            c.dropped = f"${c.hourly:.2f}/h is above --max-hourly ${max_hourly}"
    ranked = sorted((c for c in found if c.dropped is None),
                    key=lambda c: (c.total, c.hourly, c.cloud, c.region or "", c.zones))
    dropped = [c for c in found if c.dropped is not None]
    if not ranked and len({c.dropped for c in dropped}) == 1 and len(dropped) > 1:
        raise UsageError(str(dropped[0].dropped))  # the same for every candidate: the request's own fault
    if not ranked:
        why = "; ".join(f"{c.where}: {c.dropped}" for c in dropped) or "none matched"
        raise UsageError(f"no candidate is left to place the cluster ({len(dropped)} dropped): {why}")
    return Placement(ranked, dropped, hours, max_attempts)


def place(req: Any, backends: Mapping[str, Plugin], *, prepare: Callable[[Any, Any], Any],
          preflight: Callable[[Any], None] | None, max_hourly: Decimal | None = None,
          max_attempts: int | None = None, allow_egress: bool = False,
          facts: Callable[[str], eg.Facts | None] | None = None) -> Placement:
    from gpucluster.plan.shared_answers import sharing

    with sharing():  # what candidates of one place ask their cloud alike is asked once (a region's quota, ...)
        found = candidates(req, backends, prepare=prepare, preflight=preflight, allow_egress=allow_egress,
                           facts=facts)
    plans = [c.plan for c in found if c.plan is not None]
    hours = Decimal(str(plans[0].limit_minutes)) / 60 if plans else Decimal(1)
    return rank(found, hours, max_hourly=max_hourly, max_attempts=max_attempts)


def table_rows(placement: Placement, top: int = 10) -> list[tuple[str, ...]]:
    """The plan's table: rank, cloud, region, zones, instance type, $/h, est. total, egress, note; the
    first `top` ranked and dropped, then one row each saying how many more."""
    rows: list[tuple[str, ...]] = []
    for i, c in enumerate(placement.ranked[:top], 1):
        note = "chosen" if i == 1 else ""
        if c.not_checked:
            note = (note + "; " if note else "") + "not checked: " + ", ".join(c.not_checked)
        if c.egress is not None and c.egress.cost is None and c.egress.why != eg.NOT_CHECKED:
            note = (note + "; " if note else "") + "; ".join(c.egress.lines)
        rows.append((str(i), c.cloud, c.region or "-", ", ".join(c.zones) or "any", c.instance_type or "-",
                     _money(c.hourly), _money(c.total), _egress(c), note))
    left = len(placement.ranked) - top
    if left > 0:
        rows.append(("…", "", "", "", "", "", "", "", f"{left} more ranked (--json lists them all)"))
    for c in placement.dropped[:top]:
        rows.append(("-", c.cloud, c.region or "-", ", ".join(c.zones) or "-", c.instance_type or "-",
                     _money(c.hourly), _money(c.total), "-", f"dropped: {c.dropped}"))
    if len(placement.dropped) > top:
        rows.append(("…", "", "", "", "", "", "", "", f"{len(placement.dropped) - top} more dropped"))
    return rows


def _egress(c: Candidate) -> str:
    if c.egress is None:
        return "-"
    if c.egress.cost is None:
        return c.egress.why or "size unknown"
    return f"{_money(c.egress.cost)} ({c.egress.gb} GB)"


def _money(value: Decimal | None) -> str:
    return "-" if value is None else f"${value.quantize(Decimal('0.01'))}"
