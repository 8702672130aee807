"""The scheduler: a pure state machine that turns queued experiments into running ones.

`Scheduler.step(events, now)` takes what happened since the last step and returns `Actions`: the runs to
start, the stops to ask for, the notes for observers. It reads no clock (`now` is handed in), starts no thread,
never blocks and never touches a process: the real dispatcher (dispatcher.py, one thread woken by events) and
the simulator (simulate.py, a clock that jumps from event to event) drive this same code. The sweep's deadline
and each attempt's timeout are the core's own timers: `wake()` says when it next needs a step even if nothing
happens, and a step at or after that time fires them.

Order of duties for every transition: the step writes it to the record (one transaction per step); the driver
acts on the returned `Actions` only after the step has returned, i.e. once the record holds it. A stop is such a
fact too: which stop was asked (cancelled, interrupted, timed out, its host lost) is recorded before the driver
sends the signal, and every end of that attempt is judged as that stop (`StopAsked.settle`), whoever sees it end:
this scheduler, or the one that adopts the attempt after this runner died in the middle of the stop.
"""
from __future__ import annotations

import contextlib
import heapq
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple, TypeVarTuple

from ..limits import memory
from ..spec import Experiment
from ..spec.interval import StepReading, timing_of
from ..spec.metrics import PEAK_MEMORY, reported_peak
from ..spec.sure import sure, tolerance_of
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
    Key,
    Launched,
    MemoryRead,
    Progress,
    Queued,
    Run,
)
from .outcome import Outcome, StopAsked, with_measured_metric
from .placement import Pack
from .queues import BackfillQueue
from .record import Record
from .roles import Searcher
from .slots import Placement, Reservation, SlotPool

Ts = TypeVarTuple("Ts")  # the arguments _quietly passes on


def _with_peak(outcome: Outcome, peak_memory: int | None) -> Outcome:
    """The outcome a Searcher is told: with the peak measured while the run ran among its metrics (PEAK_MEMORY),
    so that a search can correct its memory model by it; a script's own figure stays when nothing was measured."""
    if peak_memory is None:
        return outcome
    return replace(outcome, metrics={**(outcome.metrics or {}), PEAK_MEMORY: float(peak_memory)})


@dataclass(frozen=True)
class Stop:
    """End a running attempt; it is recorded with `state` (and `reason`) once its `Finished` comes."""

    run: Run
    state: State
    detail: str
    reason: Reason | None = None

    @property
    def asked(self) -> StopAsked:
        return StopAsked.of(self.state, self.detail, self.reason)


class Note(NamedTuple):
    """What observers are told (see `Observer`). A tuple: a step makes one per transition, cheaply."""

    what: str
    subject: Run | Queued | str
    outcome: Outcome | None = None


@dataclass
class Actions:
    """What one step asks the driver to do, in this order: tell, stop, start."""

    notes: list[Note] = field(default_factory=list)
    stop: list[Stop] = field(default_factory=list)
    start: list[Run] = field(default_factory=list)


def default_queue(pool: SlotPool) -> BackfillQueue[Queued]:
    """Backfill with at most one overtake per slot of the cluster before the oldest waiting one goes first."""
    return BackfillQueue(max(1, sum(pool.capacity(h) for h in pool.hosts)))


@dataclass
class Scheduler:
    """Runs the queued attempts of one sweep to completion on a pool of slots."""

    record: Record
    pool: SlotPool
    sweep_id: str
    results: Path
    metric: str
    queue: BackfillQueue[Queued] | None = None  # None: `default_queue`
    placement: Placement = field(default_factory=Pack)
    retries: int = 1
    timeout: float | None = None  # seconds an attempt may run when its experiment gives none; None: no limit
    deadline: float | None = None  # when the sweep's time is up, on the clock `now` is read from
    searcher: Searcher | None = None

    def __post_init__(self) -> None:
        self._queue: BackfillQueue[Queued] = self.queue if self.queue is not None else default_queue(self.pool)
        self._running: dict[Key, Run] = {}
        self._stopping: State | None = None  # why no more work is dispatched, once set
        self._actions = Actions()  # of the step under way
        self._retried: dict[str, int] = {}  # transient failures retried, per experiment, by this scheduler
        self._placing: list[Run] = []  # placed by the step under way: not yet handed to the driver
        self._adopted: set[Key] = set()  # runs a dead runner started, followed by this one
        self._asked: dict[Key, StopAsked] = {}  # the first stop asked for each running attempt (recorded)
        self._sure: dict[Key, StepReading] = {}  # what the steps said when a run was found sure: what it records
        self._timers: list[tuple[float, int, Key | None]] = []  # (when, tie-break, run or None: the deadline)
        self._limits: dict[Key, float] = {}  # each timed run's timeout, for its message
        self._launched: dict[Key, float] = {}  # when each running attempt was launched: its start-up's origin
        self._seq = itertools.count()
        self._changed = True  # since the last placing: slots freed, work queued, a host back (else skip it)
        if self.deadline is not None:
            heapq.heappush(self._timers, (self.deadline, next(self._seq), None))

    # --- public face --------------------------------------------------------------------------------------
    def submit(self, items: Iterable[Queued]) -> None:
        """Queue attempts that the record already holds as queued."""
        for item in items:
            self._queue.push(item)
        self._changed = True

    def adopt(self, experiment: Experiment, attempt: int, slots: Mapping[str, Sequence[int]], since: float,
              stop: StopAsked | None = None) -> Run | None:
        """Take over an attempt that a dead runner left running; call before the first step, then have the
        executor follow the returned run (`Executor.adopt`). None (nothing done) when its recorded slots cannot
        be held: not the sweep's, or recorded for another running attempt too (a ledger edited or damaged by
        hand); the caller ends it instead.

        It stays `running` under its own number (no new attempt), its slots are taken before any queued work
        is placed, and its timeout counts from its recorded start; cancel, Ctrl-C and the deadline end it like
        any run. One that ended without recording its exit status is recorded interrupted and queued again,
        as a crash's casualty. `since`: when it started (launched, as recorded). `stop`: the stop the dead
        runner had asked for it (recorded before its signal, which it may not have lived to send): asked again at
        the first step, its end judged as that stop, and no later one replaces it.
        """
        name = experiment.name
        run = Run(experiment, attempt, Reservation.of(slots), f"{self.sweep_id}.{name}.{attempt}",
                  self.results / name)
        if not self.pool.can_take(run.reservation):
            return None
        self.pool.take(run.reservation)
        self._running[run.key] = run
        self._adopted.add(run.key)
        self._note("adopted", run)
        if stop is not None:
            self._asked[run.key] = stop
            self._actions.stop.append(Stop(run, stop.state, stop.detail, stop.reason))
        self._launched[run.key] = since
        self._arm(run, since)
        return run

    @property
    def stopping(self) -> State | None:
        return self._stopping

    @property
    def busy(self) -> bool:
        """Some run is still under way (placed, and its Finished not yet handled)."""
        return bool(self._running)

    @property
    def done(self) -> bool:
        """Nothing runs, and nothing more will be started."""
        return not self._running and (not self._queue or self._stopping is not None)

    def waiting(self) -> list[Queued]:
        """What waits, in queue order."""
        return list(self._queue)

    def wake(self) -> float | None:
        """When the next timer (the deadline, an attempt's timeout) is due; None: only events wake it."""
        while self._timers and self._timers[0][2] is not None and self._timers[0][2] not in self._running:
            heapq.heappop(self._timers)  # its run has ended
        return self._timers[0][0] if self._timers else None

    def step(self, events: Sequence[Event], now: float) -> Actions:
        """Handle every event at hand, fire the timers due by `now` and fill the free slots, recording all of
        it in one transaction; returns what the driver must do. Events that came before the first step (a
        cancel request) are handled before anything is placed."""
        self._placing = []
        # A step that only records launches (pids, ports) places nothing (nothing changed: no slot freed, nothing
        # queued) and starts nothing: no action waits on its commit being on disk. Every other step is synced
        # before its runs are started. Half the runner's commits were these, each an fsync the next run's
        # dispatch waited behind.
        synced = self._changed or not events or not all(isinstance(event, Launched) for event in events)
        with self.record.batch(synced):
            for event in events:
                self._handle(event, now)
            self._fire(now)
            self._dispatch(now)
        self._placing = []
        actions, self._actions = self._actions, Actions()
        return actions

    # --- a fatal error --------------------------------------------------------------------------------------
    def abort(self, error: Exception, now: float, unstarted: Sequence[Run] = ()) -> Actions:
        """The driver cannot go on (the ledger's disk is full, a bug): stop every run as Ctrl-C does; feed
        their ends to `wind_down`. Runs placed but never handed to an executor (`unstarted`, and those of a
        step that failed half-way) have nothing to end: the record holds them queued (the step rolled back) or
        running, and resume finishes either."""
        self._stopping = State.INTERRUPTED
        detail = f"the runner stopped on an error: {type(error).__name__}: {error}"[:300]
        for run in [*self._placing, *unstarted]:
            if self._running.pop(run.key, None) is not None:
                self.pool.give_back(run.reservation)
        self._placing = []
        self._actions = Actions()
        stops = [Stop(run, State.INTERRUPTED, detail) for run in self._running.values()]
        for stop in stops:  # where the record can still be written (it is what failed, most often)
            _quietly(self._record_stop, stop, now)
        return Actions(stop=stops)

    def wind_down(self, events: Sequence[Event], now: float) -> Actions:
        """After `abort`: record each run's end where the record can still be written (where it cannot, it
        stays `running`, which resume knows how to finish); nothing new is placed or stopped."""
        for event in events:
            if isinstance(event, Finished) and event.run.key in self._running:
                _quietly(self._finished, event.run, event.outcome, event.at, event.peak_memory)
                if self._running.pop(event.run.key, None) is not None:  # _finished failed before letting go
                    self.pool.give_back(event.run.reservation)
            elif isinstance(event, Launched):
                _quietly(self._handle, event, now)
        actions, self._actions = self._actions, Actions()
        return Actions(notes=actions.notes)

    # --- the step -----------------------------------------------------------------------------------------
    def _handle(self, event: Event, now: float) -> None:
        match event:
            case Launched(run=run, pid=pid, port=port, at=at, handle=handle):
                self.record.launched(run.experiment.name, run.attempt, pid=pid, port=port, at=at, handle=handle)
                if run.key in self._running:
                    self._launched[run.key] = at
                    self._arm(run, at)
            case Finished(run=run, outcome=outcome, at=at, peak_memory=peak):
                self._finished(run, outcome, at, peak)
            case Progress():
                self._progress(event, now)
            case Cancel(names=names):
                self._cancel(set(names), now)
            case CheckRequests():
                for kind, asked in self.record.take_requests():
                    if kind == "cancel":
                        self._cancel(set(asked), now)
            case Interrupt(reason=reason):
                self._stop_all(State.INTERRUPTED, reason, now)
            case HostLost(host=host, reason=reason):
                self._host_lost(host, reason, now)
            case HostBack(host=host):
                self.pool.mark_up(host)
                self._changed = True
                self._note("host_up", host)
            case MemoryRead():
                self._changed = True  # the placement reads the new values itself
            case Deadline():
                self._stop_all(State.TIMED_OUT, "the sweep's deadline passed", now, Reason.TIMEOUT)
            case _:
                raise TypeError(f"unknown event {event!r}")

    def _arm(self, run: Run, since: float) -> None:
        """The attempt's timeout (its experiment's own, else the sweep's), counted from `since`."""
        timeout = run.experiment.timeout or self.timeout
        if timeout is not None:
            self._limits[run.key] = timeout
            heapq.heappush(self._timers, (since + timeout, next(self._seq), run.key))

    def _fire(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            _, _, key = heapq.heappop(self._timers)
            if key is None:
                self._stop_all(State.TIMED_OUT, "the sweep's deadline passed", now, Reason.TIMEOUT)
            elif key in self._running:
                self._stop(self._running[key], State.TIMED_OUT,
                           f"ran past its timeout of {self._limits.pop(key):g} s", now, Reason.TIMEOUT)

    def _dispatch(self, now: float) -> None:
        """Place what fits now; the driver starts them once the step's transaction is committed. Nothing to
        do unless something changed since the last time (a step that only records launches places nothing)."""
        if self._stopping or not self._changed:
            return
        self._changed = False
        self._place_all(now)
        while self.searcher is not None and not self._queue and self.pool.any_free():
            proposed = list(self.searcher.propose(self.pool.free_count(), now))
            if not proposed:
                break
            self.record.add_experiments(proposed, now)
            self.submit(Queued(e, 1) for e in proposed)
            self._place_all(now)
        if self._queue and not self._running:
            self._fail_unplaceable(now)

    def _place_all(self, now: float) -> None:
        for item, reservation in self._queue.select(self.pool, self.placement):
            self._place(item, reservation, now)

    def _place(self, item: Queued, reservation: Reservation, now: float) -> None:
        name = item.experiment.name
        run = Run(item.experiment, item.attempt, reservation, f"{self.sweep_id}.{name}.{item.attempt}",
                  self.results / name)
        self._running[run.key] = run
        self._placing.append(run)
        self.record.start(name, item.attempt, slots=dict(reservation.slots), tag=run.tag, dir=str(run.dir), at=now)
        self._note("started", run)
        self._actions.start.append(run)

    def _finished(self, run: Run, outcome: Outcome, at: float, peak_memory: int | None = None) -> None:
        """`peak_memory`: measured while it ran (peaks.py); else what the script reported, if it did. A stop asked
        for it (by this runner or, recorded, by the one that died) says how its end reads."""
        asked = self._asked.pop(run.key, None)
        decided = self._sure.pop(run.key, None)
        if asked is not None:
            settled = asked.settle(outcome)
            if decided is not None and settled.metrics is None:  # its figures as they were judged sure
                settled = replace(settled, measured=decided)
            outcome = with_measured_metric(settled, self.metric)
        self._running.pop(run.key)
        self._changed = True
        self._limits.pop(run.key, None)
        self.pool.give_back(run.reservation)
        timing = timing_of(outcome.measured, self._launched.pop(run.key, None), at)
        if timing is not None:
            self.record.measured(run.experiment.name, run.attempt, timing)
            if outcome.state in (State.SUCCEEDED, State.STOPPED):  # a stopped one: how far it got, how fast
                outcome = replace(outcome, metrics={**(outcome.metrics or {}), **{  # its own first, as before
                    k: v for k, v in timing.columns(self.metric).items() if k not in (outcome.metrics or {})}})
        self.record.finish(run.experiment.name, run.attempt, outcome.state, at, reason=outcome.reason,
                           detail=outcome.detail, exit_code=outcome.exit_code,
                           metric=self._metric_value(outcome), metrics=outcome.metrics,
                           peak_memory=peak_memory or reported_peak(outcome.metrics))
        self._note("finished", run, outcome)
        adopted = run.key in self._adopted
        self._adopted.discard(run.key)
        again = not self._stopping and self._runs_again(run.experiment.name, outcome, adopted)
        if self.searcher is not None and not again:
            self.searcher.observe(run, _with_peak(outcome, peak_memory))
        if again:
            name = run.experiment.name
            item = Queued(run.experiment, self.record.requeue([name], at)[name])
            self._queue.push_front(item)
            self._note("requeued", item, outcome)

    def _progress(self, event: Progress, now: float) -> None:
        """A running attempt's steps so far: kept in the record (its `measures`, for `status` and the dashboard)
        and told to observers; one seen to run out of memory is ended at once (recorded failed, oom), and one the
        search says cannot win is stopped (`Searcher.outclassed`; recorded stopped, outclassed), and one whose config
        asks it to be measured until sure is ended once it is (spec/sure.py; recorded succeeded). An attempt already
        being stopped, or ended, is left alone."""
        run = event.run
        if run.key not in self._running or run.key in self._asked:
            return
        if event.oom is not None:
            self._stop(run, State.FAILED, event.oom, now, Reason.OOM)
            return
        if event.reading is None:
            return
        launched = self._launched.get(run.key)
        reading = event.reading.within(launched, now)  # as every view of it says it
        timing = timing_of(reading, launched, now)
        if timing is None:
            return
        self.record.measured(run.experiment.name, run.attempt, timing)
        self._note("progress", run, Outcome(State.RUNNING, measured=reading))
        why = self.searcher.outclassed(run, reading) if self.searcher is not None else None
        if why is not None:
            self._stop(run, State.STOPPED, why, now, Reason.OUTCLASSED)
            return
        tolerance = tolerance_of(run.experiment.ds_config)
        enough = sure(reading, tolerance) if tolerance is not None else None
        if enough is not None:
            self._sure[run.key] = reading
            self._stop(run, State.SUCCEEDED, enough, now, Reason.SURE)

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

    def _cancel(self, names: set[str], now: float) -> None:
        everything = not names
        self._changed = True  # a cancelled head of the queue may have held the rest back
        if everything:
            self._tell_stopping(State.CANCELLED, "the whole sweep was cancelled", Reason.CANCELLED)
            self._stopping = State.CANCELLED
        for item in self._queue.remove(lambda q: everything or q.experiment.name in names):
            self._end_unstarted(item, Outcome(State.CANCELLED, Reason.CANCELLED, "cancelled before it started"), now)
        for run in list(self._running.values()):
            if everything or run.experiment.name in names:
                self._stop(run, State.CANCELLED, "cancelled while running", now)

    def _host_lost(self, host: str, reason: str, now: float) -> None:
        """Told once per loss (several may tell it: a watcher, each run that ended with the host)."""
        if not self.pool.is_down(host):
            self.pool.mark_down(host)
            self._changed = True  # what needed it may no longer fit anywhere
            self._note("host_down", host, Outcome(State.INTERRUPTED, Reason.LOST, reason))
        for run in list(self._running.values()):
            if host in run.reservation.hosts:
                self._stop(run, State.INTERRUPTED, f"host {host} lost: {reason}", now, Reason.LOST)

    def _stop_all(self, state: State, detail: str, now: float, reason: Reason | None = None) -> None:
        self._tell_stopping(state, detail, reason)
        self._stopping = self._stopping or state
        for run in list(self._running.values()):
            self._stop(run, state, detail, now, reason)

    def _tell_stopping(self, state: State, detail: str, reason: Reason | None) -> None:
        """The first cause of a stop is told once: a view stops promising an ETA and says why it winds down."""
        if self._stopping is None:
            self._note("stopping", self.sweep_id, Outcome(state, reason, detail))

    def _stop(self, run: Run, state: State, detail: str, now: float, reason: Reason | None = None) -> None:
        """Ask the driver to end `run`, the stop recorded first (in this step's transaction): the first one asked
        is the one its end is judged by, here or after a crash."""
        stop = Stop(run, state, detail, reason)
        self._record_stop(stop, now)
        self._actions.stop.append(stop)

    def _record_stop(self, stop: Stop, now: float) -> None:
        key = stop.run.key
        if key not in self._asked:
            self._asked[key] = asked = stop.asked
            self.record.stopping(key[0], key[1], asked.state, asked.reason, asked.detail, now)

    def _fail_unplaceable(self, now: float) -> None:
        """Nothing runs, yet something waits: what needs more than the hosts still up could give (the pool
        shrank: hosts down; or their GPUs lack the memory it needs, other users holding it) is failed rather
        than left to hang the sweep: no run of ours will end to change that. What fits was placed already."""
        for item in self._queue.remove(lambda q: not self.placement.could_fit(self.pool, q)):
            self._end_unstarted(item, Outcome(State.FAILED, Reason.PLACEMENT, _unplaceable(item)), now)

    def _end_unstarted(self, item: Queued, outcome: Outcome, now: float) -> None:
        self.record.finish(item.experiment.name, item.attempt, outcome.state, now, reason=outcome.reason,
                           detail=outcome.detail)
        self._note("finished", item, outcome)
        if self.searcher is not None:
            self.searcher.observe(item, outcome)

    def _note(self, what: str, subject: Run | Queued | str, outcome: Outcome | None = None) -> None:
        self._actions.notes.append(Note(what, subject, outcome))


def _unplaceable(item: Queued) -> str:
    """Why nothing that is up can take `item`, as its failure says."""
    need = item.gpu_need
    what = f"needs {item.num_nodes} node(s) x {item.num_gpus} slot(s)"
    if need.gpu_type:
        what += f" of GPU type {need.gpu_type}"
    if need.memory:
        return f"{what} with {memory(need.memory)} free on each GPU; no hosts that are up have that much room"
    return f"{what}; not enough hosts are up"


def _quietly(action: Callable[[*Ts], object], *args: *Ts) -> None:
    # While winding down, the first error is the one raised; the record keeps what it could not hold as running.
    with contextlib.suppress(Exception):
        action(*args)
