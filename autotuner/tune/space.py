"""The search's space: what a tune may try (`SearchSpec`, recorded in the ledger's meta), the points of its grid
(`sizes`: each stage x the micro-batch sizes that double from the smallest; in full mode each stage's ZeRO knobs,
`Setting`), how a fixed global batch bounds the sizes (`keeps`, `accumulation`), and its offload levels.

Gradient accumulation is derived so that the global batch stays what the user asked: a fixed `train_batch_size` is
kept exactly by every candidate (micro-batch x accumulation x data-parallel GPUs; a size that cannot keep it is
never run); `max_train_batch_size` is shared as DeepSpeed's autotuner shares it.

Offload (ZeRO-Offload): the levels the search may go to when nothing fits without (more) offload (`levels`):
the optimizer states offloaded to the CPU (`offload_optimizer: {device: cpu}`, stages 1 and up, names tagged
`_oo`), then the parameters too (`offload_param`, stage 3, `_op`). A config that already offloads starts at its
own level.
"""
from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

from ..jsonvalues import JSON, JSONObject
from ..spec.model import NAME_MAX
from .batches import largest_keeping
from .knobs import BY_KEY, tag_value
from .layout import (
    Layout,
    activation_share,
    checkpointing,
    lane,
    layout_of,
    layout_tag,
    layouts,
    needs_at_least,
    replicated_params,
    stage_of,
)
from .memory_model import OFF_GPU, Bound, Facts, Training, bound
from .reruns import rerun_name

MAX_MICRO_BATCH = 4096  # the largest micro-batch size tried when the user sets no bound
DEFAULT_TRIALS = 50  # DeepSpeed's tuner_num_trials default: the sampling tuners' budget when none is set
DEFAULT_PATIENCE = 5  # DeepSpeed's tuner_early_stopping default, likewise
PROFILE = "profile"  # the profile run's name: PREFIX_profile
OFFLOAD_TAGS = ("", "_oo", "_op")  # of the names of each offload level: none, optimizer to CPU, parameters too

# A point's ZeRO knobs (full mode): the (key, value) pairs that differ from the stage's first values, in the
# order of the stage's knob space; () is the config its micro-batch search runs.
Setting = tuple[tuple[str, JSON], ...]
Point = tuple[int, int, Setting]  # (stage, micro-batch size, knobs)


def world_tag(gpus: int, nodes: int) -> str:
    """A world size in experiment names (worlds.py): g4 (one node), g8n2 (8 GPUs on each of 2 nodes)."""
    return f"g{gpus}" + (f"n{nodes}" if nodes > 1 else "")


@dataclass(frozen=True)
class SearchSpec:
    """Everything the search needs, as JSON in the ledger's meta (`search`), so that resume rebuilds it."""

    prefix: str  # of the experiment names
    template: Mapping[str, JSON]  # Experiment JSON fields but name and ds_config (script, args, num_gpus, ...)
    base: Mapping[str, JSON]  # the user's ds_config, its autotuning section reduced to what the engine reads
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
    knobs: Mapping[str, Mapping[str, Sequence[JSON]]] = field(default_factory=dict)
    gpu_memory: int | None = None  # bytes of one GPU the experiments run on (None: unknown, no memory model)
    facts: Mapping[str, JSON] | None = None  # memory.Facts from model_info (None: a profile run finds them)
    mp: int = 1  # model-parallel degree (DeepSpeed's mp_size)
    min_gain: float = 0.0  # a better run resets `patience` only when better by this fraction of the best
    host_memory: int | None = None  # bytes of RAM of a node the experiments run on (None: unknown, no constraint)
    offload: int = 0  # the offload level searched (OFFLOAD_TAGS): the base config's own, or one the search went to
    tp: tuple[int, ...] = ()  # AutoTP sizes (tensor_parallel.autotp_size) searched or fixed; (): none set (layout.py)
    script_knobs: Mapping[str, Sequence[JSON]] = field(default_factory=dict)  # "--option" -> its values
    shape: Mapping[str, int] | None = None  # heads, KV heads, hidden, vocabulary, sequence, layers (layout.py)
    goal: Mapping[str, JSON] | None = None  # the training run the tune is for (goal.Goal as JSON); None: not said
    worlds: tuple[tuple[int, int], ...] = ()  # (GPUs per node, nodes) of each world size searched (worlds.py)

    def to_json(self) -> JSONObject:
        return asdict(self) | {"stages": list(self.stages), "template": dict(self.template), "base": dict(self.base),
                               "knobs": {s: {k: list(v) for k, v in space.items()} for s, space in self.knobs.items()},
                               "facts": dict(self.facts) if self.facts is not None else None,
                               "tp": list(self.tp), "script_knobs": {k: list(v) for k, v in self.script_knobs.items()},
                               "shape": dict(self.shape) if self.shape is not None else None,
                               "goal": dict(self.goal) if self.goal is not None else None,
                               "worlds": [list(w) for w in self.worlds]}

    @property
    def layouts(self) -> list[Layout]:
        """Every layout searched (TP size x script knob values, layout.py); one when the tune sets none."""
        return layouts(self.tp, self.script_knobs)

    @property
    def lanes(self) -> list[int]:
        """Every (layout, ZeRO stage) the search walks, as lanes (layout.lane); the stages themselves with one
        layout."""
        return [lane(index, stage) for index in range(len(self.layouts)) for stage in self.stages]

    @property
    def searches_tp(self) -> bool:
        """More than one TP size is searched: names carry each one's."""
        return len(self.tp) > 1

    def layout_tag(self, index: int) -> str:
        return layout_tag(self.layouts[index], self.searches_tp)

    def lane_label(self, lane_: int) -> str:
        """A lane for people: `z1`, or `tp2 z1` / `tp2 gc1 z1` where layouts are searched."""
        tag = self.layout_tag(layout_of(lane_)).replace("_", " ").strip()
        return f"{tag} z{stage_of(lane_)}" if tag else f"z{stage_of(lane_)}"

    def needs_at_least(self, a: int, b: int) -> bool:
        """Whether lane `a` needs at least lane `b`'s memory at the same size (a lower or equal stage, or any
        stage of a layout whose TP size leaves one data-parallel GPU; a layout that needs at least as much:
        layout.needs_at_least), `a` != `b`."""
        if a == b:
            return False
        shapes = self.layouts
        tp = self.tp_of(a)  # TP leaving ZeRO one GPU to partition over: every stage holds the same (only buffers
        alone = tp > 1 and self.dp // tp <= 1 and layout_of(a) == layout_of(b)  # differ), they fit or not alike
        return (stage_of(a) <= stage_of(b) or alone) and needs_at_least(shapes[layout_of(a)], shapes[layout_of(b)])

    def tp_of(self, lane_: int) -> int:
        return self.layouts[layout_of(lane_)][0] or 1

    def share(self, index: int) -> float:
        """A layout's activations per sample on a rank, over the figure at TP 1 without checkpointing."""
        size, knobs = self.layouts[index]
        return activation_share(size or 1, checkpointing(knobs), self.shape)

    def fitted(self) -> SearchSpec:
        """This spec with its prefix cut so that every experiment name it can make (the longest: the largest
        stage, micro-batch size and accumulation, each knob at its longest value, a re-run) is a safe name;
        a ValueError where even an empty prefix would not do (knob values too long to write)."""
        own = self.config_accumulation()
        most = max(1, self.global_batch // (self.min_mbs * self.dp)) if self.global_batch else \
            self.max_mbs * own // self.min_mbs if own is not None and self.max_mbs > self.min_mbs else None
        gas = f"_gas{most}" if most is not None else ""
        tags = max(len(self.layout_tag(i)) for i in range(len(self.layouts)))
        longest = tags + max(len(f"_z{stage}_mbs{self.max_mbs}{gas}{OFFLOAD_TAGS[-1]}") + sum(
            max(len(f"_{BY_KEY[key].tag}{tag_value(v)}") for v in values)
            for key, values in self.knobs.get(str(stage), {}).items()) for stage in self.stages)
        room = NAME_MAX - longest - len(rerun_name(""))
        prefix = self.prefix[:max(0, room)].rstrip("-._")  # (a negative room would cut from the end)
        if not prefix:
            raise ValueError(f"experiment names would be longer than {NAME_MAX} characters")
        return self if prefix == self.prefix else replace(self, prefix=prefix)

    @classmethod
    def from_json(cls, data: Mapping[str, JSON]) -> SearchSpec:
        # A ledger from before confirmation re-runs asked for none: its search goes on as it began.
        return cls(**{"confirm": 0, **data, "stages": tuple(data["stages"]), "tp": tuple(data.get("tp") or ()),
                      "worlds": tuple((int(g), int(n)) for g, n in data.get("worlds") or ())})

    def at_world(self, gpus: int, nodes: int, tag: str) -> SearchSpec:
        """The search of one world size (worlds.py): its experiments on `gpus` x `nodes`, named with `tag`."""
        return replace(self, template={**self.template, "num_gpus": gpus, "num_nodes": nodes},
                       prefix=f"{self.prefix}_{tag}", worlds=())

    def world_specs(self) -> list[SearchSpec]:
        """The search of each world size; the spec itself where it searches one."""
        return [self.at_world(g, n, world_tag(g, n)) for g, n in self.worlds] or [self]

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
        least = max(low + 1, self.min_mbs)
        if not self.fixed_batch or self.global_batch is None:
            return mbs if mbs >= least else None
        return largest_keeping(self.global_batch, self.dp, least, mbs)

    def accumulation(self, mbs: int) -> int | None:
        """The gradient accumulation of a micro-batch size, as DeepSpeed derives it: a fixed train_batch_size over
        micro-batch x data-parallel GPUs; max_train_batch_size's share of one GPU over the micro-batch (at least
        1); None: the config's own."""
        if self.global_batch is None:
            return None
        if self.fixed_batch:
            return max(1, self.global_batch // (mbs * self.dp))
        return max(1, self.global_batch // self.dp // mbs)

    def config_accumulation(self) -> int | None:
        """The config's own gradient accumulation, where the sizes measured below a stage's largest derive theirs
        from it (the config sets no global batch nor a list of accumulations): they keep the largest size's batch
        per GPU, largest x this over the size, as DeepSpeed's autotuner derives it. None where they do not."""
        own = self.base.get("gradient_accumulation_steps", 1)
        searched = any("gradient_accumulation_steps" in space for space in self.knobs.values())
        usable = isinstance(own, int) and not isinstance(own, bool) and own > 0
        return own if usable and self.global_batch is None and not searched else None

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

    def bounds(self, facts: Facts, measured: Mapping[int, float] | None = None) -> dict[int, Bound]:
        """The memory model's bound of each lane (each stage of each layout) on the spec's GPUs and nodes
        (memory_model.py); none with neither the GPUs' nor the nodes' memory known. A TP size divides what it
        shards, ZeRO partitions over the rest (world / TP); `measured`: a layout's activations per sample as its
        runs showed them (memory_loop.py), over the facts' figure times the layout's share."""
        if self.gpu_memory is None and self.host_memory is None:
            return {}
        training = Training.of(self.base)
        local = int(self.template.get("num_gpus", 1))
        whole = replicated_params(facts.num_params, self.shape)
        found = {}
        for index, (size, _) in enumerate(self.layouts):
            tp = size or 1
            per_sample = (measured or {}).get(index)
            if per_sample is None and facts.activation:
                per_sample = facts.activation * self.share(index)
            for stage in self.stages:
                found[lane(index, stage)] = bound(facts, training, stage, self.gpu_memory, max(1, self.dp // tp),
                                                  self.mp, self.min_mbs, self.host_memory, local, tp, whole,
                                                  per_sample)
        return found

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
        """This spec (its own offload level), then at each further offload level the search may go to."""
        own = self.own_offload()
        found = (self.offloaded(level) for level in range(own + 1, len(OFFLOAD_TAGS)))
        return [replace(self, offload=own), *(spec for spec in found if spec is not None)]


def sizes(spec: SearchSpec) -> list[int]:
    """The micro-batch sizes of the grid the sampling tuners draw from: doubling from the smallest allowed,
    the largest allowed last."""
    found, mbs = [], spec.min_mbs
    while mbs < spec.max_mbs:
        found.append(mbs)
        mbs *= 2
    kept = (spec.kept(m) for m in [*found, spec.max_mbs])  # with a fixed batch, the largest size below that keeps it
    return list(dict.fromkeys(m for m in kept if m is not None))
