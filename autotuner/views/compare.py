"""Two sweeps side by side: the same experiments (by name), their metric in each and the ratio B / A.

Typical use: the same space before and after a change (a DeepSpeed upgrade, another node type, a code
change). Experiments that only one sweep has are listed apart. The metric is sweep A's; B's value is read from
B's metrics under that name, so two sweeps ranked by different metrics still compare where B recorded A's.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..jsonvalues import JSONObject
from ..ledger.store import Attempt
from ..spec.metrics import format_value
from ..states import State
from .gpu_hours import GpuHours, gpu_hours
from .records import DP_KEY, TP_KEY, layout_values
from .snapshot import Snapshot, load
from .tables import PLAIN, Cell, Column, Output, Styled, json_with_rows, markdown_table, render_table

FORMATS = ("table", "json", "csv", "md")
CSV_COLUMNS = ("name", "a_state", "a_metric", "a_reason", "a_gpu_hours", "b_state", "b_metric", "b_reason",
               "b_gpu_hours", "ratio", "verdict")
SAME = 0.02  # ratios within 2% of 1 count as the same
SHOWN = 10  # names of experiments only one sweep has, listed in the table's notes
SHORT = {TP_KEY: "tp", DP_KEY: "dp"}  # a layout's columns (tunes over TP sizes)


@dataclass(frozen=True)
class Comparison:
    a: Snapshot
    b: Snapshot
    rows: list[JSONObject]  # one per experiment in both, as `--format json` prints them
    only_a: list[str]
    only_b: list[str]
    hours_a: GpuHours
    hours_b: GpuHours

    @property
    def metric(self) -> str:
        return self.a.metric.name

    @property
    def minimize(self) -> bool:
        return self.a.metric.minimize

    def geomean_ratio(self) -> float | None:
        ratios = [r["ratio"] for r in self.rows if r["ratio"] is not None and r["ratio"] > 0]
        return math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else None

    def verdict(self, ratio: float | None) -> str:
        if ratio is None:
            return ""
        if abs(ratio - 1) <= SAME:
            return "same"
        return "better" if self.a.metric.better(ratio, 1.0) else "worse"  # ratio: B / A


def _value(attempt: Attempt | None, metric: str, own_metric: str) -> float | None:
    if attempt is None or attempt.state != State.SUCCEEDED:
        return None
    if metric == own_metric and attempt.metric is not None:
        return attempt.metric
    value = attempt.metrics.get(metric)
    return float(value) if value is not None else None


def compare(a: Snapshot, b: Snapshot, hours: tuple[GpuHours, GpuHours] | None = None) -> Comparison:
    """Pairs by name. When either sweep ran on several GPU types (`typed`), an experiment is paired only with the
    same experiment on the same type (a metric compares only on one GPU model); the rest are listed apart, with
    their type. Two sweeps of one type each pair by name, whatever their types: that compares two GPU models.
    `hours`: each sweep's GPU-hours, where read already (else read from their ledgers)."""
    metric = a.metric.name
    typed = a.by_type or b.by_type
    by_name_b = {x.name: x for x in b.attempts}
    hours_a, hours_b = hours if hours is not None else (gpu_hours(a), gpu_hours(b))  # the dashboard reads its own
    held_a, held_b = hours_a.per_experiment, hours_b.per_experiment
    rows = []
    only_a = []
    paired = set()
    for x in a.attempts:
        y = by_name_b.get(x.name)
        kind = a.type_of(x) if typed else None  # asked only where it counts: 10,000 look-ups otherwise
        if y is None or (typed and not _same_type(kind, b.type_of(y))):
            only_a.append(_label(x.name, kind) if typed else x.name)
            continue
        paired.add(x.name)
        va, vb = _value(x, metric, a.metric.name), _value(y, metric, b.metric.name)
        row: JSONObject = {"name": x.name, "gpu_type": (kind or b.type_of(y)) if typed else None,
                           "a_state": x.state, "a_metric": va, "a_reason": x.reason,
                           "a_gpu_hours": held_a.get(x.name), "b_state": y.state, "b_metric": vb,
                           "b_reason": y.reason, "b_gpu_hours": held_b.get(y.name),
                           "ratio": vb / va if va and vb is not None else None}
        if not typed:  # one literal, the type's key dropped (a merged dict a row was a tenth of a compare)
            del row["gpu_type"]
        rows.append(row)
    only_b = [_label(y.name, b.type_of(y)) if typed else y.name for y in b.attempts if y.name not in paired]
    return Comparison(a, b, _with_layout(a, b, rows), only_a, only_b, hours_a, hours_b)


def _with_layout(a: Snapshot, b: Snapshot, rows: list[JSONObject]) -> list[JSONObject]:
    """Tunes over layouts: each row's TP and data-parallel sizes (records.layout_values), after its name."""
    keys_a, values = layout_values(a)
    keys_b, values_b = layout_values(b)
    shown = [k for k in (TP_KEY, DP_KEY) if k in keys_a or k in keys_b]
    if not shown:
        return rows
    values = {**values_b, **values}
    return [{"name": r["name"], **{SHORT[k]: values.get(str(r["name"]), {}).get(k) for k in shown},
             **{k: v for k, v in r.items() if k != "name"}} for r in rows]


def _same_type(a: str | None, b: str | None) -> bool:
    """One never ran (no type) or both ran on the same."""
    return a is None or b is None or a == b


def _label(name: str, gpu_type: str | None) -> str:
    return f"{name} ({gpu_type})" if gpu_type else name


def render_compare(dir_a: Path, dir_b: Path, fmt: str, output: Output = PLAIN, *,
                   keep: list[object] | None = None) -> str:
    """`autotune compare`: a table, JSON, CSV (one row per experiment in both) or Markdown. What it read is added
    to `keep`, if given (see `render_report`)."""
    if fmt not in FORMATS:
        raise UserError(f"unknown --format {fmt!r}; choose one of {', '.join(FORMATS)}")
    # attempts only: no experiment's spec is read (building 20,000 Experiments took 80% of a 10,000 compare)
    c = compare(load(Path(dir_a), every_experiment=False), load(Path(dir_b), every_experiment=False))
    if keep is not None:
        keep.append(c)
    for row in c.rows:
        row["verdict"] = c.verdict(row["ratio"])
    if fmt == "json":
        best_a, best_b = c.a.best, c.b.best
        return json_with_rows({  # a row a line, as the report's
            "a": {"directory": str(dir_a), "sweep": c.a.name, "metric": c.a.metric.name,
                  "best": best_a.name if best_a else None, "gpu_hours": c.hours_a.to_json()},
            "b": {"directory": str(dir_b), "sweep": c.b.name, "metric": c.b.metric.name,
                  "best": best_b.name if best_b else None, "gpu_hours": c.hours_b.to_json()},
            "metric": c.metric, "minimize": c.minimize, "geomean_ratio": c.geomean_ratio(),
            "experiments": c.rows, "only_a": c.only_a, "only_b": c.only_b}, "experiments")
    if fmt == "csv":
        buffer = io.StringIO()
        typed = c.a.by_type or c.b.by_type
        writer = csv.writer(buffer, lineterminator="\n")
        layout = [k for k in ("tp", "dp") if c.rows and k in c.rows[0]]
        writer.writerow(("name", *layout, "gpu_type", *CSV_COLUMNS[1:]) if typed else
                        ("name", *layout, *CSV_COLUMNS[1:]))
        writer.writerows(map(dict.values, c.rows))  # each row filled in the columns' order (`compare`, above)
        return buffer.getvalue()
    if fmt == "md":
        typed = c.a.by_type or c.b.by_type
        return markdown_table(("name", *_layout_columns(c), *(["GPU type"] if typed else []), f"A {c.metric}",
                               f"B {c.metric}", "B/A", ""), _cells(c)) + "".join(f"- {line}\n" for line in _spent(c))
    return _table(c, Path(dir_a), Path(dir_b), output)


def _state(state: str, reason: str | None) -> str:
    return state if state == State.SUCCEEDED or not reason else f"{state} ({reason})"


def _layout_columns(c: Comparison) -> list[str]:
    return [k for k in ("tp", "dp") if c.rows and k in c.rows[0]]


def _cells(c: Comparison) -> list[tuple[str, ...]]:
    typed = c.a.by_type or c.b.by_type
    layout = _layout_columns(c)
    cells: list[tuple[str, ...]] = []
    for r in c.rows:
        a = format_value(r["a_metric"]) if r["a_metric"] is not None else _state(r["a_state"], r["a_reason"])
        b = format_value(r["b_metric"]) if r["b_metric"] is not None else _state(r["b_state"], r["b_reason"])
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        sizes = tuple("" if r[k] is None else str(r[k]) for k in layout)
        cells.append((r["name"], *sizes, r["gpu_type"] or "", a, b, ratio, r["verdict"]) if typed else
                     (r["name"], *sizes, a, b, ratio, r["verdict"]))
    return cells


_VERDICT_STYLES = {"better": "green", "worse": "red"}


def _table(c: Comparison, dir_a: Path, dir_b: Path, output: Output) -> str:
    typed = c.a.by_type or c.b.by_type
    columns = (Column("name", whole=True), *(Column(k, right=True) for k in _layout_columns(c)),
               *([Column("GPU type")] if typed else []), Column("A", right=True),
               Column("B", right=True), Column("B/A", right=True), Column(""))
    cells: list[tuple[Cell, ...]] = [(*row[:-1], Styled(row[-1], _VERDICT_STYLES.get(row[-1], "")))
                                     for row in _cells(c)] if output.color else list(_cells(c))
    both = sum(1 for r in c.rows if r["ratio"] is not None)
    mean = c.geomean_ratio()
    notes = [f"{len(c.rows)} experiment(s) in both, {both} succeeded in both"
             + (f"; geometric mean B/A {mean:.3f}" if mean is not None else "")]
    for label, snap in (("A", c.a), ("B", c.b)):
        best = snap.best
        notes.append(f"best in {label}: " + (f"{best.name} {snap.metric.name} {format_value(best.metric)}"
                                             if best else "none"))
    notes += _spent(c)
    if typed:
        notes.append("paired per GPU type: an experiment only with itself on the same type")
    if c.a.metric.name != c.b.metric.name:
        notes.append(f"note: B ranks by {c.b.metric.name}; compared on A's {c.metric} where B recorded it")
    for label, names in (("A", c.only_a), ("B", c.only_b)):
        if names:
            notes.append(f"only in {label} ({len(names)}): {_some(names)}")
    title = f"{c.metric} ({c.a.metric.direction}): A = {c.a.name} ({dir_a}), B = {c.b.name} ({dir_b})"
    if not c.rows:  # no box with no row in it: the notes say why
        return title + "\n" + "".join(note + "\n" for note in notes)
    return render_table(columns, cells, title=title, notes=notes, output=output)


def _spent(c: Comparison) -> list[str]:
    """Each sweep's GPU-hours, a line each (gpu_hours.py)."""
    return [f"in {label}: {hours.line()}" for label, hours in (("A", c.hours_a), ("B", c.hours_b))]


def _some(names: list[str]) -> str:
    """The first SHOWN names and how many more (`--format json` lists them all): a sweep of 10,000 compared
    with another that shares none made a line of 200,000 characters."""
    more = f", and {len(names) - SHOWN:,} more (--format json lists them all)" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more
