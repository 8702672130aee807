"""Watching the Ray cluster's nodes while a sweep runs on them: a node Ray reports dead is a lost host (what ran
there is ended and queued again elsewhere), and a host that Ray lists alive again is back. Ray is asked (its
GCS), never the nodes; every POLL seconds (AUTOTUNE_RAY_POLL)."""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from types import ModuleType

from ...core.events import Event, HostBack, HostLost
from ...threads import Workers

log = logging.getLogger(__name__)

POLL_ENV = "AUTOTUNE_RAY_POLL"
POLL = 2.0


def poll_interval() -> float:
    try:
        return max(0.1, float(os.environ.get(POLL_ENV, POLL)))
    except ValueError:
        return POLL


class NodeWatcher:
    """Posts HostLost / HostBack as Ray reports the sweep's nodes (`nodes`: host -> {id, ip}) dead or alive."""

    def __init__(self, ray: Callable[[], ModuleType], nodes: Mapping[str, Mapping[str, str]],
                 post: Callable[[Event], None], interval: float | None = None):
        self.ray, self.post = ray, post
        self.hosts = {info["id"]: host for host, info in nodes.items()}
        self.interval = poll_interval() if interval is None else interval
        self._lost: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._workers = Workers("ray-watch")
        self._workers.start("ray-watch", self._loop)

    def watch(self, host: str) -> None:
        """A host found lost by an attempt: told back (HostBack) once Ray lists it alive."""
        with self._lock:
            self._lost.add(host)

    def dead_now(self) -> list[str]:
        """The sweep's hosts Ray does not list alive now (each then watched)."""
        alive = {n["NodeID"] for n in self.ray().nodes() if n["Alive"]}
        dead = [host for node_id, host in self.hosts.items() if node_id not in alive]
        for host in dead:
            self.watch(host)
        return dead

    def close(self) -> None:
        self._stop.set()
        self._workers.close(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception as e:  # the GCS restarting: asked again next time
                log.debug("watching the Ray cluster: %s", e)

    def check(self) -> None:
        alive = {n["NodeID"] for n in self.ray().nodes() if n["Alive"]}
        for node_id, host in self.hosts.items():
            with self._lock:
                known = host in self._lost
                lost = node_id not in alive
                if lost != known:
                    (self._lost.add if lost else self._lost.discard)(host)
            if lost and not known:
                self.post(HostLost(host, "Ray reports the node dead"))
            elif not lost and known:
                self.post(HostBack(host))
