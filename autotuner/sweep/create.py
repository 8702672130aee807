"""A new sweep's results directory: everything that can be checked before a GPU is touched (each experiment fits
the cluster, the directory is not another sweep's), then the directory with its hostfile and ledger. Nothing
runs yet: `runner.execute` does.

`autotuner` imports this module when it is imported (the function `autotuner.prepare` shares its name), so it
imports what it needs only when called: `import autotuner` and `autotune --help` stay fast.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from .. import limits
from ..backends.cluster import check_fits
from ..backends.launch import launcher_for_this_python
from ..core.slots import devices_to_json
from ..errors import UserError, shown
from ..files import sync_directory, write_atomic
from ..ledger.store import FILENAME, Ledger, SweepMeta
from ..planning.learned import largest_usable, learned_needs, peaks_by_digest
from ..spec import Sweep
from ..spec.hostfile import HOSTFILE, format_hostfile, is_local
from ..spec.metrics import metric_named
from ..tune.inputs import is_tune_file, name_prefix, read_tune_file, read_tuning, split_command
from ..tune.search import DEFAULT_PATIENCE, DEFAULT_TRIALS, MAX_MICRO_BATCH, SearchSpec
from ..tune.tuners import search_for

if TYPE_CHECKING:
    from ..backends.cluster import Cluster
    from ..spec import Sweep
    from ..tune.search import SearchSpec

RESULTS_ROOT = Path("results")


def default_directory(sweep: Sweep, now: float | None = None) -> Path:
    """Where a sweep goes when no directory is named: results/NAME-YYYYmmdd-HHMMSS under the current directory."""
    return RESULTS_ROOT / f"{sweep.name}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}"


def prepare(sweep: Sweep, cluster: Cluster, directory: str | Path | None = None, *,
            launcher: Sequence[str] | None = None, timeout: float | None = limits.DEFAULT_TIMEOUT,
            search: SearchSpec | None = None, memory_from: str | Path | None = None) -> Path:
    """Validate, then create the results directory (default: `default_directory`) with its hostfile and ledger.

    `launcher` is the command that starts DeepSpeed's launcher (default: the one beside this Python, else
    `deepspeed`); `timeout` (seconds; None: no limit) is recorded for `resume` as the limit of experiments whose
    spec gives none. A directory that cannot be used (read-only, full, a name too long) is a UserError, and
    whatever this call made before finding out is removed again: a refused `run` leaves nothing behind.
    `search`: the experiments are proposed while it runs (`autotune tune`), by this search. `memory_from`: an
    earlier sweep whose measured peak GPU memory per config becomes the need of the experiments that state none
    (learned.py), recorded in the ledger.
    """
    check_fits(sweep, cluster)
    _check_launcher(launcher, cluster)
    learned = None
    if memory_from is not None:
        learned = learned_needs(sweep.experiments, peaks_by_digest(Path(memory_from)),
                                largest_usable(cluster.memory, cluster.devices))
    directory = Path(directory) if directory is not None else default_directory(sweep)
    made = _make_results_directory(directory, FILENAME)
    ours = [directory / name for name in (HOSTFILE, FILENAME) if not (directory / name).exists()]
    try:
        _write_sweep(sweep, cluster, directory, launcher, timeout, search, learned)
    except BaseException as e:
        for path in [*ours, *_staging(directory)]:  # what this call made; a file there before is not ours
            _unlink_quietly(path)
        _remove_directories(made)
        if isinstance(e, (OSError, sqlite3.Error)):  # read-only, full, a place that takes no files
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise UserError(f"cannot write the results directory: {reason}", directory) from None
        raise
    return directory


def prepare_tune(script: str, args: Sequence[str], cluster: Cluster, directory: str | Path | None = None, *,
                 num_gpus: int | None = None, num_nodes: int | None = None, launcher: Sequence[str] | None = None,
                 timeout: float | None = limits.DEFAULT_TIMEOUT, cwd: Path | None = None, seed: int = 0,
                 confirm: int | None = None, min_gain: float = 0.0) -> Path:
    """`autotune tune`: the user's DeepSpeed command (`script` and its `args`, which name the config), or a tune
    file (`script` an .hjson file stating them: spec/inputs.py), read, checked and recorded as a search; its
    experiments are proposed while it runs (search.py). Each experiment runs on `num_nodes` x `num_gpus` slots
    (given here, else the tune file's, else 1). `seed`: of the random and model-based tuners; `confirm`: how many of
    the best configs are run again before the winner is named (None: 2 when more than 2 succeeded; 0: none);
    `min_gain`: the fraction by which a run must beat the best so far to count as progress for early stopping."""
    where = cwd or Path.cwd()
    if is_tune_file(script):
        if args:
            raise UserError(f"a tune file takes no script arguments (its `args` holds them), not {shown(args[0])}; "
                            "autotune's own options go before it: autotune tune --slots 2 tune.hjson")
        told = read_tune_file(Path(script) if Path(script).is_absolute() else where / script)
        command, located, prefix, env = told.command, told.config, told.name, told.env
        num_gpus, num_nodes = num_gpus or told.num_gpus or 1, num_nodes or told.num_nodes or 1
    else:
        command, located, prefix, env = split_command(script, args, where), None, None, {}
        num_gpus, num_nodes = num_gpus or 1, num_nodes or 1
    tuning = read_tuning(command.config_path, num_gpus * num_nodes, located)
    template = {"script": command.script, "args": list(command.args), "num_gpus": num_gpus, "num_nodes": num_nodes,
                "source": str(command.config_path), "config_flag": command.flag, "arg_mappings": tuning.arg_mappings}
    if env:
        template["env"] = env
    spec = SearchSpec(prefix=prefix or name_prefix(command.script), template=template, base=tuning.base,
                      stages=tuning.stages, metric=tuning.metric, min_mbs=tuning.min_mbs,
                      max_mbs=tuning.max_mbs or MAX_MICRO_BATCH, measure=tuning.measure,
                      global_batch=tuning.global_batch, trials=tuning.trials, patience=tuning.patience,
                      tuner=tuning.tuner, seed=seed, confirm=confirm, min_gain=min_gain,
                      knobs={str(stage): space for stage, space in tuning.knobs.items() if space},
                      gpu_memory=_gpu_memory(cluster), facts=tuning.facts, mp=tuning.mp)
    if tuning.tuner != "gridsearch":  # a sampling tuner stops by DeepSpeed's defaults when the config sets none
        spec = replace(spec, trials=spec.trials or DEFAULT_TRIALS, patience=spec.patience or DEFAULT_PATIENCE)
    try:  # a long script or tune name, with full mode's knob tags, would make names no directory takes
        spec = spec.fitted()
    except ValueError as e:
        raise UserError(f"{e}: list shorter knob values in zero_optimization", command.config_path) from None
    first = search_for(spec).experiment(spec.stages[0], spec.min_mbs)
    sweep = Sweep(spec.prefix, (first,), metric_named(spec.metric), str(command.config_path))
    check_fits(sweep, cluster)  # every experiment of the search has the first one's shape
    return prepare(Sweep(spec.prefix, (), sweep.metric, sweep.source), cluster, directory, launcher=launcher,
                   timeout=timeout, search=spec)


def _gpu_memory(cluster: Cluster) -> int | None:
    """The memory of one GPU the memory model bounds a tune's experiments by: of the largest GPUs of the cluster
    (an experiment may land on them; smaller ones teach by running out of memory), None when a host's is not
    known (CPU slots, a type that states no size): then the model skips nothing."""
    known = [cluster.memory[host] for host in cluster.slots if host in cluster.memory]
    return max(known) if known and len(known) == len(cluster.slots) else None


def _check_launcher(launcher: Sequence[str] | None, cluster: Cluster) -> None:
    """A launcher given for a sweep that runs only here must be a command this machine has: otherwise every
    experiment would be launched, fail with exit status 127 and be retried. (On other hosts it runs there.)"""
    if not launcher or not all(is_local(h) for h in cluster.slots):
        return
    if shutil.which(launcher[0]) is None:
        raise UserError(f"--launcher: {shown(launcher[0])}: no such command on this machine")


def _make_results_directory(directory: Path, ledger_name: str) -> list[Path]:
    """Create `directory` (and missing parents) after checking it is no other sweep's; returns the directories
    this made, deepest first."""
    missing: list[Path] = []
    try:
        if (directory / ledger_name).exists():
            raise UserError(f"already holds a sweep; use `autotune resume {directory}` or pick another --results",
                            directory)
        for existing in (directory, *directory.parents):  # refused before anything is written
            if existing.exists():
                if not existing.is_dir():
                    raise UserError("is a file, not a directory" if existing == directory else
                                    f"cannot be a results directory: {existing} is a file", directory)
                break
            missing.append(existing)
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a name too long, a loop of links, a place we may not look into or write
        _remove_directories(missing)  # the parents made before a deeper one failed
        raise UserError(f"cannot create the results directory: {e.strerror or e}", directory) from None
    return missing


def _remove_directories(made: Sequence[Path]) -> None:
    """Remove directories this process made, deepest first; rmdir only, so nothing anyone put there goes."""
    for created in made:
        with contextlib.suppress(OSError):  # not there (never made, or a name too long), or not empty: not ours
            created.rmdir()


def _unlink_quietly(path: Path) -> None:
    """Clearing up after a failure: what cannot be removed (a read-only place) stays, and the failure is told."""
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def _staging(directory: Path) -> list[Path]:
    """The ledger built aside, and the files SQLite keeps beside it."""
    return [directory / (f".{FILENAME}.new" + suffix) for suffix in ("", "-wal", "-shm", "-journal")]


def _write_sweep(sweep: Sweep, cluster: Cluster, directory: Path, launcher: Sequence[str] | None,
                 timeout: float | None, search: SearchSpec | None = None,
                 learned: Mapping[str, int] | None = None) -> None:
    write_atomic(directory / HOSTFILE, format_hostfile(dict(cluster.capacity)))
    # The ledger is built aside and renamed into place complete: a runner killed in the middle leaves no
    # ledger (`run` again) or a whole one (`resume`), never one without its experiments.
    staging = f".{FILENAME}.new"
    for path in _staging(directory):  # what an earlier killed `run` left
        path.unlink(missing_ok=True)
    # What `resume` reads the spec from again, and the run's timeout (`none`: no limit) it keeps by default.
    reload = {**(sweep.inputs.to_json() if sweep.inputs else {}), "timeout": "none" if timeout is None else timeout}
    ledger = Ledger.create(directory, SweepMeta(
        name=sweep.name, metric=sweep.metric.spec, sweep_id=secrets.token_hex(4), source=sweep.source,
        created=time.time(), slots=dict(cluster.slots), capacity=dict(cluster.capacity),
        accelerator=cluster.accelerator, env=cluster.env,
        launcher=tuple(launcher or launcher_for_this_python().executable), reload=reload,
        search=search.to_json() if search is not None else None,
        gpu_types=dict(cluster.types) or None, gpu_memory=dict(cluster.memory) or None,
        devices=devices_to_json(cluster.devices) or None,
        slurm=dict(cluster.slurm) if cluster.slurm is not None else None,
        learned_memory=dict(learned) if learned else None,
    ), filename=staging)
    try:
        ledger.add_experiments(sweep.experiments, time.time())
    finally:
        ledger.close()  # the last connection: its WAL is checkpointed into the file and removed
    os.replace(directory / staging, directory / FILENAME)
    sync_directory(directory)
