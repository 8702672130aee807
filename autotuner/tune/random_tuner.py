"""tuner_type random (`RandomSearch`): the grid's points (space.sizes, and in full mode each stage's knob
settings) in an order drawn from the spec's seed alone, so that a search rebuilt from the ledger goes on with the
same draws.
"""
from __future__ import annotations

import random

from ..spec import Experiment
from .search import Search
from .space import SearchSpec, sizes


class RandomSearch(Search):
    """random: the grid's points in an order drawn from the seed; each one taken in turn unless it was tried or
    is known not to fit. The order is fixed by the seed alone, so a search rebuilt from the ledger goes on with
    the same draws."""

    def __init__(self, spec: SearchSpec):
        super().__init__(spec)
        self.order = [(stage, mbs, knobs) for stage in spec.stages for mbs in sizes(spec)
                      for knobs in self.settings(stage)]
        random.Random(spec.seed).shuffle(self.order)

    def choose(self, room: int) -> list[Experiment]:
        proposed: list[Experiment] = []
        for stage, mbs, knobs in self.order:
            if len(proposed) >= room or self._spent():
                break
            if not self.open(stage, mbs, knobs):
                mbs = self.substitute(stage, mbs, knobs) or mbs
            if self.open(stage, mbs, knobs) and (experiment := self.take(stage, mbs, knobs)) is not None:
                proposed.append(experiment)
        return proposed
