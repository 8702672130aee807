"""`autotune plan --training DIR`: the whole training run with one config a sweep measured, its time and cost, with
the spread its runs and their steps give; on the size it was measured on, or on another (`--nodes`,
`--gpus-per-node`), extrapolated and said to be.

The extrapolation is the simplest that the sweep's own measurements can back. The per-GPU throughput is taken to
change by a factor per doubling of a node's GPUs (`within`) and one per doubling of the nodes (`across`), each
worked out from the best configs the sweep measured at two sizes that differ only in it (views/scaling.py); one
the sweep could not measure is 1, perfect scaling, and said to be an optimistic bound. A factor is never above 1
(no size is predicted to train faster per GPU than the sizes measured) and is applied from the config's own size.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import limits
from ..errors import UserError, shown
from ..jsonvalues import JSONObject
from ..tune.goal import Goal
from .cost import HOUR, MEASURED_ONLY, RATE, Candidate, Costing, amount_words, costing, days_words, goal_of, title
from .scaling import Scaling, Size, scaling
from .snapshot import load


@dataclass(frozen=True)
class Target:
    """The size the training run is planned on: GPUs a node and nodes."""

    per_node: int
    nodes: int

    @property
    def gpus(self) -> int:
        return self.per_node * self.nodes


@dataclass(frozen=True)
class Extrapolation:
    """How a config's throughput measured at one size is carried to another."""

    within: float | None  # per-GPU throughput factor per doubling of a node's GPUs; None: not measured (1 used)
    across: float | None  # and per doubling of the nodes
    factor: float  # on the per-GPU throughput, from the config's size to the target

    def words(self, c: Candidate, target: Target) -> str:
        parts = [_factor("a node's GPUs", self.within), _factor("the nodes", self.across)]
        return (f"extrapolated, not measured: {c.name} was measured on {c.where}; per-GPU throughput "
                f"x{self.factor:.3g} to {target.gpus} GPUs on {target.nodes} node(s) ({'; '.join(parts)})")

    def to_json(self) -> JSONObject:
        return {"within_per_doubling": self.within, "across_per_doubling": self.across, "per_gpu_factor": self.factor}


def _factor(what: str, value: float | None) -> str:
    if value is None:
        return f"no loss measured doubling {what}: none assumed (an optimistic bound)"
    return f"x{value:.3g} per doubling of {what}, as the sweep measured"


def render_training_plan(directory: Path, goal: Goal, name: str | None = None, fmt: str = "table",
                         nodes: int | None = None, per_node: int | None = None) -> str:
    """The training run with config `name` (default: the best, or with a size asked for the best measured at it)
    on `nodes` x `per_node` GPUs (default: the size it was measured on). A goal with nothing to train, or a config
    that did not succeed with a throughput, is a UserError."""
    if per_node is not None and per_node > limits.SLOTS_PER_HOST:
        raise UserError(f"--gpus-per-node {per_node:,} is more than {limits.SLOTS_PER_HOST:,}, the most slots one "
                        "host may have")
    if nodes is not None and nodes > limits.SLOTS:
        raise UserError(f"--nodes {nodes:,} is more than {limits.SLOTS:,}, the most hosts of a cluster")
    snap = load(directory, every_experiment=False)
    wanted = goal_of(snap, goal)
    if not wanted.wanted:
        raise UserError("plan --training needs what is to be trained: --train-tokens (with the sequence length) or "
                        "--train-samples, or a tune that stated it")
    priced = costing(snap, wanted)
    assert priced is not None  # wanted
    c = _chosen(priced, name, snap.best.name if snap.best is not None else None, nodes, per_node, snap.name)
    target = Target(per_node or c.gpus // c.nodes, nodes or c.nodes)
    how, said = None, None
    if (target.gpus, target.nodes) != (c.gpus, c.nodes):
        how = _extrapolation(scaling(snap), c, target)
        said = how.words(c, target)
        c = _carried(c, target, how.factor, priced)
    if fmt == "json":
        basis = priced.basis if how is None else priced.basis.replace(MEASURED_ONLY, "measured sizes, carried to "
                                                                                      "the size asked for")
        return json.dumps({"sweep": snap.name, "config": c.name, **priced.row(c), "basis": basis,
                           "extrapolated": how.to_json() if how else None, "goal": wanted.to_json()}) + "\n"
    return "\n".join(_lines(priced, c, wanted, said)) + "\n"


def _chosen(priced: Costing, name: str | None, best: str | None, nodes: int | None, per_node: int | None,
            sweep: str) -> Candidate:
    """The config asked for; without one, the best measured at the size asked for, else the sweep's best."""
    if name is None and (nodes or per_node):
        at = [c for c in priced.candidates if (nodes is None or c.nodes == nodes)
              and (per_node is None or c.gpus == per_node * c.nodes)]
        if at:
            return at[0]  # fastest first
    chosen = name or best or priced.fastest.name
    found = next((c for c in priced.candidates if c.name == chosen), None)
    if found is None:
        raise UserError(f"--config {shown(chosen)}: no config of sweep {shown(sweep)} by that name succeeded with "
                        f"a {RATE} measured")
    return found


def _extrapolation(sizes: Scaling | None, c: Candidate, target: Target) -> Extrapolation:
    """The factors the sweep's best configs at each size give, applied from `c`'s size to `target`."""
    measured = sizes.sizes if sizes is not None else ()
    within = _per_doubling(measured, lambda s: s.nodes, lambda s: s.gpus // s.nodes)
    across = _per_doubling(measured, lambda s: s.gpus // s.nodes, lambda s: s.nodes)
    doublings_within = math.log2(target.per_node / (c.gpus // c.nodes))
    doublings_across = math.log2(target.nodes / c.nodes)
    factor = (within or 1.0) ** max(0.0, doublings_within) * (across or 1.0) ** max(0.0, doublings_across)
    return Extrapolation(within, across, factor)


def _per_doubling(sizes: tuple[Size, ...], fixed: Callable[[Size], int], varied: Callable[[Size], int]
                  ) -> float | None:
    """The per-GPU throughput factor per doubling of `varied` between measured sizes alike in `fixed`: the
    geometric mean over every such pair, at most 1; None when no two sizes differ only in it."""
    logs = []
    for a in sizes:
        for b in sizes:
            if fixed(a) == fixed(b) and varied(b) > varied(a):
                logs.append(math.log(b.per_gpu / a.per_gpu) / math.log2(varied(b) / varied(a)))
    return min(1.0, math.exp(sum(logs) / len(logs))) if logs else None


def _carried(c: Candidate, target: Target, factor: float, priced: Costing) -> Candidate:
    """`c` on the target size: every rate scaled by GPUs and the per-GPU factor; time and GPU-hours again."""
    scale = target.gpus / c.gpus * factor
    rate, seconds = c.rate * scale, priced.samples / (c.rate * scale)
    gpu_hours = seconds / HOUR * target.gpus
    cost = None if c.cost is None else c.cost / c.gpu_hours * gpu_hours
    deadline = priced.goal.deadline_days
    return Candidate(c.name, target.gpus, c.gpu_type, rate, c.slowest * scale, c.fastest * scale, c.runs, seconds,
                     gpu_hours, cost, meets=None if deadline is None else seconds / HOUR / 24 <= deadline,
                     nodes=target.nodes)


def _lines(priced: Costing, c: Candidate, wanted: Goal, extrapolated: str | None) -> list[str]:
    slow_days, fast_days = priced.samples / c.slowest / 86400, priced.samples / c.fastest / 86400
    spread = c.slowest < c.fastest
    price = "" if c.cost is None else f", cost {c.cost:,.2f}" + (
        f" ({c.cost * slow_days / c.days:,.2f} at the spread's slow end)" if spread else "")
    lines = [f"training run: {title(priced)} with {c.name} on {c.where}" + (
        f" ({c.gpu_type})" if c.gpu_type else ""),
             f"  time: {days_words(c.days)} at {priced.per_second(c):,.4g} {priced.unit}/s"
             + (f"; {days_words(fast_days)} to {days_words(slow_days)} over the spread of its {c.runs} run(s) and "
                "their steps" if spread else " (one run, no interval measured: no spread)"),
             f"  GPU-hours: {amount_words(c.gpu_hours)}{price}"]
    if wanted.deadline_days is not None:
        lines.append(f"  deadline {wanted.deadline_days:g} days: " + ("met" if c.meets else "missed")
                     + (", missed at the spread's slow end" if c.meets and slow_days > wanted.deadline_days else ""))
    basis = priced.basis
    if extrapolated:
        lines.append(f"  {extrapolated}")
        basis = basis.replace(MEASURED_ONLY, "measured sizes, carried to the size asked for as said above")
    lines.append(f"  computed from: {basis}")
    return lines
