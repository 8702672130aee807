"""What each experiment of a sweep is expected to take, for `autotune plan`.

A DeepSpeed run is a start-up (launcher, imports, building the engine and its optimizer) and then its steps: the
runner turns DeepSpeed's autotuning on, so the engine ends the run after `end_profile_step` + 1 optimizer steps. So
each run of an earlier sweep (`--from DIR`) splits into seconds per step and start-up = duration - steps x that
(everything of a run but its steps: the launch, building the engine, the exit). The step time is the one the
ledger measured from the run's own steps (schema 7's `measures`: the median time between its steps, and how many
it made; any script that writes the progress file, DeepSpeed's per-step lines), else DeepSpeed's `latency` metric
(microseconds per step, over the engine's profile window). The estimates, best first:

- measured: the config ran before (the same digest, else the same name): the median of its runs;
- scaled: the config ran before with another number of steps (a longer or shorter profile): its own start-up
  plus the new steps at its own time per step;
- estimate: the sweep file's `estimate`;
- start-up + steps: the earlier sweep's median start-up plus this experiment's steps at its median step time;
- median measured: the median run of the earlier sweep (runs with neither steps nor latency: a script's own metric);
- default.

A run measured until sure (its config's `autotuning.tolerance`, spec/sure.py) makes the steps its interval needs,
not its whole window: predicted from the earlier sweep's measured per-step spread (each run's interval says how
much one step spreads: `Interval.step_spread`), the steps that spread needs for the tolerance, capped at its
window's end; `Durations.until_sure` says the range, from the least to the most spread measured. With nothing
measured, the window's end.

The Monte Carlo spread of an estimate made of a start-up and steps (`Parts`) is the measured spread of each: the
start-ups' coefficient of variation over the earlier sweep's runs, and the step time's over runs of one config
(each run's step time against its config's median, where a config ran more than once).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..backends.launch import window_steps, with_autotuning
from ..errors import UserError
from ..ledger.store import Ledger, open_sweep
from ..spec import Experiment
from ..spec.interval import RunTimes
from ..spec.progress import Window
from ..spec.sure import MOST, TOLERANCE, steps_needed, tolerance_of
from ..states import State

DEFAULT_SECONDS = 600.0
PROFILE_KEYS = ("start_profile_step", "end_profile_step", TOLERANCE, MOST)


@dataclass(frozen=True)
class Parts:
    """An estimate made of a start-up and steps, with the measured spread (coefficient of variation) of each."""

    startup: float
    per_step: float
    steps: int
    startup_spread: float
    step_spread: float


@dataclass(frozen=True)
class SureSteps:
    """The steps the runs measured until sure are expected to make: the fewest (at the least spread measured),
    the median one's (at the median spread), the most (at the most spread, or the window's end); `spread`: the
    median per-step spread measured (None: nothing measured it)."""

    fewest: int
    median: int
    most: int
    spread: float | None


@dataclass(frozen=True)
class Durations:
    """Expected seconds per experiment, where each figure came from (the module docstring's names), the parts
    of those made of a start-up and steps, and the steps of those measured until sure."""

    seconds: Mapping[str, float]
    origin: Mapping[str, str]
    parts: Mapping[str, Parts] = field(default_factory=dict)
    until_sure: SureSteps | None = None

    def counts(self) -> dict[str, int]:
        counted: dict[str, int] = {}
        for origin in self.origin.values():
            counted[origin] = counted.get(origin, 0) + 1
        return counted


@dataclass(frozen=True)
class Split:
    """One run cut into its start-up and its steps."""

    startup: float
    per_step: float


@dataclass
class PastRuns:
    """An earlier sweep's runs that ended on their own (cancelled and interrupted ones say nothing of how long a
    run takes), in seconds: whole, by config digest and by name; split, by the config without its step count."""

    by_digest: dict[str, list[float]] = field(default_factory=dict)
    by_name: dict[str, list[float]] = field(default_factory=dict)
    by_unstepped: dict[str, list[Split]] = field(default_factory=dict)
    spreads: list[float] = field(default_factory=list)  # each succeeded run's per-step spread (relative)

    def every(self) -> list[float]:
        return [d for runs in self.by_name.values() for d in runs]

    def splits(self) -> list[Split]:
        return [s for runs in self.by_unstepped.values() for s in runs]


def steps(e: Experiment, spread: float | None = None) -> int:
    """Optimizer steps a DeepSpeed run of `e` takes before its engine ends it, or, measured until sure with steps
    that spread by `spread`, before the runner does (see the module docstring)."""
    config = with_autotuning(e.ds_config, "", "")
    total, window = window_steps(config), Window.of(config)
    tolerance = tolerance_of(config)
    if tolerance is None or spread is None or window.most is None:
        return total
    return min(total, window.skip + steps_needed(spread, tolerance, window.most))


def unstepped_digest(e: Experiment) -> str:
    """The digest of `e` without its profile steps: equal shapes, equal runs but for how many steps they take."""
    config = e.config()
    section = config.get("autotuning")
    if isinstance(section, dict):
        config["autotuning"] = {k: v for k, v in section.items() if k not in PROFILE_KEYS}
        if not config["autotuning"]:
            del config["autotuning"]
    return replace(e, ds_config=config).digest


def split(e: Experiment, seconds: float, metrics: Mapping[str, float], timing: RunTimes | None = None) -> Split | None:
    """A run of `e` that took `seconds` cut by its step time: measured from its steps (`timing`, the ledger's), else
    DeepSpeed's `latency`; None without either, or where the steps would outlast the run (not a time per step)."""
    if timing is not None and timing.step_seconds and timing.step_seconds > 0 and timing.steps > 0:
        # The steps it made: those before its measured window and those it measured (spec/progress.py `Window`);
        # one not measured until sure at least its config's window
        made = Window.of(with_autotuning(e.ds_config, "", "")).skip + timing.steps
        made = made if tolerance_of(e.ds_config) is not None else max(made, steps(e))
        startup = seconds - made * timing.step_seconds
        if startup >= 0:
            return Split(startup, timing.step_seconds)
    latency = metrics.get("latency")
    if latency is None or not latency > 0:
        return None
    per_step = latency / 1e6
    startup = seconds - steps(e) * per_step
    return Split(startup, per_step) if startup >= 0 else None


def past_runs(directory: Path) -> PastRuns:
    """The runs of the sweep in `directory`, read from its ledger."""
    ledger: Ledger = open_sweep(Path(directory))
    try:
        experiments = {e.name: e for e in ledger.experiments()}
        timings = ledger.measures()
        found = PastRuns()
        for a in ledger.attempts():
            if a.state in (State.CANCELLED, State.INTERRUPTED, State.STOPPED) or a.duration is None or a.duration < 0:
                continue
            found.by_name.setdefault(a.name, []).append(a.duration)
            e = experiments.get(a.name)
            if e is None:
                continue
            found.by_digest.setdefault(e.digest, []).append(a.duration)
            timing = timings.get((a.name, a.attempt))
            if a.state is State.SUCCEEDED and timing is not None and timing.interval is not None \
                    and math.isfinite(spread := timing.interval.step_spread) and spread > 0:
                found.spreads.append(spread)
            if a.state is State.SUCCEEDED and (cut := split(e, a.duration, a.metrics, timing)) is not None:
                found.by_unstepped.setdefault(unstepped_digest(e), []).append(cut)
    finally:
        ledger.close()
    return found


def _median_split(splits: Iterable[Split]) -> Split:
    listed = list(splits)
    return Split(statistics.median(s.startup for s in listed), statistics.median(s.per_step for s in listed))


def spreads(known: PastRuns) -> tuple[float, float]:
    """The measured spread (coefficient of variation) of a start-up, over every run, and of a step time, over the
    runs of each config that ran more than once (each against its config's median): 0 where nothing measures it."""
    startups = [s.startup for s in known.splits()]
    mean = statistics.fmean(startups) if startups else 0.0
    startup = statistics.stdev(startups) / mean if len(startups) > 1 and mean > 0 else 0.0
    ratios = [s.per_step / middle for runs in known.by_unstepped.values() if len(runs) > 1
              and (middle := statistics.median(r.per_step for r in runs)) > 0 for s in runs]
    return startup, math.sqrt(statistics.fmean((r - 1) ** 2 for r in ratios)) if ratios else 0.0


def durations(experiments: Sequence[Experiment], past: Path | None = None,
              default: float = DEFAULT_SECONDS) -> Durations:
    """What each experiment is expected to take (the module docstring's order)."""
    known = PastRuns()
    if past is not None:
        known = past_runs(past)
        if not known.by_name:
            raise UserError("--from: this sweep has no finished run to measure durations from", past)
    every = known.every()
    median = statistics.median(every) if every else None
    overall = _median_split(known.splits()) if known.by_unstepped else None
    startup_spread, step_spread = spreads(known)
    per_step = statistics.median(known.spreads) if known.spreads else None
    seconds: dict[str, float] = {}
    origin: dict[str, str] = {}
    parts: dict[str, Parts] = {}
    for e in experiments:
        exact = known.by_digest.get(e.digest) if known.by_digest else None  # no digest to make with nothing measured
        runs = exact or known.by_name.get(e.name)
        same = known.by_unstepped.get(unstepped_digest(e)) if known.by_unstepped else None
        if runs and (exact or not same):
            seconds[e.name], origin[e.name] = statistics.median(runs), "measured"
        elif same:
            own = _median_split(same)
            seconds[e.name], origin[e.name] = own.startup + steps(e, per_step) * own.per_step, "scaled"
            parts[e.name] = Parts(own.startup, own.per_step, steps(e, per_step), startup_spread, step_spread)
        elif e.estimate is not None:
            seconds[e.name], origin[e.name] = e.estimate, "estimate"
        elif overall is not None:
            seconds[e.name], origin[e.name] = overall.startup + steps(e, per_step) * overall.per_step, \
                "start-up + steps"
            parts[e.name] = Parts(overall.startup, overall.per_step, steps(e, per_step), startup_spread, step_spread)
        elif median is not None:
            seconds[e.name], origin[e.name] = median, "median measured"
        else:
            seconds[e.name], origin[e.name] = default, "default"
    return Durations(seconds, origin, parts, sure_steps(experiments, known.spreads))


def sure_steps(experiments: Sequence[Experiment], spreads: Sequence[float]) -> SureSteps | None:
    """The steps the experiments measured until sure are expected to make, over the spreads measured (module
    docstring); None where none is measured until sure."""
    sure = [e for e in experiments if tolerance_of(e.ds_config) is not None]
    if not sure:
        return None
    if not spreads:
        ends = [steps(e) for e in sure]
        return SureSteps(min(ends), int(statistics.median(ends)), max(ends), None)
    middle = statistics.median(spreads)
    return SureSteps(min(steps(e, min(spreads)) for e in sure), int(statistics.median(steps(e, middle) for e in sure)),
                     max(steps(e, max(spreads)) for e in sure), middle)
