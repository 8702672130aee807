"""Recovering after a crash: ending what a dead runner left running, on every backend it used, and recording
how each attempt ended (the exit status it recorded, else interrupted)."""
from __future__ import annotations

from pathlib import Path

from ..core.outcome import Outcome
from ..ledger.store import Attempt, Ledger
from ..spec.hostfile import is_local
from ..spec.metrics import metric_named
from ..states import Reason, State
from . import exitstatus
from .local.cleanup import end_tagged
from .slurm.allocation import cancel_step
from .ssh import SSHPool, end_tagged_remote


def recover(ledger: Ledger, at: float, grace: float = 2.0, pool: SSHPool | None = None,
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
            cancel_step(attempt.step)
        if attempt.tag:
            end_tagged(attempt.tag, grace)
            remote = [host for host in attempt.slots if not is_local(host)]
            if pool is not None and remote:
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
