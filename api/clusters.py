"""Clusters and prices from Python: `estimate(...)`, `up(...) -> Cluster` with `Cluster.exec`,
`.status()` and `.down()`; the steps `gpucluster up`, `exec` and `cost estimate` take through the
same code (the CLI prints between them)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from gpucluster.errors import UsageError, not_allowed
from gpucluster.states import JsonMapping, JsonObject

if TYPE_CHECKING:
    from decimal import Decimal

    from typing_extensions import Unpack

    from gpucluster.api.jobs import Planned, ProgressFn
    from gpucluster.api.records import DownOptions
    from gpucluster.costing.estimate import Estimate
    from gpucluster.domain import Cluster as Nodes, Node
    from gpucluster.errors import ExitCode
    from gpucluster.infra.contract import Plugin
    from gpucluster.ledger.recording import Provisioned
    from gpucluster.ledger.records import RunRecord
    from gpucluster.lifecycle.prepare import Prepared
    from gpucluster.lifecycle.steps import RunOutcome, RunUI
    from gpucluster.lifecycle.teardown import Downed
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.kept import Kept
    from gpucluster.lifecycle.prepare import Request
    from gpucluster.spec import ClusterSpec
    from gpucluster.watch.launch import JobSpec


# -- estimate -------------------------------------------------------------------------------------
def parse_nodes(value: str | None, cloud: str | None) -> list[int] | None:
    """--nodes N or N,N,...: each within the cloud's limit as `run` checks it (64 with no cloud given)."""
    from gpucluster.infra.registry import NAMES as CLOUDS, traits
    from gpucluster.spec import parse_int

    if value is None:
        return None
    high = traits(cloud).max_nodes if cloud in CLOUDS else 64
    return [parse_int("nodes", part, low=1, high=high) for part in value.split(",")]


def stack_path(stack: str) -> Path:
    p = Path(stack)
    if p.suffix in (".yaml", ".yml"):
        return p
    return Path("stacks") / f"Pulumi.{stack}.yaml"


def build_spec(*, stack: str | None, cloud: str | None, instance_type: str | None, gpus: int | None,
               nodes: int | None, spot: bool | None, disk_gb: int | None, disk_type: str | None,
               region: str | None, zone: str | None, gpu: str | None = None) -> ClusterSpec:
    """The ClusterSpec an estimate prices: the stack file's, overridden by the settings given."""
    from gpucluster.infra.registry import NAMES as CLOUDS, priced
    from gpucluster.spec import ClusterSpec
    from gpucluster.plan.stackconfig import spec_from_stack_file

    if stack:
        spec = spec_from_stack_file(stack_path(stack))
    elif cloud is None:
        raise UsageError(f"give --cloud {'|'.join(priced())} (or --stack NAME to read stacks/Pulumi.NAME.yaml)")
    else:
        if cloud not in CLOUDS:
            raise UsageError(not_allowed("cloud", cloud, CLOUDS))
        spec = ClusterSpec(cloud=cloud, nodes=1)
    accelerator = None
    if gpu is not None:  # --gpu TYPE[:COUNT]: the cloud's catalog picks the machine (as `run` does)
        from gpucluster.catalog.gpus import combine

        accelerator, gpus = combine(gpu, gpus)
        if instance_type is None and spec.instance_type is not None:
            raise UsageError(f"--gpu {gpu} and the stack's instanceType {spec.instance_type} both pick the "
                             "machine: give one of them")
    given = dict(cloud=cloud, instance_type=instance_type, gpus_per_node=gpus, nodes=nodes, spot=spot,
                 disk_gb=disk_gb, disk_type=disk_type, region=region, zone=zone, accelerator=accelerator)
    changes: dict[str, object] = {k: v for k, v in given.items() if v is not None}
    if "zone" in changes and "region" not in changes:
        changes["region"] = None
    return spec.replace(**changes)


def estimate(*, cloud: str | None = None, nodes: int | None = None, gpu: str | None = None,
             instance_type: str | None = None, gpus_per_node: int | None = None, hours: float | str | None = None,
             spot: bool | None = None, disk_gb: int | None = None, region: str | None = None, zone: str | None = None,
             disk_type: str | None = None, stack: str | None = None, free_tier: bool = False) -> Estimate:
    """The itemised cost of a cluster for some hours (default 1; `gpucluster cost estimate`): a
    `costing.estimate.Estimate` with `.hourly`, `.total` and `.lines` (Decimal dollars)."""
    from gpucluster.cli.options import OPTIONS, Float
    from gpucluster.costing.cost import estimate as priced_estimate
    from gpucluster.infra.registry import plugin
    from gpucluster.spec import normalize, validate

    if gpus_per_node is not None:
        gpus_per_node = OPTIONS["gpus_per_node"][1]["type"].convert(gpus_per_node, None, None)
    if disk_gb is not None:
        disk_gb = OPTIONS["disk_gb"][1]["type"].convert(disk_gb, None, None)
    priced_hours: float | str = "1" if hours is None else \
        Float("hours", "a number of hours above 0 (e.g. 0.5, 3)", 0, 24 * 366).convert(hours, None, None)
    node_list = parse_nodes(None if nodes is None else str(nodes), cloud)
    if node_list is not None and len(node_list) > 1:
        raise UsageError(f"--nodes {nodes!r}: a list of node counts needs --workload and --epochs")
    spec = build_spec(stack=stack, cloud=cloud, gpu=gpu, instance_type=instance_type, gpus=gpus_per_node,
                      nodes=node_list[0] if node_list else None, spot=spot, disk_gb=disk_gb, disk_type=disk_type,
                      region=region, zone=zone)
    chosen = plugin(spec.cloud)  # the one lookup: the cost engine is given it
    spec = normalize(spec, chosen)  # a stack file's options in their one spelling, scopes as URL fields
    est = priced_estimate(spec, priced_hours, backend=chosen, free_tier=True if free_tier else None)
    validate(spec, chosen)  # and what `run` refuses besides, by the same checks
    if free_tier and not any(line.get("category") == "cluster fee" for line in est.lines):
        raise UsageError(f"--free-tier does not apply to --cloud {spec.cloud}: it waives a cluster fee (GKE's), and "
                         f"its runs have none: remove it")
    return est


# -- up -------------------------------------------------------------------------------------------
HELD_FLAGS = ("hosts", "identity", "known_hosts", "remote_python", "python",  # `up` of machines that exist
              "context", "namespace", "create_namespace")  # ... and of a namespace of a Kubernetes cluster
def plan_up(flags: JsonObject, *, idle_minutes: int | None = None,
            given: Mapping[str, tuple[tuple[str, ...], object]] | None = None) -> Planned:
    """`up`'s plan (a cluster, no job) and its backend, or a UsageError; nothing is recorded."""
    from gpucluster.api.jobs import Planned
    from gpucluster.cli import common
    from gpucluster.cli.idle import with_idle_stop
    from gpucluster.cli.place import prepared
    from gpucluster.infra.registry import NAMES, provisioning
    from gpucluster.plan.placement import wanted

    cloud = flags["cloud"]
    clouds = provisioning()
    held = held_clouds()  # machines that exist, kept under a name (gpucluster.lifecycle.held)
    if cloud not in clouds + held and not wanted(cloud, None):
        others = [n for n in NAMES if n not in clouds + held]
        raise UsageError(not_allowed("cloud", cloud, clouds + held)
                         + (f"; {' and '.join(others)} clusters need no `up`: use `gpucluster run`"
                            if cloud in NAMES else ""))
    if cloud in held:
        check_held_flags(cloud, flags, idle_minutes)
    from gpucluster.cli.args import fold_option_flags

    flags["options"] = fold_option_flags(flags)  # --context, --namespace: kept with the cluster's options
    flags["options"] = with_idle_stop(tuple(flags.get("options") or ()), idle_minutes)  # the cloud's rules check it
    # the one lookup (or the ranking's first: docs/placement.md): everything below is given it; machines that exist
    # get the backend's own provider and launcher (the launcher asks them whether they are ready)
    chosen, plan, placement = prepared(flags, provider_for=None if cloud in held else common.provider_for,
                                       strict_prices=False, job=False, given=given)
    if cloud in held and not flags.get("dry_run"):  # each machine asked once, before anything is recorded
        from gpucluster.lifecycle.held import Holding, attach_held, reach_given

        assert chosen.ops.hold is not None and plan.launcher is not None  # machines that exist: held, launched
        found = chosen.ops.hold(plan.launcher, attach_held(plan.provider, plan.spec))
        plan.provider = Holding(plan.provider, found, reach_given(flags))
    return Planned(chosen, plan, keep=True, max_cost=flags.get("max_cost"), placement=placement)


def held_clouds() -> tuple[str, ...]:
    """The backends of machines that exist whose clusters `up` keeps under a name (`Operations.hold`)."""
    from gpucluster.infra.registry import NAMES, plugin, provisioning

    return tuple(n for n in NAMES if n not in provisioning() and plugin(n).ops.hold is not None)


def check_held_flags(cloud: str, flags: JsonMapping, idle_minutes: int | None) -> None:
    """What only a cluster gpucluster creates has: a cost cap, an idle stop, a lifetime (its nodes power
    themselves off). Machines that exist bill nobody here and are never stopped: refused by name."""
    given = [f for f, v in (("--max-cost", flags.get("max_cost")), ("--idle-minutes", idle_minutes),
                            ("--max-lifetime", flags.get("max_lifetime"))) if v is not None]
    if given:
        raise UsageError(f"{given[0]} does not apply to `up --cloud {cloud}`: the machines exist, bill nothing here "
                         "and are never stopped by gpucluster; remove it")


def provision(planned: Planned, *, ledger: Ledger, ui: RunUI, over: list[str] | None = None,
              over_budget: bool = False) -> Provisioned:
    """Create the planned cluster (the run lifecycle's bookkeeping, no job): `lifecycle.Provisioned`;
    `over`: the budget's warning lines when `--over-budget` passed it (recorded with the cluster's run).
    A team budget in the shared state is checked first (exit 2, nothing created); the cluster's spend
    record there stays open until `down` ends it (or is ended here when the cluster did not come up)."""
    from gpucluster.cli.budgets import claim_team, remember_team, settle_team
    from gpucluster.infra.contract import Capability

    plan = planned.plan
    name = plan.spec.name
    key = str(plan.spec.run_id)
    if not planned.backend.can(Capability.PROVISIONS) and ledger.open_resources(name):  # machines that exist
        raise UsageError(f"cluster {name!r} is kept already: run jobs on it with `gpucluster exec {name}`, or remove "
                         f"it first with `gpucluster down {name}`")
    team = claim_team(plan, key=key, kind="up", max_cost=planned.max_cost, over_budget=over_budget)
    for line in team:
        ui.message(line)
    try:
        made = _provision(planned, ledger=ledger, ui=ui, over=[*(over or []), *team])
    except BaseException:
        settle_team(ledger, key, [key])
        raise
    if not ledger.open_resources(planned.plan.spec.name):
        settle_team(ledger, key, [key])  # nothing of it is up: nothing left to bill
    else:
        remember_team(ledger, str(planned.plan.spec.run_id), key)  # `down` ends the record
    return made


def _provision(planned: Planned, *, ledger: Ledger, ui: RunUI, over: list[str]) -> Provisioned:
    from gpucluster.cli.budgets import record_override
    from gpucluster.lifecycle.steps import provision_only

    plan = planned.plan
    if planned.placement is not None and len(planned.placement.tried) > 1:  # down the ranking (docs/placement.md)
        from gpucluster.lifecycle.failover import up_placed
        from gpucluster.infra.registry import plugin

        backends = {c.cloud: plugin(c.cloud) for c in planned.placement.tried}
        cand, made = up_placed(planned.placement, ledger=ledger, ui=ui, provision_one=lambda c: (
            provision_only(c.plan.spec, ledger=ledger, provider=c.plan.provider, ui=ui, backend=backends[c.cloud],
                           prices=c.plan.prices)))
        plan = planned.plan = cand.plan  # the candidate that is up: what is recorded and shown
        planned.backend = backends[cand.cloud]
    else:
        made = provision_only(plan.spec, ledger=ledger, provider=plan.provider, ui=ui, backend=planned.backend,
                              prices=plan.prices)
    record_override(ledger, str(plan.spec.run_id), over or [])
    if planned.max_cost is not None:  # the kept cluster's cap: every `exec` is watched against it (guards.py)
        from gpucluster.costing.guards import CAP_KIND

        ledger.add_metrics(str(plan.spec.run_id), [(None, {"kind": CAP_KIND, "max_cost": planned.max_cost})])
    return made


@dataclass
class Cluster:
    """A kept cluster (`up`, `run(keep=True)`): its name, cloud, nodes (head first) and hourly price."""

    name: str
    cloud: str
    nodes: list[Node]
    run_id: str | None = None
    hourly: Decimal | None = None

    def exec(self, command: Sequence[str] | str | None = None, *, quiet: bool = True,
             progress: ProgressFn | None = None, **options: object) -> RunRecord | None:
        """Run a job on the cluster (`gpucluster exec`): its own run, no teardown; its record."""
        return exec_on(self.name, command, quiet=quiet, progress=progress, **options)

    def status(self) -> JsonObject:
        """What the ledger says of the cluster now: `up`, the resources that may still exist, its runs."""
        from gpucluster.ledger.store import Ledger

        ledger = Ledger.open_default()
        open_rows = ledger.open_resources(self.name)
        runs = [r.id for r in ledger.list_runs(limit=None) if r.cluster == self.name]
        return {"name": self.name, "cloud": self.cloud, "up": bool(open_rows), "open_resources": len(open_rows),
                "runs": runs}

    def down(self, **how: Unpack[DownOptions]) -> Downed:
        """Delete the cluster and check what is left (`gpucluster down NAME`): the verdict."""
        from gpucluster.api.records import down

        return down(self, **how)


def up(*, cloud: str, nodes: int | None = 2, idle_minutes: int | None = None, over_budget: bool = False,
       quiet: bool = True, progress: ProgressFn | None = None, **options: object) -> Cluster:
    """Create a cluster and leave it up (`gpucluster up`); `Cluster.down()` removes it."""
    from gpucluster.api.flags import flags_of
    from gpucluster.api.jobs import PLACEMENT_FLAGS, ui_for
    from gpucluster.cli.budgets import check_budget
    from gpucluster.cli.options import CLUSTER
    from gpucluster.errors import TeardownIncomplete
    from gpucluster.lifecycle.prepare import check_before_recording, open_ledger

    allowed = [c for c in CLUSTER if c not in ("dry_run", "yes", "as_json", "state")] + ["max_cost", *PLACEMENT_FLAGS,
                                                                                         *HELD_FLAGS]
    hosts = options.get("hosts")
    if isinstance(hosts, (list, tuple)):  # hosts=["user@h1", "h2:2222"], as --hosts takes them
        options["hosts"] = ",".join(str(h) for h in hosts)
    flags, given = flags_of(dict(cloud=cloud, nodes=nodes, **options), allowed, defaults={})
    if idle_minutes is not None:
        from gpucluster.cli.idle import IDLE_MINUTES

        idle_minutes = IDLE_MINUTES.convert(idle_minutes, None, None)
    planned = plan_up(flags, idle_minutes=idle_minutes, given=given)
    ledger = open_ledger()
    plan = planned.plan
    over = check_budget(ledger, plan.estimate.total if plan.estimate else None, None, over_budget)
    if planned.placement is None:  # a placed plan's preflight ran while ranking
        check_before_recording(plan)
    made = provision(planned, ledger=ledger, ui=ui_for(quiet, progress), over=over, over_budget=over_budget)
    if made.record_error:
        from gpucluster.ledger.recording import kept_line

        raise TeardownIncomplete(kept_line(made.record_error, planned.plan.spec.name))
    return Cluster(made.cluster.name, planned.backend.name, list(made.cluster.nodes), planned.plan.spec.run_id,
                   planned.plan.hourly)


# -- exec -----------------------------------------------------------------------------------------
@dataclass
class ExecPlan:
    """A job planned on a kept cluster (`exec`): what the CLI shows before it runs."""

    kept: Kept
    backend: Plugin
    plan: Prepared
    attached: Nodes  # the cluster as its provider describes it now
    reclaimed: str | None
    fits: str | None


def plan_exec(cluster: str, flags: JsonObject, ledger: Ledger) -> ExecPlan:
    """The job's plan on the kept cluster `cluster`, or a UsageError (nothing recorded)."""
    from gpucluster.cli import common
    from gpucluster.infra.registry import plugin, provisioning
    from gpucluster.lifecycle.kept import attach, check_fits, find, reclaim
    from gpucluster.lifecycle.prepare import prepare
    from gpucluster.spec import ClusterSpec, normalize

    if flags.get("check") is None:  # the nodes are up and were checked (or not) when they came up: --check asks again
        flags["check"] = False
    kept = find(ledger, cluster, dead_ok=True)
    chosen = plugin(kept.cloud)
    spec = normalize(ClusterSpec.from_dict(kept.spec), chosen)  # recorded by any version: one representation
    held = kept.cloud not in provisioning()  # machines that exist (gpucluster.lifecycle.held): no lifetime, no stack
    if held:
        _held_flags(flags, ledger, kept, spec)
    fits = None if held else check_fits(kept, None if flags.get("max_minutes") is None else flags["max_minutes"] * 60)
    req = _exec_request(spec, flags)
    plan = prepare(req, chosen)
    _check_granted(kept.name, spec, plan.spec)
    if held:  # asked before each job as `run` asks it (kubernetes: permissions, the pods' fit); ssh, local: nothing
        plan.provider.preflight(plan.spec)
    # the nodes' lifetime is the cluster's (fixed at first boot): recorded as it is, never "raised"
    plan.spec = plan.spec.replace(max_lifetime_minutes=spec.max_lifetime_minutes)
    # before the run's row: a gone stack records nothing
    attached = attach(plan.provider if held else common.provider_for(kept.cloud), kept, plan.spec if held else None)
    reclaimed = reclaim(ledger, plan.needs_launcher(), attached, kept)  # a killed job's leftovers, before this job
    plan.job = _capped_job(ledger, kept, chosen, plan.needs_job(), flags)
    return ExecPlan(kept, chosen, plan, attached, reclaimed, fits)


def _held_flags(flags: JsonObject, ledger: Ledger, kept: Kept, spec: ClusterSpec) -> None:
    """Machines that exist: reached as `up` reached them (a flag given here wins), and `up --gpu`
    (kubernetes) kept."""
    from gpucluster.lifecycle.held import reach_of

    for key, value in reach_of(ledger, kept).items():  # how `up` reached them (a flag given here wins)
        flags[key] = flags.get(key) or value
    if spec.accelerator and spec.gpus_per_node and not flags.get("gpu"):  # `up --gpu` (kubernetes): kept
        flags["gpu"] = f"{spec.accelerator}:{spec.gpus_per_node}"


def _exec_request(spec: ClusterSpec, flags: JsonObject) -> Request:
    """The job's request on the kept cluster: its recorded shape, the job's flags."""
    from gpucluster.infra.registry import provisioning, readers
    from gpucluster.lifecycle.prepare import Request

    req = Request(cloud=spec.cloud, nodes=spec.nodes, gpus_per_node=spec.gpus_per_node, name=spec.name,
                  hosts=",".join(spec.hosts) if spec.hosts else None,
                  region=spec.region, zone=spec.zone, instance_type=spec.instance_type, spot=spec.spot,
                  disk_gb=spec.disk_gb, ssh_cidr=spec.ssh_cidr, tags=tuple(f"{k}={v}" for k, v in spec.tags),
                  options=tuple(f"{k}={v}" for k, v in spec.options), provisioning=provisioning(), readers=readers(),
                  **flags)
    if spec.project and not req.project:
        req = replace(req, project=spec.project)  # the kept cluster's project, not whatever is configured now
    return req


def _check_granted(name: str, spec: ClusterSpec, planned: ClusterSpec) -> None:
    """UsageError when the job asks for options or object access the cluster was not created with."""
    granted = dict(spec.options)
    asked = [f"{k}={v}" for k, v in planned.options if granted.get(k) != v]
    # object access for a URL the cluster's nodes were not granted when it was created
    asked += [f"read access to {u}" for u in planned.reads if u not in spec.reads]
    asked += [f"write access to {u}" for u in planned.writes if u not in spec.writes]
    if asked:
        raise UsageError(f"cluster {name!r} was not created with {', '.join(asked)}: "
                         "what its nodes may reach is fixed when it is created; give only what it was created "
                         "with, or create a cluster for it (`gpucluster up`, `gpucluster run`)")


def _capped_job(ledger: Ledger, kept: Kept, chosen: Plugin, job: JobSpec, flags: JsonObject) -> JobSpec:
    """The job under the cluster's own cap (`up --max-cost`); past it with no job running, the
    cluster is torn down (checked) and CostCapReached says how that went."""
    from gpucluster.costing.guards import exec_guard
    from gpucluster.errors import CostCapReached

    if flags.get("max_cost") is not None:  # the cap is on what the cluster costs (exec's own rows bill nothing)
        job = replace(job, cost_of=kept.origin.id)
    try:
        return exec_guard(ledger, kept.name, kept.origin.id, chosen, job)  # `up --max-cost`: the cluster's cap
    except CostCapReached as exc:  # past it with no job running (the nodes' lifetime not yet over): down, checked
        from gpucluster.api.records import take_down_one

        done = take_down_one(kept.name, chosen, ledger=ledger, say=lambda text: None)
        verdict = done.check.verdict if done.check is not None else "not verified"
        raise CostCapReached(f"{exc.message}; the cluster was torn down: {verdict}",
                             hint=None if verdict == "verified" else f"finish with: gpucluster down {kept.name}") from None


def run_exec(planned: ExecPlan, *, ledger: Ledger, ui: RunUI) -> tuple[RunOutcome, ExitCode | None, str | None]:
    """Run the planned job on the kept cluster: (its outcome, a forced exit code or None, what to say)."""
    from gpucluster.lifecycle.kept import Attached, close_processes
    from gpucluster.lifecycle.steps import execute

    plan = planned.plan
    launcher = plan.needs_launcher()  # (plan_exec asked for it already)
    outcome = execute(plan.spec, plan.needs_job(), ledger=ledger, provider=Attached(planned.attached),
                      launcher=launcher, backend=planned.backend, ui=ui, keep=True, prices=plan.prices,
                      workload=plan.workload, resumed_from=plan.resumed_from)
    forced, said = close_processes(ledger, launcher, planned.attached, outcome.run_id)
    from gpucluster.api.records import take_down_one
    from gpucluster.lifecycle.kept import cap_teardown

    kept = planned.kept  # stopped at the cluster's own cap (`up --max-cost`): the cluster goes too, checked
    code, line = cap_teardown(ledger, kept.name, kept.origin.id, planned.backend, outcome, lambda: take_down_one(
        kept.name, planned.backend, ledger=ledger, say=ui.message))
    if code is not None:
        forced = code if forced is None or int(code) > int(forced) else forced
        said = "; ".join(x for x in (said, line) if x)
    return outcome, forced, said


def exec_on(cluster: str, command: Sequence[str] | str | None = None, *, quiet: bool = True,
            progress: ProgressFn | None = None, **options: object) -> RunRecord | None:
    """Run a job on the kept cluster named `cluster` (`gpucluster exec`); its record."""
    import shlex

    from gpucluster.api.flags import flags_of
    from gpucluster.api.jobs import ui_for
    from gpucluster.cli.kept import JOB_OPTIONS
    from gpucluster.lifecycle.prepare import open_ledger

    allowed = ["command", *(o for o in JOB_OPTIONS if o not in ("task_file", "quiet", "as_json"))]
    if isinstance(command, str):
        command = shlex.split(command)
    flags, _ = flags_of(dict(command=command, **options), allowed, defaults={})
    flags["command"] = tuple(flags.get("command") or ())
    ledger = open_ledger()
    planned = plan_exec(cluster, flags, ledger)
    outcome, _, _ = run_exec(planned, ledger=ledger, ui=ui_for(quiet, progress))
    if outcome.status == "interrupted":
        raise KeyboardInterrupt(f"run {outcome.run_id} interrupted")
    return ledger.get_run(outcome.run_id)
