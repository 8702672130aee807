"""tuner_type random (`RandomSearch`): the grid's points (space.sizes, and in full mode each stage's knob
settings) in an order drawn from the spec's seed alone, so that a search rebuilt from the ledger goes on with the
same draws.
"""
from __future__ import annotations

import random

from ..spec import Experiment
from .search import Search
from .space import Point, SearchSpec, Setting, sizes


class RandomSearch(Search):
    """random: the grid's points in an order drawn from the seed; each one taken in turn unless it was tried or
    is known not to fit. The order is fixed by the seed alone, so a search rebuilt from the ledger goes on with
    the same draws."""

    def __init__(self, spec: SearchSpec):
        super().__init__(spec)
        self.order = [(stage, mbs, knobs) for stage in spec.lanes for mbs in sizes(spec)
                      for knobs in self.settings(stage)]
        random.Random(spec.seed).shuffle(self.order)
        self._names: dict[Point, str] = {}  # each point's name at the spec `_named` (an offload level names anew)
        self._named = self.spec

    def choose(self, room: int) -> list[Experiment]:
        """The order's first open points (or their stand-ins below the memory model's ceiling: `substitute`).
        What each stage rules out is worked out once a decision and each point's name once a level: the walk
        over a grid of thousands stays cheap however much of it was tried."""
        proposed: list[Experiment] = []
        above = {stage: self.ruled_out_above(stage) for stage in self.stages}  # taking a point changes none
        for stage, mbs, knobs in self.order:
            if len(proposed) >= room or self._spent():
                break
            if not self.open_below(stage, mbs, knobs, above.get(stage)):
                mbs = self.substitute(stage, mbs, knobs) or mbs
            if self.open_below(stage, mbs, knobs, above.get(stage)) and \
                    (experiment := self.take(stage, mbs, knobs)) is not None:
                proposed.append(experiment)
        return proposed

    def name_of(self, stage: int, mbs: int, knobs: Setting = ()) -> str:
        """As every search's, kept: the walk asks it of every point it passes."""
        if self._named is not self.spec:
            self._names, self._named = {}, self.spec
        key = (stage, mbs, knobs)
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = super().name_of(stage, mbs, knobs)
        return name
