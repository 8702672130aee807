"""Watching a sweep as it runs on a terminal: a live panel of counts, slots, what runs, the failures as they
come, the best so far, an ETA (and, once it ends, how long it took).

`LiveView` is a scheduler observer (see `events` for what it is told). It starts from a `Snapshot` of the
sweep (its counts, slots and results so far) and keeps a small state up to date; it only records what it is
told and never waits, sleeps or reads the clock on its own. `render(state, now)` turns that state into a rich
renderable and is a pure function, so a test prints it into a recording Console. `rich.live.Live(view)`
redraws it: the view is a rich renderable itself. `watching` wires the views a run is watched with.

A run keeps its one-character key (in its slots and in the running list) for as long as it runs, so a person
can follow it with the eye; a key is given again only once its run has ended.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ..core.resources import devices_from_json, placement_named
from ..metrics import Metric, format_value, metric_named
from ..outcome import Outcome
from ..spec import Experiment
from ..states import State
from .events import ADOPTED, FINISHED, HOST_DOWN, HOST_UP, REQUEUED, STARTED, STOPPING, EventLog, PlainPrinter, one_line
from .snapshot import Snapshot, count_states, format_slots, snapshot

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.text import Text

    from ..core.events import Queued, Run

# States whose duration says how long an experiment takes (cancelled and interrupted runs were cut short).
_TIMED_STATES = (State.SUCCEEDED, State.FAILED, State.TIMED_OUT)
_KEYS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
MAX_RUNNING_ROWS = 24
MAX_FAILURE_ROWS = 5  # the most recent failures shown; the counts hold them all, the report every reason
MAX_DETAIL = 160  # characters of a failure's reason shown (the line is cut to the terminal's width as well)
REPLAN_SECONDS = 5.0
REPLAN_SHARE = 30  # the ETA's re-planning takes at most 1/30 of the time the view is shown
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
    key: str = "#"  # its one character in the slots and the running list, kept while it runs

    @property
    def size(self) -> int:
        return sum(len(ids) for ids in self.slots.values())


@dataclass(frozen=True)
class Failure:
    """A run that failed or timed out, listed as it happens: name, attempt, why (as the ledger records it)."""

    name: str
    attempt: int
    state: str
    reason: str | None
    detail: str | None
    again: bool = False  # the scheduler queued it again (a transient failure with retries left)


@dataclass(frozen=True)
class Search:
    """A sweep whose experiments a search proposes (`autotune tune`): how many it has proposed is no total, and
    an ETA of them would be one of the search's present step only."""

    tuner: str
    trials: int | None  # at most this many experiments, where the config sets a budget


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
    failures: tuple[Failure, ...] = ()  # the most recent, oldest first
    failures_seen: int = 0  # failures told since the view began (and found in the snapshot)
    stopping: str | None = None  # why the sweep winds down (Ctrl-C, a cancel of all of it, its deadline)
    ended: float | None = None  # when the watched run returned (`LiveView.end`): the last frame's clock
    search: Search | None = None  # `autotune tune`'s: its experiments are proposed as runs end

    @property
    def left(self) -> bool:
        """Something still runs or waits."""
        return bool(self.running) or any(state == State.QUEUED for state in self.states.values())

    def counts(self) -> dict[str, int]:
        return count_states(self.states.values())

    def capacity(self) -> int:
        return sum(len(ids) for host, ids in self.slots.items() if host not in self.down)

    def mean_duration(self) -> float | None:
        return sum(self.durations) / len(self.durations) if self.durations else None

    def eta(self, now: float) -> float | None:
        """Seconds until the sweep ends, as last re-planned; None: nothing to go on yet, no slot is up, or the
        sweep is stopping (what it would have run is no guide to when it stops)."""
        if not self.left:
            return 0.0
        if self.stopping is not None or self.planned_end is None or self.capacity() == 0:
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
        self._held: set[str] = set()  # the keys running runs hold
        self._down: set[str] = set()
        self._durations: list[float] = []
        self._failures: deque[Failure] = deque(maxlen=MAX_FAILURE_ROWS)
        self._failures_seen = 0
        self._stopping: str | None = None
        self._ended: float | None = None
        self._experiments = dict(snap.experiments)
        meta = snap.meta
        self._placement = placement_named(meta.placement or "pack", {h: (meta.gpu_types or {}).get(h)
                                                                     for h in self._slots}, meta.gpu_memory,
                                          devices=devices_from_json(meta.devices), slots=meta.slots)
        self._search = _search_of(meta.search)
        self._changes = 0  # observer calls so far: a new plan is due when it moved
        # (changes, valid until, planned end, not re-planned before)
        self._planned: tuple[int, float, float | None, float] | None = None
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
            changes, planned = self._changes, self._planned
        if not state.left or state.stopping is not None or state.ended is not None or state.search is not None:
            return state  # nothing to plan: no ETA is shown
        if planned is not None and now < planned[1] and (planned[0] == changes or now < planned[3]):
            return replace(state, planned_end=planned[2])
        started = time.perf_counter()
        end = self._replan(state, now)
        cost = time.perf_counter() - started
        # Valid until the next event, or until the runs have aged a while (10x its cost at least); and however
        # fast runs end, not planned again within REPLAN_SHARE times its cost: on 8 slots of 0.2 s runs every
        # frame saw an event, and re-planning at every frame cost the runner a tenth of a core.
        with self._lock:
            self._planned = (changes, now + max(REPLAN_SECONDS, 10 * cost), end, now + REPLAN_SHARE * cost)
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
                         down=sorted(state.down), timeout=self._default_timeout, placement=self._placement)
        return None if left is None else now + left

    def __rich__(self) -> RenderableType:
        state = self.state()
        return render(state, state.ended if state.ended is not None else self._clock())


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


def render(state: LiveState, now: float) -> RenderableType:
    """The live view of `state` at time `now`: a rich renderable (pure: same inputs, same picture)."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.text import Text

    best = Text("best so far: ")
    if state.best is None:
        best.append("none yet", style="dim")
    else:
        best.append(state.best[0], style="bold green")
        best.append(f"  {state.metric.name} {format_value(state.best[1])}")
    parts: list[RenderableType] = [_counts(state), _timing(state, now), best, Text(""), _nodes(state)]
    if state.running:
        parts += [Text(""), _running(state, now)]
    if state.failures:
        parts += [Text(""), _failures(state)]
    return Panel(Group(*parts), title=f"sweep {state.sweep}: {state.metric.name} ({state.metric.direction})",
                 title_align="left", expand=False)


def _search_of(recorded: Mapping[str, Any] | None) -> Search | None:
    """The search of a sweep's meta (search.SearchSpec as JSON), as the view shows it."""
    if recorded is None:
        return None
    trials = recorded.get("trials")
    return Search(str(recorded.get("tuner", "gridsearch")), trials if isinstance(trials, int) else None)


def _counts(state: LiveState) -> Text:
    """`4 done   1 failed   2 timed out   3 running   4 queued   of 14`: failed and timed out apart, as the
    final summary counts them."""
    from rich.text import Text

    counts = state.counts()
    head = Text()
    for label, n, style in (("done", counts.get(State.SUCCEEDED, 0), "green"),
                            ("failed", counts.get(State.FAILED, 0), "red"),
                            ("timed out", counts.get(State.TIMED_OUT, 0), "red"),
                            ("running", counts.get(State.RUNNING, 0), "cyan"),
                            ("queued", counts.get(State.QUEUED, 0), "")):
        if n or label != "timed out":
            head.append(f"{n} {label}", style=style if n else "dim")
            head.append("   ")
    for stopped in (State.CANCELLED, State.INTERRUPTED):
        if counts.get(stopped):
            head.append(f"{counts[stopped]} {stopped}   ", style="yellow")
    if state.search is None:
        head.append(f"of {len(state.states)}")
    else:
        budget = f", budget {state.search.trials}" if state.search.trials is not None else ""
        head.append(f"of {len(state.states)} proposed ({state.search.tuner} search{budget})")
    return head


def _timing(state: LiveState, now: float) -> Text:
    """Elapsed and the ETA while the sweep goes on; why it winds down once it stops (no ETA then); at the end,
    the total it took."""
    from rich.text import Text

    total = seconds(now - state.since) if state.since is not None else "?"
    if state.stopping is not None and state.running and state.ended is None:
        timing = Text(f"elapsed {total}   ")
        n = len(state.running)
        timing.append(f"stopping: {state.stopping}; waiting for {n} run{'s' if n > 1 else ''} to end",
                      style="bold yellow")
        return timing
    if state.stopping is not None:
        return Text(f"stopped after {total}: {state.stopping}", style="bold yellow")
    if not state.left:
        return Text(f"finished in {total}", style="bold")
    if state.ended is not None:  # the run returned with work left (held for `resume`, or a fault of the machine)
        return Text(f"ended after {total}", style="bold yellow")
    timing = Text(f"elapsed {total}   ")
    eta, mean = state.eta(now), state.mean_duration()
    if state.search is not None:
        timing.append("ETA ? (the search proposes as runs end)", style="dim")
        if mean is not None:
            timing.append(f" (mean run {seconds(mean)} over {len(state.durations)})", style="dim")
        return timing
    if eta is None:
        timing.append("ETA ? (no run has ended yet)" if mean is None else "ETA ? (no slot is up)", style="dim")
        return timing
    timing.append("ETA < 1s" if eta < 1 else f"ETA ~{seconds(eta)}", style="bold")
    if mean is not None:
        timing.append(f" (mean run {seconds(mean)} over {len(state.durations)})", style="dim")
    return timing


def _nodes(state: LiveState) -> RenderableType:
    """Each node's slots: the key of the run that holds it, `.` free, `x` down."""
    from rich.table import Table
    from rich.text import Text

    owner = {(host, i): r.key for r in state.running for host, ids in r.slots.items() for i in ids}
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
                cells.append(owner[(host, i)], style="bold black on cyan")
            else:
                cells.append(".", style="dim")
            cells.append(" ")
        nodes.add_row(host, cells, Text("down", style="red") if host in state.down else f"{busy}/{len(ids)}")
    if len(hosts) > MAX_NODE_ROWS:
        nodes.add_row(f"... {len(hosts) - MAX_NODE_ROWS} more nodes", "", "")
    return nodes


def _running(state: LiveState, now: float) -> RenderableType:
    """What runs: its key, name, attempt, where, for how long against its timeout."""
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold", pad_edge=False)
    for column, right in (("", False), ("running", False), ("try", True), ("on", False), ("elapsed", True),
                          ("timeout", True)):
        table.add_column(column, justify="right" if right else "left")
    for r in state.running[:MAX_RUNNING_ROWS]:
        elapsed = now - r.started_at
        late = r.timeout is not None and elapsed > 0.8 * r.timeout
        table.add_row(Text(r.key, style="bold black on cyan"), Text(r.name), str(r.attempt),
                      format_slots(r.slots), Text(seconds(elapsed), style="yellow" if late else ""),
                      seconds(r.timeout) if r.timeout is not None else "none")
    if len(state.running) > MAX_RUNNING_ROWS:
        table.add_row("", f"... {len(state.running) - MAX_RUNNING_ROWS} more", "", "", "", "")
    return table


def _failures(state: LiveState) -> RenderableType:
    """The latest failures as they came (oldest first): name, attempt, reason and the line that tells why,
    cut to one line of the terminal."""
    from rich.table import Table
    from rich.text import Text

    shown = len(state.failures)
    title = "failed" if state.failures_seen <= shown else f"failed (latest {shown} of {state.failures_seen})"
    table = Table(box=None, header_style="bold", pad_edge=False)
    longest = max(len(f.name) for f in state.failures)
    table.add_column(title, no_wrap=True, min_width=min(longest, 40))  # the name first: the why gives way
    table.add_column("try", justify="right")
    table.add_column("why", no_wrap=True, overflow="ellipsis", min_width=10)
    for f in state.failures:
        why = Text(f"[{f.reason or f.state}] ", style="red")
        if f.again:  # before the detail, which the terminal's width may cut
            why.append("(queued again) ", style="yellow")
        why.append(one_line(f.detail or "")[:MAX_DETAIL])
        table.add_row(Text(f.name, style="red"), str(f.attempt), why)
    return table


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
        observers.append(PlainPrinter(_metric_of(Path(directory))))
    try:
        yield
    finally:
        if view is not None:
            view.end()
        if display is not None:
            _quietly(display.stop)
        if log is not None:
            _quietly(log.close)


def _metric_of(directory: Path) -> str:
    """The sweep's metric, read from its ledger alone (the plain lines need nothing else)."""
    from ..ledger import Ledger

    with Ledger.open(directory) as ledger:
        return metric_named(ledger.meta().metric).name


def _quietly(close: Callable[[], None]) -> None:
    """An output that failed was left out with a note (see `Scheduler._tell`): closing it, which fails again
    (a line still buffered for the full disk, the closed terminal), must not replace the sweep's result."""
    with suppress(OSError):
        close()
