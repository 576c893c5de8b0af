"""The ledger's schema: its tables, created and moved forward by explicit, ordered migrations
(`PRAGMA user_version` = the last one applied), and the values its state columns take. The
`Ledger` (`gpucluster.ledger.store`) applies them and refuses a ledger from a newer gpucluster.
"""

from __future__ import annotations

import re
import sqlite3

from gpucluster.states import Phase, RunStatus, TeardownVerdict

PHASES = tuple(Phase)  # prepare, provision, ready, check, stage, setup, rendezvous, train, outputs, teardown
RUN_STATES = tuple(RunStatus)  # running, succeeded, failed, interrupted, stopped (at its --max-cost)

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
    (
        2,
        """
        ALTER TABLE runs ADD COLUMN teardown TEXT;    -- verified | leftovers | not verified | kept | NULL
        ALTER TABLE runs ADD COLUMN unchecked TEXT;   -- JSON list: each check that could not run, and why
        UPDATE runs SET teardown = CASE teardown_verified WHEN 1 THEN 'verified' WHEN 0 THEN 'leftovers' END
        """,
    ),
    (
        3,
        """
        CREATE TABLE outputs (              -- each node's output folder, copied back before teardown
            run_id TEXT NOT NULL REFERENCES runs(id),
            node_rank INTEGER NOT NULL,
            path TEXT,                      -- where it is on this machine
            files INTEGER,
            bytes INTEGER,
            seconds REAL,
            verdict TEXT NOT NULL,          -- complete | partial | failed
            detail TEXT,                    -- partial: what is missing, failed: why
            PRIMARY KEY (run_id, node_rank)
        )
        """,
    ),
    (
        4,
        """
        ALTER TABLE runs ADD COLUMN resumed_from TEXT;   -- run id whose outputs this run resumed (--resume)
        CREATE INDEX runs_resumed_from ON runs(resumed_from)
        """,
    ),
    (
        5,
        """
        ALTER TABLE outputs ADD COLUMN workdir_files INTEGER;  -- files the job wrote in its working folder
        ALTER TABLE outputs ADD COLUMN workdir_bytes INTEGER;  -- (copied to OUTPUT/workdir/node-N)
        """,
    ),
]
TEARDOWN_STATES = tuple(TeardownVerdict)  # verified, leftovers, not verified, kept
SCHEMA_VERSION = MIGRATIONS[-1][0]


def expected_tables() -> set[str]:
    """Every table the migrations create (a ledger missing one is damaged)."""
    return {m.group(1) for _, script in MIGRATIONS
            for m in re.finditer(r"CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", script, re.I)}


# JSON columns checked by `Ledger.check()` (table, key column, JSON columns).
JSON_COLUMNS = (
    ("runs", "id", ("command", "spec", "prices", "metrics", "leftovers", "cost", "unchecked")),
    ("nodes", "run_id", ("last_lines",)),
    ("resources", "run_id", ("detail",)),
)


def leave_wal(db: sqlite3.Connection) -> None:
    """A rollback journal, not WAL (issue 45 item 3): WAL's index `ledger.sqlite3-shm` is mapped
    into memory (https://www.sqlite.org/walformat.html), and once its pages cannot be backed (file
    system read-only or full, file truncated) the next access is SIGBUS: gpucluster dies mid-run,
    silent, no teardown. A rollback journal maps nothing; those faults become write errors, which
    callers survive. A WAL ledger (older gpucluster) is moved back when this connection is alone;
    while another holds it open SQLite says "locked" at once and this one stays in WAL."""
    if str(db.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
        try:
            db.execute("PRAGMA journal_mode = DELETE")
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc).lower() and "busy" not in str(exc).lower():
                raise
