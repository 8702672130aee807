"""The ledger's rows decoded: its JSON values and its attempts, every value checked, one that this code did not
write (damage, an edit by hand) refused as a corrupt ledger by the `Corrupt` the caller passes. Also what a row
is read as (`attempt_columns`) and, for the writer, what it must not write (`unreadable`).

Reading is what every read command does 10,000 or 100,000 times, so the common case takes the short path:
JSON through the C scanner json.loads itself ends in (json.loads adds a Python call and a whitespace check
per value), anything it does not take whole (whitespace around the value, not JSON) through json.loads, which
gives the same value or refuses it as before.
"""
from __future__ import annotations

import functools
import json
import json.scanner
import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..errors import UserError
from ..jsonvalues import JSON, JSONObject
from ..states import Reason, State
from .attempt import FIELDS, REASONS, STATES, Attempt
from .schema import RENAMED, expected_columns, short

_FLOAT_MAX = sys.float_info.max
Corrupt = Callable[[str], UserError]  # a detail -> the one-line error naming the ledger


def _no_constant(name: str) -> None:
    """NaN and Infinity: Python's json reads them, no writer of the ledger writes them (the metrics read from a
    run drop them), and `report --format json` would hand them on as JSON no other reader takes."""
    raise ValueError(f"{name} is not a JSON number")


# typeshed names the scanner's context as the scanner's own type; json itself passes its decoder, as here
_SCAN = json.scanner.make_scanner(json.JSONDecoder(parse_constant=_no_constant))  # type: ignore[arg-type]


def json_value(text: str, where: str, corrupt: Corrupt, kind: type = object) -> JSON:
    """A JSON value the ledger holds. One that does not decode (or is not a `kind`) was not written by us."""
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except (TypeError, ValueError, RecursionError):
        raise corrupt(f"{where} is not JSON") from None
    if not isinstance(value, kind):
        raise corrupt(f"{where} is not a JSON {'object' if kind is dict else kind.__name__}")
    return value


def json_object(text: str, where: str, corrupt: Corrupt) -> JSONObject:
    """`json_value(text, where, corrupt, dict)`, by the short path when the text is one JSON object alone."""
    try:
        value, end = _SCAN(text, 0)
    except (StopIteration, TypeError, ValueError, RecursionError):
        value, end = None, -1
    if end != len(text) or not isinstance(value, dict):
        value = json_value(text, where, corrupt, dict)
    return value


def odd_peak(name: object, peak: object, corrupt: Corrupt) -> UserError:
    return corrupt(f"attempts: {short(str(name))} has a peak_memory that is no whole number of bytes "
                   f"({short(str(peak))!r})")


def decode_attempts(rows: Iterable[Sequence[Any]], corrupt: Corrupt) -> list[Attempt]:
    """Attempts from their rows, each row Attempt's fields in order (`Ledger._rows` selects them so, NULL for a
    column an older version lacks), every value checked. Each attempt's dict is made by one literal (sized once,
    no column looked up by name: a third of the time a dict zipped from the row and filled in took) and set
    without Attempt's generated __init__ (a frozen dataclass sets its 19 fields one `object.__setattr__` at a
    time); states and reasons by a dict look-up, and the few distinct slot texts decoded once (each attempt
    still gets its own dict)."""
    out: list[Attempt] = []
    slot_texts: dict[str, dict[str, object]] = {}
    new, put = object.__new__, object.__setattr__
    for (name, attempt, state, queued_at, reason, detail, started_at, finished_at, slots, tag, pid, launched_at,
         port, directory, exit_code, metric, metrics, handle, peak_memory) in rows:
        if slots:
            known = slot_texts.get(slots)
            if known is None:
                known = slot_texts[slots] = json_object(slots, "attempts.slots", corrupt)
            slots = {host: list(ids) if isinstance(ids, list) else ids for host, ids in known.items()}
        else:
            slots = {}
        metrics = json_object(metrics, "attempts.metrics", corrupt) if metrics else {}
        word = STATES.get(state)
        if word is None or (reason is not None and reason not in REASONS):
            raise corrupt(f"attempts: {short(str(name))} attempt {attempt} has an unknown state or reason "
                          f"({short(str(state))}, {short(str(reason))})")
        if reason is not None:
            reason = REASONS[reason]
        if metric is not None and (not isinstance(metric, (int, float)) or not -_FLOAT_MAX <= metric <= _FLOAT_MAX):
            raise corrupt(f"attempts: {short(str(name))} attempt {attempt} has a metric that is no finite number "
                          f"({short(str(metric))})")
        if peak_memory is not None and (not isinstance(peak_memory, int) or isinstance(peak_memory, bool)):
            raise odd_peak(name, peak_memory, corrupt)
        record = new(Attempt)
        put(record, "__dict__", {
            "name": name, "attempt": attempt, "state": word, "queued_at": queued_at, "reason": reason,
            "detail": detail, "started_at": started_at, "finished_at": finished_at, "slots": slots, "tag": tag,
            "pid": pid, "launched_at": launched_at, "port": port, "dir": directory, "exit_code": exit_code,
            "metric": metric, "metrics": metrics, "handle": handle, "peak_memory": peak_memory})
        out.append(record)
    return out


def stop_words(name: object, attempt: object, state: object, detail: object, reason: object,
               corrupt: Corrupt) -> tuple[State, str, Reason]:
    """A recorded stop's row (`stops`) as its words; one this code did not write is refused as corrupt."""
    word, why = STATES.get(str(state)), REASONS.get(str(reason))
    if word is None or why is None or not isinstance(detail, str):
        raise corrupt(f"stops: {short(str(name))} attempt {attempt} has an unknown state or reason "
                      f"({short(str(state))}, {short(str(reason))})")
    return word, detail, why


def unreadable(reason: object, metric: float | None, metrics: Mapping[str, float] | None) -> str | None:
    """What of a finished attempt its readers would refuse (`decode_attempts`): a reason not in the vocabulary, a
    metric that is no finite number, a metrics value that JSON has no number for. None when there is none."""
    if reason is not None and str(reason) not in REASONS:
        return f"{reason!r} is no reason"
    if metric is not None and not math.isfinite(metric):
        return f"the metric {metric} is no finite number"
    if metrics and not all(math.isfinite(v) for v in metrics.values() if isinstance(v, (int, float))):
        return "a metric that is no finite number"
    return None


@functools.cache
def attempt_columns(version: int) -> str:
    """Attempt's fields as columns of `a`, in order: a column by its older name in a ledger of `version` from
    before its rename (the handle was a Slurm step before 8), NULL for those it lacks (a step before version 2,
    a peak before 3)."""
    have = {column[1] for column in expected_columns(max(1, version))["attempts"]}
    named = {new: old for since, old, new in RENAMED if version < since and old in have}
    return ", ".join(f"a.{named[name]} AS {name}" if name in named else f"a.{name}" if name in have
                     else f"NULL AS {name}" for name in FIELDS)
