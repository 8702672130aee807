"""Watching a sweep as it runs on a terminal: a live panel of counts, slots, what runs, the failures as they
come, the best so far, an ETA (and, once it ends, how long it took).

`LiveView` is a scheduler observer (see `events` for what it is told). It starts from a `Snapshot` of the
sweep (its counts, slots and results so far) and keeps a small state up to date; it only records what it is
told and never waits, sleeps or reads the clock on its own. Its `LiveState` (livestate.py) is drawn by
`panel.render`, a pure function; the ETA is re-planned by `eta.Eta`. `rich.live.Live(view)` redraws it: the
view is a rich renderable itself. `watching` wires the views a run is watched with.

A run keeps its one-character key (in its slots and in the running list) for as long as it runs, so a person
can follow it with the eye; a key is given again only once its run has ended.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

from ..core.outcome import Outcome
from ..ledger.store import Ledger
from ..spec import Experiment
from ..spec.metrics import metric_named
from ..states import State
from .eta import Eta
from .events import (
    ADOPTED,
    FINISHED,
    HOST_DOWN,
    HOST_UP,
    PROGRESS,
    REQUEUED,
    STARTED,
    STOPPING,
    EventLog,
    PlainPrinter,
    one_line,
)
from .livestate import Failure, LiveState, Running, SearchState
from .panel import render
from .snapshot import Snapshot, snapshot

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from ..core.events import Queued, Run

# States whose duration says how long an experiment takes (cancelled, interrupted and stopped runs were cut short).
_TIMED_STATES = (State.SUCCEEDED, State.FAILED, State.TIMED_OUT)
_KEYS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
MAX_FAILURE_ROWS = 5  # the most recent failures shown; the counts hold them all, the report every reason

# The view's clocks show whole seconds: 2 frames a second keep them current, at half the cost of rich's 4 (a frame
# of a busy sweep is 6 ms of CPU, taken in the GIL from the dispatcher's thread).
FRAMES_PER_SECOND = 2


# --- the live view -------------------------------------------------------------------------------------------
class LiveView:
    """A scheduler observer that keeps a `LiveState`; thread-safe (written by the dispatcher, read by rich).

    `pending`: states in the snapshot that the runner is about to queue again (a resume re-queues interrupted
    attempts, and those a dead runner left running; `--retry-failed` failed and timed-out ones too).
    `added`: experiments a resume adds. An attempt the scheduler queues again at once (a lost host, a transient
    failure with retries left) shows as queued: the scheduler says so ("requeued"); the view never guesses.
    """

    label = "the live view"

    def __init__(self, snap: Snapshot, *, default_timeout: float | None = None,
                 pending: Iterable[str] = (), added: Sequence[Experiment] = (),
                 clock: Callable[[], float] = time.time):
        self._lock = threading.Lock()
        self._clock = clock
        self._default_timeout = default_timeout
        self._sweep, self._metric = snap.name, snap.metric
        self._slots = {h: tuple(ids) for h, ids in snap.slots.items()}
        self._sizes = {e.name: e.num_gpus * e.num_nodes for e in snap.experiments.values()}
        self._order = {name: i for i, name in enumerate(snap.experiments)}
        self._states: dict[str, str] = {}
        self._running: dict[tuple[str, int], Running] = {}
        self._held: set[str] = set()  # the keys running runs hold
        self._down: set[str] = set()
        self._durations: list[float] = []
        self._failures: deque[Failure] = deque(maxlen=MAX_FAILURE_ROWS)
        self._failures_seen = 0
        self._stopping: str | None = None
        self._ended: float | None = None
        self._experiments = dict(snap.experiments)
        meta = snap.meta
        self._eta = Eta(meta, default_timeout)
        self._search = _search_of(meta.search)
        self._changes = 0  # observer calls so far: a new plan is due when it moved
        requeued = set(pending)
        failed = []
        for a in snap.attempts:
            if a.state in requeued:
                self._states[a.name] = State.QUEUED
                continue
            self._states[a.name] = a.state
            if a.state == State.RUNNING:
                self._running[(a.name, a.attempt)] = Running(
                    a.name, a.attempt, {h: tuple(ids) for h, ids in a.slots.items()},
                    a.started_at if a.started_at is not None else clock(), self._timeout(snap.experiments.get(a.name)))
            elif a.state in _TIMED_STATES and a.duration is not None:
                self._durations.append(a.duration)
            if a.state in (State.FAILED, State.TIMED_OUT):
                failed.append(a)
        for r in sorted(self._running.values(), key=lambda r: r.started_at):  # keys in the order they started
            self._running[(r.name, r.attempt)] = replace(r, key=self._free_key())
        for a in sorted(failed, key=lambda a: a.finished_at or 0.0):  # the latest last, as they would have come
            self._failed(Failure(a.name, a.attempt, a.state, a.reason, a.detail))
        for e in added:
            self._experiments[e.name] = e
            self._states[e.name] = State.QUEUED
            self._order.setdefault(e.name, len(self._order))
            self._sizes[e.name] = e.num_gpus * e.num_nodes
        best = snap.best
        self._best = (best.name, best.metric) if best is not None and best.metric is not None else None
        self._since = clock()

    def _timeout(self, experiment: Experiment | None) -> float | None:
        return (experiment.timeout if experiment is not None else None) or self._default_timeout

    def _free_key(self) -> str:
        """The first key no running run holds, now held; "#" once all are taken. A run keeps its key until it
        ends (`_finished` gives it back)."""
        key = next((k for k in _KEYS if k not in self._held), "#")
        self._held.add(key)
        return key

    # --- fed by the scheduler --------------------------------------------------------------------------------
    def __call__(self, what: str, subject: Run | Queued | str, outcome: Outcome | None) -> None:
        now = self._clock()
        with self._lock:
            self._changes += 1
            if what == STOPPING:
                if outcome is not None and self._stopping is None:
                    self._stopping = one_line(outcome.detail or str(outcome.state))
            elif isinstance(subject, str):  # a host event
                if what == HOST_DOWN:
                    self._down.add(subject)
                elif what == HOST_UP:
                    self._down.discard(subject)
            elif what in (STARTED, ADOPTED):
                self._started(cast("Run", subject), now)
            elif what == FINISHED and outcome is not None:
                self._finished(subject, outcome, now)
            elif what == PROGRESS and outcome is not None and outcome.measured is not None:
                key = (subject.experiment.name, subject.attempt)
                if key in self._running:
                    self._running[key] = replace(self._running[key], steps=outcome.measured.steps,
                                                 so_far=outcome.measured.interval)
            elif what == REQUEUED:  # the scheduler queued it again at once (a lost host, a transient failure)
                self._states[subject.experiment.name] = State.QUEUED
                self._requeued(subject.experiment.name)

    def _started(self, run: Run, now: float) -> None:
        name = run.experiment.name
        self._experiments[name] = run.experiment
        self._states[name] = State.RUNNING
        self._sizes[name] = run.experiment.num_gpus * run.experiment.num_nodes
        known = self._running.get((name, run.attempt))  # adopted, and in the snapshot already: same key
        key = known.key if known is not None else self._free_key()
        self._running[(name, run.attempt)] = Running(name, run.attempt, dict(run.reservation.slots), now,
                                                     self._timeout(run.experiment), key)

    def _finished(self, subject: Run | Queued, outcome: Outcome, now: float) -> None:
        name = subject.experiment.name
        started = self._running.pop((name, subject.attempt), None)
        if started is not None:
            self._held.discard(started.key)
        state = outcome.state
        if started is not None and state in _TIMED_STATES:
            self._durations.append(max(now - started.started_at, 0.0))
        self._states[name] = state
        if state in (State.FAILED, State.TIMED_OUT):
            self._failed(Failure(name, subject.attempt, state, outcome.reason, outcome.detail))
        value = outcome.metrics.get(self._metric.name) if outcome.state == State.SUCCEEDED and outcome.metrics else None
        if value is not None and (self._best is None or self._better(name, float(value), *self._best)):
            self._best = (name, float(value))

    def _failed(self, failure: Failure) -> None:
        self._failures.append(failure)
        self._failures_seen += 1

    def _requeued(self, name: str) -> None:
        """Its latest failure, if listed, is marked: it runs again (right after its "finished", as told)."""
        for i in range(len(self._failures) - 1, -1, -1):
            if self._failures[i].name == name:
                if not self._failures[i].again:
                    self._failures[i] = replace(self._failures[i], again=True)
                return

    def _better(self, name: str, value: float, best_name: str, best_value: float) -> bool:
        """As the report ranks: by the metric, ties to the experiment earlier in the sweep."""
        if value != best_value:
            return self._metric.better(value, best_value)
        return self._order.get(name, len(self._order)) < self._order.get(best_name, len(self._order))

    def end(self) -> None:
        """The watched run returned: the clock stops, and the last frame says how long it took."""
        with self._lock:
            if self._ended is None:
                self._ended = self._clock()

    # --- read by the display -----------------------------------------------------------------------------
    def state(self) -> LiveState:
        now = self._clock()
        with self._lock:
            state = LiveState(self._sweep, self._metric, dict(self._slots), dict(self._states), dict(self._sizes),
                              tuple(sorted(self._running.values(), key=lambda r: r.started_at)),
                              frozenset(self._down), self._best, tuple(self._durations), self._since,
                              failures=tuple(self._failures), failures_seen=self._failures_seen,
                              stopping=self._stopping, ended=self._ended, search=self._search)
            changes = self._changes
        if not state.left or state.stopping is not None or state.ended is not None or state.search is not None:
            return state  # nothing to plan: no ETA is shown
        return replace(state, planned_end=self._eta.planned_end(state, now, changes, self._experiments, self._order))

    def __rich__(self) -> RenderableType:
        state = self.state()
        return render(state, state.ended if state.ended is not None else self._clock())


def _search_of(recorded: Mapping[str, object] | None) -> SearchState | None:
    """The search of a sweep's meta (search.SearchSpec as JSON), as the view shows it."""
    if recorded is None:
        return None
    trials = recorded.get("trials")
    return SearchState(str(recorded.get("tuner", "gridsearch")), trials if isinstance(trials, int) else None)


# --- wiring for `autotune run` / `resume` ---------------------------------------------------------------------
@contextmanager
def watching(directory: Path, observers: list[Callable[..., None]], *, live: bool = False, plain: bool = False,
             events: Path | None = None, default_timeout: float | None = None,
             retry_failed: bool = False, added: Sequence[Experiment] = (),
             console: Console | None = None) -> Iterator[None]:
    """Add the observers a run is watched with to `observers` for the duration of the block: the event log
    when `events` names a file; the live view (drawn with rich.live) when `live`, else one plain line per
    event when `plain`. When the block ends, the live view draws its last frame: how long the run took."""
    log, display, view = None, None, None
    before = len(observers)
    if live or events is not None:
        snap = snapshot(Path(directory))
        if events is not None:
            log = EventLog(Path(events), snap.metric.name)
            observers.append(log)
        if live:
            from rich.live import Live

            pending = {State.RUNNING, State.INTERRUPTED} | ({State.FAILED, State.TIMED_OUT} if retry_failed else set())
            view = LiveView(snap, default_timeout=default_timeout, pending=pending, added=added)
            observers.append(view)
            display = Live(view, console=console, refresh_per_second=FRAMES_PER_SECOND, transient=False,
                           redirect_stderr=False)
            display.start()
    if plain and not live:
        observers.append(PlainPrinter(_metric_of(Path(directory))))
    ours = observers[before:]
    try:
        yield
    finally:
        observers[:] = [o for o in observers if not any(o is mine for mine in ours)]  # the caller's, as it was
        if view is not None:
            view.end()
        if display is not None:
            _quietly(display.stop)
        if log is not None:
            _quietly(log.close)


def _metric_of(directory: Path) -> str:
    """The sweep's metric, read from its ledger alone (the plain lines need nothing else)."""
    with Ledger.open(directory) as ledger:
        return metric_named(ledger.meta().metric).name


def _quietly(close: Callable[[], None]) -> None:
    """An output that failed was left out with a note (see `Scheduler._tell`): closing it, which fails again
    (a line still buffered for the full disk, the closed terminal), must not replace the sweep's result."""
    with suppress(OSError):
        close()
