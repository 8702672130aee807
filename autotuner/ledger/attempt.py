"""One attempt of one experiment as the ledger records it."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from ..states import Reason, State


@dataclass(frozen=True)
class Attempt:
    """One attempt of one experiment as the ledger knows it."""

    name: str
    attempt: int
    state: State
    queued_at: float
    reason: Reason | None = None
    detail: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    slots: Mapping[str, list[int]] = field(default_factory=dict)
    tag: str | None = None
    pid: int | None = None
    launched_at: float | None = None
    port: int | None = None
    dir: str | None = None
    exit_code: int | None = None
    metric: float | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    handle: str | None = None  # what its backend alone reads to find it again (a Slurm job step's id), if any
    peak_memory: int | None = None  # bytes: the most it held on one GPU, where measured (peaks.py)

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def duration(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at

    def to_json(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | {
            "slots": dict(self.slots), "metrics": dict(self.metrics)}


# What reading a row needs of Attempt and the words: its fields in order (the columns a row is selected in, an
# older version's missing ones as NULL), and each state and reason by its text.
FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Attempt))
STATES = {str(s): s for s in State}
REASONS = {str(r): r for r in Reason}
