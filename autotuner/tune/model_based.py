"""tuner_type model_based: Optuna's TPE sampler through its ask/tell interface, on the grid the random tuner
draws from (each ZeRO stage x the micro-batch sizes that double from the smallest). Optuna is an optional extra
(`pip install 'ds-autotune[tune]'`), imported only here, only when this tuner is used.

The study is rebuilt from what the search knows (the ledger's trials, in the order they were proposed) at every
ask, with the sampler seeded by the spec's seed and the trial's number: each decision is a function of the
ledger alone, so a search rebuilt on resume proposes what the one that died would have.
"""
from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

from ..errors import UserError
from ..spec import Experiment
from .inputs import OPTUNA_MISSING
from .search import Search, SearchSpec, Setting, sizes

ASKS = 16  # asks per proposal before a point TPE keeps choosing (tried, or known not to fit) gives way to a draw
STARTUP = 4  # trials drawn at random before TPE models them (Optuna's default, 10, is most of a small grid)


def load_optuna() -> Any:
    """The optuna module; a UserError naming the extra when it is not installed."""
    try:
        import optuna
    except ImportError:
        raise UserError(OPTUNA_MISSING) from None
    return optuna


@contextlib.contextmanager
def _quiet(optuna: Any) -> Iterator[None]:
    """Optuna logs every study and trial at INFO to stderr by default: quiet while we use it, then as it was."""
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(level)


class ModelSearch(Search):
    """model_based (see the module docstring). Points are (stage: categorical among the allowed stages,
    log2_mbs: int, the size `min_mbs * 2**log2_mbs`, the largest allowed last); runs still out are told to TPE
    as RUNNING, for its constant liar to steer the next asks away from them. In full mode a stage's ZeRO knobs
    join the point as categorical parameters of that stage (`z2_overlap_comm`), asked once the stage is drawn."""

    def __init__(self, spec: SearchSpec):
        super().__init__(spec)
        self.optuna = load_optuna()
        self.sizes = sizes(spec)
        dist = self.optuna.distributions
        self.space = {"stage": dist.CategoricalDistribution(spec.stages),
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

    def study(self) -> Any:
        """An Optuna study of the search's trials in the order proposed, each as TPE is told it (`_state`), with
        a TPE sampler seeded by the spec's seed and the number of trials: rebuilt from the ledger alone."""
        optuna = self.optuna
        with _quiet(optuna):
            sampler = optuna.samplers.TPESampler(seed=self._seed, constant_liar=True, n_startup_trials=STARTUP)
            study = optuna.create_study(direction="minimize" if self.metric.minimize else "maximize",
                                        sampler=sampler)
            for stage, mbs in self.trials:
                study.add_trial(self._told(stage, mbs))
            for stage, mbs, knobs in self.knob_trials:
                study.add_trial(self._told(stage, mbs, knobs))
        return study

    def _ask(self) -> tuple[int, int, Setting] | None:
        """The next point: TPE's, else (when it keeps choosing points tried or known not to fit) one of the open
        points drawn with the same seed; None when none is open."""
        study = self.study()
        with _quiet(self.optuna):
            for _ in range(ASKS):
                trial = study.ask(self.space)
                stage = trial.params["stage"]
                values = {key: trial.suggest_categorical(self._param(stage, key), choices)
                          for key, choices in self.spaces.get(stage, {}).items()}
                point = (stage, self.sizes[trial.params["log2_mbs"]], self.setting(stage, values))
                if self.open(*point):
                    return point
                if (bounded := self.substitute(*point)) is not None:  # the memory model's bound stands for it
                    return point[0], bounded, point[2]
                self._tell_known(study, trial, *point)
        left = [(stage, mbs, knobs) for stage in self.spec.stages for mbs in self.sizes
                for knobs in self.settings(stage) if self.open(stage, mbs, knobs)]
        return random.Random(self._seed).choice(left) if left else None

    @property
    def _seed(self) -> int:
        """The seed of the next ask: the spec's, and how many trials came before it."""
        return (self.spec.seed * 1_000_003 + len(self.trials) + len(self.knob_trials)) % 2**32

    @staticmethod
    def _param(stage: int, key: str) -> str:
        """A knob's parameter: one per stage, as a knob's values (its first) may differ between stages."""
        return f"z{stage}_{key}"

    def _told(self, stage: int, mbs: int, knobs: Setting = ()) -> Any:
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

    def _tell_known(self, study: Any, trial: Any, stage: int, mbs: int, knobs: Setting = ()) -> None:
        """A point asked again: told what is known of it, for the next ask (one still out stays a liar)."""
        state, value = self._state(stage, mbs, knobs)
        if state != self.optuna.trial.TrialState.RUNNING:
            study.tell(trial, value, state=state)

    def _state(self, stage: int, mbs: int, knobs: Setting = ()) -> tuple[Any, float | None]:
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
