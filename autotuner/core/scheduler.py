"""The dispatcher: one thread, woken only by events, that turns queued experiments into running ones.

Nothing here sleeps or polls. Each running experiment is watched by its executor's own thread, which posts a
`Launched` and then a `Finished` event; `cancel`, `interrupt` and the sweep deadline arrive as events too.
After every event the dispatcher fills whatever slots are free at once. The scheduler never reads the time
or starts a process itself: a clock and an executor are handed to it, so a simulated pair can drive the very
same code to predict a sweep.

Order of duties for every transition: write it to the ledger, then act on it.
"""
from __future__ import annotations

import contextlib
import queue
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..ledger import Attempt, Ledger
from ..outcome import Outcome
from ..spec import Experiment
from ..states import Reason, State
from .events import (
    Cancel,
    CheckRequests,
    Deadline,
    Event,
    Finished,
    HostBack,
    HostLost,
    Interrupt,
    Launched,
    Post,
    Queued,
    Run,
)
from .resources import BackfillQueue, BestFit, Placement, Reservation, SlotPool


class Executor(Protocol):
    """Starts and ends runs; the dispatcher's only way to touch a process. `start` and `adopt` return at once:
    the executor follows the run on a thread it owns and posts `Launched`, then exactly one `Finished`."""

    def start(self, run: Run, post: Post) -> None:
        """Launch the run; a launch that fails is posted as its `Finished` (reason launch), never raised."""

    def adopt(self, run: Run, pid: int | None, since: float, post: Post) -> None:
        """Follow a run that a dead runner started (`pid`: its process group, `since`: when it started) to
        its end, as `start` does; its Finished event is judged from the exit status it recorded."""

    def stop(self, run: Run, state: State, detail: str, reason: Reason | None = None) -> None:
        """End the run's processes (a grace period, then SIGKILL) without blocking the caller; its Finished
        event then carries `state` (cancelled, timed_out, ...) and `reason` (default: the state's own word)."""

    def kill_all(self) -> None:
        """SIGKILL every run at once, from any thread (a second Ctrl-C); each is then recorded interrupted."""

    def close(self) -> None:
        """Join the executor's threads, once every run has posted its Finished (or the runner gives up)."""


Observer = Callable[[str, "Run | Queued | str", "Outcome | None"], None]
"""Told, on the dispatcher's thread, once the ledger has recorded the fact:
- ("started", Run, None); ("adopted", Run, None) for a run a dead runner left running;
- ("finished", Run or an unstarted Queued, Outcome): the attempt's terminal state, as the ledger holds it;
- ("requeued", Queued, Outcome), right after the "finished" of an attempt that the scheduler queues again at
  once (a transient failure with retries left, a run of a lost host, an adopted run that ended unrecorded):
  the Queued is the new attempt (same experiment, next number), the Outcome the ended attempt's, whose
  `reason` says why. This is the one place the retry decision is made: observers read it, never re-derive it;
- ("host_down" | "host_up", host name, None).
An observer that raises is left out from then on (see `Scheduler._tell`): watching a sweep never stops it.
An observer may carry a `label` attribute that names it in that note."""


@dataclass
class Scheduler:
    """Runs the queued attempts of one sweep to completion on a pool of slots."""

    ledger: Ledger
    pool: SlotPool
    executor: Executor
    clock: Callable[[], float]
    sweep_id: str
    results: Path
    metric: str
    placement: Placement = field(default_factory=BestFit)
    max_bypass: int | None = None
    retries: int = 1
    observers: list[Observer] = field(default_factory=list)
    log: Callable[[str], None] = lambda line: None  # notes for the user (an observer left out, ...)

    def __post_init__(self) -> None:
        bypass = self.max_bypass if self.max_bypass is not None else max(1, sum(
            self.pool.capacity(h) for h in self.pool.hosts))
        self._queue: BackfillQueue[Queued] = BackfillQueue(bypass)
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._running: dict[tuple[str, int], Run] = {}
        self._stopping: State | None = None  # why no more work is dispatched, once set
        self._notes: list[tuple[str, Run | Queued | str, Outcome | None]] = []  # for observers, after commit
        self._retried: dict[str, int] = {}  # transient failures retried, per experiment, by this dispatcher
        self._unstarted: list[Run] = []  # placed by the current step, not yet handed to the executor
        self._adopted: set[tuple[str, int]] = set()  # runs a dead runner started, followed by this one

    # --- public face --------------------------------------------------------------------------------------
    def submit(self, items: Iterable[Queued]) -> None:
        """Queue attempts that the ledger already holds as queued."""
        for item in items:
            self._queue.push(item)

    def adopt(self, experiment: Experiment, attempt: Attempt) -> bool:
        """Take over an attempt that a dead runner left running; call before `run`. False (nothing done) when
        its recorded slots cannot be held: not the sweep's, or recorded for another running attempt too (a
        ledger edited or damaged by hand); the caller ends it instead.

        It stays `running` in the ledger under its own number (no new attempt), its slots are taken before
        any queued work is placed, and the executor follows it to its end (its timeout counted from its
        recorded start); cancel, Ctrl-C and the deadline end it like any run. One that ended without
        recording its exit status is recorded interrupted and queued again, as a crash's casualty.
        """
        name = experiment.name
        run = Run(experiment, attempt.attempt, Reservation.of(attempt.slots),
                  f"{self.sweep_id}.{name}.{attempt.attempt}", self.results / name)
        if not self.pool.can_take(run.reservation):
            return False
        self.pool.take(run.reservation)
        self._running[run.key] = run
        self._adopted.add(run.key)
        self._notify("adopted", run, None)
        since = attempt.launched_at or attempt.started_at
        self.executor.adopt(run, attempt.pid, since if since is not None else self.clock(), self.post)
        return True

    def post(self, event: Event) -> None:
        """Thread-safe: hand an event to the dispatcher."""
        self._events.put(event)

    @property
    def stopping(self) -> State | None:
        return self._stopping

    def run(self) -> None:
        """Dispatch until nothing is queued or running (or, once stopping, nothing is running).

        Events posted before the start (e.g. a cancel request that came first) are handled before anything
        is launched. An error here (the ledger's disk is full, a bug) first ends what runs (see `_abort`),
        then is raised.
        """
        try:
            self._step(self._pending_events())
            while self._running or (self._queue and not self._stopping):
                self._step([self._events.get(), *self._pending_events()])
        except Exception as error:
            self._abort(error)
            raise

    def _pending_events(self) -> list[Event]:
        events: list[Event] = []
        while True:
            try:
                events.append(self._events.get_nowait())
            except queue.Empty:
                return events

    def _step(self, events: list[Event]) -> None:
        """Handle every event at hand and fill the free slots, recording all of it in one transaction; only
        once it is committed are observers told and the new runs started."""
        with self.ledger.batch():
            for event in events:
                self._handle(event)
            self._dispatch()
        notes, self._notes = self._notes, []
        for note in notes:
            self._tell(*note)
        while self._unstarted:
            self.executor.start(self._unstarted[0], self.post)
            self._unstarted.pop(0)

    def _tell(self, what: str, subject: Run | Queued | str, outcome: Outcome | None) -> None:
        """Tell every observer; one that raises (stdout closed under `| head`, the events file's disk full, a
        display that broke) is left out with one note, and the sweep goes on: output never stops the work."""
        for observer in list(self.observers):
            try:
                observer(what, subject, outcome)
            except Exception as e:
                self.observers.remove(observer)
                label = getattr(observer, "label", None) or getattr(observer, "__name__", type(observer).__name__)
                self._say(f"note: {label} failed ({type(e).__name__}: {e}); left out, the sweep goes on")

    def _say(self, line: str) -> None:
        with contextlib.suppress(Exception):  # stderr is gone too: nothing left to say it on
            self.log(line)

    # --- a fatal error --------------------------------------------------------------------------------------
    def _abort(self, error: Exception) -> None:
        """The dispatcher cannot go on: end every run as Ctrl-C does and wait for each to end, recording it
        interrupted where the ledger can still be written (where it cannot, the ledger keeps it `running`,
        which `resume` knows how to finish). No process of the sweep outlives the runner."""
        self._stopping = State.INTERRUPTED
        self._notes = []
        detail = f"the runner stopped on an error: {type(error).__name__}: {error}"[:300]
        for run in self._unstarted:  # placed, never started: nothing to end; the ledger holds it queued (its
            self._running.pop(run.key, None)  # step rolled back) or running, and resume finishes either
            self.pool.give_back(run.reservation)
        self._unstarted = []
        for run in list(self._running.values()):
            self._try(self.executor.stop, run, State.INTERRUPTED, detail)
        while self._running:
            event = self._events.get()
            if isinstance(event, Finished) and event.run.key in self._running:
                self._try(self._finished, event.run, event.outcome, event.at)
                if event.run.key in self._running:  # _finished failed before it let go of the run
                    self._running.pop(event.run.key)
                    self.pool.give_back(event.run.reservation)
                notes, self._notes = self._notes, []
                for note in notes:
                    self._tell(*note)
            elif isinstance(event, Launched):
                self._try(self._handle, event)

    @staticmethod
    def _try(action: Callable[..., object], *args: Any) -> None:
        # The first error is the one raised; the ledger keeps what it could not record as `running`.
        with contextlib.suppress(Exception):
            action(*args)

    # --- the loop -----------------------------------------------------------------------------------------
    def _handle(self, event: Event) -> None:
        match event:
            case Launched(run=run, pid=pid, port=port, at=at):
                self.ledger.launched(run.experiment.name, run.attempt, pid=pid, port=port, at=at)
            case Finished(run=run, outcome=outcome, at=at):
                self._finished(run, outcome, at)
            case Cancel(names=names):
                self._cancel(set(names))
            case CheckRequests():
                for kind, asked in self.ledger.take_requests():
                    if kind == "cancel":
                        self._cancel(set(asked))
            case Interrupt(reason=reason):
                self._stop_all(State.INTERRUPTED, reason)
            case HostLost(host=host, reason=reason):
                self._host_lost(host, reason)
            case HostBack(host=host):
                self.pool.mark_up(host)
                self._notify("host_up", host, None)
            case Deadline():
                self._stop_all(State.TIMED_OUT, "the sweep's deadline passed", Reason.TIMEOUT)
            case _:
                raise TypeError(f"unknown event {event!r}")

    def _dispatch(self) -> None:
        """Place what fits now: recorded, and kept in `_unstarted` until the step's commit lets them start."""
        if self._stopping:
            return
        for item, reservation in self._queue.select(self.pool, self.placement):
            self._unstarted.append(self._place(item, reservation))
        if self._queue and not self._running:
            self._fail_unplaceable()

    def _place(self, item: Queued, reservation: Reservation) -> Run:
        name = item.experiment.name
        run = Run(item.experiment, item.attempt, reservation, f"{self.sweep_id}.{name}.{item.attempt}",
                  self.results / name)
        self.ledger.start(name, item.attempt, slots=reservation.as_dict(), tag=run.tag, dir=str(run.dir),
                          at=self.clock())
        self._running[run.key] = run
        self._notify("started", run, None)
        return run

    def _finished(self, run: Run, outcome: Outcome, at: float) -> None:
        self._running.pop(run.key)
        self.pool.give_back(run.reservation)
        self.ledger.finish(run.experiment.name, run.attempt, outcome.state, at, reason=outcome.reason,
                           detail=outcome.detail, exit_code=outcome.exit_code,
                           metric=self._metric_value(outcome), metrics=outcome.metrics)
        self._notify("finished", run, outcome)
        adopted = run.key in self._adopted
        self._adopted.discard(run.key)
        if not self._stopping and self._runs_again(run.experiment.name, outcome, adopted):
            name = run.experiment.name
            item = Queued(run.experiment, self.ledger.requeue([name], self.clock())[name])
            self._queue.push_front(item)
            self._notify("requeued", item, outcome)

    def _runs_again(self, name: str, outcome: Outcome, adopted: bool) -> bool:
        """The retry decision, made here only. Interrupted, not by us (its host was lost, or it is an adopted
        run that ended unrecorded): always. A transient failure: while the experiment has retries left,
        counted per experiment, not read off the attempt number, since interrupted attempts (Ctrl-C, a crash,
        a lost host) are not failures and use up no retry."""
        if outcome.state == State.INTERRUPTED:
            return outcome.reason == Reason.LOST or adopted
        if outcome.state == State.FAILED and outcome.transient and self._retried.get(name, 0) < self.retries:
            self._retried[name] = self._retried.get(name, 0) + 1
            return True
        return False

    def _metric_value(self, outcome: Outcome) -> float | None:
        return outcome.metrics.get(self.metric) if outcome.metrics else None

    def _cancel(self, names: set[str]) -> None:
        everything = not names
        if everything:
            self._stopping = State.CANCELLED
        for item in self._queue.remove(lambda q: everything or q.experiment.name in names):
            outcome = Outcome(State.CANCELLED, Reason.CANCELLED, "cancelled before it started")
            self.ledger.finish(item.experiment.name, item.attempt, outcome.state, self.clock(),
                               reason=outcome.reason, detail=outcome.detail)
            self._notify("finished", item, outcome)
        for run in list(self._running.values()):
            if everything or run.experiment.name in names:
                self.executor.stop(run, State.CANCELLED, "cancelled while running")

    def _host_lost(self, host: str, reason: str) -> None:
        self.pool.mark_down(host)
        self._notify("host_down", host, None)
        for run in list(self._running.values()):
            if host in run.reservation.hosts:
                self.executor.stop(run, State.INTERRUPTED, f"host {host} lost: {reason}", Reason.LOST)

    def _stop_all(self, state: State, detail: str, reason: Reason | None = None) -> None:
        self._stopping = self._stopping or state
        for run in list(self._running.values()):
            self.executor.stop(run, state, detail, reason)

    def _fail_unplaceable(self) -> None:
        """Nothing runs, yet something waits: what needs more than the hosts still up could give (the pool
        shrank: hosts down) is failed rather than left to hang the sweep. What fits was placed already."""
        for item in self._queue.remove(lambda q: not self.pool.could_fit(q.num_nodes, q.num_gpus, up_only=True)):
            outcome = Outcome(State.FAILED, Reason.PLACEMENT,
                              f"needs {item.num_nodes} node(s) x {item.num_gpus} slot(s); not enough hosts are up")
            self.ledger.finish(item.experiment.name, item.attempt, outcome.state, self.clock(),
                               reason=outcome.reason, detail=outcome.detail)
            self._notify("finished", item, outcome)

    def _notify(self, what: str, subject: Run | Queued | str, outcome: Outcome | None) -> None:
        """Observers are told once the step's transaction is committed (see `_step`)."""
        self._notes.append((what, subject, outcome))
