"""Ending an attempt's processes, on every host it used, until none is left.

The process group goes first (it holds the launcher and the ranks it started); then every process that carries
the attempt's tag, which also finds ranks that left the group and processes on other nodes. Used after every
attempt, on cancel, timeout and Ctrl-C, and when `cancel` finds what a dead runner left running.
"""
from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from ...core.outcome import Outcome
from ...ledger.store import Attempt, Ledger
from ...spec.hostfile import is_local
from ...spec.metrics import metric_named
from ...states import Reason, State
from .. import exitstatus, tags


def end_group(pgid: int | None, tag: str, grace: float, gone_within: Callable[[float], bool]) -> None:
    """SIGTERM the group, give it `grace` seconds (`gone_within` says when it is gone), SIGKILL it, then
    end whatever else carries the tag. No `pgid` (an adopted attempt whose leader was gone): the tag only."""
    if pgid is None:
        end_tagged(tag, grace)
        return
    _killpg(pgid, signal.SIGTERM)
    if not gone_within(grace):
        _killpg(pgid, signal.SIGKILL)
    end_tagged(tag, 0)


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def end_tagged(tag: str, grace: float) -> None:
    """SIGTERM what carries the tag here, wait up to `grace` for it to go, SIGKILL the rest, check none remain."""
    if not tags.signal_tagged(tag, signal.SIGTERM):
        return
    deadline = time.monotonic() + grace
    while tags.find_tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.05)  # processes we do not parent: there is nothing to block on
    for _ in range(50):
        if not tags.signal_tagged(tag, signal.SIGKILL):
            return
        time.sleep(0.02)
    raise RuntimeError(f"processes tagged {tag} survive SIGKILL")


def recover(ledger: Ledger, at: float, grace: float = 2.0, pool=None,
            attempts: list[Attempt] | None = None) -> list[Attempt]:
    """End the attempts a dead runner left running, for `autotune cancel` with no runner (a runner that takes
    the sweep over adopts them instead: `Scheduler.adopt`).

    Their processes are found by their tag on this machine and, over `pool`, on every other host the attempt
    used. Each attempt is then recorded as the exit status it recorded says (what ended while no runner was
    alive keeps its result), else interrupted.
    """
    left = ledger.in_state(State.RUNNING) if attempts is None else attempts
    if not left:
        return left
    metric = metric_named(ledger.meta().metric)
    for attempt in left:
        # Read before ending it: the status a wrapper records when we end its launcher is ours, not its own.
        directory = Path(attempt.dir) if attempt.dir else None
        status = exitstatus.read(directory / exitstatus.FILENAME) if directory else None
        if attempt.step:  # a Slurm job step: Slurm ends it on every node
            from ..slurm import cancel_step

            cancel_step(attempt.step)
        if attempt.tag:
            end_tagged(attempt.tag, grace)
            remote = [host for host in attempt.slots if not is_local(host)]
            if pool is not None and remote:
                from ..ssh import end_tagged_remote

                end_tagged_remote(pool, remote, attempt.tag)
        outcome = Outcome(State.INTERRUPTED, Reason.INTERRUPTED, "the runner stopped while it ran")
        if status is not None and directory is not None:
            local = attempt.step is not None or all(is_local(h) for h in attempt.slots)  # srun runs here
            outcome = exitstatus.judge_files(exitstatus.as_returncode(status) if local else status, directory,
                                             metric)
        ledger.finish(attempt.name, attempt.attempt, outcome.state, at, reason=outcome.reason, detail=outcome.detail,
                      exit_code=outcome.exit_code, metric=(outcome.metrics or {}).get(metric.name),
                      metrics=outcome.metrics)
    return left
