"""The layout a tune searches beside ZeRO: DeepSpeed's automatic tensor parallelism (`"tensor_parallel":
{"autotp_size": N}`) and the script's own knobs (`autotuning.script_knobs`, arguments such as a Trainer's
`--gradient_checkpointing`), read from the config and checked; and the lanes the search walks.

DeepSpeed 0.19.8 (`runtime/engine.py`, `_configure_tensor_parallel_states`; `runtime/tensor_parallel/config.py`):
AutoTP shards a model's linear layers over N ranks, set in the config alone, and combines with every ZeRO stage
(0-3, stage 3 included) and with offload; ZeRO then partitions over the data-parallel group only (world / N). Its
batch check runs before the TP groups exist, so it counts `train_batch_size` over every rank, TP ranks included:
mbs x accumulation x world, whatever N. The search writes the batch that way (DeepSpeed refuses any other), so a
fixed train_batch_size is kept by every candidate as DeepSpeed counts it; the throughput DeepSpeed's engine writes
(train_batch_size over the step time) then counts each sample N times, and is divided by N where runs are judged
(backends/exitstatus.py), so that layouts compare by the samples they train.

A lane is one (layout, ZeRO stage): `layout * LANE + stage`, an int, so that everything the search keys by stage
(stage.py, knowledge.py, the tuners) works unchanged on lanes; a tune without a layout has one layout, and its
lanes are its stages.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import shown
from ..jsonvalues import JSON, JSONObject
from ..spec.model import FLAG, positive_int
from ..spec.reading import CONFIG_OPTIONS, Source, read_named
from .knobs import tag_value, whole

LANE = 4  # ZeRO stages 0-3 per layout
# A layout: its TP size (None: the config sets none) and the script knobs' values, in script_knobs' order.
Layout = tuple[int | None, tuple[tuple[str, JSON], ...]]
# model_info's shape keys, and the Hugging Face config keys each is read from. A Hugging Face config states the
# longest sequence the model takes, not the one it is trained on: that is the shape's `max_positions`, which the
# activations' share falls back on (`seq_length` only as model_info states it: what TFLOPs are counted with).
SHAPE_KEYS = {"num_attention_heads": ("num_attention_heads", "n_head"),
              "num_key_value_heads": ("num_key_value_heads",),
              "hidden_size": ("hidden_size", "n_embd", "d_model"),
              "vocab_size": ("vocab_size",),
              "seq_length": (),
              "num_layers": ("num_hidden_layers", "n_layer", "num_layers")}
POSITIONS = ("max_position_embeddings", "n_positions", "seq_length")  # a Hugging Face config's longest sequence
DIVIDED = ("num_attention_heads", "num_key_value_heads", "hidden_size")  # what a TP size must divide
OWNED = ("--local_rank", "--local-rank")  # options DeepSpeed's launcher hands every rank


def lane(layout: int, stage: int) -> int:
    return layout * LANE + stage


def stage_of(lane_: int) -> int:
    return lane_ % LANE


def layout_of(lane_: int) -> int:
    return lane_ // LANE


def read_tp(src: Source, config: JSONObject, num_gpus: int, mp: int | None,
            shape: Mapping[str, int] | None) -> tuple[int, ...]:
    """`tensor_parallel.autotp_size` as the search takes it: a size (fixed), a list of sizes (searched), or "all"
    (every size that can work: the divisors of the GPUs of a node that divide the model's heads, KV heads and
    hidden size, where model_info states them); () when the config sets none. A size that cannot work is a
    located error: AutoTP shards within a node, so it must divide the GPUs of a node (--num_gpus), and it must
    divide the heads, KV heads and hidden size it splits."""
    section = config.get("tensor_parallel")
    if section is None:
        return ()
    if not isinstance(section, dict):
        raise src.error(f"tensor_parallel must be an object, not {shown(section)}", "tensor_parallel")
    size = section.get("autotp_size")
    if size is None or size == 0:  # DeepSpeed's 0: AutoTP off
        return ()
    if size == "all":
        sizes = [d for d in range(1, num_gpus + 1) if num_gpus % d == 0 and _divides(d, shape) is None]
    elif positive_int(size) or (isinstance(size, list) and size and all(positive_int(s) for s in size)):
        sizes = list(dict.fromkeys(size if isinstance(size, list) else [size]))
    else:
        raise src.error(f"tensor_parallel.autotp_size {shown(size)}: a size, a list of sizes, or \"all\"",
                        "autotp_size")
    if mp not in (None, 1) and sizes != [1]:
        raise src.error(f"tensor_parallel.autotp_size and autotuning.mp_size {mp} both split the model: give one",
                        "autotp_size")
    for s in sizes:
        problem = (f"is more than the {num_gpus} GPU(s) of a node (--num_gpus): AutoTP shards within a node"
                   if s > num_gpus else
                   f"does not divide the {num_gpus} GPU(s) of a node (--num_gpus): AutoTP shards within a node"
                   if num_gpus % s else _divides(s, shape))
        if problem is not None:
            raise src.error(f"tensor_parallel.autotp_size {s} {problem}", "autotp_size")
    return tuple(sizes)


def _divides(size: int, shape: Mapping[str, int] | None) -> str | None:
    """Why a TP size cannot split the model (its heads, KV heads or hidden size), or None."""
    for key in DIVIDED:
        value = (shape or {}).get(key)
        if value is not None and value % size:
            return f"does not divide the model's {value} {key.replace('_', ' ').replace('num ', '')}"
    return None


def read_script_knobs(src: Source, section: JSONObject, flag: str, mappings: Mapping[str, str]
                      ) -> dict[str, list[JSON]]:
    """`autotuning.script_knobs`: {"--option": [values...]}, script arguments the search tries each value of
    (handed as `--option VALUE`, true/false as words). Refused: what is not a script option, DeepSpeed's or the
    launcher's own options, an option `arg_mappings` already hands a searched value to, a knob without values."""
    knobs = section.get("script_knobs")
    if knobs is None:
        return {}
    if not isinstance(knobs, dict):
        raise src.error("script_knobs must be an object of script options to lists of values",
                        "script_knobs")
    out: dict[str, list[JSON]] = {}
    for option, values in knobs.items():
        if not isinstance(option, str) or FLAG.fullmatch(option) is None:
            raise src.error(f"script_knobs: {shown(option)} is not a script option (--name)", option)
        if option in (flag, *CONFIG_OPTIONS, *OWNED) or option in mappings.values():
            whose = "the option the config is handed to" if option in (flag, *CONFIG_OPTIONS) else \
                "DeepSpeed's launcher's own" if option in OWNED else "set by arg_mappings from the config"
            raise src.error(f"script_knobs: {option} is {whose}, not a knob of the script", option)
        if not isinstance(values, list) or not values:
            raise src.error(f"script_knobs: {option} needs a non-empty list of values, not {shown(values)}",
                            option)
        for value in values:
            if not isinstance(value, (str, int, float, bool)) or \
                    (isinstance(value, float) and not math.isfinite(value)) or (isinstance(value, str) and
                                                                               ("\0" in value or not value)):
                raise src.error(f"script_knobs: {option}: every value must be a number, a boolean or a non-empty "
                                f"string, not {shown(value)}", option)
        out[option] = list(dict.fromkeys(values))
    return out


def read_shape(src: Source, info: JSONObject | None) -> dict[str, int] | None:
    """The model's shape (heads, KV heads, hidden size, vocabulary, sequence length trained on, layers): model_info's
    own keys, over those of the Hugging Face config (config.json) `model_info.hf_config` names (relative to the
    DeepSpeed config), which gives the longest sequence the model takes (`max_positions`) but never the one trained
    on. None when neither states any."""
    if not isinstance(info, dict):
        return None
    shape: dict[str, int] = {}
    named = info.get("hf_config")
    if named is not None:
        if not isinstance(named, str) or not named:
            raise src.error("model_info.hf_config must be the path of a Hugging Face config.json", "hf_config")
        path = Path(named)
        hf = read_named(src, "hf_config", str(path / "config.json") if _is_dir(src, named) else named,
                        "Hugging Face config")
        data = hf.data.get("text_config", hf.data) if isinstance(hf.data, dict) else None
        if not isinstance(data, dict):
            raise src.error(f"model_info.hf_config {shown(named)}: not a Hugging Face config (an object)",
                            "hf_config")
        for key, names in (*SHAPE_KEYS.items(), ("max_positions", POSITIONS)):
            value = next((whole(data[n]) for n in names if positive_int(whole(data.get(n)))), None)
            if value is not None:
                shape[key] = value
        if "num_key_value_heads" not in shape and "num_attention_heads" in shape:
            shape["num_key_value_heads"] = shape["num_attention_heads"]
    for key in SHAPE_KEYS:
        value = whole(info.get(key))  # 2.048e3 is 2048, as every whole number of the config
        if value is None:
            continue
        if not positive_int(value) or value > 10 ** 9:
            raise src.error(f"model_info.{key} must be a positive whole number, not {shown(value)}", key)
        shape[key] = value
    heads, kv = shape.get("num_attention_heads"), shape.get("num_key_value_heads")
    if heads is not None and kv is not None and heads % kv:
        raise src.error(f"model_info: {heads} attention heads are not a multiple of {kv} key-value heads",
                        "num_key_value_heads" if "num_key_value_heads" in info else "hf_config")
    return shape or None


def _is_dir(src: Source, named: str) -> bool:
    path = Path(named) if Path(named).is_absolute() else src.path.parent / named
    return path.is_dir()


def layouts(tp: Sequence[int], knobs: Mapping[str, Sequence[JSON]]) -> list[Layout]:
    """Every layout of a search: each TP size (None where the config sets none) with each combination of the
    script knobs' values, the first values first."""
    combos = list(itertools.product(*([(option, v) for v in values] for option, values in knobs.items())))
    return [(size, combo) for size in (tp or (None,)) for combo in combos] if knobs else \
        [(size, ()) for size in (tp or (None,))]


def checkpointing(knobs: Sequence[tuple[str, JSON]]) -> bool:
    """Whether a layout's script knobs turn activation (gradient) checkpointing on: a knob named for it set true."""
    return any("checkpoint" in option and value in (True, "true", "True", 1, "1") for option, value in knobs)


def knob_tag(option: str, value: JSON) -> str:
    """A knob's value in an experiment name: the option's initials, then the value (`--gradient_checkpointing
    true` -> `gc1`)."""
    words = [w for w in option.lstrip("-").replace("-", "_").split("_") if w]
    return "".join(w[0] for w in words).lower() + tag_value(value).replace("/", "-")[:12]


def layout_tag(layout: Layout, searched_tp: bool) -> str:
    """What a layout adds to an experiment's name: `_tpN` where TP is searched, each knob's tag."""
    size, knobs = layout
    return (f"_tp{size}" if searched_tp and size is not None else "") + \
        "".join(f"_{knob_tag(o, v)}" for o, v in knobs)


def needs_at_least(a: Layout, b: Layout) -> bool:
    """Whether layout `a` needs at least the memory of layout `b` at the same stage and size: a TP size no larger
    (fewer shards), checkpointing no more on, every other knob the same."""
    (ta, ka), (tb, kb) = a, b
    if (ta or 1) > (tb or 1) or len(ka) != len(kb):
        return False
    for (oa, va), (ob, vb) in zip(ka, kb, strict=True):
        if oa != ob or (va != vb and not ("checkpoint" in oa and checkpointing([(oa, vb)])
                                         and not checkpointing([(oa, va)]))):
            return False
    return True


# --- the memory model's side (memory_model.py uses these) -------------------------------------------------
# Activations of a transformer layer under tensor parallelism without sequence parallelism (Korthikanti et al.,
# "Reducing Activation Recomputation in Large Transformer Models", 2022): s*b*h*(34 + 5*a*s/h) bytes, of which
# 10*s*b*h (layer norms' inputs, dropout masks, the residual) stay whole on every TP rank and the rest is split;
# with full activation checkpointing a layer keeps its input alone (2*s*b*h), and one layer's activations are
# recomputed at a time.
WHOLE, TOTAL, CHECKPOINTED = 10.0, 34.0, 2.0


def _per_layer(shape: Mapping[str, int] | None) -> float:
    """34 + 5*a*s/h where the shape states them (the sequence trained on, else the longest the model takes), else
    34 (the short-sequence end: the least that is split)."""
    shape = shape or {}
    heads, hidden = shape.get("num_attention_heads"), shape.get("hidden_size")
    seq = shape.get("seq_length") or shape.get("max_positions")
    return TOTAL + (5.0 * heads * seq / hidden if heads and seq and hidden else 0.0)


def activation_share(tp: int, checkpointed: bool, shape: Mapping[str, int] | None) -> float:
    """A layout's activations per sample on one rank, as a share of the figure at TP 1 without checkpointing."""
    total = _per_layer(shape)
    if checkpointed:
        layers = (shape or {}).get("num_layers")
        recomputed = 1.0 / layers if layers else 0.0
        return CHECKPOINTED / total + recomputed * ((WHOLE + (total - WHOLE) / tp) / total)
    return (WHOLE + (total - WHOLE) / tp) / total


def replicated_params(num_params: int, shape: Mapping[str, int] | None) -> float:
    """The parameters AutoTP leaves whole on every rank: the embedding (vocabulary x hidden) and the layer norms
    (2 x hidden a layer); 0 where the shape does not say (every parameter counted as split: the smaller need)."""
    shape = shape or {}
    vocab, hidden, layers = (shape.get(k) for k in ("vocab_size", "hidden_size", "num_layers"))
    whole = (vocab or 0) * (hidden or 0) + 2 * (hidden or 0) * (layers or 0)
    return float(min(whole, num_params))


def arg_value(args: Sequence[str], option: str) -> str | None:
    """The value `args` give `option` (`--o v` or `--o=v`, the last one: a parser takes it); None without it."""
    found = None
    for i, arg in enumerate(args):
        if arg == option and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(option + "="):
            found = arg.split("=", 1)[1]
    return found


def checkpointed(args: Sequence[str]) -> bool:
    """Whether a command line turns activation checkpointing on: an option named `...checkpointing` given a true
    value (`--gradient_checkpointing true`, `=true`) or alone (a flag), the last one said of each option counting,
    as a parser takes it. (Options that merely hold `checkpoint`, such as `--save_checkpoint true`, are not it;
    a script knob is judged by `checkpointing`, as the memory model judges it.)"""
    said: dict[str, bool] = {}
    for i, arg in enumerate(args):
        option, equals, value = arg.partition("=")
        if not option.startswith("--") or not option.endswith("checkpointing"):
            continue
        following = args[i + 1] if not equals and i + 1 < len(args) else None
        if equals or (following is not None and not following.startswith("-")):
            said[option] = checkpointing([(option, value if equals else following)])
        else:
            said[option] = True
    return any(said.values())
