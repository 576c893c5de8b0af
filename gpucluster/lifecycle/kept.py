"""Kept clusters: `up` and `run --keep` leave a cluster up; `exec` runs the next job on it, `ssh`
reaches its nodes, and an idle stop (`--idle-minutes`) powers it down when no job has run for a while.

- `find(ledger, name)`: the kept cluster as the ledger knows it (`Kept`): its runs, the run whose rows
  hold its resources (`origin`: the `up` or `run --keep` that created it) and the spec recorded then.
  A cluster that is not up, that a live gpucluster process owns, or whose last run never finished
  (its process died) is refused with the command that fixes it.
- `Attached`: the provider of an `exec` run. The cluster was read before the run's ledger row
  (`Provider.attach`: the stack's outputs); `up` hands it to the lifecycle and creates nothing; the
  lifecycle is run with `keep=True`, so nothing is torn down.
- `close_processes(...)`: the teardown of an `exec` run keeps the nodes, so what its launcher started
  there (processes; on gcp the job's Kubernetes objects) is checked apart (`Launcher.leftovers`): none
  left closes their ledger rows still open; any left is the run's verdict (leftovers, exit 3).
- `idle_left(...)`: the time before the idle stop, from the ledger: the watcher (aws: on each node, a
  job's processes carry GPUCLUSTER_RUN_ID; gcp: in the cluster, a job's pods carry its labels) counts
  from the end of the last job the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from gpucluster.domain import LAUNCHER_KINDS, Check, Cluster, Provider
from gpucluster.events import ProvisionEvents
from gpucluster.errors import ExitCode, UsageError, did_you_mean
from gpucluster.states import RunStatus, TeardownVerdict

if TYPE_CHECKING:
    from gpucluster.ledger.records import JsonObject
    from pathlib import Path

    from gpucluster.infra.contract import Plugin
    from gpucluster.watch.launch import Launcher
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.steps import RunOutcome
    from gpucluster.ledger.records import StoredRun
    from gpucluster.spec import ClusterSpec
    from gpucluster.lifecycle.teardown import Downed

IDLE_OPTION = "idleMinutes"  # the spec option the idle watcher (aws: on the nodes; gcp: in the cluster) is set up from


@dataclass(frozen=True)
class Kept:
    name: str
    cloud: str
    runs: list[StoredRun]  # newest first
    origin: StoredRun  # the run whose rows hold the cluster's resources
    spec: JsonObject  # the spec recorded by that run
    dead: StoredRun | None = None  # a run of a job whose gpucluster process died, all it left being launcher rows (`reclaim`)

    @property
    def created_at(self) -> float:
        return float(self.origin.created_at or 0)

    def lifetime_left(self, now: float | None = None) -> float | None:
        """Seconds before the nodes' dead-man switch powers them off (its deadline is fixed at first boot)."""
        minutes = self.spec.get("max_lifetime_minutes")
        if not minutes:
            return None
        return self.created_at + float(minutes) * 60 - (time.time() if now is None else now)


def find(ledger: Ledger, name: str, *, in_use_ok: bool = False, dead_ok: bool = False) -> Kept:
    """The kept cluster `name`, or a UsageError / ClusterBusy saying why it cannot take a job.
    `in_use_ok` (`ssh`): a job running on it now is fine (a shell or a tunnel beside it). `dead_ok`
    (`exec`): a last job whose process died, having left only launcher rows, is returned as `dead`
    for `reclaim` instead of refused."""
    from gpucluster.lifecycle.owner import busy_error, owner

    runs = _runs_of(ledger, name)
    latest = runs[0]
    open_rows = _cluster_rows(ledger, name, latest)
    info = owner(name)
    if info and not info.get("self") and not (in_use_ok and info.get("op") == "run"):
        raise busy_error(name, info)
    holders = _holders(open_rows)
    origin = min((r for r in runs if r.id in holders), key=lambda r: r.created_at or 0)
    dead = None
    if latest.status == RunStatus.RUNNING and not (in_use_ok and info):
        dead = _dead_or_refused(ledger, name, latest, holders, origin, dead_ok=dead_ok)
    if origin.teardown not in (None, TeardownVerdict.KEPT) and origin.status != RunStatus.RUNNING:
        # the run that created it tore it down, or tried: what is left is `down`'s to finish
        raise UsageError(f"cluster {name!r}: its teardown said {origin.teardown}; finish it with "
                         f"`gpucluster down {name}`")
    return Kept(name, str(latest.cloud), runs, origin, dict(origin.spec or {}), dead)


def _runs_of(ledger: Ledger, name: str) -> list[StoredRun]:
    """The runs of cluster `name`, newest first; a UsageError when the ledger has none."""
    runs = [r for r in ledger.list_runs(limit=None) if r.cluster == name]
    if not runs:
        known = {r.cluster: r.cloud for r in ledger.list_runs(limit=None)}
        raise UsageError(f"cluster {name!r} is not in the ledger{did_you_mean(name, known)}; create one with "
                         f"`gpucluster up --name {name}` (or `gpucluster run --keep`)")
    return runs


def _cluster_rows(ledger: Ledger, name: str, latest: StoredRun) -> list[JsonObject]:
    """The open rows of the cluster itself (not its jobs' launcher rows); a UsageError when none is."""
    open_rows = [r for r in ledger.open_resources(name) if r["kind"] not in LAUNCHER_KINDS]
    if not open_rows:
        raise UsageError(f"cluster {name!r} is not up: the ledger holds nothing of it that may still exist (its "
                         f"last run {latest.id} ended with teardown {latest.teardown or 'none'}); create it with "
                         f"`gpucluster up --name {name}`")
    return open_rows


def _holders(open_rows: list[JsonObject]) -> set[str]:
    """The runs whose rows hold the cluster: of machines that exist, its host rows' (every other
    row there is a job's, e.g. its run folders); else every open row's."""
    from gpucluster.lifecycle.held import HOST_KIND

    held = [r for r in open_rows if r["kind"] == HOST_KIND]  # machines that exist: the cluster is its host rows,
    return {r["run_id"] for r in (held or open_rows)}  # every other row there is a job's (e.g. its run folders)


def _dead_or_refused(ledger: Ledger, name: str, latest: StoredRun, holders: set[str], origin: StoredRun, *,
                     dead_ok: bool) -> StoredRun:
    """A last run still RUNNING with no live process: refused, unless (`dead_ok`) it is a job (not
    the cluster's maker) whose rows are all its launcher's, which `reclaim` may finish."""
    if not (dead_ok and latest.id not in holders and latest.id != origin.id):
        raise dead_run(ledger, name, latest.id)
    return latest  # a job (not the cluster's maker) whose rows are all its launcher's: `reclaim` may finish it


def dead_run(ledger: Ledger, name: str, run_id: str) -> UsageError:
    """The refusal of a cluster whose last run never finished, naming what it left there."""
    left = [f"{r['kind']} {r['name']}" for r in ledger.open_resources(name)
            if r["run_id"] == run_id and r["kind"] in LAUNCHER_KINDS]
    on_it = f"; what it started there may still run: {', '.join(left)}" if left else ""
    return UsageError(f"cluster {name!r}: its last run {run_id} never finished (its gpucluster process ended "
                      f"without teardown){on_it}; check or remove it with `gpucluster down {name}`")


def reclaim(ledger: Ledger, launcher: Launcher, cluster: Cluster, kept: Kept) -> str | None:
    """Before a job on a kept cluster whose last job's gpucluster process died (`kept.dead`): the
    launcher deletes what that job started there, found by its run's marks (`Launcher.leftovers` with
    `remove`; gcp:
    its Kubernetes objects by the run label), and reads it back. Nothing left: its open rows are closed
    and the run is finished as failed (a line to show). The launcher cannot, or something is left: the
    refusal (UsageError, exit 2) naming it, nothing recorded."""
    if kept.dead is None:
        return None
    rid = kept.dead.id
    left = launcher.leftovers(cluster, rid, remove=True)
    if left is None:
        raise dead_run(ledger, kept.name, rid)
    if left:
        raise UsageError(f"cluster {kept.name!r}: its last run {rid} never finished, and what it started there "
                         f"could not all be deleted: {', '.join(f'{x.kind} {x.id}' for x in left)}; remove it with "
                         f"`gpucluster down {kept.name}`")
    for r in ledger.open_resources(kept.name):
        if r["run_id"] == rid:
            ledger.resource_deleted(rid, r["kind"], r["name"])
    ledger.finish_run(rid, status=RunStatus.FAILED, exit_code=int(ExitCode.FAILURE),
                      failure="the gpucluster process ended before the run finished (crash or kill); what it "
                              "started on the cluster was deleted by the next `gpucluster exec`",
                      teardown=TeardownVerdict.KEPT, leftovers=[])
    return f"run {rid} had ended without cleanup (its gpucluster process died): what it left on the cluster is deleted"


class Attached(Provider):
    """The provider of a job on a kept cluster: `up` returns the cluster read before the run's row,
    creating nothing. The lifecycle runs with keep=True, so `down` and `leftovers` are never asked:
    should they be, they refuse rather than act on a cluster this run did not create."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.cloud = cluster.cloud

    def up(self, spec: ClusterSpec, events: ProvisionEvents) -> Cluster:
        events.message(f"on kept cluster {self.cluster.name}: {node_count(self.cluster)} node(s), nothing created")
        return self.cluster

    def down(self, name: str, events: ProvisionEvents) -> None:
        raise UsageError(f"a job on kept cluster {name!r} does not tear it down: use `gpucluster down {name}`")

    def leftovers(self, name: str, run_id: str | None = None) -> Check:
        raise UsageError(f"a job on kept cluster {name!r} checks only its own processes")


def attach(provider: Provider, kept: Kept, spec: ClusterSpec | None = None) -> Cluster:
    """The kept cluster from its backend (stack outputs), before anything is recorded. `spec`: a
    cluster of machines that exist (`gpucluster.lifecycle.held`), rebuilt from the spec `up` recorded."""
    if spec is not None:
        from gpucluster.lifecycle.held import attach_held

        return attach_held(provider, spec)
    cluster = provider.attach(kept.name)
    if cluster is None:
        raise UsageError(f"cluster {kept.name!r} is in the ledger as kept, but its stack is gone; close the "
                         f"record with `gpucluster down {kept.name}`")
    if node_count(cluster) == 0:
        raise UsageError(f"cluster {kept.name!r} has no node up")
    return cluster


def node_count(cluster: Cluster) -> int:
    """The cluster's nodes: its addressed nodes, or (a cluster whose nodes are not addressed one by
    one, whose launcher places one pod per node) the count its outputs give."""
    try:
        return len(cluster.nodes) or int(cluster.outputs.get("nodes") or 0)
    except (TypeError, ValueError):
        return 0


def check_fits(kept: Kept, max_seconds: float | None, now: float | None = None) -> str | None:
    """A job limit past the nodes' dead-man deadline is refused (its deadline cannot move); without a
    limit, a note says when the nodes power off."""
    left = kept.lifetime_left(now)
    if left is None:
        return None
    if left <= 0:
        raise UsageError(f"cluster {kept.name!r}: its nodes' max lifetime has passed (they power themselves off); "
                         f"remove it with `gpucluster down {kept.name}`")
    if max_seconds is not None and max_seconds > left:
        raise UsageError(f"--max-minutes {max_seconds / 60:g} is not allowed on cluster {kept.name!r}: its nodes "
                         f"power themselves off in {left / 60:.0f} min (max lifetime, fixed at first boot)")
    return None if max_seconds is not None else (
        f"the nodes power themselves off in {left / 60:.0f} min (max lifetime); the job is stopped then")


def close_processes(ledger: Ledger, launcher: Launcher, cluster: Cluster, run_id: str) -> tuple[ExitCode | None, str | None]:
    """After a job on a kept cluster: its processes on the nodes, checked (`Launcher.leftovers`).
    None found: their ledger rows are closed. Found, or not checkable: the run's teardown verdict says
    so (leftovers / not verified). Returns (the exit code it forces, or None; a line to show)."""
    record = ledger.get_run(run_id)
    rows = [r for r in (record.resources if record else []) if r.kind in LAUNCHER_KINDS and not r.confirmed_gone]
    if not rows:
        return None, None
    try:
        left = launcher.leftovers(cluster, run_id)
    except Exception as exc:  # noqa: BLE001 - a check that cannot run is "not verified", never a crash
        ledger.set_teardown(run_id, TeardownVerdict.NOT_VERIFIED, [],
                            [f"process check: could not run ({type(exc).__name__}: {exc})"])
        return ExitCode.LEFTOVERS, f"the job's processes could not be checked: {exc}"
    if left is None:
        return None, None
    check = Check.of(left)
    from gpucluster.ledger.store import LedgerError

    try:  # the check stands whether or not it can be written down
        if check.verified:
            for r in rows:
                ledger.resource_deleted(run_id, r.kind, r.name)
        else:
            ledger.set_teardown(run_id, check.verdict, check.to_dict()["leftovers"], list(check.unchecked))
    except LedgerError as exc:  # a ledger gone read-only, full or deleted: the run's end says it (exit 3)
        return ExitCode.LEFTOVERS, (f"the job's processes: {check.summary()}; not recorded: {exc.message}")
    return (None, None) if check.verified else (ExitCode.LEFTOVERS, f"the job's processes: {check.summary()}")


def idle_minutes(spec: JsonObject) -> int | None:
    opts = spec.get("options") or {}
    value = opts.get(IDLE_OPTION, opts.get("idle_minutes"))
    try:
        return int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def idle_left(ledger: Ledger, cluster: str, now: float | None = None) -> tuple[int, float] | None:
    """(idle minutes, seconds before the idle stop) of a kept cluster with an idle stop; None
    without one. A job running now: the full time is left. The watcher on the nodes counts from
    its own view of the last job (it sees every job's processes); this is the ledger's view."""
    now = time.time() if now is None else now
    runs = [r for r in ledger.list_runs(limit=None) if r.cluster == cluster]
    holders = {r["run_id"] for r in ledger.open_resources(cluster)}
    owners = [r for r in runs if r.id in holders]
    if not owners:
        return None
    origin = min(owners, key=lambda r: r.created_at or 0)
    minutes = idle_minutes(origin.spec or {})
    if not minutes:
        return None
    if any(r.status == RunStatus.RUNNING for r in runs):
        return minutes, minutes * 60.0
    last = max([float(r.ended_at or r.created_at or 0) for r in runs if (r.created_at or 0) >= (origin.created_at or 0)])
    return minutes, last + minutes * 60.0 - now


def access_dir(name: str, create: bool = False) -> Path:
    """Where `gpucluster ssh --ssh-config` writes a cluster's host aliases, pinned keys and key."""
    from gpucluster.home import home_dir

    return home_dir(create=create) / "ssh" / name


def forget_access(name: str) -> None:
    """`down` of a verified cluster: its ssh config, pinned keys and key copy go with it (an
    `Include` of the removed file matches nothing and is ignored by OpenSSH)."""
    import shutil

    shutil.rmtree(access_dir(name), ignore_errors=True)


def cap_teardown(ledger: Ledger, name: str, origin_id: str, backend: Plugin, outcome: RunOutcome,
                 take_down: Callable[[], Downed]) -> tuple[ExitCode | None, str | None]:
    """After a job on a kept cluster stopped at a cost cap: when the *cluster's* own cap (`up --max-cost`)
    has been reached by what the cluster cost (its resources since `up`, as the report prices them), the
    cluster is torn down and checked (`take_down()`: `gpucluster down`'s own path) rather than left billing.
    Returns (the exit code: 4 when verified, else the teardown's; the line to say), or (None, None) when the
    stop was not the cluster's cap (an `exec --max-cost` below it stops only the job)."""
    from gpucluster.costing.guards import accrued_of, cap_reason, kept_cap

    cap = kept_cap(ledger, origin_id)
    if cap is None or outcome.status != RunStatus.STOPPED:
        return None, None
    spent = accrued_of(ledger, origin_id, backend)()
    if spent is None or spent < cap:
        return None, None
    done = take_down()
    verdict = done.check.verdict if done.check is not None else str(done.verdict.get("verdict") or TeardownVerdict.NOT_VERIFIED)
    reason = cap_reason(cap, spent)
    if done.exit_code == ExitCode.OK:
        return ExitCode.COST_CAP, f"cluster {name!r}: {reason} (up --max-cost): torn down, verified"
    return done.exit_code, (f"cluster {name!r}: {reason} (up --max-cost): torn down, {verdict}; finish with "
                            f"`gpucluster down {name}`")
