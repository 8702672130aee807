"""The words a sweep is recorded in: the state of an attempt and the reason it did not succeed.

Both are string-valued enums, so the ledger, the JSON outputs and the event stream hold the same plain words
they always did ("timed_out", "oom"), while the code gets names a type checker can follow.
"""
from __future__ import annotations

from enum import StrEnum


class _Word(StrEnum):
    """A str that prints as its value (`f"{State.FAILED}"` is "failed")."""


class State(_Word):
    """Where an attempt stands: queued -> running -> one terminal state, which is final for that attempt."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"
    STOPPED = "stopped"  # ended early by the search: it could no longer win (never a failure, never re-run)

    @property
    def terminal(self) -> bool:
        return self not in (State.QUEUED, State.RUNNING)


TERMINAL = frozenset(s for s in State if s.terminal)


class Reason(_Word):
    """Why an attempt ended other than succeeded: what the report shows, and whether trying again can help."""

    OOM = "oom"  # out of memory: deterministic for its config
    CONFIG = "config"  # DeepSpeed refused the config or the script its arguments
    METRICS = "metrics"  # exit 0 without a valid metrics file
    EXIT = "exit"  # a non-zero exit that tells nothing more
    LAUNCH = "launch"  # the launch itself failed (port taken, host unreachable): transient
    LOST = "lost"  # the host went away while it ran: transient
    TIMEOUT = "timeout"  # it ran past its timeout or the sweep's deadline
    PLACEMENT = "placement"  # it can no longer be placed on the hosts that are up
    CANCELLED = "cancelled"  # a user asked for it
    INTERRUPTED = "interrupted"  # the runner stopped (Ctrl-C, a fault, a crash) while it ran
    OUTCLASSED = "outclassed"  # stopped: its best possible value, so far, is worse than a finished config's worst
    # (or, in a tune, than another first run's worst so far)
    SURE = "sure"  # a stop's: ended once its interval was narrow enough (spec/sure.py); recorded succeeded

    @property
    def transient(self) -> bool:
        """Worth retrying: the same config may well succeed on another try."""
        return self in (Reason.LAUNCH, Reason.LOST)
