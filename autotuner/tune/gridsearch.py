"""tuner_type gridsearch (`MicroBatchSearch`): the structured walk of the grid. The first run is at the largest
size the user allows (or the memory model predicts), since the largest size that fits is most often the fastest
and one run there settles it; with no bound, the size doubles from the smallest until a run runs out of memory.
Then a bisection on the log scale, sought only while a larger size could beat the best (`_worth`), then sizes
below the largest that fits are measured, one at a time while a smaller one pays (`_measure`). The stages share
what they learn (stage.py: `vouched`, `ruled_out_above`), so the highest goes first (`_order`), and the search works in
rounds (nothing proposed while one of its runs is out): what it tries depends on the answers, never on the order
in which runs end. In full mode each stage's knobs are then swept one at a time at its best size (`_knob_walk`).
"""
from __future__ import annotations

import math

from ..spec import Experiment
from .layout import checkpointing, layout_of, stage_of
from .search import Search
from .space import MAX_MICRO_BATCH, Setting
from .stage import Stage

WORTH = 0.01  # a larger size is sought only while it could measure this fraction better (see `_worth`)
BEHIND = 0.1  # with layouts, a lane this far below another layout's best measures no smaller sizes (`_behind`)
CAPPED = 1 / 3  # how far a lower stage probes towards a size a higher stage's run may yet rule out (log scale)


def midpoint(low: int, high: int, share: float = 0.5) -> int:
    """The size `share` of the way from `low` to `high` on the log scale (halfway: bisection), strictly between
    them (`low` when none is)."""
    return max(low + 1, min(high - 1, round(low * (high / low) ** share))) if high - low > 1 else low


class MicroBatchSearch(Search):
    """gridsearch, the structured walk (see the module docstring)."""

    def choose(self, room: int) -> list[Experiment]:
        """One size per stage while it searches, several once it measures; each stage's next size before any
        stage's second, the highest stage first (its OOMs rule out the lower stages' sizes, and a lower stage
        probes below a size a higher one has out: `_next`)."""
        proposed: list[Experiment] = []
        if self.busy:  # in rounds: what a stage learns bounds the others, so decisions wait for every answer
            return proposed
        order = self._order(room)
        for stage in order:
            sizes = self._next(stage)  # after the higher stages' takes: they bound it
            if sizes and len(proposed) < room and not self._spent():
                experiment = self.take(stage, sizes[0])
                if experiment is not None:
                    proposed.append(experiment)
        for stage in order:
            known = self.stages[stage]
            for mbs in self._next(stage) if known.fits and not self._probe(stage) else []:
                if len(proposed) >= room or self._spent():
                    return proposed
                experiment = self.take(stage, mbs)
                if experiment is not None:
                    proposed.append(experiment)
            for knobs in self._knob_walk(stage, known):
                if len(proposed) >= room or self._spent():
                    return proposed
                experiment = self.take(stage, self.best_size(stage), knobs)
                if experiment is not None:
                    proposed.append(experiment)
        return proposed

    def _order(self, room: int) -> list[int]:
        """The highest stage first, its OOMs ruling out the lower stages' sizes. But where the runs go one at a
        time and no memory model bounds the sizes, the search opens with the lowest stage: where it fits at the
        largest size allowed it is most often the fastest (the least communication), found in the first run
        instead of after every higher stage's walk, and its fit vouches for every higher stage there; where it
        does not, one run is spent. (With room for more, the first round already spans the stages, the highest
        bounding the others' probes: taking a slot from them costs more runs out of memory than it saves time.
        With a model each stage starts at its own predicted size.)"""
        order = sorted(self.stages, key=self._rank)
        unbounded = all(known.predicted is None for known in self.stages.values())
        if room == 1 and not self.trials and unbounded:  # the search's first point (trials span every level)
            order.remove(first := min(order, key=lambda lane_: (stage_of(lane_), self._rank(lane_))))
            order.insert(0, first)
        return order

    def _rank(self, lane_: int) -> tuple[int, int, bool, int]:
        """A lane's place in a round: the highest stage first, and among layouts the one that needs the least
        memory (the largest TP size, checkpointing on): where memory bounds the sizes it fits the largest, its
        runs rule out the others' sizes above theirs, and its best, found early, cuts their walks (`_worth`)."""
        _, knobs = self.spec.layouts[layout_of(lane_)]
        return -stage_of(lane_), -self.spec.tp_of(lane_), not checkpointing(knobs), lane_

    def _knob_walk(self, stage: int, known: Stage) -> list[Setting]:
        """Full mode, once a stage's micro-batch search is over: its knobs, one at a time, at its best size. Each
        knob's other values are tried with the others at the best found so far, the best kept (ties keep what
        was), then the next knob. The knobs that wait for a run, or none once every knob was swept."""
        space = self.spaces.get(stage)
        if not space or known.given_up or known.out or not known.fits or self._next(stage):
            return []
        mbs = self.best_size(stage)
        best, value = {k: v[0] for k, v in space.items()}, known.fits[mbs]
        for key, values in space.items():
            tries = [self.setting(stage, best | {key: v}) for v in values if v != best[key]]
            fresh = [k for k in tries if self.experiment(stage, mbs, knobs=k).name not in self.proposed]
            if fresh or any((stage, mbs, k) in self.knob_out for k in tries):
                return fresh
            for knobs in tries:  # all ended (or cancelled: nothing learnt)
                measured = self.knob_fits.get((stage, mbs, knobs))
                if measured is not None and self.metric.better(measured, value):
                    best, value = best | dict(knobs), measured
        return []

    def _next(self, stage: int) -> list[int]:
        """The sizes of a stage to try next, given what is known of it and of the other stages: while it
        searches, the one size `_probe` names; once the largest worth knowing is known, those to measure."""
        known = self.stages[stage]
        if known.given_up:
            return []
        fit = max(known.fits, default=None)
        probe = self._probe(stage)
        if known.out:
            searched = probe is None and not any(m > (fit or 0) for m in known.out)
            return self._measure(known, fit) if searched and not self._behind(stage, fit) else []
        if probe is None:
            return [] if self._behind(stage, fit) else self._measure(known, fit)
        ordered = self.ordered()
        pending = min((m for s, other in self.stages.items() if ordered and self.spec.needs_at_least(stage, s)
                       for m in other.out if m > (self.vouched(s) or 0)), default=None)
        # a higher stage's run at a size not known to fit there may rule it out: probe below it (one at a size known
        # to fit there, a smaller size measured, rules nothing out)
        if pending is not None and probe >= pending:
            below = self._probe(stage, pending)
            return [below] if below is not None and below < pending else []
        return [probe]

    def _probe(self, stage: int, cap: int | None = None) -> int | None:
        """`_size`, moved to a size that keeps a fixed train_batch_size (the largest below it, above the largest
        known to fit): a size that cannot keep it is never run."""
        size = self._size(stage, cap)
        if size is None or self.spec.keeps(size):
            return size
        low = self.vouched(stage) or 0
        kept = self.spec.kept(size, low)
        return kept if kept is not None else (low if low and low not in self.stages[stage].fits else None)

    def _size(self, stage: int, cap: int | None = None) -> int | None:
        """The size the search of a stage tries next; None once the largest size worth knowing is known.
        Between the largest size known to fit (`vouched`) and the smallest known not to (`ruled_out_above`),
        bisection on the log scale (the largest size that fits is unknown by orders of magnitude); with no
        size known not to fit, doubling; with none known to fit, from the largest allowed (or predicted)."""
        spec, known = self.spec, self.stages[stage]
        low, small = self.vouched(stage), self.ruled_out_above(stage)
        share = 0.5
        if cap is not None:  # a size a run that has not ended may rule out, taken as ruled out, and kept far from
            small, share = min(small or cap, cap), CAPPED
        if low is None:
            bounded = spec.max_mbs if spec.max_mbs < MAX_MICRO_BATCH else spec.min_mbs
            start = max(spec.min_mbs, min(known.predicted or bounded, spec.max_mbs))
            if small is None:
                return start
            if known.predicted is not None and not known.too_big:  # the model's size, below what others ruled out
                return min(start, small - 1) if small > spec.min_mbs else None
            if small <= spec.min_mbs:
                return None
            if not any(self.spec.needs_at_least(other, stage) for other in self.stages):  # the most memory: whether
                # it fits at all, in one run
                return spec.min_mbs
            return min(midpoint(spec.min_mbs, small, share), known.ceiling())
        fit, ceiling = max(known.fits, default=None), known.ceiling()
        if small is None and low < ceiling and (fit is None or len(self.spec.layouts) == 1 or
                                                self._worth(stage, fit, ceiling + 1)):
            # with a model, its size (a lower stage's fit vouches for less); past it, with layouts, only where a
            # larger size could beat the best of them all
            return ceiling if known.predicted is not None else min(low * 2, ceiling)
        if small is not None and small - low > 1 and low < ceiling and \
                (fit is None or self._worth(stage, fit, small)):
            return min(midpoint(low, small, share), ceiling)
        return low if low not in known.fits else None  # vouched for by a lower stage: measured here too

    def _worth(self, stage: int, fit: int, small: int) -> bool:
        """Whether sizes between `fit` (the largest that fits) and `small` (the smallest that does not) are worth
        their runs: the best such a size could measure beats the best of the search, and beats `fit` by WORTH.
        The best it could measure is `fit`'s value grown as the stage's two largest fits grew with the size
        (at most in proportion: a step of more samples takes no less time); the search's best is each config's
        mean over its runs, so that a lucky first measurement, once re-run, stops cutting the others short. A
        metric better lower (latency)
        has no such bound: its search goes on to the exact size."""
        if self.metric.minimize:
            return True
        known = self.stages[stage]
        value, growth = known.fits[fit], 1.0
        below = [m for m in known.fits if m < fit]
        if below:
            near = max(below)
            if known.fits[near] > 0 and value > 0:
                growth = min(1.0, max(0.0, math.log(value / known.fits[near]) / math.log(fit / near)))
        gain = ((small - 1) / fit) ** growth - 1
        best = max((self.mean(name) for name in self.configs), default=None)  # re-runs correct a lucky first
        return gain >= WORTH and (best is None or value * (1 + gain) > best)

    def _behind(self, stage: int, fit: int | None) -> bool:
        """With layouts (tune/layout.py): a lane whose largest size measured more than BEHIND below the best of
        another layout measures no smaller sizes (a smaller size pays where the step's time grows faster than its
        samples, by a few percent, never by that much). With one layout every stage measures as ever."""
        if fit is None or len(self.spec.layouts) == 1 or not self.configs or self.metric.minimize:
            return False
        best = max(self.configs, key=self.mean)
        if layout_of(self.configs[best][0]) == layout_of(stage):
            return False
        return self.stages[stage].fits[fit] < (1 - BEHIND) * self.mean(best)

    def _keep_batch(self, known: Stage, fit: int, mbs: int) -> None:
        """Without a global batch in the config, a size measured below the largest that fits runs with the
        accumulation that keeps the largest's batch per GPU, as DeepSpeed's autotuner derives it (largest x the
        config's accumulation, over the size), fixed from now on (knowledge.accumulation_of)."""
        own = self.spec.config_accumulation()
        if own is not None and (derived := fit * own // mbs) != own:
            known.accumulation.setdefault(mbs, derived)

    def _measure(self, known: Stage, fit: int | None) -> list[int]:
        """The next size below the largest that fits worth measuring: three quarters of it, then half, and so
        on, one at a time, going on only while the last one measured better than every larger size by WORTH
        (as DeepSpeed's autotuner goes down its list only while a smaller size pays); at most `measure` sizes
        measured near the largest (a quarter of it and up), the bisection's own runs counted."""
        if fit is None:
            return []
        previous = known.fits[fit]
        near = sum(1 for m in known.fits.keys() | known.out if m >= fit // 4)
        for fraction in (3 / 4, 1 / 2, 3 / 8, 1 / 4):
            mbs = self.spec.kept(max(self.spec.min_mbs, int(fit * fraction)))
            if mbs is None or mbs >= fit or mbs in known.too_big:
                continue
            if mbs in known.out:
                return []
            if mbs not in known.fits:
                if near >= self.spec.measure:
                    return []
                self._keep_batch(known, fit, mbs)
                return [mbs]
            value = known.fits[mbs]
            if not self.metric.better(value, previous) or abs(value - previous) < WORTH * abs(previous):
                return []  # a smaller size stopped paying
            previous = value
        return []
