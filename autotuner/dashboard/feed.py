"""One sweep's ledger followed read only: the experiments and their latest attempts, kept up to date from the
transitions recorded since the last read.

The ledger numbers every transition (`transitions.seq`), so "what changed since N" is one indexed query, and a
page that last saw transition N is sent the rows of the experiments whose attempts moved since. The file is
opened anew on every read, any statement that writes refused (`query_only`): the dashboard changes nothing in a
sweep, never takes its lock, and holds no connection between reads, so it is safe beside a running runner,
`resume` and `cancel`.

A ledger that no writer has open (no `-wal` file beside it) is read as immutable (`mode=ro&immutable=1`):
nothing is created beside it. Should a writer open it during that read (a `-wal` appears, or the file changes),
the read is done again the usual way. Read the usual way, a connection to a WAL database creates `-wal` and
`-shm` if they are missing (the writer left between the look and the open), and only the last connection to
close removes them, which a connection opened read only (`mode=ro`) cannot do: a writer that left while it
read left them behind for good. So the usual way is a connection SQLite may tidy up with (`mode=rw`, with
`query_only`), which removes them on close when it is the last, exactly as the runner's own close would.
"""
from __future__ import annotations

import bisect
import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

from ..errors import UserError
from ..jsonvalues import JSON, JSONObject
from ..ledger.lock import LOCKFILE
from ..ledger.store import FILENAME, SCHEMA_VERSION, Attempt, Ledger, SweepMeta
from ..spec import Experiment
from ..spec.metrics import metric_named
from ..states import State
from ..tune.memory_model import Facts
from ..tune.space import SearchSpec
from ..views import cost
from ..views.analysis import choose_axes, swept_specs
from ..views.gpu_hours import GpuHours, experiment_hours, gpu_hours
from ..views.records import layout_rows, metric_names, with_layout
from ..views.snapshot import Snapshot
from ..views.tflops import model_facts, per_sample, with_tflops
from .readings import Reading, Readings

# The columns of a row before the swept parameters (then one per swept key, then one per metric). `steps`, `low`
# and `high`: the steps measured and the metric's 95% interval (a running attempt's so far, `so_far` its mean).
COLUMNS = ("name", "state", "reason", "detail", "attempt", "metric", "started", "finished", "slots", "gpu_type",
           "peak_memory", "position", "gpu_hours", "steps", "so_far", "low", "high")
_MISSING = object()  # a swept key an experiment lacks
# What a Snapshot works out (cached properties) without its experiments: the ranking and the GPU types.
PROBED = ("order", "ranked", "runs", "_run_of", "host_types", "slot_types", "types", "best_by_type")
KEPT_READS = 10_000  # reads whose moved experiments are kept to answer "since N" (a long tune reads many)
# Past this many experiments moved since the last read, every latest attempt is read again in one query.
BULK = 200
T = TypeVar("T")


@dataclass(frozen=True)
class Reader:
    """A read-only connection to a sweep's ledger: its typed reads (`ledger`) and the raw queries the feed adds
    (`db`: the transitions since N)."""

    ledger: Ledger
    db: sqlite3.Connection
    immutable: bool  # read as a file no writer has open
    seen: tuple[int, int, int] | None  # the file (inode, size, mtime) before an immutable read

    def raced(self) -> bool:
        """A writer opened the ledger while it was read as immutable (it may have left again, after writing into
        the file): what was read may be torn."""
        return self.immutable and (_wal(self.ledger.path).exists() or _identity(self.ledger.path) != self.seen)


def _wal(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


@contextmanager
def read_only(directory: Path, *, quiet: bool = True) -> Iterator[Reader]:
    """The sweep's ledger opened for reading: SQLite refuses any statement that writes through this connection.
    `quiet`: read a ledger no writer has open as immutable (nothing created beside it); check `Reader.raced`
    after (`read` does). Else a connection that, the last to close, removes `-wal` and `-shm` (the module says
    why)."""
    path = Path(directory) / FILENAME
    if not path.is_file():
        raise UserError("no sweep here (no ledger.sqlite)", directory)
    seen = _identity(path)
    immutable = quiet and not _wal(path).exists()
    # A file this process may not write is opened read only by SQLite in any case (and could not be tidied).
    mode = "ro&immutable=1" if immutable else "rw" if os.access(path, os.W_OK) else "ro"
    db = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode={mode}", uri=True, timeout=5, isolation_level=None,
                         check_same_thread=False)
    try:
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA query_only=1")
        db.execute("PRAGMA busy_timeout=5000")
        ledger = Ledger(db, path)
        version = ledger.version()
        if version > SCHEMA_VERSION:
            raise UserError(f"written by a newer autotuner (ledger schema {version}): upgrade autotuner", path)
        yield Reader(ledger, db, immutable, seen)
    except sqlite3.DatabaseError as e:
        raise UserError(f"cannot read the ledger: {e}", path) from None
    finally:
        db.close()


def read(directory: Path, work: Callable[[Reader], T]) -> T:
    """`work` done on the ledger (`read_only`): as an unchanging file when no writer has it open, and again the
    usual way should one have opened it meanwhile."""
    with read_only(directory) as reader:
        done = work(reader)
        if not reader.raced():
            return done
    with read_only(directory, quiet=False) as reader:
        return work(reader)


def runner_pid(directory: Path) -> int | None:
    """The pid of the runner holding the sweep, from the kernel's lock table alone: unlike `lock.holder_pid`,
    this takes no lock, not even for an instant (a shared flock then would make a starting `resume` fail)."""
    where = set()
    for path in (Path(directory), Path(directory) / LOCKFILE):
        try:
            st = os.stat(path)
        except OSError:
            continue
        where.add(f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}")
    try:
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    for line in table.splitlines():  # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:2147729 0 EOF"; waiters have "->"
        fields = line.split()
        if len(fields) > 5 and fields[1:4] == ["FLOCK", "ADVISORY", "WRITE"] and fields[5] in where:
            return int(fields[4]) if fields[4].isdigit() and int(fields[4]) > 0 else None
    return None


@dataclass(frozen=True)
class Changes:
    """What a page that last saw transition `since` (and readings `mark`) is sent: the rows that moved or whose
    reading changed (all of them when `full`: its first ask, or the columns changed since), the sweep's transition
    number now, and the readings' mark now."""

    seq: int
    full: bool
    columns: tuple[str, ...]
    rows: list[list[JSON]]
    mark: str


class SweepFeed:
    """A sweep's experiments and latest attempts, refreshed from the ledger's new transitions. Thread-safe: the
    server's request threads share one per sweep."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self._lock = threading.Lock()
        self.seq = -1  # the last transition read (-1: nothing read yet)
        self.meta: SweepMeta | None = None
        self.specs: dict[str, JSONObject] = {}  # name -> the experiment as the ledger records it, in order
        self._experiments: dict[str, Experiment] = {}  # built from their specs only when needed (ETA, best)
        self.attempts: dict[str, Attempt] = {}  # name -> latest attempt, in the sweep's order
        self._moved: list[tuple[int, list[str]]] = []  # (transition, the experiments moved up to it), each read
        self.keys: list[str] = []  # the swept parameters
        self.metric_columns: tuple[str, ...] = ()
        self.layout_seq = 0  # the transition at which the columns last changed
        self._floor = 0  # the last transition whose moves were let go (`KEPT_READS`)
        self.axes: tuple[str, str | None] = ("train_micro_batch_size_per_gpu", "zero_optimization.stage")
        self._params: dict[str, list[JSON]] = {}
        self._position: dict[str, int] = {}
        self._snapshot: Snapshot | None = None
        self._search: SearchSpec | None = None  # a tune's search (its layout, its model's facts), read once
        self._facts: Facts | None = None  # the model's parameter counts, as known at the last read
        self._tflop: dict[str, float] = {}  # name -> the TFLOP a sample costs each of its GPUs (views/tflops.py)
        self._training: tuple[int, JSONObject | None] | None = None  # (transition, the training run priced)
        self._hours: dict[str, float] = {}  # name -> GPU-hours its ended attempts held (views/gpu_hours.py)
        self._spent: tuple[int, JSONObject] | None = None  # (transition, the sweep's GPU-hours)
        self.readings = Readings()  # the running attempts' steps so far (readings.py)

    # --- reading the ledger ------------------------------------------------------------------------------
    def refresh(self) -> bool:
        """Read what the ledger recorded since the last read, and the running attempts' readings; True when
        anything moved."""
        with self._lock:
            seq = self.seq
            with read_only(self.directory) as reader:
                moved = self._read(reader)
                read = self._read_progress(reader)
                if not reader.raced():
                    return moved or read
            self.seq = seq  # a writer opened it meanwhile: read again, the way a live ledger is read
            with read_only(self.directory, quiet=False) as reader:
                again = self._read(reader)
                return self._read_progress(reader) or again or moved or read

    def _read_progress(self, reader: Reader) -> bool:
        """The running attempts' steps so far (one query over the running ones alone: readings.py), of a ledger
        that keeps them (its version asked each time: a `resume` may upgrade it while it is served)."""
        return self.readings.read(reader.db, reader.ledger.version())

    def _read(self, reader: Reader) -> bool:
        ledger = reader.ledger
        top = reader.db.execute("SELECT COALESCE(MAX(seq), 0) FROM transitions").fetchone()[0]
        if top == self.seq:
            return False
        first = self.meta is None
        self.meta = ledger.meta()
        if first and self.meta.search is not None:  # recorded once, when the tune was prepared
            self._search = SearchSpec.from_json(self.meta.search)
        moved = [r[0] for r in reader.db.execute(
            "SELECT DISTINCT name FROM transitions WHERE seq > ? AND seq <= ?", (self.seq, top))]
        added = self._read_experiments(reader)
        if self.seq < 0 or len(moved) > BULK:
            latest = ledger.latest()
        else:
            latest = [found[-1] for name in moved if (found := ledger.attempts(name))]
        for a in latest:
            self.attempts[a.name] = a
        self._hours.update(experiment_hours(ledger, None if self.seq < 0 or len(moved) > BULK else moved))
        if self.seq >= 0:
            self._moved.append((top, [a.name for a in latest]))
            if len(self._moved) > KEPT_READS:  # a page further behind than the reads kept is sent every row
                self._floor = self._moved[KEPT_READS // 2 - 1][0]
                del self._moved[:KEPT_READS // 2]
        if added:
            self.attempts = {n: self.attempts[n] for n in self.specs if n in self.attempts}
        self._columns(top, added)
        self.seq = top
        self._snapshot = None
        return True

    def _read_experiments(self, reader: Reader) -> bool:
        """New experiments (a tune proposes them as it goes; a resume may add some); True when any."""
        count = reader.db.execute("SELECT COUNT(*) FROM experiments").fetchone()[0]
        if count == len(self.specs):
            return False
        for spec in reader.ledger.specs():  # JSON only: building 10,000 Experiments took most of a first read
            name = str(spec.get("name"))
            if name not in self.specs:
                self.specs[name] = spec
                self._position[name] = len(self._position)
        return True

    def _experiment(self, name: str) -> Experiment | None:
        """The experiment of that name, built from its recorded spec once (None if the record lacks one)."""
        found = self._experiments.get(name)
        if found is None and name in self.specs:
            try:
                found = self._experiments[name] = Experiment.from_json(self.specs[name])
            except (KeyError, TypeError, ValueError):
                return None
        return found

    def _columns(self, top: int, added: bool) -> None:
        """The swept keys (a tune's layout beside them: views.records.layout_rows, as the report shows it) and
        metric columns (TFLOPs per GPU among them where the model's facts tell it), worked out again when
        experiments or metric names appeared, or the facts became known (a profile run ended)."""
        assert self.meta is not None
        search = self._search
        facts = model_facts(search, self.attempts.get) if search is not None else None
        if added or facts != self._facts:
            self._tflop = per_sample(search, facts, self.specs.values()) if search and facts else {}
            if facts != self._facts:
                self._facts, self.layout_seq = facts, top  # every row's figure with them
        attempts = self.attempts.values()  # a call a row only where there is a figure to add (10,000 rows a read)
        names = metric_names(metric_named(self.meta.metric),
                             [self._metrics(a) for a in attempts] if self._tflop else [a.metrics for a in attempts])
        if added:
            keys, table = swept_specs(list(self.specs.values()))
            layout, by_name = layout_rows(search, self.specs.values())
            keys, table = with_layout(keys, table, self.specs, layout, by_name)
            self._params = {n: [row.get(k) for k in keys] for n, row in zip(self.specs, table, strict=True)}
            self.axes = choose_axes([e for n in _representatives(list(self.specs), table, keys)
                                     if (e := self._experiment(n)) is not None], None, None)
            if keys != self.keys:
                self.keys, self.layout_seq = keys, top
        if names != self.metric_columns:
            self.metric_columns, self.layout_seq = names, top

    def _metrics(self, a: Attempt) -> Mapping[str, float]:
        """A run's metrics as the report shows them: with its TFLOPs per GPU where the facts tell it."""
        return with_tflops(a.metrics, self._tflop.get(a.name)) if self._tflop else a.metrics

    # --- what the page is sent -----------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """The read model of the views, built from what was read (once per change)."""
        with self._lock:
            if self._snapshot is None:
                assert self.meta is not None
                metric, attempts = metric_named(self.meta.metric), list(self.attempts.values())
                # Of the experiments, the views here need those that wait or run (the ETA) and the best (its
                # config and command), as `snapshot(every_experiment=False)` reads them.
                probe = Snapshot(self.directory, self.meta.name, metric, {}, attempts, self.meta)
                needed = [a.name for a in attempts if a.state in (State.QUEUED, State.RUNNING)]
                needed += [a.name for a in probe.best_by_type.values()] if probe.by_type else []
                needed += [probe.best.name] if probe.best else []
                experiments = {n: e for n in needed if (e := self._experiment(n)) is not None}
                snap = Snapshot(self.directory, self.meta.name, metric, experiments, attempts, self.meta)
                # The ranking and the types do not depend on the experiments: worked out once, not twice.
                for key in PROBED:
                    if key in probe.__dict__:
                        snap.__dict__[key] = probe.__dict__[key]
                self._snapshot = snap
            return self._snapshot

    def training(self) -> JSONObject | None:
        """The training run priced for each config, as the report's training section shows it (views/cost.py, the
        same rows, notes and verdict), for a tune that stated one; None for a sweep without. Worked out once per
        transition. What cannot be priced yet (no config measured a throughput) is `{"error": why}`."""
        snap = self.snapshot()
        with self._lock:
            if self._training is not None and self._training[0] == self.seq:
                return self._training[1]
            seq = self.seq
        try:
            goal = cost.goal_of(snap)
            priced = cost.costing(snap, goal) if goal.wanted else None
        except UserError as e:
            made: JSONObject | None = {"error": str(e)}
        else:
            made = None if priced is None else {
                **priced.to_json(), "title": cost.title(priced), "headers": list(cost.headers(priced)),
                "cells": [list(row) for row in cost.cells(priced)], "verdict": list(priced.verdict),
                "notes": cost.notes(priced)[len(priced.verdict):]}
        with self._lock:
            self._training = (seq, made)
        return made

    def experiment_hours(self) -> GpuHours:
        """The sweep's GPU-hours with each experiment's (views/gpu_hours.py), from the ledger read only."""
        snap = self.snapshot()
        return read(self.directory, lambda reader: gpu_hours(snap, reader.ledger))

    def gpu_hours(self) -> JSONObject:
        """The sweep's GPU-hours as the report gives them (views/gpu_hours.py), and their line; worked out once per
        transition, from the ledger read only."""
        snap = self.snapshot()
        with self._lock:
            if self._spent is not None and self._spent[0] == self.seq:
                return self._spent[1]
            seq = self.seq
        hours = read(self.directory, lambda reader: gpu_hours(snap, reader.ledger, each=False))
        made: JSONObject = {**hours.to_json(), "line": hours.line()}
        with self._lock:
            self._spent = (seq, made)
        return made

    def columns(self) -> tuple[str, ...]:
        return (*COLUMNS, *(f"param:{k}" for k in self.keys), *(f"metric:{m}" for m in self.metric_columns))

    def changes(self, since: int, mark: str | None = None) -> Changes:
        """The rows a page that last saw transition `since` and readings `mark` lacks (all when `since` < 0 or the
        columns moved; of the readings, the running rows whose reading changed: `Readings.since`)."""
        snap = self.snapshot()
        with self._lock:
            full = since < 0 or since < max(self.layout_seq, self._floor) or since > self.seq
            if full:
                names = list(self.attempts)
            else:  # the reads after `since`, found by bisection: an idle poll costs nothing per experiment
                first = bisect.bisect_right(self._moved, since, key=lambda m: m[0])
                names = list(dict.fromkeys([*(n for _, moved in self._moved[first:] for n in moved),
                                            *self.readings.since(mark)]))
            typed = snap.by_type
            rows = [self._row(self.attempts[n], snap, typed) for n in names if n in self.attempts]
            return Changes(self.seq, full, self.columns(), rows, self.readings.mark)

    def _row(self, a: Attempt, snap: Snapshot, typed: bool) -> list[JSON]:
        metrics = dict(self._metrics(a))
        if a.metric is not None:
            metrics.setdefault(snap.metric.name, a.metric)
        slots = "@".join(f"{h}:{','.join(map(str, ids))}" for h, ids in a.slots.items())
        return [a.name, str(a.state), None if a.reason is None else str(a.reason), a.detail, a.attempt,
                a.metric, _time(a.started_at), _time(a.finished_at), slots,
                snap.type_of(a) if typed else None, a.peak_memory, self._position.get(a.name), self._hours.get(a.name),
                *self._measured(a, metrics, snap.metric.name),
                *self._params.get(a.name, [None] * len(self.keys)),
                *(metrics.get(m) for m in self.metric_columns)]

    def _measured(self, a: Attempt, metrics: Mapping[str, float], metric: str) -> list[JSON]:
        """steps, so_far, low, high: a running attempt's reading, as the runner last recorded it; an ended one's
        steps and interval, as recorded with its metrics (METRIC_low, METRIC_high: spec/interval.py)."""
        if a.state == State.RUNNING:
            found: Reading | None = self.readings.now.get(a.name)
            if found is None or found.attempt != a.attempt:
                return [None] * 4
            return [found.steps, found.mean, found.low, found.high]
        steps = metrics.get("steps_measured")
        return [None if steps is None else int(steps), None, metrics.get(f"{metric}_low"),
                metrics.get(f"{metric}_high")]


def _time(value: float | None) -> float | None:
    return None if value is None else round(value, 3)



def _representatives(names: Sequence[str], table: Sequence[Mapping[str, JSON]], keys: Sequence[str]) -> list[str]:
    """The first experiment with each value of each swept key (and the first that lacks it), in sweep order:
    what `choose_axes` concludes from them is what it would from all, at a fraction of the cost."""
    chosen: dict[str, None] = {}
    seen: set[tuple[str, tuple[str, JSON]]] = set()
    for name, row in zip(names, table, strict=True):
        for key in keys:
            value = row.get(key, _MISSING)
            mark = (key, (type(value).__name__, value if isinstance(value, (str, int, float, bool, type(None)))
                          else json.dumps(value, sort_keys=True, default=str)))
            if mark not in seen:
                seen.add(mark)
                chosen.setdefault(name)
    return list(chosen) or list(names[:1])
