"""The `down` and `gc` lifecycles, beside `lifecycle.execute` / `provision_only`.

`down`: which clusters a request names (`down_targets`), a live owner refused or stopped
(`refuse_busy`, `force`), then per cluster under its owner lock: delete, the backend's
independent check (`check_down`), and the ledger's rows closed only when it is verified
(`take_down`). `gc`: what is tagged managed-by=gpucluster and no live cluster owns (`Collection`),
deleted on request, and the verdict from a fresh look, never from the delete calls.

Both touch only what is ours (`gpucluster.ownership.Ownership`): resources carrying this home's
owner id, or made by a run of this ledger before owner marks existed. Another owner's resources
are listed with owner, user@host and age ("not ours") and left alone, and so are standalone stacks
(made with `pulumi up` directly) unless named (`gc --stack`); `--any-owner` lifts the owner limit
for an admin who means it (`gc` then also needs an age, `--older-than`).

The command resolves the backends and passes them in; nothing here prints or asks: it returns
the verdicts, and says progress through the `say` callback it is given.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Protocol, TypedDict

from gpucluster.domain import UNWITNESSED, Check
from gpucluster.errors import ExitCode, GpuclusterError, TeardownIncomplete, UsageError, did_you_mean
from gpucluster.states import RunStatus, TeardownVerdict

if TYPE_CHECKING:
    from gpucluster.ledger.records import JsonObject
    from gpucluster.domain import Leftover, Provider
    from gpucluster.infra.contract import Plugin, ScanScope
    from gpucluster.ledger.store import Ledger
    from gpucluster.ownership import Ownership
    from gpucluster.ledger.records import RunRecord, StoredRun


class FoundRecord(Protocol):
    """What a backend's tag scan reports for one resource (`infra/leftovers.Found`, which the core
    may not import): the leftover and the cluster its tags name."""

    @property
    def leftover(self) -> Leftover: ...

    @property
    def cluster(self) -> str | None: ...




class CensusRow(TypedDict):
    """One row of `census`: a cluster and owner found by tag (`status --cloud`, its JSON)."""

    cluster: str
    cloud: str
    whose: str  # ours, not ours, standalone stack
    owner: str | None
    made_by: str | None
    stack: str | None
    since: float | None
    resources: int
    hourly_usd: str | None
    regions: list[str]


# -- down ---------------------------------------------------------------------------------------
ACKNOWLEDGED = "teardown_acknowledged"  # the metric record `down --ack-unwitnessed` leaves with a run


def clusters_known(ledger: Ledger) -> dict[str, str]:
    """cluster -> cloud, for every cluster in the ledger (newest run wins)."""
    known: dict[str, str] = {}
    for run in ledger.list_runs(limit=None):
        known.setdefault(run.cluster, run.cloud)
    return known


def open_clusters(ledger: Ledger) -> dict[str, str]:
    """cluster -> cloud of what may still exist: open resource rows, and runs whose process is gone
    (`orphaned_runs`: a run killed before its first resource row, e.g. in its `check` phase, left
    its node programs and no row)."""
    out = {row["cluster"]: row["cloud"] for row in ledger.open_resources()}
    for run in orphaned_runs(ledger):
        out.setdefault(run.cluster, run.cloud)
    return out


def orphaned_runs(ledger: Ledger, cluster: str | None = None) -> list[StoredRun]:
    """Runs still `running` in the ledger whose cluster no live gpucluster process owns: the owner
    lock (gpucluster/lifecycle/owner.py, taken before the run's row and released by the kernel when its
    process dies) is free, so the process that wrote the row ended without finishing it (a crash, a
    SIGKILL), whatever resource rows it wrote. This process's own lock (`down` taking the cluster)
    does not make a run live."""
    from gpucluster.lifecycle.owner import owner

    live: dict[str, bool] = {}
    out = []
    for run in ledger.list_runs(limit=None, status=RunStatus.RUNNING):
        if cluster is not None and run.cluster != cluster:
            continue
        if run.cluster not in live:
            info = owner(run.cluster)
            live[run.cluster] = info is not None and not (info.get("self") and info.get("op") == "down")
        if not live[run.cluster]:
            out.append(run)
    return out


def down_targets(ledger: Ledger, cluster: str | None, all_: bool, cloud: str | None,
                 clouds: tuple[str, ...]) -> dict[str, str]:
    """cluster -> cloud of what `down` is asked to remove (a UsageError when it names nothing known)."""
    open_ = open_clusters(ledger)
    if all_:
        return dict(open_)
    if not cluster:
        listed = ", ".join(sorted(open_)) or "none"
        raise UsageError(f"name a cluster or pass --all (clusters that may still exist: {listed})")
    known = clusters_known(ledger)
    c = cloud or open_.get(cluster) or known.get(cluster)
    if c is None:
        raise UsageError(f"cluster {cluster!r} is not in the ledger{did_you_mean(cluster, known)}; "
                         f"pass --cloud {'|'.join(clouds)} to tear down a cluster made elsewhere with this home")
    return {cluster: c}


def open_run_ids(ledger: Ledger, name: str) -> set[str]:
    """The runs of cluster `name` that `down` checks: those with open rows, and those killed before their first
    row (issue 45 item 7)."""
    ids: set[str] = {r["run_id"] for r in ledger.open_resources(name)}
    return ids | {r.id for r in orphaned_runs(ledger, name) if r.id is not None}


def run_records(ledger: Ledger, name: str) -> dict[str, JsonObject]:
    """run id -> the JSON form of its ledger record ({} when it has none), of the runs `down` checks."""
    records = {rid: ledger.get_run(rid) for rid in sorted(open_run_ids(ledger, name))}
    return {rid: rec.to_dict() if rec is not None else {} for rid, rec in records.items()}


def check_project(project: str, targets: dict[str, str], backends: dict[str, Plugin]) -> str:
    """`down --project`: only for clusters whose backend has projects."""
    others = sorted(n for n, c in targets.items() if "project" not in backends[c].traits.flags)
    if others:
        raise UsageError(f"--project {project} is not allowed for {', '.join(others)}: it names a GCP project "
                         "(give it for gcp clusters only)")
    return project


def refuse_busy(targets: dict[str, str]) -> None:
    """A cluster a live gpucluster process owns is not pulled from under it (ClusterBusy, exit 2)."""
    from gpucluster.lifecycle.owner import busy_error, owner

    for name in sorted(targets):
        info = owner(name)
        if info and not info.get("self"):
            raise busy_error(name, info)


@dataclass
class Downed:
    """One cluster's `down`: the verdict as `--json` prints it, its check, and the exit code."""

    verdict: JsonObject
    check: Check | None
    exit_code: ExitCode
    error: str | None = None



class ProviderFor(Protocol):
    """The provider of `cloud`, made with `down`'s scope: whose resources it may count and delete (`ownership`;
    None: this home's owner) and the account they live in (`project`, `down --project`); `cli.common.provider_for`.
    A run's own provider (recovery) is given as it is."""

    def __call__(self, cloud: str, *, ownership: Ownership | None = None, project: str | None = None) -> Provider: ...


def ownership_of(ledger: Ledger, *, any_owner: bool = False, stacks: tuple[str, ...] = ()) -> Ownership:
    """What this home may delete: its owner id, and the runs its ledger made (resources older than
    owner marks carry only those)."""
    from gpucluster.ownership import Ownership

    return Ownership.here((r.id for r in ledger.list_runs(limit=None)), any_owner=any_owner, stacks=stacks)


def take_down(name: str, cloud: str, *, ledger: Ledger, provider_for: ProviderFor, backend: Plugin,
              force: bool = False, project: str | None = None, say: Callable[[str], None] = lambda text: None,
              ack_unwitnessed: bool | Callable[[str], bool] = False, any_owner: bool = False,
              context: str | None = None) -> Downed:
    """Delete `name`, then check independently what is left; the ledger's rows are closed only
    when the check is verified (else each open run gets the verdict). Only what is ours is deleted
    and counted (`any_owner`: every owner's); the rest found under the name is in the verdict's
    `not_ours`, untouched.

    A run whose node had no witness (its reaper was killed, its session was cut: an unchecked line
    starting with `UNWITNESSED`) keeps that line: no check here can find a process that carries
    nothing of the run, so the verdict stays "not verified" until `ack_unwitnessed` (the person
    says they checked those nodes themselves), which is then recorded with each such run. A callable
    `ack_unwitnessed` acknowledges only the lines it accepts (the recovery loop: the nodes it saw lost,
    whose reaper could not report because the node itself went away). `context` (`down --context`, a backend
    with `Operations.in_context`): the context the runs' objects are looked for in (theirs, or one standing in
    for theirs once it is gone)."""
    from gpucluster.lifecycle.owner import owner_lock, stop_owner

    verdict: JsonObject = {"cluster": name, "cloud": cloud}
    try:
        if force:
            stopped = stop_owner(name, say=say)
            if stopped:
                verdict["stopped_owner"] = stopped
        with owner_lock(name, "down"):
            had_open = open_run_ids(ledger, name)
            check, records = _delete_and_check(name, cloud, had_open, verdict, ledger=ledger, provider_for=provider_for,
                                               backend=backend, project=project, say=say, any_owner=any_owner,
                                               context=context)
            check, unwitnessed = _unwitnessed_lines(check, records, ack_unwitnessed)
    except GpuclusterError as exc:
        verdict.update(verdict=TeardownVerdict.NOT_VERIFIED, error=exc.message)
        code = exc.exit_code if exc.exit_code == ExitCode.USAGE else ExitCode.LEFTOVERS
        return Downed(verdict, None, code, exc.message)
    verdict.update(check.to_dict())
    if check.verified:
        _acknowledge(ledger, verdict, unwitnessed, by_recovery=callable(ack_unwitnessed))
        verdict["runs_closed"] = _finish_cluster_rows(ledger, name, had_open)
        from gpucluster.lifecycle.kept import forget_access

        forget_access(name)  # `ssh --ssh-config` files: the host aliases, pinned keys and the key copy
        return Downed(verdict, check, ExitCode.OK)
    for rid in {r["run_id"] for r in ledger.open_resources(name)} | had_open:
        ledger.set_teardown(rid, check.verdict, verdict["leftovers"], verdict["unchecked"])
    return Downed(verdict, check, ExitCode.LEFTOVERS)


def _delete_and_check(name: str, cloud: str, had_open: set[str], verdict: JsonObject, *, ledger: Ledger,
                      provider_for: ProviderFor, backend: Plugin, project: str | None,
                      say: Callable[[str], None], any_owner: bool,
                      context: str | None) -> tuple[Check, dict[str, RunRecord | None]]:
    """`take_down`'s delete, then the backend's own check of what is left (in `context`, when
    given); a delete that could not run is an unchecked line. Also the ledger's records of the
    runs that had open rows."""
    from gpucluster.lifecycle.steps import LedgerEvents

    provider = provider_for(cloud, ownership=ownership_of(ledger, any_owner=any_owner), project=project)
    not_run = []
    try:
        provider.down(name, LedgerEvents(ledger, name, say=say))
    except TeardownIncomplete as exc:
        not_run.append(f"delete: {exc.message}")
    records = {rid: ledger.get_run(rid) for rid in sorted(had_open)}
    # the backends' check_down reads the JSON form of each record
    runs: Mapping[str, Mapping[str, object]] = {rid: rec.to_dict() if rec is not None else {}
                                                for rid, rec in records.items()}
    if context is not None:
        runs = _in_context(backend, context, name, cloud, runs, say, verdict)
    return backend.ops.check_down(provider, name, runs).with_unchecked(*not_run), records


def _in_context(backend: Plugin, context: str, name: str, cloud: str, runs: Mapping[str, Mapping[str, object]],
                say: Callable[[str], None], verdict: JsonObject) -> Mapping[str, Mapping[str, object]]:
    """`down --context`: the runs as the backend finds them in `context` (said, and in the verdict)."""
    if backend.ops.in_context is None:
        raise UsageError(f"--context {context} does not apply to cluster {name} (cloud {cloud})")
    runs, moved = backend.ops.in_context(context, runs)
    for line in moved:
        say(line)
    verdict.update(context=context, **({"context_moved": moved} if moved else {}))
    return runs


def _unwitnessed_lines(check: Check, records: Mapping[str, RunRecord | None],
                       ack_unwitnessed: bool | Callable[[str], bool]) -> tuple[Check, dict[str, list[str]]]:
    """The runs' unwitnessed lines: those not acknowledged stay unchecked in the check; those
    acknowledged come back by run (only runs with some)."""
    unwitnessed = {rid: [u for u in rec.run.unchecked if u.startswith(UNWITNESSED)]
                   for rid, rec in records.items() if rec is not None}
    acked: Callable[[str], bool] = (ack_unwitnessed if callable(ack_unwitnessed)
                                    else lambda line: bool(ack_unwitnessed))
    check = check.with_unchecked(*(u for lines in unwitnessed.values() for u in lines if not acked(u)))
    unwitnessed = {rid: [u for u in lines if acked(u)] for rid, lines in unwitnessed.items()}
    return check, {rid: lines for rid, lines in unwitnessed.items() if lines}


def _acknowledge(ledger: Ledger, verdict: JsonObject, unwitnessed: Mapping[str, list[str]], *,
                 by_recovery: bool) -> None:
    """ack_unwitnessed: the person's word (or the recovery loop's), kept beside the verdict."""
    if not unwitnessed:
        return
    verdict["acknowledged"] = sorted({u for lines in unwitnessed.values() for u in lines})
    for rid, lines in sorted(unwitnessed.items()):
        by = "recovery: the node was lost" if by_recovery else "gpucluster down --ack-unwitnessed"
        ledger.add_metrics(rid, [(None, {"kind": ACKNOWLEDGED, "time": time.time(), "unwitnessed": lines,
                                         "by": by})])


def _finish_cluster_rows(ledger: Ledger, cluster: str, run_ids: set[str]) -> int:
    """After a verified teardown: every open row of `cluster` is gone; orphaned runs are closed.
    `run_ids`: the runs that had open rows before the teardown."""
    for row in ledger.open_resources(cluster):
        ledger.resource_deleted(row["run_id"], row["kind"], row["name"])
        run_ids.add(row["run_id"])
    for run in ledger.list_runs(limit=None):
        if run.cluster != cluster:
            continue
        if run.status == RunStatus.RUNNING:
            ledger.finish_run(run.id, status=RunStatus.FAILED, exit_code=int(ExitCode.FAILURE),
                              failure="the gpucluster process ended before the run finished (crash or kill); "
                                      "its resources were removed by `gpucluster down`",
                              teardown=TeardownVerdict.VERIFIED, leftovers=[])
        elif run.id in run_ids or run.teardown in (None, TeardownVerdict.KEPT):
            ledger.set_teardown(run.id, TeardownVerdict.VERIFIED, [])
    return len(run_ids)


# -- gc -----------------------------------------------------------------------------------------
def live_clusters(ledger: Ledger) -> set[str]:
    """Clusters someone wants: kept ones (`up`, `run --keep`) and those a live process owns."""
    from gpucluster.lifecycle.owner import owner as lock_owner

    live = set()
    latest: dict[str, StoredRun] = {}
    for run in ledger.list_runs(limit=None):
        latest.setdefault(run.cluster, run)
    for name, run in latest.items():
        if lock_owner(name):
            live.add(name)
        elif run.status != RunStatus.RUNNING and run.teardown in (None, TeardownVerdict.KEPT):
            live.add(name)  # kept on purpose: `up`, or `run --keep` (whatever the run's outcome)
    return live


@dataclass
class Collection:
    """`gc` over the given backends (name -> backend): where each looks (its `gc_scope`, from the
    ledger and the flags), what it finds that is ours and no live cluster owns, and what deleting
    it left. What is not ours (another owner's, a standalone stack's) or younger than `older_than`
    seconds is kept in `left_alone`, with why, and never deleted."""

    ledger: Ledger
    backends: dict[str, Plugin]
    regions: tuple[str, ...] = ()
    project: str | None = None
    include_kept: bool = False
    live: set[str] = field(default_factory=set)
    scopes: dict[str, ScanScope] = field(default_factory=dict)
    any_owner: bool = False  # every owner's resources (with older_than: an admin who means it)
    older_than: float | None = None  # seconds: only what was made at least this long ago
    stacks: tuple[str, ...] = ()  # standalone stacks (`pulumi up -s`) named to be swept too
    now: float | None = None
    ownership: Ownership = field(init=False)
    left_alone: list[tuple[Leftover, str, str]] = field(default_factory=list)  # (leftover, why, cloud), last look
    asked: bool = True  # the clouds were named (gc --cloud); False: every cloud, those not installed left out
    not_installed: list[str] = field(default_factory=list)  # clouds left out: no SDK here, no run of ours there

    def __post_init__(self) -> None:
        import dataclasses

        from gpucluster.errors import MissingDependency

        if self.any_owner and self.older_than is None:
            raise UsageError("gc --any-owner also needs --older-than DURATION (e.g. --older-than 12h): it deletes "
                             "other people's resources, so only those older than that")
        self.ownership = ownership_of(self.ledger, any_owner=self.any_owner, stacks=self.stacks)
        self.live = set() if self.include_kept else live_clusters(self.ledger)
        open_rows = self.ledger.open_resources()
        self.scopes = {}
        for c, b in list(self.backends.items()):
            runs = [r.to_dict() for r in self.ledger.list_runs(limit=200, cloud=c)]
            try:
                scope = b.needs_provisioner().gc_scope([r for r in open_rows if r["cloud"] == c], runs, self.regions,
                                                       self.project)
            except MissingDependency:
                if self.asked or runs:  # named, or this home ran there: the user must hear what is missing
                    raise
                self.not_installed.append(c)  # nothing of this home's can be there
                del self.backends[c]
                continue
            self.scopes[c] = dataclasses.replace(scope, owner=self.ownership.scan_owner)

    @property
    def where(self) -> str:
        """Where the scan looks, per cloud: its name and the regions its scope names (aws), e.g. "aws us-east-1/us-west-2, gcp"."""
        return ", ".join(" ".join([c, "/".join(self.scopes[c].regions)]).strip() for c in self.backends)

    def _why_kept(self, f: FoundRecord, now: float) -> str | None:
        """Why a found resource is left alone, or None when it is ours to delete."""
        from gpucluster.ownership import NOT_OURS, STACK, not_ours_line, when

        lo = f.leftover
        whose = self.ownership.whose(lo)
        if whose in (NOT_OURS, STACK):
            return not_ours_line(lo)
        if f.cluster in self.live:
            return f"{lo.kind} {lo.id}: cluster {f.cluster} is kept or in use (remove it with `gpucluster down {f.cluster}`)"
        if self.older_than is not None and (lo.since is None or now - lo.since < self.older_than):
            age = "of unknown age" if lo.since is None else f"made {when(lo.since)}"
            return f"{lo.kind} {lo.id}: {age}, not older than --older-than"
        return None

    def look(self) -> tuple[dict[str, list[Leftover]], list[str]]:
        """(cloud -> leftovers of ours no live cluster owns, the checks that could not run); what is
        left alone goes to `left_alone`."""
        import time

        now = time.time() if self.now is None else self.now
        found: dict[str, list[Leftover]] = {}
        skipped: list[str] = []
        self.left_alone = []
        for c, b in self.backends.items():
            try:
                report = b.needs_provisioner().scan(None, None, self.scopes[c])
            except GpuclusterError as exc:
                skipped.append(f"{c}: not checked ({exc.message})")
                continue
            except Exception as exc:  # noqa: BLE001 - no credentials, no network: say so, go on
                skipped.append(f"{c}: not checked ({type(exc).__name__}: {exc})")
                continue
            found[c] = []
            for f in report.found:
                why = self._why_kept(f, now)
                if why is None:
                    found[c].append(f.leftover)
                else:
                    self.left_alone.append((f.leftover, why, c))
            skipped += report.skipped
        return found, skipped

    def not_ours(self) -> list[Leftover]:
        from gpucluster.ownership import NOT_OURS, STACK

        return [lo for lo, _, _ in self.left_alone if self.ownership.whose(lo) in (NOT_OURS, STACK)]

    def delete(self, asked: dict[str, list[Leftover]]) -> "Collected":
        """Delete what `look` found, then look again: the verdict rests on the fresh look."""
        errors: list[str] = []
        for c, b in self.backends.items():
            if asked.get(c):
                errors += b.needs_provisioner().delete(asked[c], self.scopes[c], 600)
        by_cloud, skipped = self.look()
        # deleted: what the fresh look saw gone, only where it could look again
        deleted = [lo for c, los in asked.items() if c in by_cloud for lo in los
                   if (lo.kind, lo.id) not in {(x.kind, x.id) for x in by_cloud[c]}]
        return Collected(self.flat(by_cloud), skipped, deleted, errors, self.not_ours())

    def flat(self, by_cloud: dict[str, list[Leftover]]) -> list[Leftover]:
        return [lo for c in self.backends for lo in by_cloud.get(c, [])]


@dataclass
class Collected:
    found: list[Leftover]
    skipped: list[str]
    deleted: list[Leftover] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    not_ours: list[Leftover] = field(default_factory=list)  # another owner's, standalone stacks': untouched

    @property
    def check(self) -> Check:
        return Check(tuple(self.found), tuple(self.skipped), tuple(self.not_ours))


# -- status: what the clouds hold, by owner ----------------------------------------------------------
def census(ledger: Ledger, backends: dict[str, Plugin], regions: tuple[str, ...] = (),
           project: str | None = None) -> tuple[list[CensusRow], list[str]]:
    """What a tag scan finds, one row per cluster and owner: ours, another owner's, or a standalone
    stack (`pulumi up -s`), with owner, user@host, since, resources and $/hour (instances priced);
    and the checks that could not run. Nothing is deleted."""
    from decimal import Decimal

    from gpucluster.ownership import OURS, STACK

    sweep = Collection(ledger, backends, regions, project, include_kept=True, any_owner=False)
    by_cloud, skipped = sweep.look()
    rows: dict[tuple[str, str, str, str | None, str | None], CensusRow] = {}
    every = [(c, lo) for c, los in by_cloud.items() for lo in los] + [(c, lo) for lo, _, c in sweep.left_alone]
    for c, lo in every:
        whose = sweep.ownership.whose(lo)
        kind = "standalone stack" if whose == STACK else "ours" if whose == OURS else "not ours"
        cluster = next((part.split("=", 1)[1] for part in lo.detail.split() if part.startswith("cluster=")), "?")
        key = (c, cluster, kind, lo.owner, lo.stack)
        r = rows.setdefault(key, {"cluster": cluster, "cloud": c, "whose": kind, "owner": lo.owner, "made_by": lo.made_by,
                                  "stack": lo.stack, "since": lo.since, "resources": 0, "hourly_usd": None,
                                  "regions": []})
        r["resources"] += 1
        if lo.since is not None:
            r["since"] = lo.since if r["since"] is None else min(r["since"], lo.since)
        if lo.region and lo.region not in r["regions"]:
            r["regions"].append(lo.region)
        if lo.hourly:
            r["hourly_usd"] = str(Decimal(r["hourly_usd"] or 0) + Decimal(lo.hourly))
    return sorted(rows.values(), key=lambda r: (r["whose"], r["cluster"])), skipped
