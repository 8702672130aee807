"""What the dispatcher is told, and what it hands out: a placed `Run`, a waiting `Queued`, and the events posted
to it (by an executor's threads, a signal handler, a timer, another process through the ledger).

Plain frozen values: nothing here acts, so a simulated executor can post the very same events.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from ..spec import Experiment
from ..spec.interval import StepReading
from .outcome import Outcome
from .slots import NO_NEED, GpuNeed, Reservation

Key = tuple[str, int]  # (experiment, attempt): one attempt, as Run.key and Queued.key name it


@dataclass(frozen=True)
class Run:
    """One attempt of one experiment, placed on exact slots."""

    experiment: Experiment
    attempt: int
    reservation: Reservation
    tag: str
    dir: Path

    @cached_property
    def key(self) -> Key:
        return (self.experiment.name, self.attempt)


@dataclass(frozen=True)
class Queued:
    """A waiting attempt, as the queue policy sees it."""

    experiment: Experiment
    attempt: int

    @property
    def key(self) -> Key:
        return (self.experiment.name, self.attempt)

    @property
    def num_nodes(self) -> int:
        return self.experiment.num_nodes

    @property
    def num_gpus(self) -> int:
        return self.experiment.num_gpus

    @property
    def gpu_need(self) -> GpuNeed:
        e = self.experiment
        return GpuNeed(e.gpu_type, e.gpu_mixed, e.gpu_memory) if e.gpu_type or e.gpu_mixed or e.gpu_memory \
            else NO_NEED


@dataclass(frozen=True)
class Launched:
    """The run's process exists: its process group and master port, for the record and for clean-up."""

    run: Run
    pid: int
    port: int | None
    at: float
    handle: str | None = None  # what its backend alone reads to find it again (recorded; a Slurm step's id)


@dataclass(frozen=True)
class Finished:
    """The run ended, judged: its slots are free again. `peak_memory`: the most it held on one GPU (bytes),
    where that was measured (peaks.py)."""

    run: Run
    outcome: Outcome
    at: float
    peak_memory: int | None = None


@dataclass(frozen=True)
class Progress:
    """What a running attempt's steps say so far (the runner's step reader: sweep/steps.py), or, with `oom`, the
    log line that shows it ran out of memory: then it is ended at once, recorded failed (oom)."""

    run: Run
    reading: StepReading | None
    oom: str | None = None


@dataclass(frozen=True)
class Cancel:
    names: tuple[str, ...] = ()  # empty: the whole sweep


@dataclass(frozen=True)
class Interrupt:
    """Stop dispatching and end what runs (recorded interrupted); `resume` picks the sweep up again."""

    reason: str = "interrupted by the user"


@dataclass(frozen=True)
class CheckRequests:
    """Another process left requests in the ledger (e.g. `autotune cancel`): read and apply them."""


@dataclass(frozen=True)
class HostLost:
    """A host stopped answering: no new work goes there; what ran there is ended and queued again."""

    host: str
    reason: str


@dataclass(frozen=True)
class HostBack:
    """A lost host answers again: its slots are offered again."""

    host: str


@dataclass(frozen=True)
class MemoryRead:
    """New free-memory readings of GPUs (other users' processes come and go): what waits for GPU memory may
    fit now, so the next step places again. The readings themselves stay with whoever measured them (the
    memory placement's `measure`); the core only learns that they changed."""

    hosts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Deadline:
    """The sweep's time is up: running experiments are ended as timed out, queued ones stay for resume."""


Event = (Launched | Finished | Progress | Cancel | Interrupt | CheckRequests | HostLost | HostBack | MemoryRead
         | Deadline)
Post = Callable[[Event], None]
"""Hands an event to the dispatcher; thread-safe (`Scheduler.post`)."""

