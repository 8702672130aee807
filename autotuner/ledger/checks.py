"""The whole-ledger checks a writer (the runner, `cancel`) runs before it writes or takes a sweep
(`Ledger.check_whole`): every page, every JSON value, and the rows the runner takes as given. A damaged ledger is
refused then, with nothing changed; a reader finds damage where it reads instead.
"""
from __future__ import annotations

import sqlite3
import sys

from ..states import Reason, State
from .rows import Corrupt, json_value
from .schema import short

TIME_MAX = 1e11  # seconds since 1970 no clock of ours will read (year 5138): a larger time was not written by us


def pages(db: sqlite3.Connection, corrupt: Corrupt) -> None:
    """Every page of the file whole (SQLite's quick_check)."""
    problems = [row[0] for row in db.execute("PRAGMA quick_check")]
    if problems != ["ok"]:
        raise corrupt(problems[0])


def json_columns(db: sqlite3.Connection, version: int, corrupt: Corrupt) -> None:
    """Every JSON column of this version's tables holds what its readers decode."""
    for table, column, kind in (("experiments", "spec", dict), ("attempts", "slots", dict),
                                ("attempts", "metrics", dict), ("requests", "names", list),
                                *([("swept", "params", dict)] if version >= 4 else [])):
        _json_column(db, table, column, kind, corrupt)


def _json_column(db: sqlite3.Connection, table: str, column: str, kind: type, corrupt: Corrupt) -> None:
    """Every value of a JSON column decodes to a `kind`. SQLite's json_valid picks the suspects (10,000
    specs decoded in Python took a tenth of a second); Python judges them, since it also reads NaN, which
    SQLite does not. An SQLite without JSON functions sends every value to Python."""
    where = f"{column} IS NOT NULL" + (" AND " + column + " != ''" if table == "attempts" else "")
    try:
        found = db.execute(f"SELECT {column} FROM {table} WHERE {where} AND NOT "
                           f"(json_valid({column}) AND json_type({column}) = ?)",
                           ("object" if kind is dict else "array",)).fetchall()
    except sqlite3.OperationalError as e:
        if "no such function" not in str(e):
            raise
        found = db.execute(f"SELECT {column} FROM {table} WHERE {where}").fetchall()
    for (text,) in found:
        json_value(text, f"{table}.{column}", corrupt, kind)


def rows(db: sqlite3.Connection, corrupt: Corrupt) -> None:
    """What the runner takes as given and no writer of ours leaves: an attempt of no experiment (resume failed
    on it with a traceback), a time that is no clock's (seconds since 1970, below TIME_MAX: the summary's
    duration overflowed), a metric that is not finite."""
    orphan = db.execute("SELECT name FROM attempts WHERE name NOT IN (SELECT name FROM experiments) "
                        "LIMIT 1").fetchone()
    if orphan is not None:
        raise corrupt(f"attempts: {short(str(orphan[0]))} is an attempt of no experiment")
    for column in ("queued_at", "started_at", "launched_at", "finished_at"):
        odd = db.execute(f"SELECT name, {column} FROM attempts WHERE {column} IS NOT NULL AND NOT "
                         f"({column} BETWEEN 0 AND ?) LIMIT 1", (TIME_MAX,)).fetchone()
        if odd is not None:
            raise corrupt(f"attempts: {short(str(odd[0]))} has a {column} that is no time ({short(str(odd[1]))})")
    odd = db.execute("SELECT name, metric FROM attempts WHERE metric IS NOT NULL AND NOT "
                     "(metric BETWEEN ? AND ?) LIMIT 1", (-sys.float_info.max, sys.float_info.max)).fetchone()
    if odd is not None:
        raise corrupt(f"attempts: {short(str(odd[0]))} has a metric that is no finite number ({short(str(odd[1]))})")


def words(db: sqlite3.Connection, version: int, corrupt: Corrupt) -> None:
    """Every state and reason one this autotuner knows (what reading them would refuse later): the attempts',
    and the recorded stops' (schema 6)."""
    tables = ("attempts", "stops") if version >= 6 else ("attempts",)
    for table in tables:
        for column, known_words in (("state", State), ("reason", Reason)):
            known = [str(w) for w in known_words]
            marks = ",".join("?" * len(known))
            odd = db.execute(f"SELECT {column} FROM {table} WHERE {column} IS NOT NULL AND "
                             f"{column} NOT IN ({marks}) LIMIT 1", known).fetchone()
            if odd is not None:
                raise corrupt(f"{table}.{column} {str(odd[0])[:40]!r} is not one this autotuner knows")
