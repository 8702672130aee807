"""`autotune plan`: a sweep predicted before it runs, by the very scheduler and policies that will run it,
played on a simulated clock (simulate.py).

What each experiment takes is estimated by durations.py (a sweep already run, `--from DIR`, cut into start-up
and steps; the sweep file's `estimate`; a default). With a spread, Monte Carlo draws each duration around its
estimate (log-normal, mean kept) and gives the makespan's P10/P50/P90; an estimate made of a start-up and steps
draws each part apart, by its own measured spread (the steps by `spread` where none was measured), and these
draw even without a `spread`. The same draws serve every policy compared, so differences between policies are
theirs, not the dice's.
"""
from __future__ import annotations

import bisect
import itertools
import math
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path

from .. import limits
from ..core import PLACEMENTS, BackfillQueue, Placement, Queued, SlotPool, fifo
from ..core.placement import placement_named
from ..core.scheduler import default_queue
from ..core.slots import Devices
from ..errors import UserError
from ..spec import Experiment
from .durations import DEFAULT_SECONDS, Durations, durations
from .learned import check_learned, largest_usable, learned_needs, peaks_by_digest, with_needs
from .simulate import Timeline, Underway, simulate

RUN_BUDGET = 2_000_000  # simulated runs one plan may play (100,000 experiments: about 15 s each play here)
QUEUES: dict[str, Callable[[SlotPool], BackfillQueue[Queued]]] = {
    "backfill": default_queue, "fifo": lambda pool: fifo()}


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
    samples: int  # Monte Carlo draws played (1: none, only the estimates)
    policies: Sequence[PolicyPlan]
    samples_asked: int = 1  # more than `samples` when the sweep was too large to play them all (RUN_BUDGET)
    learned_memory: int = 0  # experiments whose GPU memory need was learned from `past` (learned.py)

    @property
    def slot_count(self) -> int:
        return sum(len(ids) for ids in self.slots.values())

    def capped(self, e: Experiment) -> float:
        """Its expected seconds, cut at its timeout (the runner ends it there)."""
        limit = e.timeout or self.timeout
        seconds = self.durations.seconds[e.name]
        return min(seconds, limit) if limit is not None else seconds

    @cached_property  # the plan's figures read it several times each: 100,000 experiments summed once
    def work(self) -> float:
        """Slot-seconds of all the experiments, at their estimates."""
        return sum(self.capped(e) * e.num_gpus * e.num_nodes for e in self.experiments)

    @cached_property
    def longest(self) -> float:
        return max((self.capped(e) for e in self.experiments), default=0.0)

    @property
    def lower_bound(self) -> float:
        """No schedule ends sooner: all the work on every slot at once, or the longest experiment."""
        return max(self.work / self.slot_count if self.slot_count else 0.0, self.longest)


MAX_SPREAD = 10.0  # a run ten times as variable as its mean: far past real sweeps, well inside a float's range


def plan_sweep(experiments: Sequence[Experiment], slots: Mapping[str, Sequence[int]], *, past: Path | None = None,
               default_seconds: float = DEFAULT_SECONDS, queues: Sequence[str] = ("backfill",),
               placements: Sequence[str] = ("pack",), spread: float = 0.0, samples: int = 100, seed: int = 0,
               timeout: float | None = limits.DEFAULT_TIMEOUT, types: Mapping[str, str | None] | None = None,
               sizes: Mapping[str, int] | None = None, devices: Devices | None = None) -> Plan:
    """Play the sweep with each queue policy x placement: once at the estimates (see `durations`: `past` is a
    results directory to measure them in), and `samples` times with durations drawn around them when `spread`
    (their coefficient of variation) is above 0. `timeout`: seconds a run may take unless its experiment says.
    `types` (host -> GPU type) and `sizes` (host -> bytes per GPU), a cluster's `host_types` and `memory`, keep
    each experiment on one type as `run` does, and `devices` (a cluster's MIG instances) keep experiments of more
    than one GPU off MIG instances; the memory placement judges every GPU by its stated size (a plan reads no
    free memory: what is free now says little about later). `past` teaches memory needs too: the peak each
    config held there (learned.py), for experiments that state none."""
    if not experiments:
        raise UserError("nothing to plan: the sweep has no experiments")
    if not 0 <= spread <= MAX_SPREAD:  # NaN fails it too; past it, the draws overflow to 0 s or infinity
        raise UserError(f"--spread must be a coefficient of variation from 0 to {MAX_SPREAD:g}, not {spread:g}")
    if samples < 1:
        raise UserError(f"--samples must be at least 1, not {samples}")
    expected = durations(experiments, past, default_seconds)
    learned = (learned_needs(experiments, peaks_by_digest(past, required=False), largest_usable(sizes, devices))
               if past is not None else {})
    check_learned(experiments, learned, past, slots, types, sizes, devices)  # as `run` refuses them: up front
    experiments = with_needs(experiments, learned)  # what the earlier runs held: the needs of those that state none
    for name in queues:
        if name not in QUEUES:
            raise UserError(f"--policy {name!r}: not a queue policy ({', '.join(QUEUES)})")
    for name in placements:
        if name not in PLACEMENTS:
            raise UserError(f"--placement {name!r}: not a placement ({', '.join(PLACEMENTS)})")
    seconds = expected.seconds
    played = len(queues) * len(placements) * len(experiments)
    asked = samples
    drawn = spread > 0 or any(p.startup_spread > 0 or p.step_spread > 0 for p in expected.parts.values())
    samples = max(1, min(samples, RUN_BUDGET // played - 1)) if drawn else 1
    draws = [_draw(experiments, expected, spread, random.Random(seed * 1_000_003 + k))
             for k in range(samples)] if drawn else []
    policies = []
    for queue in queues:
        for placement in placements:
            def play(duration: Mapping[str, float], queue: str = queue, placement: str = placement) -> Timeline:
                return simulate(experiments, slots, lambda e: duration[e.name], queue=QUEUES[queue],
                                placement=placement_named(placement, types, sizes, devices=devices,
                                                          slots=slots), timeout=timeout)

            at_estimates = play(seconds)
            makespans = sorted(play(d).makespan for d in draws) if draws else [at_estimates.makespan]
            policies.append(PolicyPlan(queue, placement, at_estimates, makespans))
    return Plan(experiments, slots, expected, timeout, spread, samples, policies, asked, len(learned))


def _draw(experiments: Sequence[Experiment], expected: Durations, spread: float,
          rng: random.Random) -> dict[str, float]:
    """One draw: each duration times a log-normal factor of mean 1 and coefficient of variation `spread`; one made
    of a start-up and steps (`Durations.parts`), the start-up and the steps' time each by its measured spread."""
    seconds, parts = expected.seconds, expected.parts
    drawn = {}
    for e in experiments:
        found = parts.get(e.name)
        if found is None:
            drawn[e.name] = seconds[e.name] * _factor(rng, spread)
        else:
            drawn[e.name] = (found.startup * _factor(rng, found.startup_spread) + found.steps * found.per_step
                             * _factor(rng, found.step_spread or spread))
    return drawn


def _factor(rng: random.Random, spread: float) -> float:
    """Log-normal, of mean 1 and coefficient of variation `spread` (1 for none)."""
    if spread <= 0:
        return 1.0
    sigma = math.sqrt(math.log1p(spread * spread))
    return math.exp(rng.gauss(-sigma * sigma / 2, sigma))


class Survival:
    """How long runs take, learnt from runs that ended and runs still under way (Kaplan-Meier: a run that has
    run 40 s and goes on says "longer than 40 s"). Counting only the runs that ended would say runs are short:
    early in a sweep the ones that ended are the short ones. What no ended run says (the tail beyond the
    longest time seen) is put at TAIL x that time."""

    TAIL = 1.5

    def __init__(self, ended: Sequence[float], under_way: Sequence[float]):
        points = sorted([(t, True) for t in ended] + [(t, False) for t in under_way])
        self.values: list[float] = []
        self.weights: list[float] = []
        left, at_risk, i = 1.0, len(points), 0
        while i < len(points):
            t, ends, gone = points[i][0], 0, 0
            while i < len(points) and points[i][0] == t:
                ends += points[i][1]
                gone += 1
                i += 1
            if ends:
                drop = left * ends / at_risk
                self.values.append(t)
                self.weights.append(drop)
                left -= drop
            at_risk -= gone
        if left > 1e-12:
            self.values.append(max((t for t, _ in points), default=0.0) * self.TAIL)
            self.weights.append(left)
        self._cumulative = list(itertools.accumulate(self.weights))

    def draw(self, rng: random.Random, longer_than: float = 0.0) -> float:
        """A duration, given that the run has gone on for `longer_than` seconds already. A run not yet started
        draws from every time seen in a bisection of the weights summed once (what `rng.choices` draws, without
        summing them at every draw: the live view's ETA drew thousands of times over a long sweep's history)."""
        start = bisect.bisect_right(self.values, longer_than)  # the values ascend
        if start == len(self.values):  # past every time seen: as far past it again as the tail is past the longest
            return longer_than * self.TAIL
        if start == 0:
            total = self._cumulative[-1]
            return self.values[bisect.bisect(self._cumulative, rng.random() * total, 0, len(self.values) - 1)]
        return rng.choices(self.values[start:], self.weights[start:])[0]


def time_left(slots: Mapping[str, Sequence[int]], queued: Sequence[Experiment], running: Sequence[Ongoing],
              seen: Sequence[float], *, down: Sequence[str] = (), timeout: float | None = None,
              draws: int = 31, seed: int = 0, placement: Placement | None = None) -> float | None:
    """Seconds until a sweep under way ends: what waits and what runs, re-planned on the scheduler's own
    policies (the runner's defaults), the median of `draws` Monte Carlo plays (fewer for large sweeps). None:
    nothing to go on yet (no run has ended, and not every queued experiment has an estimate).

    Durations are drawn from what runs have taken (`Survival`, which also learns from the runs under way); a
    running one's rest given how long it has run already; an experiment with an `estimate` takes it; none
    runs past its timeout. `placement`: the sweep's own (kept to one GPU type where the sweep has types),
    default pack. Using the median of plays, not a play of the means, matters: the sweep ends when
    its longest run does, and the mean of each run's rest says nothing of the longest.
    """
    if not queued and not running:
        return 0.0
    if not seen and not (all(e.estimate is not None for e in queued)
                         and all(r.experiment.estimate is not None for r in running)):
        return None
    survival = Survival(seen, [r.elapsed for r in running])
    rng = random.Random(seed)
    plays = max(1, min(draws, 200_000 // (len(queued) + len(running))))
    makespans = []
    for _ in range(plays):
        underway = [Underway(r.experiment, r.slots, r.elapsed, _rest(r, survival, rng, timeout)) for r in running]
        took = {e.name: e.estimate if e.estimate is not None else survival.draw(rng) for e in queued}
        makespans.append(simulate(queued, slots, partial(_took, took), timeout=timeout, underway=underway,
                                  down=down, placement=placement).makespan)
    return statistics.median(makespans)


def _took(seconds: Mapping[str, float], e: Experiment) -> float:
    return seconds[e.name]


def _rest(r: Ongoing, survival: Survival, rng: random.Random, timeout: float | None) -> float:
    """Seconds a running run has left in one play: its estimate if it has not passed it, else a draw of how
    long runs that got this far took; never past its timeout."""
    estimate = r.experiment.estimate
    total = estimate if estimate is not None and estimate > r.elapsed else survival.draw(rng, r.elapsed)
    limit = r.experiment.timeout or timeout
    return max(0.0, (total if limit is None else min(total, limit)) - r.elapsed)


@dataclass(frozen=True)
class Ongoing:
    """A run of a sweep under way, for `time_left`."""

    experiment: Experiment
    slots: Mapping[str, Sequence[int]]
    elapsed: float
