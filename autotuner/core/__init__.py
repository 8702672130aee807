"""The scheduling core: which attempt runs where and when, and the words it is told things in.

Pure: no threads, no processes, no sleeping; the clock and the executor are handed in, so a simulated pair
can drive the same code. `events` holds the values (Run, Queued and the events posted to the dispatcher),
`resources` the slots and the placement and queue policies, `scheduler` the dispatcher, the `Executor`
protocol it drives and the `Observer` callback it tells. Imports point one way: the core uses the ledger,
the outcome and the spec, and nothing of SSH, views or the CLI.
"""
from __future__ import annotations

from .events import (
    Cancel,
    CheckRequests,
    Deadline,
    Event,
    Finished,
    HostBack,
    HostLost,
    Interrupt,
    Key,
    Launched,
    Post,
    Queued,
    Run,
)
from .resources import BackfillQueue, BestFit, Placement, Reservation, SlotPool
from .scheduler import Executor, Observer, Scheduler

__all__ = [
    "BackfillQueue", "BestFit", "Cancel", "CheckRequests", "Deadline", "Event", "Executor", "Finished", "HostBack",
    "HostLost", "Interrupt", "Key", "Launched", "Observer", "Placement", "Post", "Queued", "Reservation", "Run",
    "Scheduler", "SlotPool",
]
