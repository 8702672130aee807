"""The ledger: the durable truth of a sweep, one SQLite database (WAL mode) in its results directory.

Every experiment has numbered attempts; each attempt moves queued -> running -> one terminal state, and a
terminal state is final. Each transition is committed (and synced) before the runner acts on it, so whatever
instant the runner dies at, the ledger says what may be running and where: `resume` can finish from there.
One writer (the runner: its dispatcher thread once the sweep runs); any number of readers (`status`,
`report`, other processes) at any time, each with its own connection.

The file carries its schema version in SQLite's `user_version`. Opening checks the version and the tables
once, so a file that is not what this code expects (damaged, foreign, from a newer autotuner) is one clear
error naming it, never a traceback from deep inside a query.
"""
from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

from ..errors import UserError
from ..jsonvalues import JSON, JSONObject
from ..spec import Experiment
from ..spec.interval import Interval, RunTimes, batches_of
from ..states import Reason, State
from . import checks, kept, spent
from .attempt import STATES, Attempt
from .meta import SweepMeta
from .rows import attempt_columns, decode_attempts, json_object, json_value, odd_peak, stop_words, unreadable
from .schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    columns,
    damaged,
    expected_columns,
    refusal,
    schema,
    short,
    table_problem,
)

__all__ = ["FILENAME", "SCHEMA_VERSION", "Attempt", "Ledger", "SweepMeta", "TransitionError", "open_sweep"]

FILENAME = "ledger.sqlite"

# The most names one query reads by (SQLite bounds a statement's parameters): more take several queries.
_FEW = 500
# The latest attempt of each experiment (the attempts `a`, beside its experiment `e`).
_LATEST = "FROM attempts a JOIN experiments e ON e.name = a.name " \
          "WHERE a.attempt = (SELECT MAX(attempt) FROM attempts b WHERE b.name = a.name)"


class TransitionError(Exception):
    """A transition the state machine forbids (e.g. leaving a terminal state): a bug, not bad input."""


class Ledger:
    """Typed access to one sweep's database through one connection, used by one thread at a time: the runner
    hands its ledger from the main thread to the dispatcher's and back, never to two at once."""

    def __init__(self, connection: sqlite3.Connection, path: Path):
        self._db = connection
        self.path = path
        self._batching = False

    # --- lifecycle -----------------------------------------------------------------------------------------
    @classmethod
    def create(cls, directory: Path, meta: SweepMeta, filename: str = FILENAME) -> Ledger:
        path = Path(directory) / filename
        if path.exists():
            raise FileExistsError(path)
        ledger = cls._connect(path)
        with ledger._db:
            ledger._db.executescript(schema() + f"PRAGMA user_version = {SCHEMA_VERSION};")
            ledger._db.executemany("INSERT INTO meta VALUES (?, ?)",
                                   [(k, json.dumps(v)) for k, v in meta.to_json().items()])
        return ledger

    @classmethod
    def open(cls, directory: Path) -> Ledger:
        """A ledger to read, checked first; it is left as it is (only the runner's `upgrade` writes a version)."""
        path = Path(directory) / FILENAME
        if not path.exists():
            raise FileNotFoundError(path)
        if not path.is_file():  # a directory, a FIFO, a device: sqlite3 would fail, block or read forever
            raise UserError(f"not a sweep ledger ({'a directory' if path.is_dir() else 'not a regular file'})", path)
        ledger = None
        try:
            ledger = cls._connect(path, verify=True)
            ledger._check()
            return ledger
        except BaseException as e:
            if ledger is not None:
                ledger.close()
            if isinstance(e, sqlite3.DatabaseError):
                raise refusal(e, path) from None
            raise

    @classmethod
    def _connect(cls, path: Path, verify: bool = False) -> Ledger:
        """`verify`: the file must already be a database (a cheap read first, before anything is written to it).
        Only a new ledger is put in WAL mode here: a reader writes nothing, and the runner's `upgrade` does."""
        db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        try:
            if verify:
                db.execute("PRAGMA user_version").fetchone()
            else:
                db.execute("PRAGMA journal_mode=WAL")
        except BaseException:
            db.close()
            raise
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA synchronous=FULL")  # a commit is on disk before we act on it
        db.execute("PRAGMA busy_timeout=30000")
        db.isolation_level = "DEFERRED"
        return cls(db, path)

    def version(self) -> int:
        return self._db.execute("PRAGMA user_version").fetchone()[0]

    def _check(self) -> None:
        """A version this code reads, with that version's tables and columns (checked here once, rather than a
        guard around every query), and the meta every command relies on."""
        version = self.version()
        if version > SCHEMA_VERSION:
            raise UserError(f"written by a newer autotuner (ledger schema {version}; this one reads up to "
                            f"{SCHEMA_VERSION}): upgrade autotuner", self.path)
        if version < 0:
            raise self._corrupt(f"schema version {version}")
        found = columns(self._db)
        if version == 0 and not any(found.values()):
            raise UserError("not a sweep ledger (it has none of a ledger's tables)", self.path)
        for table, expected in expected_columns(max(1, version)).items():  # version 0's tables are version 1's
            problem = table_problem(table, found[table], expected)
            if problem:
                raise self._corrupt(problem)
        problem = SweepMeta.problem(self._meta_json())
        if problem:
            raise self._corrupt(problem)

    def check_whole(self) -> None:
        """Every page and every JSON value read: what a writer (the runner, `cancel`) does before it writes or
        takes the sweep, so a damaged ledger is refused with nothing changed (checks.py). A reader finds damage
        where it reads, and says so then."""
        try:
            checks.pages(self._db, self._corrupt)
            checks.json_columns(self._db, self.version(), self._corrupt)
            self.peaks()  # a peak_memory we did not write (text, a real) is refused as reading it would be
            checks.rows(self._db, self._corrupt)
            checks.words(self._db, self.version(), self._corrupt)
        except sqlite3.DatabaseError as e:
            if damaged(e):
                raise self._corrupt(str(e)) from None
            raise

    def upgrade(self) -> None:
        """An older ledger migrated to this version in one transaction, and WAL mode: by the runner, the one
        writer, holding the sweep's lock. Readers never call it: they read an older version as it is."""
        self._db.execute("PRAGMA journal_mode=WAL")
        if self.version() == SCHEMA_VERSION:
            if not kept.in_place(self._db):  # a hand edit: not extended (a row in the way fails an add)
                with self._db:
                    self._db.execute("BEGIN IMMEDIATE")
                    self._keep_swept_anew()
            return
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            for step in MIGRATIONS[self.version():]:
                for statement in step:
                    try:
                        self._db.execute(statement)
                    except sqlite3.OperationalError as e:  # a hand edit in its way (a table by an index's name)
                        raise self._corrupt(f"cannot be brought to version {SCHEMA_VERSION} ({e})") from None
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            if not kept.in_place(self._db):  # a ledger from before version 4 (or one another writer left without)
                self._keep_swept_anew()

    def _corrupt(self, detail: str) -> UserError:
        return UserError(f"corrupt sweep ledger: {detail}", self.path)

    def _json(self, text: str, where: str, kind: type = object) -> JSON:
        """A JSON value the ledger holds. One that does not decode (or is not a `kind`) was not written by us."""
        return json_value(text, where, self._corrupt, kind)

    def _rows(self, query: str, parameters: Sequence[object] = ()) -> list[Attempt]:
        """The attempts a query selects (`query` from its FROM on; `a` names the attempts table), fetched whole
        before they are decoded: a cursor left open by a decoding error kept the connection (and its -wal and
        -shm files) alive after close(). Plain tuples of Attempt's fields in order (`attempt_columns`, of the version
        now: the runner's migration adds columns)."""
        cursor = self._db.cursor()
        cursor.row_factory = None
        rows = cursor.execute(f"SELECT {attempt_columns(self.version())} {query}", parameters).fetchall()
        return decode_attempts(rows, self._corrupt) if rows else []

    def _experiment(self, spec: str) -> Experiment:
        data = json_object(spec, "experiments.spec", self._corrupt)
        try:
            return Experiment.from_json(data)
        except (KeyError, TypeError, ValueError, RecursionError):  # RecursionError: nested too deep to copy
            raise self._corrupt("experiments.spec lacks what an experiment needs") from None

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, kind: object, error: BaseException | None, traceback: object) -> None:
        """The one place where damage found mid-read (pages a query reaches, not the ones checked at open)
        becomes the same one-line error as damage found at open."""
        self.close()
        if damaged(error):
            raise self._corrupt(str(error)) from None

    @contextmanager
    def batch(self, synced: bool = True) -> Iterator[None]:
        """Group the transitions made inside into one transaction: one commit, one sync, all or nothing.
        `synced=False`: committed without waiting for the disk (synchronous=NORMAL, WAL): a crash of the runner
        loses none of it, the next synced commit makes it durable, and only a power loss before that could
        drop it. For what no action waits on: a launch's pid and port (after a power loss, nothing it names runs)."""
        if self._batching:
            yield
            return
        self._batching = True
        if not synced:
            self._db.execute("PRAGMA synchronous=NORMAL")
        try:
            with self._db:
                yield
        finally:
            self._batching = False
            if not synced:
                self._db.execute("PRAGMA synchronous=FULL")  # a commit is on disk before we act on it

    def _transaction(self) -> AbstractContextManager[object]:
        return nullcontext() if self._batching else self._db

    # --- the sweep -----------------------------------------------------------------------------------------
    def meta(self) -> SweepMeta:
        """The sweep's settings (checked when the ledger was opened)."""
        data = self._meta_json()
        problem = SweepMeta.problem(data)
        if problem:
            raise self._corrupt(problem)
        return SweepMeta.from_json(data)

    def _meta_json(self) -> JSONObject:
        return {r["key"]: self._json(r["value"], f"meta {short(str(r['key']))!r}")
                for r in self._db.execute("SELECT key, value FROM meta").fetchall()}

    def set_meta(self, key: str, value: object) -> None:
        """One setting changed (e.g. `backend`, by the runner that records its cluster)."""
        with self._transaction():
            self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))

    def add_experiments(self, experiments: Sequence[Experiment], at: float) -> None:
        """Record new experiments, each with a first attempt queued, and the swept keys' values kept up to date
        (`kept.keep`), in one transaction."""
        start = self._db.execute("SELECT COALESCE(MAX(position) + 1, 0) FROM experiments").fetchone()[0]
        specs = [json.dumps(e.to_json(), sort_keys=True) for e in experiments]
        with self._transaction():
            self._db.executemany("INSERT INTO experiments VALUES (?, ?, ?, ?)",
                                 [(e.name, start + i, e.digest, spec) for i, (e, spec) in enumerate(zip(
                                     experiments, specs, strict=True))])
            self._insert_queued([(e.name, 1) for e in experiments], at)
            kept.keep(self._db, start, [json.loads(spec) for spec in specs], self.specs)

    # --- the swept keys (kept.py) ----------------------------------------------------------------------------
    def _keep_swept_anew(self) -> None:
        kept.keep_anew(self._db, self.specs())

    def swept_values(self) -> kept.Kept | None:
        """The swept keys and each experiment's values of them, as kept since its experiments were added
        (`kept.read`); None where they are not kept whole."""
        return kept.read(self._db, self.version(), self._corrupt)

    def experiments(self, names: Iterable[str] | None = None) -> list[Experiment]:
        """Every experiment in the sweep's order, or only those named (only their rows are read and decoded)."""
        if names is None:
            rows = self._db.execute("SELECT position, spec FROM experiments ORDER BY position").fetchall()
        else:
            rows = sorted(self._by_name("SELECT position, spec FROM experiments WHERE name IN ({})", names))
        return [self._experiment(spec) for _, spec in rows]

    def _by_name(self, query: str, names: Iterable[str]) -> list[tuple[object, ...]]:
        """The rows of `query` (its `{}` the names' marks) for the names, _FEW at a time (SQLite bounds a
        statement's parameters): as many index look-ups as names, however large the sweep."""
        wanted, rows = sorted(set(names)), []
        for i in range(0, len(wanted), _FEW):
            chunk = wanted[i:i + _FEW]
            rows += [tuple(r) for r in self._db.execute(query.format(",".join("?" * len(chunk))), chunk)]
        return rows

    def specs(self) -> list[JSONObject]:
        """Every experiment's recorded spec as JSON data, in the sweep's order, without building `Experiment`s
        (a report of 10,000 needs only their configs; building and checking each took most of its time)."""
        rows = self._db.execute("SELECT spec FROM experiments ORDER BY position").fetchall()
        return [json_object(spec, "experiments.spec", self._corrupt) for (spec,) in rows]

    def digests(self) -> dict[str, str]:
        return {r["name"]: r["digest"] for r in self._db.execute("SELECT name, digest FROM experiments")}

    # --- transitions ---------------------------------------------------------------------------------------
    def requeue(self, names: Iterable[str], at: float) -> dict[str, int]:
        """A new attempt for each experiment whose latest attempt is terminal; returns name -> attempt."""
        names = list(names)
        latest = self.states(names)
        todo = []
        for name in names:
            attempt, state = latest[name]
            if not state.terminal:
                raise TransitionError(f"{name} attempt {attempt} is still {state}")
            todo.append((name, attempt + 1))
        with self._transaction():
            self._insert_queued(todo, at)
        return dict(todo)

    def _insert_queued(self, todo: Sequence[tuple[str, int]], at: float) -> None:
        self._db.executemany("INSERT INTO attempts (name, attempt, state, queued_at) VALUES (?, ?, ?, ?)",
                             [(n, a, State.QUEUED, at) for n, a in todo])
        self._db.executemany("INSERT INTO transitions (name, attempt, state, at) VALUES (?, ?, ?, ?)",
                             [(n, a, State.QUEUED, at) for n, a in todo])

    def start(self, name: str, attempt: int, *, slots: Mapping[str, Sequence[int]], tag: str, dir: str,
              at: float) -> None:
        """queued -> running, committed before the process is started."""
        slots_json = json.dumps({h: list(ids) for h, ids in slots.items()})
        with self._transaction():
            self._move(name, attempt, (State.QUEUED,), State.RUNNING, at,
                       "started_at = ?, slots = ?, tag = ?, dir = ?", (at, slots_json, tag, dir),
                       slots_json, None)

    def launched(self, name: str, attempt: int, *, pid: int, port: int | None, at: float,
                 handle: str | None = None) -> None:
        """The process exists: its pid (its process group), master port and its backend's handle, for clean-up
        and the record."""
        with self._transaction():
            self._db.execute("UPDATE attempts SET pid = ?, port = ?, launched_at = ?, handle = ? "
                             "WHERE name = ? AND attempt = ?", (pid, port, at, handle, name, attempt))

    def finish(self, name: str, attempt: int, state: State, at: float, *, reason: Reason | None = None,
               detail: str | None = None, exit_code: int | None = None, metric: float | None = None,
               metrics: Mapping[str, float] | None = None, peak_memory: int | None = None) -> None:
        """queued|running -> a terminal state (queued ones can be cancelled or interrupted unstarted);
        `peak_memory`: the most the attempt held on one GPU, where it was measured (peaks.py)."""
        if not state.terminal:
            raise TransitionError(f"{state} is not a terminal state")
        odd = unreadable(reason, metric, metrics)
        if odd is not None:  # written, it would make every reader refuse the ledger as corrupt
            raise ValueError(f"{name} attempt {attempt}: {odd}")
        with self._transaction():
            self._move(name, attempt, (State.QUEUED, State.RUNNING), state, at,
                       "finished_at = ?, reason = ?, detail = ?, exit_code = ?, metric = ?, metrics = ?, "
                       "peak_memory = ?",
                       (at, reason, detail, exit_code, metric, json.dumps(dict(metrics)) if metrics else None,
                        peak_memory),
                       None, reason)

    def _move(self, name: str, attempt: int, from_states: tuple[State, ...], to: State, at: float,
              assignments: str, values: tuple[object, ...], slots: str | None, reason: Reason | None) -> None:
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
        return str(row["state"]) if row else None

    def stopping(self, name: str, attempt: int, state: State, reason: Reason, detail: str, at: float) -> None:
        """A stop asked for a running attempt, committed before its signal is sent; the first one asked is kept
        (a timer that fires after a cancel does not make it a timeout)."""
        with self._transaction():
            self._db.execute("INSERT OR IGNORE INTO stops VALUES (?, ?, ?, ?, ?, ?)",
                             (name, attempt, state, reason, detail, at))

    def measured(self, name: str, attempt: int, timing: RunTimes) -> None:
        """What the attempt's steps said (schema 7's `measures`), in the transaction that records its end."""
        found = timing.interval
        numbers = (timing.startup, timing.step_seconds, *((found.mean, found.low, found.high) if found else [None] * 3))
        kept = [v if v is not None and math.isfinite(v) else None for v in numbers]  # NULL: unknown, or no bound
        with self._transaction():
            self._db.execute("INSERT OR REPLACE INTO measures VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                             (name, attempt, kept[0], kept[1], timing.steps, *kept[2:]))

    def measures(self) -> dict[tuple[str, int], RunTimes]:
        """(name, attempt) -> what its steps said, of every attempt that left steps; none before schema 7."""
        if self.version() < 7:
            return {}
        found: dict[tuple[str, int], RunTimes] = {}
        for name, attempt, startup, step, steps, mean, low, high in self._db.execute("SELECT * FROM measures"):
            interval = None if mean is None or low is None else \
                Interval(mean, low, math.inf if high is None else high, steps, batches_of(steps))  # NULL high: none
            found[(name, attempt)] = RunTimes(startup, step, steps, interval)
        return found

    def slot_seconds(self, until: float | None = None) -> tuple[float, float]:
        """Slot-seconds every ended attempt held (spent.py), in all and up to `until` (0 when None): GPU-seconds."""
        found = spent.total(self._db, until)
        return found.seconds, found.until

    def spent_by_name(self, until: float | None = None, reason: str | None = None,
             names: Sequence[str] | None = None) -> dict[str, spent.Spent]:
        """name -> the slot-seconds its ended attempts held (spent.py: in all, up to `until`, with `reason`)."""
        return spent.by_name(self._db, until, reason, names)

    def spent_in_all(self, until: float | None = None, reason: str | None = None) -> spent.Spent:
        """What every ended attempt held (spent.py), summed."""
        return spent.total(self._db, until, reason)

    def early_stops(self) -> list[spent.EarlyStop]:
        """The ended attempts stopping ended early, with their steps (spent.py); none before schema 7."""
        return spent.early_stops(self._db) if self.version() >= 7 else []

    def stops_asked(self) -> dict[tuple[str, int], tuple[State, str, Reason]]:
        """(name, attempt) -> (state, detail, reason) of the stop asked for each attempt still running: what a
        runner that adopts it, or `cancel` with none alive, judges its end by. None before schema 6."""
        if self.version() < 6:
            return {}
        rows = self._db.execute("SELECT s.name, s.attempt, s.state, s.detail, s.reason FROM stops s JOIN attempts a "
                                "ON a.name = s.name AND a.attempt = s.attempt WHERE a.state = ?",
                                (State.RUNNING,)).fetchall()
        return {(name, attempt): stop_words(name, attempt, state, detail, reason, self._corrupt)
                for name, attempt, state, detail, reason in rows}

    # --- requests from other processes (`autotune cancel`) ----------------------------------------------------
    def request(self, kind: str, names: Sequence[str], at: float) -> None:
        with self._transaction():
            self._db.execute("INSERT INTO requests (kind, names, at) VALUES (?, ?, ?)",
                             (kind, json.dumps(list(names)), at))

    def take_requests(self) -> list[tuple[str, list[str]]]:
        """Pending requests, oldest first, marked handled in the same transaction."""
        with self._transaction():
            rows = self._db.execute("SELECT seq, kind, names FROM requests WHERE handled = 0 ORDER BY seq").fetchall()
            if rows:  # only what was read: a request written since stays pending for the next call
                self._db.execute("UPDATE requests SET handled = 1 WHERE handled = 0 AND seq <= ?", (rows[-1]["seq"],))
        return [(r["kind"], self._json(r["names"], "requests.names", list)) for r in rows]

    # --- reading -------------------------------------------------------------------------------------------
    def latest(self) -> list[Attempt]:
        """The latest attempt of every experiment, in the sweep's order."""
        return self._rows(f"{_LATEST} ORDER BY e.position")

    def states(self, names: Iterable[str] | None = None) -> dict[str, tuple[int, State]]:
        """name -> (number, state) of every experiment's latest attempt, in the sweep's order; or of the named
        ones only (a retry of one run read every experiment's: 100,000 rows a retry on the largest sweep). No
        attempt is built, states are looked up by their text."""
        if names is None:
            rows = self._db.execute(f"SELECT a.name, a.attempt, a.state {_LATEST} ORDER BY e.position").fetchall()
        else:  # the bare `state` is the row of MAX(attempt)'s (SQLite's rule for one min or max)
            rows = self._by_name("SELECT name, MAX(attempt), state FROM attempts WHERE name IN ({}) GROUP BY name",
                                 names)
        found = {name: (attempt, STATES.get(state)) for name, attempt, state in rows}
        odd = next((name for name, (_, state) in found.items() if state is None), None)
        if odd is not None:
            text = next(state for name, _, state in rows if name == odd)
            raise self._corrupt(f"attempts: {short(odd)} has an unknown state {short(str(text))!r}")
        return found  # type: ignore[return-value]  # no None left: checked above

    def latest_in(self, *states: State) -> dict[str, int]:
        """name -> the number of its latest attempt, of the experiments whose latest attempt is in one of
        `states`, in the sweep's order. Through the index on state: as many rows as match (what `resume` queues
        again), not every experiment's (`states()` of 100,000 three times delayed its first launch)."""
        marks = ",".join("?" * len(states))
        return dict(self._db.execute(f"SELECT a.name, a.attempt {_LATEST} AND a.state IN ({marks}) ORDER BY e.position",
                                     states).fetchall())

    def attempts(self, name: str | None = None) -> list[Attempt]:
        query = "FROM attempts a JOIN experiments e ON e.name = a.name"
        return self._rows(query + (" WHERE a.name = ?" if name else "") + " ORDER BY e.position, a.attempt",
                          (name,) if name else ())

    def peaks(self) -> dict[str, int]:
        """name -> the highest peak GPU memory measured over its attempts (bytes), of the experiments measured: even
        one that ran out of memory held that much. One query, no attempt decoded; none before peaks (schema 3)."""
        if self.version() < 3:
            return {}
        odd = self._db.execute("SELECT name, peak_memory FROM attempts WHERE peak_memory IS NOT NULL AND "
                               "typeof(peak_memory) != 'integer' LIMIT 1").fetchone()
        if odd is not None:  # we write whole bytes only: a text or real one was not written by us
            raise odd_peak(odd[0], odd[1], self._corrupt)
        return {name: int(peak) for name, peak in self._db.execute(
            "SELECT name, MAX(peak_memory) FROM attempts WHERE peak_memory > 0 GROUP BY name")}

    def in_state(self, *states: State) -> list[Attempt]:
        return self._rows(f"FROM attempts a WHERE state IN ({','.join('?' * len(states))})", states)


def open_sweep(directory: str | Path) -> Ledger:
    """The ledger of the sweep prepared in `directory`; a UserError when there is none."""
    try:
        return Ledger.open(Path(directory))
    except FileNotFoundError:
        raise UserError("no sweep here (no ledger.sqlite)", directory) from None
