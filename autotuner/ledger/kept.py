"""The swept keys' values kept in the ledger (schema 4: the `swept` rows, one per experiment by position, and the
one `leaves` row they are kept by): written in the transaction that adds experiments, read by every report of the
whole sweep. Which keys vary, and how adding experiments changes that, is swept.py's; this is where its answers
live in SQLite. Every function works on the ledger's connection inside the caller's transaction.
"""
from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence

from ..jsonvalues import JSONObject
from . import swept
from .rows import Corrupt, json_object

Kept = tuple[list[str], list[tuple[str, JSONObject]]]  # the swept keys, and (name, values) per experiment


def keep(db: sqlite3.Connection, start: int, added: Sequence[JSONObject],
         specs: Callable[[], list[JSONObject]]) -> None:
    """After experiments from position `start` were added (their specs as recorded): the leaves extended by them
    and their values of the swept keys written; where that is not enough (`swept.extend`), every experiment's
    worked out again from `specs()`."""
    leaves = _leaves(db, start) if start else swept.Leaves({}, frozenset(), 0)
    found = swept.extend(leaves, added) if leaves is not None else None
    if found is None:
        keep_anew(db, specs())
    else:
        _write(db, start, added, *found)


def keep_anew(db: sqlite3.Connection, specs: Sequence[JSONObject]) -> None:
    """Every experiment's values of the swept keys worked out from the specs and written: when the leaves kept
    are not enough, and once for a ledger from before version 4."""
    db.execute("DELETE FROM swept")
    _write(db, 0, specs, *swept.summarize(specs))


def _write(db: sqlite3.Connection, start: int, specs: Sequence[JSONObject], leaves: swept.Leaves,
           values: Sequence[JSONObject]) -> None:
    db.executemany("INSERT INTO swept VALUES (?, ?, ?)",
                   [(start + i, spec.get("name"), json.dumps(v)) for i, (spec, v) in enumerate(zip(
                       specs, values, strict=True))])
    db.execute("INSERT OR REPLACE INTO leaves VALUES (1, ?)", (json.dumps(leaves.to_json()),))


def _leaves(db: sqlite3.Connection, count: int) -> swept.Leaves | None:
    """The leaves kept, if they cover exactly the first `count` experiments (None: none kept, or experiments
    were added without them since, or they are not ours)."""
    row = db.execute("SELECT value FROM leaves").fetchone()
    if row is None:
        return None
    try:
        leaves = swept.Leaves.from_json(json.loads(row[0]))
    except (TypeError, ValueError, RecursionError):  # not JSON, a blob, nested too deep: not ours
        return None
    return leaves if leaves is not None and leaves.count == count else None


def in_place(db: sqlite3.Connection) -> bool:
    """Whether the kept values have a row for each experiment, at its position and with its name, and none
    else, and leaves that cover them all: what the runner checks before it adds (in SQL, nothing decoded:
    every runner start pays it; readers check the values themselves in `read`)."""
    count = db.execute("SELECT COUNT(*) FROM experiments").fetchone()[0]
    matched = db.execute("SELECT COUNT(*) FROM experiments e JOIN swept s ON s.position = e.position "
                         "AND s.name = e.name").fetchone()[0]
    kept = db.execute("SELECT COUNT(*) FROM swept").fetchone()[0]
    return bool(matched == kept == count) and _leaves(db, count) is not None


def read(db: sqlite3.Connection, version: int, corrupt: Corrupt) -> Kept | None:
    """The swept keys and each experiment's values of them (name, values), in the sweep's order: a few values
    each, where working them out decoded and compared every config. None for a ledger that keeps none whole (from
    before version 4, not yet resumed), or whose rows disagree with the experiments or the leaves (a name or a
    position not the experiment's, a key not swept)."""
    if version < 4:
        return None
    cursor = db.cursor()
    cursor.row_factory = None
    rows = cursor.execute("SELECT e.name, s.name, s.params FROM experiments e LEFT JOIN swept s "
                          "ON s.position = e.position ORDER BY e.position").fetchall()
    leaves = _leaves(db, len(rows))  # after the rows: an add committed between them changed the count
    if leaves is None or any(kept != name for name, kept, _ in rows) or \
            db.execute("SELECT COUNT(*) FROM swept").fetchone()[0] != len(rows):  # none beyond them
        return None
    values = [(name, json_object(params, "swept.params", corrupt)) for name, _, params in rows]
    return (leaves.keys, values) if swept.agree(leaves.keys, [v for _, v in values]) else None
