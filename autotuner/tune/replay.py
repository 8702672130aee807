"""A search rebuilt from the ledger (`replay`), the ledger being the truth: the search keeps no state of its own
that the ledger lacks, so on resume it is rebuilt by replaying every experiment the ledger holds, and makes the
decisions the search that died would have made.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..spec import Experiment
from ..spec.metrics import reported_peak
from ..states import State
from .memory_loop import MemoryLoop
from .outclass import recorded_optimistic
from .reruns import rerun_of

Latest = Mapping[str, tuple[State, str | None, float | None]]  # each experiment's last state, reason and metric


def replay(search: MemoryLoop, experiments: Sequence[Experiment], latest: Latest,
           metrics: Mapping[str, Mapping[str, float]] | None = None) -> None:
    """Rebuild `search` from the ledger: every experiment it holds was proposed; those ended are learnt, in the
    ledger's order; the others (queued, running, interrupted: to run again) are out. `metrics`: each experiment's
    recorded metrics (the profile run's model info)."""
    for e in experiments:
        search.proposed.add(e.name)
        profiled = search.spec.profile_of(e.name)
        if profiled is not None:
            state, reason, _ = latest.get(e.name, (State.QUEUED, None, None))
            if state.terminal and state != State.INTERRUPTED:
                search.learn_profile(profiled, state, reason, (metrics or {}).get(e.name), live=False)
            else:
                search.profile, search.profile_stage = "out", profiled
            continue
        placed = search.place_of(e)
        rerun = rerun_of(e.name)
        if rerun is None and placed is not None and search.level_of(e) > search.spec.offload:
            search.escalate(search.level_of(e))  # the search went on with offload here
        knobs = search.setting_of(e) if placed is not None else ()
        if rerun is None and placed is not None and placed[0] in search.stages:
            if knobs:
                search.knob_trials.append((*placed, knobs))
            else:
                search.trials.append(placed)
                search.remember_accumulation(e)
        state, reason, value = latest.get(e.name, (State.QUEUED, None, None))
        if state == State.STOPPED:  # what it learnt then: its optimistic bound (outclass.py)
            value = recorded_optimistic((metrics or {}).get(e.name), search.metric)
        if state.terminal and state not in (State.INTERRUPTED, State.CANCELLED):
            search.learn(e, state, reason, value, reported_peak((metrics or {}).get(e.name)))
        elif state == State.CANCELLED:
            continue
        elif rerun is not None:
            search.rerun_out.add(rerun)
        elif placed is not None and placed[0] in search.stages:
            if knobs:
                search.knob_out.add((*placed, knobs))
            else:
                search.stages[placed[0]].out.add(placed[1])
