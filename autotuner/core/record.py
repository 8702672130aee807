"""What the scheduler writes down, as a protocol: the sweep's ledger (SQLite, synced) for a real sweep, or
`MemoryRecord` for a simulated one, which must not touch a disk (a plan of 100,000 experiments would spend
nearly all its time in fsync)."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

from ..spec import Experiment
from ..spec.interval import RunTimes
from ..states import Reason, State


class Record(Protocol):
    """The transitions of a sweep's attempts; `Ledger` is the real one."""

    def batch(self, synced: bool = True) -> AbstractContextManager[None]:
        """One transaction; `synced=False`: what it holds need not be on disk before the caller acts."""
        ...

    def add_experiments(self, experiments: Sequence[Experiment], at: float) -> None: ...

    def requeue(self, names: Iterable[str], at: float) -> dict[str, int]: ...

    def start(self, name: str, attempt: int, *, slots: Mapping[str, Sequence[int]], tag: str, dir: str,
              at: float) -> None: ...

    def launched(self, name: str, attempt: int, *, pid: int, port: int | None, at: float,
                 handle: str | None = None) -> None: ...

    def finish(self, name: str, attempt: int, state: State, at: float, *, reason: Reason | None = None,
               detail: str | None = None, exit_code: int | None = None, metric: float | None = None,
               metrics: Mapping[str, float] | None = None, peak_memory: int | None = None) -> None: ...

    def stopping(self, name: str, attempt: int, state: State, reason: Reason, detail: str, at: float) -> None:
        """A stop asked for a running attempt, recorded before it is carried out; the first one asked is kept."""
        ...

    def measured(self, name: str, attempt: int, timing: RunTimes) -> None:
        """What an attempt's steps said, recorded with its end (in the same step's transaction)."""
        ...

    def take_requests(self) -> list[tuple[str, list[str]]]: ...


_NOTHING: AbstractContextManager[None] = nullcontext()


class MemoryRecord:
    """A record kept in memory only: each experiment's latest attempt number, and when attempts ran."""

    def __init__(self) -> None:
        self.attempts: dict[str, int] = {}
        self.started: dict[tuple[str, int], float] = {}
        self.finished: dict[tuple[str, int], tuple[State, float]] = {}
        self.stops: dict[tuple[str, int], tuple[State, Reason, float]] = {}  # the first stop asked, by attempt
        self.timings: dict[tuple[str, int], RunTimes] = {}  # what each attempt's steps said

    def batch(self, synced: bool = True) -> AbstractContextManager[None]:
        return _NOTHING  # one reusable context: a plan makes two steps per run simulated

    def add_experiments(self, experiments: Sequence[Experiment], at: float) -> None:
        for e in experiments:
            self.attempts[e.name] = 1

    def requeue(self, names: Iterable[str], at: float) -> dict[str, int]:
        again = {name: self.attempts[name] + 1 for name in names}
        self.attempts.update(again)
        return again

    def start(self, name: str, attempt: int, *, slots: Mapping[str, Sequence[int]], tag: str, dir: str,
              at: float) -> None:
        self.started[(name, attempt)] = at

    def launched(self, name: str, attempt: int, *, pid: int, port: int | None, at: float,
                 handle: str | None = None) -> None:
        pass

    def finish(self, name: str, attempt: int, state: State, at: float, *, reason: Reason | None = None,
               detail: str | None = None, exit_code: int | None = None, metric: float | None = None,
               metrics: Mapping[str, float] | None = None, peak_memory: int | None = None) -> None:
        self.finished[(name, attempt)] = (state, at)

    def stopping(self, name: str, attempt: int, state: State, reason: Reason, detail: str, at: float) -> None:
        self.stops.setdefault((name, attempt), (state, reason, at))

    def measured(self, name: str, attempt: int, timing: RunTimes) -> None:
        self.timings[(name, attempt)] = timing

    def take_requests(self) -> list[tuple[str, list[str]]]:
        return []
