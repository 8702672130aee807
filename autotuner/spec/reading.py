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
from typing import NoReturn

import hjson

from .. import limits
from ..errors import UserError, read_user_file, shown
from ..jsonvalues import JSON, JSONObject
from .metrics import Metric
from .model import CONFIG_FLAG, FLAG, NAME_MAX, UNSAFE, Experiment, Origin, positive_int

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _pairs(pairs: list[tuple[str, JSON]]) -> JSONObject:
    out: JSONObject = {}
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
        self.files: list[Path] = []  # every file read, in order: the command's inputs, which no output may be
        self.text = 0  # characters of those files: what bounds any one config, argument or value built from them

    def read(self, path: Path, size: int) -> None:
        self.files.append(path)
        self.text += size
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
    data: JSON
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


class _NotANumber(Exception):
    """JSON text whose only flaw is a number JSON has no word for (NaN, Infinity) or Python cannot hold."""

    def __init__(self, token: str) -> None:
        self.token = token


def _no_constant(name: str) -> NoReturn:
    raise _NotANumber(name)


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NotANumber(text)
    return value


def _parse(text: str, json_file: bool = False) -> JSON:
    """JSON through the C parser (DeepSpeed's files are JSON, and the pure-Python hjson parser takes seconds a
    megabyte); anything else, or anything the two might read differently, through hjson. JSON that is valid but
    for NaN or an infinite number is refused: hjson would read `NaN,` as a string, and no config means that; so
    is, in a `json_file`, a value JSON cannot take that hjson would read as a string (`_check_swallowed`)."""
    try:
        return json.loads(text, object_pairs_hook=_pairs, parse_constant=_no_constant, parse_float=_finite)
    except _NotANumber:
        raise
    except (ValueError, RecursionError) as e:
        data = hjson.loads(text, object_pairs_hook=_pairs)
        if json_file and isinstance(e, json.JSONDecodeError):  # an .hjson file's unquoted strings are its own
            _check_swallowed(text, e)
        return data


class _Swallowed(Exception):
    """A value JSON refuses that hjson read as a string to the end of its line (`"lr": +1,` -> "+1,")."""

    def __init__(self, error: json.JSONDecodeError, token: str) -> None:
        self.error, self.token = error, token


def _check_swallowed(text: str, error: json.JSONDecodeError) -> None:
    """hjson reads what JSON cannot take as a value (`+1`, `.5`, `0x10`, `1.5.3`, `-NaN`, `'a'`) as a string running to
    the end of its line, commas and brackets included: in text otherwise JSON, that is a misread, not a value.
    What hjson allows on purpose (comments, a trailing comma, unquoted keys) is not a value position, or starts
    otherwise."""
    start = error.pos
    if error.msg == "Expecting ',' delimiter":  # `0x10,` or `1.5.3,`: JSON read a number and stopped inside it
        while start > 0 and (text[start - 1].isdigit() or text[start - 1] in ".-+eE"):
            start -= 1
        if start == error.pos or text[:start].rstrip()[-1:] not in (":", "[", ","):
            return
    elif error.msg != "Expecting value" or text[error.pos:error.pos + 1] in ("", "/", "#", "]", "}"):
        return
    line_end = text.find("\n", start)
    raise _Swallowed(error, text[start:line_end if line_end >= 0 else len(text)].strip())


def _json_error(text: str) -> json.JSONDecodeError | None:
    """Where JSON's own parser stops in `text` (None: it does not, or not for its syntax)."""
    try:
        json.loads(text, parse_constant=lambda name: None)
    except json.JSONDecodeError as e:
        return e
    except (ValueError, RecursionError):
        return None
    return None


# A JSON string (skipped), or a number or one of the words JSON lacks.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|(-?(?:Infinity|NaN)|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)')


def _spot(text: str, token: str) -> tuple[int | None, int | None]:
    """(line, col) of the first `token` of a JSON text outside its strings (where `json.loads` met it)."""
    for m in _TOKENS.finditer(text):
        if m.group(1) == token:
            start = m.start(1)
            return text.count("\n", 0, start) + 1, start - (text.rfind("\n", 0, start) + 1) + 1
    return None, None


def _too_deep(data: JSON) -> bool:
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


def _lone_surrogate(data: JSON) -> bool:
    """Whether a key or string holds half of a UTF-16 pair (`"\\ud800"`): JSON's escapes can write one, and no
    file, ledger or command line can hold it (walked without recursion)."""
    stack = [data]
    while stack:
        node = stack.pop()
        items = [*node.keys(), *node.values()] if isinstance(node, dict) else node if isinstance(node, list) else ()
        for item in items:
            if isinstance(item, str):
                try:
                    item.encode()
                except UnicodeEncodeError:
                    return True
            elif isinstance(item, (dict, list)):
                stack.append(item)
    return False


# A \u escape of half a UTF-16 pair, and the whole pair (which is one character, and fine).
_SURROGATE = re.compile(r"\\[uU][dD][89a-fA-F][0-9a-fA-F]{2}")
_PAIR = re.compile(r"\\[uU][dD][89abAB][0-9a-fA-F]{2}\\[uU][dD][c-fC-F][0-9a-fA-F]{2}")


def _spot_surrogate(text: str) -> tuple[int | None, int | None]:
    """(line, col) of the first escape of half a UTF-16 pair that is not followed by its other half."""
    position = 0
    while (m := _SURROGATE.search(text, position)) is not None:
        if (pair := _PAIR.match(text, m.start())) is None:
            return text.count("\n", 0, m.start()) + 1, m.start() - (text.rfind("\n", 0, m.start()) + 1) + 1
        position = pair.end()
    return None, None


def read_source(path: Path, budget: Budget, what: str = "experiment file") -> Source:
    text = read_user_file(path, what)
    budget.read(path, len(text))
    try:
        data = _parse(text, path.suffix.lower() == ".json")
    except hjson.HjsonDecodeError as e:
        json_error = _json_error(text) if path.suffix.lower() == ".json" else None
        if json_error is not None:  # a JSON file is told where JSON's parser stopped, not hjson's (often the end)
            raise UserError(f"malformed JSON: {json_error.msg}", path, json_error.lineno, json_error.colno) from None
        raise UserError(f"malformed hjson: {e.msg}", path, e.lineno, e.colno) from None
    except _DuplicateKey as e:
        src = Source(path, text, None)
        spots = src._matches(e.key)
        line, col = spots[1] if len(spots) > 1 else (None, None)
        raise UserError(f"duplicate key {shown(e.key)}", path, line, col) from None
    except RecursionError:
        raise UserError(f"nested too deeply (the limit is {limits.DEPTH} levels)", path) from None
    except _Swallowed as e:
        raise UserError(f"malformed JSON: {e.error.msg} where {shown(e.token, 30)} stands (unquoted, it would be "
                        "read as a string to the end of the line)", path, e.error.lineno, e.error.colno) from None
    except _NotANumber as e:
        line, col = _spot(text, e.token)
        word = e.token.lstrip("-") in ("NaN", "Infinity")
        message = (f"{e.token} is not a number (JSON has no NaN or Infinity): give a finite number" if word
                   else f"number out of range ({shown(e.token, 30, quoted=False)})")
        raise UserError(message, path, line, col) from None
    except (OverflowError, ValueError):  # hjson turns 1e400 into inf, then int(inf); or a 5000-digit integer
        line, col = _bad_number(text)
        raise UserError("number out of range", path, line, col) from None
    if data == {} and "{" not in text:  # nothing but blanks and comments
        raise UserError("empty file", path)
    if _too_deep(data):
        raise UserError(f"objects and lists nest deeper than {limits.DEPTH} levels, the limit", path)
    if _lone_surrogate(data):
        line, col = _spot_surrogate(text)
        raise UserError("a string escapes half of a UTF-16 pair (\\ud800-\\udfff alone), which is no character",
                        path, line, col)
    return Source(path, text, data, budget)


def read_named(src: Source, key: str, value: str, what: str) -> Source:
    """The file `key` of `src` names (`value`, relative to `src`'s file), read as every input is: a regular file,
    bounded, counted in the sweep's budget (never /dev/zero read until memory runs out, nor a FIFO waited on). Any
    problem is one line at the key that names it."""
    try:
        return read_source(Path(abspath(value, src.path.parent)), src.budget, what)
    except UserError as e:
        where = f" (line {e.line})" if e.line is not None else ""
        raise src.error(f"{key} {shown(value)}{where}: {e.message}", key) from None


_NUMBER = re.compile(r"(?<![\w.\"'])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _bad_number(text: str) -> tuple[int | None, int | None]:
    """(line, col) of the first number that Python cannot hold (infinite as a float, or too many digits)."""
    for m in _NUMBER.finditer(text):
        token = m.group()
        if len(token) > 4000 or math.isinf(float(token)):
            start = m.start()
            return text.count("\n", 0, start) + 1, start - (text.rfind("\n", 0, start) + 1) + 1
    return None, None


def is_number(value: JSON) -> bool:
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


def script_path(src: Source, key: str, value: JSON, base: Path | None) -> str:
    if not isinstance(value, str) or not value.strip():
        raise src.error(f"{key} must be a path (a string)", key)
    script = abspath(value, base)
    if not os.path.isfile(script):
        missing = "no such file" if not os.path.exists(script) else "not a regular file"
        raise src.error(f"{key} {shown(value)}: {missing} ({shown(script, 200, quoted=False)})", key)
    return script


def string_list(src: Source, key: str, value: JSON) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise src.error(f"{key} must be a list of strings", key)
    if any("\0" in v for v in value):  # no process can be started with it
        raise src.error(f"{key}: a string holds a NUL character", key)
    return tuple(value)


_COUNT_MAX = {"num_gpus": limits.SLOTS_PER_HOST, "num_nodes": limits.SLOTS}


def positive_count(src: Source, key: str, value: JSON, after: int | None = None, what: str | None = None) -> int:
    if not positive_int(value) or value > _COUNT_MAX[key]:
        raise src.error(f"{what or key} must be a positive integer, not {shown(value)} (the limit is "
                        f"{_COUNT_MAX[key]})", key, after)
    return value


def script_option(src: Source, label: str, value: JSON, key: str, after: int | None = None) -> str:
    """A script option, as `--name`: what a sweep or a tune may hand values to. Errors are located at `key`."""
    if not isinstance(value, str) or FLAG.fullmatch(value) is None:
        raise src.error(f"{label}: {shown(value)} is not a script option (--name: letters, digits, _ . -)", key,
                        after)
    return value


# DeepSpeed's own config options: `--deepspeed_config PATH`, and `--deepspeed`, its on/off switch (or a
# Trainer's config path). A value handed to either would be taken for the config, or break the switch.
CONFIG_OPTIONS = (CONFIG_FLAG, "--deepspeed")


def arg_mappings(src: Source, value: JSON, config_flag: str) -> dict[str, str]:
    """{dotted ds_config key: script option} (DeepSpeed's `arg_mappings`): each experiment's value of the key is
    also handed to the script as that option. One set of rules for sweep files and `tune`: never onto the option
    the config itself is handed to (nor DeepSpeed's other config option), never two keys onto one option (the
    script would take one of the values, the config say another)."""
    if not isinstance(value, dict):
        raise src.error("arg_mappings must be an object of dotted ds_config keys to script options",
                        "arg_mappings")
    line = src.line("arg_mappings")
    mappings: dict[str, str] = {}
    for key, option in value.items():
        if not key or not all(key.split(".")) or key.startswith("-") or key != key.strip():
            raise src.error(f"arg_mappings: {shown(key)} is not a dotted ds_config key", key, line)
        option = script_option(src, f"arg_mappings {shown(key)}", option, key, line)
        if option == config_flag or option in CONFIG_OPTIONS:
            whose = "the option the config itself is handed to" if option == config_flag else \
                "DeepSpeed's own config option"
            raise src.error(f"arg_mappings: {key} is handed to {option}, {whose}: map it to the script's own "
                            "option for that value", key, line)
        taken = next((k for k, o in mappings.items() if o == option), None)
        if taken is not None:
            raise src.error(f"arg_mappings hands both {taken} and {key} to {option}: the script takes one value, "
                            "the config would say another", key, line)
        mappings[key] = option
    return mappings


def ds_config_of(src: Source, value: JSON) -> JSONObject:
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and value.strip():
        path = Path(abspath(value, src.path.parent))
        if not path.exists():
            raise src.error(f"ds_config {shown(value)}: no such file ({shown(str(path), 200, quoted=False)})",
                            "ds_config")
        if os.path.samefile(path, src.path):  # its keys (script, space...) would be taken for DeepSpeed's
            raise src.error(f"ds_config {shown(value)} names this file itself: name the DeepSpeed config",
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




def env_of(src: Source, value: JSON) -> dict[str, str]:
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
    values: list[JSON] = [e.ds_config.get(k) for k in _BATCH]
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
