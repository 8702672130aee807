"""Watching a sweep as it runs: a live view for a terminal, and a JSON-lines event stream for scripts.

Both are scheduler observers, called on the dispatcher thread with ("started", Run, None) (or ("adopted", Run,
None) for a run a dead runner started) and ("finished", Run, Outcome) or ("finished", Queued, None) for an
attempt that ended before it started (cancelled, or failed because it could no longer be placed). They only record what they are told; neither waits, sleeps or reads
the clock on its own.

`LiveView` starts from a `report.Snapshot` of the sweep (its counts, slots and results so far) and keeps a small
state up to date; `render(state, now)` turns that state into a rich renderable and is a pure function, so a
test prints it into a recording Console. `rich.live.Live(view)` redraws it: the view is a rich renderable
itself. `EventLog` writes one JSON object per event to a file.
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .outcome import Outcome
from .report import Snapshot, format_value
from .states import Reason, State

# States whose duration says how long an experiment takes (cancelled and interrupted runs were cut short).
_TIMED_STATES = (State.SUCCEEDED, State.FAILED, State.TIMED_OUT)
_KEYS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
MAX_RUNNING_ROWS = 24
MAX_NODE_ROWS = 32
# Host events an observer may also be called with (subject: the host's name), for a scheduler that reports them.
HOST_DOWN, HOST_UP = "host_down", "host_up"
# A run that a dead runner started and this one follows: running, as if started.
ADOPTED = "adopted"

def _slots_of(subject) -> dict[str, list[int]]:
    reservation = getattr(subject, "reservation", None)
    return reservation.as_dict() if reservation is not None else {}


# --- the live view -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Running:
    name: str
    attempt: int
    slots: Mapping[str, tuple[int, ...]]
    started_at: float
    timeout: float | None

    @property
    def size(self) -> int:
        return sum(len(ids) for ids in self.slots.values())


@dataclass(frozen=True)
class LiveState:
    """Everything the live view shows, at one instant. Immutable: safe to render from another thread."""

    sweep: str
    metric: str
    minimize: bool
    slots: Mapping[str, tuple[int, ...]]  # host -> the slot ids the sweep may use
    states: Mapping[str, str]  # experiment -> state of its latest attempt
    sizes: Mapping[str, int]  # experiment -> slots it takes
    running: tuple[Running, ...] = ()  # oldest first
    down: frozenset[str] = frozenset()
    best: tuple[str, float] | None = None
    durations: tuple[float, ...] = ()  # seconds, of the runs that ended (succeeded, failed, timed out)
    since: float | None = None  # when the view began

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for state in self.states.values():
            counts[state] = counts.get(state, 0) + 1
        return counts

    def capacity(self) -> int:
        return sum(len(ids) for host, ids in self.slots.items() if host not in self.down)

    def mean_duration(self) -> float | None:
        return sum(self.durations) / len(self.durations) if self.durations else None

    def eta(self, now: float) -> float | None:
        """Seconds until the sweep ends, from the mean duration seen so far and the slots that are up.

        Work left (slot-seconds) = every queued experiment at the mean duration plus what the running ones
        have left of it; spread over the slots that are up, and never less than the longest single piece.
        """
        mean = self.mean_duration()
        queued = [name for name, state in self.states.items() if state == State.QUEUED]
        if not queued and not self.running:
            return 0.0
        if mean is None or self.capacity() == 0:
            return None
        left = [max(mean - (now - r.started_at), 0.0) for r in self.running]
        work = sum(self.sizes.get(name, 1) for name in queued) * mean + sum(
            r.size * rest for r, rest in zip(self.running, left))
        return max(work / self.capacity(), max(left, default=0.0), mean if queued else 0.0)


class LiveView:
    """A scheduler observer that keeps a `LiveState`; thread-safe (written by the dispatcher, read by rich).

    `pending`: states in the snapshot that the runner is about to queue again (a resume re-queues interrupted
    attempts, and those a dead runner left running; `--retry-failed` failed and timed-out ones too).
    `added`: experiments a resume adds. `retries`: the runner's retries of transient failures, so that such a
    failure shows as queued again rather than failed.
    """

    label = "the live view"

    def __init__(self, snap: Snapshot, *, default_timeout: float | None = None, retries: int = 1,
                 pending: Iterable[str] = (), added: Sequence = (),
                 clock: Callable[[], float] = time.time):
        self._lock = threading.Lock()
        self._clock = clock
        self._default_timeout = default_timeout
        self._retries = retries
        self._sweep, self._metric, self._minimize = snap.name, snap.metric.name, snap.metric.minimize
        self._slots = {h: tuple(ids) for h, ids in snap.meta.slots.items()}
        self._sizes = {e.name: e.num_gpus * e.num_nodes for e in snap.experiments.values()}
        self._order = {name: i for i, name in enumerate(snap.experiments)}
        self._states: dict[str, str] = {}
        self._running: dict[tuple[str, int], Running] = {}
        self._down: set[str] = set()
        self._durations: list[float] = []
        self._retried: dict[str, int] = {}
        pending = set(pending)
        for a in snap.attempts:
            if a.state in pending:
                self._states[a.name] = State.QUEUED
                continue
            self._states[a.name] = a.state
            if a.state == State.RUNNING:
                self._running[(a.name, a.attempt)] = Running(
                    a.name, a.attempt, {h: tuple(ids) for h, ids in a.slots.items()},
                    a.started_at if a.started_at is not None else clock(), self._timeout(snap.experiments.get(a.name)))
            elif a.state in _TIMED_STATES and a.duration is not None:
                self._durations.append(a.duration)
        for e in added:
            self._states[e.name] = State.QUEUED
            self._order.setdefault(e.name, len(self._order))
            self._sizes[e.name] = e.num_gpus * e.num_nodes
        best = snap.best
        self._best = (best.name, best.metric) if best is not None and best.metric is not None else None
        self._since = clock()

    def _timeout(self, experiment) -> float | None:
        return (experiment.timeout if experiment is not None else None) or self._default_timeout

    # --- fed by the scheduler --------------------------------------------------------------------------------
    def __call__(self, what: str, subject, outcome: Outcome | None) -> None:
        now = self._clock()
        with self._lock:
            if what in ("started", ADOPTED):
                self._started(subject, now)
            elif what == "finished":
                self._finished(subject, outcome, now)
            elif what == HOST_DOWN:  # subject: the host's name
                self._down.add(str(subject))
            elif what == HOST_UP:
                self._down.discard(str(subject))

    def _started(self, run, now: float) -> None:
        name = run.experiment.name
        self._states[name] = State.RUNNING
        self._sizes[name] = run.experiment.num_gpus * run.experiment.num_nodes
        self._running[(name, run.attempt)] = Running(name, run.attempt, {h: tuple(ids) for h, ids in
                                                                          run.reservation.slots},
                                                     now, self._timeout(run.experiment))

    def _finished(self, subject, outcome: Outcome, now: float) -> None:
        name = subject.experiment.name
        started = self._running.pop((name, subject.attempt), None)
        state = outcome.state
        if started is not None and state in _TIMED_STATES:
            self._durations.append(max(now - started.started_at, 0.0))
        # What the scheduler queues again at once: a run of a lost host, and a transient failure while the
        # experiment has retries left (counted per experiment, as the scheduler counts them).
        retry = state == State.FAILED and outcome.transient and self._retried.get(name, 0) < self._retries
        if started is not None and (retry or state == State.INTERRUPTED and outcome.reason == Reason.LOST):
            self._retried[name] = self._retried.get(name, 0) + retry
            state = State.QUEUED
        self._states[name] = state
        value = outcome.metrics.get(self._metric) if outcome.state == State.SUCCEEDED and outcome.metrics else None
        if value is not None and (self._best is None or self._better(name, float(value), *self._best)):
            self._best = (name, float(value))

    def _better(self, name: str, value: float, best_name: str, best_value: float) -> bool:
        """As the report ranks: by the metric, ties to the experiment earlier in the sweep."""
        if value != best_value:
            return value < best_value if self._minimize else value > best_value
        return self._order.get(name, len(self._order)) < self._order.get(best_name, len(self._order))

    def mark_down(self, host: str) -> None:
        self(HOST_DOWN, host, None)

    def mark_up(self, host: str) -> None:
        self(HOST_UP, host, None)

    # --- read by the display -----------------------------------------------------------------------------
    def state(self) -> LiveState:
        with self._lock:
            return LiveState(self._sweep, self._metric, self._minimize, dict(self._slots), dict(self._states),
                             dict(self._sizes), tuple(sorted(self._running.values(), key=lambda r: r.started_at)),
                             frozenset(self._down), self._best, tuple(self._durations), self._since)

    def __rich__(self):
        return render(self.state(), self._clock())


def seconds(value: float | None) -> str:
    """A duration the way a person reads it: 42s, 3m05s, 2h07m."""
    if value is None:
        return "?"
    value = max(int(round(value)), 0)
    if value < 60:
        return f"{value}s"
    if value < 3600:
        return f"{value // 60}m{value % 60:02d}s"
    return f"{value // 3600}h{value % 3600 // 60:02d}m"


def running_keys(state: LiveState) -> dict[tuple[str, int], str]:
    """A one-character key per running experiment, shown in its slots and in the running list."""
    return {(r.name, r.attempt): (_KEYS[i] if i < len(_KEYS) else "#") for i, r in enumerate(state.running)}


def render(state: LiveState, now: float):
    """The live view of `state` at time `now`: a rich renderable (pure: same inputs, same picture)."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    counts = state.counts()
    failed = counts.get(State.FAILED, 0) + counts.get(State.TIMED_OUT, 0)
    head = Text()
    for label, n, style in (("done", counts.get(State.SUCCEEDED, 0), "green"), ("failed", failed, "red"),
                            ("running", counts.get(State.RUNNING, 0), "cyan"), ("queued", counts.get(State.QUEUED, 0), "")):
        head.append(f"{n} {label}", style=style if n else "dim")
        head.append("   ")
    for label in (State.CANCELLED, State.INTERRUPTED):
        if counts.get(label):
            head.append(f"{counts[label]} {label}   ", style="yellow")
    head.append(f"of {len(state.states)}")
    eta = state.eta(now)
    mean = state.mean_duration()
    timing = Text(f"elapsed {seconds(now - state.since) if state.since is not None else '?'}   ")
    if eta is None:
        timing.append("ETA ? (no run has ended yet)" if mean is None else "ETA ? (no slot is up)", style="dim")
    else:
        timing.append("ETA < 1s" if eta < 1 and (state.running or counts.get(State.QUEUED)) else f"ETA ~{seconds(eta)}",
                      style="bold")
        if mean is not None:
            timing.append(f" (mean run {seconds(mean)} over {len(state.durations)})", style="dim")
    direction = "lower is better" if state.minimize else "higher is better"
    best = Text("best so far: ")
    if state.best is None:
        best.append("none yet", style="dim")
    else:
        best.append(state.best[0], style="bold green")
        best.append(f"  {state.metric} {format_value(state.best[1])}")

    keys = running_keys(state)
    owner: dict[tuple[str, int], tuple[str, int]] = {}
    for r in state.running:
        for host, ids in r.slots.items():
            for i in ids:
                owner[(host, i)] = (r.name, r.attempt)
    nodes = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
    nodes.add_column("node")
    nodes.add_column("slots")
    nodes.add_column("busy", justify="right")
    hosts = list(state.slots)
    for host in hosts[:MAX_NODE_ROWS]:
        ids = state.slots[host]
        cells = Text()
        busy = 0
        for i in ids:
            if host in state.down:
                cells.append("x", style="bold red")
            elif (host, i) in owner:
                busy += 1
                cells.append(keys[owner[(host, i)]], style="bold black on cyan")
            else:
                cells.append(".", style="dim")
            cells.append(" ")
        nodes.add_row(host, cells, Text("down", style="red") if host in state.down else f"{busy}/{len(ids)}")
    if len(hosts) > MAX_NODE_ROWS:
        nodes.add_row(f"... {len(hosts) - MAX_NODE_ROWS} more nodes", "", "")

    parts = [head, timing, best, Text(""), nodes]
    if state.running:
        table = Table(box=None, header_style="bold", pad_edge=False)
        for column, justify in (("", "left"), ("running", "left"), ("try", "right"), ("on", "left"),
                                ("elapsed", "right"), ("timeout", "right")):
            table.add_column(column, justify=justify)
        for r in state.running[:MAX_RUNNING_ROWS]:
            elapsed = now - r.started_at
            late = r.timeout is not None and elapsed > 0.8 * r.timeout
            where = "@".join(f"{h}:{','.join(map(str, ids))}" for h, ids in r.slots.items())
            table.add_row(Text(keys[(r.name, r.attempt)], style="bold black on cyan"), r.name, str(r.attempt),
                          where, Text(seconds(elapsed), style="yellow" if late else ""),
                          seconds(r.timeout) if r.timeout is not None else "none")
        if len(state.running) > MAX_RUNNING_ROWS:
            table.add_row("", f"... {len(state.running) - MAX_RUNNING_ROWS} more", "", "", "", "")
        parts += [Text(""), table]
    return Panel(Group(*parts), title=f"sweep {state.sweep}: {state.metric} ({direction})", title_align="left",
                 expand=False)


# --- the event stream ----------------------------------------------------------------------------------------
def event_record(what: str, subject, outcome: Outcome | None, metric: str, at: float) -> dict:
    """One event as a JSON-ready dict: what, the attempt, where it ran, how it ended, when."""
    name, attempt = subject.experiment.name, subject.attempt
    record = {"event": what, "timestamp": round(at, 6),
              "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(at)) + f".{int(at % 1 * 1000):03d}",
              "name": name, "attempt": attempt, "slots": _slots_of(subject)}
    if what in ("started", ADOPTED):
        return record | {"state": State.RUNNING, "reason": None, "detail": None, "metric": None, "metrics": {}}
    metrics = dict(outcome.metrics or {}) if outcome is not None else {}
    return record | {"state": outcome.state if outcome is not None else State.CANCELLED,
                     "reason": outcome.reason if outcome is not None else None,
                     "detail": outcome.detail if outcome is not None else None,
                     "metric": metrics.get(metric), "metrics": metrics}


class EventLog:
    """A scheduler observer that appends one JSON line per event to a file, flushed at once."""

    def __init__(self, path: Path, metric: str, *, clock: Callable[[], float] = time.time):
        self.path = Path(path)
        self.label = f"--events {self.path}"
        self._metric = metric
        self._clock = clock
        self._file: IO[str] = open(self.path, "a", encoding="utf-8")

    def __call__(self, what: str, subject, outcome: Outcome | None) -> None:
        if what == "requeued":
            return
        if what in (HOST_DOWN, HOST_UP):
            at = self._clock()
            record = {"event": what, "timestamp": round(at, 6), "host": str(subject)}
        else:
            record = event_record(what, subject, outcome, self._metric, self._clock())
        self._file.write(json.dumps(record, sort_keys=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


# --- wiring for `autotune run` / `resume` ---------------------------------------------------------------------
def check_events_path(path: Path) -> None:
    """Fail before anything is created when the events file cannot be written.

    Proven by writing, since permission bits say nothing to root and /dev/full or a full disk open fine and
    fail on write: a regular file takes one byte that is then truncated away (a file made for the test is
    removed again); a device or terminal takes an empty write. A FIFO or socket is left alone: opening it
    would wait for a reader, and closing it could end that reader's input.
    """
    import stat

    from .errors import UserError

    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise UserError(f"cannot write the --events file: {e.strerror or e}", path) from None
    if mode is not None and stat.S_ISDIR(mode):
        raise UserError("is a directory; --events wants a file", path)
    if mode is None and not (path.parent if str(path.parent) else Path(".")).is_dir():
        raise UserError("no such directory for the --events file", path)
    if mode is not None and (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        if not os.access(path, os.W_OK):
            raise UserError("cannot write the --events file here", path)
        return
    try:
        _write_probe(path, regular=mode is None or stat.S_ISREG(mode), created=mode is None)
    except OSError as e:
        raise UserError(f"cannot write the --events file: {e.strerror or e}", path) from None


def _write_probe(path: Path, *, regular: bool, created: bool) -> None:
    """Write to `path` and take the write back (see `check_events_path`)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOCTTY | os.O_NONBLOCK, 0o666)
    try:
        if not regular:
            os.write(fd, b"")
            return
        size = os.fstat(fd).st_size
        try:
            os.write(fd, b"\n")
            os.fsync(fd)  # a full disk may take the byte into the page cache and refuse it here
        finally:
            os.ftruncate(fd, size)
    finally:
        os.close(fd)
        if created:
            path.unlink(missing_ok=True)


@contextmanager
def watching(directory: Path, observers: list, *, live: bool = False, plain=None, events: Path | None = None,
             default_timeout: float | None = None, retries: int = 1, retry_failed: bool = False,
             added: Sequence = (), console=None):
    """Add the observers a run is watched with to `observers` for the duration of the block: the event log
    when `events` names a file; the live view (drawn with rich.live) when `live`, else `plain` if given."""
    from .report import snapshot

    directory = Path(directory)
    snap = snapshot(directory) if live or events is not None else None
    log = EventLog(Path(events), snap.metric.name) if events is not None else None
    display = None
    if log is not None:
        observers.append(log)
    if live:
        from rich.live import Live

        pending = {State.RUNNING, State.INTERRUPTED} | ({State.FAILED, State.TIMED_OUT} if retry_failed else set())
        view = LiveView(snap, default_timeout=default_timeout, retries=retries, pending=pending, added=added)
        observers.append(view)
        display = Live(view, console=console, refresh_per_second=4, transient=False, redirect_stderr=False)
        display.start()
    elif plain is not None:
        observers.append(plain)
    try:
        yield
    finally:
        if display is not None:
            _quietly(display.stop)
        if log is not None:
            _quietly(log.close)


def _quietly(close: Callable[[], None]) -> None:
    """An output that failed was left out with a note (see `Scheduler._tell`): closing it, which fails again
    (a line still buffered for the full disk, the closed terminal), must not replace the sweep's result."""
    try:
        close()
    except OSError:
        pass
