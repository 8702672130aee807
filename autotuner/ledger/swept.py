"""The keys a sweep varies, and each experiment's values of them: worked out from the specs, and kept up to date
as experiments are added (`Leaves`), so the ledger can hold them beside the specs.

A key is swept when its value differs between experiments (the same means the same type and value, lists and
objects compared as their JSON), or when some experiment lacks it. Keys are a ds_config's dotted leaf keys, plus
`num_gpus` and `num_nodes`, in first-seen order. Comparing every config again at each report was most of a
report's time on whole configs: 10,000 decoded, flattened and compared.
"""
from __future__ import annotations

import json
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from ..jsonvalues import JSON, JSONObject
from ..spec import FIELD_KEYS
from ..spec.model import dotted_value

MISSING = object()  # what a lookup gives for a key an experiment lacks

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


def leaves_of(spec: Mapping[str, JSON]) -> JSONObject:
    """An experiment's leaves, from its spec as the ledger records it: its ds_config's, then num_gpus and
    num_nodes (over a ds_config key of the same name, in its place, as `|` merges)."""
    out: JSONObject = {}
    _flatten_into(spec.get("ds_config") or {}, "", out)
    for key in FIELD_KEYS:
        out[key] = spec.get(key)
    return out


def lacks(spec: Mapping[str, JSON], key: str) -> bool:
    """Whether the spec's ds_config has nothing at the key's path (an object there is not nothing)."""
    return dotted_value(spec.get("ds_config") or {}, key, MISSING) is MISSING


_EXACT = json.JSONEncoder(sort_keys=True).encode  # made once: json.dumps(sort_keys=True) makes one a call
_COMPOSITE = object()  # marks a list's or an object's fingerprint among the values `summarize` compares with


def fingerprint(value: JSON) -> Hashable:
    """A hashable stand-in for a JSON value that tells 1, 1.0 and True apart (as JSON does)."""
    if isinstance(value, (list, dict)):
        return _EXACT(value)
    return (type(value), value)


@dataclass(frozen=True)
class Leaves:
    """What the swept keys are worked out from, kept as experiments are added: every leaf key with its first
    value (first seen first), the keys that vary, and how many experiments (the first `count`) it covers."""

    first: Mapping[str, JSON]
    varying: frozenset[str]
    count: int

    @property
    def keys(self) -> list[str]:
        """The swept keys, in first-seen order."""
        return [key for key in self.first if key in self.varying]

    def to_json(self) -> JSONObject:
        return {"first": dict(self.first), "varying": sorted(self.varying), "count": self.count}

    @classmethod
    def from_json(cls, data: JSON) -> Leaves | None:
        """None for anything `to_json` did not write."""
        if not isinstance(data, dict) or set(data) != {"first", "varying", "count"}:
            return None
        first, varying, count = data["first"], data["varying"], data["count"]
        if not (isinstance(first, dict) and isinstance(varying, list)
                and all(isinstance(k, str) and k in first for k in varying)
                and isinstance(count, int) and not isinstance(count, bool) and count >= 0):
            return None
        return cls(first, frozenset(varying), count)


def values_of(keys: Sequence[str], rows: Sequence[Mapping[str, JSON]]) -> list[JSONObject]:
    """Each experiment's values of the swept keys (a key it lacks left out)."""
    if not keys:
        return [{} for _ in rows]
    return [{k: row[k] for k in keys if k in row} for row in rows]


def agree(keys: Sequence[str], values: Sequence[Mapping[str, JSON]]) -> bool:
    """Whether values kept can be the values of these swept keys: none holds another key, and each key is held
    by some experiment (a swept key was some experiment's leaf)."""
    wanted, seen = set(keys), set[str]()
    for row in values:
        if not row.keys() <= wanted:
            return False
        seen.update(row)
    return seen == wanted


def summarize(specs: Sequence[Mapping[str, JSON]]) -> tuple[Leaves, list[JSONObject]]:
    """The leaves of these specs (the ledger's, in the sweep's order), and each one's values of the swept keys.
    Configs of one shape are compared a column at a time (`_by_column`); any other sweep's leaves each with its
    key's first value."""
    found = _by_column(specs)
    if found is not None:
        return found
    table = [leaves_of(spec) for spec in specs]
    first: JSONObject = {}  # key -> the first value seen
    seen: dict[str, object] = {}  # key -> what it is compared by: the value; a list or object (_COMPOSITE, JSON)
    varying: set[str] = set()
    for row in table:
        for key, value in row.items():
            was = seen.get(key, MISSING)
            if was is MISSING:
                first[key] = value
                seen[key] = (_COMPOSITE, fingerprint(value)) if isinstance(value, (list, dict)) else value
            elif key in varying:
                continue
            elif isinstance(value, (list, dict)):
                if was != (_COMPOSITE, fingerprint(value)):
                    varying.add(key)
            elif value is not was and (value.__class__ is not was.__class__ or value != was):  # as tuples compare
                varying.add(key)
    # a key some experiments lack also varies (a row with every key seen lacks none)
    varying |= {k for k in first if k not in varying and any(
        k not in row and lacks(spec, k) for spec, row in zip(specs, table, strict=True) if len(row) < len(first))}
    leaves = Leaves(first, frozenset(varying), len(specs))
    return leaves, values_of(leaves.keys, table)


def extend(leaves: Leaves, specs: Sequence[Mapping[str, JSON]]) -> tuple[Leaves, list[JSONObject]] | None:
    """The leaves once these specs are added after the `leaves.count` summarized, and the new specs' values of
    the swept keys; None where the earlier experiments' values must be worked out again (`summarize` of every
    spec): a key that now varies, or a new key where an earlier config may hold an object."""
    if leaves.count == 0:
        return summarize(specs)
    first, varying, rows = dict(leaves.first), set(leaves.varying), []
    for spec in specs:
        row = leaves_of(spec)
        for key, value in row.items():
            was = first.get(key, MISSING)
            if was is MISSING:
                if any(known.startswith(key + ".") for known in first):
                    return None
                first[key] = value  # the earlier experiments lack it
                varying.add(key)
            elif key not in varying and fingerprint(value) != fingerprint(was):
                varying.add(key)
        if len(row) < len(first):
            varying |= {k for k in first if k not in row and k not in varying and lacks(spec, k)}
        rows.append(row)
    if varying != leaves.varying:
        return None
    extended = Leaves(first, frozenset(varying), leaves.count + len(specs))
    return extended, values_of(extended.keys, rows)


def _by_column(specs: Sequence[Mapping[str, JSON]]) -> tuple[Leaves, list[JSONObject]] | None:
    """`summarize` of the usual sweep, where every config has one shape (the same keys, nested alike: one base
    config, values swept): each key's values compared a column at a time, no config flattened (flattening every
    one was most of a report's time on whole configs). None for any other sweep."""
    configs = [spec.get("ds_config") or {} for spec in specs]
    columns: dict[str, list[JSON]] = {}
    if not configs or any(key in configs[0] for key in FIELD_KEYS) or not _leaf_columns(configs, "", columns):
        return None
    for key in FIELD_KEYS:
        columns[key] = [spec.get(key) for spec in specs]
    leaves = Leaves({key: column[0] for key, column in columns.items()},
                    frozenset(key for key, column in columns.items() if _varies(column)), len(specs))
    keys = leaves.keys
    if not keys:
        return leaves, [{} for _ in specs]
    return leaves, [dict(zip(keys, values, strict=True)) for values in zip(*(columns[k] for k in keys), strict=True)]


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
        return len(set(map(fingerprint, values))) > 1
    return len(set(values)) > 1
