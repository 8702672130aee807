"""The running attempts' steps so far, as the runner last recorded them (the ledger's `measures`), followed for the
page.

A reading is not a transition: the runner replaces it every few seconds (`sweep/steps.py`, `Scheduler._progress`)
without recording one, so "the rows moved since transition N" never sends it. The feed numbers the changes of
readings it sees itself, and a page is sent, beside the rows whose attempts moved, only the running rows whose
reading changed since its last ask: one query per read, over the running attempts alone (the `attempts_state`
index), whatever the sweep's size. The numbering is this process's (a mark carries a random epoch): a mark from
another feed (the dashboard started again) gets every running row, a bounded number.

A run's own page asks for its attempts' rows alone (`of_experiment`, by the table's key), start-up and step time
with them: what it shows while the run runs, and the final figures the runner put in their place at its end.
"""
from __future__ import annotations

import bisect
import math
import secrets
import sqlite3
from dataclasses import dataclass

from ..jsonvalues import JSONObject

# Before ledger schema 7 there is no `measures` table: nothing was read while a run ran.
SINCE_SCHEMA = 7
KEPT = 1_000  # changes kept to answer "since M"; a page further behind gets every running row
ATTEMPTS = "SELECT attempt, startup, step_time, steps, mean, low, high FROM measures WHERE name = ?"
QUERY = ("SELECT m.name, m.attempt, m.steps, m.mean, m.low, m.high FROM measures m JOIN attempts a "
         "ON a.name = m.name AND a.attempt = m.attempt WHERE a.state = 'running'")


@dataclass(frozen=True)
class Reading:
    """A running attempt's steps so far: how many, and its metric's mean and 95% interval (spec/interval.py)
    where its steps bound it. `high` None: no upper bound (or none yet)."""

    attempt: int
    steps: int
    mean: float | None
    low: float | None
    high: float | None


def _finite(value: float | None) -> float | None:
    """A number JSON can carry: NULL (unknown, or no bound) and a non-finite one are None."""
    return value if value is not None and math.isfinite(value) else None


class Readings:
    """The readings of the running attempts at the last read, and which names' readings changed at each read
    (numbered by this object: `mark`). Not thread-safe: the feed holds its lock around it."""

    def __init__(self) -> None:
        self.now: dict[str, Reading] = {}
        self._epoch = secrets.token_hex(4)
        self._count = 0
        self._changed: list[tuple[int, list[str]]] = []  # (count, names whose reading changed at it)
        self._floor = 0  # the last count whose changes were let go

    @property
    def mark(self) -> str:
        """What a page is told it has seen, and sends back: `epoch.count`."""
        return f"{self._epoch}.{self._count}"

    def read(self, db: sqlite3.Connection, version: int) -> bool:
        """The running attempts' readings read again; True when any changed (a new or different one)."""
        if version < SINCE_SCHEMA:
            return False
        found = {name: Reading(attempt, steps, _finite(mean), _finite(low), _finite(high))
                 for name, attempt, steps, mean, low, high in db.execute(QUERY)}
        changed = [n for n, r in found.items() if self.now.get(n) != r]
        self.now = found  # the others ended: the transition that ended them sends their rows
        if not changed:
            return False
        self._count += 1
        self._changed.append((self._count, changed))
        if len(self._changed) > KEPT:
            self._floor = self._changed[KEPT // 2 - 1][0]
            del self._changed[:KEPT // 2]
        return True

    def since(self, mark: str | None) -> list[str]:
        """The running attempts whose reading changed after `mark` (every one when the mark is not this object's,
        or older than the changes kept; none for the current mark)."""
        epoch, _, count = (mark or "").partition(".")
        if epoch != self._epoch or not count.isdigit() or not self._floor <= int(count) <= self._count:
            return list(self.now)
        first = bisect.bisect_right(self._changed, int(count), key=lambda c: c[0])
        return list(dict.fromkeys(n for _, names in self._changed[first:] for n in names))


def of_experiment(db: sqlite3.Connection, version: int, name: str) -> dict[int, JSONObject]:
    """attempt -> what its steps said, as the runner last recorded them (the final reading, once it ended): steps,
    the metric's mean and 95% interval (`high` None: no upper bound), start-up (launch to the end of its first
    step) and the median step time, in seconds; None where unknown. An attempt that left no steps has none."""
    if version < SINCE_SCHEMA:
        return {}
    return {attempt: {"steps": steps, "mean": _finite(mean), "low": _finite(low), "high": _finite(high),
                      "startup": _finite(startup), "step_seconds": _finite(step)}
            for attempt, startup, step, steps, mean, low, high in db.execute(ATTEMPTS, (name,))}
