"""A tune file: the command and config `autotune tune` is otherwise given on its command line, as one hjson file
(`autotune tune tune.hjson`), read and checked where each key stands."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import UserError, shown
from ..jsonvalues import JSON
from ..spec.model import CONFIG_FLAG, FLAG, NAME_MAX, SAFE_NAME
from ..spec.reading import (
    Budget,
    Source,
    abspath,
    ds_config_of,
    env_of,
    positive_count,
    read_source,
    script_path,
    string_list,
)
from .inputs import TuneInput, config_option
from .knobs import whole
from .worlds import MOST_SIZES, counts

TUNE_FILE_KEYS = ("name", "script", "args", "config_flag", "num_gpus", "num_nodes", "env", "ds_config")
TUNE_FILE_SUFFIXES = (".hjson", ".json")


def is_tune_file(path: str) -> bool:
    """Whether `autotune tune` was handed a tune file rather than a training script."""
    return Path(path).suffix.lower() in TUNE_FILE_SUFFIXES


@dataclass(frozen=True)
class TuneFile:
    """A tune file read: the command it states, its ds_config (located in its file, for errors), the rest."""

    command: TuneInput
    config: Source
    name: str | None = None
    num_gpus: tuple[int, ...] = ()  # each count searched (worlds.py); none stated: ()
    num_nodes: tuple[int, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


def _counts_at(src: Source, key: str, value: JSON) -> tuple[int, ...]:
    """A tune file's `num_gpus` / `num_nodes`: one count, a list of them, or the text `--num_gpus` takes (`1,2,4`,
    `1-8`): the world sizes searched (worlds.py). Refused at the key's line when any is not a count."""
    if isinstance(value, str):
        try:
            found = counts(value, key)
        except UserError as e:
            raise src.error(e.message, key) from None
    elif isinstance(value, list):
        if not value or len(value) > MOST_SIZES:
            raise src.error(f"{key} must list 1 to {MOST_SIZES} counts, not {len(value)}", key)
        found = tuple(positive_count(src, key, whole(v)) for v in value)
    else:
        found = (positive_count(src, key, whole(value)),)
    return tuple(dict.fromkeys(positive_count(src, key, v) for v in found))  # each within the limit, once


def read_tune_file(path: Path) -> TuneFile:
    """`script` (relative to the file), `args`, `config_flag` (how the script takes its config: DeepSpeed's
    `--deepspeed_config` by default, `--deepspeed` for a Trainer script), `num_gpus`, `num_nodes`, `env`, and
    `ds_config` (an object or a JSON file's path) holding DeepSpeed's `autotuning` section: what to search and
    the budget, read as `read_tuning` reads a config file's."""
    src = read_source(path, Budget(), "tune file")
    data = src.data
    if not isinstance(data, dict):
        raise UserError("a tune file must be an object", path)
    for key in data:
        if key not in TUNE_FILE_KEYS:
            raise src.error(f"unknown key {shown(key)} in a tune file (keys: {', '.join(TUNE_FILE_KEYS)})", key)
    for key in ("script", "ds_config"):
        if data.get(key) is None:
            raise src.error(f"a tune file needs `{key}`", None)
    name = data.get("name")
    if name is not None and (not isinstance(name, str) or SAFE_NAME.fullmatch(name) is None
                             or len(name) > NAME_MAX - 20):
        raise src.error(f"name {shown(name)} must be safe as a directory name (letters, digits, . _ -; not "
                        f"starting with .; at most {NAME_MAX - 20} chars)", "name")
    flag = data.get("config_flag", CONFIG_FLAG)
    if not isinstance(flag, str) or FLAG.fullmatch(flag) is None:
        raise src.error(f"config_flag {shown(flag)} is not a script option (--name)", "config_flag")
    script = script_path(src, "script", data["script"], path.parent)
    args = string_list(src, "args", data["args"]) if data.get("args") is not None else ()
    named = config_option(args)
    if named is not None:  # ds_config is the config: a second in the arguments would leave the script to choose
        raise src.error(f"args name a DeepSpeed config ({named[0]} {named[1]}): the tune file's ds_config is it",
                        "args")
    config = data["ds_config"]
    if isinstance(config, dict):
        located = replace(src, data=config)
    else:  # a file of its own (ds_config_of refuses what is not one): errors point there
        ds_config_of(src, config)
        located = read_source(Path(abspath(config, path.parent)), src.budget, "ds_config file")
    told = {k: _counts_at(src, k, data[k]) for k in ("num_gpus", "num_nodes") if data.get(k) is not None}
    return TuneFile(TuneInput(script, args, flag, located.path), located, name, told.get("num_gpus", ()),
                    told.get("num_nodes", ()), env_of(src, data.get("env", {})))
