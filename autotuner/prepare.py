"""A new sweep's results directory: everything that can be checked before a GPU is touched (each experiment fits
the cluster, the directory is not another sweep's), then the directory with its hostfile and ledger. Nothing
runs yet: `runner.execute` does.

`autotuner` imports this module when it is imported (the function `autotuner.prepare` shares its name), so it
imports what it needs only when called: `import autotuner` and `autotune --help` stay fast.
"""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from . import limits
from .errors import UserError, shown

if TYPE_CHECKING:
    from .cluster import Cluster
    from .ledger import Ledger
    from .search import SearchSpec
    from .spec import Sweep
    from .tunerequest import TuneRequest

HOSTFILE = "hostfile"  # the sweep's own hostfile, beside its ledger: what DeepSpeed's launcher is given
RESULTS_ROOT = Path("results")


def default_directory(sweep: Sweep, now: float | None = None) -> Path:
    """Where a sweep goes when no directory is named: results/NAME-YYYYmmdd-HHMMSS under the current directory."""
    return RESULTS_ROOT / f"{sweep.name}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}"


def prepare(sweep: Sweep, cluster: Cluster, directory: str | Path | None = None, *,
            launcher: Sequence[str] | None = None, timeout: float | None = limits.DEFAULT_TIMEOUT,
            search: SearchSpec | None = None, memory_from: str | Path | Mapping[str, int] | None = None) -> Path:
    """Validate, then create the results directory (default: `default_directory`) with its hostfile and ledger.

    `launcher` is the command that starts DeepSpeed's launcher (default: the one beside this Python, else
    `deepspeed`); `timeout` (seconds; None: no limit) is recorded for `resume` as the limit of experiments whose
    spec gives none. A directory that cannot be used (read-only, full, a name too long) is a UserError, and
    whatever this call made before finding out is removed again: a refused `run` leaves nothing behind.
    `search`: the experiments are proposed while it runs (`autotune tune`), by this search. `memory_from`: an
    earlier sweep whose measured peak GPU memory per config becomes the need of the experiments that state none
    (learned.py), recorded in the ledger; or its peaks read already (`measured_peaks`, by config digest), for a
    caller that reads them before it asks a cluster for anything.
    """
    import sqlite3  # here, not at the top: `import autotuner` imports this module and must stay cheap

    from .cluster import check_fits
    from .ledger import FILENAME

    check_fits(sweep, cluster)
    _check_launcher(launcher, cluster)
    learned = None
    if memory_from is not None:
        from .learned import largest_usable, learned_needs, peaks_by_digest

        peaks = memory_from if isinstance(memory_from, Mapping) else peaks_by_digest(Path(memory_from))
        learned = learned_needs(sweep.experiments, peaks, largest_usable(cluster.memory, cluster.devices))
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


def prepare_tune(script: str | TuneRequest, args: Sequence[str], cluster: Cluster,
                 directory: str | Path | None = None, *, num_gpus: int | None = None, num_nodes: int | None = None,
                 launcher: Sequence[str] | None = None, timeout: float | None = limits.DEFAULT_TIMEOUT,
                 cwd: Path | None = None, seed: int = 0, confirm: int | None = None, min_gain: float = 0.0) -> Path:
    """`autotune tune`: the user's DeepSpeed command (`script` and its `args`), or a tune file, read and checked
    (`tunerequest.read_tune`, which the other arguments but `launcher` and `timeout` go to; or `script` a
    request read already, for a caller that reads before it asks a cluster for anything), then checked against
    `cluster` and recorded as a search; its experiments are proposed while it runs (search.py)."""
    from .tunerequest import for_cluster, read_tune

    request = script if not isinstance(script, str) else read_tune(
        script, args, num_gpus=num_gpus, num_nodes=num_nodes, cwd=cwd, seed=seed, confirm=confirm,
        min_gain=min_gain)
    sweep, spec = for_cluster(request, cluster)
    return prepare(sweep, cluster, directory, launcher=launcher, timeout=timeout, search=spec)


def open_sweep(directory: str | Path) -> Ledger:
    """The ledger of the sweep prepared in `directory`; a UserError when there is none."""
    from .ledger import Ledger

    try:
        return Ledger.open(Path(directory))
    except FileNotFoundError:
        raise UserError("no sweep here (no ledger.sqlite)", directory) from None


def _check_launcher(launcher: Sequence[str] | None, cluster: Cluster) -> None:
    """A launcher given for a sweep that runs only here must be a command this machine has: otherwise every
    experiment would be launched, fail with exit status 127 and be retried. (On other hosts it runs there.)"""
    import shutil

    from .hostfile import is_local

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
    from .ledger import FILENAME

    return [directory / (f".{FILENAME}.new" + suffix) for suffix in ("", "-wal", "-shm", "-journal")]


def _write_sweep(sweep: Sweep, cluster: Cluster, directory: Path, launcher: Sequence[str] | None,
                 timeout: float | None, search: SearchSpec | None = None,
                 learned: Mapping[str, int] | None = None) -> None:
    import secrets

    from .core.resources import devices_to_json
    from .files import sync_directory, write_atomic
    from .hostfile import format_hostfile
    from .launch import launcher_for_this_python
    from .ledger import FILENAME, Ledger, SweepMeta

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
