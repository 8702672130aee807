"""The confirming re-runs: when the search is over, its best configs are run once more (`NAME_confirm1`) and ranked
by the mean of their runs, so that one lucky measurement does not name the winner. Their names, how many are
re-run, and which ones next: pure functions of what the search learnt (search.py proposes them)."""
from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping

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


def to_rerun(configs: Collection[str], count: int, mean: Callable[[str], float],
             sort_key: Callable[[float], float], reruns: Mapping[str, float | None]) -> list[str]:
    """The configs among the top `count` by the mean of their runs that have not been re-run yet: a config that a
    re-run brought down makes room for the next, which is re-run in turn."""
    ranked = sorted(configs, key=lambda name: sort_key(mean(name)))  # stable: ties in order
    return [name for name in ranked[:count] if name not in reruns]
