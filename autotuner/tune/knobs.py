"""The ZeRO knobs `autotune tune` searches in full mode (`autotuning.fast: false`), per ZeRO stage, and how a
config fixes one (a value) or states its own values to search (a list, DeepSpeed's way of writing a tuning
space in `zero_optimization`).

The spaces follow DeepSpeed's own full mode (stage 0: nothing; 1: the bucket sizes; 2 and 3: overlap_comm,
reduce_scatter, contiguous_gradients and the bucket sizes), with one change: ZeRO-3's engine (DeepSpeed 0.19)
reads neither `allgather_partitions` nor `allgather_bucket_size`, so stage 3 searches the bucket it does read,
`stage3_prefetch_bucket_size`, in their place. Each knob's first value is DeepSpeed's default: the config a
stage's micro-batch search ran with, from which the knob search starts."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import limits
from ..errors import shown
from ..jsonvalues import JSON, JSONObject
from ..spec.model import positive_int

if TYPE_CHECKING:  # a type only: the views that show a tune's knobs do not import the hjson readers
    from ..spec.reading import Source

SIZES = (500_000_000, 50_000_000, 1_000_000_000)  # bucket sizes (elements), DeepSpeed's default first


@dataclass(frozen=True)
class Knob:
    """One zero_optimization key (or, `top`, a key of the config itself): its short tag in experiment names, the
    values searched (the default first), the stages searched by default in full mode, and the stages whose engine
    reads it (a config's own list of values is searched at those)."""

    key: str
    tag: str
    values: tuple[JSON, ...]
    searched: frozenset[int]
    read: frozenset[int]
    top: bool = False

    @property
    def flag(self) -> bool:
        return isinstance(self.values[0], bool)

    def default(self, stage: int) -> JSON:
        """DeepSpeed's default at `stage` (overlap_comm is on by default only at ZeRO-3)."""
        return stage == 3 if self.key == "overlap_comm" else self.values[0]


KNOBS = (
    Knob("overlap_comm", "ovl", (False, True), frozenset({2, 3}), frozenset({1, 2, 3})),
    Knob("reduce_scatter", "rs", (True, False), frozenset({2, 3}), frozenset({1, 2, 3})),
    Knob("contiguous_gradients", "cg", (True, False), frozenset({2, 3}), frozenset({1, 2, 3})),
    Knob("reduce_bucket_size", "rbs", SIZES, frozenset({1, 2, 3}), frozenset({1, 2, 3})),
    Knob("allgather_bucket_size", "abs", SIZES, frozenset({1, 2}), frozenset({1, 2})),
    Knob("stage3_prefetch_bucket_size", "pbs", (50_000_000, 5_000_000, 500_000_000), frozenset({3}),
         frozenset({3})),
)
# Gradient accumulation, searched only where the config lists its values (in either mode: DeepSpeed's autotuner
# takes 1 in place of a list); a config key, not a zero_optimization one, at every stage.
ACCUMULATION = Knob("gradient_accumulation_steps", "gas", (1,), frozenset(), frozenset({0, 1, 2, 3}), top=True)
BY_KEY = {knob.key: knob for knob in (*KNOBS, ACCUMULATION)}
MAX_SETTINGS = 4096  # knob combinations of one stage, at most (a config's lists multiply)

# One stage's knob space: key -> the values searched, the one its micro-batch search ran with first.
Space = dict[str, list[JSON]]


def knob_spaces(src: Source, zero: Mapping[str, JSON], stages: Sequence[int], fast: bool) -> dict[int, Space]:
    """Each stage's knobs to search: none in fast mode; in full mode the table's, less every knob the config
    fixes (a value), with the config's own list where it gives one. Values are checked: each error located."""
    listed: dict[str, list[JSON]] = {}
    for key, value in zero.items():
        knob = BY_KEY.get(key)
        knob = None if knob is not None and knob.top else knob  # not a zero_optimization key
        if key == "stage":  # the stages are searched in both modes (spec/inputs.py reads them)
            continue
        if isinstance(value, list):
            if knob is None:
                raise src.error(f"zero_optimization.{key}: a list of values can be searched only for "
                                f"{', '.join(BY_KEY)}", key)
            if fast:
                raise src.error(f"zero_optimization.{key}: a list of values is searched in full mode only: set "
                                "autotuning.fast to false", key)
            if not value:
                raise src.error(f"zero_optimization.{key}: an empty list of values", key)
            values = [_checked(src, knob, v) for v in value]
            if len(set(values)) != len(values):
                raise src.error(f"zero_optimization.{key}: a value is listed twice", key)
            if not any(stage in knob.read for stage in stages):  # searched nowhere: refused, not skipped
                raise src.error(f"zero_optimization.{key}: a list of values, but the engine of no stage searched "
                                f"({', '.join(map(str, stages))}) reads it (read at stages "
                                f"{', '.join(map(str, sorted(knob.read)))})", key)
            listed[key] = values
        elif knob is not None and value != "auto":  # "auto": a Trainer script fills it in (fixed all the same)
            _checked(src, knob, value)
    spaces: dict[int, Space] = {}
    for stage in stages:
        space: Space = {}
        for knob in KNOBS:
            if knob.key in listed and stage in knob.read:
                space[knob.key] = listed[knob.key]
            elif not fast and knob.key not in zero and stage in knob.searched:
                default = knob.default(stage)
                space[knob.key] = [default, *(v for v in knob.values if v != default)]
        count = 1
        for values in space.values():
            count *= len(values)
        if count > MAX_SETTINGS:
            raise src.error(f"zero_optimization: {count} combinations of knob values at stage {stage}, more "
                            f"than {MAX_SETTINGS}: list fewer values", "zero_optimization")
        spaces[stage] = space
    return spaces


def accumulation_values(src: Source, value: JSON, derived: bool) -> list[int] | None:
    """The values of `gradient_accumulation_steps` to search: the config's list (checked, each error located),
    else None. `derived`: the config states the global batch (train_batch_size, max_train_batch_size), from which
    accumulation follows for each micro-batch size: a list then has nothing to search."""
    if not isinstance(value, list):
        return None
    key = ACCUMULATION.key
    if derived:
        raise src.error(f"{key}: a list of values, but the global batch the config states (train_batch_size or "
                        "max_train_batch_size) derives it for each micro-batch size: give one or the other", key)
    value = [whole(v) for v in value]
    if not value or not all(positive_int(v) and v <= limits.COUNT for v in value):
        raise src.error(f"{key}: a list of positive whole numbers (at most {limits.COUNT:,}) to search, not "
                        f"{shown(value)}", key)
    if len(set(value)) != len(value):
        raise src.error(f"{key}: a value is listed twice", key)
    return list(value)


def with_accumulation(spaces: dict[int, Space], values: list[int] | None) -> dict[int, Space]:
    """Each stage's knob space with the accumulation values to search (none: as it is)."""
    return spaces if not values else {stage: {**space, ACCUMULATION.key: values} for stage, space in spaces.items()}


def first_values(zero: Mapping[str, JSON]) -> JSONObject:
    """The config's zero_optimization as each run starts from: a listed knob at its first value (as checked)."""
    return {k: (whole(v[0]) if isinstance(v, list) and k in BY_KEY else v) for k, v in zero.items()}


def _checked(src: Source, knob: Knob, value: JSON) -> JSON:
    """A knob value as DeepSpeed takes it: true/false for a switch, a whole number of elements (5e8 too) for a
    bucket size."""
    if knob.flag:
        if not isinstance(value, bool):
            raise src.error(f"zero_optimization.{knob.key} must be true or false, not {shown(value)}", knob.key)
        return value
    number = whole(value)
    if not positive_int(number):
        raise src.error(f"zero_optimization.{knob.key} must be a positive whole number of elements (e.g. 5e8), "
                        f"not {shown(value)}", knob.key)
    return number


def whole(value: JSON) -> JSON:
    """5e8 (a float in JSON) as the whole number it is; anything else as it is. JSON has one kind of number, and
    its users write sizes as DeepSpeed's docs do (5e8, 1e3): a whole number is one however it is written."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def tag_value(value: JSON) -> str:
    """A knob value in an experiment name: 1/0 for a switch, a size as 5e8 where it is one."""
    if isinstance(value, bool):
        return str(int(value))
    digits = str(value)
    stripped = digits.rstrip("0")
    zeros = len(digits) - len(stripped)
    return f"{stripped}e{zeros}" if zeros >= 3 else digits
