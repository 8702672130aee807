"""Experiments, read from hjson: DeepSpeed's own experiment files, or a sweep file with a space to expand.

Each input path of `load_sweep` is a file or a directory of `*.json` / `*.hjson` files (read in name order).
A file is a sweep file when it has one of the keys `space`, `script`, `args`, `metric`, `timeout`, `env`;
otherwise it is a DeepSpeed experiment file.

DeepSpeed experiment file (as DeepSpeed's autotuner writes into its exps_dir, or the exp.json of a result):
    `{"name": .., "ds_config": {..} or "path.json", "num_gpus": N, "num_nodes": N}`, optionally
    `user_script` (relative to the current directory, as DeepSpeed's launcher got it) and `user_args`, which
    win over --script / --args, and `hostfile` (relative to the current directory), which the CLI uses when
    it is given none (cluster.spec_hostfile). The other bookkeeping keys DeepSpeed's scheduler adds (exp_id,
    result_dir, master_port, launcher_args, user, job_id, ds_config_path, ds_config_base64, results) are
    ignored: the runner decides those itself.

Sweep file:
    name       prefix of the generated experiment names (default: the file's stem)
    script     the training script, relative to the sweep file's directory (default: --script)
    args       list of strings passed to the script (default: --args)
    metric     throughput | latency | FLOPS_per_gpu | NAME:min | NAME:max (default throughput); an explicit
               --metric wins over it
    num_gpus   GPU slots per node of every experiment (default 1);  num_nodes  nodes (default 1)
    timeout    seconds an experiment may run (default: --timeout, else limits.DEFAULT_TIMEOUT, applied when it runs)
    env        extra environment variables for the script
    ds_config  the base DeepSpeed config (an object, or a path to a JSON file relative to the sweep file)
    space      {"dotted.ds_config.key": [values..], ...}: the full grid of these values, in the order written;
               the keys `num_gpus` and `num_nodes` vary those fields instead of the config.
Generated names are `<name>_<short><value>_...`, e.g. `zero_mbs_z1_mbs32`, with `short` from ABBREVIATIONS or
else the last segment of the dotted key; characters unsafe in a directory name become `-`. Every input is
bounded (limits.py) before anything is built from it.
"""
from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import hjson

from . import limits
from .errors import UserError, read_user_file, shown
from .metrics import THROUGHPUT, Metric, metric_named

NAME_MAX = 120
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,%d}" % (NAME_MAX - 1))
# What a sweep keeps beside its experiments' directories; an experiment of one of these names would collide.
RESERVED_NAMES = re.compile(r"(ledger\.sqlite|runner\.lock)([.-].*)?|hostfile|summary\.txt|ds_config_optimal\.json"
                            r"|cmd_optimal\.txt|report\.html|plot_metric\.png|plot_timeline\.png|attempt-\d+")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

ABBREVIATIONS = {
    "zero_optimization.stage": "z",
    "train_micro_batch_size_per_gpu": "mbs",
    "gradient_accumulation_steps": "gas",
    "train_batch_size": "tbs",
    "num_gpus": "g",
    "num_nodes": "n",
}
FIELD_KEYS = ("num_gpus", "num_nodes")  # space keys that vary the experiment rather than its ds_config

SWEEP_KEYS = ("name", "script", "args", "metric", "num_gpus", "num_nodes", "timeout", "env", "ds_config", "space")
_SWEEP_ONLY = {"space", "script", "args", "metric", "timeout", "env"}
DS_KEYS = ("name", "ds_config", "num_gpus", "num_nodes", "user_script", "user_args")
DS_IGNORED = ("exp_id", "result_dir", "master_port", "launcher_args", "hostfile", "user", "job_id",
              "ds_config_path", "ds_config_base64", "results")


def is_safe_name(name: str) -> bool:
    """Usable as a directory name: letters, digits, `.`, `_`, `-`; not starting with `.` (hidden); at most 120
    chars; not the name of one of the sweep's own files (RESERVED_NAMES), which share the results directory."""
    return (isinstance(name, str) and _NAME.fullmatch(name) is not None
            and RESERVED_NAMES.fullmatch(name) is None)


def name_problem(name: Any) -> str:
    """Why `name` cannot name an experiment, for the message that refuses it."""
    if isinstance(name, str) and _NAME.fullmatch(name) is not None:
        return f"experiment name {shown(name)} is the name of one of the sweep's own files"
    return (f"experiment name {shown(name)} is not safe as a directory name "
            f"(letters, digits, . _ -; not starting with .; at most {NAME_MAX} characters)")


def _canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Experiment:
    """One run: a DeepSpeed config on `num_nodes` x `num_gpus` slots of `script`."""

    name: str
    ds_config: Mapping[str, Any]  # a plain dict, read-only by convention: use config() for a private copy
    num_gpus: int  # slots per node
    num_nodes: int
    script: str  # absolute path
    args: tuple[str, ...] = ()
    timeout: float | None = None  # seconds
    env: Mapping[str, str] = field(default_factory=dict)
    source: str = ""  # the file it came from

    def __post_init__(self) -> None:
        if not is_safe_name(self.name):
            raise ValueError(name_problem(self.name))
        for key in FIELD_KEYS:
            value = getattr(self, key)
            if not _positive_int(value):
                raise ValueError(f"experiment {self.name}: {key} must be a positive integer, not {shown(value)}")
        object.__setattr__(self, "ds_config", copy.deepcopy(dict(self.ds_config)))
        object.__setattr__(self, "args", tuple(str(a) for a in self.args))
        object.__setattr__(self, "env", {str(k): str(v) for k, v in dict(self.env).items()})
        object.__setattr__(self, "script", str(self.script))
        object.__setattr__(self, "source", str(self.source))

    def __hash__(self) -> int:
        return hash((self.name, self.digest))

    def config(self) -> dict:
        """A deep copy of the ds_config, free to change."""
        return copy.deepcopy(self.ds_config)

    @cached_property
    def digest(self) -> str:
        """sha256 of what defines the run (not its name, timeout or source): equal digests, equal runs."""
        defining = {"ds_config": self.ds_config, "num_gpus": self.num_gpus, "num_nodes": self.num_nodes,
                    "script": self.script, "args": list(self.args), "env": dict(self.env)}
        return hashlib.sha256(_canonical(defining).encode()).hexdigest()

    def to_json(self) -> dict:
        return {"name": self.name, "ds_config": self.config(), "num_gpus": self.num_gpus,
                "num_nodes": self.num_nodes, "script": self.script, "args": list(self.args),
                "timeout": self.timeout, "env": dict(self.env), "source": self.source}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Experiment:
        return cls(name=data["name"], ds_config=data["ds_config"], num_gpus=data["num_gpus"],
                   num_nodes=data["num_nodes"], script=data["script"], args=tuple(data.get("args") or ()),
                   timeout=data.get("timeout"), env=dict(data.get("env") or {}), source=data.get("source", ""))


@dataclass(frozen=True)
class Origin:
    """Where an experiment was defined, to point a later error (it does not fit the cluster) at the line."""

    path: str
    line: int | None  # the experiment (a DeepSpeed file's name, a sweep file's space)
    num_gpus: int | None = None  # the line that sets num_gpus, when one does
    num_nodes: int | None = None

    def line_of(self, key: str) -> int | None:
        return getattr(self, key, None) or self.line


@dataclass(frozen=True)
class Sweep:
    name: str
    experiments: tuple[Experiment, ...]
    metric: Metric
    source: str
    origins: Mapping[str, Origin] = field(default_factory=dict)  # by experiment name
    # The `hostfile` keys of DeepSpeed experiment files: (absolute path, "file:line" that names it).
    hostfiles: tuple[tuple[str, str], ...] = ()


# --- reading files -------------------------------------------------------------------------------------------


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


class _Budget:
    """What is left of one sweep's limits as its files are read and its spaces expanded."""

    def __init__(self) -> None:
        self.bytes = limits.SWEEP_BYTES
        self.experiments = limits.EXPERIMENTS

    def read(self, path: Path, size: int) -> None:
        self.bytes -= size
        if self.bytes < 0:
            raise UserError(f"the sweep's files add up to more than {limits.size(limits.SWEEP_BYTES)}, the limit "
                            "for one sweep", path)

    def expand(self, count: int, config_bytes: int, src: _Source, key: str | None) -> None:
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
class _Source:
    """A parsed input file and its text, to point errors at the line of a key."""

    path: Path
    text: str
    data: Any
    budget: _Budget = field(default_factory=_Budget)

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


def _read(path: Path, budget: _Budget, what: str = "experiment file") -> _Source:
    text = read_user_file(path, what)
    budget.read(path, len(text))
    try:
        data = _parse(text)
    except hjson.HjsonDecodeError as e:
        raise UserError(f"malformed hjson: {e.msg}", path, e.lineno, e.colno) from None
    except _DuplicateKey as e:
        src = _Source(path, text, None)
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
    return _Source(path, text, data, budget)


_NUMBER = re.compile(r"(?<![\w.\"'])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _bad_number(text: str) -> tuple[int | None, int | None]:
    """(line, col) of the first number that Python cannot hold (infinite as a float, or too many digits)."""
    for m in _NUMBER.finditer(text):
        token = m.group()
        if len(token) > 4000 or math.isinf(float(token)):
            start = m.start()
            return text.count("\n", 0, start) + 1, start - (text.rfind("\n", 0, start) + 1) + 1
    return None, None


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _abspath(path: str | Path, base: Path | None = None) -> str:
    p = Path(os.path.expanduser(str(path)))
    if not p.is_absolute() and base is not None:
        p = base / p
    return os.path.abspath(p)


@dataclass(frozen=True)
class _Defaults:
    script: str | None
    args: tuple[str, ...]
    timeout: float | None


@dataclass
class _Loaded:
    """What one file gave: experiments (each with the line that defines it), a metric it asks for, a name."""

    experiments: list[tuple[Experiment, int | None]]
    name: str
    metric: tuple[Metric, int | None] | None = None
    origin: Origin | None = None  # of every experiment of the file
    hostfile: tuple[str, str] | None = None  # a DeepSpeed experiment file's `hostfile`: (path, where)


def _script(src: _Source, key: str, value: Any, base: Path | None) -> str:
    if not isinstance(value, str) or not value.strip():
        raise src.error(f"{key} must be a path (a string)", key)
    script = _abspath(value, base)
    if not os.path.isfile(script):
        raise src.error(f"{key} {shown(value)}: no such file ({shown(script, 200, quoted=False)})", key)
    return script


def _string_list(src: _Source, key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise src.error(f"{key} must be a list of strings", key)
    if any("\0" in v for v in value):  # no process can be started with it
        raise src.error(f"{key}: a string holds a NUL character", key)
    return tuple(value)


_COUNT_MAX = {"num_gpus": limits.SLOTS_PER_HOST, "num_nodes": limits.SLOTS}


def _count(src: _Source, key: str, value: Any, after: int | None = None, what: str | None = None) -> int:
    if not _positive_int(value) or value > _COUNT_MAX[key]:
        raise src.error(f"{what or key} must be a positive integer, not {shown(value)} (the limit is "
                        f"{_COUNT_MAX[key]})", key, after)
    return value


def _ds_config(src: _Source, value: Any) -> dict:
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and value.strip():
        path = Path(_abspath(value, src.path.parent))
        if not path.exists():
            raise src.error(f"ds_config {shown(value)}: no such file ({shown(str(path), 200, quoted=False)})", "ds_config")
        config = _read(path, src.budget, "ds_config file")
        if not isinstance(config.data, dict):
            raise UserError("a ds_config must be a JSON object", path, 1)
        return config.data
    raise src.error("ds_config must be an object or the path of a JSON file", "ds_config")


def _stem_name(path: Path) -> str:
    name = _UNSAFE.sub("-", path.name if path.is_dir() else path.stem)
    name = name.strip("-") or "sweep"
    return ("_" + name if name.startswith(".") else name)[:NAME_MAX]


def _load_ds_exp(src: _Source, data: dict, defaults: _Defaults) -> _Loaded:
    for key in data:
        if key not in DS_KEYS and key not in DS_IGNORED:
            raise src.error(f"unknown key {shown(key)} (a DeepSpeed experiment file has {', '.join(DS_KEYS)}; "
                            f"a sweep file has {', '.join(SWEEP_KEYS)})", key)
    name = data.get("name", _stem_name(src.path))
    if not is_safe_name(name):
        raise src.error(name_problem(name) + ("" if "name" in data else " (from the file name); give `name`"),
                        "name" if "name" in data else None)
    src.budget.expand(1, 0, src, None)
    if "ds_config" not in data:
        raise UserError("a DeepSpeed experiment file needs ds_config", src.path)
    config = _ds_config(src, data["ds_config"])
    num_gpus = _count(src, "num_gpus", data.get("num_gpus", 1))
    num_nodes = _count(src, "num_nodes", data.get("num_nodes", 1))
    script = defaults.script
    if data.get("user_script") is not None:
        script = _script(src, "user_script", data["user_script"], None)
    args = defaults.args
    if data.get("user_args") is not None:
        args = _string_list(src, "user_args", data["user_args"])
    if script is None:
        raise src.error(f"experiment {name}: no script to run: give --script (or user_script here)", "name")
    hostfile = data.get("hostfile")
    if hostfile is not None and (not isinstance(hostfile, str) or not hostfile.strip() or "\0" in hostfile):
        raise src.error("hostfile must be a path (a string)", "hostfile")
    experiment = Experiment(name=name, ds_config=config, num_gpus=num_gpus, num_nodes=num_nodes, script=script,
                            args=args, timeout=defaults.timeout, env={}, source=str(src.path))
    _check_batch(src, experiment)
    line = src.line("name")
    origin = Origin(str(src.path), line, src.line("num_gpus"), src.line("num_nodes"))
    where = f"{src.path}:{src.line('hostfile')}" if hostfile else ""
    return _Loaded([(experiment, line)], _stem_name(src.path), origin=origin,
                   hostfile=(_abspath(hostfile), where) if hostfile else None)


def _set_dotted(config: dict, segments: list[str], value: Any) -> str | None:
    """Set config[a][b][c] = value, creating missing objects; the blocking prefix when one is not an object."""
    node = config
    for i, segment in enumerate(segments[:-1]):
        child = node.setdefault(segment, {})
        if not isinstance(child, dict):
            return ".".join(segments[:i + 1])
        node = child
    node[segments[-1]] = value
    return None


def _value_text(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        text = json.dumps(value)
    elif isinstance(value, (int, float, str)):
        text = str(value)
    else:
        text = _canonical(value)
    return _UNSAFE.sub("-", text).strip("-") or "x"


def _experiment_name(prefix: str, parts: list[str]) -> str:
    name = "_".join([prefix, *parts])
    if len(name) > NAME_MAX:
        name = name[:NAME_MAX - 9] + "-" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return name


def _load_sweep_file(src: _Source, data: dict, defaults: _Defaults) -> _Loaded:
    for key in data:
        if key not in SWEEP_KEYS:
            raise src.error(f"unknown key {shown(key)} in a sweep file (keys: {', '.join(SWEEP_KEYS)})", key)
    prefix = data.get("name", None)
    if prefix is None:
        prefix = _stem_name(src.path)
    elif not isinstance(prefix, str) or _NAME.fullmatch(prefix) is None or len(prefix) > NAME_MAX - 20:
        raise src.error(f"name {shown(prefix)} must be safe as a directory name (letters, digits, . _ -; "
                        f"not starting with .; at most {NAME_MAX - 20} chars)", "name")
    script = defaults.script
    if data.get("script") is not None:
        script = _script(src, "script", data["script"], src.path.parent)
    if script is None:
        raise src.error("no script to run: give `script` here or --script", "name" if "name" in data else None)
    args = _string_list(src, "args", data["args"]) if data.get("args") is not None else defaults.args
    metric = None
    if data.get("metric") is not None:
        line = src.line("metric")
        if not isinstance(data["metric"], str):
            raise src.error("metric must be a string", "metric")
        metric = (metric_named(data["metric"], path=src.path, line=line), line)
    num_gpus = _count(src, "num_gpus", data.get("num_gpus", 1))
    num_nodes = _count(src, "num_nodes", data.get("num_nodes", 1))
    timeout = defaults.timeout
    if data.get("timeout") is not None:
        timeout = data["timeout"]
        if not _number(timeout) or not math.isfinite(timeout) or timeout <= 0:
            raise src.error(f"timeout must be a positive number of seconds, not {shown(timeout)}", "timeout")
        timeout = float(timeout)
    env = _env(src, data.get("env", {}))
    base = _ds_config(src, data["ds_config"]) if data.get("ds_config") is not None else {}
    space = data.get("space", {})
    if not isinstance(space, dict):
        raise src.error("space must be an object of dotted ds_config keys to lists of values", "space")
    space_line = src.line("space")
    if len(space) > limits.SPACE_KEYS:
        raise src.error(f"space has {len(space)} keys, more than {limits.SPACE_KEYS}, the limit", "space")
    axes: list[tuple[str, list[str], list[Any], list[str]]] = []
    count = 1
    for key, values in space.items():
        segments = key.split(".")
        if not key or not all(segments):
            raise src.error(f"space key {shown(key)} is not a dotted ds_config key", key, space_line)
        if not isinstance(values, list) or not values:
            raise src.error(f"space key {shown(key)} needs a non-empty list of values", key, space_line)
        if key in FIELD_KEYS:
            for value in values:
                _count(src, key, value, space_line, what=f"every value of space key {shown(key)}")
        short = _UNSAFE.sub("-", ABBREVIATIONS.get(key, segments[-1])).strip("-")
        axes.append((key, segments, values, [short + text for text in _value_texts(src, key, values, space_line)]))
        count *= len(values)  # refused just below if too many, before any experiment is built
    src.budget.expand(count, len(_canonical(base)), src, "space" if space else None)

    line = space_line or src.line("name")
    fields_from = {k: src.line(k, after=space_line) if k in space else src.line(k) if k in data else None
                   for k in FIELD_KEYS}
    loaded = _Loaded([], prefix, metric, Origin(str(src.path), line, **fields_from))
    for combo in itertools.product(*(range(len(values)) for _, _, values, _ in axes)):
        config = copy.deepcopy(base)
        fields = {"num_gpus": num_gpus, "num_nodes": num_nodes}
        parts = []
        for (key, segments, values, texts), index in zip(axes, combo):
            value = values[index]
            if key in FIELD_KEYS:
                fields[key] = value
            else:
                blocked = _set_dotted(config, segments, copy.deepcopy(value))
                if blocked is not None:
                    raise src.error(f"space key {shown(key)}: {shown(blocked)} in ds_config is "
                                    f"{shown(_get(config, blocked), 40)}, not an object", key, space_line)
            parts.append(texts[index])
        name = _experiment_name(prefix, parts)
        if not is_safe_name(name):  # a space-less sweep named like one of the sweep's own files
            raise src.error(name_problem(name), "name" if "name" in data else None)
        experiment = Experiment(name=name, ds_config=config, script=script, args=args,
                                timeout=timeout, env=env, source=str(src.path), **fields)
        _check_batch(src, experiment)
        loaded.experiments.append((experiment, line))
    return loaded


def _value_texts(src: _Source, key: str, values: list[Any], space_line: int | None) -> list[str]:
    """Each value as it appears in experiment names: made safe for a directory name, and told apart by a short
    hash where making them safe made two alike (`a b` and `a;b` are both `a-b`); a value listed twice is refused.
    """
    canonical = [_canonical(v) for v in values]
    seen: set[str] = set()
    for value, c in zip(values, canonical):
        if c in seen:
            raise src.error(f"space key {shown(key)} lists the value {shown(value)} twice", key, space_line)
        seen.add(c)
    texts = [_value_text(v) for v in values]
    alike = {t for t, n in Counter(texts).items() if n > 1}
    return [f"{t}-{hashlib.sha256(c.encode()).hexdigest()[:6]}" if t in alike else t
            for t, c in zip(texts, canonical)]


def _get(config: dict, dotted: str) -> Any:
    for segment in dotted.split("."):
        config = config[segment]
    return config


def _env(src: _Source, value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise src.error("env must be an object of variable names to strings", "env")
    env_line = src.line("env")
    env = {}
    for key, v in value.items():
        if not _ENV_NAME.fullmatch(key):
            raise src.error(f"env: {shown(key)} is not a valid environment variable name", key, env_line)
        if isinstance(v, str) and "\0" in v:
            raise src.error(f"env: {key} holds a NUL character", key, env_line)
        if isinstance(v, str) or _number(v):
            env[key] = str(v)
        else:
            raise src.error(f"env: {key} must be a string or a number", key, env_line)
    return env


_BATCH = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def _check_batch(src: _Source, e: Experiment) -> None:
    """What DeepSpeed would refuse only after launch: batch sizes that cannot fit the experiment's GPUs."""
    values = [e.ds_config.get(k) for k in _BATCH]
    for key, value in zip(_BATCH, values):
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


def _load_file(path: Path, defaults: _Defaults, budget: _Budget) -> _Loaded:
    src = _read(path, budget)
    if not isinstance(src.data, dict):
        raise UserError("expected an object (a sweep file or a DeepSpeed experiment file)", path, 1)
    if _SWEEP_ONLY & src.data.keys():
        return _load_sweep_file(src, src.data, defaults)
    return _load_ds_exp(src, src.data, defaults)


def _files(path: Path, budget: _Budget) -> list[Path]:
    if path.is_dir():
        files = []
        with os.scandir(path) as entries:  # every file makes an experiment: stop at the sweep's limit
            for entry in entries:
                if entry.name.endswith((".json", ".hjson")) and entry.is_file():
                    files.append(Path(entry.path))
                    if len(files) > budget.experiments:
                        raise UserError("directory holds more experiment files than fit in one sweep "
                                        f"({limits.EXPERIMENTS:,} experiments, the limit)", path)
        files.sort()
        if not files:
            raise UserError("directory holds no *.json or *.hjson experiment files", path)
        return files
    if not path.exists():
        raise UserError("no such file or directory", path)
    return [path]


def load_sweep(paths: Sequence[str | Path], *, script: str | None = None, args: Sequence[str] = (),
               metric: str | None = None, timeout: float | None = None) -> Sweep:
    """The experiments of sweep files, DeepSpeed experiment files and directories of them, in order.

    `script` (relative to the current directory), `args` and `timeout` are defaults for what the files leave
    out. `metric` is different: given (an explicit --metric), it wins over the files' `metric`, which would
    otherwise rank the sweep by something else than the user just asked for. UserError, naming the file and
    line, for anything wrong.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    if not paths:
        raise UserError("no experiment files given")
    if script is not None:
        cli_script = _abspath(script)
        if not os.path.isfile(cli_script):
            raise UserError(f"--script: no such file ({shown(cli_script, 200, quoted=False)})", shown(script, 200, quoted=False))
        script = cli_script
    if timeout is not None and (not _number(timeout) or not math.isfinite(timeout) or timeout <= 0):
        raise UserError(f"--timeout must be a positive number of seconds, not {shown(timeout)}")
    chosen = metric_named(metric) if metric else None
    defaults = _Defaults(script, tuple(str(a) for a in args), None if timeout is None else float(timeout))

    budget = _Budget()
    experiments: list[Experiment] = []
    origins: dict[str, Origin] = {}
    hostfiles: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    names: list[str] = []
    asked: tuple[Metric, str] | None = None  # the metric a sweep file asks for, and where
    for given in paths:
        given = Path(given)
        files = _files(given, budget)
        for path in files:
            loaded = _load_file(path, defaults, budget)
            if loaded.hostfile is not None:
                hostfiles.append(loaded.hostfile)
            if loaded.metric is not None and chosen is None:
                if asked is not None and asked[0] != loaded.metric[0]:
                    raise UserError(f"metric {loaded.metric[0].spec} differs from {asked[0].spec} in {asked[1]}; "
                                    "a sweep has one metric", path, loaded.metric[1])
                where = f"{path}:{loaded.metric[1]}" if loaded.metric[1] else str(path)
                asked = asked or (loaded.metric[0], where)
            for experiment, line in loaded.experiments:
                here = f"{path}:{line}" if line else str(path)
                if experiment.name in seen:
                    raise UserError(f"experiment name {experiment.name!r} is already used by {seen[experiment.name]}",
                                    path, line)
                seen[experiment.name] = here
                experiments.append(experiment)
                if loaded.origin is not None:
                    origins[experiment.name] = loaded.origin
        names.append(loaded.name if given.is_file() else _stem_name(given))
    name = _experiment_name(names[0], names[1:3]) if len(names) > 1 else names[0]
    if len(names) > 3:
        name = _experiment_name(name, [f"and{len(names) - 3}more"])
    return Sweep(name=name, experiments=tuple(experiments), metric=chosen or (asked[0] if asked else THROUGHPUT),
                 source=", ".join(str(p) for p in paths), origins=origins, hostfiles=tuple(hostfiles))
