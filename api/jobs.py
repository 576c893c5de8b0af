"""`gpucluster.run(...)`: provision, train, tear down, report, from Python; and the two steps that
`gpucluster run` (cli/run.py) takes through the same code: `plan_run` (the flags as a validated,
priced plan) and `execute_plan` (the run, then its events to `on_event` and the webhooks)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from gpucluster.errors import UsageError

from gpucluster.states import JsonMapping, JsonObject

if TYPE_CHECKING:
    from gpucluster.infra.contract import Plugin
    from gpucluster.ledger.records import RunRecord
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.notify import RunEvent
    from gpucluster.lifecycle.prepare import Prepared
    from gpucluster.lifecycle.recovery import Policy
    from gpucluster.lifecycle.steps import RunUI
    from gpucluster.plan.placement import Placement
    from gpucluster.spec import ClusterSpec
    from gpucluster.lifecycle.notify import LiveEvents
    from gpucluster.lifecycle.recovery import ChainOutcome

ProgressFn = Callable[[str], object]
EventFn = Callable[["RunEvent"], object]  # given a gpucluster.lifecycle.notify.RunEvent


@dataclass
class Planned:
    """A run's plan (`gpucluster.lifecycle.prepare.Prepared`) and the backend it was made for."""

    backend: Plugin
    plan: Prepared
    keep: bool = False
    max_cost: float | None = None  # `up --max-cost`: the kept cluster's cap, recorded once it is up
    placement: Placement | None = None  # `--cloud auto` or a list: the ranking (gpucluster.plan.placement), else None
    recover: int | None = None  # --recover as given (each placed attempt's policy, `_kept_policy`)


@dataclass
class Finished:
    """What `execute_plan` gives back: the chain's outcome, the final run's record, and what the
    notifications could not deliver."""

    result: ChainOutcome
    record: RunRecord | None  # of the final attempt (None: the ledger lost it)
    undelivered: list[str] = field(default_factory=list)


def plan_run(flags: JsonObject, *, keep: bool = False, idle_minutes: int | None = None,
             given: Mapping[str, tuple[tuple[str, ...], object]] | None = None) -> Planned:
    """The run's plan from its flags (the CLI's parameter names), or a UsageError; nothing is
    recorded or created. `given`: the settings given (name -> (flags, value)) when the caller is not
    a Click command (the CLI checks its own context)."""
    from gpucluster.cli.args import fold_option_flags
    from gpucluster.cli.place import placeable, prepared
    from gpucluster.infra.registry import plugin
    from gpucluster.plan.placement import wanted

    flags["options"] = fold_option_flags(flags)  # --context, --namespace: kept with the run's options
    first = placeable()[0] if wanted(flags["cloud"], None) else flags["cloud"]
    flags["options"] = _idle_stop(plugin(first), flags["options"], keep, idle_minutes)
    # the one lookup (or the ranking's first: docs/placement.md): everything below is given it
    chosen, plan, placement = prepared(flags, given=given)
    plan.policy = _kept_policy(plan.policy, keep, flags.get("recover"))
    return Planned(chosen, plan, keep, placement=placement, recover=flags.get("recover"))


def execute_plan(planned: Planned, *, ledger: Ledger, ui: RunUI, notify: Sequence[str] = (),
                 on_event: EventFn | None = None, over: list[str] | None = None, over_budget: bool = False) -> Finished:
    """Run the plan (recovery included), then tell `on_event` and every webhook how it went.
    `over`: the budget's warning lines when `--over-budget` passed it (recorded with the run).
    A team budget in the shared state is checked first (`claim_team`: exit 2, nothing created) and
    the run's spend record there ended with its cost (a kept cluster's at `down`)."""
    from gpucluster.cli.budgets import claim_team, record_override
    from gpucluster.lifecycle.notify import LiveEvents
    from gpucluster.lifecycle.recovery import run_plan

    key = str(planned.plan.spec.run_id)
    team = claim_team(planned.plan, key=key, kind="run", over_budget=over_budget,
                      max_cost=planned.plan.job.max_cost if planned.plan.job else None)
    for line in team:  # --over-budget past the team's budget: said, and recorded with the run below
        ui.message(line)
    over = [*(over or []), *team]
    live = LiveEvents(ui, ledger, notify, on_event) if (notify or on_event is not None) else None
    ui = live if live is not None else ui
    result = None
    try:
        if planned.placement is None:
            result = run_plan(planned.plan, ledger=ledger, ui=ui, backend=planned.backend, keep=planned.keep,
                              reprice=_reprice(planned.backend))
        else:  # down the ranking on capacity and quota errors (docs/placement.md)
            from gpucluster.cli.place import run_failover

            result = run_failover(planned.placement, ledger=ledger, ui=ui, keep=planned.keep, reprice=_reprice,
                                  policy_of=lambda p: _kept_policy(p, planned.keep, planned.recover))
    finally:
        _settle_team(ledger, key, result)
    record_override(ledger, result.attempts[0].run_id, over)
    record = ledger.get_run(result.final.run_id)
    undelivered: list[str] = []
    if notify or on_event is not None:
        undelivered = _tell(ledger, result, live, notify, on_event)
    return Finished(result, record, undelivered)


def _settle_team(ledger: Ledger, key: str, result: ChainOutcome | None) -> None:
    """The run's spend record in the team's budget: ended with its cost, or (a kept cluster) left
    for `down` to end."""
    from gpucluster.cli.budgets import settle_team

    ids = [key] if result is None else [a.run_id for a in result.attempts]
    if result is None or result.final.teardown != "kept":  # a kept cluster's record is ended by `down`
        settle_team(ledger, key, ids)
    else:
        from gpucluster.cli.budgets import remember_team

        remember_team(ledger, result.final.run_id, key)


def _tell(ledger: Ledger, result: ChainOutcome, live: LiveEvents | None, notify: Sequence[str],
          on_event: EventFn | None) -> list[str]:
    """How the run went, to `on_event` and every webhook (what `live` told already left out); what
    could not be delivered."""
    from gpucluster.lifecycle.notify import chain_events, deliver

    undelivered: list[str] = []
    ids = [a.run_id for a in result.attempts]
    recovered = [bool(a.interruption) for a in result.attempts]
    try:
        events = chain_events(ledger, ids, recovered)
    except Exception as exc:  # a ledger that cannot be read now: the run stays as it ended
        events, undelivered = [], [f"no event sent: the ledger could not be read ({exc})"]
    undelivered += live.close() if live is not None else []
    events = [e for e in events if live is None or (e.kind, e.run_id) not in live.sent]  # told already
    undelivered += deliver(events, list(notify), on_event)
    return undelivered


def run(command: Sequence[str] | str | None = None, *, cloud: str = "local", nodes: int | None = None,
        gpu: str | None = None, workload: str | None = None, epochs: int | None = None,
        data: Sequence[str] | str = (), output: str | None = None, env: Mapping[str, str] | Sequence[str] = (),
        secrets: Sequence[str] = (), keep: bool = False, idle_minutes: int | None = None, over_budget: bool = False,
        quiet: bool = True, progress: ProgressFn | None = None, on_event: EventFn | None = None,
        notify: Sequence[str] | str = (), **options: object) -> RunRecord | None:
    """Run a job on a new cluster and tear it down (`gpucluster run`); the run's record.

    Every other option of `gpucluster run` is a keyword of the same name (`max_minutes=`,
    `region=`, `hosts=`, `recover=`, ...); bad input raises the `UsageError` the CLI prints (nothing
    is created). A failed run is returned (its `.status`); Ctrl-C tears the cluster down, then
    raises KeyboardInterrupt. Nothing is printed unless `quiet=False` (to stderr) or `progress=`."""
    from gpucluster.cli.budgets import check_budget
    from gpucluster.lifecycle.prepare import Request, check_before_recording, open_ledger

    if isinstance(command, str):
        import shlex

        command = shlex.split(command)
    if "dry_run" in options:
        raise UsageError("dry_run= is not allowed here: gpucluster.estimate(...) gives the cost, and "
                         "`gpucluster run --dry-run` what would be declared")
    kwargs = dict(command=command, cloud=cloud, nodes=nodes, gpu=gpu, workload=workload, epochs=epochs, data=data,
                  output=output, env=env, secrets=secrets, **options)
    flags, given = _checked(kwargs, [*Request.__dataclass_fields__, *OPTION_FLAGS, *PLACEMENT_FLAGS])
    if idle_minutes is not None:
        from gpucluster.cli.idle import IDLE_MINUTES

        idle_minutes = IDLE_MINUTES.convert(idle_minutes, None, None)
    urls = all_webhooks(notify)
    planned = plan_run(flags, keep=keep, idle_minutes=idle_minutes, given=given)
    ledger = open_ledger()
    plan = planned.plan
    over = check_budget(ledger, plan.estimate.total if plan.estimate else None, flags.get("max_cost"), over_budget)
    if planned.placement is None:  # a placed plan's preflight ran while ranking
        check_before_recording(plan)  # e.g. no Pulumi CLI: said before the ledger row
    done = execute_plan(planned, ledger=ledger, ui=ui_for(quiet, progress), notify=urls, on_event=on_event, over=over,
                        over_budget=over_budget)
    final = done.result.final
    if final.status == "interrupted":
        raise KeyboardInterrupt(f"run {final.run_id} interrupted; teardown: {final.teardown}")
    if done.record is None:
        from gpucluster.errors import GpuclusterError

        raise GpuclusterError(f"run {final.run_id} ended ({final.status}) but the ledger has no record of it: "
                              f"{final.record_error or 'it was removed'}")
    from gpucluster.cli.run import with_attempts

    return with_attempts(ledger, done.record)  # a recovered chain: with its attempts, as `show` gives it


OPTION_FLAGS = ("context", "namespace", "create_namespace")
PLACEMENT_FLAGS = ("max_hourly", "max_attempts", "allow_egress")  # `--cloud auto` (cli/place.py takes them out of the flags)


def _checked(kwargs: Mapping[str, object],
             allowed: Sequence[str]) -> tuple[JsonObject, dict[str, tuple[tuple[str, ...], object]]]:
    """The keywords as the flags of `gpucluster run` (Request's own defaults for the rest)."""
    from gpucluster.api.flags import flags_of

    flags, given = flags_of(kwargs, allowed, defaults={"recover": None})
    flags["command"] = tuple(flags.get("command") or ())
    return flags, given


def all_webhooks(notify: Sequence[str] | str) -> tuple[str, ...]:
    """The webhooks given (checked) and the config file's `notify:`."""
    from gpucluster.lifecycle.notify import check_urls
    from gpucluster.plan.userconfig import notify_urls

    given = [notify] if isinstance(notify, str) else list(notify or ())
    return check_urls(dict.fromkeys([*given, *notify_urls()]))


class ProgressUI:
    """A run's UI for the API: each phase, message and (unless quiet) node line as one string to
    `say` (the caller's `progress=`, or stderr)."""

    def __init__(self, say: ProgressFn, quiet: bool):
        self.say, self.quiet = say, quiet

    def phase(self, name: str) -> None:
        self.say(f"phase: {name}")

    def line(self, node_rank: int, text: str) -> None:
        if not self.quiet:
            self.say(f"[node {node_rank}] {text}")

    def metric(self, node_rank: int | None, record: JsonMapping) -> None:
        pass

    def message(self, text: str) -> None:
        self.say(text)

    def progress(self, text: str) -> None:
        pass

    def stopping(self, signal_name: str) -> None:
        self.say(f"{signal_name}: stopping the run and tearing down")


def ui_for(quiet: bool, progress: ProgressFn | None) -> RunUI:
    """Nothing shown (quiet, no callback), the callback, or stderr."""
    if progress is not None:
        return ProgressUI(progress, quiet)
    if quiet:
        from gpucluster.lifecycle.steps import QuietUI

        return QuietUI()
    return ProgressUI(lambda text: print(text, file=sys.stderr, flush=True), False)


def _idle_stop(chosen: Plugin, options: tuple[str, ...], keep: bool, idle_minutes: int | None) -> tuple[str, ...]:
    """`--idle-minutes` is for a cluster that stays (--keep, on a cloud gpucluster creates): the options
    with the node-side idle stop, or a UsageError."""
    from gpucluster.cli.idle import with_idle_stop
    from gpucluster.infra.contract import Capability

    if idle_minutes is None:
        given = next((o for o in options or () if o.split("=", 1)[0].strip() in ("idleMinutes", "idle_minutes")), None)
        if given is not None and not keep:  # the option gets what the flag gets (issue 45 item 10)
            raise UsageError(f"--option {given} is for a cluster that is kept: add --keep")
        return options
    if not keep:
        raise UsageError(f"--idle-minutes {idle_minutes} is for a cluster that is kept: add --keep")
    if not chosen.can(Capability.PROVISIONS):
        raise UsageError(f"--idle-minutes is not allowed with --cloud {chosen.name}: its machines are not created "
                         "by gpucluster (nothing is kept)")
    return with_idle_stop(options, idle_minutes)


def _kept_policy(policy: Policy | None, keep: bool, recover: int | None) -> Policy | None:
    """A kept cluster and a replaced one cannot both be the result: --keep runs without recovery."""
    if not keep or policy is None or not policy.retries:
        return policy
    if recover is not None:
        raise UsageError("--keep and --recover: a recovered run provisions again; give one of them")
    return replace(policy, retries=0)


def _reprice(chosen: Plugin) -> Callable[[ClusterSpec], JsonObject | None] | None:
    """The price snapshot of a changed spec (the on-demand fallback), for a priced backend."""
    from gpucluster.infra.contract import Capability

    if not chosen.can(Capability.PRICED):
        return None
    import functools

    from gpucluster.costing import cost

    return functools.partial(cost.price_snapshot, backend=chosen)
