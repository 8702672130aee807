"""The ledger: the durable truth of a sweep, one SQLite database (WAL mode) in its results directory.

Every experiment has numbered attempts; each attempt moves queued -> running -> one terminal state, and a
terminal state is final. Each transition is committed (and synced) before the runner acts on it, so whatever
instant the runner dies at, the ledger says what may be running and where: `resume` can finish from there.
One writer (the runner's dispatcher thread); any number of readers (`status`, `report`) at any time.
"""
from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from .errors import UserError
from .spec import Experiment

FILENAME = "ledger.sqlite"

QUEUED, RUNNING = "queued", "running"
SUCCEEDED, FAILED, TIMED_OUT, CANCELLED, INTERRUPTED = "succeeded", "failed", "timed_out", "cancelled", "interrupted"
TERMINAL = (SUCCEEDED, FAILED, TIMED_OUT, CANCELLED, INTERRUPTED)
STATES = (QUEUED, RUNNING, *TERMINAL)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS experiments (
    name TEXT PRIMARY KEY, position INTEGER NOT NULL, digest TEXT NOT NULL, spec TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS attempts (
    name TEXT NOT NULL REFERENCES experiments(name), attempt INTEGER NOT NULL, state TEXT NOT NULL,
    reason TEXT, detail TEXT, queued_at REAL NOT NULL, started_at REAL, finished_at REAL,
    slots TEXT, tag TEXT, pid INTEGER, launched_at REAL, port INTEGER, dir TEXT, exit_code INTEGER, metric REAL, metrics TEXT,
    PRIMARY KEY (name, attempt));
CREATE TABLE IF NOT EXISTS transitions (
    seq INTEGER PRIMARY KEY, name TEXT NOT NULL, attempt INTEGER NOT NULL, state TEXT NOT NULL,
    at REAL NOT NULL, slots TEXT, reason TEXT);
CREATE TABLE IF NOT EXISTS requests (seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, names TEXT NOT NULL,
    at REAL NOT NULL, handled INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS attempts_state ON attempts(state);
"""


class TransitionError(Exception):
    """A transition the state machine forbids (e.g. leaving a terminal state): a bug, not bad input."""


@dataclass(frozen=True)
class Attempt:
    """One attempt of one experiment as the ledger knows it."""

    name: str
    attempt: int
    state: str
    queued_at: float
    reason: str | None = None
    detail: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    slots: Mapping[str, list[int]] = field(default_factory=dict)
    tag: str | None = None
    pid: int | None = None
    launched_at: float | None = None
    port: int | None = None
    dir: str | None = None
    exit_code: int | None = None
    metric: float | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def duration(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | {
            "slots": dict(self.slots), "metrics": dict(self.metrics)}


def _row_to_attempt(row: sqlite3.Row) -> Attempt:
    data = dict(row)
    data["slots"] = json.loads(data["slots"]) if data["slots"] else {}
    data["metrics"] = json.loads(data["metrics"]) if data["metrics"] else {}
    return Attempt(**data)


class Ledger:
    """Typed access to one sweep's database. Not shared across threads: each thread opens its own."""

    def __init__(self, connection: sqlite3.Connection, path: Path):
        self._db = connection
        self.path = path
        self._batching = False

    # --- lifecycle -----------------------------------------------------------------------------------------
    @classmethod
    def create(cls, directory: Path, meta: Mapping[str, object], filename: str = FILENAME) -> "Ledger":
        path = Path(directory) / filename
        if path.exists():
            raise FileExistsError(path)
        ledger = cls._connect(path)
        with ledger._db:
            ledger._db.executescript(_SCHEMA)
            ledger._db.executemany("INSERT INTO meta VALUES (?, ?)",
                                   [(k, json.dumps(v)) for k, v in meta.items()])
        return ledger

    @classmethod
    def open(cls, directory: Path) -> "Ledger":
        path = Path(directory) / FILENAME
        if not path.exists():
            raise FileNotFoundError(path)
        return cls._connect(path, verify=True)

    @classmethod
    def _connect(cls, path: Path, verify: bool = False) -> "Ledger":
        """`verify`: the file must already be a ledger (a cheap read first, before anything is written to it);
        a corrupt or foreign file is a UserError, not sqlite3's traceback."""
        db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        try:
            if verify:
                db.execute("SELECT key, value FROM meta LIMIT 1").fetchall()
            db.execute("PRAGMA journal_mode=WAL")
        except sqlite3.DatabaseError as e:
            db.close()
            if not verify:
                raise
            raise UserError(f"not a sweep ledger ({e})", path) from None
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA synchronous=FULL")  # a commit is on disk before we act on it
        db.execute("PRAGMA busy_timeout=30000")
        db.isolation_level = "DEFERRED"
        return cls(db, path)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Group the transitions made inside into one transaction: one commit, one sync, all or nothing."""
        if self._batching:
            yield
            return
        self._batching = True
        try:
            with self._db:
                yield
        finally:
            self._batching = False

    def _transaction(self):
        return nullcontext() if self._batching else self._db

    # --- the sweep -----------------------------------------------------------------------------------------
    def meta(self) -> dict[str, object]:
        return {r["key"]: json.loads(r["value"]) for r in self._db.execute("SELECT key, value FROM meta")}

    def set_meta(self, key: str, value: object) -> None:
        with self._transaction():
            self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))

    def add_experiments(self, experiments: Sequence[Experiment], at: float) -> None:
        """Record new experiments, each with a first attempt queued, in one transaction."""
        start = self._db.execute("SELECT COALESCE(MAX(position) + 1, 0) FROM experiments").fetchone()[0]
        with self._transaction():
            self._db.executemany(
                "INSERT INTO experiments VALUES (?, ?, ?, ?)",
                [(e.name, start + i, e.digest, json.dumps(e.to_json(), sort_keys=True))
                 for i, e in enumerate(experiments)])
            self._insert_queued([(e.name, 1) for e in experiments], at)

    def experiments(self, names: Iterable[str] | None = None) -> list[Experiment]:
        """Every experiment in the sweep's order, or only those named (only their specs are decoded)."""
        rows = self._db.execute("SELECT name, spec FROM experiments ORDER BY position")
        wanted = None if names is None else set(names)
        return [Experiment.from_json(json.loads(r["spec"])) for r in rows if wanted is None or r["name"] in wanted]

    def digests(self) -> dict[str, str]:
        return {r["name"]: r["digest"] for r in self._db.execute("SELECT name, digest FROM experiments")}

    # --- transitions ---------------------------------------------------------------------------------------
    def requeue(self, names: Iterable[str], at: float) -> dict[str, int]:
        """A new attempt for each experiment whose latest attempt is terminal; returns name -> attempt."""
        latest = self.states()
        todo = []
        for name in names:
            attempt, state = latest[name]
            if state not in TERMINAL:
                raise TransitionError(f"{name} attempt {attempt} is still {state}")
            todo.append((name, attempt + 1))
        with self._transaction():
            self._insert_queued(todo, at)
        return dict(todo)

    def _insert_queued(self, todo: Sequence[tuple[str, int]], at: float) -> None:
        self._db.executemany("INSERT INTO attempts (name, attempt, state, queued_at) VALUES (?, ?, ?, ?)",
                             [(n, a, QUEUED, at) for n, a in todo])
        self._db.executemany("INSERT INTO transitions (name, attempt, state, at) VALUES (?, ?, ?, ?)",
                             [(n, a, QUEUED, at) for n, a in todo])

    def start(self, name: str, attempt: int, *, slots: Mapping[str, Sequence[int]], tag: str, dir: str,
              at: float) -> None:
        """queued -> running, committed before the process is started."""
        slots_json = json.dumps({h: list(ids) for h, ids in slots.items()})
        with self._transaction():
            self._move(name, attempt, (QUEUED,), RUNNING, at,
                       "started_at = ?, slots = ?, tag = ?, dir = ?", (at, slots_json, tag, dir),
                       slots_json, None)

    def launched(self, name: str, attempt: int, *, pid: int, port: int | None, at: float) -> None:
        """The process exists: its pid (its process group) and master port, for clean-up and the record."""
        with self._transaction():
            self._db.execute("UPDATE attempts SET pid = ?, port = ?, launched_at = ? WHERE name = ? AND attempt = ?",
                             (pid, port, at, name, attempt))

    def finish(self, name: str, attempt: int, state: str, at: float, *, reason: str | None = None,
               detail: str | None = None, exit_code: int | None = None, metric: float | None = None,
               metrics: Mapping[str, float] | None = None) -> None:
        """queued|running -> a terminal state (queued ones can be cancelled or interrupted unstarted)."""
        if state not in TERMINAL:
            raise TransitionError(f"{state} is not a terminal state")
        with self._transaction():
            self._move(name, attempt, (QUEUED, RUNNING), state, at,
                       "finished_at = ?, reason = ?, detail = ?, exit_code = ?, metric = ?, metrics = ?",
                       (at, reason, detail, exit_code, metric, json.dumps(dict(metrics)) if metrics else None),
                       None, reason)

    def _move(self, name: str, attempt: int, from_states: tuple[str, ...], to: str, at: float,
              assignments: str, values: tuple, slots: str | None, reason: str | None) -> None:
        marks = ",".join("?" * len(from_states))
        cursor = self._db.execute(
            f"UPDATE attempts SET state = ?, {assignments} WHERE name = ? AND attempt = ? AND state IN ({marks})",
            (to, *values, name, attempt, *from_states))
        if cursor.rowcount != 1:
            raise TransitionError(f"{name} attempt {attempt}: cannot move to {to} from {self._state(name, attempt)}")
        self._db.execute("INSERT INTO transitions (name, attempt, state, at, slots, reason) VALUES (?, ?, ?, ?, ?, ?)",
                         (name, attempt, to, at, slots, reason))

    def _state(self, name: str, attempt: int) -> str | None:
        row = self._db.execute("SELECT state FROM attempts WHERE name = ? AND attempt = ?", (name, attempt)).fetchone()
        return row["state"] if row else None

    # --- requests from other processes (`autotune cancel`) ----------------------------------------------------
    def request(self, kind: str, names: Sequence[str], at: float) -> None:
        with self._transaction():
            self._db.execute("INSERT INTO requests (kind, names, at) VALUES (?, ?, ?)", (kind, json.dumps(list(names)), at))

    def take_requests(self) -> list[tuple[str, list[str]]]:
        """Pending requests, oldest first, marked handled in the same transaction."""
        with self._transaction():
            rows = self._db.execute("SELECT seq, kind, names FROM requests WHERE handled = 0 ORDER BY seq").fetchall()
            if rows:  # only what was read: a request written since stays pending for the next call
                self._db.execute("UPDATE requests SET handled = 1 WHERE handled = 0 AND seq <= ?", (rows[-1]["seq"],))
        return [(r["kind"], json.loads(r["names"])) for r in rows]

    # --- reading -------------------------------------------------------------------------------------------
    def latest(self) -> list[Attempt]:
        """The latest attempt of every experiment, in the sweep's order."""
        rows = self._db.execute(
            "SELECT a.* FROM attempts a JOIN experiments e ON e.name = a.name "
            "WHERE a.attempt = (SELECT MAX(attempt) FROM attempts b WHERE b.name = a.name) ORDER BY e.position")
        return [_row_to_attempt(r) for r in rows]

    def states(self) -> dict[str, tuple[int, str]]:
        """name -> (number, state) of every experiment's latest attempt, in the sweep's order. Cheap: what
        `latest()` costs on a large sweep is building its Attempts, not the query."""
        rows = self._db.execute(
            "SELECT a.name, a.attempt, a.state FROM attempts a JOIN experiments e ON e.name = a.name "
            "WHERE a.attempt = (SELECT MAX(attempt) FROM attempts b WHERE b.name = a.name) ORDER BY e.position")
        return {name: (attempt, state) for name, attempt, state in rows}

    def attempts(self, name: str | None = None) -> list[Attempt]:
        query = "SELECT a.* FROM attempts a JOIN experiments e ON e.name = a.name"
        rows = self._db.execute(query + (" WHERE a.name = ?" if name else "") + " ORDER BY e.position, a.attempt",
                                (name,) if name else ())
        return [_row_to_attempt(r) for r in rows]

    def in_state(self, *states: str) -> list[Attempt]:
        marks = ",".join("?" * len(states))
        rows = self._db.execute(f"SELECT * FROM attempts WHERE state IN ({marks})", states)
        return [_row_to_attempt(r) for r in rows]

    def transitions(self) -> list[dict]:
        return [dict(r) for r in self._db.execute("SELECT * FROM transitions ORDER BY seq")]
