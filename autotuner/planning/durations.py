"""What each experiment of a sweep is expected to take, for `autotune plan`.

A DeepSpeed run is a start-up (launcher, imports, building the engine and its optimizer) and then its steps: the
runner turns DeepSpeed's autotuning on, so the engine ends the run after `end_profile_step` + 1 optimizer steps and
reports the mean time of one (`latency`, in microseconds). So each run of an earlier sweep (`--from DIR`) splits
into start-up = duration - steps x latency, and seconds per step. The estimates, best first:

- measured: the config ran before (the same digest, else the same name): the median of its runs;
- scaled: the config ran before with another number of steps (a longer or shorter profile): its own start-up
  plus the new steps at its own time per step;
- estimate: the sweep file's `estimate`;
- start-up + steps: the earlier sweep's median start-up plus this experiment's steps at its median step time;
- median measured: the median run of the earlier sweep (runs that report no latency: a script's own metric);
- default.
"""
from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..backends.launch import END_PROFILE_STEP, end_profile_step, with_autotuning
from ..errors import UserError
from ..ledger.store import Ledger, open_sweep
from ..spec import Experiment
from ..states import State

DEFAULT_SECONDS = 600.0
PROFILE_KEYS = ("start_profile_step", "end_profile_step")


@dataclass(frozen=True)
class Durations:
    """Expected seconds per experiment, and where each figure came from (the module docstring's names)."""

    seconds: Mapping[str, float]
    origin: Mapping[str, str]

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

    def every(self) -> list[float]:
        return [d for runs in self.by_name.values() for d in runs]

    def splits(self) -> list[Split]:
        return [s for runs in self.by_unstepped.values() for s in runs]


def steps(e: Experiment) -> int:
    """Optimizer steps a DeepSpeed run of `e` takes before its engine ends it (see the module docstring)."""
    end = end_profile_step(with_autotuning(e.ds_config, "", ""))
    return (end if end is not None else END_PROFILE_STEP) + 1


def unstepped_digest(e: Experiment) -> str:
    """The digest of `e` without its profile steps: equal shapes, equal runs but for how many steps they take."""
    config = e.config()
    section = config.get("autotuning")
    if isinstance(section, dict):
        config["autotuning"] = {k: v for k, v in section.items() if k not in PROFILE_KEYS}
        if not config["autotuning"]:
            del config["autotuning"]
    return replace(e, ds_config=config).digest


def split(e: Experiment, seconds: float, metrics: Mapping[str, float]) -> Split | None:
    """A run of `e` that took `seconds` cut by its reported step time; None without one (not DeepSpeed's
    metrics) or where the steps would outlast the run (the figure is not per step)."""
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
        found = PastRuns()
        for a in ledger.attempts():
            if a.state in (State.CANCELLED, State.INTERRUPTED, State.STOPPED) or a.duration is None or a.duration < 0:
                continue
            found.by_name.setdefault(a.name, []).append(a.duration)
            e = experiments.get(a.name)
            if e is None:
                continue
            found.by_digest.setdefault(e.digest, []).append(a.duration)
            if a.state is State.SUCCEEDED and (cut := split(e, a.duration, a.metrics)) is not None:
                found.by_unstepped.setdefault(unstepped_digest(e), []).append(cut)
    finally:
        ledger.close()
    return found


def _median_split(splits: Iterable[Split]) -> Split:
    listed = list(splits)
    return Split(statistics.median(s.startup for s in listed), statistics.median(s.per_step for s in listed))


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
    seconds: dict[str, float] = {}
    origin: dict[str, str] = {}
    for e in experiments:
        exact = known.by_digest.get(e.digest) if known.by_digest else None  # no digest to make with nothing measured
        runs = exact or known.by_name.get(e.name)
        same = known.by_unstepped.get(unstepped_digest(e)) if known.by_unstepped else None
        if runs and (exact or not same):
            seconds[e.name], origin[e.name] = statistics.median(runs), "measured"
        elif same:
            own = _median_split(same)
            seconds[e.name], origin[e.name] = own.startup + steps(e) * own.per_step, "scaled"
        elif e.estimate is not None:
            seconds[e.name], origin[e.name] = e.estimate, "estimate"
        elif overall is not None:
            seconds[e.name], origin[e.name] = overall.startup + steps(e) * overall.per_step, "start-up + steps"
        elif median is not None:
            seconds[e.name], origin[e.name] = median, "median measured"
        else:
            seconds[e.name], origin[e.name] = default, "default"
    return Durations(seconds, origin)
