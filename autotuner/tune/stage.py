"""What the search knows of one ZeRO stage (`Stage`: sizes that fit, sizes that do not, sizes out, the memory
model's bound), and what the stages tell each other: at the same size a lower stage needs at least the memory of
a higher one (`ordered`), so an OOM at stage 2 rules out stages 0 and 1 there (`ruled_out_above`) and a fit at
stage 1 vouches for stages 2 and 3 (`vouched`).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .space import MAX_MICRO_BATCH


@dataclass
class Stage:
    """What is known of one ZeRO stage: sizes that fit (with their metric), sizes that do not, sizes out."""

    fits: dict[int, float] = field(default_factory=dict)
    too_big: set[int] = field(default_factory=set)
    oom: set[int] = field(default_factory=set)  # of too_big, those that ran out of memory (not out of time)
    out: set[int] = field(default_factory=set)  # proposed, not ended yet
    crashed: set[int] = field(default_factory=set)  # failed for a reason that says nothing of memory
    given_up: bool = False
    predicted: int | None = None  # the memory model's largest size that fits (0: none, the stage is skipped)
    top: int = MAX_MICRO_BATCH  # the largest size the user allows
    accumulation: dict[int, int] = field(default_factory=dict)  # sizes measured below the largest -> the
    # accumulation derived for them, fixed when proposed (knowledge.accumulation_of)

    def pruned(self, mbs: int) -> bool:
        """Known not to fit: a size at or above one that ran out of memory (or time), or above the ceiling."""
        return any(mbs >= small for small in self.too_big) or mbs > self.ceiling()

    def ceiling(self) -> int:
        """The largest size worth trying: the predicted largest until a run there fits; then a probe past it
        (an eighth more), and while probes fit (the model was low), probes twice as far each time."""
        if self.predicted is None or self.predicted >= self.top:
            return self.top
        fit = max(self.fits, default=0)
        ceiling, step = self.predicted, max(1, self.predicted // 8)
        while fit >= ceiling and ceiling < self.top:
            ceiling, step = ceiling + step, step * 2
        return min(ceiling, self.top)


Needs = Callable[[int, int], bool]  # whether lane a needs at least lane b's memory at the same size


def lower(a: int, b: int) -> bool:
    """Plain stages: a lower stage needs at least a higher one's memory."""
    return a < b


def ordered(stages: Mapping[int, Stage], needs: Needs = lower) -> bool:
    """Whether the runs agree that a lower ZeRO stage needs at least the memory of a higher one at the same size
    (what partitioning more implies; with one data-parallel GPU only the buffers differ): no stage fits at or
    above a size where a higher stage ran out of memory. A run that contradicts it turns the inference off
    (`vouched`, `ruled_out_above`). With layouts (lanes: layout.py), `needs` says which lane needs at least which
    (a lower stage, a smaller TP size, checkpointing off)."""
    return not any(fit >= oom for high, known in stages.items() for oom in known.oom
                   for low, other in stages.items() if needs(low, high) for fit in other.fits)


def vouched(stages: Mapping[int, Stage], stage: int, needs: Needs = lower) -> int | None:
    """The largest size known to fit at `stage`: its own, or one that fits at a lane that needs more."""
    more = [s for s in stages if needs(s, stage)] if ordered(stages, needs) else []
    return max((m for s in (stage, *more) for m in stages[s].fits), default=None)


def ruled_out_above(stages: Mapping[int, Stage], stage: int, needs: Needs = lower) -> int | None:
    """The smallest size known not to fit at `stage`: its own out of memory or time, or one where a lane that
    needs less ran out of memory."""
    less = [s for s in stages if needs(stage, s)] if ordered(stages, needs) else []
    return min([*stages[stage].too_big, *(m for s in less for m in stages[s].oom)], default=None)
