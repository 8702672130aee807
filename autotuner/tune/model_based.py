"""tuner_type model_based: Optuna's TPE sampler through its ask/tell interface, on the grid the random tuner
draws from (each ZeRO stage x the micro-batch sizes that double from the smallest). Optuna is an optional extra
(`pip install 'ds-autotune[tune]'`), imported only here, only when this tuner is used.

The study holds what the search knows: the ledger's trials, in the order they were proposed, each as TPE is told
it. It is kept between asks and told only what changed (new trials, outcomes of trials that were running), and
the sampler is seeded by the spec's seed and the number of trials at each ask: each decision is a function of the
ledger alone, so a search rebuilt on resume (its study built in one go) proposes what the one that died would
have. The trials an ask makes are failed once the decision is taken: TPE leaves FAIL trials out of everything it
reads, so the kept study samples as one holding the ledger's trials alone. A kept trial whose told state would
have to change after it ended (a crashed run later known too big: FAIL then PRUNED), which Optuna cannot do,
makes the study be built anew.
"""
from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from ..errors import UserError
from ..spec import Experiment
from ..states import State
from .inputs import OPTUNA_MISSING
from .reruns import rerun_of
from .search import Search
from .space import SearchSpec, Setting, sizes

if TYPE_CHECKING:  # optuna is an optional extra, imported at run time by load_optuna only
    from optuna import Study
    from optuna.distributions import BaseDistribution
    from optuna.samplers import BaseSampler, TPESampler
    from optuna.trial import FrozenTrial, TrialState

ASKS = 16  # asks per proposal before a point TPE keeps choosing (tried, or known not to fit) gives way to a draw
READS = 6_000  # trials TPE's passes of one proposal read at most, about (`_asks`)
STARTUP = 4  # trials drawn at random before TPE models them (Optuna's default, 10, is most of a small grid)


def load_optuna() -> ModuleType:
    """The optuna module; a UserError naming the extra when it is not installed."""
    try:
        import optuna
    except ImportError:
        raise UserError(OPTUNA_MISSING) from None
    return optuna


@contextlib.contextmanager
def _quiet(optuna: ModuleType) -> Iterator[None]:
    """Optuna logs every study and trial at INFO to stderr by default: quiet while we use it, then as it was."""
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(level)


def _kept_cache(old: BaseSampler, new: TPESampler) -> TPESampler:
    """`new` (a sampler seeded for this decision) with `old`'s intersection search space, a cache of the study
    the two sample: a new one reads every trial's distributions again (most of a decision's cost at 1,000 trials).
    Optuna's attribute, so only where both have it; what is sampled does not change, every trial holding the
    same space (`ModelSearch.space`)."""
    if hasattr(old, "_search_space") and hasattr(new, "_search_space"):
        new._search_space = old._search_space
    return new


class ModelSearch(Search):
    """model_based (see the module docstring). Points are (stage: categorical among the allowed stages,
    log2_mbs: int, the size `min_mbs * 2**log2_mbs`, the largest allowed last); runs still out are told to TPE
    as RUNNING, for its constant liar to steer the next asks away from them. In full mode a stage's ZeRO knobs
    join the point as categorical parameters of that stage (`z2_overlap_comm`), asked once the stage is drawn."""

    def __init__(self, spec: SearchSpec):
        super().__init__(spec)
        self.optuna = load_optuna()
        self.sizes = sizes(spec)
        self.space = self._space()
        self.points: list[tuple[int, int, Setting]] = []  # every trial, micro-batch or knob, in proposal order
        self._kept: Study | None = None  # the study between asks
        self._told_states: list[tuple[TrialState, float | None]] = []  # what it was told of each of `points`
        self._numbers: list[int] = []  # each point's trial number in it
        self._size = 0  # its trials, the failed asks included

    def take(self, stage: int, mbs: int, knobs: Setting = ()) -> Experiment | None:
        experiment = super().take(stage, mbs, knobs)
        if experiment is not None:
            self.points.append((stage, mbs, knobs))
        return experiment

    def replay(self, experiments: Sequence[Experiment], latest: Mapping[str, tuple[State, str | None,
                                                                                    float | None]],
               metrics: Mapping[str, Mapping[str, float]] | None = None) -> None:
        """As every search, and the trials in the ledger's order, as the live search took them."""
        super().replay(experiments, latest, metrics)
        for e in experiments:
            placed = self.place_of(e)
            if self.spec.profile_of(e.name) is None and rerun_of(e.name) is None and placed is not None \
                    and placed[0] in self.stages and self.level_of(e) == self.spec.offload:
                self.points.append((*placed, self.setting_of(e)))

    def escalate(self, level: int | None = None) -> bool:
        """As every search; the study starts afresh on the new level's stages: the points of the level before (none
        of which fit) are no part of it, its trials and names being the new level's."""
        if not super().escalate(level):
            return False
        self.space = self._space()
        self.points, self._kept, self._told_states, self._numbers, self._size = [], None, [], [], 0
        return True

    def _space(self) -> dict[str, BaseDistribution]:
        """The point TPE asks for: the stage among those of the level searched, and the size's place on the grid."""
        dist = self.optuna.distributions
        return {"stage": dist.CategoricalDistribution(self.spec.lanes),
                "log2_mbs": dist.IntDistribution(0, len(self.sizes) - 1)}

    def choose(self, room: int) -> list[Experiment]:
        proposed: list[Experiment] = []
        while len(proposed) < room and not self._spent():
            point = self._ask()
            experiment = self.take(*point) if point is not None else None
            if experiment is None:
                break
            proposed.append(experiment)
        return proposed

    def study(self) -> Study:
        """A new Optuna study of the search's trials in the order proposed, each as TPE is told it (`_state`):
        built from the ledger alone, as a search rebuilt on resume first builds it."""
        optuna = self.optuna
        with _quiet(optuna):
            study = optuna.create_study(direction="minimize" if self.metric.minimize else "maximize",
                                        sampler=self._sampler())
            for point in self.points:
                study.add_trial(self._told(*point))
        return study

    def _sampler(self) -> TPESampler:
        return self.optuna.samplers.TPESampler(seed=self._seed, constant_liar=True, n_startup_trials=STARTUP)

    def _synced(self) -> Study:
        """The kept study told what changed since the last ask: outcomes of trials it holds as running, and the
        trials proposed since; built anew where a trial that ended would have to change (see the module), and
        once the asks it failed outnumber its trials: TPE leaves them out of what it models, but Optuna filters
        them out of every read (a live search of a few hundred trials asks thousands of times)."""
        told = [self._state(*point) for point in self.points]
        known = len(self._told_states)
        running = self.optuna.trial.TrialState.RUNNING
        changed = [i for i in range(known) if told[i] != self._told_states[i]]
        stale = self._size > 2 * len(self.points) + 4 * ASKS  # more failed asks than trials: every read filters them
        if self._kept is None or stale or any(self._told_states[i][0] != running for i in changed):
            self._kept, self._size = self.study(), len(self.points)
            self._told_states, self._numbers = told, list(range(len(self.points)))
            return self._kept
        study = self._kept
        with _quiet(self.optuna):
            for i in changed:
                state, value = told[i]
                if state != running:
                    study.tell(self._numbers[i], value, state=state)
                self._told_states[i] = told[i]
            for point, told_state in zip(self.points[known:], told[known:], strict=True):
                study.add_trial(self._told(*point))
                self._told_states.append(told_state)
                self._numbers.append(self._size)
                self._size += 1
        study.sampler = _kept_cache(study.sampler, self._sampler())
        return study

    def _ask(self) -> tuple[int, int, Setting] | None:
        """The next point: TPE's, else (when it keeps choosing points tried or known not to fit) one of the open
        points drawn with the same seed; None when none is open. A point asked again is left running for the
        next ask (TPE's constant liar steers away from it); every trial asked is failed before this returns."""
        study = self._synced()
        asked = []
        try:
            with _quiet(self.optuna):
                for _ in range(self._asks()):
                    trial = study.ask(self.space)
                    asked.append(trial.number)
                    self._size += 1
                    stage = trial.params["stage"]
                    values = {key: trial.suggest_categorical(self._param(stage, key), choices)
                              for key, choices in self.spaces.get(stage, {}).items()}
                    point = (stage, self.sizes[trial.params["log2_mbs"]], self.setting(stage, values))
                    if self.open(*point):
                        return point
                    if (bounded := self.substitute(*point)) is not None:  # the memory model's bound stands for it
                        return point[0], bounded, point[2]
        finally:
            with _quiet(self.optuna):
                for number in asked:
                    study.tell(number, state=self.optuna.trial.TrialState.FAIL)
        left = self.open_points(self.sizes)
        return random.Random(self._seed).choice(left) if left else None

    def _asks(self) -> int:
        """How many times TPE is asked before an open point is drawn instead: ASKS, fewer once the history is long
        (READS over the trials times the passes an ask makes, at least one). Each ask is a TPE pass over every
        trial for the stage and size, and one more for each knob of the stage drawn (asked apart), so a decision
        reads about READS trials at most whatever the history: its cost stays flat. Where that cuts the asks, most
        of a grid is tried and TPE, whose choices gather where the best were, mostly chooses points tried: the
        draw among the open points is what decides there anyway."""
        passes = 1 + max((len(space) for space in self.spaces.values()), default=0)
        return max(1, min(ASKS, READS // (passes * max(1, len(self.trials) + len(self.knob_trials)))))

    @property
    def _seed(self) -> int:
        """The seed of the next ask: the spec's, and how many trials came before it."""
        return (self.spec.seed * 1_000_003 + len(self.trials) + len(self.knob_trials)) % 2**32

    @staticmethod
    def _param(stage: int, key: str) -> str:
        """A knob's parameter: one per stage, as a knob's values (its first) may differ between stages."""
        return f"z{stage}_{key}"

    def _told(self, stage: int, mbs: int, knobs: Setting = ()) -> FrozenTrial:
        """One trial of the search as TPE is told it."""
        state, value = self._state(stage, mbs, knobs)
        space = self.spaces.get(stage, {})
        values = {k: v[0] for k, v in space.items()} | dict(knobs)
        dist = self.optuna.distributions
        return self.optuna.trial.create_trial(
            params={"stage": stage, "log2_mbs": self._index(mbs)}
            | {self._param(stage, k): v for k, v in values.items()},
            distributions=self.space | {self._param(stage, k): dist.CategoricalDistribution(v)
                                        for k, v in space.items()},
            state=state, value=value)

    def _index(self, mbs: int) -> int:
        """A size's place on the grid; one between its points (the memory model's bound) is told as the point
        below it."""
        return max(i for i, size in enumerate(self.sizes) if size <= mbs)

    def _state(self, stage: int, mbs: int, knobs: Setting = ()) -> tuple[TrialState, float | None]:
        """What a point is to TPE. Out of memory (or time) is PRUNED, never FAIL: TPE leaves FAIL trials out of
        its model, so an OOM told as FAIL teaches it nothing and it samples there again."""
        states, known = self.optuna.trial.TrialState, self.stages[stage]
        if knobs:
            point = (stage, mbs, knobs)
            if point in self.knob_fits:
                return states.COMPLETE, self.knob_fits[point]
            if known.pruned(mbs) or mbs >= self.knob_oom.get((stage, knobs), mbs + 1):
                return states.PRUNED, None
            return (states.RUNNING if point in self.knob_out else states.FAIL), None
        if mbs in known.fits:
            return states.COMPLETE, known.fits[mbs]
        if known.pruned(mbs):
            return states.PRUNED, None
        if mbs in known.out:
            return states.RUNNING, None
        return states.FAIL, None  # a crash (its stage is given up), or cancelled: nothing learnt
