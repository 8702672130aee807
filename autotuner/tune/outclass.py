"""Stopping what cannot win: a running attempt whose best possible value is worse than the worst a finished
config (or, in a tune, another first run still running) can be.

Each reading of a running attempt's steps (spec/interval.py) bounds its mean with a 95% interval. Its optimistic
bound is the end of that interval on the better side (METRIC_high for a throughput, METRIC_low for a latency); a
finished config's pessimistic bound is the other end of its own first run's interval, and a tune's other first
runs still running count with their intervals so far (once they have made MIN_STEPS measured steps too): runs
that start together, before any has finished, tell each other apart while they run, so a clearly worse one is
not measured to its end for want of a finished config. Once the running attempt has made MIN_STEPS measured
steps and its optimistic bound is worse than the best of those pessimistic bounds, it cannot be the best: it is
stopped, recorded `stopped` (reason `outclassed`), never the best and never run again, and its slots go to the next
run. Its optimistic bound is what the search learns of its point (it fits in memory, and is at best that good), so
the walk goes on as if it had ended. (A running run that outclassed others and then fails, after its steps, leaves
them stopped: a risk taken because a run that made its steps rarely fails after them; out of memory comes first.)

Both bounds are 95% intervals of batch means, which widen with the drift of the step times, so a run is stopped
only when it is clearly behind; with few steps the interval is wide (Student's t with one degree of freedom for
two batches) and nothing is stopped. Profile runs and confirming re-runs are never stopped: the first measures
the model, the second settles the winner. A plain `run` sweep stops its experiments by the same rule only when
asked (`--stop-outclassed`: `GridJudge`).
"""
from __future__ import annotations

from collections.abc import Collection, Mapping

from ..core import Queued, Run
from ..core.outcome import Outcome
from ..spec import Experiment
from ..spec.interval import Interval, StepReading
from ..spec.metrics import Metric, format_value
from ..spec.sure import MIN_STEPS
from ..states import State
from .reruns import Bounds, interval_of


def optimistic(interval: Bounds, metric: Metric) -> float:
    """The best a mean within `interval` (low, high) can be."""
    return interval[0] if metric.minimize else interval[1]


def pessimistic(interval: Bounds, metric: Metric) -> float:
    """The worst a mean within `interval` (low, high) can be."""
    return interval[1] if metric.minimize else interval[0]


def recorded_optimistic(metrics: Mapping[str, float] | None, metric: Metric) -> float | None:
    """A stopped attempt's optimistic bound, from its recorded metrics: METRIC_high (METRIC_low where lower is
    better); None where it was not kept (an interval with no upper bound)."""
    return (metrics or {}).get(f"{metric.name}_{'low' if metric.minimize else 'high'}")


def outclassed(reading: StepReading, finished: Mapping[str, Bounds], configs: Collection[str],
               metric: Metric, running: Mapping[str, Bounds] | None = None) -> str | None:
    """Why a running attempt whose steps say `reading` cannot beat the configs that finished (`configs`, their
    first runs' intervals in `finished`) or the other first runs still running (`running`: their intervals so
    far), as its stop records it; None while it still could, or has made fewer than MIN_STEPS measured steps."""
    interval = reading.interval
    if interval is None or interval.n < MIN_STEPS:
        return None
    bounds = [(name, pessimistic(finished[name], metric), False) for name in configs if name in finished]
    bounds += [(name, pessimistic(bounds_, metric), True) for name, bounds_ in (running or {}).items()]
    if not bounds:
        return None
    best, floor, still = min(bounds, key=lambda found: metric.sort_key(found[1]))
    mine = optimistic((interval.low, interval.high), metric)
    if not metric.better(floor, mine):
        return None
    return _why(interval, mine, best, floor, metric) + (" (still running)" if still else "")


def _why(interval: Interval, mine: float, best: str, floor: float, metric: Metric) -> str:
    side = "at least" if metric.minimize else "at most"
    theirs = "at most" if metric.minimize else "at least"
    shown_mine, shown_floor = _apart(mine, floor)
    return (f"outclassed after {interval.n} measured steps: its {metric.name} is {side} {shown_mine} "
            f"(95% interval {format_value(interval.low)} to {format_value(interval.high)}), {best}'s "
            f"{theirs} {shown_floor}")


def _apart(mine: float, floor: float) -> tuple[str, str]:
    """The two bounds a stop compares, as people read values, with the digits it takes to tell them apart: "at most
    2,214, at least 2,214" would say nothing of why."""
    shown = format_value(mine), format_value(floor)
    digits = 5
    while shown[0] == shown[1] and digits <= 12:
        shown = f"{mine:,.{digits}g}", f"{floor:,.{digits}g}"
        digits += 1
    return shown


def bounded(reading: StepReading) -> Bounds | None:
    """A running attempt's interval so far, once it has made MIN_STEPS measured steps: what it may outclass the
    others by (`outclassed`'s `running`); None before."""
    interval = reading.interval
    return (interval.low, interval.high) if interval is not None and interval.n >= MIN_STEPS else None


class GridJudge:
    """`run --stop-outclassed`: a grid's Searcher. It proposes nothing (a grid's experiments are queued at its start)
    and stops a running experiment that cannot beat one that succeeded on the same GPU type (`types`: each host's;
    measurements of two types do not compare), by the rule above. `keep` what succeeded before a resume."""

    def __init__(self, metric: Metric, types: Mapping[str, str | None]):
        self.metric, self.types = metric, dict(types)
        self.finished: dict[str | None, dict[str, Bounds]] = {}  # by GPU type: what succeeded, its interval

    def _type(self, hosts: Collection[str]) -> str | None:
        return next((self.types.get(host) for host in hosts), None)

    def keep(self, name: str, hosts: Collection[str], metrics: Mapping[str, float] | None) -> None:
        """An experiment that succeeded on `hosts`, with its recorded metrics (its interval among them)."""
        bounds = interval_of(metrics, self.metric.name)
        if bounds is not None:
            self.finished.setdefault(self._type(hosts), {})[name] = bounds

    def propose(self, free_slots: int, now: float) -> list[Experiment]:
        return []

    def observe(self, run: Run | Queued, outcome: Outcome) -> None:
        if outcome.state == State.SUCCEEDED and isinstance(run, Run):
            self.keep(run.experiment.name, run.reservation.hosts, outcome.metrics)

    def outclassed(self, run: Run, reading: StepReading) -> str | None:
        same = self.finished.get(self._type(run.reservation.hosts), {})
        return outclassed(reading, same, same, self.metric)
