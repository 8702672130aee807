"""The scheduler driven in real time: one thread, woken by events (posted by executors' threads, signal
handlers, the host watcher) or by the scheduler's next timer, that carries out what each step returns.

The scheduler decides; this loop only waits, steps and acts. Nothing here sleeps or polls.
"""
from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable

from ..core import Actions, Event, Executor, Observer, Run, Scheduler
from ..core.scheduler import Note

# The longest single wait: a timer due later is simply waited for again (a lock's timeout has an upper bound).
_LONGEST_WAIT = 3600.0


class Inbox:
    """Where events wait for the dispatcher. Made before it, so that what posts events (the executor, the
    watchers a backend opens) is built complete before the dispatcher that is given it."""

    def __init__(self) -> None:
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()

    def post(self, event: Event) -> None:
        """Thread-safe: hand an event to the dispatcher."""
        self.events.put(event)


class Dispatcher:
    """Runs one scheduler to its end against a real executor and clock."""

    def __init__(self, scheduler: Scheduler, executor: Executor, clock: Callable[[], float],
                 observers: list[Observer] | None = None, log: Callable[[str], None] = lambda line: None,
                 inbox: Inbox | None = None):
        self.scheduler = scheduler
        self.executor = executor
        self.clock = clock
        self.observers = list(observers or [])
        self.log = log
        self._inbox = inbox or Inbox()
        self._events = self._inbox.events
        # Set once the sweep's stop (Ctrl-C, a cancel of all, its deadline) is in the record, or the dispatcher
        # gave up: a kill waits for it, so that what it kills reads as stopped, not failed, even after a crash.
        self.stop_recorded = threading.Event()

    def post(self, event: Event) -> None:
        """Thread-safe: hand an event to the dispatcher."""
        self._inbox.post(event)

    def run(self) -> None:
        """Step until the scheduler is done. Events posted before the start (a cancel request that came first)
        are handled before anything is launched. An error here (the ledger's disk is full, a bug) first ends
        what runs and waits for it (see `_abort`), then is raised."""
        unstarted: list[Run] = []
        try:
            self._carry_out(self._step(self._pending()), unstarted)
            while not self.scheduler.done:
                self._carry_out(self._step(self._wait(self.scheduler.wake())), unstarted)
        except Exception as error:
            self._abort(error, unstarted)
            raise
        finally:
            self.stop_recorded.set()

    def _step(self, events: list[Event]) -> Actions:
        actions = self.scheduler.step(events, self.clock())  # committed: the stops it asks for are recorded
        if self.scheduler.stopping is not None:
            self.stop_recorded.set()
        return actions

    def _wait(self, wake: float | None) -> list[Event]:
        """The next event, or none once `wake` comes; then whatever else is at hand."""
        timeout = None if wake is None else min(_LONGEST_WAIT, max(0.0, wake - self.clock()))
        try:
            first = [self._events.get(timeout=timeout)]
        except queue.Empty:
            first = []
        return first + self._pending()

    def _pending(self) -> list[Event]:
        events: list[Event] = []
        while True:
            try:
                events.append(self._events.get_nowait())
            except queue.Empty:
                return events

    def _carry_out(self, actions: Actions, unstarted: list[Run]) -> None:
        """Tell, stop, start: the record holds all of it already. `unstarted` keeps the runs not yet handed to
        the executor, for `_abort`, should a start raise."""
        self._tell(actions.notes)
        for stop in actions.stop:
            self.executor.stop(stop.run, stop.state, stop.detail, stop.reason)
        unstarted[:] = actions.start
        while unstarted:
            self.executor.start(unstarted[0], self.post)
            unstarted.pop(0)

    def _tell(self, notes: list[Note]) -> None:
        """Tell every observer; one that raises (stdout closed under `| head`, the events file's disk full, a
        display that broke) is left out with one note, and the sweep goes on: output never stops the work."""
        for note in notes:
            for observer in list(self.observers):
                try:
                    observer(note.what, note.subject, note.outcome)
                except Exception as e:
                    self.observers.remove(observer)
                    label = getattr(observer, "label", None) or getattr(observer, "__name__",
                                                                        type(observer).__name__)
                    self._say(f"note: {label} failed ({type(e).__name__}: {e}); left out, the sweep goes on")

    def _say(self, line: str) -> None:
        with contextlib.suppress(Exception):  # stderr is gone too: nothing left to say it on
            self.log(line)

    def _abort(self, error: Exception, unstarted: list[Run]) -> None:
        """The dispatcher cannot go on: end every run as Ctrl-C does and wait for each to end, recording it
        interrupted where the ledger can still be written. No process of the sweep outlives the runner."""
        actions = self.scheduler.abort(error, self.clock(), unstarted)
        self.stop_recorded.set()
        for stop in actions.stop:
            with contextlib.suppress(Exception):
                self.executor.stop(stop.run, stop.state, stop.detail, stop.reason)
        while self.scheduler.busy:
            self._tell(self.scheduler.wind_down([self._events.get()], self.clock()).notes)

