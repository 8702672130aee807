"""What `autotune tune` is given: the user's own DeepSpeed command (the script, its arguments and the config
they name with `--deepspeed_config` or `--deepspeed`), and that config's `autotuning` section, read as DeepSpeed
documents it (full mode, `fast: false`, adds the ZeRO knobs of spec/knobs.py). Unknown or mistyped keys are
located errors, never ignored; what the search does not do yet is refused by name rather than silently skipped."""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .. import limits
from ..errors import UserError, shown
from ..jsonvalues import JSON, JSONObject
from ..spec.metrics import metric_named
from ..spec.model import CONFIG_FLAG, UNSAFE, positive_int
from ..spec.progress import THROUGHPUT
from ..spec.reading import (
    Budget,
    Source,
    arg_mappings,
    read_named,
    read_source,
)
from ..spec.sure import MOST, TOLERANCE
from .batches import largest_keeping
from .goal import SECTION_KEYS as GOAL_KEYS
from .goal import Goal, from_section
from .knobs import Space, accumulation_values, first_values, knob_spaces, whole, with_accumulation
from .layout import SHAPE_KEYS, read_script_knobs, read_shape, read_tp
from .untilsure import CONFIGS, Asked, engine_section

# The `autotuning` keys DeepSpeed documents; the search reads those in USED, the rest are its bookkeeping.
KEYS = ("enabled", "fast", "results_dir", "exps_dir", "overwrite", "metric", "start_profile_step",
        "end_profile_step", "metric_path", "max_train_batch_size", "min_train_batch_size",
        "min_train_micro_batch_size_per_gpu", "max_train_micro_batch_size_per_gpu", "num_tuning_micro_batch_sizes",
        "mp_size", "tuner_type", "tuner_early_stopping", "tuner_num_trials", "arg_mappings", "model_info",
        "model_info_path", "script_knobs", TOLERANCE, MOST, *GOAL_KEYS)  # script_knobs: ours (layout.py), the
# script's arguments to search; tolerance, max_measured_steps: ours (untilsure.py); the goal's keys: ours too
# (goal.py), the training run the tune is for
TUNERS = ("gridsearch", "random", "model_based")
SWITCHES = ("enabled", "fast", "overwrite")  # the section's true/false keys
PATHS = ("results_dir", "exps_dir", "metric_path")  # the section's path keys
OPTUNA_MISSING = "tuner_type model_based searches with Optuna, not installed: pip install 'ds-autotune[tune]'"
PROFILE_STEPS = (3, 5)  # DeepSpeed's start_profile_step and end_profile_step when a config sets none
STAGES = (0, 1, 2, 3)
BATCH_KEYS = ("train_batch_size", "gradient_accumulation_steps", "train_micro_batch_size_per_gpu")
OFFLOAD_DEVICES = ("none", "cpu", "nvme")  # DeepSpeed's OffloadDeviceEnum
# The Trainer's options for the values the search sets, named in the hint when a config says "auto" unmapped.
TRAINER_OPTIONS = {"train_micro_batch_size_per_gpu": "--per_device_train_batch_size",
                   "gradient_accumulation_steps": "--gradient_accumulation_steps"}
CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # characters no path the user means holds
MODEL_NUMBER = 10 ** 15  # the most a model fact may state: parameters, or bytes of activations a sample
# model_info: DeepSpeed's documented keys, and those its engine writes on a profile run (a file's, pasted in).
MODEL_INFO_KEYS = ("profile", "num_params", "hidden_size", "num_layers", "trainable_num_params",
                   "activation_mem_per_gpu", *(k for k in SHAPE_KEYS if k not in ("hidden_size", "num_layers")),
                   "hf_config")  # the shape (layout.py): what a TP size must divide, and activations under TP
SHAPE_ONLY = tuple(k for k in (*SHAPE_KEYS, "hf_config") if k not in ("hidden_size", "num_layers"))


@dataclass(frozen=True)
class TuneInput:
    """The user's command, taken apart."""

    script: str  # absolute
    args: tuple[str, ...]  # without the config option
    flag: str  # the option the config is handed to
    config_path: Path


def split_command(script: str, args: Sequence[str], cwd: Path) -> TuneInput:
    """`train.py --deepspeed_config ds.json --lr 1e-4` -> its parts. The config option is `--deepspeed_config`
    (DeepSpeed's own), else `--deepspeed PATH` (Hugging Face Trainer, Accelerate); `--deepspeed` followed by
    another option is DeepSpeed's on/off switch, and stays."""
    path = Path(script) if Path(script).is_absolute() else cwd / script
    if not path.is_file():
        raise UserError("no such training script" if not path.exists() else "not a file: the training script",
                        path)
    rest = list(args)
    found = config_option(rest)
    if found is None:
        raise UserError(f"the command names no DeepSpeed config: give it as `{CONFIG_FLAG} ds.json` (or `--deepspeed "
                        "ds.json` for a Trainer script), as you would to deepspeed")
    flag, value, i, end = found
    rest = rest[:i] + rest[end:]
    again = config_option(rest)
    if again is not None:  # which one the script would take depends on its parser: neither is guessed
        raise UserError(f"the command names a DeepSpeed config twice ({flag} {value}, {again[0]} {again[1]}): give "
                        "it once")
    config = Path(value) if Path(value).is_absolute() else cwd / value
    return TuneInput(str(path.resolve()), tuple(rest), flag, config)


def config_option(args: Sequence[str]) -> tuple[str, str, int, int] | None:
    """The first config option in `args`: (flag, path, where it starts, where it ends), `--deepspeed_config`
    before `--deepspeed PATH`."""
    for flag in (CONFIG_FLAG, "--deepspeed"):
        for i, arg in enumerate(args):
            if arg == flag and i + 1 < len(args) and not args[i + 1].startswith("--"):
                return flag, args[i + 1], i, i + 2
            if arg.startswith(flag + "="):
                return flag, arg.split("=", 1)[1], i, i + 1
    return None


@dataclass(frozen=True)
class Tuning:
    """The config's autotuning section, checked: what the search is asked to do."""

    base: JSONObject  # the config, its autotuning section reduced to the keys the engine reads
    stages: tuple[int, ...]
    metric: str
    min_mbs: int
    max_mbs: int | None
    measure: int
    global_batch: int | None
    trials: int | None
    patience: int | None
    arg_mappings: dict[str, str]
    tuner: str = "gridsearch"
    knobs: dict[int, Space] = field(default_factory=dict)  # full mode: each stage's ZeRO knobs to search
    facts: JSONObject | None = None  # memory.Facts as JSON, from model_info or model_info_path
    mp: int = 1  # mp_size
    facts_line: int | None = None  # the line of model_info or model_info_path, when the facts come from one
    files: tuple[str, ...] = ()  # every file read for it: the tune file, the config, the model info file
    fixed_batch: bool = False  # global_batch is the config's train_batch_size, kept by every candidate
    nvme_lines: dict[str, int] = field(default_factory=dict)  # offload section -> the line of its nvme_path
    tp: tuple[int, ...] = ()  # tensor_parallel.autotp_size: the sizes searched (layout.py)
    script_knobs: dict[str, list[JSON]] = field(default_factory=dict)  # autotuning.script_knobs
    shape: dict[str, int] | None = None  # the model's heads, hidden size... (model_info, its hf_config)
    goal: Goal = field(default_factory=Goal)  # the training run it is for (train_tokens, gpu_hour_cost, ...)


def read_tuning(path: Path, world: int, src: Source | None = None, flag: str = CONFIG_FLAG,
                num_gpus: int | None = None, options: Asked = CONFIGS) -> Tuning:
    """The config at `path` (or `src`, one read already: a tune file's ds_config) and its autotuning section
    (DeepSpeed's keys); `world`: GPUs per experiment; `flag`: the option the script takes the config by, which
    no `arg_mappings` entry may hand a value to (the rules of a sweep file's); `options`: `autotune tune`'s over
    the section's keys of measuring until sure (untilsure.py)."""
    src = src or read_source(path, Budget(), "DeepSpeed config")
    config = src.data
    if not isinstance(config, dict):
        raise UserError("a DeepSpeed config must be an object", path)
    section = config.get("autotuning", {})
    if not isinstance(section, dict):
        raise src.error("autotuning must be an object", "autotuning")
    for key in section:
        if key not in KEYS:
            raise src.error(f"unknown autotuning key {shown(key)} (DeepSpeed's keys: {', '.join(KEYS)})", key)
    for key in SWITCHES:
        if key in section and not isinstance(section[key], bool):
            raise src.error(f"{key} must be true or false, not {shown(section[key])}", key)
    for key in PATHS:  # DeepSpeed's autotuner's own bookkeeping, unused here: still never a mistyped value
        if section.get(key) is not None and not isinstance(section[key], str):
            raise src.error(f"{key} must be a path (a string), not {shown(section[key])}", key)
    fast = section.get("fast", True)
    tuner = section.get("tuner_type", "gridsearch")
    if tuner not in TUNERS:
        raise src.error(f"tuner_type {shown(tuner)}: one of {', '.join(TUNERS)}", "tuner_type")
    if tuner == "model_based" and not _have_optuna():
        raise src.error(OPTUNA_MISSING, "tuner_type")
    metric = section.get("metric", "throughput")
    if not isinstance(metric, str):
        raise src.error("metric must be a string", "metric")
    named = metric_named(metric, path=path, line=src.line("metric"))
    metric = named.spec
    counts = {k: _count(src, section, k) for k in ("min_train_micro_batch_size_per_gpu",
                                                   "max_train_micro_batch_size_per_gpu", "max_train_batch_size",
                                                   "num_tuning_micro_batch_sizes", "tuner_num_trials",
                                                   "tuner_early_stopping", "start_profile_step", "end_profile_step",
                                                   "mp_size")}
    _check_steps(src, counts["start_profile_step"], counts["end_profile_step"])
    if counts["mp_size"] is not None and world % counts["mp_size"]:
        raise src.error(f"mp_size {counts['mp_size']} does not divide the {world} GPU(s) of each experiment "
                        "(--num_gpus x --num_nodes)", "mp_size")
    config = _check_batch_keys(src, config)
    min_mbs = counts["min_train_micro_batch_size_per_gpu"] or 1
    batch = config.get("train_batch_size")
    fixed = isinstance(batch, int) and not isinstance(batch, bool) and batch > 0
    dp = max(1, world // (counts["mp_size"] or 1))
    global_batch = _global_batch(src, batch if fixed else None, counts["max_train_batch_size"], dp)
    max_mbs = _largest_micro_batch(src, counts["max_train_micro_batch_size_per_gpu"], min_mbs, global_batch,
                                   "train_batch_size" if fixed else "max_train_batch_size", dp)
    if fixed and global_batch is not None and largest_keeping(global_batch, dp, min_mbs, max_mbs or min_mbs) is None:
        raise src.error(f"train_batch_size {batch} cannot be kept: no micro-batch size from {min_mbs} to "
                        f"{max_mbs} times the accumulation times {dp} data-parallel GPU(s) makes it",
                        "train_batch_size")
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, dict):  # the search sets its stage: nothing else can stand here
        raise src.error(f"zero_optimization must be an object, not {shown(zero)}", "zero_optimization")
    stages = _stages(src, config)
    nvme_lines = _check_offload(src, zero)
    accumulations = accumulation_values(src, config.get("gradient_accumulation_steps"), global_batch is not None)
    spaces = with_accumulation(knob_spaces(src, zero, stages, fast), accumulations)
    base = {k: v for k, v in config.items() if k != "autotuning"}
    if accumulations:
        base["gradient_accumulation_steps"] = accumulations[0]
    if zero:
        base["zero_optimization"] = first_values(zero)
    engine = engine_section(src, section, counts["start_profile_step"], counts["end_profile_step"], options,
                            stepped=named.name == THROUGHPUT)
    if engine:
        base["autotuning"] = engine
    mappings = arg_mappings(src, section.get("arg_mappings", {}), flag)
    _check_auto(src, config, mappings, global_batch is not None)
    facts = _facts(src, section, path)  # reads the model info file, if one is named
    shape = read_shape(src, section.get("model_info"))  # reads the Hugging Face config, if one is named
    tp = read_tp(src, config, num_gpus or world, counts["mp_size"], shape)
    if tp:  # each candidate writes its own size (knowledge.experiment), the section's other keys kept
        base["tensor_parallel"] = {k: v for k, v in config["tensor_parallel"].items() if k != "autotp_size"}
    knobs = read_script_knobs(src, section, flag, mappings)
    return Tuning(base, stages, metric, min_mbs, max_mbs, counts["num_tuning_micro_batch_sizes"] or 3,
                  global_batch, counts["tuner_num_trials"], counts["tuner_early_stopping"], mappings, tuner, spaces,
                  facts, counts["mp_size"] or 1, _facts_line(src, section), tuple(map(str, src.budget.files)),
                  fixed, nvme_lines, tp, knobs, shape, from_section(src, section, shape))


def _global_batch(src: Source, fixed: int | None, most: int | None, dp: int) -> int | None:
    """The global batch the search keeps (`fixed`, the config's train_batch_size) or stays within (`most`,
    max_train_batch_size), checked against each other and against `dp`, the data-parallel GPUs of an experiment:
    below them, micro-batch 1 on each GPU would already pass the most allowed (the search ran it all the same)."""
    if most is not None and fixed is not None and fixed > most:
        raise src.error(f"max_train_batch_size {most} is below the config's train_batch_size {fixed}, which every "
                        "candidate keeps: raise it, or leave one of them out", "max_train_batch_size")
    if fixed is None and most is not None and most < dp:
        raise src.error(f"max_train_batch_size {most} is below the {dp} data-parallel GPU(s) of each experiment: "
                        f"micro-batch size 1 on each already makes a global batch of {dp}", "max_train_batch_size")
    return fixed if fixed is not None else most


def _largest_micro_batch(src: Source, stated: int | None, least: int, global_batch: int | None, batch_key: str,
                         dp: int) -> int | None:
    """The largest micro-batch size allowed: max_train_micro_batch_size_per_gpu (`stated`), bounded by the global
    batch over the data-parallel GPUs. Below the smallest allowed (`least`), refused at the key that bounds it,
    naming it: the global batch's key where that bound is the tighter one."""
    by_batch = max(1, global_batch // dp) if global_batch is not None else None
    largest = min((x for x in (stated, by_batch) if x is not None), default=None)
    if largest is None or largest >= least:
        return largest
    if by_batch is not None and (stated is None or by_batch <= stated):
        raise src.error(f"{batch_key} {global_batch} over {dp} data-parallel GPU(s) allows micro-batch sizes up to "
                        f"{by_batch}, below min_train_micro_batch_size_per_gpu {least}", batch_key)
    raise src.error(f"max_train_micro_batch_size_per_gpu {stated} is below min_train_micro_batch_size_per_gpu {least}",
                    "max_train_micro_batch_size_per_gpu")


def _check_steps(src: Source, start: int | None, end: int | None) -> None:
    """DeepSpeed's engine profiles at `start_profile_step` and writes the metrics after `end_profile_step` (3 and
    5 unless set), in one step when they are equal: a start past the end would end every run before it measured
    (its engine then fails on the FLOPS it never counted)."""
    first, last = start or PROFILE_STEPS[0], end or PROFILE_STEPS[1]
    if first > last:
        raise src.error(f"start_profile_step {first} is past end_profile_step {last}: DeepSpeed's engine would "
                        "write the metrics before it measured", "start_profile_step" if start else "end_profile_step")


def _check_batch_keys(src: Source, config: JSONObject) -> JSONObject:
    """The batch sizes the search leaves to the config: a positive whole number (1e3 too, handed on as 1000), or
    "auto" (the script's), as DeepSpeed takes them; anything else fails every run. The config, its whole numbers
    as such."""
    config = {k: (whole(v) if k in BATCH_KEYS else v) for k, v in config.items()}
    for key in BATCH_KEYS:
        value = config.get(key)
        listed = key == "gradient_accumulation_steps" and isinstance(value, list)  # searched: knobs.py checks it
        if value is not None and value != "auto" and not listed and not (positive_int(value) and value <= limits.COUNT):
            most = f", at most {limits.COUNT:,}" if positive_int(value) else ""
            raise src.error(f"{key} must be a positive whole number or \"auto\"{most}, not {shown(value)}", key)
    return config


def _check_offload(src: Source, zero: JSONObject) -> dict[str, int]:
    """The offload sections the search reads and extends (`_oo`, `_op` levels), as DeepSpeed's engine takes them:
    an object (or null), its `device` none, cpu or nvme, an `nvme_path` with nvme, a path no control character
    is part of (no file system takes a NUL; a newline is a pasted value's, never a directory meant). Anything
    else failed every run, and the search, taking each failure for "nothing fits", went on to offload levels
    built on the broken section. Returns the line of each section's nvme_path, where `sweep.create` points when
    the cluster's machine cannot write there."""
    lines: dict[str, int] = {}
    for key in ("offload_optimizer", "offload_param"):
        section = zero.get(key)
        if section is None:
            continue
        if not isinstance(section, dict):
            raise src.error(f"zero_optimization.{key} must be an object (e.g. {{\"device\": \"cpu\"}}), not "
                            f"{shown(section)}", key)
        device = section.get("device", "none")
        if device not in OFFLOAD_DEVICES:
            raise src.error(f"zero_optimization.{key}.device {shown(device)}: one of {', '.join(OFFLOAD_DEVICES)}",
                            "device", src.line(key))
        path = section.get("nvme_path")
        if device == "nvme" and (not isinstance(path, str) or not path):
            raise src.error(f"zero_optimization.{key}: device nvme needs nvme_path, the directory to offload to, "
                            f"not {shown(path)}", "nvme_path" if "nvme_path" in section else key, src.line(key))
        if device == "nvme" and isinstance(path, str) and CONTROL.search(path):
            raise src.error(f"zero_optimization.{key}.nvme_path {shown(path)} holds a control character (a NUL, "
                            "a newline): no directory to offload to is named so", "nvme_path", src.line(key))
        line = src.line("nvme_path", src.line(key)) if "nvme_path" in section else None
        if line is not None:
            lines[key] = line
    return lines


def _facts(src: Source, section: JSONObject, path: Path) -> JSONObject | None:
    """The model facts the section states: `model_info` with `num_params` (and the activation memory per sample,
    `activation_mem_per_gpu`, as a profile run writes it at micro-batch 1), else the model info file
    `model_info_path` names (relative to the config), as DeepSpeed's engine writes it. None: a profile run finds
    them. `trainable_num_params` (LoRA, PEFT) counts gradients and optimizer states apart. `hidden_size` and
    `num_layers` are DeepSpeed's, checked, and not needed by the memory model. Each fact is checked by one rule
    (`_fact_problem`) wherever it is read; a file's keys beyond them (the engine writes `rank`) are its own."""
    info = section.get("model_info")
    if info is not None:
        if not isinstance(info, dict):
            raise src.error("model_info must be an object", "model_info")
        for key in info:
            if key not in MODEL_INFO_KEYS:
                raise src.error(f"unknown model_info key {shown(key)} (keys: {', '.join(MODEL_INFO_KEYS)})", key)
        problem = _fact_problem(info)
        if problem is not None:
            raise src.error(f"model_info.{problem[0]} {problem[1]}", problem[0])
        if "num_params" in info:
            return _facts_of(info, "model_info", frozen_only=False)
    named = section.get("model_info_path")
    if named is None:
        return None
    if not isinstance(named, str) or not named:
        raise src.error("model_info_path must be the path of a model info file", "model_info_path")
    info_src = read_named(src, "model_info_path", named, "model info file")
    data = info_src.data
    if not isinstance(data, dict) or data.get("num_params") is None:
        raise src.error(f"model_info_path {shown(named)}: holds no num_params (a positive whole number)",
                        "model_info_path")
    problem = _fact_problem(data)
    if problem is not None:  # located as read_named locates a problem of the file: the key naming it, its line
        line = info_src.line(problem[0])
        where = f" (line {line})" if line is not None else ""
        raise src.error(f"model_info_path {shown(named)}{where}: {problem[0]} {problem[1]}", "model_info_path")
    return _facts_of(data, f"model_info_path {info_src.path}", frozen_only=True)


def _fact_problem(info: JSONObject) -> tuple[str, str] | None:
    """(key, why) of the first fact of `info` the memory model cannot use, None when all can: the one rule for
    model_info and a model info file alike (a file once passed more trainable parameters than parameters)."""
    for key, value in info.items():
        if key not in MODEL_INFO_KEYS or key in SHAPE_ONLY:  # the shape alone: layout.read_shape checks it
            continue
        if key == "profile":
            if not isinstance(value, bool):
                return key, f"must be true or false, not {shown(value)}"
            continue
        problem = _model_number(key, value)
        if problem is not None:
            return key, problem
    total, trainable = whole(info.get("num_params")), whole(info.get("trainable_num_params"))
    if isinstance(total, int) and isinstance(trainable, int) and trainable > total:
        return "trainable_num_params", f"({trainable}) is more than num_params ({total})"
    return None


def _facts_of(info: JSONObject, source: str, frozen_only: bool) -> JSONObject:
    """memory.Facts as JSON from checked facts, counts as whole numbers (1.3e9 is 1300000000). `frozen_only`: the
    trainable count only where some parameters are frozen (a file's, which the engine writes for every model;
    model_info's is kept as stated, as recorded searches have it)."""
    total, trainable = whole(info["num_params"]), whole(info.get("trainable_num_params"))
    if frozen_only and trainable is not None and trainable >= total:
        trainable = None
    return {"num_params": total, "activation": info.get("activation_mem_per_gpu") or None, "source": source,
            "trainable": trainable}


def _facts_line(src: Source, section: JSONObject) -> int | None:
    """The line that states the model's facts: model_info's num_params, else model_info_path."""
    info = section.get("model_info")
    if isinstance(info, dict) and "num_params" in info:
        return src.line("num_params", src.line("model_info"))
    return src.line("model_info_path") if section.get("model_info_path") is not None else None


def _model_number(key: str, value: JSON) -> str | None:
    """Why a model fact cannot be used (None: it can): a count is a positive whole number, the activation memory a
    number of bytes, both finite and at most MODEL_NUMBER (the memory model computes in floats: 10^400
    parameters would overflow it)."""
    bytes_ = key == "activation_mem_per_gpu"
    wanted = "a non-negative number of bytes" if bytes_ else "a positive whole number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (bytes_ or positive_int(whole(value))):
        return f"must be {wanted}, not {shown(value)}"
    if (isinstance(value, float) and not math.isfinite(value)) or value < 0 or value > MODEL_NUMBER:
        return f"must be {wanted} of at most 10^15, not {shown(value)}"
    return None


def _have_optuna() -> bool:
    """Optuna imports (an optional extra; imported here only when the config asks for model_based)."""
    try:
        import optuna  # noqa: F401
    except ImportError:
        return False
    return True


def _count(src: Source, section: JSONObject, key: str) -> int | None:
    """A whole number of the autotuning section (1e3, as JSON writes it, is 1000)."""
    value = whole(section.get(key))
    if value is None:
        return None
    if not positive_int(value) or value > limits.COUNT:
        raise src.error(f"{key} must be a positive whole number (at most {limits.COUNT:,}), not "
                        f"{shown(section.get(key))}", key)
    return value


def _stages(src: Source, config: JSONObject) -> tuple[int, ...]:
    """zero_optimization.stage as DeepSpeed's autotuner reads it: one stage, a list of them, or "all"."""
    zero = config.get("zero_optimization", {})
    stage = zero.get("stage", "all") if isinstance(zero, dict) else "all"
    listed = list(STAGES) if stage == "all" else stage if isinstance(stage, list) else [stage]
    if not listed or any(s not in STAGES or not isinstance(s, int) or isinstance(s, bool) for s in listed):
        raise src.error(f"zero_optimization.stage {shown(stage)}: a stage (0-3), a list of them, or \"all\"",
                        "stage")
    return tuple(dict.fromkeys(listed))


def _check_auto(src: Source, config: JSONObject, mappings: dict[str, str], derives_accumulation: bool) -> None:
    """A value the search sets that the config leaves "auto" is filled by the script from its own arguments (a
    Hugging Face Trainer does so, and refuses a config that disagrees with them): without an `arg_mappings` entry
    that hands the script the searched value, every run would fail on that disagreement."""
    searched = ("train_micro_batch_size_per_gpu", *(("gradient_accumulation_steps",) if derives_accumulation else ()))
    for key in searched:
        if config.get(key) == "auto" and key not in mappings:
            raise src.error(f'{key} is "auto" (the script sets it from its arguments) and the search sets it: map it '
                            f'to the script\'s option in the autotuning section, e.g. "arg_mappings": {{"{key}": '
                            f'"{TRAINER_OPTIONS[key]}"}} for a Hugging Face Trainer script', key)


def name_prefix(script: str) -> str:
    """Experiment names start with the script's name: `train.py` -> `train`."""
    return UNSAFE.sub("-", Path(script).stem).strip("-") or "tune"
