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

import functools
import json
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from ..errors import UserError
from ..spec import Experiment
from ..states import Reason, State

FILENAME = "ledger.sqlite"

# PRAGMA user_version of the ledgers this code writes. 0: a ledger from before versions (it has version 1's
# tables), read as it is and migrated by the next runner.
SCHEMA_VERSION = 3

_SCHEMA = """  -- version 1's tables: a new ledger gets them, then every migration (`_schema`)
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
_TABLES = ("meta", "experiments", "attempts", "transitions", "requests")

# The statements that bring a ledger of version N to N + 1 (index N), run by the runner in the transaction
# that stamps the new version. 0 -> 1: version 0 already has version 1's tables; the stamp is the migration.
# 1 -> 2: a Slurm job step's id per attempt. 2 -> 3: the peak GPU memory an attempt held (peaks.py).
_MIGRATIONS: tuple[tuple[str, ...], ...] = ((), ("ALTER TABLE attempts ADD COLUMN step TEXT",),
                                            ("ALTER TABLE attempts ADD COLUMN peak_memory INTEGER",))
assert len(_MIGRATIONS) == SCHEMA_VERSION

# SQLite's primary result codes for a file that is not (or no longer) a database: SQLITE_CORRUPT,
# SQLITE_FORMAT, SQLITE_NOTADB. A full disk or a lock is something else, and is not reported as damage.
_DAMAGE_CODES = (11, 24, 26)

# Experiments read by name in one query when there are at most this many (SQLite bounds a statement's
# parameters); more are read with the rest and picked in Python.
_FEW = 500


class TransitionError(Exception):
    """A transition the state machine forbids (e.g. leaving a terminal state): a bug, not bad input."""


@dataclass(frozen=True)
class SweepMeta:
    """The sweep's settings, as `prepare` recorded them in the meta table (one JSON value per key).

    The first five are what every command relies on; the rest have defaults, for ledgers written before them.
    Keys this version does not know are kept in `extra`, never an error: a newer autotuner may add some.
    """

    name: str
    metric: str  # as `metric_named` reads it: "throughput", or "loss:min"
    sweep_id: str  # the first part of every attempt's tag
    slots: Mapping[str, tuple[int, ...]]  # the slot ids of each host the sweep may use, in hostfile order
    launcher: tuple[str, ...]  # DeepSpeed's launcher, as an argv prefix
    source: str = ""  # the sweep file(s) it was read from
    created: float | None = None  # seconds since the epoch
    capacity: Mapping[str, int] = field(default_factory=dict)  # every slot of each host (the hostfile's)
    accelerator: str = "cuda"
    env: Mapping[str, str] = field(default_factory=dict)  # what every experiment's environment gets
    reload: Mapping[str, Any] = field(default_factory=dict)  # how `resume` reads the sweep's spec again
    ssh: Mapping[str, Any] | None = None  # how other hosts are reached (runner.Ssh), once a runner used SSH
    search: Mapping[str, Any] | None = None  # `autotune tune`: the search that proposes the experiments
    # host -> GPU type, and host -> bytes per GPU, of the hosts where known; None (a ledger from before types, or
    # a cluster that states none): no types, every host as any other.
    gpu_types: Mapping[str, str] | None = None
    gpu_memory: Mapping[str, int] | None = None
    # host -> slot id (a string) -> {gpu_type, memory, mig}: this machine's MIG instances (core.slots.Device)
    devices: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None
    placement: str | None = None  # the placement a runner was last told to use (None: the default)
    # experiment -> bytes per GPU it is taken to need, learned from an earlier sweep's peaks (learned.py)
    learned_memory: Mapping[str, int] | None = None
    slurm: Mapping[str, Any] | None = None  # the Slurm allocation it runs in (job id, whether ours), if one
    ray: Mapping[str, Any] | None = None  # the Ray cluster it runs on (address, host -> node id), if one
    extra: Mapping[str, Any] = field(default_factory=dict)

    # The JSON type of each key in the table; the first five must be there.
    _TYPES: ClassVar[dict[str, type | tuple[type, ...]]] = {
        "name": str, "metric": str, "sweep_id": str, "slots": dict, "launcher": list, "source": str,
        "created": (int, float), "capacity": dict, "accelerator": str, "env": dict, "reload": dict,
        "ssh": (dict, type(None)), "search": (dict, type(None)), "gpu_types": dict, "gpu_memory": dict,
        "devices": dict, "placement": str, "slurm": (dict, type(None)), "learned_memory": dict,
        "ray": (dict, type(None))}
    _REQUIRED: ClassVar[tuple[str, ...]] = ("name", "metric", "sweep_id", "slots", "launcher")

    @classmethod
    def problem(cls, data: Mapping[str, Any]) -> str | None:
        """What makes the table's values unusable, in words; None when they are fine."""
        for key, kind in cls._TYPES.items():
            if key not in data:
                if key in cls._REQUIRED:
                    return f"meta {key!r} is missing"
            elif not isinstance(data[key], kind) or isinstance(data[key], bool):
                return f"meta {key!r} is not a {'number' if key == 'created' else _json_kind(kind)}"
        if not all(isinstance(v, str) for v in dict(data.get("gpu_types") or {}).values()):
            return "meta 'gpu_types' holds a type that is not a string"
        for key in ("gpu_memory", "learned_memory"):
            if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                       for v in dict(data.get(key) or {}).values()):
                return f"meta {key!r} holds a size that is not a positive integer"
        devices = dict(data.get("devices") or {}).values()
        if not all(isinstance(own, dict) and all(str(i).isdigit() and isinstance(d, dict)
                                                 and isinstance(d.get("gpu_type"), str) for i, d in own.items())
                   for own in devices):
            return "meta 'devices' holds a slot that is not {gpu_type, memory, mig}"
        return None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SweepMeta:
        """The settings from the table's decoded values (checked first with `problem`)."""
        known = {f.name for f in fields(cls)} - {"extra"}
        values = {k: v for k, v in data.items() if k in known}
        values["slots"] = {str(h): tuple(ids) for h, ids in dict(values["slots"]).items()}
        values["launcher"] = tuple(values["launcher"])
        for key in ("env", "capacity", "gpu_types", "gpu_memory", "learned_memory"):
            if key in values:
                values[key] = {str(k): v if key in ("capacity", "gpu_memory", "learned_memory") else str(v)
                               for k, v in values[key].items()}
        return cls(**values, extra={k: v for k, v in data.items() if k not in known})
    def to_json(self) -> dict[str, Any]:
        """The table's values: the same keys and JSON a ledger has always held (`slots` as lists)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        data["slots"] = {h: list(ids) for h, ids in self.slots.items()}
        data["launcher"] = list(self.launcher)
        for key in ("capacity", "env", "reload", "ssh", "search", "gpu_types", "gpu_memory", "devices", "slurm",
                    "learned_memory", "ray"):
            data[key] = None if data[key] is None else dict(data[key])
        # Unset: left out, as ledgers always had it (ssh is written by the first runner that reaches a host).
        return {k: v for k, v in data.items() if v is not None} | dict(self.extra)


@dataclass(frozen=True)
class Attempt:
    """One attempt of one experiment as the ledger knows it."""

    name: str
    attempt: int
    state: State
    queued_at: float
    reason: Reason | None = None
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
    step: str | None = None  # the Slurm job step (`J.S`) that ran it, in a sweep run inside Slurm
    peak_memory: int | None = None  # bytes: the most it held on one GPU, where measured (peaks.py)

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def duration(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | {
            "slots": dict(self.slots), "metrics": dict(self.metrics)}


# What reading a row needs of Attempt and the words: every field with its default (None: the columns of an
# older ledger's version that are missing), and each state and reason by its text.
_ATTEMPT_DEFAULTS: dict[str, Any] = {f.name: None for f in fields(Attempt)}
_STATES = {str(s): s for s in State}
_REASONS = {str(r): r for r in Reason}


def _json_kind(kind: type | tuple[type, ...]) -> str:
    return (kind if isinstance(kind, type) else kind[0]).__name__


def _damaged(error: BaseException | None) -> bool:
    """sqlite3 saying the file is damaged or no database (as opposed to, say, a full disk)."""
    code = getattr(error, "sqlite_errorcode", None)
    return isinstance(error, sqlite3.DatabaseError) and code is not None and code & 0xFF in _DAMAGE_CODES


def _refusal(error: sqlite3.DatabaseError, path: Path) -> UserError:
    """What sqlite3 said while a ledger was opened and checked, as one line naming the file."""
    code = (getattr(error, "sqlite_errorcode", None) or 0) & 0xFF
    if code == 26:  # SQLITE_NOTADB
        return UserError(f"not a sweep ledger ({error})", path)
    if _damaged(error):
        return UserError(f"corrupt sweep ledger: {error}", path)
    return UserError(f"cannot read the ledger: {error}", path)


def _columns(db: sqlite3.Connection) -> dict[str, list[tuple]]:
    """The columns of each ledger table as PRAGMA table_info gives them (none: the table is missing)."""
    return {table: [tuple(c) for c in db.execute(f"PRAGMA table_info({table})")] for table in _TABLES}


def _schema(version: int = SCHEMA_VERSION) -> str:
    """The statements that make a ledger of `version`'s tables: version 1's, then the migrations after it."""
    return _SCHEMA + "".join(f"{statement};\n" for step in _MIGRATIONS[1:version] for statement in step)


@functools.cache
def _expected_columns(version: int = SCHEMA_VERSION) -> dict[str, list[tuple]]:
    """The columns of `version`'s tables, from the schema itself (not a second copy to keep in step)."""
    db = sqlite3.connect(":memory:")
    try:
        db.executescript(_schema(version))
        return _columns(db)
    finally:
        db.close()


def _short(name: str) -> str:
    return name if len(name) <= 40 else name[:37] + "..."


def _table_problem(table: str, found: list[tuple], expected: list[tuple]) -> str | None:
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
        f"{label} column{'s' if len(names) > 1 else ''} {', '.join(map(_short, names[:3]))}"
        f"{' ...' if len(names) > 3 else ''}" for label, names in (("no", missing), ("unknown", unknown)) if names)


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
            ledger._db.executescript(_schema() + f"PRAGMA user_version = {SCHEMA_VERSION};")
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
                raise _refusal(e, path) from None
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
        found = _columns(self._db)
        if version == 0 and not any(found.values()):
            raise UserError("not a sweep ledger (it has none of a ledger's tables)", self.path)
        for table, expected in _expected_columns(max(1, version)).items():  # version 0's tables are version 1's
            problem = _table_problem(table, found[table], expected)
            if problem:
                raise self._corrupt(problem)
        problem = SweepMeta.problem(self._meta_json())
        if problem:
            raise self._corrupt(problem)

    def check_whole(self) -> None:
        """Every page and every JSON value read: what a writer (the runner, `cancel`) does before it writes or
        takes the sweep, so a damaged ledger is refused with nothing changed. A reader finds damage where it
        reads, and says so then."""
        try:
            problems = [row[0] for row in self._db.execute("PRAGMA quick_check")]
            if problems != ["ok"]:
                raise self._corrupt(problems[0])
            for table, column, kind in (("experiments", "spec", dict), ("attempts", "slots", dict),
                                        ("attempts", "metrics", dict), ("requests", "names", list)):
                self._check_json(table, column, kind)
            self.peaks()  # a peak_memory we did not write (text, a real) is refused as reading it would be
            for column, words in (("state", State), ("reason", Reason)):  # what reading them would refuse later
                known = [str(w) for w in words]
                marks = ",".join("?" * len(known))
                odd = self._db.execute(f"SELECT {column} FROM attempts WHERE {column} IS NOT NULL AND "
                                       f"{column} NOT IN ({marks}) LIMIT 1", known).fetchone()
                if odd is not None:
                    raise self._corrupt(f"attempts.{column} {str(odd[0])[:40]!r} is not one this autotuner knows")
        except sqlite3.DatabaseError as e:
            if _damaged(e):
                raise self._corrupt(str(e)) from None
            raise

    def _check_json(self, table: str, column: str, kind: type) -> None:
        """Every value of a JSON column decodes to a `kind`. SQLite's json_valid picks the suspects (10,000
        specs decoded in Python took a tenth of a second); Python judges them, since it also reads NaN, which
        SQLite does not. An SQLite without JSON functions sends every value to Python."""
        where = f"{column} IS NOT NULL" + (" AND " + column + " != ''" if table == "attempts" else "")
        try:
            rows = self._db.execute(f"SELECT {column} FROM {table} WHERE {where} AND NOT "
                                    f"(json_valid({column}) AND json_type({column}) = ?)",
                                    ("object" if kind is dict else "array",)).fetchall()
        except sqlite3.OperationalError as e:
            if "no such function" not in str(e):
                raise
            rows = self._db.execute(f"SELECT {column} FROM {table} WHERE {where}").fetchall()
        for (text,) in rows:
            self._json(text, f"{table}.{column}", kind)

    def upgrade(self) -> None:
        """An older ledger migrated to this version in one transaction, and WAL mode: by the runner, the one
        writer, holding the sweep's lock. Readers never call it: they read an older version as it is."""
        self._db.execute("PRAGMA journal_mode=WAL")
        if self.version() == SCHEMA_VERSION:
            return
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            for step in _MIGRATIONS[self.version():]:
                for statement in step:
                    self._db.execute(statement)
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _corrupt(self, detail: str) -> UserError:
        return UserError(f"corrupt sweep ledger: {detail}", self.path)

    def _json(self, text: str, where: str, kind: type = object) -> Any:
        """A JSON value the ledger holds. One that does not decode (or is not a `kind`) was not written by us."""
        try:
            value = json.loads(text)
        except (TypeError, ValueError, RecursionError):
            raise self._corrupt(f"{where} is not JSON") from None
        if not isinstance(value, kind):
            raise self._corrupt(f"{where} is not a JSON {'object' if kind is dict else kind.__name__}")
        return value

    def _attempt(self, row: sqlite3.Row) -> Attempt:
        return self._attempts([row])[0]

    def _attempts(self, rows: Sequence[sqlite3.Row]) -> list[Attempt]:
        """Attempts from their rows, every value checked as before. Built without Attempt's generated __init__
        (a frozen dataclass sets its 19 fields one `object.__setattr__` at a time: 40 ms of 10,000 attempts, the
        largest part of `autotune status` on a large sweep), states and reasons by a dict look-up, and the few
        distinct slot texts decoded once (each attempt still gets its own dict)."""
        if not rows:
            return []
        out = []
        slot_texts: dict[str, dict[str, list[int]]] = {}
        columns = rows[0].keys()
        missing = {k: v for k, v in _ATTEMPT_DEFAULTS.items() if k not in columns}  # an older version's ledger
        for row in rows:
            data = dict(zip(columns, row, strict=True))
            if missing:
                data.update(missing)
            text = data["slots"]
            if not text:
                data["slots"] = {}
            else:
                known = slot_texts.get(text)
                if known is None:
                    known = slot_texts[text] = self._json(text, "attempts.slots", dict)
                data["slots"] = {host: list(ids) if isinstance(ids, list) else ids for host, ids in known.items()}
            data["metrics"] = self._json(data["metrics"], "attempts.metrics", dict) if data["metrics"] else {}
            state, reason = _STATES.get(data["state"]), data["reason"]
            if state is None or (reason is not None and reason not in _REASONS):
                raise self._corrupt(f"attempts: {_short(str(data['name']))} attempt {data['attempt']} has an "
                                    f"unknown state or reason ({_short(str(data['state']))}, "
                                    f"{_short(str(data['reason']))})")
            data["state"], data["reason"] = state, None if reason is None else _REASONS[reason]
            peak = data["peak_memory"]
            if peak is not None and (not isinstance(peak, int) or isinstance(peak, bool)):
                raise self._odd_peak(data["name"], peak)
            if len(data) != len(_ATTEMPT_DEFAULTS):  # a column Attempt lacks: what Attempt(**data) refused
                raise TypeError(f"unexpected attempts columns {sorted(set(data) - set(_ATTEMPT_DEFAULTS))}")
            attempt = object.__new__(Attempt)
            attempt.__dict__.update(data)
            out.append(attempt)
        return out

    def _odd_peak(self, name: object, peak: object) -> UserError:
        return self._corrupt(f"attempts: {_short(str(name))} has a peak_memory that is no whole number of bytes "
                             f"({_short(str(peak))!r})")

    def _experiment(self, spec: str) -> Experiment:
        data = self._json(spec, "experiments.spec", dict)
        try:
            return Experiment.from_json(data)
        except (KeyError, TypeError, ValueError):
            raise self._corrupt("experiments.spec lacks what an experiment needs") from None

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, kind: object, error: BaseException | None, traceback: object) -> None:
        """The one place where damage found mid-read (pages a query reaches, not the ones checked at open)
        becomes the same one-line error as damage found at open."""
        self.close()
        if _damaged(error):
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

    def _meta_json(self) -> dict[str, Any]:
        return {r["key"]: self._json(r["value"], f"meta {_short(str(r['key']))!r}")
                for r in self._db.execute("SELECT key, value FROM meta").fetchall()}

    def set_meta(self, key: str, value: object) -> None:
        """One setting changed (e.g. `ssh`, by the runner that first reaches another host)."""
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
        wanted = None if names is None else sorted(set(names))
        if wanted is not None and len(wanted) <= _FEW:  # a report's bests: only their rows are read
            rows = self._db.execute(f"SELECT name, spec FROM experiments WHERE name IN ({','.join('?' * len(wanted))}) "
                                    "ORDER BY position", wanted).fetchall()
        else:
            rows = self._db.execute("SELECT name, spec FROM experiments ORDER BY position").fetchall()
        chosen = None if wanted is None else set(wanted)
        return [self._experiment(r["spec"]) for r in rows if chosen is None or r["name"] in chosen]

    def specs(self) -> list[dict[str, Any]]:
        """Every experiment's recorded spec as JSON data, in the sweep's order, without building `Experiment`s
        (a report of 10,000 needs only their configs; building and checking each took most of its time)."""
        rows = self._db.execute("SELECT spec FROM experiments ORDER BY position").fetchall()
        return [self._json(r["spec"], "experiments.spec", dict) for r in rows]

    def digests(self) -> dict[str, str]:
        return {r["name"]: r["digest"] for r in self._db.execute("SELECT name, digest FROM experiments")}

    # --- transitions ---------------------------------------------------------------------------------------
    def requeue(self, names: Iterable[str], at: float) -> dict[str, int]:
        """A new attempt for each experiment whose latest attempt is terminal; returns name -> attempt."""
        latest = self.states()
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
                 step: str | None = None) -> None:
        """The process exists: its pid (its process group), master port and Slurm step, for clean-up and the
        record."""
        with self._transaction():
            self._db.execute("UPDATE attempts SET pid = ?, port = ?, launched_at = ?, step = ? "
                             "WHERE name = ? AND attempt = ?", (pid, port, at, step, name, attempt))

    def finish(self, name: str, attempt: int, state: State, at: float, *, reason: Reason | None = None,
               detail: str | None = None, exit_code: int | None = None, metric: float | None = None,
               metrics: Mapping[str, float] | None = None, peak_memory: int | None = None) -> None:
        """queued|running -> a terminal state (queued ones can be cancelled or interrupted unstarted);
        `peak_memory`: the most the attempt held on one GPU, where it was measured (peaks.py)."""
        if not state.terminal:
            raise TransitionError(f"{state} is not a terminal state")
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
    # Rows are fetched whole before they are decoded: a cursor left open by a decoding error kept the
    # connection (and its -wal and -shm files) alive after close().
    def latest(self) -> list[Attempt]:
        """The latest attempt of every experiment, in the sweep's order."""
        rows = self._db.execute(
            "SELECT a.* FROM attempts a JOIN experiments e ON e.name = a.name "
            "WHERE a.attempt = (SELECT MAX(attempt) FROM attempts b WHERE b.name = a.name) ORDER BY e.position"
        ).fetchall()
        return self._attempts(rows)

    def states(self) -> dict[str, tuple[int, State]]:
        """name -> (number, state) of every experiment's latest attempt, in the sweep's order. Cheap: what
        `latest()` costs on a large sweep is building its Attempts, not the query."""
        rows = self._db.execute(
            "SELECT a.name, a.attempt, a.state FROM attempts a JOIN experiments e ON e.name = a.name "
            "WHERE a.attempt = (SELECT MAX(attempt) FROM attempts b WHERE b.name = a.name) ORDER BY e.position")
        return {name: (attempt, self._state_word(state, name)) for name, attempt, state in rows}

    def _state_word(self, text: str, name: str) -> State:
        try:
            return State(text)
        except ValueError:
            raise self._corrupt(f"attempts: {_short(name)} has an unknown state {_short(str(text))!r}") from None

    def attempts(self, name: str | None = None) -> list[Attempt]:
        query = "SELECT a.* FROM attempts a JOIN experiments e ON e.name = a.name"
        rows = self._db.execute(query + (" WHERE a.name = ?" if name else "") + " ORDER BY e.position, a.attempt",
                                (name,) if name else ()).fetchall()
        return self._attempts(rows)

    def peaks(self) -> dict[str, int]:
        """name -> the highest peak GPU memory measured over its attempts (bytes), of the experiments measured:
        even an attempt that ran out of memory held at least that much. One query, no attempt decoded. A ledger
        from before peaks were recorded (read, not migrated: an earlier sweep's) has none."""
        if self.version() < 3:
            return {}
        odd = self._db.execute("SELECT name, peak_memory FROM attempts WHERE peak_memory IS NOT NULL AND "
                               "typeof(peak_memory) != 'integer' LIMIT 1").fetchone()
        if odd is not None:  # we write whole bytes only: a text or real one was not written by us
            raise self._odd_peak(odd[0], odd[1])
        return {name: int(peak) for name, peak in self._db.execute(
            "SELECT name, MAX(peak_memory) FROM attempts WHERE peak_memory > 0 GROUP BY name")}

    def in_state(self, *states: State) -> list[Attempt]:
        marks = ",".join("?" * len(states))
        rows = self._db.execute(f"SELECT * FROM attempts WHERE state IN ({marks})", states).fetchall()
        return self._attempts(rows)


def open_sweep(directory: str | Path) -> Ledger:
    """The ledger of the sweep prepared in `directory`; a UserError when there is none."""
    try:
        return Ledger.open(Path(directory))
    except FileNotFoundError:
        raise UserError("no sweep here (no ledger.sqlite)", directory) from None
