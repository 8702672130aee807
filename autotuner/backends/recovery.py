"""Recovering after a crash: what a dead runner left running is ended by the sweep's backend (`Backend.end`),
and each attempt is recorded as the exit status it recorded says (what ended while no runner was alive keeps its
result), else interrupted."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..core.outcome import Outcome, StopAsked, with_measured_metric
from ..ledger.store import Attempt, Ledger
from ..spec.hostfile import is_local
from ..spec.metrics import metric_named
from ..states import Reason, State
from . import exitstatus

# How an attempt's recorded exit status reads (attempt, status, its directory -> the code judged): the backend's
# `recorded_code`, since only the backend knows where and how the attempt ran.
Judge = Callable[[Attempt, int, Path], int]

# The stop recovery asks for an attempt nobody asked one for: what ends it is the runner's death, not its own fault.
_RECOVERED = StopAsked(State.INTERRUPTED, "the runner stopped while it ran", Reason.INTERRUPTED)


def stops_asked(ledger: Ledger) -> dict[tuple[str, int], StopAsked]:
    """The stops a dead runner had asked for the attempts still running (recorded before their signals), by
    (name, attempt): those attempts' ends read as them, whoever sees them end."""
    return {key: StopAsked(*words) for key, words in ledger.stops_asked().items()}


def as_it_ran(attempt: Attempt, status: int, directory: Path) -> int:
    """A status recorded beside a run's logs as the runner would have seen it: a local process's returncode (-N
    for signal N) where every host of the run is this machine, else the remote status as recorded."""
    return exitstatus.as_returncode(status) if all(is_local(h) for h in attempt.slots) else status


def recover(ledger: Ledger, at: float, end: Callable[[Attempt], None],
            attempts: list[Attempt] | None = None, code: Judge = as_it_ran) -> list[Attempt]:
    """End the attempts a dead runner left running (all of them, or `attempts`) through `end`, for `autotune
    cancel` with no runner, and for runs found on slots not theirs (a runner that takes the sweep over adopts
    the others instead: `Scheduler.adopt`). Each stop is recorded before `end` (the first one asked is kept: the
    dead runner's, if it had asked one), so a recovery that dies half-way leaves it for the next. `code` reads
    the status an attempt that ended meanwhile recorded (the backend's `recorded_code`). Returns them."""
    left = ledger.in_state(State.RUNNING) if attempts is None else attempts
    if not left:
        return left
    metric = metric_named(ledger.meta().metric)
    asked = stops_asked(ledger)
    for attempt in left:
        # Read before ending it: the status a wrapper records when we end its launcher is ours, not its own.
        directory = Path(attempt.dir) if attempt.dir else None
        status = exitstatus.read(directory / exitstatus.FILENAME) if directory else None
        before = asked.get((attempt.name, attempt.attempt))  # the dead runner's stop, under way when it died
        stop = before or _RECOVERED
        ledger.stopping(attempt.name, attempt.attempt, stop.state, stop.reason, stop.detail, at)
        end(attempt)
        outcome = Outcome(stop.state, stop.reason, stop.detail)
        if status is not None and directory is not None:  # it ended before we came: as it ended, or as that stop
            outcome = exitstatus.judge_files(code(attempt, status, directory), directory, metric)
            if before is not None:
                outcome = before.settle(outcome)
        elif stop.state == State.SUCCEEDED and directory is not None:  # ended once sure: its steps say its metric
            outcome = stop.settle(exitstatus.judge_files(None, directory, metric))
        outcome = with_measured_metric(outcome, metric.name)
        ledger.finish(attempt.name, attempt.attempt, outcome.state, at, reason=outcome.reason, detail=outcome.detail,
                      exit_code=outcome.exit_code, metric=(outcome.metrics or {}).get(metric.name),
                      metrics=outcome.metrics)
    return left
