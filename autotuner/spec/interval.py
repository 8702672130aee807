"""What a run's steps say, with how sure it is: start-up, step time, and an interval for the metric's mean.

The interval is a batch-means interval. The steps after warm-up are cut, in their order, into b contiguous
batches of (nearly) equal size, b = the integer square root of their number, at least 2 and at most MAX_BATCHES;
the interval is the mean of all steps plus or minus Student's t (b - 1 degrees of freedom, 95%) times the
standard deviation of the batch means over the square root of b.

Why not the textbook t-interval over the steps themselves: that one takes every step for an independent draw.
Step times are not independent: they drift (a GPU clocks down as it warms, a neighbour's job starts on the
node, the data loader's cache fills) and come in runs of slow and fast steps, so n correlated steps hold far
less information than n independent ones, and the textbook interval is too narrow by about the square root of
the correlation time. Batch means keep a slow stretch inside one batch, so the spread of the batch means carries
the drift, and the interval widens by as much as the steps are correlated; on independent steps it is the
textbook interval with fewer degrees of freedom.
"""
from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .metrics import format_value
from .progress import TrainStep, read_steps

MAX_BATCHES = 10
RATES = ("throughput", "FLOPS_per_gpu")  # the metrics that are work per second (`measure`'s rate)
WARMUP = 2  # steps of a progress file left out first: compilation, allocator and cache warm-up
# Student's t, two-sided 95%, by degrees of freedom (1..MAX_BATCHES - 1).
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093)


@dataclass(frozen=True)
class Interval:
    """The mean of the measured values and its 95% batch-means interval; n values in `batches` batches."""

    mean: float
    low: float
    high: float
    n: int
    batches: int

    @property
    def step_spread(self) -> float:
        """The spread of one step, relative to the mean, that the interval implies (its half-width is Student's t
        times that over the square root of its steps): what `autotune plan` predicts a run's steps from."""
        return self.half_width * math.sqrt(self.n) / t95(self.batches)

    @property
    def half_width(self) -> float:
        """Half the interval, relative to its mean (0.02: the mean is known within 2%); inf for a zero mean."""
        return (self.high - self.low) / 2 / abs(self.mean) if self.mean else math.inf


@dataclass(frozen=True)
class StepReading:
    """What a run's steps after warm-up say: when its first step ended (seconds since the epoch, for its
    start-up), how many steps it made, the median step time, and the interval of the metric where the steps
    carried its values."""

    first_at: float
    steps: int
    step_seconds: float | None
    interval: Interval | None

    def startup(self, launched_at: float | None) -> float | None:
        """Seconds from the launch to the end of the first step; None when unknown (or the clocks disagree)."""
        if launched_at is None or self.first_at < launched_at:
            return None
        return self.first_at - launched_at


def t95(batches: int) -> float:
    """Student's t, two-sided 95%, of an interval of `batches` batch means (batches - 1 degrees of freedom)."""
    return _T95[min(max(batches, 2), MAX_BATCHES) - 2]


def batch_means(values: Sequence[float]) -> Interval | None:
    """The batch-means interval of `values` (>= 0, as every metric is) in their order (see the module's doc),
    its low end at least 0; None for fewer than 2."""
    n = len(values)
    if n < 2:
        return None
    b = min(MAX_BATCHES, n, max(2, math.isqrt(n)))
    means = [statistics.fmean(values[i * n // b:(i + 1) * n // b]) for i in range(b)]
    mean = statistics.fmean(values)
    spread = _T95[b - 2] * statistics.stdev(means) / math.sqrt(b)
    return Interval(mean, max(0.0, mean - spread), mean + spread, n, b)  # a metric is never below 0


def measure(steps: Sequence[TrainStep], warmup: int = WARMUP, rate: bool = False) -> StepReading | None:
    """What `steps` say once the first `warmup` are left out (none are when that would leave fewer than two);
    None for a run without steps. `rate`: the values are per-second rates (samples/s, FLOP/s), whose mean over
    a run is the work over the time, i.e. the harmonic mean of the steps' rates: the interval is worked out on
    the seconds per unit of work and turned back."""
    if not steps:
        return None
    kept = steps[warmup:] if len(steps) - warmup >= 2 else steps
    durations = [(b.at - a.at) / max(1, b.step - a.step) for a, b in itertools.pairwise(kept) if b.at >= a.at]
    values = [s.value for s in kept if s.value is not None]
    interval = None
    if len(values) == len(kept):
        interval = _of_rates(values) if rate else batch_means(values)
    return StepReading(steps[0].at, len(steps), statistics.median(durations) if durations else None, interval)


def _of_rates(values: Sequence[float]) -> Interval | None:
    """The batch-means interval of rates' harmonic mean (see `measure`); None where a rate is 0."""
    if any(v <= 0 for v in values):
        return None
    inverse = batch_means([1 / v for v in values])
    if inverse is None:
        return None
    high = 1 / inverse.low if inverse.low > 0 else math.inf
    return Interval(1 / inverse.mean, 1 / inverse.high, high, inverse.n, inverse.batches)


def measured_run(directory: Path, metric: str,
                 window_end: Callable[[], int | None] = lambda: None) -> StepReading | None:
    """What the steps a run left in its directory say (progress.py: its progress file, or DeepSpeed's lines up
    to the end of its profile window, `window_end()`)."""
    steps, warmup = read_steps(directory, metric, WARMUP, window_end)
    return measure(steps, warmup, rate=metric in RATES)


@dataclass(frozen=True)
class RunTimes:
    """A run's time apart, as the ledger's `measures` table keeps it: start-up (launch to the end of its first
    step), the median step time, the steps it made, and the interval of the metric's mean (None: unknown)."""

    startup: float | None
    step_seconds: float | None
    steps: int
    interval: Interval | None

    def columns(self, metric: str) -> dict[str, float]:
        """The report's columns of it, beside the metrics: `startup_s`, `step_s`, `steps_measured`, and the
        interval as METRIC_low and METRIC_high."""
        found = {"startup_s": self.startup, "step_s": self.step_seconds, "steps_measured": float(self.steps)}
        if self.interval is not None:
            found.update({f"{metric}_low": self.interval.low, f"{metric}_high": self.interval.high})
        return {k: v for k, v in found.items() if v is not None and math.isfinite(v)}


def timing_of(measured: StepReading | None, launched_at: float | None) -> RunTimes | None:
    """A run's RunTimes from what its steps said and when it was launched; None when it left no steps."""
    if measured is None:
        return None
    return RunTimes(measured.startup(launched_at), measured.step_seconds, measured.steps, measured.interval)


def interval_text(metrics: Mapping[str, float], metric: str) -> str:
    """How sure a run's value is, as the best's line says it: " (95% interval LOW to HIGH over N steps)"; nothing
    for a run that left no interval (an unbounded high end is not kept as a column: "no upper bound")."""
    low, high, steps = metrics.get(f"{metric}_low"), metrics.get(f"{metric}_high"), metrics.get("steps_measured")
    if low is None:
        return ""
    over = f" over {steps:.0f} steps" if steps else ""
    upper = f"to {format_value(high)}" if high is not None else "with no upper bound"
    return f" (95% interval {format_value(low)} {upper}{over})"
