"""What the pictures of a sweep show, worked out without matplotlib: the keys a sweep varies, the plot's axes,
how busy the slots were, and the timeline's rows. `autotune report` and `status` stay free of plotting imports.
"""
from __future__ import annotations

import json
import time
from collections.abc import Hashable, Iterable, Mapping, Sequence
from pathlib import Path

from ..errors import UserError
from ..jsonvalues import JSON, JSONObject
from ..ledger.lock import holder_pid
from ..ledger.store import Attempt, Ledger
from ..spec import FIELD_KEYS, Experiment

DEFAULT_X = "train_micro_batch_size_per_gpu"
DEFAULT_LINES = "zero_optimization.stage"
MISSING = object()  # what `value_of` gives for a key an experiment lacks


# What a JSON leaf is: none of them is a Mapping, and asking isinstance(..., Mapping) of one goes through the ABC
# machinery (most of `flatten`'s time on the 10,000 configs of a report).
_LEAVES = (str, int, float, list, type(None))


def flatten(config: Mapping[str, JSON], prefix: str = "") -> JSONObject:
    """Leaf values of a nested ds_config under their dotted keys."""
    out: JSONObject = {}
    _flatten_into(config, prefix, out)
    return out


def _flatten_into(config: Mapping[str, JSON], prefix: str, out: JSONObject) -> None:
    """Every level writes into the one `out`: a dict made and merged per nested object was a third of the time
    on whole configs (optimizer, scheduler, ZeRO settings: `benchmarks/scale.py --full-configs`)."""
    for key, value in config.items():
        if (value.__class__ is dict or (not isinstance(value, _LEAVES) and isinstance(value, Mapping))) and value:
            _flatten_into(value, f"{prefix}{key}.", out)
        else:
            out[f"{prefix}{key}"] = value


def value_of(experiment: Experiment, key: str) -> JSON:
    if key in FIELD_KEYS:
        return getattr(experiment, key)
    node: JSON = experiment.ds_config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return MISSING
        node = node[part]
    return node


def spec_of(experiment: Experiment) -> JSONObject:
    """What `swept_specs` reads of an experiment: its ds_config, num_gpus and num_nodes (as the ledger's spec)."""
    return {"ds_config": experiment.ds_config} | {k: getattr(experiment, k) for k in FIELD_KEYS}


def _leaves(spec: Mapping[str, JSON]) -> JSONObject:
    out: JSONObject = {}
    _flatten_into(spec.get("ds_config") or {}, "", out)
    for key in FIELD_KEYS:  # over a ds_config key of the same name, in its place (as `|` merges)
        out[key] = spec.get(key)
    return out


def _lacks(spec: Mapping[str, JSON], key: str) -> bool:
    node: JSON = spec.get("ds_config") or {}
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return True
        node = node[part]
    return False


_EXACT = json.JSONEncoder(sort_keys=True).encode  # made once: json.dumps(sort_keys=True) makes one a call


def _fingerprint(value: JSON) -> Hashable:
    """A hashable stand-in for a JSON value that tells 1, 1.0 and True apart (as JSON does)."""
    if isinstance(value, (list, dict)):
        return _EXACT(value)
    return (type(value), value)


_COMPOSITE = object()  # marks a list's or an object's fingerprint among the first values of `swept_specs`


def swept_specs(specs: Sequence[Mapping[str, JSON]]) -> tuple[list[str], list[JSONObject]]:
    """The keys whose value differs between experiments (or that some lack), in first-seen order, and each
    experiment's values of those keys (a key it lacks left out), from their specs as the ledger records them
    (`spec_of`): what the report, `autotuner.load` and the plots call the swept parameters. Values are the same
    when of the same type and value (lists and objects as their JSON). Configs of one shape are compared a
    column at a time (`_swept_by_column`); any other sweep's leaves each with its key's first value."""
    found = _swept_by_column(specs)
    if found is not None:
        return found
    table = [_leaves(spec) for spec in specs]
    first: JSONObject = {}  # key -> the first value seen; a list or an object as (_COMPOSITE, its JSON)
    varying: set[str] = set()
    for row in table:
        for key, value in row.items():
            was = first.get(key, MISSING)
            if was is MISSING:
                first[key] = (_COMPOSITE, _fingerprint(value)) if isinstance(value, (list, dict)) else value
            elif key in varying:
                continue
            elif isinstance(value, (list, dict)):
                if was != (_COMPOSITE, _fingerprint(value)):
                    varying.add(key)
            elif value is not was and (value.__class__ is not was.__class__ or value != was):  # as tuples compare
                varying.add(key)
    # a key some experiments lack also varies (a row with every key seen lacks none)
    varying |= {k for k in first if k not in varying and any(
        k not in row and _lacks(spec, k) for spec, row in zip(specs, table, strict=True) if len(row) < len(first))}
    keys = [k for k in first if k in varying]
    return keys, [{k: row[k] for k in keys if k in row} for row in table]


def _swept_by_column(specs: Sequence[Mapping[str, JSON]]) -> tuple[list[str], list[JSONObject]] | None:
    """`swept_specs` of the usual sweep, where every config has one shape (the same keys, nested alike: one base
    config, values swept): each key's values compared a column at a time, no config flattened (flattening every
    one was most of a report's time on whole configs). None for any other sweep."""
    configs = [spec.get("ds_config") or {} for spec in specs]
    columns: dict[str, list[JSON]] = {}
    if not configs or any(key in configs[0] for key in FIELD_KEYS) or not _leaf_columns(configs, "", columns):
        return None
    for key in FIELD_KEYS:
        columns[key] = [spec.get(key) for spec in specs]
    keys = [key for key, column in columns.items() if _varies(column)]
    if not keys:
        return keys, [{} for _ in specs]
    return keys, [dict(zip(keys, values, strict=True)) for values in zip(*(columns[k] for k in keys), strict=True)]


def _leaf_columns(nodes: Sequence[Mapping[str, JSON]], prefix: str, columns: dict[str, list[JSON]]) -> bool:
    """Each leaf's values under `prefix` (one per node, dotted keys in the first node's order) into `columns`;
    False where the nodes are not all of one shape (a key some lack, an object in one and a value in another,
    an empty object, a mapping that is no dict)."""
    shape = nodes[0].keys()
    if any(node.keys() != shape for node in nodes):
        return False
    for key in nodes[0]:
        column = [node[key] for node in nodes]
        kinds = set(map(type, column))
        if kinds == {dict} and all(column):
            if not _leaf_columns(column, f"{prefix}{key}.", columns):
                return False
        elif any(issubclass(kind, Mapping) for kind in kinds):
            return False
        else:
            columns[f"{prefix}{key}"] = column
    return True


def _varies(values: list[JSON]) -> bool:
    """Whether one key's values (every experiment has it) are not all the same type and value, compared a column
    at a time in sets, where a loop compared each with the first (most of the swept keys' time on whole configs)."""
    if len(set(map(type, values))) > 1:
        return True
    if isinstance(values[0], (list, dict)):
        return len(set(map(_fingerprint, values))) > 1
    return len(set(values)) > 1


def swept_keys(experiments: Iterable[Experiment]) -> list[str]:
    """Dotted keys (and num_gpus / num_nodes) whose value differs between experiments, in first-seen order."""
    return swept_specs([spec_of(e) for e in experiments])[0]


def choose_axes(experiments: Sequence[Experiment], x: str | None, lines: str | None) -> tuple[str, str | None]:
    """The x key and the lines key: as named (each must exist in some experiment), else sensible defaults."""
    present = set()
    for e in experiments:
        present |= set(flatten(e.ds_config)) | set(FIELD_KEYS)
    swept = swept_keys(experiments)
    for key, option in ((x, "--x"), (lines, "--lines")):
        if key is not None and key not in present:
            raise UserError(f"{option} {key}: no experiment of this sweep has that ds_config key; swept keys: "
                            f"{', '.join(swept) or 'none'}")
    if x is None:
        numeric = [k for k in swept if all(isinstance(value_of(e, k), (int, float)) for e in experiments)]
        x = DEFAULT_X if DEFAULT_X in swept or (DEFAULT_X in present and not numeric) else (
            numeric[0] if numeric else (swept[0] if swept else DEFAULT_X))
    if lines is None:
        if DEFAULT_LINES in swept and x != DEFAULT_LINES:
            lines = DEFAULT_LINES
        else:
            lines = next((k for k in swept if k != x), None)
    if lines == x:
        raise UserError(f"--x and --lines name the same key {x}")
    return x, lines


# --- the timeline --------------------------------------------------------------------------------------------
def utilisation(attempts: Sequence[Attempt], slots: Mapping[str, Sequence[int]], now: float) -> JSONObject:
    """Busy slot-seconds / (slots x makespan), for the sweep and for each host; makespan from the first
    start to the last end (now, for attempts still running)."""
    spans = [(a, a.started_at, a.finished_at if a.finished_at is not None else now)
             for a in attempts if a.started_at is not None]
    if not spans:
        return {"makespan_s": 0.0, "busy_slot_s": 0.0, "slots": sum(len(v) for v in slots.values()),
                "utilisation": None, "per_host": {h: None for h in slots}}
    start = min(s for _, s, _ in spans)
    end = max(e for _, _, e in spans)
    makespan = max(end - start, 1e-9)
    busy: dict[str, float] = {h: 0.0 for h in slots}
    for a, s, e in spans:
        for host, ids in a.slots.items():
            busy[host] = busy.get(host, 0.0) + max(e - s, 0.0) * len(ids)
    count = {h: len(slots.get(h, ())) for h in busy}
    total = sum(count.values())
    return {"start": start, "end": end, "makespan_s": end - start, "busy_slot_s": sum(busy.values()),
            "slots": total, "utilisation": sum(busy.values()) / (total * makespan) if total else None,
            "per_host": {h: (busy[h] / (count[h] * makespan) if count[h] else None) for h in busy}}


def slot_rows(slots: Mapping[str, Sequence[int]], attempts: Sequence[Attempt]) -> list[tuple[str, int]]:
    rows = [(h, i) for h, ids in slots.items() for i in sorted(ids)]
    known = set(rows)
    for a in attempts:
        for h, ids in a.slots.items():
            for i in ids:
                if (h, i) not in known:
                    known.add((h, i))
                    rows.append((h, i))
    return rows


def all_attempts(directory: Path) -> list[Attempt]:
    with Ledger.open(directory) as ledger:
        return ledger.attempts()


def timeline_end(directory: Path, attempts: Sequence[Attempt]) -> float:
    """Where running attempts end on the timeline: now while a runner holds the sweep; else (the runner died,
    `resume` will record them interrupted) the last time the ledger knows of."""
    if holder_pid(Path(directory)) is not None:
        return time.time()
    known = [t for a in attempts for t in (a.started_at, a.launched_at, a.finished_at) if t is not None]
    return max(known, default=time.time())
