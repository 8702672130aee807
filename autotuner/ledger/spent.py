"""Slot-seconds held by a sweep's attempts, as SQL over the `attempts` table: the one place that says what an
attempt holds (its slots, from its start to its end), so that `status`, `report`, `compare` and the dashboard
count GPU-hours alike (views/gpu_hours.py turns these into hours).

An attempt counts once it has ended: every attempt, retries, re-runs and failed ones too; a running one not yet.
An attempt's slots are its commas plus one (`{"h": [0, 1], "g": [3]}`: host names hold no comma, no host has an
empty list), where json_each made 10,000 attempts cost 90 ms. Every function works on the ledger's connection.
Also here: the attempts stopping ended before their window's end (`early_stops`), the rows GPU-hours saved are
estimated from; only those rows are read, so the estimate adds nothing per experiment to a report.
"""
from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from ..jsonvalues import JSONObject
from ..states import Reason, State

_SLOTS = "(length(slots) - length(replace(slots, ',', '')) + 1)"
_ENDED = "started_at IS NOT NULL AND finished_at IS NOT NULL AND slots IS NOT NULL"
_FEW = 500  # names a query reads by at most (SQLite bounds a statement's parameters)
# Ended attempts that stopping ended early, with what their steps said (schema 7's `measures`): stopped because
# they could not win, or succeeded through a stop asked once they were measured until sure (the `stops` row). A step
# time longer than its attempt is none (its steps' clock was not the runner's: a runner before the scheduler kept
# such out recorded it, and it priced the steps saved at up to inf).
# Two selects, each led by a small set (the index on state; the stops: CROSS JOIN keeps SQLite from leading with every
# succeeded attempt), not a scan of every attempt's measures.
_MEASURED = (f"SELECT a.name, m.steps, m.step_time, {_SLOTS}, e.spec FROM {{}} JOIN measures m ON m.name = a.name "
             f"AND m.attempt = a.attempt JOIN experiments e ON e.name = a.name WHERE {_ENDED} AND m.step_time > 0 "
             "AND m.step_time <= a.finished_at - a.started_at AND a.state = ?")
_EARLY = (_MEASURED.format("attempts a") + " UNION ALL " + _MEASURED.format(
    "stops s CROSS JOIN attempts a ON a.name = s.name AND a.attempt = s.attempt") + " AND s.reason = ?")


@dataclass(frozen=True)
class Spent:
    """Slot-seconds one experiment's ended attempts held: in all, those up to a time (`until`: the best's end),
    and those of attempts recorded with a given reason (a run stopped because it could not win)."""

    seconds: float
    until: float
    with_reason: float


@dataclass(frozen=True)
class EarlyStop:
    """An attempt stopping ended before its window's end: its experiment, the steps it measured (of its measured
    window: spec/progress.py `Window`), its median step time (seconds), its slots, and its config's `autotuning`
    section (what its window is made of)."""

    name: str
    steps: int
    step_seconds: float
    slots: int
    autotuning: JSONObject


def early_stops(db: sqlite3.Connection) -> list[EarlyStop]:
    """Every ended attempt stopped as outclassed or ended once measured until sure that left a step time. Only its
    config's autotuning section is taken from its spec: no experiment is built (on 2,000 of them, 56 of 66 ms)."""
    rows = db.execute(_EARLY, (State.STOPPED, State.SUCCEEDED, Reason.SURE)).fetchall()
    return [EarlyStop(str(name), int(steps), float(step), int(slots), _autotuning(spec))
            for name, steps, step, slots, spec in rows]


def _autotuning(spec: str) -> JSONObject:
    """The autotuning section of an experiment's recorded spec (none: empty)."""
    try:
        config = json.loads(spec).get("ds_config")
    except (ValueError, AttributeError, RecursionError):
        return {}
    section = config.get("autotuning") if isinstance(config, dict) else None
    return section if isinstance(section, dict) else {}


def _sums(until: float | None, reason: str | None) -> tuple[str, list[object]]:
    """The three sums of `Spent` as SQL, and their parameters (`until` None: nothing is up to it; `reason` None:
    = NULL matches no row)."""
    held = f"MAX(finished_at - started_at, 0) * {_SLOTS}"
    return (f"SUM({held}), SUM(MAX(MIN(finished_at, ?) - started_at, 0) * {_SLOTS}), "
            f"SUM(CASE WHEN reason = ? THEN {held} ELSE 0 END)"), [until if until is not None else -math.inf, reason]


def _spent(row: Sequence[float | None]) -> Spent:
    """A row of the sums (NULL: no attempt to sum)."""
    return Spent(float(row[0] or 0.0), float(row[1] or 0.0), float(row[2] or 0.0))


def total(db: sqlite3.Connection, until: float | None = None, reason: str | None = None) -> Spent:
    """What every ended attempt of the sweep held, summed in one pass (no row per experiment: on 10,000 attempts
    a sixth of `by_name`'s time)."""
    sums, first = _sums(until, reason)
    return _spent(db.execute(f"SELECT {sums} FROM attempts WHERE {_ENDED}", first).fetchone())


def by_name(db: sqlite3.Connection, until: float | None = None, reason: str | None = None,
         names: Sequence[str] | None = None) -> dict[str, Spent]:
    """name -> what its ended attempts held (see `Spent`), of every experiment that has one, or of `names` only."""
    sums, first = _sums(until, reason)
    query = f"SELECT name, {sums} FROM attempts WHERE {_ENDED}"
    if names is None:
        rows = db.execute(query + " GROUP BY name", first).fetchall()
    else:
        listed = list(dict.fromkeys(names))
        rows = []
        for i in range(0, len(listed), _FEW):
            chunk = listed[i:i + _FEW]
            rows += db.execute(query + f" AND name IN ({','.join('?' * len(chunk))}) GROUP BY name",
                               [*first, *chunk]).fetchall()
    return {r[0]: Spent(r[1], r[2], r[3]) for r in rows}  # a group has rows: no NULL sum
