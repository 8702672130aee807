"""Judging a finished attempt: its exit status plus its metrics file, never a word found in stderr alone.

Success is exit status 0 and a valid metrics file. A failure gets a class, read from the exit status and the
log's telling line, so the report can say *why* and the runner knows whether trying again could help:
`oom`, `config` and `metrics` are deterministic (the same config fails the same way); `launch` (port in use,
command not found, host unreachable) and `lost` (the host went away) are transient and may be retried.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..spec.interval import Interval, StepReading
from ..spec.metrics import KNOWN, METRICS_PATH_ENV, MISSING, Metric, MetricsError, read_metrics
from ..states import Reason, State

# (class, pattern) in priority order: the first class whose pattern matches any log line wins. OOM first, then
# CONFIG: a deterministic cause beats a transient-looking line printed on the way to it.
_PATTERNS: tuple[tuple[Reason, re.Pattern[str]], ...] = (
    (Reason.OOM, re.compile(r"CUDA out of memory|OutOfMemoryError|\bMemoryError\b|Out of memory: Killed process"
                            r"|Cannot allocate memory|std::bad_alloc", re.I)),
    (Reason.CONFIG, re.compile(r"DeepSpeedConfigError|Check batch related parameters|train_batch_size is not equal"
                               r"|ValidationError|is not a valid|unrecognized arguments|Unknown .*config", re.I)),
    # No bare "Connection refused": torch's c10d prints it as a harmless warning while a rendezvous retries.
    (Reason.LAUNCH, re.compile(r"Address already in use|EADDRINUSE|command not found"
                               r"|No such file or directory: '?deepspeed"
                               r"|Could not resolve hostname|ssh: .*Connection refused"
                               r"|Permission denied \(publickey", re.I)),
)
_TAIL_BYTES = 256 * 1024
# A process that aborts in its teardown: C++'s std::terminate on a thread still joinable at exit (gloo's, NCCL's).
# DeepSpeed's autotuning mode ends a run by calling exit() from inside its engine once it wrote the metrics, so
# the script never tears its process group down, and the interpreter's exit can end this way.
_TEARDOWN_ABORT = re.compile(r"terminate called without an active exception")
# Lines that only say a process ended, not why: srun's per-task lines and slurmstepd's cancel. The line before
# them tells; they tell only when nothing else does. srun's, also after a rank's unended line (`first_bad_exit`).
_ENDED_ONLY = re.compile(r"srun: error: \S+: tasks? [\d,\-]+: |^slurmstepd\S*: error: \*\*\* ")
# SIGABRT as subprocess reports it (-6), as a shell does (134), and as DeepSpeed's launcher passes a rank's -6 on
# (sys.exit(-6): 250).
_ABORTED = (-6, 128 + 6, 256 - 6)


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended: the ledger state, and for failures a class and the line that tells why."""

    state: State
    reason: Reason | None = None
    detail: str | None = None
    exit_code: int | None = None
    metrics: Mapping[str, float] | None = None
    measured: StepReading | None = None  # what its steps said (spec/interval.py), where it left any

    def __post_init__(self) -> None:
        """Plain words (from JSON, a test, a stand-in executor) become the enums they name."""
        object.__setattr__(self, "state", State(self.state))
        if self.reason is not None:
            object.__setattr__(self, "reason", Reason(self.reason))

    @property
    def transient(self) -> bool:
        """A failure that trying again may cure (see `Reason.transient`)."""
        return self.reason is not None and self.reason.transient


# The reason a stop records when it names none: its state's own word.
REASON_OF = {State.CANCELLED: Reason.CANCELLED, State.INTERRUPTED: Reason.INTERRUPTED,
             State.TIMED_OUT: Reason.TIMEOUT, State.STOPPED: Reason.OUTCLASSED, State.SUCCEEDED: Reason.SURE}


@dataclass(frozen=True)
class StopAsked:
    """A stop asked for a running attempt (a cancel, Ctrl-C, a timeout, a lost host, a crash's clean-up): recorded
    before its signal is sent, so that whoever sees the attempt end (this runner, a runner that adopts it after a
    crash, `cancel` with none alive) judges that end as the stop, never as a failure of the experiment."""

    state: State
    detail: str
    reason: Reason

    @classmethod
    def of(cls, state: State, detail: str, reason: Reason | None = None) -> StopAsked:
        """`reason` None: the state's own word (REASON_OF)."""
        return cls(State(state), detail, Reason(reason) if reason is not None else REASON_OF[State(state)])

    def settle(self, outcome: Outcome) -> Outcome:
        """The outcome to record: the stop's, unless the attempt succeeded before the stop reached it, or its
        host was lost (then it runs again elsewhere). A stop once measured until sure (spec/sure.py) reads as a
        success whose metric its steps give (`with_measured_metric`)."""
        if outcome.state == State.SUCCEEDED or outcome.reason == Reason.LOST:
            return outcome
        if self.state == State.SUCCEEDED:
            return Outcome(State.SUCCEEDED, None, self.detail, outcome.exit_code, measured=outcome.measured)
        return Outcome(self.state, self.reason, self.detail, outcome.exit_code, measured=outcome.measured)


def with_measured_metric(outcome: Outcome, metric: str) -> Outcome:
    """A success that left no metrics file (ended once measured until sure): its metric the mean of its measured
    steps, with the interval as METRIC_low and METRIC_high; a failure (metrics) where its steps could not be read
    back. Any other outcome as it is."""
    if outcome.state != State.SUCCEEDED or metric in (outcome.metrics or {}):
        return outcome
    interval = outcome.measured.interval if outcome.measured is not None else None
    if interval is None:
        return Outcome(State.FAILED, Reason.METRICS, f"{outcome.detail}; but its steps could not be read back for "
                       f"its {metric}", outcome.exit_code, measured=outcome.measured)
    metrics = {**(outcome.metrics or {}), **steps_metric(interval, metric)}
    return Outcome(State.SUCCEEDED, None, outcome.detail, outcome.exit_code, metrics, outcome.measured)


def steps_metric(interval: Interval, metric: str) -> dict[str, float]:
    """`metric` as a run's steps measured it: their mean, with its interval as METRIC_low and METRIC_high (an
    unbounded high end is no column)."""
    found = {metric: interval.mean, f"{metric}_low": interval.low}
    if math.isfinite(interval.high):
        found[f"{metric}_high"] = interval.high
    return found


def log_tail(path: Path, size: int = _TAIL_BYTES) -> str:
    """The end of an attempt's log (what its launcher, or srun, said last), or nothing when there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _tail_lines(path: Path) -> list[str]:
    return log_tail(path).splitlines()


def oom_line(text: str) -> str | None:
    """The last line of `text` that says a process ran out of memory (the class `classify` gives first), or None:
    what the runner's step reader looks for in a running attempt's new log lines."""
    pattern = _PATTERNS[0][1]
    found = [line.strip() for line in text.splitlines() if pattern.search(line)]
    return found[-1][:300] if found else None


def classify(exit_code: int | None, logs: list[Path]) -> tuple[Reason, str | None]:
    """The failure class of a failed run and its telling log line (None when no line tells)."""
    lines = [line.strip() for log in logs for line in _tail_lines(log)]
    for reason, pattern in _PATTERNS:
        for line in reversed(lines):
            if pattern.search(line):
                return reason, line[:300]
    if exit_code in (127, 126):
        return Reason.LAUNCH, f"exit status {exit_code}: launcher not found or not executable"
    if exit_code is not None and exit_code < 0 and -exit_code == 9:
        return Reason.OOM, "killed by SIGKILL (the kernel's OOM killer?)"
    errors = [line for line in lines if re.search(r"Error|error:|Traceback|FAILED", line)]
    telling = [line for line in errors if not _ENDED_ONLY.search(line)] or errors
    return Reason.EXIT, (telling[-1][:300] if telling else None)


def judge(exit_code: int, metrics_path: Path, metric: Metric, logs: list[Path],
          end_profile_step: int | None = None) -> Outcome:
    """Succeeded only with exit status 0 and a valid metrics file; otherwise a classified failure.

    `end_profile_step`: the run's config has the injected autotuning section, so DeepSpeed's engine writes the
    metrics file itself once that many optimizer steps are done; a missing file then says what to change.
    """
    if exit_code == 0:
        try:
            values = read_metrics(metrics_path, metric)
        except MetricsError as e:
            detail = str(e)
            if e.reason == MISSING:
                detail += _why_missing(metric, end_profile_step)
            return Outcome(State.FAILED, Reason.METRICS, detail, exit_code)
        return Outcome(State.SUCCEEDED, exit_code=exit_code, metrics=values)
    if aborted_at_exit(exit_code, logs):
        try:
            values = read_metrics(metrics_path, metric)
        except MetricsError:
            pass  # aborted before it measured: a failure as ever
        else:
            return Outcome(State.SUCCEEDED, None, f"measured, then aborted at exit (exit status {exit_code}: "
                           "terminate called without an active exception)", exit_code, values)
    reason, line = classify(exit_code, logs)
    return Outcome(State.FAILED, reason, line or f"exit status {exit_code}", exit_code)


def aborted_at_exit(exit_code: int | None, logs: list[Path]) -> bool:
    """The process aborted in its teardown and nothing else went wrong: SIGABRT, the log's "terminate called
    without an active exception", no Python traceback, no out-of-memory, config or launch line. What it wrote
    before (a metrics file, the profile run's model info: the attempt's own, removed before it started) is whole,
    so it counts; a crash with any other sign, or with nothing written, is a failure as ever."""
    if exit_code not in _ABORTED:
        return False
    lines = [line.strip() for log in logs for line in _tail_lines(log)]
    if not any(_TEARDOWN_ABORT.search(line) for line in lines) or any("Traceback" in line for line in lines):
        return False
    return classify(exit_code, logs)[0] == Reason.EXIT


def _why_missing(metric: Metric, end_profile_step: int | None) -> str:
    """Why a run that exited 0 left no metrics file, and what to change."""
    if metric.name in KNOWN and end_profile_step is not None:
        return (f": the script ended before DeepSpeed's profile window did; DeepSpeed's engine writes the "
                f"metrics only after end_profile_step ({end_profile_step}) optimizer steps: run more than "
                f"{end_profile_step} optimizer steps, or lower autotuning.end_profile_step in the ds_config")
    return f": the script exited 0 without writing its metric {metric.name!r} to ${METRICS_PATH_ENV}"
