"""The swept parameters (`views.analysis.swept_specs`): configs of one shape are compared a column at a time, any
other sweep leaf by leaf; both must say what the plain definition says, which this file keeps as the reference:
every config flattened, each leaf compared with its key's first value (type and value), a key some lack swept."""
from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from types import MappingProxyType

import pytest

from autotuner.ledger import swept
from autotuner.views.analysis import swept_specs

FIELDS = ("num_gpus", "num_nodes")
MISSING = object()


def reference(specs: list[dict]) -> tuple[list[str], list[dict]]:
    """The definition, written as plainly as it reads (the product's code before the column path)."""
    def flat(node: Mapping, prefix: str = "") -> dict:
        out: dict = {}
        for key, value in node.items():
            if isinstance(value, Mapping) and value:
                out.update(flat(value, f"{prefix}{key}."))
            else:
                out[f"{prefix}{key}"] = value
        return out

    def lacks(spec: dict, key: str) -> bool:
        node = spec.get("ds_config") or {}
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return True
            node = node[part]
        return False

    def same(a: object, b: object) -> bool:
        if isinstance(a, (list, dict)) or isinstance(b, (list, dict)):
            return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
        return a is b or (type(a) is type(b) and a == b)

    rows = [flat(spec.get("ds_config") or {}) | {k: spec.get(k) for k in FIELDS} for spec in specs]
    first: dict = {}
    varying = set()
    for row in rows:
        for key, value in row.items():
            if key not in first:
                first[key] = value
            elif not same(value, first[key]):
                varying.add(key)
    varying |= {k for k in first if any(k not in row and lacks(spec, k) for spec, row in zip(specs, rows, strict=True))}
    keys = [k for k in first if k in varying]
    return keys, [{k: row[k] for k in keys if k in row} for row in rows]


LEAVES = [0, 1, 2, 1.0, 2.5, -0.0, 0.0, True, False, None, "cpu", "none", [1, 2], [1.0, 2], [], {}, [{"a": 1}]]


def leaf(rng: random.Random) -> object:
    value = rng.choice([*LEAVES, math.nan])
    return json.loads(json.dumps(value)) if isinstance(value, (list, dict)) else value  # objects of its own


def config(rng: random.Random, depth: int = 0) -> dict:
    out: dict = {}
    for key in rng.sample(["a", "b", "c", "d.e", "stage", "num_gpus"], rng.randint(1, 4)):
        if key == "num_gpus" and (depth or rng.random() < 0.8):
            continue  # now and then a ds_config key named like an experiment field
        out[key] = config(rng, depth + 1) if depth < 2 and rng.random() < 0.4 else leaf(rng)
    return out


def varied(rng: random.Random, node: dict, reshape: bool) -> dict:
    """`node` with other values; with `reshape`, now and then another shape (a key gone or added, an object for a
    value or a value for an object)."""
    out: dict = {}
    for key, value in node.items():
        if reshape and rng.random() < 0.1:
            continue
        if isinstance(value, dict) and value:
            out[key] = leaf(rng) if reshape and rng.random() < 0.1 else varied(rng, value, reshape)
        else:
            out[key] = config(rng, 2) if reshape and rng.random() < 0.05 else (
                leaf(rng) if rng.random() < 0.3 else json.loads(json.dumps(value)) if isinstance(value, (list, dict))
                else value)
    if reshape and rng.random() < 0.1:
        out[rng.choice("xyz")] = leaf(rng)
    return out


def exact(rows: list[dict]) -> list[list[tuple]]:
    return [[(k, type(v).__name__, json.dumps(v, sort_keys=True)) for k, v in row.items()] for row in rows]


def random_sweep(rng: random.Random, reshape: bool) -> list[dict]:
    base = config(rng)
    return [{"ds_config": base if i == 0 else varied(rng, base, reshape),
             **{k: rng.choice([1, 2, 1.0, True, None]) for k in FIELDS if rng.random() < 0.9}}
            for i in range(rng.randint(1, 8))]


@pytest.mark.parametrize("reshape", [False, True])
def test_the_swept_keys_and_values_are_the_definitions_for_random_sweeps(reshape, monkeypatch):
    by_column = {"taken": 0}
    columns = swept._by_column

    def counted(specs):
        found = columns(specs)
        by_column["taken"] += found is not None
        return found

    monkeypatch.setattr(swept, "_by_column", counted)
    rng = random.Random(20261126 + reshape)
    for _ in range(600):
        specs = random_sweep(rng, reshape)
        keys, rows = swept_specs(specs)
        want_keys, want_rows = reference(specs)
        assert keys == want_keys, specs
        assert exact(rows) == exact(want_rows), specs
    # both ways were taken (the draws are seeded): one shape, more often without reshaping (a value drawn as an
    # empty object, or a key named like a field, makes a sweep go the other way), and the others
    assert 300 < by_column["taken"] < 600 if not reshape else 50 < by_column["taken"] < 300


def test_one_shape_that_is_not_plain_dicts_or_has_empty_objects_is_compared_leaf_by_leaf():
    """A read-only mapping, an empty object and a value where another config holds an object: the leaf-by-leaf
    way, with the same answer."""
    proxy = [{"ds_config": MappingProxyType({"a": MappingProxyType({"b": i})}), "num_gpus": 1} for i in (1, 2)]
    assert swept_specs(proxy) == (["a.b"], [{"a.b": 1}, {"a.b": 2}])
    empty = [{"ds_config": {"a": {}, "b": 1}}, {"ds_config": {"a": {}, "b": 2}}]
    assert swept_specs(empty) == (["b"], [{"b": 1}, {"b": 2}]) == reference(empty)
    mixed = [{"ds_config": {"a": {"b": 1}}}, {"ds_config": {"a": 5}}]
    assert swept_specs(mixed) == reference(mixed) == (["a.b"], [{"a.b": 1}, {}])  # `a` is no value in the first


@pytest.mark.parametrize("reshape", [False, True])
def test_leaves_extended_as_experiments_come_say_what_the_definition_says(reshape):
    """As the ledger keeps them: the first experiments summarized, the rest added a few at a time (`extend`,
    or `summarize` of all where extend says it cannot), the leaves through their JSON between adds."""
    rng = random.Random(20261127 + reshape)
    extended = anew = 0
    for _ in range(600):
        specs = json.loads(json.dumps(random_sweep(rng, reshape)).replace("NaN", "0.5"))  # as a ledger holds them
        end = rng.randint(1, len(specs))
        leaves, values = swept.summarize(specs[:end])
        while end < len(specs):
            chunk = specs[end:end + rng.randint(1, 3)]
            leaves = swept.Leaves.from_json(json.loads(json.dumps(leaves.to_json())))
            found = swept.extend(leaves, chunk)
            end += len(chunk)
            if found is None:
                anew += 1
                leaves, values = swept.summarize(specs[:end])
            else:
                extended += 1
                leaves, more = found
                values = values + more
            want_keys, want_rows = reference(specs[:end])
            assert (leaves.keys, exact(values), leaves.count) == (want_keys, exact(want_rows), end), specs[:end]
    assert extended > 200 and anew > 200  # both ways taken (seeded draws)


def test_leaves_not_written_by_to_json_are_none():
    for data in (None, [], {"first": {}, "varying": [], "count": -1}, {"first": {}, "varying": ["a"], "count": 1},
                 {"first": {}, "varying": [], "count": True}, {"first": [], "varying": [], "count": 0},
                 {"first": {}, "varying": [], "count": 0, "more": 1}, {"first": {}, "varying": [[1]], "count": 0},
                 {"first": {"1": 1}, "varying": [1], "count": 1}, {"first": {}, "varying": [], "count": 2.0}):
        assert swept.Leaves.from_json(data) is None, data
    assert swept.Leaves.from_json({"first": {"a": 1}, "varying": ["a"], "count": 2}) == \
        swept.Leaves({"a": 1}, frozenset({"a"}), 2)
