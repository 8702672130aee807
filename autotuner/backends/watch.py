"""Watching a cluster's hosts while a sweep runs: one thread that asks the backend, every `interval` seconds,
which hosts answer now, and posts HostLost for a host that stopped answering and HostBack for one that answers
again (the scheduler then ends and requeues, or reuses, what ran there).

A backend supplies only the asking (`Look`): SSH probes each host it was told was lost, Slurm reads the nodes'
states from slurmctld, Ray its nodes from the GCS. The watcher owns the thread, the lost set and its lock; the
backend that built it closes it (`close`, once the executor's runs have ended).
"""
from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable, Iterable, Sequence

from .. import limits
from ..core.events import HostBack, HostLost, Post
from ..threads import Workers

log = logging.getLogger(__name__)

# Of the hosts asked, each with None when it answers now, else why it is lost. Yielded one at a time, so that
# a slow probe per host can be left as soon as the watcher is closed.
Look = Callable[[Sequence[str]], Iterable[tuple[str, str | None]]]


def env_seconds(name: str, default: float) -> float:
    """Seconds an environment variable sets: at least 0.1, at most limits.SECONDS; the default where it is not
    such a number (`inf` or `1e300` overflowed the waits they were handed: a traceback), with a warning."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= limits.SECONDS:  # NaN fails it too
        log.warning("%s=%s is not a number of seconds from 0 to %s: using %g", name, text[:40],
                    f"{limits.SECONDS:,}", default)
        return default
    return max(0.1, value)


class PollingWatcher:
    """Asks `look` every `interval` seconds about `hosts` (with none given, about the hosts told lost), and
    posts HostLost / HostBack as their answers change. `then` runs after each look, on the same thread (the
    Slurm allocation's end); an error of a type in `transient` (the cluster's controller restarting) is logged
    and the hosts are asked again next time. Its one thread starts at once and is joined by `close()`."""

    def __init__(self, name: str, look: Look, post: Post, interval: float, *, hosts: Sequence[str] = (),
                 then: Callable[[], None] | None = None,
                 transient: tuple[type[Exception], ...] = (Exception,)):
        self.name, self.look, self.post, self.interval = name, look, post, interval
        self.hosts, self.then, self.transient = tuple(hosts), then, transient
        self._lost: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._workers = Workers(name)
        self._workers.start(name, self._loop)

    def watch(self, host: str) -> None:
        """A host found lost by an attempt (or before the first launch): told back (HostBack) once it answers."""
        with self._lock:
            self._lost.add(host)

    def lost_now(self) -> list[str]:
        """One look now, on the caller's thread, at `hosts`: those that do not answer (each then watched; no
        event is posted, the caller marks them down itself)."""
        lost = [host for host, why in self.look(self.hosts) if why is not None]
        for host in lost:
            self.watch(host)
        return lost

    def close(self) -> None:
        """Stop looking; returns once the thread has ended (within a look under way)."""
        self._stop.set()
        self._workers.close(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except self.transient as e:
                log.debug("%s: %s", self.name, e)

    def check(self) -> None:
        """One look at the hosts (`hosts`; with none, the lost ones), then `then`."""
        with self._lock:
            asked = list(self.hosts) or sorted(self._lost)
        for host, why in self.look(asked):
            if self._stop.is_set():
                return
            with self._lock:
                known = host in self._lost
                lost = why is not None
                if lost != known:
                    (self._lost.add if lost else self._lost.discard)(host)
            if lost and not known:
                self.post(HostLost(host, why or ""))
            elif not lost and known:
                self.post(HostBack(host))
        if self.then is not None:
            self.then()
