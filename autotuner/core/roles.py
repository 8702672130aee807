"""The parts a scheduler is plugged into: the `Executor` that carries its starts and stops out, the `Observer`s
its driver tells, and the `Searcher` a search feeds the queue through (and that says which running attempts cannot
win). Protocols only: the scheduler (scheduler.py) decides, these act, watch and propose.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from ..spec import Experiment
from ..spec.interval import StepReading
from ..states import Reason, State
from .events import Post, Queued, Run
from .outcome import Outcome


class Executor(Protocol):
    """Starts and ends runs for a driver. `start` and `adopt` return at once: the executor follows the run (on a
    thread it owns, or on a simulated clock) and posts `Launched`, then exactly one `Finished`."""

    def start(self, run: Run, post: Post) -> None:
        """Launch the run; a launch that fails is posted as its `Finished` (reason launch), never raised."""

    def adopt(self, run: Run, pid: int | None, post: Post) -> None:
        """Follow a run that a dead runner started (`pid`: its process group) to
        its end, as `start` does; its Finished event is judged from the exit status it recorded."""

    def stop(self, run: Run, state: State, detail: str, reason: Reason | None = None) -> None:
        """End the run's processes (a grace period, then SIGKILL) without blocking the caller; its Finished
        event then carries `state` (cancelled, timed_out, ...) and `reason` (default: the state's own word).
        The first stop asked for a run wins."""

    def kill_all(self) -> None:
        """SIGKILL every run at once, from any thread (a second Ctrl-C); each is then recorded interrupted."""

    def close(self) -> None:
        """Join the executor's threads, once every run has posted its Finished (or the runner gives up)."""


Observer = Callable[[str, "Run | Queued | str", "Outcome | None"], None]
"""Told, by the driver, once the record holds the fact:
- ("started", Run, None); ("adopted", Run, None) for a run a dead runner left running;
- ("finished", Run or an unstarted Queued, Outcome): the attempt's terminal state, as the record holds it;
- ("requeued", Queued, Outcome), right after the "finished" of an attempt that the scheduler queues again at
  once (a transient failure with retries left, a run of a lost host, an adopted run that ended unrecorded):
  the Queued is the new attempt (same experiment, next number), the Outcome the ended attempt's, whose
  `reason` says why. This is the one place the retry decision is made: observers read it, never re-derive it;
- ("progress", Run, Outcome(running, measured=what its steps say so far)), at each new reading of a running
  attempt's steps (kept in the record's `measures` meanwhile);
- ("host_down", host name, Outcome: why), ("host_up", host name, None);
- ("stopping", sweep id, Outcome(state, reason, detail)), once, when the sweep stops dispatching (Ctrl-C, a
  cancel of the whole sweep, its deadline): what runs is being ended as `state`; `detail` says why.
An observer that raises is left out from then on (see `Dispatcher._tell`): watching a sweep never stops it.
An observer may carry a `label` attribute that names it in that note."""


class Searcher(Protocol):
    """Proposes experiments while slots are free and nothing waits: the hook a searcher (`autotune tune`)
    feeds the queue through. A grid needs none: its fixed list is submitted at the start."""

    def propose(self, free_slots: int, now: float) -> Sequence[Experiment]:
        """Experiments to queue now (new names); none: nothing more until a run ends."""

    def observe(self, run: Run | Queued, outcome: Outcome) -> None:
        """An attempt of the sweep ended for good, as recorded (a run, or one cancelled before it started); an
        attempt the scheduler queues again (a transient failure with retries left, a lost host) is not told:
        its next attempt's end is."""

    def outclassed(self, run: Run, reading: StepReading) -> str | None:
        """Why a running attempt, by its steps so far (`reading`), can no longer be the best (its optimistic
        bound worse than a finished config's pessimistic one), as the line its stop records; None: let it run.
        Asked at each new reading (core/scheduler.py `_progress`); it is then stopped, recorded `stopped`."""
