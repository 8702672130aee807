"""What a run measured, and which way is better.

DeepSpeed runs
    With the `autotuning` section enabled in its config, DeepSpeed's engine times the profile steps and rank 0
    writes one JSON object to `autotuning.metric_path`, e.g.
    `{"fwd": .., "bwd": .., "step": .., "latency": .., "FLOPS_per_gpu": .., "throughput": .., "rank": 0}`.
    `throughput` (samples/s) and `FLOPS_per_gpu` (FLOP/s) are better higher, `latency` (microseconds per step, as
    DeepSpeed's engine computes it) better lower.

Scripts that are not DeepSpeed (the contract)
    The runner sets the environment variable `AUTOTUNE_METRICS_PATH` (`METRICS_PATH_ENV`) to an absolute path
    in the experiment's result directory. Before exiting with status 0, the script writes a JSON object to
    that path, holding at least the sweep's metric key with a finite number >= 0, for example
    `{"tokens_per_s": 1834.2}`. Other numeric entries are kept as extra measurements; entries that are not
    numbers are ignored. The sweep names such a metric with its direction: `--metric tokens_per_s:max` or
    `metric: val_loss:min`. Only one process (rank 0) should write the file, and it should write it whole
    (write a temporary file in the same directory and rename it), since a half-written file is a failure.
    A run succeeds only when it exits 0 and the file is valid; nothing printed to stdout or stderr counts.
"""
from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError, shown

METRICS_PATH_ENV = "AUTOTUNE_METRICS_PATH"

_CUSTOM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")

# What a run may hand us is bounded: DeepSpeed writes one flat object of a few hundred bytes. A bigger or deeper
# file is a broken script, and reading it whole (or recursing through it) must not take the runner down.
MAX_BYTES = 1024 * 1024
MISSING = "metrics file missing"  # the run wrote none: `outcome.judge` says why that may be
MAX_DEPTH = 32
MAX_NAME = 100  # characters of a metric's name the report shows; a longer key is left out
MAX_KEPT = 256  # numbers kept of one metrics file, the sweep's metric among them (each a report column)


@dataclass(frozen=True)
class Metric:
    """A metric key in the metrics file and its direction."""

    name: str
    minimize: bool

    @property
    def direction(self) -> str:
        """How people read it: "lower is better" or "higher is better"."""
        return "lower is better" if self.minimize else "higher is better"

    def sort_key(self, value: float) -> float:
        """Ascending order of this key puts the best value first."""
        return value if self.minimize else -value

    def better(self, value: float, than: float) -> bool:
        """Whether `value` beats `than` (ties do not)."""
        return value < than if self.minimize else value > than

    @property
    def spec(self) -> str:
        """The text `metric_named` reads back into this metric (`throughput`, or `loss:min` for custom ones)."""
        if KNOWN.get(self.name) == self:
            return self.name
        return f"{self.name}:{'min' if self.minimize else 'max'}"

    def __str__(self) -> str:
        return self.spec


THROUGHPUT = Metric("throughput", minimize=False)
LATENCY = Metric("latency", minimize=True)
FLOPS_PER_GPU = Metric("FLOPS_per_gpu", minimize=False)

KNOWN: dict[str, Metric] = {m.name: m for m in (THROUGHPUT, LATENCY, FLOPS_PER_GPU)}
# DeepSpeed's autotuning config calls the FLOPS metric "flops"; its engine writes the key FLOPS_per_gpu.
_ALIASES = {"flops": FLOPS_PER_GPU}


PEAK_MEMORY = "peak_memory"
"""A metrics key a script may write: the most it held on one GPU, in bytes (e.g. torch.cuda.max_memory_reserved()).
Where the runner measured nothing (a run on another host, NVML blind to its processes) it is the attempt's peak."""


def reported_peak(metrics: Mapping[str, float] | None) -> int | None:
    """The script's own peak GPU memory figure (PEAK_MEMORY) in whole bytes; None where it reported none."""
    value = (metrics or {}).get(PEAK_MEMORY)
    return int(value) if value is not None and 1 <= value < 1 << 60 else None  # what an SQLite integer holds


# From here on a value is written with an exponent: grouped digits past a float's ~17 significant ones would be noise
# (1e23 reads 99,999,999,999,999,991,611,392), and a script's step may carry any finite value (1e308: 309 digits).
_EXPONENT = 1e21


def format_value(value: float | None) -> str:
    """A metric value as people read it in every view: 4 significant digits, thousands grouped (past _EXPONENT
    with an exponent: 1.5e+308); "-" for none."""
    if value is None:
        return "-"
    return f"{value:,.4g}" if abs(value) < 1e4 or abs(value) >= _EXPONENT else f"{value:,.0f}"


_SI = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"))


def format_compact(value: float | None) -> str:
    """`format_value`, but a million and more with an SI prefix (FLOPS: `1.234T`): for narrow table cells."""
    if value is None or not 1e6 <= abs(value) < _EXPONENT:
        return format_value(value)
    size, chosen = abs(value), _SI[-1]
    for pair in _SI:  # a plain loop: a generator per cell was a tenth of a 100,000-row report
        if size >= pair[0]:
            chosen = pair
            break
    return f"{value / chosen[0]:.4g}{chosen[1]}"


# The units DeepSpeed's engine writes its metrics in (runtime/engine.py `_autotuning_exit`: its timers' means are
# milliseconds times 1000, so latency is in microseconds, and throughput and FLOPS divide by it times 1e6).
UNITS = {"throughput": "samples/s", "latency": "\u00b5s", "FLOPS_per_gpu": "FLOP/s per GPU"}


def metric_named(name: str, *, path: str | Path | None = None, line: int | None = None) -> Metric:
    """`throughput`, `latency`, `FLOPS_per_gpu` (or `flops`), or a custom `name:min` / `name:max`.

    A UserError (located at `path`:`line` when given) for anything else.
    """
    text = str(name).strip()
    key, sep, direction = text.rpartition(":")
    if not sep:
        key, direction = text, ""
    known = KNOWN.get(key) or _ALIASES.get(key)
    if not sep:
        if known is None:
            raise UserError(f"unknown metric {shown(text)}: use one of {', '.join(KNOWN)}, or name:min / name:max "
                            "for a metric your script writes itself", path, line)
        return known
    if direction not in ("min", "max") or not _CUSTOM_NAME.fullmatch(key):
        raise UserError(f"bad metric {shown(text)}: expected NAME:min or NAME:max (NAME of letters, digits, _ . -)",
                        path, line)
    metric = Metric(key, minimize=direction == "min")
    if known is not None and known.minimize != metric.minimize:
        raise UserError(f"metric {known.name} is {'minimized' if known.minimize else 'maximized'}; "
                        f"{shown(text)} contradicts that", path, line)
    return known or metric


class MetricsError(Exception):
    """A metrics file that cannot be used; str() is the reason, naming the file."""

    def __init__(self, reason: str, path: str | Path | None = None) -> None:
        self.reason = reason
        self.path = None if path is None else str(path)
        super().__init__(f"{path}: {reason}" if path is not None else reason)


def _finite(value: object) -> float | None:
    """The value as a float when it is a finite JSON number (not a bool), else None."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def read_metrics(path: str | Path, metric: Metric) -> dict[str, float]:
    """The numeric entries of a metrics file whose `metric` key is a finite number >= 0; else MetricsError.

    The only reader of metrics files. Bounded: at most MAX_BYTES are read and at most MAX_DEPTH levels of
    nesting are parsed, and only a regular file is opened for reading (a FIFO would block, a device never end).
    """
    raw = _read_bounded(Path(path))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MetricsError(f"metrics file is not JSON (not UTF-8 text: byte {e.start})", path) from None
    depth = _nesting(text)
    if depth > MAX_DEPTH:
        raise MetricsError(f"metrics file nests {depth} levels deep (at most {MAX_DEPTH} are read)", path)
    try:
        data = json.loads(text)
    except ValueError as e:
        detail = "empty file" if not text.strip() else str(e)[:200]
        raise MetricsError(f"metrics file is not JSON ({detail})", path) from None
    if not isinstance(data, dict):
        raise MetricsError(f"metrics file holds a JSON {type(data).__name__}, not an object", path)
    if metric.name not in data:
        present = ", ".join(sorted(map(str, data)))
        present = (present[:200] + " ...") if len(present) > 200 else present or "none"
        raise MetricsError(f"metric {metric.name!r} missing (keys: {present})", path)
    value = _finite(data[metric.name])
    if value is None or value < 0:
        raise MetricsError(f"metric {metric.name!r} is {_shown(data[metric.name])}, not a finite number >= 0", path)
    kept: dict[str, float] = {}
    for key, number in ((k, _finite(v)) for k, v in data.items()):  # in the file's order, the sweep's metric kept
        if number is not None and (key == metric.name or (len(kept) < MAX_KEPT - 1 and _usable_name(key))):
            kept[key] = number
    return kept


def _usable_name(key: str) -> bool:
    """Whether a metrics key can head a column of the report: printable text of at most MAX_NAME characters that
    UTF-8 can write (a script's `"\\ud800"` key made every table of the report fail with a traceback, a key of a
    million characters made each row a megabyte)."""
    if not key or len(key) > MAX_NAME or not key.isprintable():
        return False
    try:
        key.encode()
    except UnicodeEncodeError:
        return False
    return True


def _read_bounded(path: Path) -> bytes:
    """At most MAX_BYTES of a regular file; MetricsError for anything else (missing, a directory, a FIFO...)."""
    try:
        # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise MetricsError(MISSING, path) from None
    except OSError as e:
        raise MetricsError(f"metrics file unreadable: {e.strerror or e}", path) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket"
            raise MetricsError(f"metrics file unreadable: {kind}, not a regular file", path)
        chunks, size = [], 0
        while size <= MAX_BYTES:
            chunk = os.read(fd, MAX_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise MetricsError(f"metrics file unreadable: {e.strerror or e}", path) from None
    finally:
        os.close(fd)
    if size > MAX_BYTES:
        raise MetricsError(f"metrics file is larger than {MAX_BYTES // (1024 * 1024)} MiB", path)
    return b"".join(chunks)


_STRINGS_AND_BRACKETS = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]')


def _nesting(text: str) -> int:
    """How deeply arrays and objects nest in JSON `text` (strings skipped), counted without recursion."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return 0  # cannot be deeper than that: the usual case costs two counts
    depth = deepest = 0
    for match in _STRINGS_AND_BRACKETS.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            deepest = max(deepest, depth)
        elif token in ("]", "}"):
            depth -= 1
    return deepest


def _shown(value: object) -> str:
    """A short rendering of a JSON value for a message (a huge number or string is cut)."""
    try:
        text = json.dumps(value)
    except (ValueError, OverflowError):
        text = type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."
