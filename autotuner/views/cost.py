"""What training would cost with each configuration a sweep measured: given the training run (`tune.goal.Goal`:
tokens with a sequence length, or samples; a price per GPU-hour; a deadline), each config's samples (or tokens)
per second, the time to train, the GPU-hours and the cost; the configs not beaten on both time and cost (the
Pareto front); the fastest, and the cheapest that meets the deadline.

Every figure is computed from what the sweep measured and says so (`Costing.basis`): the throughput each config
recorded (samples per second, the mean of its runs where it was run again), with the spread its runs and their
steps give (the least and most of its runs' 95% intervals, spec/interval.py, where measured; else of the runs
themselves), on the GPUs it ran on. Nothing is extrapolated to a world size no run had (`plan --training` on
another size does, and says so: views/extrapolate.py).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ..errors import UserError, shown
from ..jsonvalues import JSONObject
from ..states import State
from ..tune.goal import Goal
from ..tune.reruns import rerun_of
from .snapshot import Snapshot

MEASURED_ONLY = "measured sizes only, nothing extrapolated"  # what the basis says of the sizes
RATE = "throughput"  # the metric each config's rate is read from: samples trained per second (DeepSpeed's)
HOUR = 3600.0


def gpus_words(gpus: int, nodes: int) -> str:
    """GPUs as a sentence says them: "8 GPU(s)", or "8 GPU(s) on 2 nodes"."""
    return f"{gpus} GPU(s)" + (f" on {nodes} nodes" if nodes > 1 else "")


@dataclass(frozen=True)
class Candidate:
    """One config's training run, at its measured rate."""

    name: str
    gpus: int
    gpu_type: str | None
    rate: float  # samples per second: the mean of its runs
    slowest: float  # samples per second: the spread's slow end (its runs' intervals, else the runs)
    fastest: float  # and its fast end
    runs: int
    seconds: float  # to train the goal at `rate`
    gpu_hours: float
    cost: float | None  # gpu_hours x the price of its GPU type; None when not priced
    front: bool = False  # not beaten on both time and cost (GPU-hours where not priced)
    meets: bool | None = None  # within the deadline; None when there is none
    nodes: int = 1  # the nodes its GPUs were spread over

    @property
    def size(self) -> str:
        """Its GPUs as a table's cell says them: "8", or "8 (2 nodes)"."""
        return f"{self.gpus}" + (f" ({self.nodes} nodes)" if self.nodes > 1 else "")

    @property
    def where(self) -> str:
        return gpus_words(self.gpus, self.nodes)


    @property
    def days(self) -> float:
        return self.seconds / HOUR / 24

    @property
    def hours(self) -> float:
        return self.seconds / HOUR

    @property
    def spend(self) -> float:
        """What the front and the cheapest compare: the cost, else the GPU-hours."""
        return self.cost if self.cost is not None else self.gpu_hours


@dataclass(frozen=True)
class Costing:
    """Every candidate's training run, the front, the fastest and the cheapest (within the deadline)."""

    goal: Goal
    seq_len: int | None  # tokens per sample (a token goal)
    samples: float  # to train
    candidates: tuple[Candidate, ...]  # fastest first
    cheapest: str | None  # the cheapest within the deadline (without one: the cheapest); None: none meets it
    basis: str  # what the figures were computed from, in words

    @property
    def fastest(self) -> Candidate:
        return self.candidates[0]

    @property
    def unit(self) -> str:
        return "tokens" if self.goal.tokens is not None else "samples"

    def per_second(self, c: Candidate) -> float:
        """The candidate's rate in the goal's unit (tokens or samples a second)."""
        return c.rate * (self.seq_len or 1) if self.goal.tokens is not None else c.rate

    @property
    def verdict(self) -> list[str]:
        """The answer in lines: the fastest, the cheapest within the deadline (or that none meets it)."""
        f = self.fastest
        lines = [f"fastest: {f.name}, {days_words(f.days)} on {f.where}{_money(self, f)}"]
        cheapest = next((c for c in self.candidates if c.name == self.cheapest), None)
        deadline = self.goal.deadline_days
        within = f" within {deadline:g} days" if deadline is not None else ""
        if cheapest is not None:
            same = " (the fastest)" if cheapest is f else ""
            lines.append(f"cheapest{within}: {cheapest.name}{same}, {days_words(cheapest.days)} on {cheapest.where}"
                         f"{_money(self, cheapest)}")
        elif deadline is not None:
            lines.append(f"no candidate meets the deadline of {deadline:g} days: the fastest, {f.name}, takes "
                         f"{days_words(f.days)}")
        return lines

    def to_json(self) -> JSONObject:
        return {"goal": self.goal.to_json(), "unit": self.unit, "seq_len": self.seq_len, "samples": self.samples,
                "basis": self.basis, "fastest": self.fastest.name, "cheapest": self.cheapest,
                "deadline_met": (self.cheapest is not None) if self.goal.deadline_days is not None else None,
                "front": [c.name for c in self.candidates if c.front],
                "candidates": [self.row(c) for c in self.candidates]}

    def row(self, c: Candidate) -> JSONObject:
        return {"name": c.name, "gpus": c.gpus, "nodes": c.nodes, "gpu_type": c.gpu_type,
                f"{self.unit}_per_s": self.per_second(c),
                "runs": c.runs, "samples_per_s_spread": [c.slowest, c.fastest], "hours": c.hours, "days": c.days,
                "days_spread": [self.samples / c.fastest / HOUR / 24, self.samples / c.slowest / HOUR / 24],
                "gpu_hours": c.gpu_hours, "cost": c.cost, "front": c.front, "meets_deadline": c.meets}


def days_words(days: float) -> str:
    return f"{days:.3g} days" if days >= 1 else f"{days * 24:.3g} hours"


def _money(costing: Costing, c: Candidate) -> str:
    return f", {amount_words(c.gpu_hours)} GPU-hours" + (f", cost {c.cost:,.2f}" if c.cost is not None else "")


def amount_words(value: float) -> str:
    """A figure for people: whole from 100 up, three significant digits below."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def costing(snap: Snapshot, goal: Goal) -> Costing | None:
    """The training run priced for each config of the sweep that succeeded and recorded a throughput; None
    when the goal asks for nothing. A goal that cannot be priced (no config measured a throughput, a GPU type
    with no price, tokens without a sequence length) is a UserError naming the option."""
    if not goal.wanted:
        return None
    shape = (snap.meta.search or {}).get("shape") if snap.meta.search is not None else None
    model_seq = shape.get("seq_length") if isinstance(shape, dict) else None
    seq = goal.sequence(model_seq if isinstance(model_seq, int) else None)
    samples = goal.tokens / seq if goal.tokens is not None and seq else float(goal.samples or 0)
    found = _priced(measured_configs(snap), goal)
    if not found:
        raise UserError(f"no config of sweep {shown(snap.name)} succeeded with a {RATE} (samples per second) "
                        "measured: nothing to compute the training time from")
    candidates = [_candidate(m, samples, goal) for m in found]
    candidates.sort(key=lambda c: (c.seconds, c.spend, c.name))
    candidates = _marked(candidates, goal)
    meeting = [c for c in candidates if c.meets is not False]
    cheapest = min(meeting, key=lambda c: (c.spend, c.seconds)).name if meeting else None
    return Costing(goal, seq if goal.tokens is not None else None, samples, tuple(candidates), cheapest,
                   _basis(goal, seq, candidates))


@dataclass(frozen=True)
class MeasuredConfig:
    """What a sweep measured of one config that succeeded: where it ran and the throughput of each of its runs."""

    name: str
    gpus: int
    nodes: int
    gpu_type: str | None
    rates: tuple[float, ...]  # samples per second, one per run that succeeded
    low: float  # the least its runs allow: each run's 95% interval's low end where measured, else its rate
    high: float  # the most: each run's interval's high end where bounded, else its rate

    @property
    def rate(self) -> float:
        return sum(self.rates) / len(self.rates)


def measured_configs(snap: Snapshot) -> list[MeasuredConfig]:
    """Each config that succeeded with a throughput, re-runs counted with their config, in the sweep's order."""
    found = []
    for a in snap.attempts:
        if rerun_of(a.name) is not None and rerun_of(a.name) in snap.runs:
            continue  # a re-run: counted with its config
        runs = [r for r in snap.runs.get(a.name, [a]) if r.state == State.SUCCEEDED and _rate(r.metrics) is not None]
        if not runs or a.state != State.SUCCEEDED:
            continue
        rates = tuple(_rate(r.metrics) or 0.0 for r in runs)
        lows = [_bound(r.metrics, "low", rate) for r, rate in zip(runs, rates, strict=True)]
        highs = [_bound(r.metrics, "high", rate) for r, rate in zip(runs, rates, strict=True)]
        kind = snap.type_of(a)
        found.append(MeasuredConfig(a.name, sum(len(ids) for ids in a.slots.values()) or 1, max(1, len(a.slots)),
                                    kind if kind not in (None, "unknown") else None, rates,
                                    min(*lows, *rates), max(*highs, *rates)))
    return found


def _rate(metrics: Mapping[str, object]) -> float | None:
    value = metrics.get(RATE)
    return float(value) if isinstance(value, (int, float)) and value > 0 and math.isfinite(value) else None


def _bound(metrics: Mapping[str, object], end: str, rate: float) -> float:
    """One end of a run's interval (METRIC_low / METRIC_high) where it is a positive finite number; else its rate."""
    value = metrics.get(f"{RATE}_{end}")
    return float(value) if isinstance(value, (int, float)) and value > 0 and math.isfinite(value) else rate


def _priced(found: list[MeasuredConfig], goal: Goal) -> list[MeasuredConfig]:
    """The configs, each GPU type with a price where the goal prices any (one missing: refused)."""
    for m in found:
        if goal.priced and goal.price_of(m.gpu_type) is None:
            raise UserError(f"--gpu-hour-cost names no price for GPU type {shown(m.gpu_type or 'unknown')}, which "
                            f"{m.name} ran on (add TYPE=PRICE, or a bare price for every other type, or the "
                            "hostfile's gpu_hour_cost= on its hosts)")
    return found


def _candidate(m: MeasuredConfig, samples: float, goal: Goal) -> Candidate:
    seconds = samples / m.rate
    gpu_hours = seconds / HOUR * m.gpus
    price = goal.price_of(m.gpu_type)
    return Candidate(m.name, m.gpus, m.gpu_type, m.rate, m.low, m.high, len(m.rates), seconds, gpu_hours,
                     gpu_hours * price if price is not None else None, nodes=m.nodes)


def _marked(candidates: list[Candidate], goal: Goal) -> list[Candidate]:
    """Each candidate with its place on the front and whether it meets the deadline."""
    deadline = goal.deadline_days
    out = []
    for c in candidates:
        beaten = any(d.seconds <= c.seconds and d.spend <= c.spend and (d.seconds < c.seconds or d.spend < c.spend)
                     for d in candidates)
        meets = None if deadline is None else c.days <= deadline
        out.append(Candidate(**{**c.__dict__, "front": not beaten, "meets": meets}))
    return out


def _basis(goal: Goal, seq: int | None, candidates: Sequence[Candidate]) -> str:
    """What the figures were computed from, in words."""
    runs = sum(c.runs for c in candidates)
    sizes = [size for _, size in sorted({(c.gpus, c.nodes): c.size for c in candidates}.items())]
    amount = (f"{goal.tokens:,} tokens at {seq:,} a sample "
              f"({'--seq-len' if goal.seq_len else 'the model' + chr(39) + 's seq_length'})"
              if goal.tokens is not None else f"{goal.samples:,} samples")
    price = ("not priced: GPU-hours compared" if not goal.priced else
             ", ".join([*(f"{p:g} a GPU-hour" for p in [goal.price] if p is not None),
                        *(f"{k} {p:g}" for k, p in goal.prices.items())]))
    return (f"{amount}; each config's measured {RATE} (samples/s; the mean of its runs: {runs} run(s) of "
            f"{len(candidates)} config(s)) on the GPUs it ran on ({', '.join(map(str, sizes))}); {MEASURED_ONLY}; "
            f"{price}")


def goal_of(snap: Snapshot, options: Goal | None = None) -> Goal:
    """The goal a report prices: the options' keys over what the tune recorded (its autotuning section, its
    options); checked as one. A GPU type the goal prices not is priced as the sweep's hostfile did
    (`gpu_hour_cost=`), whatever ran the sweep: a type's own price wins over one for every type."""
    recorded = Goal.from_json((snap.meta.search or {}).get("goal")
                              if snap.meta.search is not None else None)
    goal = recorded if options is None or options == Goal() else options.over(recorded)
    goal.check()
    hostfile = snap.meta.gpu_prices or {}
    return replace(goal, prices={**hostfile, **goal.prices}) if goal.wanted and hostfile else goal


HEADERS = ("name", "GPUs", "RATE/s", "hours", "days", "GPU-hours", "cost", "front", "deadline")
# The CSV's columns of the training run, after the report's own (new names: no report column is renamed).
CSV_COLUMNS = ("train_rate_per_s", "train_unit", "train_hours", "train_days", "train_gpu_hours", "train_cost",
               "train_front", "train_meets_deadline")


def cells(costing: Costing) -> list[tuple[str, ...]]:
    """The training table's rows, fastest first."""
    return [(c.name, c.size, f"{costing.per_second(c):,.4g}", f"{c.hours:,.4g}", f"{c.days:,.4g}",
             f"{c.gpu_hours:,.4g}", f"{c.cost:,.2f}" if c.cost is not None else "-", "yes" if c.front else "",
             "" if c.meets is None else ("met" if c.meets else "missed")) for c in costing.candidates]


def headers(costing: Costing) -> list[str]:
    return [h.replace("RATE", costing.unit) for h in HEADERS]


def title(costing: Costing) -> str:
    return f"{costing.samples:,.0f} samples" + (
        f" ({costing.goal.tokens:,} tokens)" if costing.goal.tokens is not None else "")


def notes(costing: Costing) -> list[str]:
    return [*costing.verdict, "front: not beaten on both time and " + ("cost" if costing.goal.priced
                                                                       else "GPU-hours"),
            "computed from: " + costing.basis]


def csv_values(costing: Costing) -> dict[str, list[object]]:
    """name -> its values of CSV_COLUMNS (names not priced: none)."""
    return {c.name: [round(costing.per_second(c), 6), costing.unit, round(c.hours, 6), round(c.days, 6),
                     round(c.gpu_hours, 6), None if c.cost is None else round(c.cost, 2), c.front, c.meets]
            for c in costing.candidates}
