"""The live view's ETA: when the sweep should end, re-planned on the scheduler's own policies (`plan.time_left`)
as runs end, at a bounded cost. A plan holds until the next event, or until the runs have aged a while; and
however fast runs end, and however long ago it was made, it is not re-planned within REPLAN_SHARE times its own
cost (on 8 slots of 0.2 s runs every frame saw an event, and re-planning at every frame cost the runner a tenth
of a core; a plan that aged past REPLAN_SECONDS was re-planned whatever it cost, 4.5% of a core).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from ..core.placement import placement_named
from ..core.slots import Placement, devices_from_json
from ..ledger.store import SweepMeta
from ..planning.plan import Ongoing, time_left
from ..spec import Experiment
from ..states import State
from .livestate import LiveState

REPLAN_SECONDS = 5.0
REPLAN_SHARE = 50  # the ETA's re-planning takes at most 1/50 of the time the view is shown


@dataclass(frozen=True)
class _Plan:
    changes: int  # the view's changes it was made at
    valid_until: float  # however few changes since
    end: float | None  # when the sweep should end
    not_before: float  # not re-planned before, however many changes since


class Eta:
    """The planned end of a sweep, kept between frames (thread-safe: asked by the display's thread)."""

    def __init__(self, meta: SweepMeta, default_timeout: float | None = None):
        self._default_timeout = default_timeout
        self._placement: Placement = placement_named(
            meta.placement or "pack", {h: (meta.gpu_types or {}).get(h) for h in meta.slots}, meta.gpu_memory,
            devices=devices_from_json(meta.devices), slots=meta.slots)
        self._lock = threading.Lock()
        self._plan: _Plan | None = None

    def planned_end(self, state: LiveState, now: float, changes: int, experiments: Mapping[str, Experiment],
                    order: Mapping[str, int]) -> float | None:
        """The end as last planned while it holds (`changes`: the view's count of what it was told), else
        re-planned now."""
        with self._lock:
            plan = self._plan
        if plan is not None and now < plan.valid_until and (plan.changes == changes or now < plan.not_before):
            return plan.end
        started = time.perf_counter()
        end = self._replan(state, now, experiments, order)
        cost = time.perf_counter() - started
        with self._lock:
            self._plan = _Plan(changes, now + max(REPLAN_SECONDS, REPLAN_SHARE * cost), end, now + REPLAN_SHARE * cost)
        return end

    def _replan(self, state: LiveState, now: float, known: Mapping[str, Experiment],
                order: Mapping[str, int]) -> float | None:
        """What waits and what runs, re-planned (outside the view's lock: the dispatcher never waits for it)."""
        queued = sorted((name for name, s in state.states.items() if s == State.QUEUED and name in known),
                        key=lambda name: order.get(name, len(order)))
        running = [Ongoing(known[r.name], r.slots, max(0.0, now - r.started_at))
                   for r in state.running if r.name in known]
        left = time_left(state.slots, [known[name] for name in queued], running, state.durations,
                         down=sorted(state.down), timeout=self._default_timeout, placement=self._placement)
        return None if left is None else now + left
