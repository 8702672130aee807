"""The ETA the page shows: the terminal's own (`plan.time_left`, the scheduler's policies re-played on what
waits and what runs), worked out on a thread of its own so that no request waits for a re-plan.

A plan holds until it has aged (`REPLAN_SECONDS`, as the live view's, or ten times what it cost), however much the
sweep moved meanwhile: a busy sweep moves several times a second, and a re-plan of hundreds of waiting
experiments would then take a core from the runner. One plan at a time per sweep.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from ..core.placement import placement_named
from ..core.slots import devices_from_json
from ..planning.plan import Ongoing, time_left
from ..states import State
from ..threads import Workers
from ..views.eta import REPLAN_SECONDS
from ..views.snapshot import Snapshot

# States whose duration says how long an experiment takes (as the live view counts them).
TIMED = (State.SUCCEEDED, State.FAILED, State.TIMED_OUT)


@dataclass(frozen=True)
class PlannedEnd:
    seq: int  # the transition it was planned at
    made: float
    valid_until: float
    end: float | None  # when the sweep should end (seconds since the epoch); None: nothing to go on yet


class Planner:
    """Re-plans each sweep's end in the background; `end` answers at once with the latest plan."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._plans: dict[Path, PlannedEnd] = {}
        self._busy: set[Path] = set()
        self._workers = Workers("dashboard-eta")

    def end(self, snap: Snapshot, seq: int, lost: Collection[str], now: float) -> PlannedEnd | None:
        """The latest plan of this sweep (None before the first); a new one is started when it is due."""
        key = snap.directory
        with self._lock:
            plan = self._plans.get(key)
            due = plan is None or now >= plan.valid_until
            if due and key not in self._busy:
                self._busy.add(key)
                self._workers.start("plan", self._plan, snap, seq, tuple(lost), now)
        return plan

    def _plan(self, snap: Snapshot, seq: int, lost: tuple[str, ...], now: float) -> None:
        started = time.perf_counter()
        try:
            end = planned_end(snap, lost, now)
        finally:
            cost = time.perf_counter() - started
            with self._lock:
                self._busy.discard(snap.directory)
        with self._lock:
            self._plans[snap.directory] = PlannedEnd(seq, now, now + max(REPLAN_SECONDS, 10 * cost), end)

    def close(self) -> None:
        self._workers.close(timeout=30)


def planned_end(snap: Snapshot, lost: tuple[str, ...], now: float) -> float | None:
    """When the sweep should end, re-planned as the live view does (`LiveView._replan`)."""
    meta = snap.meta
    slots = {h: tuple(ids) for h, ids in meta.slots.items()}
    placement = placement_named(meta.placement or "pack", {h: (meta.gpu_types or {}).get(h) for h in slots},
                                meta.gpu_memory, devices=devices_from_json(meta.devices), slots=meta.slots)
    known = snap.experiments
    queued = [known[a.name] for a in snap.attempts if a.state == State.QUEUED and a.name in known]
    running = [Ongoing(known[a.name], dict(a.slots), max(0.0, now - (a.started_at or now)))
               for a in snap.attempts if a.state == State.RUNNING and a.name in known]
    seen = [a.duration for a in snap.attempts if a.state in TIMED and a.duration is not None]
    left = time_left(slots, queued, running, seen, down=sorted(lost), placement=placement)
    return None if left is None else now + left
