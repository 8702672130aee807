"""Sweep files: a base ds_config and a space of values, expanded into the full grid of experiments.

Keys (SWEEP_KEYS): `name` (prefix of the generated names), `script`, `args`, `metric`, `num_gpus`, `num_nodes`,
`timeout`, `estimate` (seconds a run is expected to take, for `autotune plan`), `env`, `gpu_type` (the GPU type its
experiments run on), `gpu_mixed` (true: one experiment may span GPU types), `gpu_memory` (what each experiment
needs on each GPU, "30GB": for `--placement memory`), `ds_config` (an object or a JSON file) and `space`
({"dotted.ds_config.key": [values..]}, in the order written; `num_gpus` and `num_nodes` vary those fields instead
of the config, and a key that starts with `--` varies that option of the script). `config_flag` names the script
option the config is handed to (default `--deepspeed_config`; `--deepspeed` for Hugging Face Trainer scripts);
`arg_mappings` ({"dotted.ds_config.key": "--option"}, as in DeepSpeed's autotuning section) also hands each
experiment's value of a config key to the script as that option (Trainer scripts take their batch sizes as
arguments). Generated names are `<name>_<short><value>_...`, e.g.
`zero_mbs_z1_mbs32`, with `short` from ABBREVIATIONS or else the last segment of the dotted key. A space is
refused before it is expanded when it would pass the sweep's limits.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections import Counter

from .. import limits
from ..errors import shown
from ..gpu.types import parse_size, type_problem
from ..jsonvalues import JSON, JSONObject
from .metrics import metric_named
from .model import (
    ABBREVIATIONS,
    CONFIG_FLAG,
    FIELD_KEYS,
    NAME_MAX,
    SAFE_NAME,
    UNSAFE,
    Experiment,
    Origin,
    canonical,
    copied,
    is_safe_name,
    name_problem,
    option_text,
    with_arg,
    with_mapped_args,
)
from .reading import (
    CONFIG_OPTIONS,
    Defaults,
    Loaded,
    Source,
    arg_mappings,
    check_batch,
    ds_config_of,
    env_of,
    is_number,
    positive_count,
    script_option,
    script_path,
    stem_name,
    string_list,
)
from .sure import problem

SWEEP_KEYS = ("name", "script", "args", "config_flag", "arg_mappings", "metric", "num_gpus", "num_nodes", "timeout",
              "estimate", "env", "gpu_type", "gpu_mixed", "gpu_memory", "ds_config", "space")


def _set_dotted(config: JSONObject, segments: list[str], value: JSON) -> str | None:
    """Set config[a][b][c] = value, creating missing objects; the blocking prefix when one is not an object."""
    node = config
    for i, segment in enumerate(segments[:-1]):
        child = node.setdefault(segment, {})
        if not isinstance(child, dict):
            return ".".join(segments[:i + 1])
        node = child
    node[segments[-1]] = value
    return None


def _value_text(value: JSON) -> str:
    if isinstance(value, bool) or value is None:
        text = json.dumps(value)
    elif isinstance(value, (int, float, str)):
        text = str(value)
    else:
        text = canonical(value)
    return UNSAFE.sub("-", text).strip("-") or "x"


def experiment_name(prefix: str, parts: list[str]) -> str:
    name = "_".join([prefix, *parts])
    if len(name) > NAME_MAX:
        name = name[:NAME_MAX - 9] + "-" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return name


def load_sweep_file(src: Source, data: JSONObject, defaults: Defaults) -> Loaded:
    for key in data:
        if key not in SWEEP_KEYS:
            raise src.error(f"unknown key {shown(key)} in a sweep file (keys: {', '.join(SWEEP_KEYS)})", key)
    prefix = data.get("name")
    if prefix is None:
        prefix = stem_name(src.path)
    elif not isinstance(prefix, str) or SAFE_NAME.fullmatch(prefix) is None or len(prefix) > NAME_MAX - 20:
        raise src.error(f"name {shown(prefix)} must be safe as a directory name (letters, digits, . _ -; "
                        f"not starting with .; at most {NAME_MAX - 20} chars)", "name")
    script = defaults.script
    if data.get("script") is not None:
        script = script_path(src, "script", data["script"], src.path.parent)
    if script is None:
        raise src.error("no script to run: give `script` here or --script", "name" if "name" in data else None)
    args = string_list(src, "args", data["args"]) if data.get("args") is not None else defaults.args
    metric = None
    if data.get("metric") is not None:
        line = src.line("metric")
        if not isinstance(data["metric"], str):
            raise src.error("metric must be a string", "metric")
        metric = (metric_named(data["metric"], path=src.path, line=line), line)
    num_gpus = positive_count(src, "num_gpus", data.get("num_gpus", 1))
    num_nodes = positive_count(src, "num_nodes", data.get("num_nodes", 1))
    timeout = _seconds(src, "timeout", data) if data.get("timeout") is not None else defaults.timeout
    estimate = _seconds(src, "estimate", data) if data.get("estimate") is not None else None
    config_flag = script_option(src, "config_flag", data["config_flag"], "config_flag") if "config_flag" in data \
        else CONFIG_FLAG
    mappings = arg_mappings(src, data.get("arg_mappings", {}), config_flag)
    env = env_of(src, data.get("env", {}))
    gpu_type, gpu_mixed, gpu_memory = _gpu_needs(src, data, defaults)
    base = ds_config_of(src, data["ds_config"]) if data.get("ds_config") is not None else {}
    space = data.get("space", {})
    if not isinstance(space, dict):
        raise src.error("space must be an object of dotted ds_config keys to lists of values", "space")
    space_line = src.line("space")
    if len(space) > limits.SPACE_KEYS:
        raise src.error(f"space has {len(space)} keys, more than {limits.SPACE_KEYS}, the limit", "space")
    axes: list[tuple[str, list[str], list[JSON], list[str]]] = []
    count = 1
    for key, values in space.items():
        segments = key.split(".")
        if not key or not all(segments):
            raise src.error(f"space key {shown(key)} is not a dotted ds_config key", key, space_line)
        if len(segments) > limits.DEPTH:  # each segment a level of the config it builds
            raise src.error(f"space key {shown(key)} nests {len(segments)} levels, more than {limits.DEPTH}, the "
                            "limit", key, space_line)
        if not key.startswith("-"):
            prefixes = (".".join(segments[:i]) for i in range(1, len(segments)))
            within = next((prefix for prefix in prefixes if prefix in space), None)
            if within is not None:  # the one set last would undo the other: experiments alike under two names
                raise src.error(f"space keys {shown(within)} and {shown(key)} overlap: {shown(within)} sets what "
                                f"{shown(key)} does; give one of them", key, space_line)
        if not isinstance(values, list) or not values:
            raise src.error(f"space key {shown(key)} needs a non-empty list of values", key, space_line)
        if key in FIELD_KEYS:
            for value in values:
                positive_count(src, key, value, space_line, what=f"every value of space key {shown(key)}")
        if key.startswith("-"):
            _check_option_axis(src, key, values, config_flag, space_line)
        short = UNSAFE.sub("-", ABBREVIATIONS.get(key, segments[-1])).strip("-")
        axes.append((key, segments, values, [short + text for text in _value_texts(src, key, values, space_line)]))
        count *= len(values)  # refused just below if too many, before any experiment is built
    src.budget.expand(count, len(canonical(base)), src, "space" if space else None)
    for dotted, option in mappings.items():
        if option in space:
            raise src.error(f"arg_mappings hands {dotted} to {option}, which the space varies too", option,
                            space_line)

    line = space_line or src.line("name")
    fields_from = {k: src.line(k, after=space_line) if k in space else src.line(k) if k in data else None
                   for k in FIELD_KEYS} | {k: src.line(k) if k in data else None for k in ("gpu_type", "gpu_memory")}
    loaded = Loaded([], prefix, metric, Origin(str(src.path), line, **fields_from))
    for combo in itertools.product(*(range(len(values)) for _, _, values, _ in axes)):
        config = copied(base)
        fields = {"num_gpus": num_gpus, "num_nodes": num_nodes}
        options = list(args)
        parts = []
        for (key, segments, values, texts), index in zip(axes, combo, strict=True):
            value = values[index]
            if key in FIELD_KEYS:
                fields[key] = value
            elif key.startswith("-"):
                options = with_arg(options, key, option_text(value))
            else:
                blocked = _set_dotted(config, segments, copied(value))
                if blocked is not None:
                    raise src.error(f"space key {shown(key)}: {shown(blocked)} in ds_config is "
                                    f"{shown(_get(config, blocked), 40)}, not an object", key, space_line)
            parts.append(texts[index])
        name = experiment_name(prefix, parts)
        if not is_safe_name(name):  # a space-less sweep named like one of the sweep's own files
            raise src.error(name_problem(name), "name" if "name" in data else None)
        options = with_mapped_args(options, config, mappings)
        experiment = Experiment(name=name, ds_config=config, script=script, args=tuple(options), timeout=timeout,
                                env=env, source=str(src.path), estimate=estimate, config_flag=config_flag,
                                num_gpus=fields["num_gpus"], num_nodes=fields["num_nodes"], gpu_type=gpu_type,
                                gpu_mixed=gpu_mixed, gpu_memory=gpu_memory)
        check_batch(src, experiment)
        if (wrong := problem(experiment.ds_config)) is not None:
            raise src.error(f"experiment {name}: {wrong}", "ds_config" if "ds_config" in data else None)
        loaded.experiments.append((experiment, line))
    return loaded


def _check_option_axis(src: Source, key: str, values: list[JSON], config_flag: str, line: int | None) -> None:
    """A space key that varies a script option: a proper option, not the config's own, with plain values."""
    script_option(src, "space key", key, key, line)
    if key == config_flag or key in CONFIG_OPTIONS:
        whose = "the option the config itself is handed to" if key == config_flag else "DeepSpeed's own config option"
        raise src.error(f"space key {key} is {whose}: vary the config's keys", key, line)
    for value in values:
        if not isinstance(value, (str, int, float, bool)) or (isinstance(value, float) and not math.isfinite(value)):
            raise src.error(f"space key {key}: every value must be a string, number or boolean, not "
                            f"{shown(value)}", key, line)
        if isinstance(value, str) and "\0" in value:  # no argument can hold one: every launch would fail
            raise src.error(f"space key {key}: a value holds a NUL character", key, line)


def _gpu_needs(src: Source, data: JSONObject, defaults: Defaults) -> tuple[str | None, bool, int | None]:
    """gpu_type, gpu_mixed and gpu_memory, each checked at its line; --gpu-type wins over the file's type."""
    gpu_type = data.get("gpu_type")
    if gpu_type is not None and type_problem(gpu_type):
        raise src.error(f"gpu_type: {type_problem(gpu_type)}", "gpu_type")
    mixed = data.get("gpu_mixed", False)
    if not isinstance(mixed, bool):
        raise src.error(f"gpu_mixed must be true or false, not {shown(mixed)}", "gpu_mixed")
    memory = None
    if data.get("gpu_memory") is not None:
        try:
            memory = parse_size(data["gpu_memory"])
        except ValueError as e:
            raise src.error(f"gpu_memory {e}", "gpu_memory") from None
    return defaults.gpu_type or gpu_type, defaults.gpu_mixed or mixed, memory


def _seconds(src: Source, key: str, data: JSONObject) -> float:
    """A positive, finite number of seconds within the sweep's limits, or a located error."""
    value = data[key]
    if not is_number(value) or not math.isfinite(value) or value <= 0:
        raise src.error(f"{key} must be a positive number of seconds, not {shown(value)}", key)
    if value > limits.SECONDS:
        raise src.error(f"{key} {value:g} is more than {limits.SECONDS:,} seconds (the limit)", key)
    return float(value)


def _value_texts(src: Source, key: str, values: list[JSON], space_line: int | None) -> list[str]:
    """Each value as it appears in experiment names: made safe for a directory name, and told apart by a short
    hash where making them safe made two alike (`a b` and `a;b` are both `a-b`); a value listed twice is refused.
    """
    exact = [canonical(v) for v in values]
    seen: set[str] = set()
    for value, c in zip(values, exact, strict=True):
        if c in seen:
            raise src.error(f"space key {shown(key)} lists the value {shown(value)} twice", key, space_line)
        seen.add(c)
    texts = [_value_text(v) for v in values]
    alike = {t for t, n in Counter(texts).items() if n > 1}
    return [f"{t}-{hashlib.sha256(c.encode()).hexdigest()[:6]}" if t in alike else t
            for t, c in zip(texts, exact, strict=True)]


def _get(config: JSONObject, dotted: str) -> JSON:
    for segment in dotted.split("."):
        config = config[segment]
    return config
