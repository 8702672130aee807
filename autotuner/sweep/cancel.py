"""Cancelling experiments of a sweep, or all of it, from any process: through its live runner, or in the ledger.

The request is written to the ledger first, then the runner holding the sweep's lock is signalled (SIGUSR1) and
cancels at its next step. With no runner alive, this process takes the lock, ends what a dead runner left
running, and records the cancelled experiments itself.
"""
from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..backends.recovery import recover
from ..backends.registry import backend_for
from ..errors import UserError, shown
from ..jsonvalues import JSONObject
from ..ledger.lock import SweepBusy, holder_pid
from ..ledger.store import open_sweep
from ..states import Reason, State
from .holding import holding

if TYPE_CHECKING:
    from ..backends.base import Backend
    from ..ledger.store import Ledger


@dataclass(frozen=True)
class Cancellation:
    """What `cancel` did: asked the live runner (its pid; it cancels at its next step), or, with none alive,
    cancelled here the experiments that had not finished. `str()` says it in a line."""

    directory: Path
    requested: tuple[str, ...]  # the experiments asked for; empty: the whole sweep
    via_runner: bool  # a live runner was asked (it cancels at its next step)
    runner_pid: int | None = None
    cancelled: tuple[str, ...] = ()  # cancelled here, with no runner alive
    given_back: str | None = None  # what the cluster gave the sweep, given back here (nothing left to run), in words

    def __str__(self) -> str:
        if self.via_runner:
            return f"asked the runner (pid {self.runner_pid}) to cancel {', '.join(self.requested) or 'the sweep'}"
        done = f"cancelled {len(self.cancelled)} experiment(s) that had not finished"
        return f"{done}; {self.given_back}" if self.given_back else done

    def to_json(self) -> JSONObject:
        """For `autotune cancel --format json`: `cancelled` is null when the runner was asked (it decides)."""
        return {"directory": str(self.directory), "requested": list(self.requested) or "all",
                "via_runner": self.via_runner, "runner_pid": self.runner_pid,
                "cancelled": None if self.via_runner else list(self.cancelled), "given_back": self.given_back,
                "message": str(self)}


def cancel(directory: str | Path, names: Sequence[str] = ()) -> Cancellation:
    """Cancel the experiments named (all of them when `names` is empty); returns what was done (`str()` of it
    is a line for people)."""
    directory = Path(directory)
    with open_sweep(directory) as ledger:
        known = {e.name for e in ledger.experiments()}
        unknown = [n for n in names if n not in known]
        if unknown:
            listed = ", ".join(shown(n, quoted=False) for n in unknown[:10])
            more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
            raise UserError(f"no experiment named {listed}{more} in this sweep", directory)
        ledger.check_whole()  # before the request is written (and the lock taken, when no runner is alive)
        backend = _reached(directory, ledger) if holder_pid(directory) is None else None
        handed = False  # to _cancel_here, which closes it
        try:
            ledger.request("cancel", names, time.time())
            requested = tuple(names)
            pid = holder_pid(directory)
            if pid is not None:
                os.kill(pid, signal.SIGUSR1)
                return Cancellation(directory, requested, True, pid)
            try:
                with holding(directory):
                    handed = True
                    done, given_back = _cancel_here(directory, ledger, names, known, backend)
                    return Cancellation(directory, requested, False, None, tuple(done), given_back)
            except SweepBusy as e:  # a runner started since: it reads the request when it starts dispatching
                if e.pid is not None:
                    os.kill(e.pid, signal.SIGUSR1)
                return Cancellation(directory, requested, True, e.pid)
        finally:
            if backend is not None and not handed:
                backend.close()


def _reached(directory: Path, ledger: Ledger) -> Backend:
    """No runner is alive: this process will end what a dead one left running, through the sweep's backend. Its
    cluster is reached now, before the request and the lock are written, so that one which cannot be reached
    refuses the cancel with the sweep left byte for byte as it was (reached only when something is left
    running: the rest is the ledger's alone)."""
    backend = backend_for(directory, ledger)
    try:
        if ledger.in_state(State.RUNNING):
            backend.reach(to_run=False)
    except BaseException:
        backend.close()
        raise
    return backend


def _cancel_here(directory: Path, ledger: Ledger, names: Sequence[str], known: set[str],
                 backend: Backend | None) -> tuple[list[str], str | None]:
    """No runner: apply the request here, after the sweep's backend (`backend`, reached before the lock; None:
    a runner alive then has died since) cleared up what a dead one left; returns those cancelled, and what the
    backend gave back once nothing of the sweep is left to run."""
    ledger.upgrade()  # the writer now, holding the lock: the stops it records need schema 6
    with contextlib.closing(backend or _reached(directory, ledger)) as ending:
        recover(ledger, time.time(), ending.end, code=ending.recorded_code)
        done = _cancel_recorded(ledger, names, known)
        left = any(a.state in (State.QUEUED, State.RUNNING, State.INTERRUPTED) for a in ledger.latest())
        return done, None if left else ending.give_back()


def _cancel_recorded(ledger: Ledger, names: Sequence[str], known: set[str]) -> list[str]:
    """The request applied in the ledger: the experiments chosen that had not finished recorded cancelled."""
    # Ours and any other cancel's that came meanwhile (those signalled us, and found us holding the lock).
    asked = [wanted for kind, wanted in ledger.take_requests() if kind == "cancel"]
    chosen = known if any(not wanted for wanted in asked) else set().union(set(names), *asked)
    done = []
    for attempt in ledger.latest():
        if attempt.name in chosen and attempt.state in (State.QUEUED, State.INTERRUPTED):
            number = attempt.attempt
            if attempt.state == State.INTERRUPTED:
                number = ledger.requeue([attempt.name], time.time())[attempt.name]
            ledger.finish(attempt.name, number, State.CANCELLED, time.time(), reason=Reason.CANCELLED,
                          detail="cancelled while the sweep was stopped")
            done.append(attempt.name)
    return done
