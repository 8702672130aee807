"""The ledger's rows decoded: its JSON values and its attempts, every value checked, one that this code did not
write (damage, an edit by hand) refused as a corrupt ledger by the `Corrupt` the caller passes.

Reading is what every read command does 10,000 or 100,000 times, so the common case takes the short path:
JSON through the C scanner json.loads itself ends in (json.loads adds a Python call and a whitespace check
per value), anything it does not take whole (whitespace around the value, not JSON) through json.loads, which
gives the same value or refuses it as before.
"""
from __future__ import annotations

import json
import json.scanner
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..errors import UserError
from ..jsonvalues import JSON, JSONObject
from .attempt import ATTEMPT_DEFAULTS, REASONS, STATES, Attempt
from .schema import short

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


def decode_attempts(columns: Sequence[str], rows: Iterable[Sequence[object]], corrupt: Corrupt) -> list[Attempt]:
    """Attempts from their rows (`columns`: the names of the rows' values), every value checked. Built without
    Attempt's generated __init__ (a frozen dataclass sets its 19 fields one `object.__setattr__` at a time: the
    largest part of `autotune status` on a large sweep), states and reasons by a dict look-up, and the few
    distinct slot texts decoded once (each attempt still gets its own dict)."""
    out: list[Attempt] = []
    missing = {k: v for k, v in ATTEMPT_DEFAULTS.items() if k not in columns}  # an older version's ledger
    unknown = sorted(set(columns) - set(ATTEMPT_DEFAULTS))
    slot_texts: dict[str, dict[str, object]] = {}
    new, put = object.__new__, object.__setattr__
    for row in rows:
        if unknown:  # a column Attempt lacks: what Attempt(**data) refused
            raise TypeError(f"unexpected attempts columns {unknown}")
        data: dict[str, Any] = dict(zip(columns, row, strict=True))  # sqlite3 gives a row's values as Any
        if missing:
            data.update(missing)
        text = data["slots"]
        if text:
            known = slot_texts.get(text)
            if known is None:
                known = slot_texts[text] = json_object(text, "attempts.slots", corrupt)
            data["slots"] = {host: list(ids) if isinstance(ids, list) else ids for host, ids in known.items()}
        else:
            data["slots"] = {}
        text = data["metrics"]
        data["metrics"] = json_object(text, "attempts.metrics", corrupt) if text else {}
        state, reason = STATES.get(data["state"]), data["reason"]
        if state is None or (reason is not None and reason not in REASONS):
            raise corrupt(f"attempts: {short(str(data['name']))} attempt {data['attempt']} has an unknown state or "
                          f"reason ({short(str(data['state']))}, {short(str(data['reason']))})")
        data["state"] = state
        if reason is not None:
            data["reason"] = REASONS[reason]
        metric = data["metric"]
        if metric is not None and (not isinstance(metric, (int, float)) or not -_FLOAT_MAX <= metric <= _FLOAT_MAX):
            raise corrupt(f"attempts: {short(str(data['name']))} attempt {data['attempt']} has a metric that is no "
                          f"finite number ({short(str(metric))})")
        peak = data["peak_memory"]
        if peak is not None and (not isinstance(peak, int) or isinstance(peak, bool)):
            raise odd_peak(data["name"], peak, corrupt)
        attempt = new(Attempt)
        put(attempt, "__dict__", data)
        out.append(attempt)
    return out
