"""World sizes in the search (`tune --num_gpus 1,2,4 --num_nodes 1,2`): the best configuration at each size.

Each world size (GPUs per node x nodes) is searched as a tune of its own (`WorldSearch`: one tuner per size,
`SearchSpec.at_world`), its experiments named with the size (`train_g4_z1_mbs16`, `train_g8n2_...`), its
accumulation derived for its own data-parallel GPUs so that a fixed `train_batch_size` is kept at every size as
DeepSpeed derives it. The sizes share the slots: each is asked for experiments in turn, smallest first, and told
the outcomes of its own; its confirming re-runs confirm its own best. The report compares them (views/scaling.py).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..core import Queued, Run
from ..core.outcome import Outcome
from ..errors import UserError, shown
from ..spec import Experiment
from ..spec.interval import StepReading
from .replay import Latest
from .search import Search
from .space import SearchSpec

MOST_SIZES = 64  # the most world sizes one tune may search


def counts(text: str, option: str) -> tuple[int, ...]:
    """`4`, `1,2,4,8`, or `1-8` (the powers of two from 1 to 8): the values of --num_gpus / --num_nodes."""
    values: list[int] = []
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        try:
            first, last = int(low), int(high) if dash else int(low)
        except ValueError:
            raise UserError(f"{option} {shown(text)}: a count (4), a list (1,2,4,8) or a range of powers of two "
                            "(1-8)") from None
        if first < 1 or last < first:
            raise UserError(f"{option} {shown(text)}: counts are whole numbers from 1, a range low to high")
        value = first
        while value <= last:
            values.append(value)
            value = value * 2 if dash else last + 1
            if len(values) > MOST_SIZES:
                raise UserError(f"{option} {shown(text)}: more than {MOST_SIZES} values")
    return tuple(dict.fromkeys(values))


def sizes(gpus: Sequence[int], nodes: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """Every (GPUs per node, nodes) of the lists, smallest world first."""
    found = sorted({(g, n) for g in gpus for n in nodes}, key=lambda w: (w[0] * w[1], w[1]))
    if len(found) > MOST_SIZES:
        raise UserError(f"--num_gpus x --num_nodes make {len(found)} world sizes, more than {MOST_SIZES}")
    return tuple(found)


class WorldSearch:
    """One tuner per world size (`SearchSpec.worlds`), sharing the slots; a Searcher for the scheduler."""

    def __init__(self, spec: SearchSpec, searches: Sequence[Search]) -> None:
        self.spec = spec
        self.searches = list(searches)

    def _owner(self, name: str) -> Search | None:
        return next((s for s in self.searches if name.startswith(s.spec.prefix + "_")), None)

    def propose(self, free_slots: int, now: float) -> list[Experiment]:
        """Each size asked in turn, smallest first, for what it would run now."""
        proposed: list[Experiment] = []
        for search in self.searches:
            proposed += search.propose(free_slots, now)
        return proposed

    def observe(self, run: Run | Queued, outcome: Outcome) -> None:
        owner = self._owner(run.experiment.name)
        if owner is not None:
            owner.observe(run, outcome)

    def outclassed(self, run: Run, reading: StepReading) -> str | None:
        """As its size's search says (each size's best is its own)."""
        owner = self._owner(run.experiment.name)
        return owner.outclassed(run, reading) if owner is not None else None

    def replay(self, experiments: Sequence[Experiment], latest: Latest,
               metrics: Mapping[str, Mapping[str, float]] | None = None) -> None:
        """Each size rebuilt from its own experiments (replay.py)."""
        for search in self.searches:
            search.replay([e for e in experiments if self._owner(e.name) is search], latest, metrics)

    def experiment(self, stage: int, mbs: int) -> Experiment:
        """The smallest size's experiment for a point (the first the sweep is checked by)."""
        return self.searches[0].experiment(stage, mbs)

    def firsts(self) -> list[Experiment]:
        """Each size's first experiment: the shapes the cluster must hold."""
        return [s.experiment(s.spec.stages[0], s.spec.min_mbs) for s in self.searches]
