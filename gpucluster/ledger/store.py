"""The run ledger: one SQLite file (0600, in a 0700 home) that says what every run did, what it
created, and whether that is confirmed gone.

A run row is written (in one transaction) before anything is started or created. Phases, node
exit codes, metrics and resources are appended as they happen, each in its own short transaction,
so a crash at any point leaves rows that say what may still exist; `gpucluster down` / `gc` read
them to finish the job.

Times are Unix seconds (float, UTC). The schema is versioned (`PRAGMA user_version`) and moved forward
by the ordered migrations in `gpucluster.ledger.schema`; a ledger from a newer gpucluster is refused."""

from __future__ import annotations

import functools
import inspect
import json
import os
import random
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

from gpucluster.ledger.chains import ResumeLinks
from gpucluster.home import home_dir, ledger_moved as _moved, private_file
from gpucluster.errors import ConfigError, UsageError
from gpucluster.ledger.schema import (JSON_COLUMNS, MIGRATIONS, RUN_STATES, SCHEMA_VERSION,
                                      TEARDOWN_STATES, expected_tables, leave_wal)
from gpucluster.ledger.records import (NodeRow, OutputRow, PhaseRow, ResourceRow, RunRecord, RunRow, SetupRecord,
                                StageRecord, StoredRun)
from gpucluster.states import JsonObject

OPEN_BUSY_S = 30.0  # how long opening the ledger keeps trying through busy answers


def _dumps(value: object) -> str | None:
    return None if value is None else json.dumps(value, default=str, sort_keys=True)


def _verified_column(teardown: str | None) -> int | None:
    """The v1 column kept for old readers: 1 only when verified, NULL when nothing was checked."""
    if teardown in (None, "kept"):
        return None
    return int(teardown == "verified")


def _loads(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError) as exc:
        raise _BadJSON(f"a row holds bad JSON ({exc}: {str(text)[:40]!r})") from None


class LedgerError(ConfigError):
    """The ledger file cannot be read or written (full disk, read-only, locked, damaged). Before a
    run's row exists this is bad input (exit 2); once it exists the lifecycle goes on without its
    record and ends with exit 3 (`gpucluster.lifecycle.steps`)."""


class _BadJSON(Exception):
    """A JSON column that does not parse: the ledger was edited or damaged outside gpucluster."""


def _damaged(path: Path, what: str) -> ConfigError:
    p = str(path)
    return LedgerError(f"ledger {p!r} is damaged: {what}; move it aside (mv {p} {p}.damaged) and gpucluster "
                       "starts a new, empty ledger, or restore it from a backup")


def _ledger_error(path: Path, exc: BaseException) -> ConfigError:
    """One-line error for a SQLite / JSON failure on the ledger at `path`."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, _BadJSON):
        return _damaged(path, text)
    low = text.lower()
    if "readonly" in low or "read-only" in low:
        return LedgerError(f"ledger {str(path)!r} is read-only ({text}); make it and its folder writable, "
                           "or set GPUCLUSTER_HOME to a writable directory")
    if "locked" in low or "busy" in low:
        return LedgerError(f"ledger {str(path)!r} is locked by another process for too long ({text}); try again")
    if "no such table" in low or "no such column" in low or "malformed" in low or "not a database" in low:
        return _damaged(path, text)
    return LedgerError(f"ledger {str(path)!r} cannot be used: {text}")


def _guard(method):
    """Turn SQLite/JSON failures inside a Ledger method into one-line ConfigErrors (exit 2)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            with self._lock:  # one connection, used by the main and the launcher's reader threads
                return method(self, *args, **kwargs)
        except (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError):
            raise  # the caller's mistake (e.g. a duplicate run id), not the file's
        except _BadJSON as exc:
            where = None
            try:
                where = self._find_bad_json(JSON_COLUMNS + (("metrics", "run_id", ("data",)),))
            except sqlite3.DatabaseError:
                pass
            raise (_damaged(self.path, where) if where else _ledger_error(self.path, exc)) from None
        except sqlite3.DatabaseError as exc:
            moved = _moved(self.path, self.identity, "command")  # SQLite: SQLITE_READONLY_DBMOVED
            raise (LedgerError(moved) if moved else _ledger_error(self.path, exc)) from None

    return wrapper


class Ledger:
    def __init__(self, path: Path | str):
        self.path = Path(path)
        # per connection, not per thread: else a reader thread's metric in the main thread's transaction
        self._lock = threading.RLock()
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # a new home: its owner's (home.py)
            self.identity = private_file(self.path)  # (device, inode): `home.ledger_moved` after a run
            self._open()
        except sqlite3.DatabaseError as exc:
            raise _ledger_error(self.path, exc) from None
        except OSError as exc:
            raise ConfigError(f"ledger {str(self.path)!r} cannot be created: {exc.strerror or exc}") from None

    def _open(self) -> None:
        """Connect, leave WAL for a rollback journal, migrate, check the tables; a busy answer is
        tried again (with jitter) for up to `OPEN_BUSY_S`. SQLite's busy timeout does not cover a
        WAL database (a ledger an older gpucluster made) whose last connection is closing: an opening
        connection "might get an SQLITE_BUSY error" at once (https://www.sqlite.org/wal.html,
        "Sometimes Queries Return SQLITE_BUSY In WAL Mode")."""
        end = time.monotonic() + OPEN_BUSY_S
        delay = 0.005
        while True:
            db = sqlite3.connect(str(self.path), timeout=30, isolation_level=None, check_same_thread=False)
            try:
                db.row_factory = sqlite3.Row
                self._db = db
                db.execute("PRAGMA foreign_keys = ON")
                leave_wal(db)
                self._migrate()
                self._check_tables()
                return
            except sqlite3.OperationalError as exc:
                db.close()
                low = str(exc).lower()
                if ("locked" not in low and "busy" not in low) or time.monotonic() >= end:
                    raise
            except BaseException:
                db.close()
                raise
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.25)

    @classmethod
    def open_default(cls) -> "Ledger":
        return cls(home_dir() / "ledger.sqlite3")

    def close(self) -> None:
        self._db.close()

    # -- schema ----------------------------------------------------------------------------
    def _migrate(self) -> None:
        """Apply the migrations this ledger lacks. Many gpucluster processes may open a new home at
        once: the version is read again inside an exclusive (BEGIN IMMEDIATE) transaction, so one
        process migrates and the others, once it commits, find nothing left to do."""
        if self._version_checked() == SCHEMA_VERSION:
            return
        with self._tx() as db:
            version = self._version_checked()
            for target, script in MIGRATIONS:
                if target <= version:
                    continue
                for statement in script.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {int(target)}")

    def _version_checked(self) -> int:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise ConfigError(
                f"ledger {str(self.path)!r} has schema version {version}, newer than this "
                f"gpucluster understands ({SCHEMA_VERSION}); upgrade gpucluster"
            )
        return version

    def _check_tables(self) -> None:
        present = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        missing = sorted(expected_tables() - present)
        if missing:
            raise _damaged(self.path, f"table {missing[0]!r} is missing" if len(missing) == 1
                           else f"tables {', '.join(repr(m) for m in missing)} are missing")

    def check(self) -> None:
        """Before a run starts: the ledger can be written and its rows parse (else a one-line ConfigError).

        A run must not begin on a ledger it cannot record into: the row would be missing, or stuck
        at "running" when a later write fails.
        """
        where = self._find_bad_json(JSON_COLUMNS)
        if where:
            raise _damaged(self.path, where)
        try:  # a real write (the schema version, unchanged), rolled back: nothing is kept
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(f"PRAGMA user_version = {int(self.schema_version)}")
            finally:
                self._db.execute("ROLLBACK")
        except sqlite3.OperationalError as exc:
            raise _ledger_error(self.path, exc) from None

    def _find_bad_json(self, tables) -> str | None:
        """'<table> row <key> holds bad JSON in column <col>' for the first such row, else None."""
        for table, key, columns in tables:
            # SQLite's json_valid() is strict RFC 8259 and so also flags NaN/Infinity, which Python's
            # json writes (a diverged loss): it only picks candidates; Python's parser decides.
            cond = " OR ".join(f"({c} IS NOT NULL AND NOT json_valid({c}))" for c in columns)
            for row in self._db.execute(f"SELECT {key}, {', '.join(columns)} FROM {table} WHERE {cond}"):
                for col in columns:
                    if row[col] is not None and not _valid_json(row[col]):
                        return f"{table} row {row[key]!r} holds bad JSON in column {col!r}"
        return None

    @property
    def schema_version(self) -> int:
        return self._db.execute("PRAGMA user_version").fetchone()[0]

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:  # a Ctrl-C may land anywhere in here, even just after BEGIN
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    # -- writes ----------------------------------------------------------------------------
    def create_run(self, run_id: str, *, cloud: str, cluster: str, nodes: int, gpus_per_node: int | None,
                   command: list[str], spec: JsonObject, workload: str | None = None,
                   prices: JsonObject | None = None, sweep_id: str | None = None, log_dir: str | None = None,
                   resumed_from: str | None = None, now: float | None = None) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO runs (id, created_at, status, cloud, cluster, nodes, gpus_per_node, workload,"
                " command, spec, prices, sweep_id, log_dir, resumed_from) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (run_id, now or time.time(), "running", cloud, cluster, nodes, gpus_per_node, workload,
                 _dumps(command), _dumps(spec), _dumps(prices), sweep_id, log_dir, resumed_from),
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
            from gpucluster.ledger.node_output import cap_last_lines

            last_lines = cap_last_lines(last_lines)
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO nodes (run_id, node_rank, host, exit_code, last_lines) VALUES (?,?,?,?,?)",
                (run_id, node_rank, host, exit_code, _dumps(last_lines)),
            )

    def record_outputs(self, run_id: str, outputs: list[JsonObject]) -> None:
        """Each node's copied-back outputs: path, files, bytes, seconds, verdict, detail."""
        with self._tx() as db:
            db.executemany(
                "INSERT OR REPLACE INTO outputs (run_id, node_rank, path, files, bytes, seconds, verdict, detail,"
                " workdir_files, workdir_bytes) VALUES (?,?,?,?,?,?,?,?,?,?)",
                [(run_id, o["node_rank"], o.get("path"), o.get("files"), o.get("bytes"), o.get("seconds"),
                  o["verdict"], o.get("detail"), o.get("workdir_files") or 0, o.get("workdir_bytes") or 0)
                 for o in outputs],
            )

    def add_metrics(self, run_id: str, records: list[tuple[int | None, JsonObject]],
                    busy_s: float | None = None) -> None:
        """`busy_s`: wait at most this long for a lock another process holds (default: 30 s, as every write)."""
        if not records:
            return
        with self._lock:
            if busy_s is not None:
                self._db.execute(f"PRAGMA busy_timeout = {int(busy_s * 1000)}")
            try:
                with self._tx() as db:
                    db.executemany("INSERT INTO metrics (run_id, node_rank, kind, time, data) VALUES (?,?,?,?,?)",
                                   [(run_id, nr, r.get("kind", "?"), r.get("time"), _dumps(r)) for nr, r in records])
            finally:
                if busy_s is not None:
                    self._db.execute("PRAGMA busy_timeout = 30000")

    def resource_requested(self, run_id: str, kind: str, name: str, *, region: str | None = None,
                           detail: JsonObject | None = None, now: float | None = None) -> int:
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO resources (run_id, kind, name, region, detail, requested_at) VALUES (?,?,?,?,?,?)",
                (run_id, kind, name, region, _dumps(detail), now or time.time()),
            )
            rowid = cur.lastrowid
            assert rowid is not None  # an INSERT sets it
            return rowid

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
                   metrics: JsonObject | None = None, teardown: str | None = None,
                   leftovers: list[JsonObject] | None = None, unchecked: list[str] | None = None,
                   now: float | None = None) -> None:
        """Close a run. `teardown`: the three-state verdict ("verified", "leftovers", "not verified"),
        "kept" for a cluster left up on purpose, or None when nothing was checked."""
        if status not in RUN_STATES:
            raise ValueError(f"bad run status {status!r}")
        self._check_teardown(teardown)
        with self._tx() as db:
            db.execute(
                "UPDATE runs SET status = ?, exit_code = ?, failure = ?, metrics = COALESCE(?, metrics),"
                " teardown = ?, teardown_verified = ?, leftovers = ?, unchecked = ?, ended_at = ? WHERE id = ?",
                (
                    status, exit_code, failure, _dumps(metrics), teardown, _verified_column(teardown),
                    _dumps(leftovers or []), _dumps(unchecked or []), now or time.time(), run_id,
                ),
            )

    def set_teardown(self, run_id: str, teardown: str, leftovers: list[JsonObject],
                     unchecked: list[str] | None = None) -> None:
        self._check_teardown(teardown)
        with self._tx() as db:
            db.execute("UPDATE runs SET teardown = ?, teardown_verified = ?, leftovers = ?, unchecked = ? WHERE id = ?",
                       (teardown, _verified_column(teardown), _dumps(leftovers), _dumps(unchecked or []), run_id))

    @staticmethod
    def _check_teardown(teardown: str | None) -> None:
        if teardown is not None and teardown not in TEARDOWN_STATES:
            raise ValueError(f"bad teardown verdict {teardown!r}")

    def set_cost(self, run_id: str, cost: JsonObject) -> None:
        with self._tx() as db:
            db.execute("UPDATE runs SET cost = ? WHERE id = ?", (_dumps(cost), run_id))

    # -- reads -----------------------------------------------------------------------------
    @staticmethod
    def _run_dict(row: sqlite3.Row) -> JsonObject:
        d = dict(row)
        for key in ("command", "spec", "prices", "metrics", "leftovers", "cost", "unchecked"):
            d[key] = _loads(d[key])
        d["unchecked"] = d["unchecked"] or []
        if d["teardown_verified"] is not None:
            d["teardown_verified"] = bool(d["teardown_verified"])
        return d

    def get_run(self, run_id: str, *, with_metrics: bool = False, links: Mapping[str, tuple] | None = None) -> RunRecord | None:
        """The run `run_id` (or the one run whose id starts with it), typed; None when none has it."""
        if not run_id or not run_id.strip():
            raise UsageError(f"run id {run_id!r} is empty; give a run id or a unique prefix of one "
                             "(list them with 'gpucluster runs')")
        row = self._db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None and run_id:
            # A unique prefix of an id, matched literally (no LIKE: '%' and '_' are plain characters).
            matches = self._db.execute(
                "SELECT * FROM runs WHERE substr(id, 1, length(?)) = ? ORDER BY created_at DESC LIMIT 6",
                (run_id, run_id),
            ).fetchall()
            if len(matches) > 1:
                shown = ", ".join(m["id"] for m in matches[:5]) + (", ..." if len(matches) > 5 else "")
                raise UsageError(f"run id prefix {run_id!r} is ambiguous: it matches {shown}; "
                                 "give more of the id")
            if not matches:
                return None
            row = matches[0]
        run = RunRow.from_dict(self._run_dict(row))
        rid: str = row["id"]  # the runs table's key (run.id is None only for an estimate's imagined run)
        phases = [PhaseRow(**dict(r)) for r in self._db.execute(
            "SELECT name, started_at, ended_at, status, detail FROM phases WHERE run_id = ? ORDER BY started_at", (rid,))]
        nodes = [NodeRow(**{**dict(r), "last_lines": _loads(r["last_lines"])})
                 for r in self._db.execute("SELECT node_rank, host, exit_code, last_lines FROM nodes WHERE run_id = ?"
                                           " ORDER BY node_rank", (rid,))]
        outputs = [OutputRow(**dict(r)) for r in self._db.execute(
            "SELECT node_rank, path, files, bytes, seconds, verdict, detail, workdir_files, workdir_bytes"
            " FROM outputs WHERE run_id = ?"
            " ORDER BY node_rank", (rid,))]
        resources = [ResourceRow.from_dict({**dict(r), "detail": _loads(r["detail"]),
                                            "confirmed_gone": bool(r["confirmed_gone"])})
                     for r in self._db.execute("SELECT * FROM resources WHERE run_id = ? ORDER BY id", (rid,))]
        # --resume: the runs this one continues and its chain (gpucluster.ledger.chains); `links`: resume_links() read once
        from gpucluster.ledger.chains import ancestors, members

        links = self.resume_links() if links is None else links
        return RunRecord(
            run=run, phases=phases, nodes=nodes, outputs=outputs, resources=resources,
            resumed_chain=ancestors(rid, links), chain=members(rid, links) if rid in links else [rid],
            # --data and --setup per node (metric records the launchers wrote): `show` and --json read them
            staging=[StageRecord.from_dict(r) for r in self.metrics(rid, "stage")],
            setup=[SetupRecord.from_dict(r) for r in self.metrics(rid, "setup_end")],
            resume_files=self.metrics(rid, "resume_files"),  # --resume: files laid back, from which node
            metric_records=self.metrics(rid) if with_metrics else None,
        )

    def metrics(self, run_id: str, kind: str | None = None) -> list[JsonObject]:
        sql = "SELECT node_rank, data FROM metrics WHERE run_id = ?"
        args: tuple = (run_id,)
        if kind:
            sql += " AND kind = ?"
            args += (kind,)
        out = []
        for r in self._db.execute(sql + " ORDER BY rowid", args):
            rec = _loads(r["data"])
            rec.setdefault("node_rank", r["node_rank"])
            out.append(rec)
        return out

    def list_runs(self, *, limit: int | None = 50, cloud: str | None = None, since: float | None = None,
                  status: str | None = None, sweep_id: str | None = None, billed_since: float | None = None) -> list[StoredRun]:
        sql = "SELECT * FROM runs WHERE 1=1"
        args: list[Any] = []
        if billed_since is not None:  # started since, or one of its resources billed after it (costing/periods.py)
            sql += (" AND (created_at >= ? OR id IN (SELECT run_id FROM resources WHERE confirmed_gone = 0"
                    " OR deleted_at IS NULL OR deleted_at > ?))")
            args += [billed_since, billed_since]
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
        return [StoredRun.from_dict(self._run_dict(r)) for r in self._db.execute(sql, args)]

    def resume_links(self) -> ResumeLinks:
        """run id -> (resumed_from, created_at) of every run in a chain (indexed once: `ResumeLinks`)."""
        rows = self._db.execute(
            "SELECT id, resumed_from, created_at FROM runs WHERE resumed_from IS NOT NULL"
            " OR id IN (SELECT resumed_from FROM runs WHERE resumed_from IS NOT NULL)")
        return ResumeLinks({r["id"]: (r["resumed_from"], r["created_at"]) for r in rows})

    def open_resources(self, cluster: str | None = None) -> list[JsonObject]:
        """Resources not confirmed gone (what `down`/`gc` must finish), newest run first."""
        sql = ("SELECT resources.*, runs.cluster AS cluster, runs.cloud AS cloud FROM resources"
               " JOIN runs ON runs.id = resources.run_id WHERE confirmed_gone = 0")
        args: list[Any] = []
        if cluster:
            sql += " AND runs.cluster = ?"
            args.append(cluster)
        return [{**dict(r), "detail": _loads(r["detail"])} for r in self._db.execute(sql + " ORDER BY id DESC", args)]


def _valid_json(text: object) -> bool:
    if not isinstance(text, (str, bytes, bytearray)):  # an SQLite INTEGER or REAL: json.loads refuses it
        return False
    try:
        json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return False
    return True


# Every public method (reads and writes, present and future) reports SQLite/JSON trouble as one line.
for _name, _fn in list(vars(Ledger).items()):
    if not _name.startswith("_") and inspect.isfunction(_fn):
        setattr(Ledger, _name, _guard(_fn))
del _name, _fn
