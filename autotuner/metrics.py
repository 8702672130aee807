"""What a run measured, and which way is better.

DeepSpeed runs
    With the `autotuning` section enabled in its config, DeepSpeed's engine times the profile steps and rank 0
    writes one JSON object to `autotuning.metric_path`, e.g.
    `{"fwd": .., "bwd": .., "step": .., "latency": .., "FLOPS_per_gpu": .., "throughput": .., "rank": 0}`.
    `throughput` (samples/s) and `FLOPS_per_gpu` are better higher, `latency` (ms per step) better lower.

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
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import UserError

METRICS_PATH_ENV = "AUTOTUNE_METRICS_PATH"

_CUSTOM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")


@dataclass(frozen=True)
class Metric:
    """A metric key in the metrics file and its direction."""

    name: str
    minimize: bool

    def better(self, a: float, b: float) -> bool:
        """True when value `a` is strictly better than value `b`."""
        return a < b if self.minimize else a > b

    @property
    def direction(self) -> str:
        """How people read it: "lower is better" or "higher is better"."""
        return "lower is better" if self.minimize else "higher is better"

    def sort_key(self, value: float) -> float:
        """Ascending order of this key puts the best value first."""
        return value if self.minimize else -value

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
            raise UserError(f"unknown metric {text!r}: use one of {', '.join(KNOWN)}, or name:min / name:max "
                            "for a metric your script writes itself", path, line)
        return known
    if direction not in ("min", "max") or not _CUSTOM_NAME.fullmatch(key):
        raise UserError(f"bad metric {text!r}: expected NAME:min or NAME:max (NAME of letters, digits, _ . -)",
                        path, line)
    metric = Metric(key, minimize=direction == "min")
    if known is not None and known.minimize != metric.minimize:
        raise UserError(f"metric {known.name} is {'minimized' if known.minimize else 'maximized'}; "
                        f"{text!r} contradicts that", path, line)
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
    """The numeric entries of a metrics file whose `metric` key is a finite number >= 0; else MetricsError."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise MetricsError("metrics file missing", path) from None
    except OSError as e:
        raise MetricsError(f"metrics file unreadable: {e.strerror or e}", path) from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        detail = "empty file" if not raw.strip() else str(e)
        raise MetricsError(f"metrics file is not JSON ({detail})", path) from None
    if not isinstance(data, dict):
        raise MetricsError(f"metrics file holds a JSON {type(data).__name__}, not an object", path)
    if metric.name not in data:
        present = ", ".join(sorted(map(str, data))) or "none"
        raise MetricsError(f"metric {metric.name!r} missing (keys: {present})", path)
    value = _finite(data[metric.name])
    if value is None or value < 0:
        shown = json.dumps(data[metric.name])
        raise MetricsError(f"metric {metric.name!r} is {shown[:60]}, not a finite number >= 0", path)
    return {str(k): v for k, v in ((k, _finite(v)) for k, v in data.items()) if v is not None}
