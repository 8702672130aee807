"""`autotune tune`'s search: the fastest micro-batch size of each ZeRO stage, found without a hand-written grid.

A `Source` for the scheduler (core/scheduler.py): whenever slots are free and nothing waits, it is asked for
the next experiments, and it learns from every run that ends. Each ZeRO stage is searched on its own, all stages
at once: the micro-batch size doubles from the smallest until a run runs out of memory (or the largest allowed),
then a binary search finds the largest size that fits, then a few sizes below it are measured. An OOM is an
answer (that size and every larger one of the stage do not fit), never retried; a stage whose runs fail for
another reason is given up. Gradient accumulation is derived so that the global batch stays what the user asked.

The ledger stays the truth: every trial is an experiment of the sweep. The search keeps no state of its own
that the ledger lacks: on resume it is rebuilt by replaying the ledger (`replay`), and makes the same decisions.
"""
from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .core import Run
from .metrics import Metric, metric_named
from .outcome import Outcome
from .spec import Experiment
from .spec.model import with_mapped_args
from .states import Reason, State

MAX_MICRO_BATCH = 4096  # the largest micro-batch size tried when the user sets no bound


@dataclass(frozen=True)
class SearchSpec:
    """Everything the search needs, as JSON in the ledger's meta (`search`), so that resume rebuilds it."""

    prefix: str  # of the experiment names
    template: Mapping[str, Any]  # Experiment JSON fields but name and ds_config (script, args, num_gpus, ...)
    base: Mapping[str, Any]  # the user's ds_config, its autotuning section reduced to what the engine reads
    stages: tuple[int, ...]
    metric: str
    min_mbs: int = 1
    max_mbs: int = MAX_MICRO_BATCH
    measure: int = 3  # micro-batch sizes measured near the largest that fits (DeepSpeed's num_tuning_...)
    global_batch: int | None = None  # the train_batch_size to keep (gradient accumulation derived), if any
    trials: int | None = None  # at most this many experiments (DeepSpeed's tuner_num_trials)
    patience: int | None = None  # stop after this many ended runs without a better one (tuner_early_stopping)

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"stages": list(self.stages), "template": dict(self.template), "base": dict(self.base)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SearchSpec:
        return cls(**{**data, "stages": tuple(data["stages"])})

    @property
    def world(self) -> int:
        return int(self.template.get("num_gpus", 1)) * int(self.template.get("num_nodes", 1))


@dataclass
class _Stage:
    """What is known of one ZeRO stage: sizes that fit (with their metric), sizes that do not, sizes out."""

    fits: dict[int, float] = field(default_factory=dict)
    too_big: set[int] = field(default_factory=set)
    out: set[int] = field(default_factory=set)  # proposed, not ended yet
    given_up: bool = False


class MicroBatchSearch:
    """The structured search (see the module docstring); a `Source`."""

    def __init__(self, spec: SearchSpec):
        self.spec = spec
        self.metric: Metric = metric_named(spec.metric)
        self.stages = {stage: _Stage() for stage in spec.stages}
        self.proposed: set[str] = set()
        self.best: float | None = None
        self.since_best = 0  # runs ended since the best got better

    # --- the Source protocol ------------------------------------------------------------------------------
    def propose(self, free_slots: int, now: float) -> list[Experiment]:
        """The next experiments: one per stage while it searches, several once it measures; none when every
        stage waits for a run, is done, or the budget is spent."""
        if self._stopped():
            return []
        room = max(1, free_slots // self.spec.world)  # at least one: the queue holds what does not fit yet
        proposed: list[Experiment] = []
        for stage, known in self.stages.items():
            for mbs in self._next(known):
                if len(proposed) >= room or self._spent():
                    return proposed
                experiment = self.experiment(stage, mbs)
                if experiment.name in self.proposed:
                    continue
                known.out.add(mbs)
                self.proposed.add(experiment.name)
                proposed.append(experiment)
        return proposed

    def observe(self, run: Run, outcome: Outcome) -> None:
        self.learn(run.experiment, outcome.state, outcome.reason,
                   outcome.metrics.get(self.metric.name) if outcome.metrics else None)

    # --- learning -----------------------------------------------------------------------------------------
    def learn(self, experiment: Experiment, state: State, reason: str | None, value: float | None) -> None:
        """One ended run (or, replaying, one recorded). Interrupted or cancelled ones teach nothing: they are
        run again (resume) or were not wanted."""
        placed = self._place_of(experiment)
        if placed is None or placed[0] not in self.stages:
            return
        stage, mbs = placed
        known = self.stages[stage]
        known.out.discard(mbs)
        if state == State.SUCCEEDED and value is not None:
            known.fits[mbs] = value
            if self.best is None or self.metric.better(value, self.best):
                self.best, self.since_best = value, 0
                return
        elif state in (State.FAILED, State.TIMED_OUT) and (reason == Reason.OOM or state == State.TIMED_OUT):
            known.too_big.add(mbs)
        elif state in (State.FAILED, State.SUCCEEDED):  # a crash, a refused config, no metric: not a size answer
            known.given_up = True
        else:
            return
        self.since_best += 1

    def replay(self, experiments: Sequence[Experiment], latest: Mapping[str, tuple[State, str | None,
                                                                                    float | None]]) -> None:
        """Rebuild from the ledger: every experiment it holds was proposed; those ended are learnt, in the
        ledger's order; the others (queued, running, interrupted: to run again) are out."""
        for e in experiments:
            self.proposed.add(e.name)
            placed = self._place_of(e)
            state, reason, value = latest.get(e.name, (State.QUEUED, None, None))
            if state.terminal and state not in (State.INTERRUPTED, State.CANCELLED):
                self.learn(e, state, reason, value)
            elif placed is not None and placed[0] in self.stages and state != State.CANCELLED:
                self.stages[placed[0]].out.add(placed[1])

    # --- deciding -----------------------------------------------------------------------------------------
    def _next(self, known: _Stage) -> list[int]:
        """The sizes of a stage to try next, given what is known of it."""
        if known.given_up:
            return []
        spec = self.spec
        fit = max(known.fits, default=None)
        small = min(known.too_big, default=None)
        if known.out:
            return self._measure(known, fit) if self._searched(known, fit, small) else []
        if fit is None:
            return [spec.min_mbs] if small is None else []  # the smallest does not fit: the stage is out
        if small is None:
            if fit < spec.max_mbs:
                return [min(fit * 2, spec.max_mbs)]
        elif small - fit > 1:
            return [(fit + small) // 2]
        return self._measure(known, fit)

    def _searched(self, known: _Stage, fit: int | None, small: int | None) -> bool:
        """The largest size that fits is known (only measuring remains)."""
        return fit is not None and (fit >= self.spec.max_mbs or (small is not None and small - fit <= 1)) \
            and not any(m > fit for m in known.out)

    def _measure(self, known: _Stage, fit: int | None) -> list[int]:
        """Sizes below the largest that fits, worth measuring: three quarters and half of it, and so on."""
        if fit is None:
            return []
        wanted = []
        for fraction in (3 / 4, 1 / 2, 3 / 8, 1 / 4):
            mbs = max(self.spec.min_mbs, int(fit * fraction))
            if mbs not in known.fits and mbs not in known.too_big and mbs not in known.out and mbs not in wanted:
                wanted.append(mbs)
        measured_near = sum(1 for m in known.fits if m >= fit // 4)
        return wanted[:max(0, self.spec.measure - measured_near)]

    def _stopped(self) -> bool:
        """Early stopping: `patience` runs ended without a better result."""
        return self.spec.patience is not None and self.since_best >= self.spec.patience

    def _spent(self) -> bool:
        """The trial budget is used up."""
        return self.spec.trials is not None and len(self.proposed) >= self.spec.trials

    # --- experiments --------------------------------------------------------------------------------------
    def experiment(self, stage: int, mbs: int) -> Experiment:
        """The experiment for one stage and micro-batch size: the user's config with both set, gradient
        accumulation derived to keep the global batch, and the script's arguments mapped."""
        spec = self.spec
        config = copy.deepcopy(dict(spec.base))
        config.setdefault("zero_optimization", {})["stage"] = stage
        config["train_micro_batch_size_per_gpu"] = mbs
        name = f"{spec.prefix}_z{stage}_mbs{mbs}"
        if spec.global_batch is not None:
            gas = max(1, spec.global_batch // (mbs * spec.world))
            config["gradient_accumulation_steps"] = gas
            config["train_batch_size"] = mbs * gas * spec.world
            name += f"_gas{gas}"
        template = dict(spec.template)
        args = with_mapped_args(template.pop("args", []), config, template.pop("arg_mappings", {}))
        return Experiment.from_json({**template, "name": name, "ds_config": config, "args": args})

    @staticmethod
    def _place_of(experiment: Experiment) -> tuple[int, int] | None:
        """(stage, micro-batch size) of one of the search's experiments, read from its config."""
        config = experiment.ds_config
        stage = (config.get("zero_optimization") or {}).get("stage")
        mbs = config.get("train_micro_batch_size_per_gpu")
        if isinstance(stage, int) and isinstance(mbs, int):
            return stage, mbs
        return None
