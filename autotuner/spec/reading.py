"""Reading a sweep's input files: hjson or JSON text, parsed within the sweep's limits, and the checks of the
values in them, each failure a UserError at the file, line and column of its key.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hjson

from .. import limits
from ..errors import UserError, read_user_file, shown
from .metrics import Metric
from .model import NAME_MAX, UNSAFE, Experiment, Origin, positive_int

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _pairs(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


class Budget:
    """What is left of one sweep's limits as its files are read and its spaces expanded."""

    def __init__(self) -> None:
        self.bytes = limits.SWEEP_BYTES
        self.experiments = limits.EXPERIMENTS

    def read(self, path: Path, size: int) -> None:
        self.bytes -= size
        if self.bytes < 0:
            raise UserError(f"the sweep's files add up to more than {limits.size(limits.SWEEP_BYTES)}, the limit "
                            "for one sweep", path)

    def expand(self, count: int, config_bytes: int, src: Source, key: str | None) -> None:
        """Refuse a space before it is expanded: the product of its lists, and the configs it would build."""
        if count > self.experiments:
            many = f"{count:,}" if count < 10 ** 15 else shown(count)
            raise src.error(f"{'the space' if key else 'this file'} makes {many} experiments; with the rest "
                            f"of the sweep that is more than {limits.EXPERIMENTS:,}, the limit for one sweep", key)
        if count * config_bytes > self.bytes:
            raise src.error(f"the space makes {count:,} experiments with a {limits.size(config_bytes)} ds_config: "
                            f"more than {limits.size(limits.SWEEP_BYTES)} of configs, the limit for one sweep", key)
        self.experiments -= count
        self.bytes -= count * config_bytes


@dataclass
class Source:
    """A parsed input file and its text, to point errors at the line of a key."""

    path: Path
    text: str
    data: Any
    budget: Budget = field(default_factory=Budget)

    def _matches(self, key: str) -> list[tuple[int, int]]:
        pattern = re.compile(r"(?:^|(?<=[{,\[]))[ \t]*([\"']?)" + re.escape(key) + r"\1[ \t]*:", re.M)
        found = []
        for m in pattern.finditer(self.text):
            start = m.start(1)
            line = self.text.count("\n", 0, start) + 1
            found.append((line, start - (self.text.rfind("\n", 0, start) + 1) + 1))
        return found

    def where(self, key: str, after: int | None = None) -> tuple[int | None, int | None]:
        """(line, col) of `key`: at top level (least indented), or the first one after line `after`."""
        found = self._matches(key)
        if after is not None:
            found = [lc for lc in found if lc[0] >= after] or found
            return found[0] if found else (None, None)
        return min(found, key=lambda lc: (lc[1], lc[0])) if found else (None, None)

    def line(self, key: str, after: int | None = None) -> int | None:
        return self.where(key, after)[0]

    def error(self, message: str, key: str | None = None, after: int | None = None) -> UserError:
        line, col = self.where(key, after) if key is not None else (None, None)
        return UserError(message, self.path, line, col)


class _NotPlainJson(Exception):
    pass


def _no_constant(name: str) -> Any:
    raise _NotPlainJson(name)


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NotPlainJson(text)
    return value


def _parse(text: str) -> Any:
    """JSON through the C parser (DeepSpeed's files are JSON, and the pure-Python hjson parser takes seconds a
    megabyte); anything else, or anything the two might read differently, through hjson."""
    try:
        return json.loads(text, object_pairs_hook=_pairs, parse_constant=_no_constant, parse_float=_finite)
    except (_NotPlainJson, ValueError, RecursionError):
        return hjson.loads(text, object_pairs_hook=_pairs)


def _too_deep(data: Any) -> bool:
    """Whether objects and lists nest deeper than limits.DEPTH (walked without recursion)."""
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > limits.DEPTH:
                    return True
                stack.append((child, depth + 1))
    return False


def read_source(path: Path, budget: Budget, what: str = "experiment file") -> Source:
    text = read_user_file(path, what)
    budget.read(path, len(text))
    try:
        data = _parse(text)
    except hjson.HjsonDecodeError as e:
        raise UserError(f"malformed hjson: {e.msg}", path, e.lineno, e.colno) from None
    except _DuplicateKey as e:
        src = Source(path, text, None)
        spots = src._matches(e.key)
        line, col = spots[1] if len(spots) > 1 else (None, None)
        raise UserError(f"duplicate key {shown(e.key)}", path, line, col) from None
    except RecursionError:
        raise UserError(f"nested too deeply (the limit is {limits.DEPTH} levels)", path) from None
    except (OverflowError, ValueError):  # hjson turns 1e400 into inf, then int(inf); or a 5000-digit integer
        line, col = _bad_number(text)
        raise UserError("number out of range", path, line, col) from None
    if data == {} and "{" not in text:  # nothing but blanks and comments
        raise UserError("empty file", path)
    if _too_deep(data):
        raise UserError(f"objects and lists nest deeper than {limits.DEPTH} levels, the limit", path)
    return Source(path, text, data, budget)


_NUMBER = re.compile(r"(?<![\w.\"'])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _bad_number(text: str) -> tuple[int | None, int | None]:
    """(line, col) of the first number that Python cannot hold (infinite as a float, or too many digits)."""
    for m in _NUMBER.finditer(text):
        token = m.group()
        if len(token) > 4000 or math.isinf(float(token)):
            start = m.start()
            return text.count("\n", 0, start) + 1, start - (text.rfind("\n", 0, start) + 1) + 1
    return None, None


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def abspath(path: str | Path, base: Path | None = None) -> str:
    p = Path(os.path.expanduser(str(path)))
    if not p.is_absolute() and base is not None:
        p = base / p
    return os.path.abspath(p)


@dataclass(frozen=True)
class Defaults:
    script: str | None
    args: tuple[str, ...]
    timeout: float | None
    gpu_type: str | None = None  # --gpu-type: wins over a sweep file's gpu_type
    gpu_mixed: bool = False  # --gpu-mixed


@dataclass
class Loaded:
    """What one file gave: experiments (each with the line that defines it), a metric it asks for, a name."""

    experiments: list[tuple[Experiment, int | None]]
    name: str
    metric: tuple[Metric, int | None] | None = None
    origin: Origin | None = None  # of every experiment of the file
    hostfile: tuple[str, str] | None = None  # a DeepSpeed experiment file's `hostfile`: (path, where)


def script_path(src: Source, key: str, value: Any, base: Path | None) -> str:
    if not isinstance(value, str) or not value.strip():
        raise src.error(f"{key} must be a path (a string)", key)
    script = abspath(value, base)
    if not os.path.isfile(script):
        raise src.error(f"{key} {shown(value)}: no such file ({shown(script, 200, quoted=False)})", key)
    return script


def string_list(src: Source, key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise src.error(f"{key} must be a list of strings", key)
    if any("\0" in v for v in value):  # no process can be started with it
        raise src.error(f"{key}: a string holds a NUL character", key)
    return tuple(value)


_COUNT_MAX = {"num_gpus": limits.SLOTS_PER_HOST, "num_nodes": limits.SLOTS}


def positive_count(src: Source, key: str, value: Any, after: int | None = None, what: str | None = None) -> int:
    if not positive_int(value) or value > _COUNT_MAX[key]:
        raise src.error(f"{what or key} must be a positive integer, not {shown(value)} (the limit is "
                        f"{_COUNT_MAX[key]})", key, after)
    return value


def ds_config_of(src: Source, value: Any) -> dict:
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and value.strip():
        path = Path(abspath(value, src.path.parent))
        if not path.exists():
            raise src.error(f"ds_config {shown(value)}: no such file ({shown(str(path), 200, quoted=False)})",
                            "ds_config")
        config = read_source(path, src.budget, "ds_config file")
        if not isinstance(config.data, dict):
            raise UserError("a ds_config must be a JSON object", path, 1)
        return config.data
    raise src.error("ds_config must be an object or the path of a JSON file", "ds_config")


def stem_name(path: Path) -> str:
    name = UNSAFE.sub("-", path.name if path.is_dir() else path.stem)
    name = name.strip("-") or "sweep"
    return ("_" + name if name.startswith(".") else name)[:NAME_MAX]




def env_of(src: Source, value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise src.error("env must be an object of variable names to strings", "env")
    env_line = src.line("env")
    env = {}
    for key, v in value.items():
        if not _ENV_NAME.fullmatch(key):
            raise src.error(f"env: {shown(key)} is not a valid environment variable name", key, env_line)
        if isinstance(v, str) and "\0" in v:
            raise src.error(f"env: {key} holds a NUL character", key, env_line)
        if isinstance(v, str) or is_number(v):
            env[key] = str(v)
        else:
            raise src.error(f"env: {key} must be a string or a number", key, env_line)
    return env


_BATCH = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def check_batch(src: Source, e: Experiment) -> None:
    """What DeepSpeed would refuse only after launch: batch sizes that cannot fit the experiment's GPUs."""
    values: list[Any] = [e.ds_config.get(k) for k in _BATCH]
    for key, value in zip(_BATCH, values, strict=True):
        if isinstance(value, int) and not isinstance(value, bool) and value <= 0:
            raise src.error(f"experiment {e.name}: {key} must be positive, not {value}", key)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return  # "auto", absent, or left for DeepSpeed to compute
    tbs, mbs, gas = values
    gpus = e.num_gpus * e.num_nodes
    product = mbs * gas * gpus
    # DeepSpeed wants train_batch_size == micro batch * gas * data-parallel size; with model parallelism of
    # degree m, the data-parallel size is gpus / m. Refuse only what no such m explains.
    degree = product // tbs
    if product % tbs or degree == 0 or gpus % degree:
        raise src.error(f"experiment {e.name}: train_batch_size {tbs} != train_micro_batch_size_per_gpu {mbs} "
                        f"x gradient_accumulation_steps {gas} x {gpus} GPU(s) = {product}", "train_batch_size")
