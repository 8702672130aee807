"""`autotune plan`: a sweep predicted before it runs, by the very scheduler and policies that will run it,
played on a simulated clock (simulate.py).

What each experiment takes comes, best first, from a sweep already run (`--from DIR`: the same config, by its
digest, else the same name), from the sweep file's `estimate`, from the median of what the earlier sweep
measured, or from a default. With a spread, Monte Carlo draws each duration around its estimate (log-normal,
mean kept) and gives the makespan's P10/P50/P90; the same draws serve every policy compared, so differences
between policies are theirs, not the dice's.
"""
from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import limits
from .core import PLACEMENTS, BackfillQueue, Queued, SlotPool, fifo
from .core.resources import placement_named
from .core.scheduler import default_queue
from .errors import UserError
from .simulate import Timeline, Underway, simulate
from .spec import Experiment
from .states import State

DEFAULT_SECONDS = 600.0
QUEUES: dict[str, Callable[[SlotPool], BackfillQueue[Queued]]] = {
    "backfill": default_queue, "fifo": lambda pool: fifo()}


@dataclass(frozen=True)
class Durations:
    """Expected seconds per experiment, and where each figure came from (measured, estimate, median, default)."""

    seconds: Mapping[str, float]
    origin: Mapping[str, str]

    def counts(self) -> dict[str, int]:
        counted: dict[str, int] = {}
        for origin in self.origin.values():
            counted[origin] = counted.get(origin, 0) + 1
        return counted


def measured(directory: Path) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds each attempt of an earlier sweep held its slots (started to finished), by config digest and by
    name; attempts cancelled or interrupted are left out (they say nothing of how long a run takes)."""
    from .ledger import Ledger
    from .prepare import open_sweep

    ledger: Ledger = open_sweep(Path(directory))
    try:
        experiments = {e.name: e for e in ledger.experiments()}
        by_digest: dict[str, list[float]] = {}
        by_name: dict[str, list[float]] = {}
        for a in ledger.attempts():
            if a.state in (State.CANCELLED, State.INTERRUPTED) or a.duration is None or a.duration < 0:
                continue
            by_name.setdefault(a.name, []).append(a.duration)
            if a.name in experiments:
                by_digest.setdefault(experiments[a.name].digest, []).append(a.duration)
    finally:
        ledger.close()
    return by_digest, by_name


def durations(experiments: Sequence[Experiment], past: Path | None = None,
              default: float = DEFAULT_SECONDS) -> Durations:
    """What each experiment is expected to take (see the module docstring for the order)."""
    by_digest: dict[str, list[float]] = {}
    by_name: dict[str, list[float]] = {}
    if past is not None:
        by_digest, by_name = measured(past)
        if not by_name:
            raise UserError("--from: this sweep has no finished run to measure durations from", past)
    every = [d for runs in by_name.values() for d in runs]
    median = statistics.median(every) if every else None
    seconds: dict[str, float] = {}
    origin: dict[str, str] = {}
    for e in experiments:
        if e.digest in by_digest:
            seconds[e.name], origin[e.name] = statistics.median(by_digest[e.digest]), "measured"
        elif e.name in by_name:
            seconds[e.name], origin[e.name] = statistics.median(by_name[e.name]), "measured"
        elif e.estimate is not None:
            seconds[e.name], origin[e.name] = e.estimate, "estimate"
        elif median is not None:
            seconds[e.name], origin[e.name] = median, "median measured"
        else:
            seconds[e.name], origin[e.name] = default, "default"
    return Durations(seconds, origin)


@dataclass(frozen=True)
class PolicyPlan:
    """One queue policy and placement: the schedule at the estimates, and the makespans of the draws."""

    queue: str
    placement: str
    expected: Timeline
    makespans: Sequence[float]  # sorted, one per Monte Carlo draw (the expected one's alone without a spread)

    def percentile(self, q: float) -> float:
        """Nearest rank: P10 of 100 draws is the 10th smallest."""
        ordered = self.makespans
        return ordered[max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))]


@dataclass(frozen=True)
class Plan:
    experiments: Sequence[Experiment]
    slots: Mapping[str, Sequence[int]]
    durations: Durations
    timeout: float | None
    spread: float
    samples: int
    policies: Sequence[PolicyPlan]

    @property
    def slot_count(self) -> int:
        return sum(len(ids) for ids in self.slots.values())

    def capped(self, e: Experiment) -> float:
        """Its expected seconds, cut at its timeout (the runner ends it there)."""
        limit = e.timeout or self.timeout
        seconds = self.durations.seconds[e.name]
        return min(seconds, limit) if limit is not None else seconds

    @property
    def work(self) -> float:
        """Slot-seconds of all the experiments, at their estimates."""
        return sum(self.capped(e) * e.num_gpus * e.num_nodes for e in self.experiments)

    @property
    def longest(self) -> float:
        return max((self.capped(e) for e in self.experiments), default=0.0)

    @property
    def lower_bound(self) -> float:
        """No schedule ends sooner: all the work on every slot at once, or the longest experiment."""
        return max(self.work / self.slot_count if self.slot_count else 0.0, self.longest)


def plan_sweep(experiments: Sequence[Experiment], slots: Mapping[str, Sequence[int]], *, past: Path | None = None,
               default_seconds: float = DEFAULT_SECONDS, queues: Sequence[str] = ("backfill",),
               placements: Sequence[str] = ("pack",), spread: float = 0.0, samples: int = 100, seed: int = 0,
               timeout: float | None = limits.DEFAULT_TIMEOUT, types: Mapping[str, str | None] | None = None,
               sizes: Mapping[str, int] | None = None) -> Plan:
    """Play the sweep with each queue policy x placement: once at the estimates (see `durations`: `past` is a
    results directory to measure them in), and `samples` times with durations drawn around them when `spread`
    (their coefficient of variation) is above 0. `timeout`: seconds a run may take unless its experiment says.
    `types` (host -> GPU type) and `sizes` (host -> bytes per GPU), a cluster's `host_types` and `memory`, keep
    each experiment on one type as `run` does; the memory placement judges every GPU by its stated size (a
    plan reads no free memory: what is free now says little about later)."""
    if not experiments:
        raise UserError("nothing to plan: the sweep has no experiments")
    if not (spread >= 0 and math.isfinite(spread)):
        raise UserError(f"--spread must be a non-negative number, not {spread:g}")
    if samples < 1:
        raise UserError(f"--samples must be at least 1, not {samples}")
    expected = durations(experiments, past, default_seconds)
    for name in queues:
        if name not in QUEUES:
            raise UserError(f"--policy {name!r}: not a queue policy ({', '.join(QUEUES)})")
    for name in placements:
        if name not in PLACEMENTS:
            raise UserError(f"--placement {name!r}: not a placement ({', '.join(PLACEMENTS)})")
    seconds = expected.seconds
    draws = [_draw(experiments, seconds, spread, random.Random(seed * 1_000_003 + k))
             for k in range(samples)] if spread > 0 else []
    policies = []
    for queue in queues:
        for placement in placements:
            def play(duration: Mapping[str, float], queue: str = queue, placement: str = placement) -> Timeline:
                return simulate(experiments, slots, lambda e: duration[e.name], queue=QUEUES[queue],
                                placement=placement_named(placement, types, sizes), timeout=timeout)

            at_estimates = play(seconds)
            makespans = sorted(play(d).makespan for d in draws) if draws else [at_estimates.makespan]
            policies.append(PolicyPlan(queue, placement, at_estimates, makespans))
    return Plan(experiments, slots, expected, timeout, spread, samples if draws else 1, policies)


def _draw(experiments: Sequence[Experiment], seconds: Mapping[str, float], spread: float,
          rng: random.Random) -> dict[str, float]:
    """One draw: each duration times a log-normal factor of mean 1 and coefficient of variation `spread`."""
    sigma = math.sqrt(math.log1p(spread * spread))
    mu = -sigma * sigma / 2
    return {e.name: seconds[e.name] * math.exp(rng.gauss(mu, sigma)) for e in experiments}


def time_left(slots: Mapping[str, Sequence[int]], queued: Sequence[Experiment], running: Sequence[Ongoing],
              seen: Sequence[float], *, down: Sequence[str] = (), timeout: float | None = None) -> float | None:
    """Seconds until a sweep under way ends: what waits and what runs, re-planned on the scheduler's own
    policies (the runner's defaults). None: nothing to go on yet (no run has ended, and nothing queued or
    running has an estimate).

    A queued experiment takes its estimate, else the mean of the runs seen. A running one is expected to run
    as long as the runs seen that outlasted its elapsed time did on average; past all of them, a mean more;
    never past its timeout.
    """
    if not queued and not running:
        return 0.0
    mean = statistics.fmean(seen) if seen else None
    if mean is None and not all(e.estimate is not None for e in queued):
        return None
    underway = []
    for r in running:
        limit = r.experiment.timeout or timeout
        longer = [d for d in seen if d > r.elapsed]
        expected = r.experiment.estimate if r.experiment.estimate is not None else mean
        if longer:
            left = statistics.fmean(longer) - r.elapsed
        elif expected is not None and expected > r.elapsed:
            left = expected - r.elapsed
        elif mean is not None:
            left = mean
        else:
            return None
        if limit is not None:
            left = min(left, max(0.0, limit - r.elapsed))
        underway.append(Underway(r.experiment, r.slots, r.elapsed, left))
    guess = mean if mean is not None else 0.0
    timeline = simulate(queued, slots, lambda e: e.estimate if e.estimate is not None else guess,
                        timeout=timeout, underway=underway, down=down)
    return timeline.makespan


@dataclass(frozen=True)
class Ongoing:
    """A run of a sweep under way, for `time_left`."""

    experiment: Experiment
    slots: Mapping[str, Sequence[int]]
    elapsed: float
