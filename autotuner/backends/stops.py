"""Stop requests for running attempts (cancel, Ctrl-C, a timeout, a lost host). Shared by the local and the
SSH executor.

A stop is asked from the dispatcher's thread (or a signal handler); the attempt's own thread waits on its
process and, once it ended, reads here how to record it (`StopAsked.settle`: the stop's state, unless the
attempt succeeded before the stop reached it or its host was lost). The scheduler recorded the stop in the ledger
before asking for it here, so a runner that dies meanwhile leaves it for the next to judge the same way.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Protocol

from ..core.events import Key, Run
from ..core.outcome import Outcome, StopAsked
from ..states import Reason, State


class Waitable(Protocol):
    """A process an executor follows: `wait` returns its exit status (None: none is known) and raises
    `TimeoutError` or `subprocess.TimeoutExpired` when `timeout` seconds pass first."""

    def wait(self, timeout: float | None = None) -> int | None: ...


class Stops:
    """The stops asked for running attempts, by key; thread-safe."""

    KILLED = (State.INTERRUPTED, "killed at once (interrupted twice)", None)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked: dict[Key, StopAsked] = {}
        self.killing = False  # kill_all was called: no grace period any more, and late starts are killed too

    def ask(self, key: Key, state: State, detail: str, reason: Reason | None = None) -> None:
        """The first request wins: a cancel is not turned into a timeout by the timer that fires after it."""
        with self._lock:
            self._asked.setdefault(key, StopAsked.of(state, detail, reason))

    def asked(self, key: Key) -> bool:
        with self._lock:
            return key in self._asked

    def kill_all(self, keys: Iterable[Key]) -> None:
        with self._lock:
            self.killing = True
            for key in keys:
                self._asked.setdefault(key, StopAsked.of(*self.KILLED))

    def settle(self, key: Key, outcome: Outcome) -> Outcome:
        """The outcome to record: the stop's, unless the attempt succeeded before the stop reached it, or its
        host was lost (then it runs again elsewhere)."""
        with self._lock:
            request = self._asked.pop(key, None)
        return outcome if request is None else request.settle(outcome)

    def wait(self, run: Run, proc: Waitable, *, end: Callable[[], None]) -> int | None:
        """Wait for the attempt to end. A stop asked before the wait began (a cancel, or a timeout, while it
        was being launched) is carried out first; one asked later is carried out by the executor's `stop`.
        Timeouts are the scheduler's timers (core/scheduler.py): they arrive here as stops like any other."""
        if self.asked(run.key):
            end()
        return proc.wait()
