"""The memory model's loop closed (memory_model.py holds the model itself): with the memory of the GPUs known
(`gpu_memory`), the model's facts come from `model_info` (the spec's `facts`) or else from a profile run
(`NAME_profile`, first of all: DeepSpeed's engine at the smallest stage and size writes the parameter count and the
activation memory, then ends; out of memory, the next stage is profiled, `NAME_profile_zS`). A stage whose model
states cannot fit is skipped (never run); the others' micro-batch sizes start at the predicted largest and stay
below it until a run there fits, then one probe past it: a success there shows the model low and lifts the bound.
A profile run that fails leaves the search without a model, as with CPU slots: runs out of memory bound it.

Measured peaks (NVML, or a script's own `peak_memory`) and OOM runs correct the model's activation memory as runs
end (`model`): the stages still to start are bounded by the corrected model. When nothing fits at an offload
level, the search goes on at the next (`escalate`: space.SearchSpec.levels), bounded by the model there; the
node's RAM bounds what may be offloaded (memory_model.host_states; `host_memory`).
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from ..spec import Experiment
from ..spec.sure import TOLERANCE
from ..states import Reason, State
from .knowledge import Knowledge
from .layout import checkpointing, layout_of, replicated_params, stage_of
from .memory_model import Facts, Training, model_states
from .space import SearchSpec
from .stage import Stage

log = logging.getLogger(__name__)


def profile_facts(spec: SearchSpec, metrics: Mapping[str, float] | None, name: str) -> Facts | None:
    """The facts of a profile run's metrics (what DeepSpeed's engine wrote to its model info file): the activation
    memory it measured at the smallest size, per sample, and the trainable parameters it counted; None when it
    holds no parameter count."""
    num_params = (metrics or {}).get("num_params")
    if not num_params or num_params <= 0:
        return None
    activation = (metrics or {}).get("activation_mem_per_gpu")
    # measured in the first layout (its TP size, its knobs): the figure at TP 1 without checkpointing is its over
    # the layout's share
    per_sample = activation / spec.min_mbs / spec.share(0) if activation and activation > 0 else None
    trainable = (metrics or {}).get("trainable_num_params")
    return Facts(int(num_params), per_sample, f"profile run {name}",
                 int(trainable) if trainable is not None and 0 <= trainable < num_params else None)


class MemoryLoop(Knowledge):
    """`Knowledge` with the memory model: its facts (stated or profiled), corrected by what runs showed."""

    def __init__(self, spec: SearchSpec):
        super().__init__(spec)
        self.facts: Facts | None = None  # as stated or profiled; `model` is what runs corrected them to
        self.profile: str | None = "wanted" if spec.profiles else None  # wanted, out, done, failed
        self.profile_stage = min(spec.stages)  # of the profile run wanted or out
        if spec.facts is not None:
            self.apply(Facts.from_json(spec.facts))

    def learn(self, experiment: Experiment, state: State, reason: str | None, value: float | None,
              peak: int | None = None) -> None:
        """As `Knowledge.learn`; a peak or an OOM then corrects the memory model (`model`)."""
        super().learn(experiment, state, reason, value, peak)
        if self.facts is not None and (peak or reason == Reason.OOM):
            self._relearn()

    def apply(self, facts: Facts) -> None:
        """The model's bounds, from `facts`: a stage that cannot fit is skipped, the others bounded."""
        self.facts = facts
        self._bound(facts)

    def _bound(self, facts: Facts) -> None:
        """Each stage's bound from `facts`, for the stages no run has answered or is answering yet (a stage's
        search keeps the bound it started with)."""
        for stage, found in self.spec.bounds(facts, self._by_layout()).items():
            known = self.stages[stage]
            if known.fits or known.too_big or known.out or known.crashed:
                continue
            known.predicted = found.largest
            known.given_up = found.largest == 0

    def model(self) -> Facts | None:
        """The memory model's facts corrected by what runs showed (the loop closed): the activation memory per
        sample each run that fit measured (its peak less the model states of its stage, over its size), and
        the least each run out of memory needed (the GPU less those states, over its size); the largest of
        those figures, once there is one, stands for the stated one. A wrong model then stops launching runs
        that run out of memory at the stages still to come."""
        facts, gpu = self.facts, self.spec.gpu_memory
        if facts is None or gpu is None:
            return facts
        states = self._states(facts)
        # each figure as at TP 1 without checkpointing, through its layout's share; a checkpointed layout's runs
        # teach that layout alone (`_by_layout`): what checkpointing keeps is the model's roughest guess
        share = {stage: self.spec.share(layout_of(stage)) for stage in self.stages
                 if not checkpointing(self.spec.layouts[layout_of(stage)][1])}
        seen = [figure / share[stage] for stage in share if (figure := self._per_sample(stage, states[stage]))
                is not None]
        seen += [(gpu - states[stage]) / mbs / share[stage] for stage in share for mbs in self.stages[stage].oom
                 if gpu > states[stage] and _within(mbs, self.stages[stage].predicted)]
        if not seen:
            return facts
        return replace(facts, activation=max(seen), source=f"{facts.source}, corrected by {len(seen)} run(s)")

    def _states(self, facts: Facts) -> dict[int, float]:
        """Each lane's model states (its stage, its TP size: ZeRO over world / TP)."""
        spec, training = self.spec, Training.of(self.spec.base)
        whole = replicated_params(facts.num_params, spec.shape)
        return {lane_: model_states(facts.num_params, stage_of(lane_), training, max(1, spec.dp // spec.tp_of(lane_)),
                                    spec.mp, facts.trainable, spec.tp_of(lane_), whole) for lane_ in self.stages}

    def _by_layout(self) -> dict[int, float]:
        """Each layout's activations per sample as its own runs' peaks showed them (the largest of its lanes'):
        what the model learns of a layout (a TP size, checkpointing) beyond its share, where runs measured it."""
        if self.facts is None or not self.peaks or len(self.spec.layouts) == 1:
            return {}
        states = self._states(self.facts)
        found: dict[int, float] = {}
        for stage in self.stages:
            figure = self._per_sample(stage, states[stage])
            if figure is not None:
                found[layout_of(stage)] = max(figure, found.get(layout_of(stage), 0.0))
        return found

    def _per_sample(self, stage: int, states: float) -> float | None:
        """The activation memory per sample a stage's measured peaks show: the slope between its smallest and
        largest size measured (what the runtime keeps on top cancels out), or with one size, its peak less the
        model states over it (an over-estimate by that share: the safe side). None: no peak measured."""
        measured = sorted((mbs, peak) for (s, mbs), peak in self.peaks.items() if s == stage)
        if not measured:
            return None
        (small, low), (large, high) = measured[0], measured[-1]
        if large > small and high > low:
            return (high - low) / (large - small)
        return (high - states) / large if high > states else None

    def _relearn(self) -> None:
        """After a run: the stages still to start bounded by the corrected model (and, with layouts, by what each
        layout's own runs showed)."""
        corrected = self.model()
        if corrected is not None and (corrected != self.facts or len(self.spec.layouts) > 1):
            self._bound(corrected)

    def learn_profile(self, stage: int, state: State, reason: str | None, metrics: Mapping[str, float] | None,
                      detail: str | None = None, live: bool = True) -> None:
        """A profile run ended: its facts bound the search. Out of memory, it showed that its stage cannot fit at
        the smallest size (as that stage's own run would have), and the next stage tuned is profiled. Failed
        otherwise (no model info written), the search goes on without a model, said in one line."""
        name = self.spec.profile_name(stage)
        facts = profile_facts(self.spec, metrics, name) if state == State.SUCCEEDED else None
        if facts is not None:
            self.profile = "done"
            self.apply(facts)
            return
        later = [s for s in sorted(self.spec.stages) if s > stage]
        if reason == Reason.OOM:
            self.stages[stage].too_big.add(self.spec.min_mbs)
            if later:
                self.profile, self.profile_stage = "wanted", later[0]
                return
        self.profile = "failed"
        if live:
            log.warning("the profile run %s %s%s: searching without a memory model (runs that run out of "
                        "memory bound the search instead)", name, state.value,
                        f" ({detail})" if detail else " without writing the model info")

    def _profile_run(self) -> list[Experiment]:
        """The profile run, once: DeepSpeed's engine at the smallest stage and size, told to write its model
        info (`autotuning.model_info.profile`), the rest of the user's config as it is."""
        if self.profile != "wanted":
            return []
        self.profile = "out"
        data = self.experiment(self.profile_stage, self.spec.min_mbs).to_json()
        config = data["ds_config"]
        kept = {k: v for k, v in config.get("autotuning", {}).items() if k != TOLERANCE}  # nothing to be sure of:
        config["autotuning"] = {**kept, "model_info": {"profile": True}}  # its engine ends it at its first pass
        name = self.spec.profile_name(self.profile_stage)
        self.proposed.add(name)
        return [Experiment.from_json({**data, "name": name})]

    # --- offload ------------------------------------------------------------------------------------------
    # --- offload ------------------------------------------------------------------------------------------
    def escalate(self, level: int | None = None) -> bool:
        """Go on at the next offload level (or `level`): nothing fits at this one. What runs taught of the
        activations stays in the model's facts; the stages start afresh, bounded by the model at that level.
        False when there is no further level."""
        wanted = [s for s in self.levels if s.offload > self.spec.offload and (level is None or s.offload == level)]
        if not wanted:
            return False
        corrected = self.model()
        self.spec, self.stages, self.peaks, self.since_best = wanted[0], {}, {}, 0
        for stage in self.spec.lanes:
            self.stages[stage] = Stage(top=self.spec.max_mbs)
        if corrected is not None:
            self.apply(corrected)
        return True


def _within(mbs: int, predicted: int | None) -> bool:
    """An OOM at a size the model said fits (or with no size predicted): it teaches the model something."""
    return predicted is None or mbs <= predicted
