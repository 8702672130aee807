"""What the live view shows of a running sweep at one instant (`LiveState`, immutable: rendered on rich's thread
while the dispatcher's updates the view), and the runs, failures and search it lists.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..spec.interval import Interval
from ..spec.metrics import Metric
from ..states import State
from .snapshot import count_states


@dataclass(frozen=True)
class Running:
    """A run the live view shows: where, since when, and its timeout (None: no limit)."""

    name: str
    attempt: int
    slots: Mapping[str, tuple[int, ...]]
    started_at: float
    timeout: float | None
    key: str = "#"  # its one character in the slots and the running list, kept while it runs
    steps: int = 0  # steps its progress showed so far (sweep/steps.py)
    so_far: Interval | None = None  # the metric's mean so far and its 95% interval

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
class SearchState:
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
    search: SearchState | None = None  # `autotune tune`'s: its experiments are proposed as runs end

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
