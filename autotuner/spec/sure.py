"""Measure until sure: a run ends as soon as its steps pin its metric down, rather than after a fixed count.

A run whose config's `autotuning` section holds `tolerance` (a fraction: 0.03 is 3%) is measured until its 95%
interval (interval.py) has a half-width of at most that fraction of its mean, once it has made SURE_STEPS
measured steps; its engine profiles up to `end_profile_step`, the most it may measure, where DeepSpeed's engine
ends it as ever. The runner ends it as soon as it is sure (core/scheduler.py), recorded succeeded, its metric the
steps' mean: the stop is recorded before its signal like every other stop, so a runner killed in between leaves
it for the next to read as the success it was. The key is ours: DeepSpeed's engine reads the section's keys it
knows and ignores the rest.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from .. import limits
from ..errors import shown
from ..jsonvalues import JSON
from .interval import MAX_BATCHES, StepReading, t95

MIN_STEPS = 4  # measured steps (after warm-up) a run makes before its interval decides anything
TOLERANCE = "tolerance"  # the autotuning key: the half-width asked, relative to the mean
MOST = "max_measured_steps"  # the autotuning key: the most steps past start_profile_step a run measures
DEFAULT_TOLERANCE = 0.03  # `autotune tune`'s, unless the config or --tolerance says otherwise
DEFAULT_MOST = 30  # `autotune tune`'s, and a `run` sweep's experiment that asks a tolerance and sets no window end
START = 3  # DeepSpeed's default start_profile_step
# Batches of the interval (interval.py) before it can say a run is sure: with two, its width rests on one degree of
# freedom (the difference of two batch means), narrow by chance often enough that stopping on the first narrow one
# ends noisy runs early at a lucky mean; three (nine measured steps) give the spread two and Student's t 4.3.
SURE_BATCHES = 3
SURE_STEPS = max(MIN_STEPS, SURE_BATCHES ** 2)  # the fewest measured steps whose interval has SURE_BATCHES batches


def tolerance_of(ds_config: Mapping[str, JSON]) -> float | None:
    """The tolerance an experiment's config asks its runs to be measured to; None: a fixed profile window."""
    section = ds_config.get("autotuning")
    value = section.get(TOLERANCE) if isinstance(section, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        return None
    return float(value)


def problem(ds_config: Mapping[str, JSON]) -> str | None:
    """What is wrong with the measuring until sure a `run` sweep's experiment asks (its config's own keys: a
    `tolerance`, the most steps it measures, `max_measured_steps`, or the window `end_profile_step` ends), as its
    refusal says it; None: nothing, or not asked. A key of ours that would be ignored is refused with the rest."""
    section = ds_config.get("autotuning")
    if not isinstance(section, Mapping):
        return None
    if section.get(TOLERANCE) is None:
        return (f"autotuning.{MOST} bounds a run measured until sure: give autotuning.{TOLERANCE} too (0.03: within "
                f"3% of the mean)" if MOST in section else None)
    if tolerance_of(ds_config) is None:
        return (f"autotuning.{TOLERANCE} must be a fraction between 0 and 1 (0.03: within 3% of the mean), not "
                f"{shown(section[TOLERANCE])}")
    for key, least in (("start_profile_step", 0), ("end_profile_step", 0), (MOST, SURE_STEPS)):
        value = section.get(key, least)
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= limits.COUNT:
            return f"autotuning.{key} must be a whole number from {least} to {limits.COUNT:,}, not {shown(value)}"
    start, end = section.get("start_profile_step", START), section.get("end_profile_step")
    if MOST in section and end is not None:
        return f"autotuning.{MOST} and end_profile_step both bound the profile window: give one"
    if isinstance(start, int) and isinstance(end, int) and end - start < SURE_STEPS:
        return (f"autotuning.end_profile_step {end} leaves {end - start} measured step(s) past start_profile_step "
                f"{start}, fewer than the {SURE_STEPS} a run makes before its interval can end it")
    return None


def most_of(ds_config: Mapping[str, JSON]) -> int:
    """The most steps a run measured until sure measures where its config sets no `end_profile_step`: its
    `max_measured_steps`, else DEFAULT_MOST."""
    section = ds_config.get("autotuning")
    most = section.get(MOST) if isinstance(section, Mapping) else None
    return most if isinstance(most, int) and not isinstance(most, bool) and most >= SURE_STEPS else DEFAULT_MOST


def steps_needed(spread: float, tolerance: float, most: int) -> int:
    """The measured steps a run whose steps spread by `spread` (relative) makes before it is sure to `tolerance`:
    the fewest (SURE_STEPS at least) whose interval, b = their square root batches, is narrow enough; `most` at
    most."""
    for n in range(SURE_STEPS, most):
        batches = min(MAX_BATCHES, max(2, math.isqrt(n)))
        if t95(batches) * spread / math.sqrt(n) <= tolerance:
            return n
    return most


def sure(reading: StepReading, tolerance: float) -> str | None:
    """Why a running attempt whose steps say `reading` is measured well enough, as its record says it; None while
    its interval is wider than `tolerance` of its mean, or rests on fewer than SURE_STEPS measured steps
    (SURE_BATCHES batches)."""
    interval = reading.interval
    if interval is None or interval.n < SURE_STEPS or interval.batches < SURE_BATCHES or \
            interval.half_width > tolerance:
        return None
    return (f"measured until sure: after {interval.n} measured steps its 95% interval is within "
            f"{interval.half_width:.2%} of its mean (tolerance {tolerance:.2%})")
