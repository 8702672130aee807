"""A sweep played on a simulated clock: the real scheduler and policies, runs that take the durations they
are given, and no disk.

The clock jumps from one event to the next, so 100,000 experiments play in seconds. What the simulator does
not reproduce is what it cannot know: process start-up (fold it into the durations), the grace period of a
stop (a stopped run ends at once) and failures other than timeouts.
"""
from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from ..core import (
    BackfillQueue,
    Event,
    Finished,
    Launched,
    MemoryRecord,
    Pack,
    Placement,
    Post,
    Queued,
    Run,
    Scheduler,
    Searcher,
    SlotPool,
)
from ..core.outcome import REASON_OF, Outcome
from ..core.scheduler import default_queue
from ..spec import Experiment
from ..states import Reason, State

Duration = Callable[[Experiment], float]
"""How long an experiment runs, in seconds (a Monte Carlo draw, or an estimate)."""

_DONE = Outcome(State.SUCCEEDED)


@dataclass(frozen=True)
class Played:
    """One attempt as the simulation ran it."""

    name: str
    start: float
    end: float
    slots: Mapping[str, Sequence[int]]
    state: State

    @property
    def size(self) -> int:
        return sum(len(ids) for ids in self.slots.values())


@dataclass
class Timeline:
    """A whole simulated sweep: each attempt, and the cluster it ran on."""

    played: list[Played]
    slots: int  # of the cluster
    decisions: list[float] = field(default_factory=list)  # seconds per run started, of each placing step (measured)

    # Read once the play is over, several times each (a plan's table, its JSON): 100,000 runs summed once.
    @cached_property
    def makespan(self) -> float:
        return max((p.end for p in self.played), default=0.0)

    @cached_property
    def slot_seconds(self) -> float:
        return sum((p.end - p.start) * p.size for p in self.played)

    @property
    def utilisation(self) -> float:
        """Busy slot-time over all slot-time until the last run ends."""
        return self.slot_seconds / (self.makespan * self.slots) if self.makespan and self.slots else 0.0


class SimulatedExecutor:
    """An `Executor` whose runs end after their duration on the simulated clock: a stand-in for processes,
    named as such. Runs are launched the moment they are started; a stopped run ends at once, recorded with
    the stop's state (the first stop asked wins, as with the real executors)."""

    def __init__(self, duration: Duration, schedule: Callable[[float, Event], None], now: Callable[[], float],
                 outcome: Callable[[Experiment], Outcome] | None = None):
        self._duration = duration
        self._outcome = outcome
        self._schedule = schedule
        self._now = now
        self._ending: dict[tuple[str, int], float] = {}  # when each running run's Finished is due
        self._stopped: set[tuple[str, int]] = set()
        self._pids = itertools.count(1)

    def start(self, run: Run, post: Post) -> None:
        now = self._now()
        end = now + max(0.0, self._duration(run.experiment))
        self._ending[run.key] = end
        post(Launched(run, next(self._pids), None, now))
        self._schedule(end, Finished(run, self._outcome(run.experiment) if self._outcome else _DONE, end))

    def adopt(self, run: Run, pid: int | None, post: Post) -> None:
        raise NotImplementedError("a simulated sweep follows runs under way with `follow`")

    def follow(self, run: Run, end: float) -> None:
        """A run under way when the simulation starts: it ends at `end`."""
        self._ending[run.key] = end
        self._schedule(end, Finished(run, _DONE, end))

    def stop(self, run: Run, state: State, detail: str, reason: Reason | None = None) -> None:
        if run.key in self._stopped or run.key not in self._ending:
            return
        self._stopped.add(run.key)
        now = self._now()
        self._ending[run.key] = now
        self._schedule(now, Finished(run, Outcome(state, reason or REASON_OF[state], detail), now))

    def ends(self, event: Finished) -> bool:
        """Whether `event` is the run's real end (not the one a stop made moot, or vice versa)."""
        due = self._ending.get(event.run.key)
        if due is None or due != event.at:
            return False
        del self._ending[event.run.key]
        return True

    def kill_all(self) -> None:
        for key in list(self._ending):
            self._ending[key] = self._now()

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Underway:
    """A run already under way when the simulation starts (a sweep re-planned while it runs)."""

    experiment: Experiment
    slots: Mapping[str, Sequence[int]]
    elapsed: float  # seconds it has run
    left: float  # seconds it is expected to run still


def simulate(experiments: Sequence[Experiment], slots: Mapping[str, Sequence[int]], duration: Duration, *,
             queue: Callable[[SlotPool], BackfillQueue[Queued]] = default_queue,
             placement: Placement | None = None, timeout: float | None = None, start: float = 0.0,
             underway: Sequence[Underway] = (), down: Sequence[str] = (), measure: bool = False,
             outcome: Callable[[Experiment], Outcome] | None = None, searcher: Searcher | None = None,
             metric: str = "") -> Timeline:
    """Play `experiments` (in queue order) on `slots` with the scheduler the runner uses. `timeout`: the
    sweep's default per-attempt limit; `underway`: runs that hold their slots already, `down`: hosts not up
    (a sweep re-planned while it runs). `outcome`: how each run ends (default: succeeded); `searcher`: a searcher
    that proposes experiments as slots free up (`metric` names the value it is told). `measure`: time each
    step, for the benchmark."""
    pool = SlotPool(slots)
    for host in down:
        pool.mark_down(host)
    record = MemoryRecord()
    scheduler = Scheduler(record, pool, "plan", Path("plan"), metric, queue=queue(pool),
                          placement=placement or Pack(), retries=0, timeout=timeout, searcher=searcher)
    record.add_experiments(experiments, start)
    scheduler.submit(Queued(e, 1) for e in experiments)
    clock = [start]
    due: list[tuple[float, int, Event]] = []
    order = itertools.count()

    def schedule(at: float, event: Event) -> None:
        heapq.heappush(due, (at, next(order), event))

    executor = SimulatedExecutor(duration, schedule, lambda: clock[0], outcome)
    played: list[Played] = []
    began: dict[tuple[str, int], float] = {}
    for u in underway:
        run = scheduler.adopt(u.experiment, 1, u.slots, start - u.elapsed)
        if run is not None:  # slots it could not hold (recorded twice): it is left out of the plan
            began[run.key] = start - u.elapsed
            executor.follow(run, start + max(0.0, u.left))
    decisions: list[float] = []
    events: list[Event] = []

    def post(event: Event) -> None:
        events.append(event)

    while True:
        if measure:
            tick = time.perf_counter()
        actions = scheduler.step(events, clock[0])
        if measure and actions.start:
            decisions.append((time.perf_counter() - tick) / len(actions.start))
        events = []
        for stop in actions.stop:
            executor.stop(stop.run, stop.state, stop.detail, stop.reason)
        for run in actions.start:
            began[run.key] = clock[0]
            executor.start(run, post)
        if events:
            continue  # the launches, handled at the same instant
        if scheduler.done:
            break
        wake = scheduler.wake()
        nxt = due[0][0] if due else None
        if nxt is None and wake is None:
            raise RuntimeError("the simulation stalled: runs are under way but nothing is due")  # a bug
        clock[0] = min(t for t in (nxt, wake) if t is not None)
        while due and due[0][0] <= clock[0]:
            event = heapq.heappop(due)[2]
            if isinstance(event, Finished) and executor.ends(event):
                run = event.run
                played.append(Played(run.experiment.name, began.pop(run.key), event.at,
                                     dict(run.reservation.slots), event.outcome.state))
                events.append(event)
    total = sum(len(ids) for ids in slots.values())
    return Timeline(played, total, decisions)

