"""What `autotune report` prints: one row per experiment with every swept parameter and metric, ranked, for
people (a table fitted to the terminal, Markdown) and for programs (JSON, CSV), and the best config with its
command. Every format is made from the same records (`records.from_snapshot`).
"""
from __future__ import annotations

import csv
import itertools
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..errors import UserError
from ..limits import memory
from ..spec import ABBREVIATIONS
from ..spec.metrics import format_compact
from ..states import State
from ..tune.goal import Goal
from . import cost
from .gpu_hours import hours_text
from .records import ExperimentRecord, SweepResults, from_snapshot
from .scaling import Scaling, scaling
from .snapshot import Snapshot, format_slots, load
from .summary import batch_note, command_file, config_file, confirmation, memory_note, optimal, uncertain
from .tables import FORMATS, PLAIN, Cell, Column, Output, Styled, json_with_rows, markdown_table, render_table

_STATE_STYLES = {State.SUCCEEDED: "green", State.FAILED: "red", State.TIMED_OUT: "yellow", State.RUNNING: "cyan",
                 State.QUEUED: "dim", State.CANCELLED: "dim", State.STOPPED: "blue", State.INTERRUPTED: "magenta"}
# Headers of swept keys in the table: the experiment names' abbreviations, but words for the two counts.
_HEADERS = {**ABBREVIATIONS, "num_gpus": "gpus", "num_nodes": "nodes"}


def _json_row(r: ExperimentRecord, typed: bool) -> dict[str, object]:
    """One dict literal, the GPU type left out unless typed (three merged dicts a row were a fifth of a JSON
    report of 10,000)."""
    duration = r.duration
    row: dict[str, object] = {
        "rank": r.rank, "best": r.best, "name": r.name, "gpu_type": r.gpu_type, "state": r.state, "metric": r.metric,
        "reason": r.reason, "detail": r.detail, "attempt": r.attempt,
        "duration_s": round(duration, 3) if duration is not None else None, "gpu_hours": r.gpu_hours,
        "peak_memory": r.peak_memory,
        "slots": format_slots(r.slots), "parameters": r.parameters, "metrics": r.metrics, "started_at": r.started,
        "finished_at": r.finished}
    if not typed:
        del row["gpu_type"]
    return row


def render_report(directory: Path, fmt: str, output: Output = PLAIN, *, keep: list[object] | None = None,
                  goal: Goal | None = None) -> str:
    """`autotune report`: one row per experiment with every swept parameter and metric, as `fmt`. What it read
    is added to `keep`, if given: a caller that ends right after holds it rather than free it object by object.
    `goal`: the training run to price each config for (over the one the tune recorded: views/cost.py)."""
    if fmt not in FORMATS:
        raise UserError(f"unknown --format {fmt!r}; choose one of {', '.join(FORMATS)}")
    snap = load(directory, every_experiment=False)
    training = cost.costing(snap, cost.goal_of(snap, goal))  # a goal it cannot price: refused before any output
    sizes = scaling(snap)
    results = from_snapshot(snap)
    if keep is not None:
        keep += (snap, results)
    if fmt == "json":
        best = snap.best
        found = optimal(snap)
        return json_with_rows({"sweep": snap.name, "metric": snap.metric.name, "minimize": snap.metric.minimize,
                               "best": best.name if best else None, "counts": snap.counts(),
                               "parameters": list(results.parameters), "metrics": list(results.metrics),
                               "experiments": [_json_row(r, results.typed) for r in results.in_sweep_order],
                               "optimal": {"config": found[0], "command": found[1]} if found else None}
                              | {"gpu_hours": _hours_json(results)} | _per_type(snap) | confirmed_json(snap)
                              | ({"training": training.to_json()} if training else {})
                              | ({"scaling": sizes.to_json()} if sizes else {}), "experiments",
                              results.ranking)
    if fmt == "csv":
        return _csv(results, cost.csv_values(training) if training else None)
    if fmt == "md":
        return _markdown(results) + _hours_markdown(results) + (_scaling_markdown(sizes) if sizes else "") \
            + (_training_markdown(training) if training else "")
    notes = [note for note in (confirmation(snap), memory_note(snap), batch_note(snap)) if note]
    notes += [results.hours.line()] if results.hours else []
    return _report_table(results, output, notes) + (_scaling_table(sizes, output) if sizes else "") \
        + (_training_table(training, output) if training else "") + _optimal_text(snap)


def _hours_json(results: SweepResults) -> dict[str, float | None] | None:
    return results.hours.to_json() if results.hours else None


def _hours_markdown(results: SweepResults) -> str:
    """The sweep's GPU-hours, a line under the table."""
    return f"\n- {results.hours.line()}\n" if results.hours else ""


def _scaling_table(sizes: Scaling, output: Output) -> str:
    """Each world size's best config, its throughput per GPU and efficiency; where adding GPUs stops paying."""
    columns = [Column(h, right=h != "best config", whole=h == "best config") for h in Scaling.HEADERS]
    return "\n" + render_table(columns, sizes.cells(), title="scaling: the best config at each world size",
                               notes=[sizes.verdict(), "computed from: " + sizes.basis()], output=output, keep=1)


def _scaling_markdown(sizes: Scaling) -> str:
    table = markdown_table(Scaling.HEADERS, sizes.cells())
    return f"\n**scaling: the best config at each world size**\n\n{table}\n- {sizes.verdict()}\n" \
           f"- computed from: {sizes.basis()}\n"


def _training_table(training: cost.Costing, output: Output) -> str:
    """The training run priced for each config, the front marked, and the answer under it."""
    columns = [Column(h, right=h not in ("name", "front", "deadline"), whole=h == "name")
               for h in cost.headers(training)]
    return "\n" + render_table(columns, cost.cells(training), title="training run: " + cost.title(training),
                               notes=cost.notes(training), output=output, keep=1)


def _training_markdown(training: cost.Costing) -> str:
    table = markdown_table(cost.headers(training), cost.cells(training))
    return f"\n**training run: {cost.title(training)}**\n\n{table}\n" + "".join(f"- {line}\n"
                                                                               for line in cost.notes(training))


def confirmed_json(snap: Snapshot) -> dict[str, object]:
    """A tune's: how its winner was confirmed by re-runs (None: nothing was run again), what its memory model said."""
    if snap.meta.search is None:
        return {}
    return {"confirmation": confirmation(snap), "confirmed": (uncertain(snap) is None) if snap.runs else None,
            "memory": memory_note(snap), "batch": batch_note(snap)}


def _per_type(snap: Snapshot) -> dict[str, object]:
    """A sweep on several GPU types: each type's best, and its config and command (a metric compares only within
    one type)."""
    if not snap.by_type:
        return {}
    return {"best_by_type": {t: a.name for t, a in snap.best_by_type.items()},
            "optimal_by_type": {t: {"config": o[0], "command": o[1]} for t in snap.best_by_type
                                if (o := optimal(snap, gpu_type=t)) is not None}}


def _csv(results: SweepResults, training: dict[str, list[object]] | None = None) -> str:
    """One line per record, its values in `columns()` order (lists and objects as JSON): each row's dict taken
    as it is filled (in that order) where no value needs JSON, written in the sweep's order a line each, the
    lines then put in rank order (see `Snapshot.order`). `training`: the training run's columns
    (cost.CSV_COLUMNS) by name, after the rest (empty for a config not priced)."""
    values: list[Iterable[object]] = list(map(dict.values, results.rows(in_sweep_order=True)))
    if training is not None:
        empty = [None] * len(cost.CSV_COLUMNS)
        values = [[*row, *training.get(r.name, empty)] for row, r in zip(values, results.in_sweep_order, strict=True)]
    if {list, dict} & set(map(type, itertools.chain.from_iterable(values))):
        values = [[json.dumps(v) if isinstance(v, (list, dict)) else v for v in row] for row in values]
    lines = _Lines()
    writer = csv.writer(lines, lineterminator="\n")
    writer.writerow([*results.columns(), *(cost.CSV_COLUMNS if training is not None else ())])
    writer.writerows(values)
    ranked = [lines[1 + i] for i in results.ranking]
    ranked.insert(0, lines[0])  # the header: one copy of the whole text, not two
    return "".join(ranked)


class _Lines(list[str]):
    """Where csv.writer writes: one string per row it is given (its line, quoted and ended)."""

    write = list.append


def _value_text(value: object) -> str:
    """A parameter's value in a cell: text as it is, anything else as JSON; "-" where the experiment lacks it."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # as JSON writes it, without its cost on 10,000 rows
    return json.dumps(value, sort_keys=True)


_NUMBERS = {int, float}  # exactly: a bool is JSON's true or false


def _value_texts(records: Sequence[ExperimentRecord], key: str) -> list[str]:
    """`_value_text` of a column: a column of plain numbers (the usual sweep) by one C-level map."""
    values = [r.parameters[key] for r in records]
    if set(map(type, values)) <= _NUMBERS:
        return list(map(str, values))
    return [_value_text(v) for v in values]


def _why(r: ExperimentRecord) -> str:
    return f"[{r.reason}] {r.detail or ''}".rstrip() if r.reason else ""


def _duration(r: ExperimentRecord) -> str:
    return f"{r.duration:.1f}s" if r.duration is not None else ""


def _peak(r: ExperimentRecord) -> str:
    return memory(r.peak_memory) if r.peak_memory is not None else ""


def _markdown(results: SweepResults) -> str:
    typed, peaks, records = results.typed, results.measured_memory, results.in_sweep_order
    head = ["", "name", *(["GPU type"] if typed else []), "state", *results.parameters, *results.metric_columns(),
            "time", "GPU-hours", *(["peak memory"] if peaks else []), "reason"]
    columns: list[Sequence[str]] = [  # a column at a time, as the table's cells
        ["**best**" if r.best else str(r.rank or "") for r in records], [r.name for r in records],
        *([[r.gpu_type or "" for r in records]] if typed else []), [r.state for r in records],
        *(_value_texts(records, k) for k in results.parameters),
        *([format_compact(r.metrics.get(m)) for r in records] for m in results.metrics),
        [_duration(r) for r in records], [hours_text(r.gpu_hours) for r in records],
        *([[_peak(r) for r in records]] if peaks else []),
        [f"{r.reason}: {r.detail}" if r.reason else "" for r in records]]
    return markdown_table(head, list(zip(*columns, strict=True)), results.ranking)


def headers(keys: Sequence[str], taken: Sequence[str] = ()) -> dict[str, str]:
    """A short header for each swept key: its usual abbreviation, else the shortest dotted suffix that no other
    header has (`offload_optimizer.device` beside `offload_param.device`)."""
    out: dict[str, str] = {}
    used = set(taken)
    for key in keys:
        parts = key.split(".")
        choices = [_HEADERS[key]] if key in _HEADERS else []
        choices += [".".join(parts[i:]) for i in range(len(parts) - 1, -1, -1)]
        clash = {k for k in keys if k != key}
        header = next((c for c in choices if c not in used and not any(k.endswith("." + c) or k == c
                                                                       for k in clash)), key)
        out[key] = header
        used.add(header)
    return out


def _report_table(results: SweepResults, output: Output, more: Sequence[str] = ()) -> str:
    metric = results.metric
    short = headers(results.parameters,
                    ("#", "name", "state", *results.metric_columns(), "time", "GPU-h", "peak mem", "slots", "why"))
    columns = (Column("#", right=True), Column("name", whole=True),
               *([Column("GPU type", whole=True)] if results.typed else []), Column("state", whole=True),
               *(Column(short[k], right=True) for k in results.parameters),
               *(Column(m, right=True) for m in results.metric_columns()),
               Column("time", right=True), Column("GPU-h", right=True),
               *([Column("peak mem", right=True)] if results.measured_memory else []), Column("slots"), Column("why"))
    cells = _report_cells(results, output.color)
    legend = [f"{short[k]} = {k}" for k in results.parameters if short[k] != k]
    notes = ["columns: " + ", ".join(legend)] if legend else []
    if results.typed:
        notes.append("ranked per GPU type: a metric compares only within one type")
    notes += more
    title = f"sweep {results.name}: {metric.name} ({metric.direction})"
    return render_table(columns, cells, title=title, notes=notes, output=output, keep=2,
                        row_styles=["bold" if r.best else "" for r in results.in_sweep_order], order=results.ranking)


def _report_cells(results: SweepResults, color: bool) -> list[tuple[Cell, ...]]:
    """Each record's cells, in the sweep's order, made a column at a time (one comprehension each: a call and a
    generator per row were a quarter of a report of 10,000, profiled); styled (state, why) only where the output
    takes colour."""
    records = results.in_sweep_order
    states: Sequence[Cell] = [Styled(r.state, _STATE_STYLES.get(r.state, "")) for r in records] if color else \
        [r.state for r in records]
    whys = [_why(r) for r in records]
    columns: list[Sequence[Cell]] = [
        ["best" if r.best else str(r.rank or "") for r in records], [r.name for r in records],
        *([[r.gpu_type or "" for r in records]] if results.typed else []), states,
        *(_value_texts(records, k) for k in results.parameters),
        *([format_compact(r.metrics.get(m)) for r in records] for m in results.metrics),
        [_duration(r) for r in records], [hours_text(r.gpu_hours) for r in records],
        *([[_peak(r) for r in records]] if results.measured_memory else []), [format_slots(r.slots) for r in records],
        [Styled(why, "red" if r.reason else "") for why, r in zip(whys, records, strict=True)] if color else whys]
    return list(zip(*columns, strict=True))


def _optimal_text(snap: Snapshot) -> str:
    """The best config and its command; of a sweep that ran on several GPU types, each type's."""
    text = ""
    for gpu_type in list(snap.best_by_type) if snap.by_type else [None]:
        found = optimal(snap, gpu_type=gpu_type)
        if found is None:
            continue
        config, command = found
        name, of = config_file(gpu_type), f" of {gpu_type}" if gpu_type else ""
        later = "" if (snap.directory / name).exists() else " (the file is written when the sweep ends)"
        text += (f"\nbest config{of}, {name}{later}:\n{json.dumps(config, indent=2, sort_keys=True)}\n"
                 f"\ncommand{of}, {command_file(gpu_type)}:\n{command}\n")
    return text

