"""`--cloud auto|A,B`, `--region auto|A,B`, `--max-hourly`, `--max-attempts` on `run`, `up`, `sweep` and
`cost estimate`: the candidates ranked before anything is created (gpucluster.plan.placement), the table
the plan shows, and the plan of the one chosen."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpucluster.errors import UsageError
from gpucluster.plan.placement import wanted  # noqa: F401 (the commands ask it through here)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from decimal import Decimal

    from rich.console import Console

    from gpucluster.domain import Provider
    from gpucluster.infra.contract import Plugin
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.prepare import Prepared, Request
    from gpucluster.lifecycle.recovery import ChainOutcome, Policy
    from gpucluster.lifecycle.steps import RunUI
    from gpucluster.plan.placement import Candidate, Placement
    from gpucluster.spec import ClusterSpec
    from gpucluster.states import JsonObject


def placeable() -> tuple[str, ...]:
    """The clouds placement chooses among: those gpucluster creates on and prices (aws, gcp)."""
    from gpucluster.infra.registry import priced, provisioning

    return tuple(c for c in provisioning() if c in priced())


def prepared(flags: dict[str, Any], *, provider_for: Callable[[str], Provider] | None = None, strict_prices: bool = True,
             given: Mapping[str, tuple[tuple[str, ...], object]] | None = None, **request: Any) -> tuple[Plugin, Prepared, Placement | None]:
    # Any: the command's flags and `request` are `prepare.Request`'s fields, each of its own type
    """(the chosen cloud's plugin, its plan, the Placement or None) for a command's flags (`prepare.Request`'s
    fields plus `max_hourly` and `max_attempts`, taken out here; `request`: more of its fields). One cloud
    and one region, with neither limit: the plan as before (no placement). `provider_for(cloud)`: a
    provider of the command's own (`up`), instead of the backend's."""
    from gpucluster.plan import placement as pl
    from gpucluster.cli.args import check_cloud_flags
    from gpucluster.infra.registry import plugin, provisioning, readers
    from gpucluster.lifecycle.prepare import Request, check_before_recording, prepare

    max_hourly = pl.parse_max_hourly(flags.pop("max_hourly", None))
    max_attempts = flags.pop("max_attempts", None)
    allow_egress = bool(flags.pop("allow_egress", False))
    cloud = flags["cloud"]
    req = Request(**flags, **request, provisioning=provisioning(), readers=readers())
    if not pl.wanted(cloud, flags.get("region")) and max_hourly is None and max_attempts is None:
        chosen = plugin(cloud)
        if given is None:
            check_cloud_flags(cloud)
        else:  # the Python API (api/): the settings it was given, checked the same way
            from gpucluster.cli.args import refuse_flags

            refuse_flags(cloud, dict(given))
        return chosen, prepare(req, chosen, provider=provider_for(cloud) if provider_for else None,
                               strict_prices=strict_prices), None
    clouds = pl.parse_clouds(cloud, placeable())
    backends = {c: plugin(c) for c in clouds}
    absent = _without_credentials(backends) if cloud.strip() == pl.AUTO and not req.dry_run else {}
    backends = {c: b for c, b in backends.items() if c not in absent}
    check_regions(flags.get("region"), backends)
    if flags.get("instance_type") and len(clouds) > 1:
        raise UsageError(f"--instance-type {flags['instance_type']} names one cloud's machine: with --cloud {cloud} "
                         "give --gpu TYPE[:COUNT] instead (each cloud picks its machine)")

    own = _own_flags(req, backends)
    if req.project is not None:  # a bad --project is the user's to fix, not a reason to place elsewhere
        from gpucluster.lifecycle.prepare import check_place

        check_place({c: b for c, b in backends.items() if "project" in b.traits.flags}, project=req.project)

    def one(r: Request, backend: Plugin) -> Prepared:  # each cloud gets the cloud-only flags it takes (--project: gcp)
        r = replace(r, **own[backend.name])
        return prepare(r, backend, provider=provider_for(r.cloud) if provider_for else None, strict_prices=True)

    placement = pl.place(req, backends, prepare=one, preflight=None if req.dry_run else check_before_recording,
                         max_hourly=max_hourly, max_attempts=max_attempts, allow_egress=allow_egress,
                         facts=bucket_facts)
    placement.dropped[:0] = [pl.Candidate(c, None, dropped=why) for c, why in absent.items()]
    return backends[placement.chosen.cloud], placement.chosen.plan, placement


def bucket_facts(cloud: str) -> Callable[[str], tuple[str | None, int | None]] | None:
    """`cloud`'s bucket lookup (URL -> its region, the bytes under it), or None where it has none."""
    from gpucluster.infra.registry import plugin

    return plugin(cloud).ops.bucket_facts


def _without_credentials(backends: dict[str, Plugin]) -> dict[str, str]:
    """`--cloud auto` places on the clouds whose credentials this machine has: cloud -> what was looked
    for, for the others; none has them: exit 2 naming what was looked for."""
    absent = {c: why for c, b in backends.items() if b.ops.credentials_found is not None
              for why in [b.ops.credentials_found()] if why}
    if len(absent) == len(backends):
        raise UsageError("--cloud auto: no cloud's credentials were found: "
                         + "; ".join(f"{c}: {why}" for c, why in absent.items()))
    return absent


def _own_flags(req: Request, backends: dict[str, Plugin]) -> dict[str, dict[str, Any]]:
    # Any: `Request`'s defaults, each field of its own type
    """Per cloud, the cloud-only flags given that it does not take, set back to their defaults (it would
    refuse them); a flag none of the clouds takes is refused, as `run --cloud X` refuses it."""
    from dataclasses import MISSING, fields

    from gpucluster.cli.args import cloud_only_flags

    defaults = {f.name: f.default for f in fields(req) if f.default is not MISSING}
    defaults.update({f.name: f.default_factory() for f in fields(req) if f.default_factory is not MISSING})
    given = [k for k in cloud_only_flags() if k in defaults and getattr(req, k) != defaults[k]]
    for k in given:
        if not any(k in b.traits.flags for b in backends.values()):
            flag = "--" + k.replace("_", "-")
            raise UsageError(f"{flag} does not apply to --cloud {req.cloud}: none of {', '.join(backends)} uses it; "
                             "remove it")
    return {c: {k: defaults[k] for k in given if k not in b.traits.flags} for c, b in backends.items()}


def run_failover(placement: Placement, *, ledger: Ledger, ui: RunUI | None, keep: bool,
                 reprice: Callable[[Plugin], Callable[[ClusterSpec], JsonObject | None] | None],
                 policy_of: Callable[[Policy | None], Policy | None]) -> ChainOutcome:
    """`run` on a placement: the chosen candidate, then the next on capacity or quota errors
    (gpucluster.lifecycle.failover); each candidate's plan with the run's policy, linked to the last attempt."""
    from gpucluster.lifecycle.failover import run_placed
    from gpucluster.infra.registry import plugin
    from gpucluster.lifecycle.recovery import run_plan

    backends = {c.cloud: plugin(c.cloud) for c in placement.tried}

    def one(cand: Candidate, after: str | None) -> ChainOutcome:
        plan, backend = cand.plan, backends[cand.cloud]
        plan.policy = policy_of(plan.policy)
        if after is not None and plan.resumed_from is None:  # the chain `show` and `cost report` follow
            plan.resumed_from = after
        return run_plan(plan, ledger=ledger, ui=ui, backend=backend, keep=keep, reprice=reprice(backend))

    return run_placed(placement, ledger=ledger, ui=ui, run_one=one)


def check_regions(asked: str | None, backends: Mapping[str, Plugin]) -> None:
    """Each region of a --region list is one at least one of the clouds knows; else exit 2 naming it."""
    from gpucluster.plan.placement import AUTO, split_list, knows_region

    if asked is None or asked.strip() == AUTO:
        return
    for region in split_list("--region", asked):
        if not any(knows_region(b, c, region) for c, b in backends.items()):
            raise UsageError(f"--region {region!r} is not allowed: no region of {', '.join(backends)} by that name "
                             "(`gpucluster prices` lists the regions priced)")


def print_placement(out: Console, placement: Placement, top: int = 10) -> None:
    """The ranking as the plan shows it (and `cost estimate --cloud auto`)."""
    from gpucluster.cli.tables import Col, fitted
    from gpucluster.plan.placement import table_rows

    hours = placement.hours.normalize()
    out.print(f"[bold]placement[/bold]: {len(placement.ranked)} candidate(s) ranked by the estimated total for "
              f"{hours:f} h, {len(placement.dropped)} dropped"
              + (f"; at most {placement.max_attempts} tried" if placement.max_attempts else ""), highlight=False)
    cols = [Col("#", keep=True), Col("cloud", keep=True), Col("region", keep=True), Col("zones", drop=2),
            Col("instance type", keep=True), Col("$/h", keep=True, justify="right"),
            Col("est. total", keep=True, justify="right"), Col("egress", drop=3, justify="right"), Col("note", drop=1)]
    out.print(fitted(out.width, cols, table_rows(placement, top)))


def estimate_placed(build_spec: Callable[..., ClusterSpec], cloud: str | None, region: str | None,
                    max_hourly: str | None, as_json: bool, hours: float | str | Decimal | None,
                    shape: dict[str, Any]) -> None:  # Any: the shape's flags, each of its own type
    """`cost estimate --cloud auto|A,B` / `--region auto|A,B`: every candidate priced as a one-cloud estimate
    is, ranked (gpucluster.plan.placement); the table, or its JSON."""
    from dataclasses import replace
    from decimal import Decimal
    from types import SimpleNamespace

    from gpucluster.costing.cost import estimate
    from gpucluster.infra.registry import plugin
    from gpucluster.plan.placement import parse_clouds, parse_max_hourly, place
    from gpucluster.lifecycle.prepare import Request
    from gpucluster.spec import normalize, resolve, validate

    backends = {c: plugin(c) for c in parse_clouds(cloud or "auto", placeable())}
    check_regions(region, backends)
    span = Decimal(str(hours if hours is not None else "1"))

    def one(req: Request, backend: Plugin) -> SimpleNamespace:
        given = {**shape, "zone": req.zone, "instance_type": req.instance_type}  # each machine of a place
        spec = resolve(normalize(build_spec(**given, cloud=req.cloud, region=req.region), backend), backend)
        validate(spec, backend)
        return SimpleNamespace(spec=spec, estimate=estimate(spec, span, backend=backend), limit_minutes=span * 60)

    placement = place(replace(Request(cloud=cloud or "auto"), gpu=shape["gpu"], region=region, zone=shape["zone"],
                              instance_type=shape["instance_type"]), backends,
                      prepare=one, preflight=None, max_hourly=parse_max_hourly(max_hourly))
    if as_json:
        import json

        import click

        click.echo(json.dumps(placement.to_dict(), indent=1))
        return
    from gpucluster.cli.common import console

    print_placement(console(), placement)
