"""A sweep read from its input paths: sweep files, DeepSpeed experiment files and directories of them, each
file read by the reader its keys call for (grid.py or dsfiles.py), the experiments checked across files (one
name each, one metric, a launch that fits) and gathered into one Sweep."""
from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

from .. import limits
from ..errors import UserError, shown
from ..gpu.types import type_problem
from .dsfiles import load_ds_exp
from .grid import experiment_name, load_sweep_file
from .launchable import launch_problem, may_be_too_long
from .metrics import THROUGHPUT, Metric, metric_named
from .model import Experiment, Origin, Sweep, SweepInputs
from .reading import Budget, Defaults, Loaded, abspath, is_number, read_source, stem_name

_SWEEP_ONLY = {"space", "script", "args", "metric", "timeout", "env", "gpu_type", "gpu_mixed", "gpu_memory"}


def _load_file(path: Path, defaults: Defaults, budget: Budget) -> Loaded:
    src = read_source(path, budget)
    if not isinstance(src.data, dict):
        raise UserError("expected an object (a sweep file or a DeepSpeed experiment file)", path, 1)
    if _SWEEP_ONLY & src.data.keys():
        return load_sweep_file(src, src.data, defaults)
    return load_ds_exp(src, src.data, defaults)


def _files(path: Path, budget: Budget) -> list[Path]:
    try:
        return _files_at(path, budget)
    except OSError as e:  # a name too long, a loop of links, a directory we may not read
        raise UserError(f"cannot read: {e.strerror or e}", path) from None


def _files_at(path: Path, budget: Budget) -> list[Path]:
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
               metric: str | None = None, timeout: float | None = None, gpu_type: str | None = None,
               gpu_mixed: bool = False) -> Sweep:
    """The experiments of sweep files, DeepSpeed experiment files and directories of them, in order.

    `script` (relative to the current directory), `args` and `timeout` are defaults for what the files leave
    out. `metric` is different: given (an explicit --metric), it wins over the files' `metric`, which would
    otherwise rank the sweep by something else than the user just asked for; so does `gpu_type` (--gpu-type)
    over their `gpu_type`, and `gpu_mixed` (--gpu-mixed) lets every experiment span GPU types. UserError,
    naming the file and line, for anything wrong.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    if not paths:
        raise UserError("no experiment files given")
    if script is not None:
        cli_script = abspath(script)
        if not os.path.isfile(cli_script):
            raise UserError(f"--script: no such file ({shown(cli_script, 200, quoted=False)})",
                            shown(script, 200, quoted=False))
        script = cli_script
    if timeout is not None and (not is_number(timeout) or not math.isfinite(timeout) or timeout <= 0):
        raise UserError(f"--timeout must be a positive number of seconds, not {shown(timeout)}")
    chosen = metric_named(metric) if metric is not None else None  # "" is a mistake, not "the default"
    if gpu_type is not None and type_problem(gpu_type):
        raise UserError(f"--gpu-type: {type_problem(gpu_type)}")
    defaults = Defaults(script, tuple(str(a) for a in args), None if timeout is None else float(timeout), gpu_type,
                        gpu_mixed)

    budget = Budget()
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
                problem = launch_problem(experiment) if may_be_too_long(budget.text) else None
                if problem is not None:
                    raise UserError(f"experiment {experiment.name}: {problem}", path, line)
                experiments.append(experiment)
                if loaded.origin is not None:
                    origins[experiment.name] = loaded.origin
        names.append(loaded.name if given.is_file() else stem_name(given))
    name = experiment_name(names[0], names[1:3]) if len(names) > 1 else names[0]
    if len(names) > 3:
        name = experiment_name(name, [f"and{len(names) - 3}more"])
    inputs = SweepInputs(tuple(str(Path(p).resolve()) for p in paths), script, defaults.args, metric, gpu_type,
                         gpu_mixed)
    return Sweep(name=name, experiments=tuple(experiments), metric=chosen or (asked[0] if asked else THROUGHPUT),
                 source=", ".join(str(p) for p in paths), origins=origins, hostfiles=tuple(hostfiles), inputs=inputs,
                 files=tuple(str(p) for p in budget.files))
