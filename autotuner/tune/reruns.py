"""The confirming re-runs: when the search is over, its best configs are run once more (`NAME_confirm1`) and ranked
by the mean of their runs, so that one lucky measurement does not name the winner. Their names, how many are
re-run, and which ones next: pure functions of what the search learnt (search.py proposes them). A leader whose
first run's interval (spec/interval.py: METRIC_low, METRIC_high, of at least SURE_STEPS measured steps) is clear of
every other leader's is told apart already and not re-run; one whose interval overlaps another's, or that has none,
is."""
from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping

from ..spec.sure import SURE_STEPS

DEFAULT_CONFIRM = 2  # configs re-run when the user says nothing, once more than this many succeeded
RERUN = re.compile(r"(.+)_confirm([0-9]+)")


def rerun_name(name: str) -> str:
    """The name of a config's confirming re-run."""
    return f"{name}_confirm1"


def rerun_of(name: str) -> str | None:
    """The experiment a confirming re-run repeats, or None when `name` is no re-run."""
    found = RERUN.fullmatch(name)
    return found.group(1) if found else None


def mean_of(first: float, rerun: float | None) -> float:
    """A config's metric over its runs that succeeded: the first, and its re-run (None: out or failed)."""
    values = [v for v in (first, rerun) if v is not None]
    return sum(values) / len(values)


def confirm_count(wanted: int | None, succeeded: int) -> int:
    """How many of the best configs are re-run: `wanted` (the spec's number), or by default DEFAULT_CONFIRM once
    more than that many succeeded (with two or fewer, the search itself is the comparison)."""
    if wanted is None:
        wanted = DEFAULT_CONFIRM if succeeded > DEFAULT_CONFIRM else 0
    return min(wanted, succeeded)


Bounds = tuple[float, float]  # a first run's interval: (low, high)


def to_rerun(configs: Collection[str], count: int, mean: Callable[[str], float],
             sort_key: Callable[[float], float], reruns: Mapping[str, float | None],
             intervals: Mapping[str, Bounds] | None = None) -> list[str]:
    """The configs among the top `count` by the mean of their runs that have not been re-run yet and are not told
    apart from the other leaders by their intervals (`overlapping`): a config that a re-run brought down makes
    room for the next, which is re-run in turn."""
    ranked = sorted(configs, key=lambda name: sort_key(mean(name)))  # stable: ties in order
    leaders = ranked[:count]
    return [name for name in leaders if name not in reruns and overlapping(name, leaders, intervals or {})]


def overlapping(name: str, leaders: Collection[str], intervals: Mapping[str, Bounds]) -> bool:
    """Whether `name` needs a re-run to be told apart from the other leaders: it has no interval, or one of
    theirs has none or overlaps its."""
    mine = intervals.get(name)
    if mine is None:
        return True
    for other in leaders:
        if other == name:
            continue
        theirs = intervals.get(other)
        if theirs is None or (theirs[0] <= mine[1] and mine[0] <= theirs[1]):
            return True
    return False


def interval_of(metrics: Mapping[str, float] | None, metric: str) -> Bounds | None:
    """A run's interval of `metric` among its recorded metrics (METRIC_low, METRIC_high), None where it has none or
    rests on fewer than SURE_STEPS measured steps (`steps_measured`): as for being sure (spec/sure.py), the width
    of fewer batches rests on one degree of freedom, narrow by chance often enough that two such intervals would
    tell configs apart (no re-run, a stop) that are not."""
    low, high = (metrics or {}).get(f"{metric}_low"), (metrics or {}).get(f"{metric}_high")
    steps = (metrics or {}).get("steps_measured")
    if steps is not None and steps < SURE_STEPS:
        return None
    return (low, high) if low is not None and high is not None else None
