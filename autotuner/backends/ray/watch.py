"""Watching the Ray cluster's nodes while a sweep runs on them: a node Ray reports dead is a lost host (what ran
there is ended and queued again elsewhere), and a host that Ray lists alive again is back. Ray is asked (its
GCS), never the nodes; every POLL seconds (AUTOTUNE_RAY_POLL)."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType

from ...core.events import Event
from ..watch import PollingWatcher, env_seconds

POLL_ENV = "AUTOTUNE_RAY_POLL"
POLL = 2.0


def poll_interval() -> float:
    """Seconds between looks at the nodes (`AUTOTUNE_RAY_POLL`, else POLL; `inf` would end the watch's thread)."""
    return env_seconds(POLL_ENV, POLL)


class NodeWatcher:
    """Posts HostLost / HostBack as Ray reports the sweep's nodes (`nodes`: host -> {id, ip}) dead or alive (a
    PollingWatcher asking Ray's node table); its owner closes it."""

    def __init__(self, ray: Callable[[], ModuleType], nodes: Mapping[str, Mapping[str, str]],
                 post: Callable[[Event], None], interval: float | None = None):
        self.ray = ray
        self.hosts = {info["id"]: host for host, info in nodes.items()}
        self._poll = PollingWatcher("ray-watch", self.look, post, poll_interval() if interval is None else interval,
                                    hosts=list(self.hosts.values()))
        self.watch, self.dead_now, self.close = self._poll.watch, self._poll.lost_now, self._poll.close

    def look(self, hosts: Sequence[str]) -> Iterator[tuple[str, str | None]]:
        """Each of `hosts` (of the sweep's nodes) with None when Ray lists its node alive."""
        alive = {n["NodeID"] for n in self.ray().nodes() if n["Alive"]}
        for node_id, host in self.hosts.items():
            if host in hosts:
                yield host, None if node_id in alive else "Ray reports the node dead"
