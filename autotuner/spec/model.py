"""What a sweep is: its experiments, their names, and where they came from.

An experiment's name is also its directory in the results directory, so names are checked here, once, for
every way an experiment is made (files, Python).
"""
from __future__ import annotations

import copy
import hashlib
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from ..errors import shown
from ..gpu.types import type_problem
from ..jsonvalues import JSON, JSONObject
from .metrics import Metric

NAME_MAX = 120
SAFE_NAME = re.compile(rf"[A-Za-z0-9_-][A-Za-z0-9._-]{{0,{NAME_MAX - 1}}}")
# What a sweep keeps beside its experiments' directories; an experiment of one of these names would collide.
# (`.TYPE`: the best of each GPU type, when a sweep ran on several.)
RESERVED_NAMES = re.compile(r"(ledger\.sqlite|runner\.lock)([.-].*)?|hostfile|summary\.txt"
                            r"|ds_config_optimal(\..+)?\.json|cmd_optimal(\..+)?\.txt|report\.html|plot_metric\.png"
                            r"|plot_timeline\.png|attempt-\d+")
UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")

ABBREVIATIONS = {
    "zero_optimization.stage": "z",
    "train_micro_batch_size_per_gpu": "mbs",
    "gradient_accumulation_steps": "gas",
    "train_batch_size": "tbs",
    "tensor_parallel.autotp_size": "tp",
    "num_gpus": "g",
    "num_nodes": "n",
    "--per_device_train_batch_size": "bs",
    "--gradient_accumulation_steps": "gas",
    "--learning_rate": "lr",
}
FIELD_KEYS = ("num_gpus", "num_nodes")  # space keys that vary the experiment rather than its ds_config
CONFIG_FLAG = "--deepspeed_config"  # how the config reaches the script unless the sweep says (`config_flag`)
FLAG = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_.-]*")  # a script option a sweep may set or vary


def with_arg(args: Sequence[str], flag: str, value: str) -> list[str]:
    """`args` (a fresh list) with option `flag` set to `value`: replaced wherever present (`--f v` or `--f=v`;
    every time it is given, since a parser takes the last), appended otherwise."""
    out = list(args)
    found = False
    for i, arg in enumerate(out):
        if arg == flag and i + 1 < len(out):
            out[i + 1], found = value, True
        elif arg.startswith(flag + "="):
            out[i], found = f"{flag}={value}", True
    return out if found else [*out, flag, value]


def option_text(value: JSON) -> str:
    """A value as a script argument: JSON's words for booleans, the number or string itself otherwise."""
    return json.dumps(value) if isinstance(value, bool) else str(value)


def dotted_value(config: Mapping[str, JSON], dotted: str, missing: JSON = None) -> JSON:
    """The value of a dotted key in a config (an object there too), or `missing` where it has none."""
    node: JSON = config
    for segment in dotted.split("."):
        if not isinstance(node, Mapping) or segment not in node:
            return missing
        node = node[segment]
    return node


def with_mapped_args(args: Sequence[str], config: Mapping[str, JSON], mappings: Mapping[str, str]) -> list[str]:
    """`args` with each config value that `mappings` (dotted key -> script option, DeepSpeed's `arg_mappings`)
    names handed to the script as that option too; an absent key or "auto" is left to the script."""
    out = list(args)
    for dotted, option in mappings.items():
        value = dotted_value(config, dotted)
        if value is not None and value != "auto":
            out = with_arg(out, option, option_text(value))
    return out


def is_safe_name(name: str) -> bool:
    """Usable as a directory name: letters, digits, `.`, `_`, `-`; not starting with `.` (hidden); at most 120
    chars; not the name of one of the sweep's own files (RESERVED_NAMES), which share the results directory."""
    return (isinstance(name, str) and SAFE_NAME.fullmatch(name) is not None
            and RESERVED_NAMES.fullmatch(name) is None)


def name_problem(name: JSON) -> str:
    """Why `name` cannot name an experiment, for the message that refuses it."""
    if isinstance(name, str) and SAFE_NAME.fullmatch(name) is not None:
        return f"experiment name {shown(name)} is the name of one of the sweep's own files"
    return (f"experiment name {shown(name)} is not safe as a directory name "
            f"(letters, digits, . _ -; not starting with .; at most {NAME_MAX} characters)")


def positive_int(value: JSON) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


_ATOMS = (str, int, float, bool, type(None))


def copied(value: JSON) -> JSON:
    """A deep copy of JSON-like data (dicts and lists of plain values), equal to what `copy.deepcopy` makes but
    without its memo and dispatch: every experiment built copies its config, and a sweep may hold 100,000
    (copy.deepcopy was most of the time `autotune plan` took to read one). Anything else: `copy.deepcopy`."""
    kind = type(value)
    if kind is dict:
        return {k if type(k) in _ATOMS else copy.deepcopy(k): copied(v) for k, v in value.items()}
    if kind is list:
        return [copied(v) for v in value]
    if kind in _ATOMS:
        return value
    return copy.deepcopy(value)


def canonical(data: JSON) -> str:
    """The one JSON text of `data`: what digests and value names are made from."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Experiment:
    """One run: a DeepSpeed config on `num_nodes` x `num_gpus` slots of `script`."""

    name: str
    ds_config: Mapping[str, JSON]  # a plain dict, read-only by convention: use config() for a private copy
    num_gpus: int  # slots per node
    num_nodes: int
    script: str  # absolute path
    args: tuple[str, ...] = ()
    timeout: float | None = None  # seconds
    env: Mapping[str, str] = field(default_factory=dict)
    source: str = ""  # the file it came from
    estimate: float | None = None  # seconds it is expected to run, for `autotune plan`; not part of the run
    config_flag: str = CONFIG_FLAG  # the script option the config is handed to (`--deepspeed` for HF Trainer)
    gpu_type: str | None = None  # the GPU type it must run on; None: any one type (gpu/types.py)
    gpu_mixed: bool = False  # it may span GPU types
    gpu_memory: int | None = None  # bytes it needs on each GPU, for the memory placement; not part of the run

    def __post_init__(self) -> None:
        if not is_safe_name(self.name):
            raise ValueError(name_problem(self.name))
        for key in FIELD_KEYS:
            value = getattr(self, key)
            if not positive_int(value):
                raise ValueError(f"experiment {self.name}: {key} must be a positive integer, not {shown(value)}")
        if self.gpu_type is not None and type_problem(self.gpu_type):
            raise ValueError(f"experiment {self.name}: {type_problem(self.gpu_type)}")
        if not isinstance(self.gpu_mixed, bool):
            raise ValueError(f"experiment {self.name}: gpu_mixed must be true or false, not {shown(self.gpu_mixed)}")
        if self.gpu_memory is not None and not positive_int(self.gpu_memory):
            raise ValueError(f"experiment {self.name}: gpu_memory must be a positive number of bytes, "
                             f"not {shown(self.gpu_memory)}")
        object.__setattr__(self, "ds_config", copied(dict(self.ds_config)))
        object.__setattr__(self, "args", tuple(str(a) for a in self.args))
        object.__setattr__(self, "env", {str(k): str(v) for k, v in dict(self.env).items()})
        object.__setattr__(self, "script", str(self.script))
        object.__setattr__(self, "source", str(self.source))

    def __hash__(self) -> int:
        return hash((self.name, self.digest))

    def config(self) -> JSONObject:
        """A deep copy of the ds_config, free to change."""
        return copied(dict(self.ds_config))

    @cached_property
    def digest(self) -> str:
        """sha256 of what defines the run (not its name, timeout, estimate, memory need or source): equal digests,
        equal runs. The GPU type it is pinned to, or leave to span types, defines its result: part of it when set
        (and only then, so that the digests of experiments without them stay what they were)."""
        defining = {"ds_config": self.ds_config, "num_gpus": self.num_gpus, "num_nodes": self.num_nodes,
                    "script": self.script, "args": list(self.args), "env": dict(self.env)} | self._set_fields()
        return hashlib.sha256(canonical(defining).encode()).hexdigest()

    def _set_fields(self) -> JSONObject:
        """The fields that define the run only when set: left out at their defaults, so that the digests of
        experiments made before the fields existed stay what they were."""
        return ({"config_flag": self.config_flag} if self.config_flag != CONFIG_FLAG else {}) | (
            {"gpu_type": self.gpu_type} if self.gpu_type is not None else {}) | (
            {"gpu_mixed": True} if self.gpu_mixed else {})

    def to_json(self) -> JSONObject:
        return {"name": self.name, "ds_config": self.config(), "num_gpus": self.num_gpus,
                "num_nodes": self.num_nodes, "script": self.script, "args": list(self.args),
                "timeout": self.timeout, "env": dict(self.env), "source": self.source} | (
                    {"estimate": self.estimate} if self.estimate is not None else {}) | self._set_fields() | (
                    {"gpu_memory": self.gpu_memory} if self.gpu_memory is not None else {})

    @classmethod
    def from_json(cls, data: Mapping[str, JSON]) -> Experiment:
        return cls(name=data["name"], ds_config=data["ds_config"], num_gpus=data["num_gpus"],
                   num_nodes=data["num_nodes"], script=data["script"], args=tuple(data.get("args") or ()),
                   timeout=data.get("timeout"), env=dict(data.get("env") or {}), source=data.get("source", ""),
                   estimate=data.get("estimate"), config_flag=data.get("config_flag", CONFIG_FLAG),
                   gpu_type=data.get("gpu_type"), gpu_mixed=data.get("gpu_mixed", False),
                   gpu_memory=data.get("gpu_memory"))


@dataclass(frozen=True)
class Origin:
    """Where an experiment was defined, to point a later error (it does not fit the cluster) at the line."""

    path: str
    line: int | None  # the experiment (a DeepSpeed file's name, a sweep file's space)
    num_gpus: int | None = None  # the line that sets num_gpus, when one does
    num_nodes: int | None = None
    gpu_type: int | None = None  # the line of the sweep file's gpu_type (None: none there, or --gpu-type)
    gpu_memory: int | None = None

    def line_of(self, key: str) -> int | None:
        return getattr(self, key, None) or self.line


@dataclass(frozen=True)
class SweepInputs:
    """How `load_sweep` read a sweep (paths absolute), recorded in the ledger so `resume` can read the same files
    again, from any directory, and see whether they changed."""

    specs: tuple[str, ...]
    script: str | None = None
    args: tuple[str, ...] = ()
    metric: str | None = None
    gpu_type: str | None = None  # --gpu-type
    gpu_mixed: bool = False  # --gpu-mixed

    def to_json(self) -> JSONObject:
        """The ledger's `reload` record; `args` one shell-quoted string, as the command line took it. The GPU
        options only when given: a record without them reads as it always did."""
        return {"specs": list(self.specs), "script": self.script, "args": shlex.join(self.args),
                "metric": self.metric} | ({"gpu_type": self.gpu_type} if self.gpu_type else {}) | (
                    {"gpu_mixed": True} if self.gpu_mixed else {})

    @classmethod
    def from_json(cls, data: Mapping[str, JSON]) -> SweepInputs | None:
        """The inputs a ledger recorded; None when it recorded none (a sweep made in Python)."""
        if not data.get("specs"):
            return None
        specs, script, args, metric = data["specs"], data.get("script"), data.get("args") or "", data.get("metric")
        gpu_type, gpu_mixed = data.get("gpu_type"), data.get("gpu_mixed", False)
        if not (isinstance(specs, list) and all(isinstance(p, str) for p in specs) and isinstance(args, str)
                and all(v is None or isinstance(v, str) for v in (script, metric, gpu_type))
                and isinstance(gpu_mixed, bool)):
            raise ValueError("meta 'reload' is not what `run` records")
        try:
            words = tuple(shlex.split(args))
        except ValueError:
            raise ValueError("meta 'reload' holds arguments that are not shell words") from None
        return cls(tuple(specs), script, words, metric, gpu_type, gpu_mixed)


@dataclass(frozen=True)
class Sweep:
    """Experiments to run, ranked by one metric; made by `load_sweep` or in Python."""

    name: str
    experiments: tuple[Experiment, ...]
    metric: Metric
    source: str
    origins: Mapping[str, Origin] = field(default_factory=dict)  # by experiment name
    # The `hostfile` keys of DeepSpeed experiment files: (absolute path, "file:line" that names it).
    hostfiles: tuple[tuple[str, str], ...] = ()
    inputs: SweepInputs | None = None  # the files it was read from; None: made in Python
    files: tuple[str, ...] = ()  # every file read to make it: sweep, experiment and ds_config files

    def paths(self) -> tuple[str, ...]:
        """Every file the sweep reads or runs (its files, its scripts, the hostfiles its DeepSpeed files name):
        what no output of the command may overwrite."""
        scripts = dict.fromkeys(e.script for e in self.experiments)
        return (*self.files, *scripts, *(path for path, _ in self.hostfiles))
