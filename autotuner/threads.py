"""Threads with an owner: every thread the runner starts belongs to a `Workers`, which joins it and logs its
failure, so no thread outlives what started it unnoticed and no exception is printed into the live view.

The owner is whatever holds the resource the threads work on (an executor, a host watcher, the runner): its
`close()` joins them. Threads are daemons only so that a hung system call cannot keep a killed runner's
process alive; nothing relies on that for clean-up.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVarTuple

log = logging.getLogger("autotuner.threads")
Ts = TypeVarTuple("Ts")


class Workers:
    """Starts named threads, remembers those still running, joins them on `close()`."""

    def __init__(self, owner: str):
        self.owner = owner
        self._lock = threading.Lock()
        self._running: set[threading.Thread] = set()

    def start(self, name: str, target: Callable[[*Ts], object], *args: *Ts) -> threading.Thread:
        """Run `target(*args)` on a new thread; an exception it raises is logged with the owner's name."""
        thread = threading.Thread(target=self._run, args=(target, args), name=f"{self.owner}-{name}", daemon=True)
        with self._lock:
            self._running.add(thread)
        thread.start()
        return thread

    def _run(self, target: Callable[[*Ts], object], args: tuple[*Ts]) -> None:
        try:
            target(*args)
        except BaseException:  # a bug: logged where --debug shows it, never printed over the live view
            log.exception("thread %s failed", threading.current_thread().name)
        finally:
            with self._lock:
                self._running.discard(threading.current_thread())

    def running(self) -> list[threading.Thread]:
        with self._lock:
            return list(self._running)

    def close(self, timeout: float | None = None) -> list[str]:
        """Join every thread (each within `timeout` seconds); returns the names of those still running."""
        for thread in self.running():
            if thread is not threading.current_thread():
                thread.join(timeout)
        left = [t.name for t in self.running() if t is not threading.current_thread()]
        if left:
            log.warning("%s: threads still running after close: %s", self.owner, ", ".join(left))
        return left
