"""Watching the allocation while a sweep runs in it: a node Slurm marks DOWN or DRAIN is lost to the sweep
(what ran there is ended and queued again elsewhere) and comes back when Slurm clears it; the allocation's end
(its time limit, or a cancel) interrupts the sweep cleanly a margin before Slurm would kill what runs, so that
`autotune resume --slurm` in a new allocation finishes it."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime

from ...core.events import Interrupt, Post
from ..watch import Look, PollingWatcher
from .allocation import Allocation, SlurmError, env_seconds, job_state, node_states

POLL_ENV = "AUTOTUNE_SLURM_POLL"  # seconds between looks (default POLL): slurmctld is asked, never the nodes
POLL = 5.0


def poll_interval() -> float:
    """Seconds between looks at the allocation (`AUTOTUNE_SLURM_POLL`, else POLL)."""
    return env_seconds(POLL_ENV, POLL)


def end_seconds(end_time: str | None) -> float | None:
    """Slurm's EndTime (local time, `2026-11-23T22:10:00`) in seconds since the epoch; None if there is none."""
    if not end_time:
        return None
    try:
        return datetime.fromisoformat(end_time).timestamp()
    except ValueError:
        return None


def node_states_look(allocation: Allocation) -> Look:
    """The allocation watcher's look: the nodes' states as slurmctld has them (None: the node can run)."""
    def look(nodes: Sequence[str]) -> Iterator[tuple[str, str | None]]:
        for name, node in node_states(list(nodes)).items():
            yield name, f"Slurm marks it {node.why}" if node.lost else None
    return look


def allocation_watcher(allocation: Allocation, post: Post, margin: float, interval: float | None = None,
                       clock: Callable[[], float] = time.time) -> PollingWatcher:
    """Posts HostLost / HostBack as Slurm changes the allocation's nodes' states, and Interrupt once before the
    allocation ends (`margin` seconds before its end time) or as soon as it has ended. Its owner closes it."""
    return PollingWatcher("slurm-watch", node_states_look(allocation), post,
                          poll_interval() if interval is None else interval, hosts=allocation.nodes,
                          then=AllocationEnd(allocation, post, margin, clock), transient=(SlurmError,))


class AllocationEnd:
    """Posts Interrupt once, when the allocation has ended or is within `margin` seconds of its end time."""

    def __init__(self, allocation: Allocation, post: Post, margin: float, clock: Callable[[], float]):
        self.allocation, self.post, self.margin, self.clock = allocation, post, margin, clock
        self._ended = False

    def __call__(self) -> None:
        """One look at the job (after the watcher's look at its nodes)."""
        if self._ended:
            return
        job = job_state(self.allocation.job)
        if job is None or job.state != "RUNNING":
            self._ended = True
            self.post(Interrupt(f"the Slurm allocation {self.allocation.job} ended "
                                f"({job.state if job else 'gone'})"))
            return
        end = end_seconds(job.end_time)
        if end is not None and end - self.clock() <= self.margin:
            self._ended = True
            self.post(Interrupt(f"the Slurm allocation {self.allocation.job} ends at {job.end_time} "
                                f"(its time limit): stopped {self.margin:g} s before"))
