"""How long a tune's runs measure: the profile window each experiment's engine gets, and whether the runner ends
a run once it is sure (spec/sure.py), from the config's `autotuning` keys and `autotune tune`'s options.

`autotune tune` measures until sure by default (DEFAULT_TOLERANCE, at most DEFAULT_MOST measured steps): a
window of DeepSpeed's default three steps gives an interval too wide to rank close configs, a long fixed window
spends GPU-hours on runs that were known long before it ended. A config that sets `end_profile_step` and neither
key of ours asked for that window: it is kept as DeepSpeed documents it. `tolerance: null` (or `--tolerance off`)
asks for the fixed window too. With a tolerance, `max_measured_steps` (or `end_profile_step`, not both) bounds
the window: the engine profiles from `start_profile_step` to at most that many steps past it and ends the run
there, as ever, where it was never sure.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import limits
from ..errors import UserError, shown
from ..jsonvalues import JSONObject
from ..spec.reading import Source
from ..spec.sure import DEFAULT_MOST, DEFAULT_TOLERANCE, MOST, START, SURE_STEPS, TOLERANCE
from .knobs import whole

OFF = "off"  # --tolerance off: the fixed window


@dataclass(frozen=True)
class Asked:
    """What `autotune tune`'s options ask, over the config's keys: a tolerance (None: the config's), `off` for the
    fixed window, and the most measured steps (None: the config's)."""

    tolerance: float | None = None
    off: bool = False
    most: int | None = None


CONFIGS = Asked()  # no option given: the config's keys, else the defaults


def asked(tolerance: str | None, most: int | None) -> Asked:
    """`--tolerance` (a fraction, or "off") and `--max-measured-steps`, checked."""
    if most is not None and most < SURE_STEPS:
        raise UserError(f"--max-measured-steps {most} is below the {SURE_STEPS} measured steps a run makes before "
                        "its interval can end it")
    if most is not None and most > limits.COUNT:
        raise UserError(f"--max-measured-steps {most} is above {limits.COUNT:,}, the most steps a config's "
                        f"{MOST} may ask")
    if tolerance is None or tolerance.strip().lower() == OFF:
        return Asked(None, tolerance is not None, most)
    try:
        value = float(tolerance)
    except ValueError:
        value = math.nan
    if not 0 < value < 1:  # NaN fails too
        raise UserError(f"--tolerance must be a fraction between 0 and 1 (0.03: within 3% of the mean) or off, not "
                        f"{shown(tolerance)}")
    return Asked(value, False, most)


def engine_section(src: Source, section: JSONObject, start: int | None, end: int | None,
                   options: Asked, stepped: bool = True) -> JSONObject:
    """The autotuning keys each experiment's engine (and the runner) reads: the profile window and, measuring until
    sure, the tolerance (see the module's doc). `start`, `end`: the config's profile steps, checked. `stepped`:
    the tune's metric is one DeepSpeed's per-step lines measure (throughput); for another (latency,
    FLOPS_per_gpu) the runner reads steps only where the script writes them itself, so it measures until sure only
    where asked (by default its runs would make the whole 30-step window with nothing to end them)."""
    tolerance = _tolerance(src, section)
    most = _most(src, section, end)
    asked_none = options.tolerance is None and options.most is None and tolerance is None
    if options.off or (asked_none and (TOLERANCE in section or (end is not None and most is None) or
                                       (not stepped and most is None))):
        return {k: v for k, v in (("start_profile_step", start), ("end_profile_step", end)) if v is not None}
    first = start if start is not None else START
    if options.most is not None or most is not None or end is None:
        end = first + (options.most or most or DEFAULT_MOST)
    elif end - first < SURE_STEPS:
        raise src.error(f"end_profile_step {end} leaves {end - first} measured step(s) past start_profile_step "
                        f"{first}, fewer than the {SURE_STEPS} a run makes before its interval can end it: raise it, "
                        f"or set {MOST}", "end_profile_step")
    return {"start_profile_step": first, "end_profile_step": end,
            TOLERANCE: options.tolerance or tolerance or DEFAULT_TOLERANCE}


def _tolerance(src: Source, section: JSONObject) -> float | None:
    value = section.get(TOLERANCE)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise src.error(f"{TOLERANCE} must be a fraction between 0 and 1 (0.03: within 3% of the mean), or null for "
                        f"the fixed profile window, not {shown(value)}", TOLERANCE)
    return float(value)


def _most(src: Source, section: JSONObject, end: int | None) -> int | None:
    if MOST not in section:
        return None
    value = whole(section[MOST])  # 3e1, as JSON may write it, is 30
    if isinstance(value, bool) or not isinstance(value, int) or value < SURE_STEPS or value > limits.COUNT:
        raise src.error(f"{MOST} must be a whole number of at least {SURE_STEPS} (the measured steps a run makes "
                        f"before its interval can end it) and at most {limits.COUNT:,}, not {shown(section[MOST])}",
                        MOST)
    if end is not None:
        raise src.error(f"{MOST} and end_profile_step both bound the profile window: give one", MOST)
    return value
