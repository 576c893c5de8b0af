"""The run ledger: one SQLite file that says what every run did, what it created, and whether
that is confirmed gone.

A run row is written (in one transaction) before anything is started or created. Phases, node
exit codes, metrics and resources are appended as they happen, each in its own short transaction,
so a crash at any point leaves rows that say what may still exist; `gpucluster down` / `gc` read
them to finish the job.

Times are Unix seconds (float, UTC). The schema is versioned (`PRAGMA user_version`) and moved
forward by the explicit, ordered migrations below; a ledger from a newer gpucluster is refused.
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from .errors import ConfigError

PHASES = ("prepare", "provision", "ready", "rendezvous", "train", "teardown")
RUN_STATES = ("running", "succeeded", "failed", "interrupted")

MIGRATIONS: list[tuple[int, str]] = [
    (
        1,
        """
        CREATE TABLE runs (
            id TEXT PRIMARY KEY,
            created_at REAL NOT NULL,
            ended_at REAL,
            status TEXT NOT NULL,
            cloud TEXT NOT NULL,
            cluster TEXT NOT NULL,
            nodes INTEGER NOT NULL,
            gpus_per_node INTEGER,
            workload TEXT,
            command TEXT NOT NULL,          -- JSON argv of the training command
            spec TEXT NOT NULL,             -- JSON ClusterSpec
            prices TEXT,                    -- JSON price snapshot taken at launch
            failure TEXT,
            exit_code INTEGER,
            metrics TEXT,                   -- JSON summary of final metrics
            teardown_verified INTEGER,      -- 1 confirmed nothing left, 0 something left, NULL unknown
            leftovers TEXT,                 -- JSON list of what was found still existing
            cost TEXT,                      -- JSON itemized cost, computed after the run
            sweep_id TEXT,
            log_dir TEXT
        );
        CREATE INDEX runs_created ON runs(created_at);
        CREATE TABLE phases (
            run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
            name TEXT NOT NULL,
            started_at REAL NOT NULL,
            ended_at REAL,
            status TEXT,                    -- ok, failed, interrupted, NULL while running
            detail TEXT,
            PRIMARY KEY (run_id, name)
        );
        CREATE TABLE nodes (
            run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
            node_rank INTEGER NOT NULL,
            host TEXT,
            exit_code INTEGER,
            last_lines TEXT,                -- JSON list of the node's last log lines
            PRIMARY KEY (run_id, node_rank)
        );
        CREATE TABLE metrics (
            run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
            node_rank INTEGER,
            kind TEXT NOT NULL,
            time REAL,
            data TEXT NOT NULL
        );
        CREATE INDEX metrics_run ON metrics(run_id, kind);
        CREATE TABLE resources (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
            kind TEXT NOT NULL,             -- instance, volume, gke-cluster, node-pool, process, ...
            name TEXT NOT NULL,
            cloud_id TEXT,
            region TEXT,
            detail TEXT,                    -- JSON: type, size, price key, ...
            requested_at REAL NOT NULL,     -- creation requested (billing may start any moment)
            created_at REAL,
            deleted_at REAL,                -- deletion confirmed
            confirmed_gone INTEGER NOT NULL DEFAULT 0
        );
        CREATE INDEX resources_run ON resources(run_id);
        """,
    ),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, default=str, sort_keys=True)


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


class Ledger:
    def __init__(self, path: Path | str):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(self.path), timeout=30, isolation_level=None, check_same_thread=False)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA foreign_keys = ON")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"ledger {str(self.path)!r} cannot be used: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"ledger {str(self.path)!r} cannot be created: {exc.strerror or exc}") from None

    @classmethod
    def open_default(cls) -> "Ledger":
        from .home import home_dir

        return cls(home_dir() / "ledger.sqlite3")

    def close(self) -> None:
        self._db.close()

    # -- schema ----------------------------------------------------------------------------
    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise ConfigError(
                f"ledger {str(self.path)!r} has schema version {version}, newer than this "
                f"gpucluster understands ({SCHEMA_VERSION}); upgrade gpucluster"
            )
        for target, script in MIGRATIONS:
            if target <= version:
                continue
            with self._tx() as db:
                for statement in script.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {int(target)}")

    @property
    def schema_version(self) -> int:
        return self._db.execute("PRAGMA user_version").fetchone()[0]

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        else:
            self._db.execute("COMMIT")

    # -- writes ----------------------------------------------------------------------------
    def create_run(
        self,
        run_id: str,
        *,
        cloud: str,
        cluster: str,
        nodes: int,
        gpus_per_node: int | None,
        command: list[str],
        spec: dict[str, Any],
        workload: str | None = None,
        prices: dict[str, Any] | None = None,
        sweep_id: str | None = None,
        log_dir: str | None = None,
        now: float | None = None,
    ) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO runs (id, created_at, status, cloud, cluster, nodes, gpus_per_node, workload,"
                " command, spec, prices, sweep_id, log_dir) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    run_id, now or time.time(), "running", cloud, cluster, nodes, gpus_per_node, workload,
                    _dumps(command), _dumps(spec), _dumps(prices), sweep_id, log_dir,
                ),
            )

    def phase_start(self, run_id: str, name: str, now: float | None = None) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO phases (run_id, name, started_at) VALUES (?,?,?)",
                (run_id, name, now or time.time()),
            )

    def phase_end(self, run_id: str, name: str, status: str = "ok", detail: str | None = None,
                  now: float | None = None) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE phases SET ended_at = ?, status = ?, detail = ? WHERE run_id = ? AND name = ?"
                " AND ended_at IS NULL",
                (now or time.time(), status, detail, run_id, name),
            )

    def record_node(self, run_id: str, node_rank: int, host: str | None, exit_code: int | None,
                    last_lines: list[str] | None = None) -> None:
        if last_lines:  # at most 64 KiB of last lines per node, long lines cut, whoever sends them
            from .launch import cap_last_lines

            last_lines = cap_last_lines(last_lines)
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO nodes (run_id, node_rank, host, exit_code, last_lines) VALUES (?,?,?,?,?)",
                (run_id, node_rank, host, exit_code, _dumps(last_lines)),
            )

    def add_metrics(self, run_id: str, records: list[tuple[int | None, dict[str, Any]]]) -> None:
        if not records:
            return
        with self._tx() as db:
            db.executemany(
                "INSERT INTO metrics (run_id, node_rank, kind, time, data) VALUES (?,?,?,?,?)",
                [(run_id, nr, r.get("kind", "?"), r.get("time"), _dumps(r)) for nr, r in records],
            )

    def resource_requested(self, run_id: str, kind: str, name: str, *, region: str | None = None,
                           detail: dict[str, Any] | None = None, now: float | None = None) -> int:
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO resources (run_id, kind, name, region, detail, requested_at) VALUES (?,?,?,?,?,?)",
                (run_id, kind, name, region, _dumps(detail), now or time.time()),
            )
            return int(cur.lastrowid)

    def resource_created(self, run_id: str, kind: str, name: str, cloud_id: str | None = None,
                         now: float | None = None) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE resources SET created_at = ?, cloud_id = COALESCE(?, cloud_id)"
                " WHERE run_id = ? AND kind = ? AND name = ? AND created_at IS NULL",
                (now or time.time(), cloud_id, run_id, kind, name),
            )

    def resource_deleted(self, run_id: str, kind: str, name: str, now: float | None = None) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE resources SET deleted_at = ?, confirmed_gone = 1"
                " WHERE run_id = ? AND kind = ? AND name = ? AND confirmed_gone = 0",
                (now or time.time(), run_id, kind, name),
            )

    def finish_run(self, run_id: str, *, status: str, exit_code: int, failure: str | None = None,
                   metrics: dict[str, Any] | None = None, teardown_verified: bool | None = None,
                   leftovers: list[dict[str, Any]] | None = None, now: float | None = None) -> None:
        if status not in RUN_STATES:
            raise ValueError(f"bad run status {status!r}")
        with self._tx() as db:
            db.execute(
                "UPDATE runs SET status = ?, exit_code = ?, failure = ?, metrics = COALESCE(?, metrics),"
                " teardown_verified = ?, leftovers = ?, ended_at = ? WHERE id = ?",
                (
                    status, exit_code, failure, _dumps(metrics),
                    None if teardown_verified is None else int(teardown_verified),
                    _dumps(leftovers or []), now or time.time(), run_id,
                ),
            )

    def set_teardown(self, run_id: str, verified: bool, leftovers: list[dict[str, Any]]) -> None:
        with self._tx() as db:
            db.execute("UPDATE runs SET teardown_verified = ?, leftovers = ? WHERE id = ?",
                       (int(verified), _dumps(leftovers), run_id))

    def set_cost(self, run_id: str, cost: dict[str, Any]) -> None:
        with self._tx() as db:
            db.execute("UPDATE runs SET cost = ? WHERE id = ?", (_dumps(cost), run_id))

    # -- reads -----------------------------------------------------------------------------
    @staticmethod
    def _run_dict(row: sqlite3.Row) -> dict[str, Any]:
        d = dict(row)
        for key in ("command", "spec", "prices", "metrics", "leftovers", "cost"):
            d[key] = _loads(d[key])
        if d["teardown_verified"] is not None:
            d["teardown_verified"] = bool(d["teardown_verified"])
        return d

    def get_run(self, run_id: str, *, with_metrics: bool = False) -> dict[str, Any] | None:
        row = self._db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            matches = self._db.execute(
                "SELECT * FROM runs WHERE id LIKE ? ORDER BY created_at DESC LIMIT 2", (run_id + "%",)
            ).fetchall()
            if len(matches) != 1:
                return None
            row = matches[0]
        run = self._run_dict(row)
        rid = run["id"]
        run["phases"] = [dict(r) for r in self._db.execute(
            "SELECT name, started_at, ended_at, status, detail FROM phases WHERE run_id = ? ORDER BY started_at", (rid,))]
        run["node_results"] = [
            {**dict(r), "last_lines": _loads(r["last_lines"])}
            for r in self._db.execute("SELECT node_rank, host, exit_code, last_lines FROM nodes WHERE run_id = ?"
                                      " ORDER BY node_rank", (rid,))
        ]
        run["resources"] = [
            {**dict(r), "detail": _loads(r["detail"]), "confirmed_gone": bool(r["confirmed_gone"])}
            for r in self._db.execute("SELECT * FROM resources WHERE run_id = ? ORDER BY id", (rid,))
        ]
        if with_metrics:
            run["metric_records"] = self.metrics(rid)
        return run

    def metrics(self, run_id: str, kind: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT node_rank, data FROM metrics WHERE run_id = ?"
        args: tuple = (run_id,)
        if kind:
            sql += " AND kind = ?"
            args += (kind,)
        out = []
        for r in self._db.execute(sql + " ORDER BY rowid", args):
            rec = json.loads(r["data"])
            rec.setdefault("node_rank", r["node_rank"])
            out.append(rec)
        return out

    def list_runs(self, *, limit: int | None = 50, cloud: str | None = None, since: float | None = None,
                  status: str | None = None, sweep_id: str | None = None) -> list[dict[str, Any]]:
        sql, args = "SELECT * FROM runs WHERE 1=1", []
        if cloud:
            sql += " AND cloud = ?"
            args.append(cloud)
        if since is not None:
            sql += " AND created_at >= ?"
            args.append(since)
        if status:
            sql += " AND status = ?"
            args.append(status)
        if sweep_id:
            sql += " AND sweep_id = ?"
            args.append(sweep_id)
        sql += " ORDER BY created_at DESC"
        if limit:
            sql += f" LIMIT {int(limit)}"
        return [self._run_dict(r) for r in self._db.execute(sql, args)]

    def open_resources(self, cluster: str | None = None) -> list[dict[str, Any]]:
        """Resources not confirmed gone (what `down`/`gc` must finish), newest run first."""
        sql = ("SELECT resources.*, runs.cluster AS cluster, runs.cloud AS cloud FROM resources"
               " JOIN runs ON runs.id = resources.run_id WHERE confirmed_gone = 0")
        args: list[Any] = []
        if cluster:
            sql += " AND runs.cluster = ?"
            args.append(cluster)
        return [{**dict(r), "detail": _loads(r["detail"])} for r in self._db.execute(sql + " ORDER BY id DESC", args)]
