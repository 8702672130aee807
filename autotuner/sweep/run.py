"""A prepared sweep (create.py) run to the end, new or resumed.

`execute` wires ledger, slot pool, executor and scheduler together, runs the sweep to the end and writes the
files a user takes away.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import limits
from ..backends.base import Admit, Attached, Backend, MemoryReading
from ..backends.launch import Launcher
from ..backends.recovery import recover, stops_asked
from ..backends.registry import backend_for
from ..backends.watch import env_seconds
from ..core import CheckRequests, Interrupt, Observer, Placement, Queued, Scheduler, Searcher, SlotPool
from ..core.placement import PLACEMENTS, placement_named
from ..core.slots import Devices, devices_from_json
from ..errors import UserError, shown
from ..jsonvalues import JSON
from ..ledger.lock import SweepBusy
from ..ledger.store import Attempt, Ledger, open_sweep
from ..planning.learned import largest_usable, needs_of_sweep, with_needs
from ..spec import Experiment
from ..spec.metrics import PEAK_MEMORY, metric_named
from ..states import Reason, State
from ..threads import Workers
from ..tune.outclass import GridJudge
from ..tune.space import SearchSpec
from ..tune.tuners import search_for
from ..views.snapshot import Snapshot, snapshot
from ..views.summary import write_outcome_files
from .create import withdraw
from .dispatcher import Dispatcher, Inbox
from .holding import holding
from .steps import DEFAULT_POLL, POLL_ENV, StepReader
from .verdict import FailOn, exit_code

__all__ = ["Options", "Result", "Stopped", "execute", "machine_fault", "requeue"]

log = logging.getLogger(__name__)

# The longest a second Ctrl-C waits for the first one's stop to be recorded before it kills (seconds).
_RECORD_WAIT = 5.0

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
        memory or past its timeout is an answer (that size is too big), not a failure; a run stopped because it could
        not win (`stopped`) is never one."""
        answers = self.snapshot.meta.search is not None
        all_succeeded = all(a.state in (State.SUCCEEDED, State.STOPPED) or (answers and (a.reason == Reason.OOM
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
class Options:
    """How to execute; none of it changes what an experiment is."""

    log: Callable[[str], None] = lambda line: None  # notes for the user (hosts down, ...)
    grace: float = 10.0
    retries: int = 1
    timeout: float | None = limits.DEFAULT_TIMEOUT  # seconds, for experiments whose spec gives none; None: no limit
    deadline: float | None = None  # seconds for the whole sweep
    observers: list[Observer] = field(default_factory=list)
    placement: str | None = None  # a name of PLACEMENTS (pack, spread, memory); None: as the sweep last ran, or pack
    fail_on: FailOn | str = FailOn.ANY  # what makes `Result.exit_code` 1: "any" non-success, or "no-result"
    # The backends' options, by name, each backend reading its own (as `cluster_for` takes them): how SSH hosts
    # are reached ("ssh": an Ssh; none: as the sweep was started), the allocation to run in ("allocation": a
    # sweep started in Slurm needs one), the cluster to run on ("ray": its address, "" for the default one).
    backend: Mapping[str, object] = field(default_factory=dict)
    stop_outclassed: bool = False  # a grid: stop a run whose steps show it cannot beat one that succeeded


def execute(directory: Path, options: Options | None = None, *, retry_failed: bool = False,
            new_experiments: Sequence[Experiment] = (), prepared: bool = False) -> Result:
    """Run the sweep in `directory` to the end, whether it is new or resumed; Ctrl-C stops it cleanly.

    Holding the sweep's lock, it takes over what a dead runner left running (adopted: followed to its end,
    or judged by the exit status it recorded while no runner was alive), queues what must run again, then
    dispatches until nothing is left. A fault of the machine (a full disk) raises `Stopped` once nothing of
    the sweep runs any more. `options`: none, the defaults (a new `Options` each call). `prepared`: the
    directory is the one `prepare` just made (`run`, `tune`): refused before its lock, what it made is removed.
    """
    options = options or Options()
    try:
        fail_on = FailOn(options.fail_on)
    except ValueError:
        raise UserError(f"fail_on {shown(options.fail_on)}: choose from {', '.join(FailOn)}") from None
    try:
        return replace(_execute(Path(directory), options, retry_failed, new_experiments, prepared), fail_on=fail_on)
    except Exception as e:
        fault = machine_fault(e)
        if fault is None:
            raise
        raise Stopped(fault) from e


def _execute(directory: Path, options: Options, retry_failed: bool, new_experiments: Sequence[Experiment],
             prepared: bool) -> Result:
    if options.placement is not None and options.placement not in PLACEMENTS:
        raise UserError(f"--placement {shown(options.placement)}: choose from {', '.join(PLACEMENTS)}")
    locked = False
    try:
        with contextlib.ExitStack() as held:
            with open_sweep(directory) as ledger:
                ledger.check_whole()  # a damaged ledger is refused before anything is written, the lock's files too
                with contextlib.closing(backend_for(directory, ledger, options.backend, grace=options.grace,
                                                    log=options.log)) as backend:
                    # A cluster that refuses the sweep does so before the lock rewrites runner.lock.
                    backend.reach()
                    admit = backend.admit(SlotPool(ledger.meta().slots),
                                          _to_run(ledger, retry_failed, new_experiments))
                    try:
                        held.enter_context(holding(directory))
                    except SweepBusy as e:
                        raise UserError(f"{e}; wait for it, or `autotune cancel {directory}`", directory) from None
                    locked = True
                    ledger.upgrade()  # only the runner, holding the lock, migrates an older ledger
                    attached = backend.attach()  # what runs the sweep: only attach makes one
                    left = ledger.in_state(State.RUNNING)  # by a dead runner: adopted
                    requeue(ledger, retry_failed)
                    if new_experiments:
                        ledger.add_experiments(new_experiments, time.time())
                    interrupted = _dispatch(directory, ledger, options, backend, attached, admit, left)
            snap = snapshot(directory)  # every spec: summary.txt groups the experiments by ZeRO stage
            # A Ctrl-C that came after the last experiment ended interrupted nothing: the sweep is complete.
            interrupted = interrupted and any(a.state in (State.QUEUED, State.RUNNING, State.INTERRUPTED)
                                              for a in snap.attempts)
            return Result(snap, interrupted, write_outcome_files(snap, Launcher()))
    except UserError as e:
        if prepared and not locked:  # a new sweep its cluster refused: nothing of it is left
            withdraw(directory)
            if e.path is not None and Path(e.path).resolve().is_relative_to(directory.resolve()):
                raise UserError(e.message) from None  # the file it named (the sweep's hostfile) is gone with it
        raise


def requeue(ledger: Ledger, retry_failed: bool) -> dict[str, int]:
    """New attempts for interrupted experiments (and failed or timed-out ones when asked)."""
    again = {State.INTERRUPTED} | ({State.FAILED, State.TIMED_OUT} if retry_failed else set())
    return ledger.requeue(list(ledger.latest_in(*again)), time.time())


def _to_run(ledger: Ledger, retry_failed: bool, new_experiments: Sequence[Experiment]) -> list[Queued]:
    """The queue as it will be once the lock is held (what waits, what `requeue` queues again, the new ones),
    read before the lock: what `Backend.admit` judges."""
    again = {State.QUEUED, State.INTERRUPTED} | ({State.FAILED, State.TIMED_OUT} if retry_failed else set())
    latest = ledger.latest_in(*again)
    return [Queued(e, latest[e.name]) for e in ledger.experiments(latest)] + [Queued(e, 1) for e in new_experiments]


def _dispatch(directory: Path, ledger: Ledger, options: Options, backend: Backend, attached: Attached,
              admit: Admit, adopt: Sequence[Attempt] = ()) -> bool:
    """The sweep dispatched on `attached` until it ends (`backend` ends what it finds on slots not its own);
    whether it was interrupted. The backend closes what they opened (its caller closes it); nothing here is
    replaced once built."""
    meta = ledger.meta()
    devices = devices_from_json(meta.devices)
    slot_pool = SlotPool(meta.slots)
    now = time.time()
    # Only what runs is read: decoding every spec and attempt of a sweep of 10,000 delayed the first launch.
    queued = ledger.latest_in(State.QUEUED)
    needs = needs_of_sweep(meta.learned_memory, ledger.peaks(), largest_usable(meta.gpu_memory, devices))
    waiting = [Queued(e, queued[e.name]) for e in with_needs(ledger.experiments(queued), needs)]
    chosen, memory = _placement(ledger, options, attached, devices)
    placement, waiting = admit(chosen, waiting)
    scheduler = Scheduler(ledger, slot_pool, meta.sweep_id, directory.resolve(), metric_named(meta.metric).name,
                          placement=placement, retries=options.retries, timeout=options.timeout,
                          deadline=None if options.deadline is None else now + options.deadline,
                          searcher=_search(ledger, meta.search) if meta.search is not None else
                          _judge(ledger) if options.stop_outclassed else None)
    inbox = Inbox()
    executor = attached.executor(inbox.post)
    reader = StepReader(inbox.post, scheduler.metric, env_seconds(POLL_ENV, DEFAULT_POLL))
    dispatcher = Dispatcher(scheduler, executor, time.time, [*memory.observers, reader, *options.observers],
                            options.log, inbox)
    attached.clear_strays(adopt)
    # What a dead runner left running holds its slots before anything queued is placed. Adopted before the
    # hosts are probed: a run on a host found down then ends as lost, and runs again elsewhere.
    experiments = {e.name: e for e in with_needs(ledger.experiments({a.name for a in adopt}), needs)} if adopt else {}
    asked = stops_asked(ledger) if adopt else {}  # the dead runner's stops under way: their ends read as them
    stray = []
    for a in adopt:
        since = a.launched_at or a.started_at or now
        run = scheduler.adopt(experiments[a.name], a.attempt, a.slots, since, asked.get((a.name, a.attempt)))
        if run is None:
            stray.append(a)
        else:
            executor.adopt(run, a.pid, dispatcher.post)
            reader("adopted", run, None)
            for note in memory.observers:  # before the first reading: its GPUs show the run's own memory
                note("adopted", run, None)
    if stray:  # slots recorded twice or not the sweep's (a ledger edited by hand): ended, then run again
        recover(ledger, time.time(), backend.end, attempts=stray, code=backend.recorded_code)
        states = ledger.states(a.name for a in stray)  # one that ended with no runner alive keeps its status
        again = ledger.requeue([a.name for a in stray if states[a.name][1] == State.INTERRUPTED], time.time())
        waiting += [Queued(experiments[name], number) for name, number in again.items()]
        options.log(f"{len(stray)} attempt(s) left running on slots that were not theirs to hold: ended and "
                    "queued again")
    attached.ready(slot_pool, dispatcher.post)
    scheduler.submit(waiting)
    with reader.reading():
        return _run_with_signals(dispatcher)


def _placement(ledger: Ledger, options: Options, attached: Attached,
               devices: Devices) -> tuple[Placement, MemoryReading]:
    """The placement a sweep runs with: the one asked for (recorded, so that `resume` keeps it), else the one
    recorded, else pack; kept to one GPU type at a time where the sweep recorded types. `memory` places by the
    free memory the backend reads (a host not measured is judged by its type's stated size)."""
    meta = ledger.meta()
    name = options.placement or meta.placement or "pack"
    if options.placement is not None and options.placement != meta.placement:
        ledger.set_meta("placement", options.placement)
    memory = attached.read_memory(name, devices)
    types = {h: (meta.gpu_types or {}).get(h) for h in meta.slots}
    return placement_named(name, types, meta.gpu_memory, memory.measure, devices, meta.slots), memory


def _search(ledger: Ledger, spec: Mapping[str, JSON]) -> Searcher:
    """`autotune tune`'s search (`spec`: the ledger's meta `search`), rebuilt from the ledger: what it proposed
    and what came of it (search.py)."""
    search = search_for(SearchSpec.from_json(spec))
    attempts = ledger.latest()
    latest = {a.name: (a.state, a.reason, a.metric) for a in attempts}
    peaks = ledger.peaks()  # measured while they ran: the search told them so (core/scheduler.py), and is again
    search.replay(ledger.experiments(), latest, {a.name: {**(a.metrics or {}), **({PEAK_MEMORY: float(peaks[a.name])}
                                                                                 if a.name in peaks else {})}
                                                 for a in attempts})
    return search


def _judge(ledger: Ledger) -> Searcher:
    """`--stop-outclassed` of a grid (tune/outclass.py), told what succeeded before, each on its hosts' GPU type."""
    meta = ledger.meta()
    judge = GridJudge(metric_named(meta.metric), meta.gpu_types or {})
    for a in ledger.latest():
        if a.state == State.SUCCEEDED:
            judge.keep(a.name, list(a.slots), a.metrics)
    return judge


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
            # At once: SIGKILL them all; the dispatcher records each interrupted as it is reaped and ends. Only
            # after the first press's stop is recorded (a step: milliseconds), so that what is killed reads as
            # interrupted even if this runner dies next; bounded, should the dispatcher be stuck.
            killing = True
            try:
                dispatcher.stop_recorded.wait(_RECORD_WAIT)
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

