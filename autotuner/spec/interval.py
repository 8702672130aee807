"""What a run's steps say, with how sure it is: start-up, step time, and a robust interval for the metric's mean.

The value is the steps' 10%-trimmed mean (TRIM of the steps cut at each end, as DeepSpeed's engine trims its own
timers), its interval a batch-means interval of the winsorized steps. Why trimmed: on a shared or loaded machine a
few steps stall (a neighbour's burst, the scheduler's time slice, a page fault) for many times a typical step, and
the plain mean of step times is theirs: measured on the README's example under a test suite, 5 of 30 steps held
half of a run's time, and its plain mean read 0.55 of its median step's rate. Trimming cuts them (and as many of
the fastest), so the value is the run's typical rate; it is the mean of steady steps, so it still averages the
ordinary noise the median would not.

The interval (Tukey and McLaughlin's for a trimmed mean, with batch means for the drift): the steps are winsorized
(each cut step set to the nearest kept one), cut in their order into b contiguous batches of (nearly) equal size,
b = the integer square root of their number, at least 2 and at most MAX_BATCHES, and the half-width is Student's
t (b - 1 degrees of freedom, 95%) times the standard deviation of the winsorized batch means over the square root
of b, over 1 - 2g (g the fraction trimmed at each end).
Why batch means: step times are not independent. They drift (a GPU clocks down as it warms, a neighbour's job
starts on the node, the data loader's cache fills) and come in runs of slow and fast steps, so n correlated steps
hold far less information than n independent ones, and the textbook interval is too narrow by about the square root
of the correlation time. Batch means keep a slow stretch inside one batch, so the spread of the batch means carries
the drift, and the interval widens by as much as the steps are correlated. Why winsorized: a stall left whole in
its batch would make that batch's mean, and the interval, as wide as the stall; clipped to the slowest kept step it
counts as a slow step, no more. On independent steps without outliers it is the textbook interval of the mean with
fewer degrees of freedom.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .metrics import format_value
from .progress import TrainStep, Window, read_steps

MAX_BATCHES = 10
TRIM = 0.1  # of the steps cut at each end for the value and winsorized for its interval (see the module's doc)
RATES = ("throughput", "FLOPS_per_gpu")  # the metrics that are work per second (`measure`'s rate)
# Student's t, two-sided 95%, by degrees of freedom (1..MAX_BATCHES - 1).
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093)


@dataclass(frozen=True)
class Interval:
    """The trimmed mean of the measured values and its 95% interval; n values in `batches` batches."""

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

    def over(self, size: int) -> Interval:
        """The interval of the value over `size` (a throughput DeepSpeed counts `size` times: autotp's ranks)."""
        return Interval(self.mean / size, self.low / size, self.high / size, self.n, self.batches)

    @property
    def half_width(self) -> float:
        """Half the interval, relative to its mean (0.02: the mean is known within 2%); inf for a zero mean."""
        return (self.high - self.low) / 2 / abs(self.mean) if self.mean else math.inf


@dataclass(frozen=True)
class StepReading:
    """What a run's steps say: when its first step ended (seconds since the epoch, for its start-up), how many
    steps of its window it measured, the median step time, and the interval of the metric where the steps carried
    its values."""

    first_at: float
    steps: int
    step_seconds: float | None
    interval: Interval | None

    def over(self, size: int) -> StepReading:
        """The reading with its values over `size` (`Interval.over`)."""
        return dataclasses.replace(self, interval=self.interval.over(size)) if self.interval and size > 1 else self

    def startup(self, launched_at: float | None, until: float | None = None) -> float | None:
        """Seconds from the launch to the end of the first step; None when unknown, or when the clocks disagree:
        a first step before the launch, or after `until` (the runner's time of the reading)."""
        if launched_at is None or self.first_at < launched_at or (until is not None and self.first_at > until):
            return None
        return self.first_at - launched_at

    def within(self, launched_at: float | None, until: float) -> StepReading:
        """The reading with no step time where that is longer than the run had lasted at `until` since its launch:
        its steps' time stamps are then not of a clock that runs as the runner's (a script's own numbers), and a
        step time taken from them would price each step it saved at that (GPU-hours saved beyond a float)."""
        if launched_at is None or self.step_seconds is None or self.step_seconds <= until - launched_at:
            return self
        return dataclasses.replace(self, step_seconds=None)


def t95(batches: int) -> float:
    """Student's t, two-sided 95%, of an interval of `batches` batch means (batches - 1 degrees of freedom)."""
    return _T95[min(max(batches, 2), MAX_BATCHES) - 2]


def batches_of(n: int) -> int:
    """How many batches an interval of `n` values is worked out from (see the module's doc): a function of n alone,
    so an interval read back from the ledger, which keeps n, knows its degrees of freedom."""
    return min(MAX_BATCHES, n, max(2, math.isqrt(n)))


def batch_means(values: Sequence[float]) -> Interval | None:
    """The trimmed mean of `values` (finite, >= 0, as every metric is) and its winsorized batch-means interval, the
    values in their order (see the module's doc); its low end at least 0 (its high end inf where the spread is
    beyond a float); None for fewer than 2. Worked out on the values over the largest of them: a script's values
    are any finite numbers, and sums of those near a float's largest overflow (math.fsum raises)."""
    n = len(values)
    if n < 2:
        return None
    scale = max(values) or 1.0
    scaled = [v / scale for v in values]
    cut = int(n * TRIM + 0.5)  # rounded half up: 1 of 5 to 14 steps, 2 of 15 to 24, ...
    ordered = sorted(scaled)
    floor, ceiling = ordered[cut], ordered[n - 1 - cut]
    kept = [min(max(v, floor), ceiling) for v in scaled]
    b = batches_of(n)
    means = [statistics.fmean(kept[i * n // b:(i + 1) * n // b]) for i in range(b)]
    mean = statistics.fmean(ordered[cut:n - cut]) * scale
    spread = _T95[b - 2] * statistics.stdev(means) / math.sqrt(b) / (1 - 2 * cut / n) * scale
    return Interval(mean, max(0.0, mean - spread), mean + spread, n, b)  # a metric is never below 0


def measure(steps: Sequence[TrainStep], measured: Sequence[TrainStep], rate: bool = False) -> StepReading | None:
    """What a run's `steps` say, the `measured` of them (its window's, progress.py `Window`) for its step time and
    interval; None for a run without steps. `rate`: the values are per-second rates (samples/s, FLOP/s), whose
    mean over a run is the work over the time: the interval is worked out on the seconds per unit of work (each
    step's time, for samples/s) and turned back."""
    if not steps:
        return None
    timed = measured if len(measured) >= 2 else steps
    durations = [(b.at - a.at) / max(1, b.step - a.step) for a, b in itertools.pairwise(timed) if b.at >= a.at]
    values = [s.value for s in measured if s.value is not None]
    interval = None
    if len(values) == len(measured):
        interval = _of_rates(values) if rate else batch_means(values)
    return StepReading(steps[0].at, len(measured), statistics.median(durations) if durations else None, interval)


def _of_rates(values: Sequence[float]) -> Interval | None:
    """The interval of rates worked out on their inverses, a step's time per unit of work (see `measure`): the
    work over the trimmed mean step time; None where a rate is 0, or so far below the largest that its inverse
    is beyond a float (inverted over the largest rate, so that a small rate alone is no such one)."""
    if not values or min(values) <= 0 or not math.isfinite(max(values) / min(values)):
        return None
    scale = max(values)
    inverse = batch_means([scale / v for v in values])
    if inverse is None:
        return None
    low = scale / inverse.high if math.isfinite(inverse.high) else 0.0
    high = scale / inverse.low if inverse.low > 0 else math.inf
    return Interval(scale / inverse.mean, low, high, inverse.n, inverse.batches)


def measured_run(directory: Path, metric: str, window: Window) -> StepReading | None:
    """What the steps a run left in its directory say (progress.py: its progress file, or DeepSpeed's lines), its
    measured `window`'s for its interval."""
    return measure(*read_steps(directory, metric, window), rate=metric in RATES)


@dataclass(frozen=True)
class RunTimes:
    """A run's time apart, as the ledger's `measures` table keeps it: start-up (launch to the end of its first
    step), the median step time, the steps of its window it measured, and the interval of the metric's trimmed mean
    (None: unknown)."""

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


def timing_of(measured: StepReading | None, launched_at: float | None, until: float | None = None) -> RunTimes | None:
    """A run's RunTimes from what its steps said, when it was launched and, where known, when this was read (its
    end, or the reading while it runs: what its start-up and step time cannot exceed, `StepReading.within`); None
    when it left no steps."""
    if measured is None:
        return None
    if until is not None:
        measured = measured.within(launched_at, until)
    return RunTimes(measured.startup(launched_at, until), measured.step_seconds, measured.steps, measured.interval)


def interval_text(metrics: Mapping[str, float], metric: str) -> str:
    """How sure a run's value is, as the best's line says it: " (95% interval LOW to HIGH over N steps)"; nothing
    for a run that left no interval (an unbounded high end is not kept as a column: "no upper bound")."""
    low, high, steps = metrics.get(f"{metric}_low"), metrics.get(f"{metric}_high"), metrics.get("steps_measured")
    if low is None:
        return ""
    over = f" over {steps:.0f} steps" if steps else ""
    upper = f"to {format_value(high)}" if high is not None else "with no upper bound"
    return f" (95% interval {format_value(low)} {upper}{over})"
