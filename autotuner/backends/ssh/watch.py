"""Noticing that a lost host answers again: the one fact about hosts that no event announces."""
from __future__ import annotations

import threading

from ...core.events import HostBack, Post
from ...threads import Workers
from .pool import SSHPool


class HostWatcher:
    """Probes the hosts it was told were lost, every `interval` seconds, and posts HostBack when one answers.

    Its one thread is joined by `close()`.
    """

    def __init__(self, pool: SSHPool, post: Post, interval: float = 10.0):
        self._pool = pool
        self._post = post
        self._interval = interval
        self._down: set[str] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._workers = Workers("hostwatch")
        self._workers.start("loop", self._loop)

    def watch(self, host: str) -> None:
        with self._lock:
            self._down.add(host)

    def close(self) -> None:
        """Stop probing; returns once the thread has ended (a probe under way takes at most 5 s)."""
        self._closed.set()
        self._workers.close(timeout=30)

    def _loop(self) -> None:
        while not self._closed.wait(self._interval):
            with self._lock:
                down = sorted(self._down)
            for host in down:
                if self._closed.is_set():
                    return
                if self._pool.is_up(host, timeout=5):
                    with self._lock:
                        self._down.discard(host)
                    self._post(HostBack(host))
