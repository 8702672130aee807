"""Watching the allocation while a sweep runs in it: a node Slurm marks DOWN or DRAIN is lost to the sweep
(what ran there is ended and queued again elsewhere) and comes back when Slurm clears it; the allocation's end
(its time limit, or a cancel) interrupts the sweep cleanly a margin before Slurm would kill what runs, so that
`autotune resume --slurm` in a new allocation finishes it."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime

from ..core.events import Event, HostBack, HostLost, Interrupt
from ..threads import Workers
from .allocation import Allocation, SlurmError, env_seconds, job_state, node_states

log = logging.getLogger(__name__)

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


class AllocationWatcher:
    """Posts HostLost / HostBack as Slurm changes the allocation's nodes' states, and Interrupt once before
    the allocation ends (`margin` seconds before its end time) or as soon as it has ended."""

    def __init__(self, allocation: Allocation, post: Callable[[Event], None], margin: float,
                 interval: float | None = None, clock: Callable[[], float] = time.time):
        self.allocation, self.post, self.margin, self.clock = allocation, post, margin, clock
        self.interval = poll_interval() if interval is None else interval
        self._lost: set[str] = set()
        self._lock = threading.Lock()
        self._ended = False
        self._stop = threading.Event()
        self._workers = Workers("slurm-watch")
        self._workers.start("slurm-watch", self._loop)

    def watch(self, node: str) -> None:
        """A node found lost elsewhere (a run's srun said so): told back (HostBack) once Slurm shows it fine."""
        with self._lock:
            self._lost.add(node)

    def close(self) -> None:
        self._stop.set()
        self._workers.close(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except SlurmError as e:  # slurmctld busy or restarting: asked again next time
                log.debug("watching the allocation: %s", e)

    def check(self) -> None:
        """One look at the nodes and the job."""
        for name, node in node_states(self.allocation.nodes).items():
            with self._lock:
                known = name in self._lost
                if node.lost != known:
                    (self._lost.add if node.lost else self._lost.discard)(name)
            if node.lost and not known:
                self.post(HostLost(name, f"Slurm marks it {node.why}"))
            elif not node.lost and known:
                self.post(HostBack(name))
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
