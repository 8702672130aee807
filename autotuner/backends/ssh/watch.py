"""Noticing that a lost SSH host answers again: the one fact about hosts that no event announces. Only the
hosts told lost are probed (a run's connection failing says the rest), one at a time."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from ...core.events import Post
from ..watch import PollingWatcher
from .pool import SSHPool

PROBE_SECONDS = 5.0  # how long one probe waits: what `close()` may wait for a probe under way


def answers(pool: SSHPool) -> Callable[[Sequence[str]], Iterator[tuple[str, str | None]]]:
    """The look of a host watcher: each host probed in turn, None when it answers."""
    def look(hosts: Sequence[str]) -> Iterator[tuple[str, str | None]]:
        for host in hosts:
            yield host, None if pool.is_up(host, timeout=PROBE_SECONDS) else "no answer over SSH"
    return look


def host_watcher(pool: SSHPool, post: Post, interval: float = 10.0) -> PollingWatcher:
    """Probes the hosts it was told were lost (`watch`), every `interval` seconds, and posts HostBack when one
    answers. Its owner closes it."""
    return PollingWatcher("hostwatch", answers(pool), post, interval, transient=())
