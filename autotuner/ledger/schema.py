"""The ledger's file format: its tables, the version stamped in SQLite's `user_version`, the migrations that bring
an older ledger to this version, and the checks that a file is a ledger this code reads (damage, a foreign file,
a newer version), each as one line naming the file.
"""
from __future__ import annotations

import functools
import sqlite3
from pathlib import Path

from ..errors import UserError

# PRAGMA user_version of the ledgers this code writes. 0: a ledger from before versions (it has version 1's
# tables), read as it is and migrated by the next runner.
SCHEMA_VERSION = 8

TABLES_SQL = """  -- version 1's tables: a new ledger gets them, then every migration (`schema`)
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS experiments (
    name TEXT PRIMARY KEY, position INTEGER NOT NULL, digest TEXT NOT NULL, spec TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS attempts (
    name TEXT NOT NULL REFERENCES experiments(name), attempt INTEGER NOT NULL, state TEXT NOT NULL,
    reason TEXT, detail TEXT, queued_at REAL NOT NULL, started_at REAL, finished_at REAL,
    slots TEXT, tag TEXT, pid INTEGER, launched_at REAL, port INTEGER, dir TEXT, exit_code INTEGER, metric REAL,
    metrics TEXT,
    PRIMARY KEY (name, attempt));
CREATE TABLE IF NOT EXISTS transitions (
    seq INTEGER PRIMARY KEY, name TEXT NOT NULL, attempt INTEGER NOT NULL, state TEXT NOT NULL,
    at REAL NOT NULL, slots TEXT, reason TEXT);
CREATE TABLE IF NOT EXISTS requests (seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, names TEXT NOT NULL,
    at REAL NOT NULL, handled INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS attempts_state ON attempts(state);
"""
TABLES = ("meta", "experiments", "attempts", "transitions", "requests", "swept", "leaves", "stops", "measures")

# 6 -> 7, kept apart so that it can be renumbered on its own.
MEASURES = ("CREATE TABLE measures (name TEXT NOT NULL, attempt INTEGER NOT NULL, startup REAL, step_time REAL, "
            "steps INTEGER NOT NULL, mean REAL, low REAL, high REAL, PRIMARY KEY (name, attempt))",)

# Before 8, each kind of cluster kept its record under its own meta key: (key, kind), in the order the registry
# asked them (a later one is the sweep's backend over an earlier one: a Ray record over a Slurm one over the SSH
# settings a hosts runner wrote). History only: the migration and the reader of an older ledger use it.
LEGACY_RECORDS = (("ssh", "hosts"), ("slurm", "slurm"), ("ray", "ray"))

# 7 -> 8: the backend's record one opaque meta row ({kind, data}: `meta.BackendRecord`), the legacy ones folded
# into it (the last wins, as the registry picked it); the attempt's Slurm step become the handle its backend alone
# reads (a Slurm step id is the same text). SQL alone: an SQLite without JSON functions migrates it too.
OPAQUE = (*(f"INSERT OR REPLACE INTO meta (key, value) SELECT 'backend', "
            f"'{{\"kind\": \"{kind}\", \"data\": ' || value || '}}' FROM meta WHERE key = '{key}' AND value LIKE '{{%'"
            for key, kind in LEGACY_RECORDS),
          "DELETE FROM meta WHERE key IN ({})".format(", ".join(f"'{key}'" for key, _ in LEGACY_RECORDS)),
          "ALTER TABLE attempts RENAME COLUMN step TO handle")

# An attempt's column by its older name, in the versions before its rename: (version renamed in, old, new).
RENAMED = ((8, "step", "handle"),)

# The statements that bring a ledger of version N to N + 1 (index N), run by the runner in the transaction
# that stamps the new version. 0 -> 1: version 0 already has version 1's tables; the stamp is the migration.
# 1 -> 2: a Slurm job step's id per attempt. 2 -> 3: the peak GPU memory an attempt held (peaks.py). 3 -> 4:
# each experiment's values of the swept keys, and (one row) the leaves they are kept by (swept.py). 4 -> 5: the
# experiments indexed by position, the order every read of the whole sweep is in (without it, SQLite sorted
# every row read: a fifth of a 100,000-experiment report's query). Older ledgers read the same, only slower.
# 5 -> 6: the stop asked for a running attempt (which one: cancelled, interrupted, timed out, its host lost),
# recorded before its signal, so that an attempt whose runner died during the stop is judged as that stop.
# 6 -> 7: what an attempt's steps said (spec/interval.py RunTimes): start-up and step time apart, the steps it made,
# the interval of the metric's mean; one row per attempt that left steps. 7 -> 8: OPAQUE.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (), ("ALTER TABLE attempts ADD COLUMN step TEXT",), ("ALTER TABLE attempts ADD COLUMN peak_memory INTEGER",),
    ("CREATE TABLE swept (position INTEGER PRIMARY KEY, name TEXT NOT NULL, params TEXT NOT NULL)",
     "CREATE TABLE leaves (one INTEGER PRIMARY KEY CHECK (one = 1), value TEXT NOT NULL)"),
    ("CREATE INDEX IF NOT EXISTS experiments_position ON experiments(position)",),
    ("CREATE TABLE stops (name TEXT NOT NULL, attempt INTEGER NOT NULL, state TEXT NOT NULL, reason TEXT NOT NULL, "
     "detail TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (name, attempt))",),
    MEASURES, OPAQUE)
assert len(MIGRATIONS) == SCHEMA_VERSION

# SQLite's primary result codes for a file that is not (or no longer) a database: SQLITE_CORRUPT,
# SQLITE_FORMAT, SQLITE_NOTADB. A full disk or a lock is something else, and is not reported as damage.
DAMAGE_CODES = (11, 24, 26)


def damaged(error: BaseException | None) -> bool:
    """sqlite3 saying the file is damaged or no database (as opposed to, say, a full disk)."""
    code = getattr(error, "sqlite_errorcode", None)
    return isinstance(error, sqlite3.DatabaseError) and code is not None and code & 0xFF in DAMAGE_CODES


def refusal(error: sqlite3.DatabaseError, path: Path) -> UserError:
    """What sqlite3 said while a ledger was opened and checked, as one line naming the file."""
    code = (getattr(error, "sqlite_errorcode", None) or 0) & 0xFF
    if code == 26:  # SQLITE_NOTADB
        return UserError(f"not a sweep ledger ({error})", path)
    if damaged(error):
        return UserError(f"corrupt sweep ledger: {error}", path)
    return UserError(f"cannot read the ledger: {error}", path)


def columns(db: sqlite3.Connection) -> dict[str, list[tuple]]:
    """The columns of each ledger table as PRAGMA table_info gives them (none: the table is missing)."""
    return {table: [tuple(c) for c in db.execute(f"PRAGMA table_info({table})")] for table in TABLES}


def schema(version: int = SCHEMA_VERSION) -> str:
    """The statements that make a ledger of `version`'s tables: version 1's, then the migrations after it."""
    return TABLES_SQL + "".join(f"{statement};\n" for step in MIGRATIONS[1:version] for statement in step)


@functools.cache
def expected_columns(version: int = SCHEMA_VERSION) -> dict[str, list[tuple]]:
    """The columns of `version`'s tables, from the schema itself (not a second copy to keep in step)."""
    db = sqlite3.connect(":memory:")
    try:
        db.executescript(schema(version))
        return columns(db)
    finally:
        db.close()


def short(name: str) -> str:
    return name if len(name) <= 40 else name[:37] + "..."


def table_problem(table: str, found: list[tuple], expected: list[tuple]) -> str | None:
    """How a table differs from what this version declares, in words; None when it does not."""
    if found == expected:
        return None
    if not found:
        return f"no table {table}"
    have, want = [c[1] for c in found], [c[1] for c in expected]
    missing = [c for c in want if c not in have]
    unknown = [c for c in have if c not in want]
    if not missing and not unknown:
        return f"the columns of table {table} are not declared as this version declares them"
    return f"table {table}: " + "; ".join(
        f"{label} column{'s' if len(names) > 1 else ''} {', '.join(map(short, names[:3]))}"
        f"{' ...' if len(names) > 3 else ''}" for label, names in (("no", missing), ("unknown", unknown)) if names)
