"""A prepared sweep (prepare.py) run to the end, new or resumed.

`execute` wires ledger, slot pool, executor and scheduler together, runs the sweep to the end and writes the
files a user takes away.
"""
from __future__ import annotations

import errno
import logging
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

from . import limits
from .core import (
    CheckRequests,
    Executor,
    Interrupt,
    Observer,
    Placement,
    Queued,
    Reservation,
    Scheduler,
    SlotPool,
    Source,
)
from .core.resources import PLACEMENTS, Demand, Devices, Only, Slots, devices_from_json, placement_named
from .dispatcher import Dispatcher
from .errors import UserError, shown
from .executor import LocalExecutor
from .hostfile import (
    is_local,
)
from .inventory import FreeMemory
from .launch import Launcher
from .learned import largest_usable, needs_of_sweep, with_needs
from .ledger import Attempt, Ledger
from .lock import SweepBusy, SweepLock
from .metrics import PEAK_MEMORY, metric_named
from .peaks import Measured, PeakMemory
from .prepare import HOSTFILE, open_sweep
from .results import write_outcome_files
from .spec import Experiment
from .states import Reason, State
from .threads import Workers
from .verdict import FailOn, exit_code
from .views.snapshot import Snapshot, snapshot

if TYPE_CHECKING:
    from .slurm import Allocation
    from .ssh import SSHPool
    from .ssh.memory import RemoteMemory

log = logging.getLogger(__name__)

@dataclass
class Result:
    """How a sweep ended, for the CLI's exit status and last lines."""

    snapshot: Snapshot
    interrupted: bool
    optimal_config: Path | None
    fail_on: FailOn = FailOn.ANY  # what counts as failure (`Options.fail_on`)

    @property
    def exit_code(self) -> int:
        """0, 1 (as `fail_on` says) or 130 (interrupted): see `verdict`. For a search (`tune`), a run out of
        memory or past its timeout is an answer (that size is too big), not a failure."""
        answers = self.snapshot.meta.search is not None
        all_succeeded = all(a.state == State.SUCCEEDED or (answers and (a.reason == Reason.OOM
                                                                        or a.state == State.TIMED_OUT))
                            for a in self.snapshot.attempts)
        return exit_code(interrupted=self.interrupted, all_succeeded=all_succeeded,
                         best_written=self.optimal_config is not None, fail_on=self.fail_on)


class Stopped(Exception):
    """The sweep stopped on a fault of the machine (a full disk, an I/O error), not of its input or of this
    code. What ran was ended first and recorded where the ledger could still be written; `resume` finishes."""


# Faults of the machine, not of the sweep or of this code: one line for the user, not a traceback.
_MACHINE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EMFILE, errno.ENFILE,
                             errno.ENOMEM})
# SQLite's primary result codes (sqlite3 names them only from Python 3.11): SQLITE_FULL, SQLITE_IOERR,
# SQLITE_READONLY, SQLITE_CANTOPEN, SQLITE_BUSY, SQLITE_NOMEM.
_MACHINE_SQLITE = frozenset({13, 10, 8, 14, 5, 7})


def machine_fault(error: BaseException) -> str | None:
    """What went wrong, in a few words, when `error` is a fault of the machine; None for anything else."""
    if isinstance(error, OSError) and error.errno in _MACHINE_ERRNOS:
        return f"{error.strerror or error}" + (f": {error.filename}" if error.filename else "")
    code = getattr(error, "sqlite_errorcode", None)
    if isinstance(error, sqlite3.Error) and code is not None and code & 0xFF in _MACHINE_SQLITE:
        return f"the ledger: {error}"
    return None


@dataclass
class Ssh:
    """How other hosts are reached (kept in the ledger, so `resume` reaches them the same way)."""

    config: str | None = None  # ssh config file used instead of ~/.ssh/config
    accept_new_hosts: bool = False
    remote_root: str | None = None  # where logs go on hosts that do not share our filesystem

    def to_json(self) -> dict:
        return {"config": self.config, "accept_new_hosts": self.accept_new_hosts, "remote_root": self.remote_root}


@dataclass
class Options:
    """How to execute; none of it changes what an experiment is."""

    ssh: Ssh | None = None  # None: as the sweep was started
    log: Callable[[str], None] = lambda line: None  # notes for the user (hosts down, ...)
    grace: float = 10.0
    retries: int = 1
    timeout: float | None = limits.DEFAULT_TIMEOUT  # seconds, for experiments whose spec gives none; None: no limit
    deadline: float | None = None  # seconds for the whole sweep
    observers: list[Observer] = field(default_factory=list)
    placement: str | None = None  # a name of PLACEMENTS (pack, spread, memory); None: as the sweep last ran, or pack
    fail_on: FailOn | str = FailOn.ANY  # what makes `Result.exit_code` 1: "any" non-success, or "no-result"
    slurm: Allocation | None = None  # the Slurm allocation to run in (a sweep started in Slurm needs one)


def execute(directory: Path, options: Options = Options(), *, retry_failed: bool = False,
            new_experiments: Sequence[Experiment] = ()) -> Result:
    """Run the sweep in `directory` to the end, whether it is new or resumed; Ctrl-C stops it cleanly.

    Holding the sweep's lock, it takes over what a dead runner left running (adopted: followed to its end,
    or judged by the exit status it recorded while no runner was alive), queues what must run again, then
    dispatches until nothing is left. A fault of the machine (a full disk) raises `Stopped` once nothing of
    the sweep runs any more.
    """
    try:
        fail_on = FailOn(options.fail_on)
    except ValueError:
        raise UserError(f"fail_on {shown(options.fail_on)}: choose from {', '.join(FailOn)}") from None
    try:
        return replace(_execute(Path(directory), options, retry_failed, new_experiments), fail_on=fail_on)
    except Exception as e:
        fault = machine_fault(e)
        if fault is None:
            raise
        raise Stopped(fault) from e


def _execute(directory: Path, options: Options, retry_failed: bool, new_experiments: Sequence[Experiment]) -> Result:
    if options.placement is not None and options.placement not in PLACEMENTS:
        raise UserError(f"--placement {shown(options.placement)}: choose from {', '.join(PLACEMENTS)}")
    ledger = open_sweep(directory)
    try:  # a damaged ledger is refused before anything is written, the lock's files included
        ledger.check_whole()
    except BaseException:
        ledger.close()
        raise
    previous_usr1 = listen_for_requests()
    try:
        lock = SweepLock(directory).acquire()
    except SweepBusy as e:
        ledger.close()
        restore_handler(signal.SIGUSR1, previous_usr1)
        raise UserError(f"{e}; wait for it, or `autotune cancel {directory}`", directory) from None
    try:
        pool = None
        try:
            ledger.upgrade()  # only the runner, holding the lock, migrates an older ledger
            if options.slurm is not None or ledger.meta().slurm is not None:
                use_allocation(directory, ledger, options.slurm)
            else:
                pool = ssh_pool(ledger, options)
            left = ledger.in_state(State.RUNNING)  # by a dead runner: adopted
            requeue(ledger, retry_failed)
            if new_experiments:
                ledger.add_experiments(new_experiments, time.time())
            interrupted = _dispatch(directory, ledger, options, pool, left)
        finally:
            if pool is not None:
                pool.close()
            ledger.close()
        snap = snapshot(directory)  # every spec: summary.txt groups the experiments by ZeRO stage
        # A Ctrl-C that came after the last experiment ended interrupted nothing: the sweep is complete.
        interrupted = interrupted and any(a.state in (State.QUEUED, State.RUNNING, State.INTERRUPTED)
                                          for a in snap.attempts)
        return Result(snap, interrupted, write_outcome_files(snap, Launcher()))
    finally:
        lock.release()
        restore_handler(signal.SIGUSR1, previous_usr1)


_Handler = Callable[[int, FrameType | None], Any] | int | None  # what signal.signal returns


def listen_for_requests() -> _Handler:
    """From before the lock is taken until after it is released, SIGUSR1 must not kill the runner.

    `autotune cancel` signals whoever holds the lock, and SIGUSR1's default action ends a process: a cancel
    sent while the runner still cleared up (or wrote its outcome files) killed it. The request waits in the
    ledger; the dispatcher reads pending requests when it starts, and on each SIGUSR1 while it runs.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGUSR1, lambda *_: None)


def restore_handler(signum: int, previous: _Handler) -> None:
    if previous is not None:
        signal.signal(signum, previous)


def requeue(ledger: Ledger, retry_failed: bool) -> dict[str, int]:
    """New attempts for interrupted experiments (and failed or timed-out ones when asked)."""
    again = {State.INTERRUPTED} | ({State.FAILED, State.TIMED_OUT} if retry_failed else set())
    return ledger.requeue([name for name, (_, state) in ledger.states().items() if state in again], time.time())


def use_allocation(directory: Path, ledger: Ledger, allocation: Allocation | None) -> None:
    """A sweep started in Slurm runs in an allocation: this one. A new allocation (resume after the last one
    ended) replaces the nodes the sweep may use; what ran on the old ones ended with it."""
    meta = ledger.meta()
    if allocation is None:
        raise UserError("this sweep runs inside Slurm: resume it with --slurm, inside an allocation or with "
                        "--nodes and --gpus-per-node for a new one", directory)
    from .files import write_atomic
    from .hostfile import format_hostfile
    from .slurm import cluster_of
    from .slurm.shared import unshared_nodes

    unseen = unshared_nodes(allocation, directory)
    if unseen:
        raise UserError(f"node(s) {', '.join(unseen)} of Slurm job {allocation.job} do not see this results "
                        "directory (the first node of each experiment writes its metrics there): put it on a "
                        "filesystem the nodes share, such as home or project space", directory)
    cluster = cluster_of(allocation)
    if meta.slurm == allocation.to_json() and dict(meta.slots) == dict(cluster.slots):
        return
    for key, value in (("slots", {h: list(ids) for h, ids in cluster.slots.items()}),
                       ("capacity", dict(cluster.capacity)), ("gpu_types", dict(cluster.types)),
                       ("gpu_memory", dict(cluster.memory)), ("slurm", allocation.to_json())):
        ledger.set_meta(key, value)
    write_atomic(directory / HOSTFILE, format_hostfile(dict(cluster.capacity)))


def ssh_pool(ledger: Ledger, options: Options, *, even_local: bool = False) -> SSHPool | None:
    """A pool of SSH connections when the sweep has hosts other than this machine (or `even_local`), else None."""
    meta = ledger.meta()
    if not even_local and all(is_local(h) for h in meta.slots):
        return None
    from .ssh import SSHPool

    ssh = options.ssh or Ssh(**dict(meta.ssh or {}))
    ledger.set_meta("ssh", ssh.to_json())
    return SSHPool(ssh.config, accept_new_hosts=ssh.accept_new_hosts)


def _dispatch(directory: Path, ledger: Ledger, options: Options, pool: SSHPool | None = None,
              adopt: Sequence[Attempt] = ()) -> bool:
    meta = ledger.meta()
    metric = metric_named(meta.metric)
    slots = meta.slots
    launcher = Launcher(meta.launcher)
    env = dict(meta.env)
    devices = devices_from_json(meta.devices)
    executor: Executor
    if options.slurm is not None:
        from .slurm import SlurmExecutor

        executor = SlurmExecutor(str(directory.resolve() / HOSTFILE), metric, time.time, launcher, env,
                                 options.grace, allocation=options.slurm)
    else:
        cpu_slots = {h: list(ids) for h, ids in slots.items() if is_local(h)} if meta.accelerator == "cpu" else {}
        executor = LocalExecutor(str(directory.resolve() / HOSTFILE), metric, time.time, launcher, env,
                                 options.grace, devices, cpu_slots)
    slot_pool = SlotPool(slots)
    now = time.time()
    placement, memory, remote_memory = _placement(ledger, options, devices, pool)
    scheduler = Scheduler(ledger, slot_pool, meta.sweep_id, directory.resolve(), metric.name,
                          placement=placement, retries=options.retries, timeout=options.timeout,
                          deadline=None if options.deadline is None else now + options.deadline,
                          source=_search(ledger, meta.search) if meta.search is not None else None)
    dispatcher = Dispatcher(scheduler, executor, time.time, options.observers, options.log)
    if remote_memory is not None:
        dispatcher.observers.insert(0, remote_memory.note)  # which GPUs the sweep's runs hold
    # Only what runs is read: decoding every spec and attempt of a sweep of 10,000 delayed the first launch.
    queued = {name: attempt for name, (attempt, state) in ledger.states().items() if state == State.QUEUED}
    needs = needs_of_sweep(meta.learned_memory, ledger.peaks(), largest_usable(meta.gpu_memory, devices))
    waiting = [Queued(e, queued[e.name]) for e in with_needs(ledger.experiments(queued), needs)]
    if options.slurm is None:
        waiting = _keep_multi_node_off_silent_local_hosts(directory, ledger, options, pool, scheduler, waiting)
    watcher = remote = None
    allocation_watcher = None
    if options.slurm is not None:
        from .slurm import AllocationWatcher, SlurmExecutor, end_strays

        stray_steps = end_strays(options.slurm, meta.sweep_id, {a.tag for a in adopt if a.tag})
        if stray_steps:
            options.log(f"{len(stray_steps)} job step(s) a dead runner left in Slurm job {options.slurm.job} "
                        "that no attempt follows any more: cancelled")
        allocation_watcher = AllocationWatcher(options.slurm, dispatcher.post, margin=options.grace + 30)
        cast(SlurmExecutor, executor).on_lost = allocation_watcher.watch
    if pool is not None:
        from .routing import Router
        from .ssh import HostWatcher, SshExecutor

        watcher = HostWatcher(pool, dispatcher.post)
        ssh = Ssh(**dict(ledger.meta().ssh or {}))
        remote = SshExecutor(pool, (directory / HOSTFILE).read_text(), metric, time.time, launcher, env,
                             options.grace, ssh.remote_root, on_lost=watcher.watch,
                             devices=devices)
        executor = dispatcher.executor = Router(executor, remote)
    on_gpus_here = meta.accelerator != "cpu" and any(is_local(h) for h in slots)
    peaks = PeakMemory(mig=_local_mig(devices)) if on_gpus_here else None
    if peaks is not None:  # runs on this machine's GPUs: their peak memory is read while they run
        executor = dispatcher.executor = Measured(executor, peaks, is_local)
    # What a dead runner left running holds its slots before anything queued is placed. Adopted before the
    # hosts are probed: a run on a host found down then ends as lost, and runs again elsewhere.
    experiments = {e.name: e for e in with_needs(ledger.experiments({a.name for a in adopt}), needs)} if adopt else {}
    stray = []
    for a in adopt:
        since = a.launched_at or a.started_at or now
        run = scheduler.adopt(experiments[a.name], a.attempt, a.slots, since)
        if run is None:
            stray.append(a)
        else:
            executor.adopt(run, a.pid, dispatcher.post)
            if remote_memory is not None:  # before the first reading: its GPUs show the run's own memory
                remote_memory.note("adopted", run)
    if stray:  # slots recorded twice or not the sweep's (a ledger edited by hand): ended, then run again
        from .cleanup import recover

        recover(ledger, time.time(), options.grace, pool, attempts=stray)
        states = ledger.states()  # one that ended while no runner was alive keeps what its status says
        again = ledger.requeue([a.name for a in stray if states[a.name][1] == State.INTERRUPTED], time.time())
        waiting += [Queued(experiments[name], number) for name, number in again.items()]
        options.log(f"{len(stray)} attempt(s) left running on slots that were not theirs to hold: ended and "
                    "queued again")
    if pool is not None and watcher is not None:
        from .ssh import unanswering

        for host, trouble in unanswering(pool, [h for h in slots if not is_local(h)]).items():
            options.log(f"{trouble}: left out until it answers")
            slot_pool.mark_down(host)
            watcher.watch(host)
        if all(slot_pool.is_down(h) for h in slots):
            watcher.close()
            raise UserError("no host of the sweep answers (see `autotune hosts`)", directory / HOSTFILE)
    if remote_memory is not None:  # the first placement sees every host's GPUs as they are now
        for host in slots:
            if slot_pool.is_down(host):
                remote_memory.note("host_down", host)
        remote_memory.read_now()
        remote_memory.start(dispatcher.post)
    scheduler.submit(waiting)
    try:
        return _run_with_signals(dispatcher)
    finally:
        if memory is not None:
            memory.close()
        if remote_memory is not None:
            remote_memory.close()
        executor.close()  # every run has posted its end: its threads are ending, or ended
        if peaks is not None:
            peaks.close()
        if watcher is not None:
            watcher.close()
        if allocation_watcher is not None:
            allocation_watcher.close()
        if remote is not None:
            remote.close()


def _search(ledger: Ledger, spec: Mapping[str, Any]) -> Source:
    """`autotune tune`'s search (`spec`: the ledger's meta `search`), rebuilt from the ledger: what it proposed
    and what came of it (search.py)."""
    from .search import SearchSpec, search_for

    search = search_for(SearchSpec.from_json(spec))
    attempts = ledger.latest()
    latest = {a.name: (a.state, a.reason, a.metric) for a in attempts}
    peaks = ledger.peaks()  # measured while they ran: the search told them so (core/scheduler.py), and is again
    search.replay(ledger.experiments(), latest, {a.name: {**(a.metrics or {}), **({PEAK_MEMORY: float(peaks[a.name])}
                                                                                 if a.name in peaks else {})}
                                                 for a in attempts})
    return search


def _local_mig(devices: Devices) -> dict[int, str]:
    """This machine's MIG instances, slot id -> UUID: NVML readers find them by UUID, not by index."""
    return {i: d.mig for h, own in devices.items() if is_local(h) for i, d in own.items() if d.mig}


def _placement(ledger: Ledger, options: Options, devices: Devices, pool: SSHPool | None = None
               ) -> tuple[Placement, FreeMemory | None, RemoteMemory | None]:
    """The placement a sweep runs with: the one asked for (recorded, so that `resume` keeps it), else the one
    recorded, else pack; kept to one GPU type at a time where the sweep recorded types. `memory` reads this
    machine's GPUs (NVML) each time it places, and the latest readings of the other hosts' GPUs that a
    RemoteMemory keeps (ssh/memory.py: read over `pool`, off the dispatcher; the caller starts it); a host
    not measured is judged by its type's stated size. Returns the readers too, for the caller to close."""
    meta = ledger.meta()
    name = options.placement or meta.placement or "pack"
    if options.placement is not None and options.placement != meta.placement:
        ledger.set_meta("placement", options.placement)
    local = remote = None
    if name == "memory" and meta.accelerator != "cpu" and any(is_local(h) for h in meta.slots):
        local = FreeMemory(mig=_local_mig(devices))
    remote_hosts = {h: ids for h, ids in meta.slots.items() if not is_local(h) and not devices.get(h)}
    if name == "memory" and pool is not None and remote_hosts:  # (MIG instances are read on this machine only)
        from .ssh.memory import RemoteMemory, nvidia_smi

        remote = RemoteMemory(nvidia_smi(pool), remote_hosts, meta.gpu_memory)
    measure: Callable[[str], dict[int, int] | None] | None = None
    if local is not None or remote is not None:
        def measure(host: str) -> dict[int, int] | None:
            if is_local(host):
                return local.read() if local is not None else None
            return remote.free(host) if remote is not None else None
    types = {h: (meta.gpu_types or {}).get(h) for h in meta.slots}
    return placement_named(name, types, meta.gpu_memory, measure, devices, meta.slots), local, remote


def _keep_multi_node_off_silent_local_hosts(directory: Path, ledger: Ledger, options: Options,
                                            pool: SSHPool | None, scheduler: Scheduler,
                                            waiting: list[Queued]) -> list[Queued]:
    """What of `waiting` can run, once this machine's own names (localhost, 127.0.0.1) are probed over SSH.

    DeepSpeed's multi-node launcher reaches every node over ssh (pdsh), this machine too: with no sshd
    answering here, every multi-node launch on it fails and is retried. Such names stay usable for single-node
    experiments (run directly) but are kept out of multi-node placements; a multi-node experiment that then
    cannot fit stays queued for `resume`. Nothing at all can run: a UserError.
    """
    local = [h for h in scheduler.pool.hosts if is_local(h)]
    if not local or not any(item.num_nodes > 1 for item in waiting):
        return waiting
    from .ssh import unanswering

    probing = pool or ssh_pool(ledger, options, even_local=True)
    assert probing is not None  # even_local: always a pool
    try:
        silent = unanswering(probing, local)
    finally:
        if probing is not pool:
            probing.close()
    if not silent:
        return waiting
    answering = [h for h in scheduler.pool.hosts if h not in silent]

    def can_run(item: Queued) -> bool:
        return item.num_nodes == 1 or sum(
            1 for h in answering if scheduler.pool.capacity(h) >= item.num_gpus) >= item.num_nodes

    runnable = [item for item in waiting if can_run(item)]
    held = len(waiting) - len(runnable)
    why = "; ".join(list(silent.values())[:3]) + " (a multi-node launch reaches every node over ssh, this " \
        "machine's names too)"
    if not runnable:
        raise UserError(f"no experiment can run: {why}; see `autotune hosts`", directory / HOSTFILE)
    scheduler.placement = _SingleNodeOn(frozenset(silent), scheduler.placement)
    if held:
        options.log(f"{why}: {held} multi-node experiment(s) left queued; `autotune resume {directory}` "
                    "runs them once it answers")
    return runnable


@dataclass(frozen=True)
class _SingleNodeOn:
    """A placement that puts only single-node experiments on `hosts` (see the function above)."""

    hosts: frozenset[str]
    placement: Placement

    def place(self, pool: Slots, demand: Demand) -> Reservation | None:
        return self.placement.place(self._seen(pool, demand), demand)

    def could_fit(self, pool: Slots, demand: Demand) -> bool:
        return self.placement.could_fit(self._seen(pool, demand), demand)

    def _seen(self, pool: Slots, demand: Demand) -> Slots:
        """The pool without `hosts`, for a multi-node experiment."""
        return Only(pool, frozenset(pool.hosts) - self.hosts) if demand.num_nodes > 1 else pool


def _run_with_signals(dispatcher: Dispatcher) -> bool:
    """Dispatch on a thread of the runner's own, the main thread staying free for signals and the display.

    First Ctrl-C (or SIGTERM): stop gracefully. Every later one: kill at once, again; never an exception out of
    the handler (a KeyboardInterrupt raised here closed the ledger under the dispatcher's feet: SIGSEGV).
    SIGUSR1: read requests from the ledger. Returns whether the sweep was interrupted.
    """
    scheduler, executor = dispatcher.scheduler, dispatcher.executor
    presses = 0
    killing = False  # a kill is under way in an outer call of the handler (a press during a press)

    def on_sigint(signum: int, frame: object) -> None:
        nonlocal presses, killing
        presses += 1
        if presses == 1:
            dispatcher.post(Interrupt())
        elif not killing:  # nested: the kill under way SIGKILLs everything already
            # At once: SIGKILL them all; the dispatcher records each interrupted as it is reaped and ends.
            killing = True
            try:
                executor.kill_all()
            except Exception:
                log.exception("killing the sweep's processes failed")
            finally:
                killing = False

    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers[signal.SIGINT] = signal.signal(signal.SIGINT, on_sigint)
        handlers[signal.SIGTERM] = signal.signal(signal.SIGTERM, on_sigint)
        handlers[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, lambda *_: dispatcher.post(CheckRequests()))
    dispatcher.post(CheckRequests())  # requests that came before we listened (handled before the first launch)
    workers = Workers("runner")
    done = threading.Event()
    errors: list[BaseException] = []

    def dispatch() -> None:
        try:
            dispatcher.run()
        except BaseException as e:  # raised on the caller's thread below
            errors.append(e)
        finally:
            done.set()

    try:
        workers.start("dispatcher", dispatch)
        done.wait()
    finally:
        workers.close()
        for signum, previous in handlers.items():
            signal.signal(signum, previous)
    if errors:
        raise errors[0]
    return scheduler.stopping == State.INTERRUPTED

