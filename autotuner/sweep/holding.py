"""Holding a sweep: its lock taken with SIGUSR1 listened to, both given back together. The runner holds a sweep
while it runs it; `cancel` holds one to apply a request when no runner is alive.

`autotune cancel` signals (SIGUSR1) whoever holds the lock, and SIGUSR1's default action ends a process: a
cancel sent while the holder still cleared up would kill it. So SIGUSR1 is listened to from before the lock is
taken until after it is released; the request waits in the ledger, and the dispatcher reads pending requests when
it starts and on each SIGUSR1 while it runs."""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

from ..ledger.lock import SweepLock

Handler = Callable[[int, FrameType | None], object] | int | None  # what signal.signal returns


def listen_for_requests() -> Handler:
    """SIGUSR1 made harmless (on the main thread only: signals are set there); returns the handler it replaced."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGUSR1, lambda *_: None)


def restore_handler(signum: int, previous: Handler) -> None:
    if previous is not None:
        signal.signal(signum, previous)


@contextlib.contextmanager
def holding(directory: Path) -> Iterator[SweepLock]:
    """The sweep's lock, SIGUSR1 listened to the whole time; `SweepBusy` (with the holder's pid) when a live
    process holds it."""
    previous = listen_for_requests()
    try:
        lock = SweepLock(directory).acquire()
        try:
            yield lock
        finally:
            lock.release()
    finally:
        restore_handler(signal.SIGUSR1, previous)
