"""Slot-seconds held by a sweep's attempts, as SQL over the `attempts` table: the one place that says what an
attempt holds (its slots, from its start to its end), so that `status`, `report`, `compare` and the dashboard
count GPU-hours alike (views/gpu_hours.py turns these into hours).

An attempt counts once it has ended: every attempt, retries, re-runs and failed ones too; a running one not yet.
An attempt's slots are its commas plus one (`{"h": [0, 1], "g": [3]}`: host names hold no comma, no host has an
empty list), where json_each made 10,000 attempts cost 90 ms. Every function works on the ledger's connection.
"""
from __future__ import annotations

import math
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

_SLOTS = "(length(slots) - length(replace(slots, ',', '')) + 1)"
_ENDED = "started_at IS NOT NULL AND finished_at IS NOT NULL AND slots IS NOT NULL"
_FEW = 500  # names a query reads by at most (SQLite bounds a statement's parameters)


@dataclass(frozen=True)
class Held:
    """Slot-seconds one experiment's ended attempts held: in all, those up to a time (`until`: the best's end),
    and those of attempts recorded with a given reason (a run stopped because it could not win)."""

    seconds: float
    until: float
    with_reason: float


def held(db: sqlite3.Connection, until: float | None = None, reason: str | None = None,
         names: Sequence[str] | None = None) -> dict[str, Held]:
    """name -> what its ended attempts held (see `Held`), of every experiment that has one, or of `names` only.
    `until` None: nothing counts as up to it."""
    query = (f"SELECT name, SUM(MAX(finished_at - started_at, 0) * {_SLOTS}), "
             f"SUM(MAX(MIN(finished_at, ?) - started_at, 0) * {_SLOTS}), "
             f"SUM(CASE WHEN reason = ? THEN MAX(finished_at - started_at, 0) * {_SLOTS} ELSE 0 END) "
             f"FROM attempts WHERE {_ENDED}")
    first = [until if until is not None else -math.inf, reason]  # reason None: = NULL matches no row
    if names is None:
        rows = db.execute(query + " GROUP BY name", first).fetchall()
    else:
        listed = list(dict.fromkeys(names))
        rows = []
        for i in range(0, len(listed), _FEW):
            chunk = listed[i:i + _FEW]
            rows += db.execute(query + f" AND name IN ({','.join('?' * len(chunk))}) GROUP BY name",
                               [*first, *chunk]).fetchall()
    return {str(r[0]): Held(float(r[1] or 0.0), float(r[2] or 0.0), float(r[3] or 0.0)) for r in rows}
