"""The scheduling core: which attempt runs where and when, and the words it is told things in.

Pure: no threads, no processes, no clock, no blocking; `Scheduler.step(events, now)` returns what to start, stop
and tell, so the real dispatcher (dispatcher.py) and the simulator (simulate.py) drive the same code. `events`
holds the values (Run, Queued and the events a driver hands in), `slots` the slot pool and what experiments need of
it, `placement` and `queues` the policies, `record` what the scheduler writes to (the ledger, or memory for a
simulation), `scheduler` the state machine, `roles` the `Executor` protocol drivers carry its actions out through,
the `Observer` callback they tell and the `Searcher` hook a searcher feeds the queue through (and says which running
attempts cannot win). Imports point one way: the core uses the outcome and the spec, and nothing of SSH, views or
the CLI.
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
    MemoryRead,
    Post,
    Progress,
    Queued,
    Run,
)
from .placement import PLACEMENTS, Pack, Spread
from .queues import BackfillQueue, fifo
from .record import MemoryRecord, Record
from .roles import Executor, Observer, Searcher
from .scheduler import Actions, Note, Scheduler, Stop
from .slots import Placement, Reservation, SlotPool

__all__ = [
    "PLACEMENTS", "Actions", "BackfillQueue", "Cancel", "CheckRequests", "Deadline", "Event", "Executor", "Finished",
    "HostBack", "HostLost", "Interrupt", "Key", "Launched", "MemoryRead", "MemoryRecord", "Note", "Observer", "Pack",
    "Placement", "Post", "Progress", "Queued", "Record", "Reservation", "Run", "Scheduler", "Searcher", "SlotPool",
    "Spread", "Stop", "fifo",
]
