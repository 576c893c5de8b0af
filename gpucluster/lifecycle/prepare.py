"""The one prepare step of `run`, `up`, `sweep` and their dry runs: a request (the flags as given) becomes a
resolved, validated, priced plan, always in this order, before anything is recorded:

    validate -> resolve -> project -> object access -> prepare -> validate again -> job -> price snapshot

then, for a real run, what must hold before the ledger row (the backend's tools, the node programs it
would ship). Everything raises a `UsageError` naming the bad value (exit 2); nothing here prints,
creates or records anything. The backend object is resolved once by the command and passed in
(`backend`); the provider and launcher are made here from it (`backend.make`), unless the command
passes a provider of its own (`up`: `cli.common.provider_for`, which tests replace).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import TYPE_CHECKING, Mapping

from gpucluster.domain import Provider
from gpucluster.errors import SpecError, UsageError, not_allowed
from gpucluster.watch.health import spec_for as health_spec
from gpucluster.infra.contract import Capability, LaunchOptions, Plugin
from gpucluster.plan.jobargs import (WORKLOADS, check_command, check_ssh_files, parse_size,  # noqa: F401 (re-exported)
                                     workload_argv)
from gpucluster.watch.launch import JobSpec, Launcher
from gpucluster.ledger.store import Ledger
from gpucluster.lifecycle.recovery import Policy, checkpoint_args, policy
from gpucluster.spec import ClusterSpec, new_run_id, parse_int
from gpucluster.watch.staging import DataMount

if TYPE_CHECKING:
    from gpucluster.ledger.records import JsonObject
    from gpucluster.costing.estimate import Estimate

# the largest values run accepts; every command that takes the same flag checks it the same way
MAX_GPUS_PER_NODE = 16
DISK_GB = (10, 16384)
LIFETIME_MINUTES = (5, 7 * 24 * 60)
DEFAULT_LIFETIME_MINUTES = 240  # gpucluster.plan.bounds raises it to fit --max-minutes


@dataclass(frozen=True)
class Request:
    """The flags as given (numbers already ints where Click converted them); `job=False`: `up`."""

    cloud: str
    nodes: int | None = None
    gpus_per_node: int | None = None
    name: str | None = None
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    gpu: str | None = None  # --gpu TYPE[:COUNT]: the GPU and GPUs per node; the cloud picks the machine
    spot: bool = False
    disk_gb: int | None = None  # None: the backend's default (gpucluster.spec.DEFAULT_DISK_GB, sized for the image)
    max_lifetime: int | None = None  # None: the default, raised to fit --max-minutes (gpucluster.plan.bounds)
    ssh_cidr: str | None = None
    tags: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    hosts: str | None = None
    project: str | None = None
    dry_run: bool = False
    provisioning: tuple[str, ...] = ()  # the clouds gpucluster provisions (named when --dry-run is refused)
    # URL scheme -> the clouds whose nodes read it (named when a --data/--output/--resume URL is refused)
    readers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # the job (run, sweep)
    job: bool = True
    workload: str | None = None
    default_workload: str = "digits"
    epochs: int | None = None
    workload_args: str = ""
    command: tuple[str, ...] = ()
    procs_per_node: int | None = None
    threads_per_proc: int | None = None
    max_restarts: int = 0
    max_minutes: float | None = None
    data: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    output: str | None = None
    resume: str | None = None
    # how the nodes are reached
    identity: str | None = None
    known_hosts: str | None = None
    remote_python: str | None = None
    python: str | None = None  # local: the Python every node runs
    # what comes back from each node's working folder
    collect: tuple[str, ...] = ()
    collect_limit: str | None = None
    ready_timeout: int | None = None  # None: the backend's own bound for its nodes (gpucluster.plan.bounds)
    start_deadline: int = 20
    # the job's own environment (gpucluster.plan.jobenv): --env, --env-file, --secret (names only)
    env: tuple[str, ...] = ()
    env_file: tuple[str, ...] = ()
    secret: tuple[str, ...] = ()
    # issue 30 (docs/recovery.md): the health check (None: the backend's default) and recovery
    check: bool | None = None
    recover: int | None = None
    fallback: str | None = None
    fallback_after: int | None = None
    checkpoint_every: int | None = None
    # money guards (gpucluster/costing/guards.py)
    max_cost: float | None = None
    stall_minutes: float | None = None


@dataclass
class Prepared:
    """The plan: spec and job as they will be recorded and run, with what prices them."""

    spec: ClusterSpec
    job: JobSpec | None
    provider: Provider
    launcher: Launcher | None  # None: a provider was given (`up`), no launcher made
    notes: list[str] = field(default_factory=list)
    plan_line: str = ""
    estimate: Estimate | None = None  # for `limit_minutes`, when the backend is priced
    limit_minutes: float = 60.0  # what the estimate covers: the job's --max-minutes, else the lifetime cap
    limit_what: str = ""  # which of the two it is, for the plan line
    prices: JsonObject | None = None  # the price snapshot stored with the run
    described: list[str] = field(default_factory=list)  # what the launcher will do (data, outputs)
    resumed_from: str | None = None
    workload: str | None = None  # the name the ledger keeps (workload, or the command's program)
    bounds: list[str] = field(default_factory=list)  # ready and lifetime bounds, said under the plan
    policy: Policy | None = None  # run: --recover

    @property
    def hourly(self) -> Decimal | None:
        return None if self.estimate is None else self.estimate.hourly

    def shape(self) -> dict[str, str | None]:
        """The machine and GPUs planned, as `--dry-run --json` and the plan show them: the instance type
        (the one `--gpu` picked included) and `gpu` as TYPE:COUNT per node (None where none)."""
        gpu = None if self.estimate is None else self.estimate.gpu
        if gpu is None and self.spec.accelerator and self.spec.gpus_per_node:
            from gpucluster.catalog.gpus import lookup

            known = lookup(self.spec.accelerator)
            gpu = f"{known.name if known else self.spec.accelerator}:{self.spec.gpus_per_node}"
        return {"instance_type": self.spec.instance_type, "gpu": gpu}

    def needs_launcher(self) -> Launcher:
        """The launcher of a plan made without a provider of the command's own (run, exec, sweep)."""
        if self.launcher is None:
            raise ValueError("this plan has no launcher (it was prepared with a provider given: `up`)")
        return self.launcher

    def needs_job(self) -> JobSpec:
        """The job of a plan that has one (`Request.job`: run, exec, sweep; `up` plans none)."""
        if self.job is None:
            raise ValueError("this plan has no job (it was prepared for `up`)")
        return self.job


def prepare(req: Request, backend: Plugin, *, provider: Provider | None = None, strict_prices: bool = True) -> Prepared:
    """The request as a plan, or a UsageError. `provider`: a provider to use instead of the
    backend's (then no launcher is made). `strict_prices`: a spec the catalog cannot price is
    refused (run, sweep); otherwise it is planned without a price (`up`)."""
    output_dir = None if req.output is None else _output_dest(req.output, backend, req.readers)
    command, workload = _command_or_workload(req)
    spec = _checked_spec(req, backend)
    wl_args = workload_argv(workload, req.workload_args, req.epochs, command) if req.job else []
    wl_args += checkpoint_args(req.checkpoint_every, command)
    if command:
        check_command(command)
    staged = _staged(req, backend)
    outputs = [output_dir] if isinstance(output_dir, str) else []
    # `up` has no --data/--output: the cluster's grants are the ones its options name (gcsRead/gcsWrite,
    # s3Read/s3Write, lifted by `normalize`); a run's are exactly what it reads and writes
    spec = (backend.with_object_access(spec, staged.reads, outputs) if req.job
            else backend.with_object_access(spec, spec.reads, spec.writes))
    from gpucluster.plan.bounds import decide

    bounds = decide(backend, spec, ready_timeout=req.ready_timeout, max_lifetime=req.max_lifetime,
                    max_minutes=req.max_minutes if req.job else None, job=req.job, longest=LIFETIME_MINUTES[1])
    if bounds.lifetime is not None and bounds.lifetime != spec.max_lifetime_minutes:
        spec = spec.replace(max_lifetime_minutes=bounds.lifetime)  # raised to fit the job (said in the plan)
    provider, launcher = _make(req, backend, spec, provider, bounds.ready_timeout)
    if output_dir is not None and (launcher is None or not launcher.collects_outputs):
        raise UsageError(f"--output {req.output!r}: copying outputs back is not supported yet with cloud {req.cloud} "
                         "(supported: local, ssh, aws, gcp)")
    spec, notes = prepare_spec(backend, spec, dry_run=req.dry_run)  # and validated again
    job = _job(req, spec, command, workload, wl_args, staged, _shown_output(output_dir, launcher, req.dry_run))
    if job is not None:  # the health check, and what to do when a node is lost (docs/recovery.md)
        job = replace(job, check=health_spec(spec, backend, req.check, launcher))
    plan = Prepared(spec, job, provider, launcher, [*notes, *bounds.warnings], resumed_from=staged.resumed_from,
                    workload=workload or command_name(command), bounds=bounds.lines,
                    policy=policy(req, backend, spec) if req.job else None)
    _price_guarded(plan, req, backend, strict_prices)
    if not req.dry_run and launcher is not None and job is not None:  # `up` of machines that exist: no job
        plan.described = list(launcher.describe(spec, job))  # its errors come before anything exists
    return plan


def _checked_spec(req: Request, backend: Plugin) -> ClusterSpec:
    """`prepare`'s cluster: built from the request, normalized, validated, owned, resolved (the
    location actually used) and given its project; --gpu and --dry-run checked against the backend."""
    hosts = given_hosts(req.hosts, backend)  # checked first, by the backend's `validate` (ssh)
    nodes = req.nodes if req.nodes is not None else (len(hosts) if hosts else 2)
    from gpucluster.spec import normalize, resolve, validate

    # it picks a machine: only where one is made, or where the backend picks nodes by their GPU (kubernetes)
    if req.gpu is not None and not backend.can(Capability.PROVISIONS) and not backend.can(Capability.GPU_SELECTS_NODES):
        raise UsageError(f"--gpu {req.gpu} is not allowed with --cloud {req.cloud}: it picks the machine to create "
                         f"({' or '.join(req.provisioning) or 'aws or gcp'}) or, on kubernetes, the nodes by their "
                         "GPU; here the machines exist: use --gpus-per-node")
    spec = normalize(build_spec(req, nodes, hosts, new_run_id(), backend.traits.max_nodes), backend)
    spec = _with_project_flag(spec, req.project, backend)  # its form is the backend's to check
    validate(spec, backend)  # bad input is refused before anything is looked up
    spec = with_owner(spec, named=bool(req.name), dry_run=req.dry_run)  # default name and owner marks
    spec = resolve(spec, backend)  # the location actually used, defaults included: stored and checked later
    if req.dry_run and backend.ops.dry_run is None:
        raise UsageError(not_allowed("--dry-run with cloud", req.cloud,
                                     f"{' or '.join(req.provisioning) or 'a cloud'} (clouds gpucluster provisions)"))
    return spec


def given_hosts(text: str | None, backend: Plugin) -> tuple[str, ...]:
    """`--hosts h1,h2` as the spec's hosts, one node each, split at the commas and otherwise as given. A backend
    that takes `--hosts` (`Traits.flags`: ssh) checks them first with its `validate`, on a spec of those hosts
    alone: a missing or bad `--hosts` is refused before any other flag is checked or anything is looked up,
    naming the text as the user wrote it (its `resolve` writes them its one way later). () for a backend
    that does not take `--hosts` (refused there before this)."""
    if "hosts" not in backend.traits.flags:
        return ()
    hosts = tuple(text.split(",")) if text else ()
    backend.spec.validate(ClusterSpec(cloud=backend.name, nodes=max(1, len(hosts)), hosts=hosts))
    return hosts


def _with_project_flag(spec: ClusterSpec, project: str | None, backend: Plugin) -> ClusterSpec:
    """`--project`: the account the resources live in, for a backend that takes the flag (gcp), over the one a
    stack file or a recorded run names; without it the backend's `SpecRules.prepare` finds the default."""
    if not project:
        return spec
    if "project" not in backend.traits.flags:
        raise UsageError(f"--project {project} is not allowed with --cloud {backend.name}")
    return spec.replace(project=project, project_source="--project")


def checked_project(backend: Plugin, project: str) -> str:
    """`--project` of a command that creates nothing (`down`, `cost report`, `gc`, `doctor`, `status`), for a
    backend that takes it: checked as `run` checks it (`validate`); '' is the default project (`SpecRules.prepare`)."""
    from gpucluster.spec import resolve, validate

    spec = ClusterSpec(cloud=backend.name, nodes=1)
    if not project:
        return str(backend.spec.prepare(spec)[0].project)
    validate(resolve(spec.replace(project=project, project_source="--project"), backend), backend)
    return project


def _price_guarded(plan: Prepared, req: Request, backend: Plugin, strict_prices: bool) -> None:
    """The plan's price; again when --max-cost shortened the nodes' lifetime."""
    from gpucluster.costing.guards import apply_guards

    _price(plan, backend, strict_prices)
    if apply_guards(plan, req, backend):  # --max-cost shortened the nodes' lifetime
        _price(plan, backend, strict_prices)


def check_before_recording(plan: Prepared) -> None:
    """What a real run needs before its ledger row: the provider's tools (e.g. the Pulumi CLI,
    missing or too old). The ledger itself is checked by `open_ledger`."""
    state = plan.provider.preflight(plan.spec)  # aws: also the quota and a dry run of the launch
    plan.spec = plan.spec.replace(state=state)  # the ledger row records which state


def open_ledger() -> Ledger:
    """The ledger a run will be recorded in, checked (writable, not damaged) before anything starts."""
    from gpucluster.home import home_dir
    from gpucluster.ledger.store import Ledger

    ledger = Ledger.open_default()  # checks GPUCLUSTER_HOME before anything starts
    ledger.check()  # writable, not damaged: else the run's row could not be kept true
    home_dir()
    return ledger


# -- the steps ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Staged:
    mounts: tuple[DataMount, ...]
    setup: tuple[str, ...]
    resumed_from: str | None
    resume: DataMount | None
    resume_files: tuple[str, str] | None = None  # the resumed run's working-folder files, laid back into every node's

    @property
    def reads(self) -> list[str]:
        """The object-storage URLs the nodes read: the cloud's component grants exactly these."""
        both = self.mounts + ((self.resume,) if self.resume is not None else ())
        return [m.src for m in both if m.remote]


def _staged(req: Request, backend: Plugin) -> _Staged:
    """--data, --setup and --resume, checked (a resumed run is looked up read-only)."""
    from gpucluster.watch.staging import parse_data, parse_setup

    mounts, setup_cmds = parse_data(req.data, backend, req.readers), parse_setup(req.setup)
    resumed_from, resume_mount, resume_back = (_resume(req.resume, mounts, backend, req.readers)
                                               if req.resume is not None else (None, None, None))
    return _Staged(mounts, setup_cmds, resumed_from, resume_mount, resume_back)


def _job(req: Request, spec: ClusterSpec, command: tuple[str, ...], workload: str | None, wl_args: list[str],
         staged: _Staged, output_dir: str | None) -> JobSpec | None:
    if not req.job:
        return None
    from gpucluster.plan.jobenv import job_env

    env, secrets = job_env(req.env, req.env_file, req.secret)
    return JobSpec(run_id=spec.run_id or "", command=command, env=env, secrets=secrets,
                   workload=None if command else workload,
                   workload_args=tuple(wl_args) if not command else (),
                   nproc_per_node=req.procs_per_node or (spec.gpus_per_node or 1), max_restarts=req.max_restarts,
                   max_seconds=req.max_minutes * 60 if req.max_minutes else None,
                   threads_per_proc=req.threads_per_proc, setup=staged.setup, data=staged.mounts,
                   resume=staged.resume, resume_files=staged.resume_files,
                   collect=tuple(_check_collect(p) for p in req.collect),
                   collect_limit=None if req.collect_limit is None else parse_size("--collect-limit", req.collect_limit),
                   output_dir=output_dir, owner=dict(spec.marks).get("gpucluster-owner"))


def _command_or_workload(req: Request) -> tuple[tuple[str, ...], str | None]:
    command, workload = tuple(req.command), req.workload
    if not req.job:
        return (), None
    if command and workload:
        raise UsageError("give either --workload or a command after --, not both")
    if command and command[0] == "--":
        command = command[1:]
        if not command or command[0] == "--":
            raise UsageError(not_allowed("command after --", shlex.join(req.command), "a program and its "
                                         "arguments, e.g. -- python train.py"))
    if not command:
        workload = workload or req.default_workload
        if workload not in WORKLOADS:
            raise UsageError(not_allowed("workload", workload, WORKLOADS))
    return command, workload


def _output_dest(value: str, backend: Plugin, readers: Mapping[str, tuple[str, ...]]) -> os.PathLike[str] | str:
    from gpucluster.watch.outputs import check_output_dest

    return check_output_dest(value, backend, readers)  # creates nothing


def _shown_output(output_dir: os.PathLike[str] | str | None, launcher: Launcher | None, dry_run: bool) -> str | None:
    if output_dir is not None:
        return str(output_dir)
    if dry_run and launcher is not None and launcher.collects_outputs:
        return "$GPUCLUSTER_HOME/runs/RUN_ID/outputs"  # where the lifecycle would put them (nothing is created)
    return None


def _make(req: Request, backend: Plugin, spec: ClusterSpec, provider: Provider | None,
          ready: int | None) -> tuple[Provider, Launcher | None]:
    if provider is not None:
        return provider, None
    check_ssh_files(req.identity, req.known_hosts)
    return backend.transport.make(LaunchOptions(
        identity=req.identity, known_hosts=req.known_hosts, remote_python=req.remote_python, python=req.python,
        spec_options=spec.option_dict, ready_timeout=ready, start_deadline_s=req.start_deadline * 60))


def _price(plan: Prepared, backend: Plugin, strict: bool) -> None:
    """The estimate for the run's limit (the job's --max-minutes, else the nodes' lifetime cap), the
    plan's one line and the price snapshot (priced backends)."""
    from gpucluster.costing import cost
    from gpucluster.errors import GpuclusterError

    spec = plan.spec
    if plan.job is not None and plan.job.max_seconds:
        plan.limit_minutes, plan.limit_what = plan.job.max_seconds / 60, "the job's limit, --max-minutes"
    else:
        plan.limit_minutes, plan.limit_what = float(spec.max_lifetime_minutes), "the nodes' lifetime cap, --max-lifetime"
    if backend.can(Capability.PRICED):
        try:
            plan.estimate = cost.estimate(spec, Decimal(str(plan.limit_minutes)) / 60, backend=backend)
            plan.prices = cost.price_snapshot(spec, backend=backend)
        except GpuclusterError:
            if strict:
                raise
            plan.estimate = plan.prices = None
    nproc = plan.job.nproc_per_node if plan.job else 1
    line = backend.spec.plan_line(spec, nproc, plan.hourly)
    if line is None:
        gpus = f"{spec.gpus_per_node} GPU(s)/node" if spec.gpus_per_node else "CPU only"
        line = f"{spec.nodes} node(s) on {spec.cloud} ({gpus}, {nproc} process(es)/node)"
    plan.plan_line = line


def _check_collect(pattern: str) -> str:
    text = (pattern or "").strip()
    if not text or text.startswith("/") or ".." in text.split("/"):
        raise UsageError(f"--collect {pattern!r} is not allowed: a pattern relative to the job's working folder, "
                         "e.g. '*.pt' or 'lightning_logs'")
    return text


def _resume(value: str, mounts: tuple[DataMount, ...], store: Plugin,
            readers: Mapping[str, tuple[str, ...]]) -> tuple[str, DataMount, tuple[str, str] | None]:
    """--resume RUN_ID checked against the ledger (read only: a missing ledger is not created);
    with the working-folder files to lay back into every node's working folder (resume_files)."""
    from gpucluster.home import home_dir
    from gpucluster.ledger.store import Ledger
    from gpucluster.plan.resume import check_dest_free, resume_files, resume_source

    check_dest_free(mounts)
    path = home_dir(create=False) / "ledger.sqlite3"
    ledger = Ledger(path) if path.is_file() else None
    try:
        rid, mount = resume_source(ledger, value, store, readers)
        return rid, mount, resume_files(ledger, rid, mount)
    finally:
        if ledger is not None:
            ledger.close()


def command_name(command: tuple[str, ...]) -> str | None:
    return os.path.basename(command[-1] if len(command) == 1 else command[1]) if command else None


# -- flags -> spec and job ----------------------------------------------------------------------
def parse_tags(values: tuple[str, ...]) -> dict[str, str]:
    from gpucluster.spec import is_reserved_tag, reserved_tag_error

    tags = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(not_allowed("tag", item, "KEY=VALUE"))
        if is_reserved_tag(key):
            raise UsageError(reserved_tag_error(key.strip(), "--tag key"))
        tags[key.strip()] = value.strip()
    return tags


def parse_options(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Repeatable `--option KEY=VALUE` -> spec options; the cloud's `validate_spec` checks the
    keys and values against the same schema as the stack file's `gpucluster:` options."""
    opts: dict[str, str] = {}
    for item in values or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(not_allowed("option", item, "KEY=VALUE, e.g. --option efa=true"))
        opts[key.strip()] = value.strip()
    return tuple(sorted(opts.items()))


def build_spec(req: Request, nodes: int, hosts: tuple[str, ...], run_id: str | None, max_nodes: int) -> ClusterSpec:
    n = parse_int("nodes", str(nodes), low=1, high=max_nodes)  # the text as given, quoted
    g = None if req.gpus_per_node is None else parse_int("gpus per node", str(req.gpus_per_node), low=0,
                                                         high=MAX_GPUS_PER_NODE)
    from gpucluster.catalog.gpus import combine

    accelerator, g = combine(req.gpu, g)  # --gpu TYPE:COUNT; refused against a different --gpus-per-node
    if g is not None and g > MAX_GPUS_PER_NODE:
        raise UsageError(f"--gpu {req.gpu} is not allowed: at most {MAX_GPUS_PER_NODE} GPUs per node")
    return ClusterSpec(
        cloud=req.cloud, nodes=n, name=req.name or f"gpucluster-{req.cloud}", region=req.region, zone=req.zone,
        instance_type=req.instance_type, accelerator=accelerator, gpus_per_node=g, spot=req.spot,
        disk_gb=(None if req.disk_gb is None
                 else parse_int("disk size (GB)", str(req.disk_gb), low=DISK_GB[0], high=DISK_GB[1])),
        max_lifetime_minutes=parse_int("max lifetime (minutes)", str(req.max_lifetime or DEFAULT_LIFETIME_MINUTES),
                                       low=LIFETIME_MINUTES[0], high=LIFETIME_MINUTES[1]),
        ssh_cidr=req.ssh_cidr, tags=tuple(sorted(parse_tags(req.tags).items())), hosts=tuple(hosts), run_id=run_id,
        options=parse_options(req.options),
    )


def with_owner(spec: ClusterSpec, *, named: bool, dry_run: bool = False) -> ClusterSpec:
    """The spec marked with this home's owner (`gpucluster.ownership`): every resource carries the
    owner id, user and host; a cluster not named gets the per-owner default name."""
    from gpucluster.ownership import default_name, existing_id, owner_marks

    # a dry run creates nothing, not even the home's id: a home without one shows a placeholder
    marks = owner_marks((existing_id() or "0" * 16) if dry_run else None)
    owner = dict(marks)["gpucluster-owner"]
    return spec.replace(marks=marks, name=spec.name if named else default_name(spec.cloud, owner))


def prepare_spec(backend: Plugin, spec: ClusterSpec, *, dry_run: bool = False) -> tuple[ClusterSpec, list[str]]:
    """The backend's pre-plan resolution (`prepare_spec`) (aws: SSH CIDR from this machine's public
    IPv4, GPUs per node from the type), re-validated. In a dry run a failed detection is a note,
    not an error: nothing is created."""
    from gpucluster.spec import validate

    try:
        spec, notes = backend.spec.prepare(spec, dry_run=dry_run)
    except SpecError as exc:
        if not dry_run:
            raise
        spec, notes = backend.spec.prepare(spec, dry_run=dry_run, detect=None)
        notes.append(f"{exc.message} (a real run stops here with exit code 2; this preview has no SSH rule)")
    return spec, [*validate(spec, backend), *notes]


def size_job(job: JobSpec, run_id: str, gpus: int | None) -> JobSpec:
    """A sweep's job for one size: its own run id; a positive GPU count sets processes per node."""
    job = replace(job, run_id=run_id)
    return replace(job, nproc_per_node=gpus) if gpus else job


def check_place(backends: dict[str, Plugin], *, regions: tuple[str, ...] = (), project: str | None = None,
                instance_type: str | None = None) -> tuple[str, ...]:
    """`--region` and `--project` of commands that create nothing (`gc`, `doctor`), refused as `run`
    refuses them, through the same code: a region is checked as a spec of each backend given
    (`validate` after `resolve`) and refused when none of them takes it; a project by the backend
    that takes `--project` (`checked_project`); an instance type (in the first region) as a region is.
    Returns the regions to use: an empty one means the default, as for `run`, so it is left out."""
    from gpucluster.spec import resolve, validate

    asked: list[tuple[str | None, str | None]] = [(r, None) for r in regions]  # (region, instance type)
    if instance_type is not None:
        asked.append((next((r for r in regions if r), None), instance_type))
    for region, itype in asked:
        refusals: list[UsageError] = []
        for name in backends:
            try:
                spec = ClusterSpec(cloud=name, nodes=1, region=region, instance_type=itype)
                validate(resolve(spec, backends[name]), backends[name])
            except UsageError as exc:
                refusals.append(exc)
        if refusals and len(refusals) == len(backends):
            raise refusals[0]
    for chosen in backends.values():
        if project is not None and "project" in chosen.traits.flags:
            checked_project(chosen, project)
    return tuple(r for r in regions if r)
