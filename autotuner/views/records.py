"""A sweep's results for programs: one record per experiment with its swept parameters and every metric the
ledger holds (`autotuner.load`), as flat rows, and as a pandas DataFrame when pandas is installed.

The report's table, CSV, JSON, Markdown and HTML are made from the same records, so every output shows the
same columns. Flat column names are the parameters' dotted keys and the metrics' names; one that is already
taken (DeepSpeed's metrics file holds `rank`, which is also the report's rank) gets a `params.` or `metrics.`
prefix.
"""
from __future__ import annotations

import importlib
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, overload

from ..jsonvalues import JSON, JSONObject
from ..ledger.store import Attempt, Ledger
from ..spec.metrics import KNOWN, Metric
from ..spec.progress import autotp_size
from ..states import Reason, State
from ..tune.layout import arg_value
from ..tune.space import SearchSpec
from .analysis import spec_of, swept_specs
from .gpu_hours import GpuHours, gpu_hours
from .snapshot import Snapshot, format_slots, load
from .tflops import model_facts, per_sample, with_tflops

# The flat columns every row has, around the parameters and metrics (see `SweepResults.columns`).
LEADING = ("rank", "best", "name", "state")
TRAILING = ("metric", "reason", "detail", "attempt", "started", "finished", "duration_s", "gpu_hours", "peak_memory",
            "slots")
PANDAS_HINT = "to_dataframe() needs pandas, which is not installed: pip install pandas"


@dataclass(frozen=True)
class ExperimentRecord:
    """One experiment as its latest attempt left it."""

    name: str
    state: State
    reason: Reason | None
    detail: str | None
    attempt: int  # the latest attempt's number (1 unless retried or resumed)
    rank: int | None  # 1 is the best; None when it did not succeed
    best: bool
    metric: float | None  # the value of the sweep's metric
    parameters: Mapping[str, JSON]  # swept key -> value; None where this experiment lacks the key
    metrics: Mapping[str, float]  # everything its metrics file held that is a number
    started: float | None  # seconds since the epoch
    finished: float | None
    slots: Mapping[str, tuple[int, ...]]  # host -> slot ids it ran on
    sweep_directory: Path
    gpu_type: str | None = None  # the GPU type it ran on, in a sweep that ran on several (else None)
    peak_memory: int | None = None  # bytes: the most it held on one GPU, where measured (peaks.py)
    gpu_hours: float | None = None  # what all its attempts that ended held (gpu_hours.py); None: none has ended

    @property
    def directory(self) -> Path:
        """Its files: exp.json, ds_config.json, cmd.txt, stdout.log, stderr.log, metrics.json."""
        return self.sweep_directory / self.name

    @property
    def duration(self) -> float | None:
        """Seconds from start to end; None until it has ended."""
        return None if self.started is None or self.finished is None else self.finished - self.started


@dataclass(frozen=True)
class SweepResults(Sequence[ExperimentRecord]):
    """Every experiment of a sweep, ranked (succeeded best first, then the rest in sweep order); indexable by
    position or by name."""

    directory: Path
    name: str
    metric: Metric
    parameters: tuple[str, ...]  # the swept keys: ds_config keys as the ledger holds them (sorted), num_gpus, num_nodes
    metrics: tuple[str, ...]  # every metric name recorded: the sweep's first, then DeepSpeed's, then the rest
    records: tuple[ExperimentRecord, ...]
    typed: bool = False  # it ran on several GPU types: ranked per type, each type's best marked, a gpu_type each
    in_sweep_order: tuple[ExperimentRecord, ...] = ()  # the same records in the sweep's order (default: `records`)
    ranking: tuple[int, ...] = ()  # records[k] is in_sweep_order[ranking[k]]
    hours: GpuHours | None = None  # the sweep's GPU-hours: in all, on the best config, until the best ended

    def __post_init__(self) -> None:
        if not self.in_sweep_order:  # made without them: the records as they are
            object.__setattr__(self, "in_sweep_order", self.records)
            object.__setattr__(self, "ranking", tuple(range(len(self.records))))

    @property
    def best(self) -> ExperimentRecord | None:
        return next((r for r in self.records if r.best), None)

    @cached_property
    def measured_memory(self) -> bool:
        """Whether any experiment's peak GPU memory was measured: the table, Markdown and HTML show the column
        then (asked once per row: kept)."""
        return any(r.peak_memory is not None for r in self.in_sweep_order)

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[ExperimentRecord]:
        return iter(self.records)

    @overload
    def __getitem__(self, key: int | str) -> ExperimentRecord: ...

    @overload
    def __getitem__(self, key: slice) -> Sequence[ExperimentRecord]: ...

    def __getitem__(self, key: int | str | slice) -> ExperimentRecord | Sequence[ExperimentRecord]:
        if isinstance(key, str):
            found = next((r for r in self.records if r.name == key), None)
            if found is None:
                raise KeyError(key)
            return found
        return self.records[key]

    def column_names(self) -> dict[str, str]:
        """Flat column -> what it holds: itself for the fixed ones, "params.KEY" or "metrics.NAME" for the rest."""
        leading = self.leading()
        taken = set(leading) | set(TRAILING)
        named: dict[str, str] = {}
        for prefix, keys in (("params.", self.parameters), ("metrics.", self.metrics)):
            for key in keys:
                column = key if key not in taken else prefix + key
                taken.add(column)
                named[column] = prefix + key
        return {c: c for c in leading} | named | {c: c for c in TRAILING}

    def leading(self) -> tuple[str, ...]:
        """The first columns: rank, best, name (its GPU type, in a sweep on several), state."""
        return (*LEADING[:3], "gpu_type", *LEADING[3:]) if self.typed else LEADING

    def metric_columns(self) -> list[str]:
        """The flat column of each metric, in `metrics` order: its name, or `metrics.NAME` where that is taken."""
        named = self.column_names()
        return [c for c, source in named.items() if source.startswith("metrics.")]

    def columns(self) -> list[str]:
        """The flat columns, in order: rank, best, name, state, the parameters, the metrics, then the rest."""
        return list(self.column_names())

    def rows(self, in_sweep_order: bool = False) -> list[dict[str, object]]:
        """One flat dict per record (the CSV's rows, the DataFrame's), ranked or in the sweep's order: plain str
        for state and reason, slots as `host:0,1@host2:0`, times in seconds since the epoch."""
        named = self.column_names()
        params = [(c, s[len("params."):]) for c, s in named.items() if s.startswith("params.")]
        metrics = [(c, s[len("metrics."):]) for c, s in named.items() if s.startswith("metrics.")]
        out: list[dict[str, object]] = []
        for r in self.in_sweep_order if in_sweep_order else self.records:
            # one dict filled in column order (five merged dicts a row took twice as long)
            row: dict[str, object] = {"rank": r.rank, "best": r.best, "name": r.name}
            if self.typed:
                row["gpu_type"] = r.gpu_type
            row["state"] = str(r.state)
            for c, k in params:
                row[c] = r.parameters.get(k)
            for c, k in metrics:
                row[c] = r.metrics.get(k)
            duration = r.duration  # then TRAILING, one key at a time (a dict of them merged was a tenth)
            row["metric"] = r.metric
            row["reason"] = None if r.reason is None else str(r.reason)
            row["detail"] = r.detail
            row["attempt"] = r.attempt
            row["started"] = r.started
            row["finished"] = r.finished
            row["duration_s"] = None if duration is None else round(duration, 3)
            row["gpu_hours"] = r.gpu_hours
            row["peak_memory"] = r.peak_memory
            row["slots"] = format_slots(r.slots)
            out.append(row)
        return out

    def to_dataframe(self) -> Any:  # a pandas.DataFrame: pandas has no type information (no py.typed, no stubs)
        """A pandas DataFrame of `rows()`, one row per experiment; ImportError naming pandas without it."""
        try:
            pandas = importlib.import_module("pandas")
        except ImportError:
            raise ImportError(PANDAS_HINT) from None
        return pandas.DataFrame(self.rows(), columns=self.columns())


def metric_names(primary: Metric, recorded: Sequence[Mapping[str, float]],
                 ranked: Sequence[int] | None = None) -> tuple[str, ...]:
    """Every metric name recorded: the sweep's first, then DeepSpeed's known ones, then the rest as first seen
    (in the `ranked` order of `recorded`, when given: asked only when there are two or more such names)."""
    seen = dict.fromkeys(itertools.chain.from_iterable(recorded))
    first = [primary.name] + [k for k in KNOWN if k != primary.name and k in seen]
    rest = [k for k in seen if k not in first]
    if len(rest) > 1 and ranked is not None:
        rest = [k for k in dict.fromkeys(itertools.chain.from_iterable(recorded[i] for i in ranked)) if k not in first]
    return tuple(first + rest)


def from_snapshot(snap: Snapshot) -> SweepResults:
    """The records of a snapshot (read with or without every experiment: their specs are read if missing), made
    in the sweep's order and ranked last (see `Snapshot.order`)."""
    keys, values, tflop = _tune_columns(snap, *_swept(snap))
    hours = gpu_hours(snap)
    per = hours.per_experiment
    attempts, order = snap.attempts, snap.order
    typed = snap.by_type  # ranked per GPU type, each type's best marked
    bests = {id(a) for a in snap.best_by_type.values()} if typed else set()
    best = snap.best
    best_name = best.name if best is not None else None
    primary, directory = snap.metric.name, snap.directory
    kinds = [snap.type_of(a) for a in attempts] if typed else [None] * len(attempts)  # each asked once
    positions = _positions(attempts, order, kinds if typed else None)
    records = []
    count = len(keys)  # a row holds no key but swept ones (kept rows are checked, worked-out ones made so)
    new, put, done = object.__new__, object.__setattr__, State.SUCCEEDED  # a member looked up once, not per row
    for a, row, position, kind in zip(attempts, values, positions, kinds, strict=True):
        metrics = a.metrics  # its own dict, as decoded: shared with the attempt, which the snapshot holds read-only
        if a.metric is not None and primary not in metrics:  # the ranking value is a metric of the record even
            metrics = {**metrics, primary: a.metric}  # where `metrics` lacks it
        if tflop:
            metrics = with_tflops(metrics, tflop.get(a.name))
        # Filled as its generated __init__ would (every field, in order): a frozen dataclass's __init__ sets its
        # 16 fields one object.__setattr__ at a time, 10,000 times for a report of 10,000.
        record = new(ExperimentRecord)
        put(record, "__dict__", {
            "name": a.name, "state": a.state, "reason": a.reason, "detail": a.detail, "attempt": a.attempt,
            "rank": position if a.state == done else None,
            "best": id(a) in bests if typed else a.name == best_name and best_name is not None,
            "metric": a.metric, "parameters": row if len(row) == count else {k: row.get(k) for k in keys},
            "metrics": metrics, "started": a.started_at, "finished": a.finished_at,
            "slots": {h: tuple(ids) for h, ids in a.slots.items()}, "sweep_directory": directory,
            "gpu_type": kind, "peak_memory": a.peak_memory, "gpu_hours": per.get(a.name)})
        records.append(record)
    ranked = tuple([records[i] for i in order])
    return SweepResults(snap.directory, snap.name, snap.metric, tuple(keys),
                        metric_names(snap.metric, [r.metrics for r in records], order), ranked, typed, tuple(records),
                        tuple(order), hours)


def _positions(attempts: Sequence[Attempt], order: Sequence[int], kinds: Sequence[str | None] | None) -> list[int]:
    """Each attempt's place in the ranking (its rank, if it succeeded); in a sweep on several GPU types (`kinds`:
    each attempt's), its place among the succeeded attempts of its type."""
    positions = [0] * len(order)
    for place, i in enumerate(order, 1):
        positions[i] = place
    if kinds is not None:
        counted: dict[str | None, int] = {}
        for i in order:
            if attempts[i].state == State.SUCCEEDED:
                counted[kinds[i]] = positions[i] = counted.get(kinds[i], 0) + 1
    return positions


def _swept(snap: Snapshot) -> tuple[list[str], list[JSONObject]]:
    """The swept keys, and each attempt's values of them (in `snap.attempts` order, each its own dict): as the
    ledger keeps them; for a ledger that keeps none (from before version 4), or keeps more than the snapshot
    shows (an add since it was read: keys that vary only in experiments it lacks are no columns of it), worked
    out from the specs of those it shows, in the sweep's order (the columns then do not move as the ranking
    does)."""
    attempts = snap.attempts
    with Ledger.open(snap.directory) as ledger:
        kept = ledger.swept_values()
        if kept is not None and len(kept[1]) == len(attempts) and \
                all(name == a.name for (name, _), a in zip(kept[1], attempts, strict=True)):
            return kept[0], [values for _, values in kept[1]]
        attempted = {a.name for a in attempts}
        if all(name in snap.experiments for name in attempted):
            specs = {name: spec_of(e) for name, e in snap.experiments.items() if name in attempted}
        else:
            specs = {name: spec for spec in ledger.specs() if (name := str(spec.get("name"))) in attempted}
    keys, table = swept_specs(list(specs.values()))
    by_name = dict(zip(specs, table, strict=True))
    return keys, [by_name.get(a.name) or {} for a in attempts]


TP_KEY = "tensor_parallel.autotp_size"
DP_KEY = "dp"  # a tune's data-parallel size (world / TP): a column of its own beside the TP size


def layout_values(snap: Snapshot) -> tuple[list[str], dict[str, JSONObject]]:
    """A tune that searches a layout (tune/layout.py): the keys of its layout, and each experiment's values of
    them (`layout_rows`). ([], {}) for any other sweep."""
    spec = SearchSpec.from_json(snap.meta.search) if snap.meta.search is not None else None
    if spec is None or not (spec.tp or spec.script_knobs):
        return [], {}
    with Ledger.open(snap.directory) as ledger:
        return layout_rows(spec, ledger.specs())


def layout_rows(spec: SearchSpec | None, specs: Iterable[Mapping[str, JSON]]
                ) -> tuple[list[str], dict[str, JSONObject]]:
    """The keys of a tune's layout and each experiment's values of them, from the experiments' recorded specs: its
    TP size (even where one size is fixed), its data-parallel size (its GPUs / TP), each script knob's value as the
    script was handed it. ([], {}) for a sweep that is no such tune (`spec` None, or no layout). The report and
    the dashboard both show these."""
    if spec is None or not (spec.tp or spec.script_knobs):
        return [], {}
    by_name: dict[str, JSONObject] = {}
    for found in specs:
        config, args = found.get("ds_config") or {}, found.get("args") or []
        size = autotp_size(config) if isinstance(config, dict) else None
        row: JSONObject = {}
        if spec.tp and size is not None:  # the experiment's own GPUs: a tune may search world sizes
            gpus, nodes = found.get("num_gpus"), found.get("num_nodes")
            world = gpus * nodes if isinstance(gpus, int) and isinstance(nodes, int) else spec.world
            row = {TP_KEY: size, DP_KEY: max(1, world // size)}
        row |= {option: arg_value(args, option) for option in spec.script_knobs}
        by_name[str(found.get("name"))] = row
    return [*((TP_KEY, DP_KEY) if spec.tp else ()), *spec.script_knobs], by_name


def with_layout(keys: list[str], values: list[JSONObject], names: Iterable[str], layout: Sequence[str],
                by_name: Mapping[str, JSONObject]) -> tuple[list[str], list[JSONObject]]:
    """The swept keys and each experiment's values (`names`, in the same order), with a tune's layout (`layout`,
    `by_name`: `layout_rows`) beside them: the data-parallel size next to the TP size."""
    added = [k for k in layout if k not in keys]
    if not added:
        return keys, values
    rows = []
    for name, row in zip(names, values, strict=True):
        extra = by_name.get(name, {})
        rows.append({**row, **{k: extra[k] for k in added if extra.get(k) is not None}})
    ordered = [*keys, *(k for k in added if k != DP_KEY)]
    if DP_KEY in added:  # beside the TP size
        ordered.insert(ordered.index(TP_KEY) + 1, DP_KEY)
    return ordered, rows


def _tune_columns(snap: Snapshot, keys: list[str], values: list[JSONObject]
                  ) -> tuple[list[str], list[JSONObject], dict[str, float]]:
    """The swept keys and values with a tune's layout beside them (`with_layout`), and the TFLOP a sample costs
    each GPU of each experiment where the model's facts tell it (views/tflops.py); the ledger's specs read once
    for both, and only for a tune that has either."""
    spec = SearchSpec.from_json(snap.meta.search) if snap.meta.search is not None else None
    if spec is None:
        return keys, values, {}
    facts = model_facts(spec, {a.name: a for a in snap.attempts}.get)
    if facts is None and not (spec.tp or spec.script_knobs):
        return keys, values, {}
    with Ledger.open(snap.directory) as ledger:
        specs = ledger.specs()
    layout, by_name = layout_rows(spec, specs)
    keys, values = with_layout(keys, values, (a.name for a in snap.attempts), layout, by_name)
    return keys, values, per_sample(spec, facts, specs) if facts is not None else {}


def load_results(directory: str | Path) -> SweepResults:
    """`autotuner.load(DIR)`: a sweep's results, safe while it runs; a UserError when DIR holds no sweep."""
    return from_snapshot(load(Path(directory), every_experiment=False))
