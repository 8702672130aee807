"""Watching a sweep as it runs on a terminal: a live panel of counts, slots, what runs, the best so far, an ETA.

`LiveView` is a scheduler observer (see `events` for what it is told). It starts from a `Snapshot` of the
sweep (its counts, slots and results so far) and keeps a small state up to date; it only records what it is
told and never waits, sleeps or reads the clock on its own. `render(state, now)` turns that state into a rich
renderable and is a pure function, so a test prints it into a recording Console. `rich.live.Live(view)`
redraws it: the view is a rich renderable itself. `watching` wires the views a run is watched with.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

from ..metrics import Metric, format_value
from ..outcome import Outcome
from ..spec import Experiment
from ..states import State
from .events import ADOPTED, FINISHED, HOST_DOWN, HOST_UP, REQUEUED, STARTED, EventLog, PlainPrinter
from .snapshot import Snapshot, count_states, format_slots, snapshot

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from ..core.events import Queued, Run

# States whose duration says how long an experiment takes (cancelled and interrupted runs were cut short).
_TIMED_STATES = (State.SUCCEEDED, State.FAILED, State.TIMED_OUT)
_KEYS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
MAX_RUNNING_ROWS = 24
REPLAN_SECONDS = 5.0
MAX_NODE_ROWS = 32


# --- the live view -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Running:
    """A run the live view shows: where, since when, and its timeout (None: no limit)."""

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
    metric: Metric
    slots: Mapping[str, tuple[int, ...]]  # host -> the slot ids the sweep may use
    states: Mapping[str, str]  # experiment -> state of its latest attempt
    sizes: Mapping[str, int]  # experiment -> slots it takes
    running: tuple[Running, ...] = ()  # oldest first
    down: frozenset[str] = frozenset()
    best: tuple[str, float] | None = None
    durations: tuple[float, ...] = ()  # seconds, of the runs that ended (succeeded, failed, timed out)
    since: float | None = None  # when the view began
    planned_end: float | None = None  # when the sweep is expected to end, re-planned (see `LiveView.state`)

    def counts(self) -> dict[str, int]:
        return count_states(self.states.values())

    def capacity(self) -> int:
        return sum(len(ids) for host, ids in self.slots.items() if host not in self.down)

    def mean_duration(self) -> float | None:
        return sum(self.durations) / len(self.durations) if self.durations else None

    def eta(self, now: float) -> float | None:
        """Seconds until the sweep ends, as last re-planned; None: nothing to go on yet, or no slot is up."""
        if not self.running and not any(state == State.QUEUED for state in self.states.values()):
            return 0.0
        if self.planned_end is None or self.capacity() == 0:
            return None
        return max(self.planned_end - now, 0.0)


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
        self._down: set[str] = set()
        self._durations: list[float] = []
        self._experiments = dict(snap.experiments)
        self._changes = 0  # observer calls so far: a new plan is due when it moved
        self._planned: tuple[int, float, float | None] | None = None  # (changes, valid until, planned end)
        requeued = set(pending)
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

    # --- fed by the scheduler --------------------------------------------------------------------------------
    def __call__(self, what: str, subject: Run | Queued | str, outcome: Outcome | None) -> None:
        now = self._clock()
        with self._lock:
            self._changes += 1
            if isinstance(subject, str):  # a host event
                if what == HOST_DOWN:
                    self._down.add(subject)
                elif what == HOST_UP:
                    self._down.discard(subject)
            elif what in (STARTED, ADOPTED):
                self._started(cast("Run", subject), now)
            elif what == FINISHED and outcome is not None:
                self._finished(subject, outcome, now)
            elif what == REQUEUED:  # the scheduler queued it again at once (a lost host, a transient failure)
                self._states[subject.experiment.name] = State.QUEUED

    def _started(self, run: Run, now: float) -> None:
        name = run.experiment.name
        self._experiments[name] = run.experiment
        self._states[name] = State.RUNNING
        self._sizes[name] = run.experiment.num_gpus * run.experiment.num_nodes
        self._running[(name, run.attempt)] = Running(name, run.attempt, dict(run.reservation.slots), now,
                                                     self._timeout(run.experiment))

    def _finished(self, subject: Run | Queued, outcome: Outcome, now: float) -> None:
        name = subject.experiment.name
        started = self._running.pop((name, subject.attempt), None)
        state = outcome.state
        if started is not None and state in _TIMED_STATES:
            self._durations.append(max(now - started.started_at, 0.0))
        self._states[name] = state
        value = outcome.metrics.get(self._metric.name) if outcome.state == State.SUCCEEDED and outcome.metrics else None
        if value is not None and (self._best is None or self._better(name, float(value), *self._best)):
            self._best = (name, float(value))

    def _better(self, name: str, value: float, best_name: str, best_value: float) -> bool:
        """As the report ranks: by the metric, ties to the experiment earlier in the sweep."""
        if value != best_value:
            return self._metric.better(value, best_value)
        return self._order.get(name, len(self._order)) < self._order.get(best_name, len(self._order))

    # --- read by the display -----------------------------------------------------------------------------
    def state(self) -> LiveState:
        now = self._clock()
        with self._lock:
            state = LiveState(self._sweep, self._metric, dict(self._slots), dict(self._states), dict(self._sizes),
                              tuple(sorted(self._running.values(), key=lambda r: r.started_at)),
                              frozenset(self._down), self._best, tuple(self._durations), self._since)
            changes, planned = self._changes, self._planned
        if planned is not None and planned[0] == changes and now < planned[1]:
            return replace(state, planned_end=planned[2])
        started = time.perf_counter()
        end = self._replan(state, now)
        cost = time.perf_counter() - started
        with self._lock:  # valid until the next event, or until the runs have aged a while (10x its cost at least)
            self._planned = (changes, now + max(REPLAN_SECONDS, 10 * cost), end)
        return replace(state, planned_end=end)

    def _replan(self, state: LiveState, now: float) -> float | None:
        """When the sweep should end: what waits and what runs re-planned on the scheduler's own policies
        (plan.time_left). Done outside the lock: the dispatcher never waits for it."""
        from ..plan import Ongoing, time_left

        known = self._experiments
        queued = sorted((name for name, s in state.states.items() if s == State.QUEUED and name in known),
                        key=lambda name: self._order.get(name, len(self._order)))
        running = [Ongoing(known[r.name], r.slots, max(0.0, now - r.started_at))
                   for r in state.running if r.name in known]
        left = time_left(state.slots, [known[name] for name in queued], running, state.durations,
                         down=sorted(state.down), timeout=self._default_timeout)
        return None if left is None else now + left

    def __rich__(self) -> RenderableType:
        return render(self.state(), self._clock())


def seconds(value: float | None) -> str:
    """A duration the way a person reads it: 42s, 3m05s, 2h07m."""
    if value is None:
        return "?"
    value = max(round(value), 0)
    if value < 60:
        return f"{value}s"
    if value < 3600:
        return f"{value // 60}m{value % 60:02d}s"
    return f"{value // 3600}h{value % 3600 // 60:02d}m"


def _running_keys(state: LiveState) -> dict[tuple[str, int], str]:
    """A one-character key per running experiment, shown in its slots and in the running list."""
    return {(r.name, r.attempt): (_KEYS[i] if i < len(_KEYS) else "#") for i, r in enumerate(state.running)}


def render(state: LiveState, now: float) -> RenderableType:
    """The live view of `state` at time `now`: a rich renderable (pure: same inputs, same picture)."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    counts = state.counts()
    failed = counts.get(State.FAILED, 0) + counts.get(State.TIMED_OUT, 0)
    head = Text()
    for label, n, style in (("done", counts.get(State.SUCCEEDED, 0), "green"), ("failed", failed, "red"),
                            ("running", counts.get(State.RUNNING, 0), "cyan"),
                            ("queued", counts.get(State.QUEUED, 0), "")):
        head.append(f"{n} {label}", style=style if n else "dim")
        head.append("   ")
    for stopped in (State.CANCELLED, State.INTERRUPTED):
        if counts.get(stopped):
            head.append(f"{counts[stopped]} {stopped}   ", style="yellow")
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
    best = Text("best so far: ")
    if state.best is None:
        best.append("none yet", style="dim")
    else:
        best.append(state.best[0], style="bold green")
        best.append(f"  {state.metric.name} {format_value(state.best[1])}")

    keys = _running_keys(state)
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

    parts: list[RenderableType] = [head, timing, best, Text(""), nodes]
    if state.running:
        table = Table(box=None, header_style="bold", pad_edge=False)
        for column, right in (("", False), ("running", False), ("try", True), ("on", False), ("elapsed", True),
                              ("timeout", True)):
            table.add_column(column, justify="right" if right else "left")
        for r in state.running[:MAX_RUNNING_ROWS]:
            elapsed = now - r.started_at
            late = r.timeout is not None and elapsed > 0.8 * r.timeout
            table.add_row(Text(keys[(r.name, r.attempt)], style="bold black on cyan"), r.name, str(r.attempt),
                          format_slots(r.slots), Text(seconds(elapsed), style="yellow" if late else ""),
                          seconds(r.timeout) if r.timeout is not None else "none")
        if len(state.running) > MAX_RUNNING_ROWS:
            table.add_row("", f"... {len(state.running) - MAX_RUNNING_ROWS} more", "", "", "", "")
        parts += [Text(""), table]
    return Panel(Group(*parts), title=f"sweep {state.sweep}: {state.metric.name} ({state.metric.direction})",
                 title_align="left", expand=False)


# --- wiring for `autotune run` / `resume` ---------------------------------------------------------------------
@contextmanager
def watching(directory: Path, observers: list[Callable[..., None]], *, live: bool = False, plain: bool = False,
             events: Path | None = None, default_timeout: float | None = None,
             retry_failed: bool = False, added: Sequence[Experiment] = (),
             console: Console | None = None) -> Iterator[None]:
    """Add the observers a run is watched with to `observers` for the duration of the block: the event log
    when `events` names a file; the live view (drawn with rich.live) when `live`, else one plain line per
    event when `plain`."""
    log, display = None, None
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
            display = Live(view, console=console, refresh_per_second=4, transient=False, redirect_stderr=False)
            display.start()
    if plain and not live:
        observers.append(PlainPrinter())
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
    with suppress(OSError):
        close()
