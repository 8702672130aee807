"""A new sweep's results directory: everything that can be checked before a GPU is touched (each experiment fits
the cluster, the directory is not another sweep's), then the directory with its hostfile and ledger. Nothing
runs yet: `sweep.run.execute` does. A tune's request (tune/request.py) is checked against its cluster here
(`for_cluster`), where the cluster's checks are.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import shutil
import sqlite3
import tempfile
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
from ..limits import memory
from ..planning.learned import check_learned, largest_usable, learned_needs, peaks_by_digest
from ..spec import Sweep
from ..spec.hostfile import HOSTFILE, format_hostfile, is_local
from ..spec.launchable import launch_problem
from ..spec.metrics import metric_named
from ..tune.memory_model import Bound, Facts, budget
from ..tune.request import TuneRequest, read_tune
from ..tune.space import SearchSpec
from ..tune.tuners import search_for

if TYPE_CHECKING:
    from ..backends.cluster import Cluster

log = logging.getLogger(__name__)

RESULTS_ROOT = Path("results")
PATH_SHOWN = 200  # characters of a resolved path a message names: enough for a deep tree, never a screenful


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
    check_fits(sweep, cluster)
    launcher = _launcher_path(launcher)
    _check_launcher(launcher, cluster)
    learned = None
    if memory_from is not None:
        peaks = memory_from if isinstance(memory_from, Mapping) else peaks_by_digest(Path(memory_from))
        learned = learned_needs(sweep.experiments, peaks, largest_usable(cluster.memory, cluster.devices))
        check_learned(sweep.experiments, learned, getattr(peaks, "source", None), cluster.slots,
                      cluster.host_types, cluster.memory, cluster.devices)
    directory = Path(directory) if directory is not None else default_directory(sweep)
    made = _make_results_directory(directory, FILENAME)
    ours = [directory / name for name in (HOSTFILE, FILENAME, *(FILENAME + s for s in SQLITE_FILES))
            if not (directory / name).exists()]
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
    _made[directory.resolve()] = (ours, made)
    return directory


SQLITE_FILES = ("-wal", "-shm", "-journal")  # what SQLite keeps beside a database
_made: dict[Path, tuple[list[Path], list[Path]]] = {}  # by each `prepare` of this process: (files, directories)


def withdraw(directory: Path) -> None:
    """A new sweep refused before it first ran (its cluster cannot run it, found before the lock): what this
    process's `prepare` made for it removed again, so that a refused `run` leaves nothing behind. Only those
    files and directories: a file or directory that was there before stays."""
    files, made = _made.pop(Path(directory).resolve(), ([], []))
    for path in files:
        _unlink_quietly(path)
    _remove_directories(made)


def prepare_tune(script: str | TuneRequest, args: Sequence[str], cluster: Cluster,
                 directory: str | Path | None = None, *, num_gpus: int | None = None, num_nodes: int | None = None,
                 launcher: Sequence[str] | None = None, timeout: float | None = limits.DEFAULT_TIMEOUT,
                 cwd: Path | None = None, seed: int = 0, confirm: int | None = None, min_gain: float = 0.0) -> Path:
    """`autotune tune`: the user's DeepSpeed command (`script` and its `args`), or a tune file, read and checked
    (`tune.request.read_tune`, which the other arguments but `launcher` and `timeout` go to; or `script` a
    request read already, for a caller that reads before it asks a cluster for anything), then checked against
    `cluster` and recorded as a search; its experiments are proposed while it runs (search.py)."""
    request = script if not isinstance(script, str) else read_tune(
        script, args, num_gpus=num_gpus, num_nodes=num_nodes, cwd=cwd, seed=seed, confirm=confirm,
        min_gain=min_gain)
    sweep, spec = for_cluster(request, cluster)
    return prepare(sweep, cluster, directory, launcher=launcher, timeout=timeout, search=spec)


def for_cluster(request: TuneRequest, cluster: Cluster) -> tuple[Sweep, SearchSpec]:
    """The request on `cluster`: its search bounded by the GPUs' memory, and the (empty) sweep it fills. Refused
    when its experiments cannot fit the cluster's slots, or when the memory model says that no stage tuned fits
    any of its GPUs: nothing would run, and the user learns it now rather than from "no best configuration"."""
    spec = replace(request.spec, gpu_memory=_gpu_memory(cluster), host_memory=_host_memory(cluster))
    firsts = [search_for(s).experiment(s.stages[0], s.min_mbs) for s in spec.world_specs()]  # one per world size
    for first in firsts:
        problem = launch_problem(first)  # every experiment of the search is the first one's config give or take knobs
        if problem is not None:
            raise UserError(f"experiment {first.name}: {problem}", request.config)
    sweep = Sweep(spec.prefix, tuple(firsts), metric_named(spec.metric), str(request.config))
    check_fits(sweep, cluster)  # every experiment of the search has the first one's shape (of its world size)
    _check_nvme(request, spec, cluster)
    if len(spec.levels()) > 1 and spec.host_memory is None:
        log.warning("the RAM of %s is not known: offload, if the search comes to it, is not bounded by it",
                    ", ".join(h for h in cluster.slots if not is_local(h)) or "the nodes")
    if spec.facts is not None and spec.gpu_memory is not None:
        facts = Facts.from_json(spec.facts)
        if not any(b.fits for level in spec.levels() for b in level.bounds(facts).values()):
            _check_some_stage_fits(request, spec.bounds(facts), spec)
    return Sweep(spec.prefix, (), sweep.metric, sweep.source), spec


def _check_nvme(request: TuneRequest, spec: SearchSpec, cluster: Cluster) -> None:
    """An NVMe offload path the config names must be a directory this machine can create files in when it runs
    experiments here (one located line otherwise); on other nodes the run itself finds out, said once. A relative
    path is looked up where DeepSpeed's engine will look it up: the runs' own directory, their script's (the
    config goes to them unchanged, as the best config goes to the user)."""
    zero = spec.base.get("zero_optimization")
    runs_in = Path(str(spec.template["script"])).parent
    for key in ("offload_optimizer", "offload_param"):
        section = zero.get(key) if isinstance(zero, Mapping) else None
        path = section.get("nvme_path") if isinstance(section, Mapping) and section.get("device") == "nvme" else None
        if not isinstance(path, str):
            continue
        if any(is_local(h) for h in cluster.slots):
            problem = _unwritable(runs_in / path)
            if problem is not None:
                where = shown(str(runs_in / path), PATH_SHOWN, quoted=False)
                relative = "" if os.path.isabs(path) else f" ({where}: runs start in the script's directory)"
                hint = "; DeepSpeed expands neither ~ nor $VARIABLES" if path.startswith(("~", "$")) else ""
                raise UserError(f"zero_optimization.{key}.nvme_path {shown(path)}{relative} {problem}: offloading "
                                f"to NVMe needs a directory to write to{hint}", request.config,
                                request.nvme_lines.get(key))
        if any(not is_local(h) for h in cluster.slots):
            log.warning("zero_optimization.%s.nvme_path %s is checked by each run on the other nodes", key, path)


def _unwritable(directory: Path) -> str | None:
    """Why runs could not write their offloaded states in `directory` (None: they can), found by creating a file
    there and removing it: permission bits say yes to root where the file system says no (/proc, /sys, a
    read-only mount)."""
    try:
        if not directory.is_dir():
            return "is not a directory" if directory.exists() else "does not exist"
    except OSError as e:  # a name too long, a directory that may not be looked into
        return f"cannot be looked up ({e.strerror or e})"
    try:
        fd, made = tempfile.mkstemp(prefix=".autotune-nvme-check-", dir=directory)
    except OSError as e:  # /proc answers "no such file" to a create in it: said without that word
        why = f" ({e.strerror})" if e.strerror and e.errno != errno.ENOENT else ""
        return f"is a directory this user cannot create files in{why}"
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(made)
    return None


def _check_some_stage_fits(request: TuneRequest, bounds: dict[int, Bound], spec: SearchSpec) -> None:
    """`run` refuses an experiment no GPU could hold; a tune whose every stage the model rules out, at every
    offload level too, is refused the same way, at the config's line that states the model's facts. The line
    says what is short: the GPUs (model states, or activations at the smallest micro-batch size), or, where a
    GPU would hold an offloaded stage, the node's RAM it offloads to, with advice for that."""
    if not bounds or any(b.fits for b in bounds.values()):
        return
    facts = Facts.from_json(spec.facts or {})
    room = budget(spec.gpu_memory or 0)
    every = [b for level in spec.levels() for b in level.bounds(facts).values()]
    activations = (facts.activation or 0) * spec.min_mbs
    stages = ", ".join(str(s) for s in spec.stages)
    offload = ", even with offload" if len(spec.levels()) > 1 else ""
    said = f"the memory model says this model ({facts.num_params:,} parameters) "
    ram_only = [b for b in every if b.host_short and b.states + activations <= room]
    if ram_only:  # a GPU would hold it offloaded: the node's RAM is what is short
        least = min(ram_only, key=lambda b: b.host)
        raise UserError(f"{said}fits no node of the cluster at any ZeRO stage tuned ({stages}){offload}: a GPU of "
                        f"{memory(spec.gpu_memory or 0)} would hold stage {least.stage} offloaded, but it needs "
                        f"{memory(least.host)} of a node's RAM, more than a node of {memory(spec.host_memory or 0)} "
                        "holds beside its headroom; offload to NVMe (device nvme, with its nvme_path), or tune on "
                        "nodes with more RAM", request.config, request.facts_line)
    short = [b for b in every if b.host_short]
    node = (f"; offloaded, it needs at least {memory(min(b.host for b in short))} of a node's RAM of "
            f"{memory(spec.host_memory or 0)}") if short else ""
    least = min(every, key=lambda b: b.states)
    why = (f"stage {least.stage} needs {memory(least.states)} for its model states alone" if least.states >= room
           else f"stage {least.stage} leaves {memory(room - least.states)} for activations, less than "
                f"micro-batch size {spec.min_mbs} needs ({memory(activations)})")
    raise UserError(f"{said}fits no GPU of the cluster at any ZeRO stage tuned ({stages}){offload}: a GPU of "
                    f"{memory(spec.gpu_memory or 0)} leaves {memory(room)} beside the headroom, and {why}{node}; tune "
                    "on larger GPUs, or more of them per experiment (--num_gpus)",
                    request.config, request.facts_line)


def _host_memory(cluster: Cluster) -> int | None:
    """The RAM of a node the experiments run on, which bounds what they offload: this machine's (its physical
    memory) when every host is this one; None when a host is another (a hostfile states no RAM): then offload
    is not bounded by it."""
    if not cluster.slots or not all(is_local(h) for h in cluster.slots):
        return None
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _gpu_memory(cluster: Cluster) -> int | None:
    """The memory of one GPU the memory model bounds a tune's experiments by: of the largest GPUs of the cluster
    (an experiment may land on them; smaller ones teach by running out of memory), None when a host's is not
    known (CPU slots, a type that states no size): then the model skips nothing."""
    known = [cluster.memory[host] for host in cluster.slots if host in cluster.memory]
    return max(known) if known and len(known) == len(cluster.slots) else None


def _launcher_path(launcher: Sequence[str] | None) -> Sequence[str] | None:
    """A launcher named by a relative path (`./launch.sh`, `bin/launch`) is taken from the current directory, as
    any path given is: the runs start in their script's directory, where it would name another file (or none,
    each run failing with exit status 127). A bare command name is left to PATH."""
    if launcher and "/" in launcher[0] and not os.path.isabs(launcher[0]):
        return [os.path.abspath(launcher[0]), *launcher[1:]]
    return launcher


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


def _check_stray_hostfile(path: Path, ours: str) -> None:
    """A hostfile in a directory with no ledger yet is ours only when it says what this sweep would write (a
    `run` killed before its ledger was in place left it); anything else is someone's file, never written over."""
    try:
        there = path.read_text()
    except FileNotFoundError:
        return
    except (OSError, UnicodeDecodeError):
        there = None
    if there != ours:
        raise UserError("is a hostfile this sweep did not write (the directory holds no ledger): move it or pick "
                        "another --results", path)


def _staging(directory: Path) -> list[Path]:
    """The ledger built aside, and the files SQLite keeps beside it."""
    return [directory / (f".{FILENAME}.new" + suffix) for suffix in ("", "-wal", "-shm", "-journal")]


def _write_sweep(sweep: Sweep, cluster: Cluster, directory: Path, launcher: Sequence[str] | None,
                 timeout: float | None, search: SearchSpec | None = None,
                 learned: Mapping[str, int] | None = None) -> None:
    hostfile = format_hostfile(dict(cluster.capacity))
    _check_stray_hostfile(directory / HOSTFILE, hostfile)
    write_atomic(directory / HOSTFILE, hostfile)
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
        backend=cluster.backend,
        learned_memory=dict(learned) if learned else None,
        gpu_prices=dict(cluster.prices) or None,
    ), filename=staging)
    try:
        ledger.add_experiments(sweep.experiments, time.time())
    finally:
        ledger.close()  # the last connection: its WAL is checkpointed into the file and removed
    os.replace(directory / staging, directory / FILENAME)
    sync_directory(directory)
