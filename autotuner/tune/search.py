"""`autotune tune`'s search: the fastest (ZeRO stage, micro-batch size) without a hand-written grid.

A `Source` for the scheduler (core/scheduler.py): whenever slots are free and nothing waits, it is asked for
the next experiments, and it learns from every run that ends. Three tuners (DeepSpeed's `tuner_type`) share what
is learnt (`Search`) and differ only in which point they try next (`choose`):

- gridsearch (`MicroBatchSearch`): the structured walk of the grid. The first run is at the largest size the
  user allows (or the memory model predicts), since the largest size that fits is most often the fastest and one
  run there settles it; with no bound, the size doubles from the smallest until a run runs out of memory. Then a
  bisection on the log scale, sought only while a larger size could beat the best (`_worth`), then sizes below
  the largest that fits are measured, one at a time while a smaller one pays (`_measure`). The stages share
  what they learn: a lower stage needs at least the memory of a higher one at the same size (`vouched`,
  `ruled_out_above`), so the highest goes first, and the search works in rounds (nothing proposed while one of
  its runs is out): what it tries depends on the answers, never on the order in which runs end.
- random (`RandomSearch`): the grid's points (each stage x the sizes that double from the smallest, `sizes`) in
  an order drawn from the spec's seed.
- model_based (model_based.py): Optuna's TPE through ask/tell, on the same points.

Full mode (`fast: false`) adds each stage's ZeRO knobs (spec/knobs.py): a point is then (stage, size, knobs),
the knobs those that differ from the values its micro-batch search ran with (`Setting`, in the experiment's name
and config). gridsearch sweeps them knob by knob at a stage's best size once its micro-batch search is over; the
sampling tuners draw them with the rest. Knob points are learnt apart (`knob_*`): their answers say nothing of
the stage's sizes.

Memory (memory_model.py): with the memory of the GPUs known (`gpu_memory`), the model's facts come from `model_info`
(the spec's `facts`) or else from a profile run (`NAME_profile`, first of all: DeepSpeed's engine at the smallest
stage and size writes the parameter count and the activation memory, then ends; out of memory, the next stage is
profiled, `NAME_profile_zS`). A stage whose model states
cannot fit is skipped (never run); the others' micro-batch sizes start at the predicted largest and stay below it
until a run there fits, then one probe past it: a success there shows the model low and lifts the bound. A
profile run that fails leaves the search without a model, as with CPU slots: runs out of memory bound it.

Offload (ZeRO-Offload): when no configuration without offload fits (the model skips every stage, or every stage's
runs ran out of memory), the search starts over with the optimizer states offloaded to the CPU (`offload_optimizer:
{device: cpu}`, stages 1 and up, names tagged `_oo`), and when nothing fits that way either, with the parameters
too (`offload_param`, stage 3, `_op`): least offload first, each level searched as the stages were (`offloaded`),
the fastest config of the first level where one fits named best. The node's RAM bounds what may be offloaded
(memory.host_states; `host_memory`): a level that would exhaust it is skipped like a stage that cannot fit. A
config that already offloads starts at its own level.

An OOM is an answer (that size and every larger one of the stage do not fit: none of them is ever launched),
never retried; so is a timeout. A stage whose runs fail for another reason is given up. Gradient accumulation is
derived so that the global batch stays what the user asked. When the search is over, the best configs are run
once more (`NAME_confirm1`) and ranked by the mean of their runs, so that one lucky measurement does not name
the winner (`confirm`).

The ledger stays the truth: every trial is an experiment of the sweep. The search keeps no state of its own
that the ledger lacks: on resume it is rebuilt by replaying the ledger (`replay`), and makes the same decisions.
"""
from __future__ import annotations

import copy
import itertools
import logging
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..core import Queued, Run
from ..core.outcome import Outcome
from ..spec import Experiment
from ..spec.metrics import Metric, metric_named, reported_peak
from ..spec.model import NAME_MAX, with_mapped_args
from ..states import Reason, State
from .knobs import BY_KEY, tag_value
from .memory_model import OFF_GPU, Bound, Facts, Training, bound, model_states

MAX_MICRO_BATCH = 4096  # the largest micro-batch size tried when the user sets no bound
DEFAULT_TRIALS = 50  # DeepSpeed's tuner_num_trials default: the sampling tuners' budget when none is set
DEFAULT_PATIENCE = 5  # DeepSpeed's tuner_early_stopping default, likewise
DEFAULT_CONFIRM = 2  # configs re-run when the user says nothing, once more than this many succeeded
RERUN = re.compile(r"(.+)_confirm([0-9]+)")
WORTH = 0.01  # a larger size is sought only while it could measure this fraction better (see `_worth`)
CAPPED = 1 / 3  # how far a lower stage probes towards a size a higher stage's run may yet rule out (log scale)
PROFILE = "profile"  # the profile run's name: PREFIX_profile
OFFLOAD_TAGS = ("", "_oo", "_op")  # of the names of each offload level: none, optimizer to CPU, parameters too
log = logging.getLogger(__name__)

# A point's ZeRO knobs (full mode): the (key, value) pairs that differ from the stage's first values, in the
# order of the stage's knob space; () is the config its micro-batch search runs.
Setting = tuple[tuple[str, Any], ...]
Point = tuple[int, int, Setting]  # (stage, micro-batch size, knobs)


def rerun_name(name: str) -> str:
    """The name of a config's confirming re-run."""
    return f"{name}_confirm1"


def rerun_of(name: str) -> str | None:
    """The experiment a confirming re-run repeats, or None when `name` is no re-run."""
    found = RERUN.fullmatch(name)
    return found.group(1) if found else None


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
    global_batch: int | None = None  # train_batch_size (fixed_batch) or max_train_batch_size: see `accumulation`
    fixed_batch: bool = False  # global_batch is the config's train_batch_size: every candidate keeps it exactly
    trials: int | None = None  # at most this many experiments (DeepSpeed's tuner_num_trials)
    patience: int | None = None  # stop after this many ended runs without a better one (tuner_early_stopping)
    tuner: str = "gridsearch"  # spec.tuning.TUNERS
    seed: int = 0  # of the random and model-based tuners' draws: the same seed, the same decisions
    confirm: int | None = None  # configs re-run at the end; None: DEFAULT_CONFIRM when more than that succeeded
    # full mode: stage ("2") -> its ZeRO knobs to search -> their values, the one its micro-batches ran with first
    knobs: Mapping[str, Mapping[str, Sequence[Any]]] = field(default_factory=dict)
    gpu_memory: int | None = None  # bytes of one GPU the experiments run on (None: unknown, no memory model)
    facts: Mapping[str, Any] | None = None  # memory.Facts from model_info (None: a profile run finds them)
    mp: int = 1  # model-parallel degree (DeepSpeed's mp_size)
    min_gain: float = 0.0  # a better run resets `patience` only when better by this fraction of the best
    host_memory: int | None = None  # bytes of RAM of a node the experiments run on (None: unknown, no constraint)
    offload: int = 0  # the offload level searched (OFFLOAD_TAGS): the base config's own, or one the search went to

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"stages": list(self.stages), "template": dict(self.template), "base": dict(self.base),
                               "knobs": {s: {k: list(v) for k, v in space.items()} for s, space in self.knobs.items()},
                               "facts": dict(self.facts) if self.facts is not None else None}

    def fitted(self) -> SearchSpec:
        """This spec with its prefix cut so that every experiment name it can make (the longest: the largest
        stage, micro-batch size and accumulation, each knob at its longest value, a re-run) is a safe name;
        a ValueError where even an empty prefix would not do (knob values too long to write)."""
        gas = f"_gas{max(1, self.global_batch // (self.min_mbs * self.dp))}" if self.global_batch else ""
        longest = max(len(f"_z{stage}_mbs{self.max_mbs}{gas}{OFFLOAD_TAGS[-1]}") + sum(
            max(len(f"_{BY_KEY[key].tag}{tag_value(v)}") for v in values)
            for key, values in self.knobs.get(str(stage), {}).items()) for stage in self.stages)
        room = NAME_MAX - longest - len(rerun_name(""))
        prefix = self.prefix[:max(0, room)].rstrip("-._")  # (a negative room would cut from the end)
        if not prefix:
            raise ValueError(f"experiment names would be longer than {NAME_MAX} characters")
        return self if prefix == self.prefix else replace(self, prefix=prefix)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SearchSpec:
        # A ledger from before confirmation re-runs asked for none: its search goes on as it began.
        return cls(**{"confirm": 0, **data, "stages": tuple(data["stages"])})

    @property
    def world(self) -> int:
        return int(self.template.get("num_gpus", 1)) * int(self.template.get("num_nodes", 1))

    @property
    def dp(self) -> int:
        """The data-parallel GPUs of an experiment: its GPUs over the model-parallel degree (DeepSpeed's)."""
        return max(1, self.world // self.mp)

    def keeps(self, mbs: int) -> bool:
        """Whether a micro-batch size can keep a fixed train_batch_size: micro-batch x accumulation x data-parallel
        GPUs equals it for a whole accumulation (DeepSpeed refuses a config where it does not)."""
        return not self.fixed_batch or self.global_batch is None or self.global_batch % (mbs * self.dp) == 0

    def kept(self, mbs: int, low: int = 0) -> int | None:
        """The largest size at or below `mbs` and above `low` that keeps the batch (`keeps`); None when none does."""
        return next((m for m in range(mbs, max(low, self.min_mbs - 1), -1) if self.keeps(m)), None)

    def accumulation(self, mbs: int) -> int | None:
        """The gradient accumulation of a micro-batch size, as DeepSpeed derives it: a fixed train_batch_size over
        micro-batch x data-parallel GPUs; max_train_batch_size's share of one GPU over the micro-batch (at least
        1); None: the config's own."""
        if self.global_batch is None:
            return None
        if self.fixed_batch:
            return max(1, self.global_batch // (mbs * self.dp))
        return max(1, self.global_batch // self.dp // mbs)

    @property
    def profiles(self) -> bool:
        """A profile run comes first: the GPUs' memory is known and model_info states no parameter count."""
        return self.gpu_memory is not None and self.facts is None

    def profile_name(self, stage: int | None = None) -> str:
        """The profile run's name: PREFIX_profile at the smallest stage; PREFIX_profile_zS at a larger stage
        (the next one tuned, when a smaller one's ran out of memory)."""
        return f"{self.prefix}_{PROFILE}" if stage is None or stage == min(self.stages) else \
            f"{self.prefix}_{PROFILE}_z{stage}"

    def profile_of(self, name: str) -> int | None:
        """The stage of a profile run's name; None for any other name."""
        return next((stage for stage in self.stages if self.profile_name(stage) == name), None)

    def bounds(self, facts: Facts) -> dict[int, Bound]:
        """The memory model's bound of each stage on the spec's GPUs and nodes (memory_model.py); none with neither
        the GPUs' nor the nodes' memory known."""
        if self.gpu_memory is None and self.host_memory is None:
            return {}
        training = Training.of(self.base)
        local = int(self.template.get("num_gpus", 1))
        return {stage: bound(facts, training, stage, self.gpu_memory, self.dp, self.mp, self.min_mbs,
                             self.host_memory, local) for stage in self.stages}

    def own_offload(self) -> int:
        """The offload level the user's config states: 2 with parameters offloaded, 1 the optimizer, else 0."""
        training = Training.of(self.base)
        return 2 if training.offload_params else 1 if training.offload_optimizer else 0

    def offloaded(self, level: int) -> SearchSpec | None:
        """This spec at an offload level (OFFLOAD_TAGS): its config with the optimizer states (1), and the
        parameters too (2), offloaded to the CPU (a section the user wrote, an NVMe one say, kept), its stages
        those where that offload exists (1 and up; 3); None when none of its stages has it."""
        stages = tuple(s for s in self.stages if s >= (3 if level >= 2 else 1 if level else 0))
        if not stages:
            return None
        base = copy.deepcopy(dict(self.base))
        zero = base.setdefault("zero_optimization", {})
        for key, needed in (("offload_optimizer", 1), ("offload_param", 2)):
            section = zero.get(key)
            if level >= needed and not (isinstance(section, Mapping) and section.get("device") in OFF_GPU):
                zero[key] = {**(section if isinstance(section, Mapping) else {}), "device": "cpu"}
        return replace(self, base=base, stages=stages, offload=level)

    def levels(self) -> list[SearchSpec]:
        """This spec (its own offload level), then at each further offload level the search may go to. Not
        model_based's: its study's space is the stages it began with (it ends without a best instead)."""
        own = self.own_offload()
        if self.tuner == "model_based":
            return [replace(self, offload=own)]
        found = (self.offloaded(level) for level in range(own + 1, len(OFFLOAD_TAGS)))
        return [replace(self, offload=own), *(spec for spec in found if spec is not None)]


def profile_facts(spec: SearchSpec, metrics: Mapping[str, float] | None, name: str) -> Facts | None:
    """The facts of a profile run's metrics (what DeepSpeed's engine wrote to its model info file): the activation
    memory it measured at the smallest size, per sample, and the trainable parameters it counted; None when it
    holds no parameter count."""
    num_params = (metrics or {}).get("num_params")
    if not num_params or num_params <= 0:
        return None
    activation = (metrics or {}).get("activation_mem_per_gpu")
    per_sample = activation / spec.min_mbs if activation and activation > 0 else None
    trainable = (metrics or {}).get("trainable_num_params")
    return Facts(int(num_params), per_sample, f"profile run {name}",
                 int(trainable) if trainable is not None and 0 <= trainable < num_params else None)



def midpoint(low: int, high: int, share: float = 0.5) -> int:
    """The size `share` of the way from `low` to `high` on the log scale (halfway: bisection), strictly between
    them (`low` when none is)."""
    return max(low + 1, min(high - 1, round(low * (high / low) ** share))) if high - low > 1 else low


def sizes(spec: SearchSpec) -> list[int]:
    """The micro-batch sizes of the grid the sampling tuners draw from: doubling from the smallest allowed,
    the largest allowed last."""
    found, mbs = [], spec.min_mbs
    while mbs < spec.max_mbs:
        found.append(mbs)
        mbs *= 2
    kept = (spec.kept(m) for m in [*found, spec.max_mbs])  # with a fixed batch, the largest size below that keeps it
    return list(dict.fromkeys(m for m in kept if m is not None))


@dataclass
class _Stage:
    """What is known of one ZeRO stage: sizes that fit (with their metric), sizes that do not, sizes out."""

    fits: dict[int, float] = field(default_factory=dict)
    too_big: set[int] = field(default_factory=set)
    oom: set[int] = field(default_factory=set)  # of too_big, those that ran out of memory (not out of time)
    out: set[int] = field(default_factory=set)  # proposed, not ended yet
    crashed: set[int] = field(default_factory=set)  # failed for a reason that says nothing of memory
    given_up: bool = False
    predicted: int | None = None  # the memory model's largest size that fits (0: none, the stage is skipped)
    top: int = MAX_MICRO_BATCH  # the largest size the user allows

    def pruned(self, mbs: int) -> bool:
        """Known not to fit: a size at or above one that ran out of memory (or time), or above the ceiling."""
        return any(mbs >= small for small in self.too_big) or mbs > self.ceiling()

    def ceiling(self) -> int:
        """The largest size worth trying: the predicted largest until a run there fits; then a probe past it
        (an eighth more), and while probes fit (the model was low), probes twice as far each time."""
        if self.predicted is None or self.predicted >= self.top:
            return self.top
        fit = max(self.fits, default=0)
        ceiling, step = self.predicted, max(1, self.predicted // 8)
        while fit >= ceiling and ceiling < self.top:
            ceiling, step = ceiling + step, step * 2
        return min(ceiling, self.top)


class Search:
    """What every tuner shares (see the module docstring): what runs taught, the budget, the confirming
    re-runs, replay, and the experiments. A subclass says which points to try next (`choose`)."""

    def __init__(self, spec: SearchSpec):
        self.own = spec.own_offload()
        self.spec = replace(spec, offload=self.own)  # at the offload level searched: `escalate` moves it on
        self.levels = spec.levels()
        self.metric: Metric = metric_named(spec.metric)
        self.stages = {stage: _Stage() for stage in spec.stages}
        self.proposed: set[str] = set()
        self.trials: list[tuple[int, int]] = []  # the search's points in the order proposed (the ledger's)
        self.best: float | None = None
        self.since_best = 0  # runs ended since the best got better
        self.configs: dict[str, Point] = {}  # each config that succeeded -> its point, in order
        self.first: dict[str, float] = {}  # each config that succeeded -> the metric of its first run
        # full mode: each stage's knob space, and what the knob points (those with a Setting) taught
        self.spaces = {int(s): {k: list(v) for k, v in space.items()} for s, space in spec.knobs.items()}
        self.knob_trials: list[Point] = []  # in the order proposed (the ledger's)
        self.knob_fits: dict[Point, float] = {}
        self.knob_oom: dict[tuple[int, Setting], int] = {}  # (stage, knobs) -> the smallest size out of memory
        self.knob_out: set[Point] = set()
        self.reruns: dict[str, float | None] = {}  # a config re-run -> the re-run's metric (None: out or failed)
        self.rerun_out: set[str] = set()
        for known in self.stages.values():
            known.top = spec.max_mbs
        self.facts: Facts | None = None  # as stated or profiled; `model` is what runs corrected them to
        self.peaks: dict[tuple[int, int], float] = {}  # (stage, size) that fit -> the peak memory it held
        self.profile: str | None = "wanted" if spec.profiles else None  # wanted, out, done, failed
        self.profile_stage = min(spec.stages)  # of the profile run wanted or out
        if spec.facts is not None:
            self.apply(Facts.from_json(spec.facts))

    # --- the memory model ---------------------------------------------------------------------------------
    def apply(self, facts: Facts) -> None:
        """The model's bounds, from `facts`: a stage that cannot fit is skipped, the others bounded."""
        self.facts = facts
        self._bound(facts)

    def _bound(self, facts: Facts) -> None:
        """Each stage's bound from `facts`, for the stages no run has answered or is answering yet (a stage's
        search keeps the bound it started with)."""
        for stage, found in self.spec.bounds(facts).items():
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
        training = Training.of(self.spec.base)
        states = {stage: model_states(facts.num_params, stage, training, self.spec.dp, self.spec.mp, facts.trainable)
                  for stage in self.stages}
        seen = [figure for stage in self.stages if (figure := self._per_sample(stage, states[stage])) is not None]
        seen += [(gpu - states[stage]) / mbs for stage, known in self.stages.items() for mbs in known.oom
                 if gpu > states[stage] and (known.predicted is None or mbs <= known.predicted)]
        if not seen:
            return facts
        return replace(facts, activation=max(seen), source=f"{facts.source}, corrected by {len(seen)} run(s)")

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
        """After a run: the stages still to start bounded by the corrected model."""
        corrected = self.model()
        if corrected is not None and corrected != self.facts:
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
        config["autotuning"] = {**config.get("autotuning", {}), "model_info": {"profile": True}}
        name = self.spec.profile_name(self.profile_stage)
        self.proposed.add(name)
        return [Experiment.from_json({**data, "name": name})]

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
        for stage in self.spec.stages:
            self.stages[stage] = _Stage(top=self.spec.max_mbs)
        if corrected is not None:
            self.apply(corrected)
        return True

    def level_of(self, experiment: Experiment) -> int:
        """The offload level of one of the search's experiments, read from its config."""
        training = Training.of(experiment.ds_config)
        return 2 if training.offload_params else 1 if training.offload_optimizer else 0

    # --- the Source protocol ------------------------------------------------------------------------------
    def propose(self, free_slots: int, now: float) -> list[Experiment]:
        """The next experiments; none while every point worth trying waits for a run, or the budget is spent.
        Once the search is over and nothing runs, the confirming re-runs."""
        room = max(1, free_slots // self.spec.world)  # at least one: the queue holds what does not fit yet
        if self.profile in ("wanted", "out"):  # nothing else until the model is known
            return self._profile_run()
        chosen = [] if self._stopped() else self.choose(room)
        while not chosen and not self.busy and not self.configs and not self._spent() and self.escalate():
            chosen = self.choose(room)  # nothing fits without (more) offload
        if chosen or self.busy:
            return chosen
        return self._confirmations()

    def observe(self, run: Run | Queued, outcome: Outcome) -> None:
        profiled = self.spec.profile_of(run.experiment.name)
        if profiled is not None:
            self.learn_profile(profiled, outcome.state, outcome.reason, outcome.metrics, outcome.detail)
            return
        self.learn(run.experiment, outcome.state, outcome.reason,
                   outcome.metrics.get(self.metric.name) if outcome.metrics else None, reported_peak(outcome.metrics))

    def choose(self, room: int) -> list[Experiment]:
        """At most `room` new experiments (`take`), none of a point known not to fit, within the budget."""
        raise NotImplementedError

    @property
    def busy(self) -> bool:
        """Some point of the search still runs (or waits to)."""
        return any(known.out for known in self.stages.values()) or bool(self.knob_out)

    def open(self, stage: int, mbs: int, knobs: Setting = ()) -> bool:
        """Worth proposing: never tried, and not known not to fit (with those knobs: an OOM without knobs says
        so for every setting; one with knobs, for those knobs)."""
        known = self.stages.get(stage)
        return known is not None and not known.given_up and not known.pruned(mbs) and \
            mbs < (self.ruled_out_above(stage) or mbs + 1) and \
            mbs < self.knob_oom.get((stage, knobs), mbs + 1) and \
            self.name_of(stage, mbs, knobs) not in self.proposed

    def substitute(self, stage: int, mbs: int, knobs: Setting = ()) -> int | None:
        """For the sampling tuners: a point above the memory model's ceiling that no run ruled out stands for the
        ceiling itself (the predicted largest size, or the probe past it), when that is open; else None."""
        known = self.stages.get(stage)
        if known is None or known.predicted is None or any(mbs >= small for small in known.too_big):
            return None
        ceiling = known.ceiling()
        return ceiling if mbs > ceiling >= self.spec.min_mbs and self.open(stage, ceiling, knobs) else None

    def take(self, stage: int, mbs: int, knobs: Setting = ()) -> Experiment | None:
        """The experiment for a point, marked proposed; None when it was proposed before."""
        experiment = self.experiment(stage, mbs, knobs=knobs)
        if experiment.name in self.proposed:
            return None
        self.proposed.add(experiment.name)
        if knobs:
            self.knob_out.add((stage, mbs, knobs))
            self.knob_trials.append((stage, mbs, knobs))
        else:
            self.stages[stage].out.add(mbs)
            self.trials.append((stage, mbs))
        return experiment

    def settings(self, stage: int) -> list[Setting]:
        """Every combination of a stage's knobs (full mode), the one its micro-batches ran with first; [()] in
        fast mode."""
        space = self.spaces.get(stage, {})
        return [self.setting(stage, dict(zip(space, values, strict=True)))
                for values in itertools.product(*space.values())]

    def setting(self, stage: int, values: Mapping[str, Any]) -> Setting:
        """Knob values as a point holds them: those that differ from the stage's first values, in its order."""
        space = self.spaces.get(stage, {})
        return tuple((k, values[k]) for k in space if k in values and values[k] != space[k][0])

    def best_size(self, stage: int) -> int:
        """The micro-batch size of a stage with the best metric (ties: the larger)."""
        fits = self.stages[stage].fits
        return min(fits, key=lambda mbs: (self.metric.sort_key(fits[mbs]), -mbs))

    # --- what the stages tell each other -----------------------------------------------------------------
    def ordered(self) -> bool:
        """Whether the runs agree that a lower ZeRO stage needs at least the memory of a higher one at the same
        size (what partitioning more implies; with one data-parallel GPU only the buffers differ): no stage
        fits at or above a size where a higher stage ran out of memory. A run that contradicts it turns the
        inference off (`vouched`, `ruled_out_above`)."""
        return not any(fit >= oom for high, known in self.stages.items() for oom in known.oom
                       for low, other in self.stages.items() if low < high for fit in other.fits)

    def vouched(self, stage: int) -> int | None:
        """The largest size known to fit at `stage`: its own, or one that fits at a lower stage."""
        lower = [s for s in self.stages if s < stage] if self.ordered() else []
        return max((m for s in (stage, *lower) for m in self.stages[s].fits), default=None)

    def ruled_out_above(self, stage: int) -> int | None:
        """The smallest size known not to fit at `stage`: its own out of memory or time, or one where a higher
        stage ran out of memory."""
        higher = [s for s in self.stages if s > stage] if self.ordered() else []
        return min([*self.stages[stage].too_big, *(m for s in higher for m in self.stages[s].oom)], default=None)

    # --- learning -----------------------------------------------------------------------------------------
    def learn(self, experiment: Experiment, state: State, reason: str | None, value: float | None,
              peak: int | None = None) -> None:
        """One ended run (or, replaying, one recorded). Interrupted or cancelled ones teach nothing: they are
        run again (resume) or were not wanted. `peak`: the GPU memory it held at most, which corrects the
        memory model (`model`) with its out-of-memory answers."""
        self._learn(experiment, state, reason, value, peak)
        if self.facts is not None and (peak or reason == Reason.OOM):
            self._relearn()

    def _learn(self, experiment: Experiment, state: State, reason: str | None, value: float | None,
               peak: int | None) -> None:
        rerun = rerun_of(experiment.name)
        if self.spec.profile_of(experiment.name) is not None:
            return
        if rerun is not None:
            self.rerun_out.discard(rerun)
            self.reruns[rerun] = value if state == State.SUCCEEDED else None
            return
        placed = self._place_of(experiment)
        if placed is None or placed[0] not in self.stages or self.level_of(experiment) != self.spec.offload:
            return
        stage, mbs = placed
        knobs = self._setting_of(experiment)
        if knobs:
            self._learn_knobs(experiment.name, (stage, mbs, knobs), state, reason, value)
            return
        known = self.stages[stage]
        known.out.discard(mbs)
        if state == State.SUCCEEDED and value is not None:
            known.fits[mbs] = value
            if peak:
                self.peaks[(stage, mbs)] = float(peak)
            self.configs[experiment.name] = (stage, mbs, ())
            self.first[experiment.name] = value
            if self._improves(value):
                self.since_best = 0
                return
        elif state in (State.FAILED, State.TIMED_OUT) and (reason == Reason.OOM or state == State.TIMED_OUT):
            known.too_big.add(mbs)
            if reason == Reason.OOM:
                known.oom.add(mbs)
        elif state in (State.FAILED, State.SUCCEEDED):  # a crash, a refused config, no metric: not a size answer
            known.crashed.add(mbs)
            known.given_up = True
        else:
            return
        self.since_best += 1

    def _improves(self, value: float) -> bool:
        """Whether `value` improves on the best so far by the spec's margin (`min_gain`, a fraction of the best):
        what early stopping counts as progress. A better value becomes the best either way, so creeping gains
        below the margin do not keep a search alive."""
        best = self.best
        if best is not None and not self.metric.better(value, best):
            return False
        self.best = value
        return best is None or abs(value - best) >= self.spec.min_gain * abs(best)

    def _learn_knobs(self, name: str, point: Point, state: State, reason: str | None, value: float | None) -> None:
        """One ended run of a knob point: its metric, or that those knobs do not run at that size (out of memory
        or time: not at any larger size either; refused or no metric: that point only). The stage's micro-batch
        answers are not touched."""
        self.knob_out.discard(point)
        if state == State.SUCCEEDED and value is not None:
            self.knob_fits[point] = value
            self.configs[name], self.first[name] = point, value
            if self._improves(value):
                self.since_best = 0
                return
        elif state in (State.FAILED, State.TIMED_OUT, State.SUCCEEDED):  # no metric
            if state == State.TIMED_OUT or reason == Reason.OOM:
                stage, mbs, knobs = point
                self.knob_oom[(stage, knobs)] = min(mbs, self.knob_oom.get((stage, knobs), mbs))
        else:
            return
        self.since_best += 1

    def replay(self, experiments: Sequence[Experiment], latest: Mapping[str, tuple[State, str | None,
                                                                                    float | None]],
               metrics: Mapping[str, Mapping[str, float]] | None = None) -> None:
        """Rebuild from the ledger: every experiment it holds was proposed; those ended are learnt, in the
        ledger's order; the others (queued, running, interrupted: to run again) are out. `metrics`: each
        experiment's recorded metrics (the profile run's model info)."""
        for e in experiments:
            self.proposed.add(e.name)
            profiled = self.spec.profile_of(e.name)
            if profiled is not None:
                state, reason, _ = latest.get(e.name, (State.QUEUED, None, None))
                if state.terminal and state != State.INTERRUPTED:
                    self.learn_profile(profiled, state, reason, (metrics or {}).get(e.name), live=False)
                else:
                    self.profile, self.profile_stage = "out", profiled
                continue
            placed = self._place_of(e)
            rerun = rerun_of(e.name)
            if rerun is None and placed is not None and self.level_of(e) > self.spec.offload:
                self.escalate(self.level_of(e))  # the search went on with offload here
            knobs = self._setting_of(e) if placed is not None else ()
            if rerun is None and placed is not None and placed[0] in self.stages:
                if knobs:
                    self.knob_trials.append((*placed, knobs))
                else:
                    self.trials.append(placed)
            state, reason, value = latest.get(e.name, (State.QUEUED, None, None))
            if state.terminal and state not in (State.INTERRUPTED, State.CANCELLED):
                self.learn(e, state, reason, value, reported_peak((metrics or {}).get(e.name)))
            elif state == State.CANCELLED:
                continue
            elif rerun is not None:
                self.rerun_out.add(rerun)
            elif placed is not None and placed[0] in self.stages:
                if knobs:
                    self.knob_out.add((*placed, knobs))
                else:
                    self.stages[placed[0]].out.add(placed[1])

    # --- stopping -----------------------------------------------------------------------------------------
    def _stopped(self) -> bool:
        """Early stopping: `patience` runs ended without a better result."""
        return self.spec.patience is not None and self.since_best >= self.spec.patience

    def _spent(self) -> bool:
        """The trial budget is used up (confirming re-runs are not trials of the search)."""
        return self.spec.trials is not None and len(self.trials) + len(self.knob_trials) >= self.spec.trials

    # --- confirming the best ------------------------------------------------------------------------------
    def mean(self, name: str) -> float:
        """A config's metric over its runs that succeeded: the first, and its re-run."""
        runs = [self.first[name], self.reruns.get(name)]
        values = [v for v in runs if v is not None]
        return sum(values) / len(values)

    def confirm_count(self) -> int:
        """How many of the best configs are re-run: the spec's number, or by default DEFAULT_CONFIRM once more
        than that many succeeded (with two or fewer, the search itself is the comparison)."""
        wanted = self.spec.confirm
        if wanted is None:
            wanted = DEFAULT_CONFIRM if len(self.configs) > DEFAULT_CONFIRM else 0
        return min(wanted, len(self.configs))

    def _confirmations(self) -> list[Experiment]:
        """Re-runs of the best configs by the mean of their runs until the top `confirm_count` have all been
        re-run: a config that a re-run brought down makes room for the next, which is re-run in turn."""
        if self.rerun_out:
            return []
        ranked = sorted(self.configs, key=lambda name: self.metric.sort_key(self.mean(name)))  # stable: ties in order
        wanted = [name for name in ranked[:self.confirm_count()] if name not in self.reruns]
        proposed = []
        for name in wanted:
            stage, mbs, knobs = self.configs[name]
            experiment = self.experiment(stage, mbs, rerun=True, knobs=knobs)
            if experiment.name in self.proposed:  # proposed, then cancelled: not wanted
                continue
            self.proposed.add(experiment.name)
            self.rerun_out.add(name)
            proposed.append(experiment)
        return proposed

    # --- experiments --------------------------------------------------------------------------------------
    def experiment(self, stage: int, mbs: int, rerun: bool = False, knobs: Setting = ()) -> Experiment:
        """The experiment for one stage and micro-batch size (and, in full mode, ZeRO knobs): the user's config
        with them set, gradient accumulation derived to keep the global batch, and the script's arguments mapped.
        `rerun`: the confirming re-run of that config."""
        spec = self.spec
        config = copy.deepcopy(dict(spec.base))
        config.setdefault("zero_optimization", {})["stage"] = stage
        config["zero_optimization"].update(dict(knobs))
        config["train_micro_batch_size_per_gpu"] = mbs
        gas = spec.accumulation(mbs)
        if gas is not None:
            config["gradient_accumulation_steps"] = gas
            config["train_batch_size"] = mbs * gas * spec.dp
        name = self.name_of(stage, mbs, knobs)
        template = dict(spec.template)
        args = with_mapped_args(template.pop("args", []), config, template.pop("arg_mappings", {}))
        return Experiment.from_json({**template, "name": rerun_name(name) if rerun else name, "ds_config": config,
                                     "args": args})

    def name_of(self, stage: int, mbs: int, knobs: Setting = ()) -> str:
        """The name of `experiment(stage, mbs, knobs=knobs)`, without building it: whether a point was proposed is
        asked of every point of the grid when a sampling tuner looks for the open ones."""
        spec = self.spec
        name = f"{spec.prefix}_z{stage}_mbs{mbs}"
        gas = spec.accumulation(mbs)
        if gas is not None:
            name += f"_gas{gas}"
        name += OFFLOAD_TAGS[spec.offload] if spec.offload > self.own else ""
        return name + "".join(f"_{BY_KEY[key].tag}{tag_value(value)}" for key, value in knobs)

    @staticmethod
    def _place_of(experiment: Experiment) -> tuple[int, int] | None:
        """(stage, micro-batch size) of one of the search's experiments, read from its config."""
        config = experiment.ds_config
        stage = (config.get("zero_optimization") or {}).get("stage")
        mbs = config.get("train_micro_batch_size_per_gpu")
        if isinstance(stage, int) and isinstance(mbs, int):
            return stage, mbs
        return None

    def _setting_of(self, experiment: Experiment) -> Setting:
        """The knobs of one of the search's experiments, read from its config (() for a micro-batch trial)."""
        config = experiment.ds_config
        zero = config.get("zero_optimization") or {}
        stage = zero.get("stage")
        return self.setting(stage, zero) if isinstance(stage, int) else ()


class MicroBatchSearch(Search):
    """gridsearch, the structured walk (see the module docstring)."""

    def choose(self, room: int) -> list[Experiment]:
        """One size per stage while it searches, several once it measures; each stage's next size before any
        stage's second, the highest stage first (its OOMs rule out the lower stages' sizes, and a lower stage
        probes below a size a higher one has out: `_next`)."""
        proposed: list[Experiment] = []
        if self.busy:  # in rounds: what a stage learns bounds the others, so decisions wait for every answer
            return proposed
        order = sorted(self.stages, reverse=True)
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

    def _knob_walk(self, stage: int, known: _Stage) -> list[Setting]:
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
            return self._measure(known, fit) if searched else []
        if probe is None:
            return self._measure(known, fit)
        pending = min((m for s, other in self.stages.items() if s > stage and self.ordered() for m in other.out),
                      default=None)
        if pending is not None and probe >= pending:  # a higher stage's run there may rule it out: probe below it
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
            if stage == min(self.stages):  # the most memory: whether it fits at all, in one run
                return spec.min_mbs
            return min(midpoint(spec.min_mbs, small, share), known.ceiling())
        fit, ceiling = max(known.fits, default=None), known.ceiling()
        if small is None and low < ceiling:
            return min(low * 2, ceiling)
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

    def _measure(self, known: _Stage, fit: int | None) -> list[int]:
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
                return [mbs] if near < self.spec.measure else []
            value = known.fits[mbs]
            if not self.metric.better(value, previous) or abs(value - previous) < WORTH * abs(previous):
                return []  # a smaller size stopped paying
            previous = value
        return []


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
