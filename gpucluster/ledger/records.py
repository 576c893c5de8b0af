"""The ledger's run records, typed: what `Ledger.list_runs` (one `RunRow` per run) and
`Ledger.get_run` (a `RunRecord`: the row and its phases, nodes, outputs, resources, staging and
setup records, resume chain and cost) hand back. Readers use attributes; `to_dict()` gives the
JSON form that `show --json`, `run --json` and `runs --json` print, key for key and in the same
order as before these types existed (tests/test_json_keys.py pins it).

The state columns (a run's status and teardown verdict, a phase's status, an output's verdict) are
the enums of `gpucluster.states` here: the rows convert them when made (`__post_init__`), so code
past this module compares members (`run.status is RunStatus.SUCCEEDED`); being `str`s, they print
and serialise as the stored strings.

Values the nodes and the cost engine write as JSON (a run's metric summary, its metric records,
its price snapshot and stored cost, its recorded spec) stay the mappings they are.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TypeVar

from gpucluster.states import JsonMapping, JsonObject, OutputVerdict, PhaseStatus, RunStatus, TeardownVerdict, parse




# the command the ledger records for a run that only brings a cluster up (`up`: lifecycle.provision_only), no job
UP_COMMAND = ("gpucluster", "up")


def _known(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls) if not f.name.startswith("_"))


@dataclass(frozen=True)
class RunRow:
    """One row of the `runs` table, its JSON columns decoded (`id` is None only for the run an
    estimate imagines)."""

    id: str | None
    created_at: float | None = None
    ended_at: float | None = None
    status: RunStatus | None = None
    cloud: str | None = None
    cluster: str | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    workload: str | None = None
    command: list[str] | None = None
    spec: JsonObject | None = None
    prices: JsonObject | None = None
    failure: str | None = None
    exit_code: int | None = None
    metrics: JsonObject | None = None
    teardown_verified: bool | None = None
    leftovers: list[JsonObject] | None = None
    cost: JsonObject | None = None
    sweep_id: str | None = None
    log_dir: str | None = None
    teardown: TeardownVerdict | None = None
    unchecked: list[str] = field(default_factory=list)
    resumed_from: str | None = None
    # the column order of the row read (the --json order), and columns a newer schema added
    _columns: tuple[str, ...] = field(default=(), repr=False, compare=False)
    _extra: JsonMapping = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:  # the stored strings as members
        object.__setattr__(self, "status", parse(RunStatus, self.status))
        object.__setattr__(self, "teardown", parse(TeardownVerdict, self.teardown))

    @classmethod
    def from_dict(cls: type[R], d: JsonMapping) -> R:
        known = _known(cls)
        return cls(**{k: v for k, v in d.items() if k in known},
                   _columns=tuple(d), _extra={k: v for k, v in d.items() if k not in known})

    def to_dict(self) -> JsonObject:
        columns = self._columns or tuple(f.name for f in dataclasses.fields(self) if not f.name.startswith("_"))
        return {c: (self._extra[c] if c in self._extra else getattr(self, c)) for c in columns}

    @property
    def wall_s(self) -> float | None:
        """Seconds from the row's creation to its end; None while it runs."""
        return self.ended_at - self.created_at if self.ended_at and self.created_at is not None else None

    @property
    def options(self) -> JsonMapping:
        """The recorded spec's backend options."""
        return (self.spec or {}).get("options") or {}

    @property
    def project(self) -> str | None:
        """The recorded spec's account (gcp project): a field, among the options in older records."""
        return (self.spec or {}).get("project") or self.options.get("project")


R = TypeVar("R", bound=RunRow)


@dataclass(frozen=True)
class StoredRun(RunRow):
    """A row as the ledger holds it (`Ledger.list_runs`): its NOT NULL columns are never None."""

    id: str
    cloud: str = ""
    cluster: str = ""
    status: RunStatus = RunStatus.RUNNING


@dataclass(frozen=True)
class PhaseRow:
    name: str
    started_at: float
    ended_at: float | None = None
    status: PhaseStatus | None = None
    detail: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", parse(PhaseStatus, self.status))

    @property
    def seconds(self) -> float | None:
        return self.ended_at - self.started_at if self.ended_at is not None else None


@dataclass(frozen=True)
class NodeRow:
    node_rank: int
    host: str | None = None
    exit_code: int | None = None
    last_lines: list[str] | None = None


@dataclass(frozen=True)
class OutputRow:
    node_rank: int
    path: str | None = None
    files: int | None = None
    bytes: int | None = None
    seconds: float | None = None
    verdict: OutputVerdict | None = None
    detail: str | None = None
    # what came back from the node's working folder (files the job wrote beside its script)
    workdir_files: int | None = None
    workdir_bytes: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "verdict", parse(OutputVerdict, self.verdict))


@dataclass(frozen=True)
class ResourceRow:
    kind: str
    name: str
    id: int | None = None
    run_id: str | None = None
    cloud_id: str | None = None
    region: str | None = None
    detail: JsonObject | None = None
    requested_at: float | None = None
    created_at: float | None = None
    deleted_at: float | None = None
    confirmed_gone: bool = False
    _columns: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: JsonMapping) -> "ResourceRow":
        known = _known(cls)
        return cls(**{k: v for k, v in d.items() if k in known}, _columns=tuple(d))

    def to_dict(self) -> JsonObject:
        return {c: getattr(self, c) for c in self._columns}


@dataclass(frozen=True)
class StageRecord:
    """A node's `stage` metric record (--data): what it holds, what was sent and fetched, how long."""

    node_rank: int | None
    files: int = 0
    bytes: int = 0
    sent_bytes: int = 0
    fetched_bytes: int = 0
    seconds: float = 0
    sent_files: int | None = None  # files sent (the rest were in the node's cache); None: not counted
    raw: JsonMapping = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: JsonMapping) -> "StageRecord":
        return cls(d.get("node_rank"), d.get("files", 0), d.get("bytes", 0), d.get("sent_bytes", 0),
                   d.get("fetched_bytes", 0), d.get("seconds", 0), d.get("sent_files"), raw=d)


@dataclass(frozen=True)
class SetupRecord:
    """A node's `setup_end` metric record (--setup): its exit code and how long it took."""

    node_rank: int | None
    rc: int | None = None
    seconds: float = 0
    raw: JsonMapping = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: JsonMapping) -> "SetupRecord":
        return cls(d.get("node_rank"), d.get("rc"), d.get("seconds", 0), raw=d)


@dataclass(frozen=True)
class RunRecord:
    """One run as the ledger holds it (`Ledger.get_run`)."""

    run: RunRow
    phases: list[PhaseRow] = field(default_factory=list)
    nodes: list[NodeRow] = field(default_factory=list)
    outputs: list[OutputRow] = field(default_factory=list)
    resources: list[ResourceRow] = field(default_factory=list)
    staging: list[StageRecord] = field(default_factory=list)
    setup: list[SetupRecord] = field(default_factory=list)
    resumed_chain: list[str] = field(default_factory=list)  # the runs it continues, nearest first
    chain: list[str] = field(default_factory=list)  # its whole --resume chain, oldest first
    # --resume: the working-folder files laid back into each node, and from which node (metric records)
    resume_files: list[JsonObject] = field(default_factory=list)
    metric_records: list[JsonObject] | None = None  # every metric record (get_run(with_metrics=True))
    attempts: list[JsonObject] | None = None  # a recovered chain's attempts (gpucluster/ledger/attempts.py)

    @property
    def id(self) -> str | None:
        return self.run.id

    @property
    def cost(self) -> JsonObject | None:
        """The stored cost (`gpucluster.costing.cost.run_cost`), None before it was computed."""
        return self.run.cost

    # the run's own columns a caller of the Python API reads most (docs/python.md)
    @property
    def status(self) -> RunStatus | None:
        """running, succeeded, failed, interrupted or stopped."""
        return self.run.status

    @property
    def teardown(self) -> TeardownVerdict | None:
        """The teardown verdict: verified, leftovers, not verified, kept, or None (nothing to check)."""
        return self.run.teardown

    @property
    def exit_code(self) -> int | None:
        return self.run.exit_code

    @property
    def cluster(self) -> str | None:
        return self.run.cluster

    def phase(self, name: str) -> PhaseRow | None:
        return next((p for p in self.phases if p.name == name), None)

    def to_dict(self) -> JsonObject:
        """The JSON form (`show --json`): the row's columns, then the lists, as always."""
        d = self.run.to_dict()
        d["phases"] = [dataclasses.asdict(p) for p in self.phases]
        d["node_results"] = [dataclasses.asdict(n) for n in self.nodes]
        d["outputs"] = [dataclasses.asdict(o) for o in self.outputs]
        d["resources"] = [r.to_dict() for r in self.resources]
        d["resumed_chain"] = list(self.resumed_chain)
        d["chain"] = list(self.chain)
        d["staging"] = [dict(s.raw) for s in self.staging]
        d["setup"] = [dict(s.raw) for s in self.setup]
        d["resume_files"] = [dict(r) for r in self.resume_files]
        from gpucluster.ledger.trained import training_warnings

        d["warnings"] = training_warnings(self)  # the report's lines on whether the run trained (issue 46)
        if self.metric_records is not None:
            d["metric_records"] = list(self.metric_records)
        if self.attempts is not None:
            d["attempts"] = [dict(a) for a in self.attempts]
        return d

    @classmethod
    def from_dict(cls, d: JsonMapping) -> "RunRecord":
        """The inverse of `to_dict` (also for a record written by hand, as tests and old callers do:
        every list may be left out)."""
        return cls(
            run=RunRow.from_dict({k: v for k, v in d.items() if k not in _LISTS}),
            phases=[PhaseRow(**p) for p in _listed(d, "phases")],
            nodes=[NodeRow(**n) for n in _listed(d, "node_results")],
            outputs=[OutputRow(**o) for o in _listed(d, "outputs")],
            resources=[ResourceRow.from_dict(r) for r in _listed(d, "resources")],
            staging=[StageRecord.from_dict(s) for s in _listed(d, "staging")],
            setup=[SetupRecord.from_dict(s) for s in _listed(d, "setup")],
            resume_files=[dict(r) for r in _listed(d, "resume_files")],
            resumed_chain=list(d.get("resumed_chain") or []),
            chain=list(d.get("chain") or []),
            metric_records=None if d.get("metric_records") is None else list(d["metric_records"]),
            attempts=None if d.get("attempts") is None else [dict(a) for a in d["attempts"]],
        )


# the lists of a record's JSON form (RunRecord.to_dict), beside the row's columns
_LISTS = frozenset({"phases", "node_results", "outputs", "resources", "resumed_chain", "chain", "staging", "setup",
                    "resume_files", "metric_records", "attempts", "warnings"})


def _listed(d: JsonMapping, key: str) -> list[JsonObject]:
    """A list of objects in a record's JSON form; left out or null: empty."""
    return d.get(key) or []
