"""Sweeps and their experiments, read from hjson: DeepSpeed's own experiment files, or sweep files with a space.

`load.load_sweep` reads them: each input path is a file or a directory of `*.json` / `*.hjson` files (read in
name order). A file is a sweep file (grid.py) when it has one of the keys `space`, `script`, `args`, `metric`,
`timeout`, `env`, `gpu_type`, `gpu_mixed`, `gpu_memory`; otherwise it is a DeepSpeed experiment file (dsfiles.py).
Every input is bounded (limits.py) before anything is built from it, and every mistake is a UserError at its file
and line (reading.py). model.py holds what is read into: Experiment and Sweep, which this package's face names
(the readers of a ledger need them, not the hjson readers: `autotune report` does not import those).
"""
from __future__ import annotations

from .model import (
    ABBREVIATIONS,
    FIELD_KEYS,
    NAME_MAX,
    RESERVED_NAMES,
    Experiment,
    Origin,
    Sweep,
    SweepInputs,
    is_safe_name,
)

__all__ = ["ABBREVIATIONS", "FIELD_KEYS", "NAME_MAX", "RESERVED_NAMES", "Experiment", "Origin", "Sweep", "SweepInputs",
           "is_safe_name"]
