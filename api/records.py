"""The ledger from Python: `runs()`, `show(run_id)`, `logs(run_id)` and `down(cluster)`, the functions
`gpucluster runs`, `show`, `logs` and `down` call (the CLI renders what they return)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, TypedDict

from gpucluster.errors import UsageError, not_allowed

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from gpucluster.api.clusters import Cluster
    from gpucluster.infra.contract import Plugin
    from gpucluster.ledger.records import RunRecord, StoredRun
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.teardown import Downed

def _ledger(ledger: Ledger | None = None) -> Ledger:
    if ledger is not None:
        return ledger
    from gpucluster.ledger.store import Ledger

    return Ledger.open_default()


def runs(limit: int | None = 20, *, cloud: str | None = None, status: str | None = None,
         ledger: Ledger | None = None) -> list[StoredRun]:
    """The recorded runs (`records.RunRow`), newest first."""
    from gpucluster.infra.registry import NAMES
    from gpucluster.ledger.schema import RUN_STATES as STATUSES

    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise UsageError(not_allowed("limit", limit, "an integer of 1 or more"))
    if cloud is not None and cloud not in NAMES:
        raise UsageError(not_allowed("cloud", cloud, NAMES))
    if status is not None and status not in STATUSES:
        raise UsageError(not_allowed("status", status, STATUSES))
    return list(_ledger(ledger).list_runs(limit=limit, cloud=cloud, status=status))


def show(run_id: str, *, metrics: bool = False, ledger: Ledger | None = None) -> RunRecord:
    """One run's whole record (`records.RunRecord`: phases, nodes, outputs, resources, cost; a
    recovered chain's attempts), or a UsageError when the ledger does not have it."""
    from gpucluster.cli.run import with_attempts

    ledger = _ledger(ledger)
    record = ledger.get_run(run_id, with_metrics=metrics)
    if record is None:
        raise UsageError(f"run {run_id!r} is not in the ledger; list runs with 'gpucluster runs'")
    with_chain = with_attempts(ledger, record)
    assert with_chain is not None  # with_attempts returns None only when given None
    return with_chain


def node_logs(log_dir: Path) -> list[Path]:
    """The node-N.log files of a run's log folder, by rank."""
    if not log_dir.is_dir():
        return []
    found = [p for p in log_dir.glob("node-*.log") if p.stem.split("-", 1)[1].isdigit()]
    return sorted(found, key=lambda p: int(p.stem.split("-")[1]))


@dataclass
class LogLine:
    """One line of a node's log."""

    node: int
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass
class LogReader:
    """A run's node logs read as they grow (`logs`; `gpucluster logs` renders what it reads)."""

    record: RunRecord
    ledger: Ledger
    node: int | None = None
    offsets: dict[Path, int] = field(default_factory=dict)

    @property
    def log_dir(self) -> Path:
        return Path(self.record.run.log_dir or "")

    def files(self) -> list[Path]:
        return [p for p in node_logs(self.log_dir) if self.node is None or p.stem == f"node-{self.node}"]

    def read(self, *, whole_lines: bool) -> list[LogLine]:
        """The lines written since the last read; `whole_lines`: a line still being written waits."""
        out: list[LogLine] = []
        for p in self.files():
            if not p.is_file():
                raise UsageError(f"node log {str(p)!r} is not a file (a folder?); move it aside to read the others")
            # bytes, not text: the offset counts the bytes read (a line that is not UTF-8 is re-encoded
            # longer by errors="replace", and a text offset then skipped what came after it)
            with open(p, "rb") as fh:
                fh.seek(self.offsets.get(p, 0))
                data = fh.read()
            if data and not data.endswith(b"\n") and whole_lines:
                data = data[: data.rfind(b"\n") + 1]
            self.offsets[p] = self.offsets.get(p, 0) + len(data)
            rank = int(p.stem.split("-")[1])
            out += [LogLine(rank, line) for line in data.decode("utf-8", errors="replace").splitlines()]
        return out

    def follow(self, *, on_orphan: Callable[[], object] | None = None, poll_s: float = 0.5) -> Iterator[list[LogLine]]:
        """Batches of new lines until the run is no longer running (or its process is gone)."""
        while True:
            batch = self.read(whole_lines=True)
            if batch:
                yield batch
                continue
            over, orphaned = self.ended()
            if over:
                yield self.read(whole_lines=False)  # what was written between the last read and the end
                if orphaned and on_orphan is not None:
                    on_orphan()
                return
            time.sleep(poll_s)

    def ended(self) -> tuple[bool, bool]:
        """(whether the run is over: no longer running, or its process gone; whether it was left
        `running` by a process that is gone: orphaned). `follow` and the dashboard's live logs stop on it."""
        now = self.ledger.get_run(self.record.id or "")  # (a record read from the ledger has its id)
        if now is None or now.run.status != "running":
            return True, False
        return (True, True) if not owner_alive(self.record) else (False, False)


def reader(run_id: str, node: int | None = None, *, ledger: Ledger | None = None) -> LogReader:
    """A reader of the run's node logs (a UsageError for an unknown run or node)."""
    ledger = _ledger(ledger)
    record = ledger.get_run(run_id)
    if record is None:
        raise UsageError(f"run {run_id!r} is not in the ledger; list runs with 'gpucluster runs'")
    if node is not None and (isinstance(node, bool) or not isinstance(node, int) or node < 0):
        raise UsageError(not_allowed("node", node, "a node rank (0, 1, ...)"))
    found = LogReader(record, ledger, node)
    files = node_logs(found.log_dir)
    if node is not None and node >= (record.run.nodes or 0) and not any(p.stem == f"node-{node}" for p in files):
        have = sorted(p.stem for p in files)
        raise UsageError(not_allowed("node", node, ", ".join(have) or "none: the run has no node logs"))
    return found


def logs(run_id: str, node: int | None = None, follow: bool = False, *, raw: bool = False,
         ledger: Ledger | None = None) -> Iterator[str]:
    """The run's log lines (every node's, or `node`'s), node by node; `follow`: then the lines
    written until the run ends, as they come. Metric lines (`@gpucluster-metric {...}`, in the
    ledger: `show(run_id, metrics=True)`) are left out unless `raw`."""
    import itertools

    from gpucluster.workloads.protocol import PREFIX as METRIC_MARK

    read = reader(run_id, node, ledger=ledger)  # an unknown run or node: raised here, not at the first line
    first = [read.read(whole_lines=follow)]
    more = read.follow() if follow and read.record.run.status == "running" else iter(())
    return (line.text for batch in itertools.chain(first, more) for line in batch
            if raw or METRIC_MARK not in line.text)


def owner_alive(record: RunRecord) -> bool:
    """Whether a live gpucluster process still owns the run (its owner lock, released by the kernel
    when that process dies, names this run)."""
    from gpucluster.lifecycle.owner import owner

    info = owner(record.run.cluster) if record.run.cluster is not None else None  # no cluster: no lock
    if info is None:
        return False
    return info.get("run_id") in (None, record.id)  # an unreadable lock: assume it is this run's


class HowDown(TypedDict, total=False):
    """How a cluster is taken down (`gpucluster down`'s flags): `take_down`'s keywords."""

    force: bool
    project: str | None
    ack_unwitnessed: bool | Callable[[str], bool]
    any_owner: bool
    context: str | None


class DownOptions(TypedDict, total=False):
    """`down`'s keywords beside the cluster (`Cluster.down(**how)`)."""

    cloud: str | None
    force: bool
    any_owner: bool
    project: str | None
    ack_unwitnessed: bool
    ledger: Ledger | None
    say: Callable[[str], None] | None


def down(cluster: str | Cluster, *, cloud: str | None = None, force: bool = False, any_owner: bool = False,
         project: str | None = None, ack_unwitnessed: bool = False, ledger: Ledger | None = None,
         say: Callable[[str], None] | None = None) -> Downed:
    """Delete a cluster (a name, or a `Cluster`) and check what is left: its `Teardown` (`.verdict`
    verified / leftovers / not verified, `.exit_code`). A cluster a live gpucluster process owns is
    refused (ClusterBusy) unless `force`."""
    from gpucluster.infra.registry import plugin, project_id, provisioning
    from gpucluster.lifecycle.teardown import check_project, down_targets, refuse_busy

    from gpucluster.api.clusters import Cluster

    name = cluster.name if isinstance(cluster, Cluster) else cluster
    if not isinstance(name, str) or not name:
        raise UsageError(not_allowed("cluster", cluster, "a cluster name (see `gpucluster status`)"))
    ledger = _ledger(ledger)
    targets = down_targets(ledger, name, False, cloud, provisioning())
    if not targets:
        raise UsageError(f"nothing to do: the ledger records no cluster {name!r} that may still exist")
    if not force:
        refuse_busy(targets)
    chosen = plugin(targets[name])
    if project:
        project = check_project(project_id(project), targets, {chosen.name: chosen})
    return take_down_one(name, chosen, ledger=ledger, say=say or (lambda text: None), force=force, project=project,
                         ack_unwitnessed=ack_unwitnessed, any_owner=any_owner)


def take_down_one(name: str, chosen: Plugin, *, ledger: Ledger, say: Callable[[str], None],
                  **how: Unpack[HowDown]) -> Downed:
    """One cluster of `chosen`'s cloud down and checked (`down`; `gpucluster down` for each cluster)."""
    from gpucluster.cli.common import provider_for
    from gpucluster.lifecycle.teardown import take_down

    done = take_down(name, chosen.name, ledger=ledger, provider_for=provider_for, backend=chosen, say=say, **how)
    if not ledger.open_resources(name):  # all of it confirmed gone: a team's spend record of it ends (cli/budgets.py)
        from gpucluster.cli.budgets import settle_kept

        settle_kept(ledger, name)
    return done
