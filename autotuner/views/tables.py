"""What `autotune report`, `status` and `hosts` print: a sweep's ranking for people (a table, Markdown) and for
programs (JSON, CSV), where it stands, and the hosts of a hostfile; and `render_table`, the one table renderer
every view that prints a table uses.
"""
from __future__ import annotations

import csv
import io
import json
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO

from ..errors import UserError
from ..ledger.lock import holder_pid
from ..limits import memory
from ..spec import ABBREVIATIONS
from ..spec.metrics import format_compact, format_value
from ..states import Reason, State
from .records import ExperimentRecord, SweepResults, from_snapshot
from .snapshot import Snapshot, format_slots, load
from .summary import (
    OPTIMAL_COMMAND,
    batch_note,
    command_file,
    config_file,
    confirmation,
    memory_note,
    optimal,
    uncertain,
)

if TYPE_CHECKING:
    from ..sweep.run import Result

FORMATS = ("table", "json", "csv", "md")
# rich lays out and renders every cell on its own (about 0.7 ms a row here: 7 s for a sweep of 10,000), so a
# larger table is laid out by hand: the same columns, one line per row, the last column running to the end.
RICH_ROWS = 1000
_STATE_STYLES = {State.SUCCEEDED: "green", State.FAILED: "red", State.TIMED_OUT: "yellow", State.RUNNING: "cyan",
                 State.QUEUED: "dim", State.CANCELLED: "dim", State.INTERRUPTED: "magenta"}
# Headers of swept keys in the table: the experiment names' abbreviations, but words for the two counts.
_HEADERS = {**ABBREVIATIONS, "num_gpus": "gpus", "num_nodes": "nodes"}


# --- where the text goes -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Output:
    """Where a table is printed: a terminal's width (None: a file or a pipe, where every row stays on one line
    however wide) and whether it may be coloured."""

    width: int | None = None
    color: bool = False

    @classmethod
    def of(cls, stream: TextIO, environ: Mapping[str, str] | None = None) -> Output:
        """A terminal gets its width and colour; a file or pipe neither. NO_COLOR (https://no-color.org) turns
        colour off, FORCE_COLOR on (NO_COLOR wins); COLUMNS overrides a terminal's width."""
        env = os.environ if environ is None else environ
        try:
            terminal = stream.isatty()
        except (AttributeError, ValueError):  # closed, or not a real stream
            terminal = False
        width = shutil.get_terminal_size().columns if terminal else None
        color = (terminal or bool(env.get("FORCE_COLOR"))) and not env.get("NO_COLOR")
        return cls(max(width, 40) if width else None, color)


PLAIN = Output()


# --- the table renderer --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    header: str
    right: bool = False  # numbers: aligned right, never wrapped
    whole: bool = False  # names: never wrapped either (the text columns around them wrap instead)


class Styled(NamedTuple):
    """A cell with a rich style ("red", "bold green"), used only when the output takes colour."""

    text: str
    style: str


Cell = str | Styled


def _text(cell: Cell) -> str:
    return cell.text if isinstance(cell, Styled) else cell


def render_table(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], *, title: str | None = None,
                 notes: Sequence[str] = (), output: Output = PLAIN, row_styles: Sequence[str] | None = None,
                 keep: int = 1) -> str:
    """Rows of plain-text cells (never read as markup) as a boxed rich table, or laid out by hand beyond
    RICH_ROWS rows; then `notes`, one line each. As wide as the rows need, or fitted to `output.width`: text
    columns wrap, and columns that still do not fit go on in another table below, beside the first `keep`
    columns again (as pandas prints a wide DataFrame). Coloured only when `output.color`."""
    texts = [[_text(c) for c in cells] for cells in rows]
    natural = [max([_width(c.header)] + [_width(t[i]) for t in texts]) for i, c in enumerate(columns)]
    plain = len(rows) > RICH_ROWS
    parts = []
    for n, block in enumerate(_blocks(columns, natural, keep, output.width, plain)):
        heading = title if n == 0 else None
        chosen = [columns[i] for i in block]
        if plain:
            parts.append(_plain_table(chosen, [[t[i] for i in block] for t in texts], heading, output.width))
        else:
            parts.append(_rich_table(chosen, [[r[i] for i in block] for r in rows], heading, output, row_styles))
    return "\n".join(parts) + "".join(note + "\n" for note in notes)


def _width(text: str) -> int:
    """Columns `text` takes on a terminal (wide characters count two): its length, for the usual ASCII."""
    if text.isascii():
        return len(text)
    from rich.cells import cell_len

    return cell_len(text)


_SQUEEZED = 24  # what a text column that wraps counts for when a table is split to fit


def _blocks(columns: Sequence[Column], natural: Sequence[int], keep: int, width: int | None,
            plain: bool) -> list[list[int]]:
    """The columns of each table a wide one is split into to fit `width` (all in one without a width)."""
    everything = list(range(len(columns)))
    if width is None:
        return [everything]
    gap, edge = (2, -2) if plain else (3, 1)  # a plain table's two spaces; a box's bar and padding

    def size(block: list[int]) -> int:
        return edge + sum(gap + (natural[i] if columns[i].right or columns[i].whole else
                                 min(natural[i], _SQUEEZED)) for i in block)

    if size(everything) <= width:
        return [everything]
    keep = min(keep, len(columns) - 1)
    blocks, current = [], everything[:keep]
    for i in everything[keep:]:
        if len(current) > keep and size([*current, i]) > width:
            blocks.append(current)
            current = everything[:keep]
        current.append(i)
    return [*blocks, current]


def _rich_table(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], title: str | None, output: Output,
                row_styles: Sequence[str] | None) -> str:
    from rich.console import Console
    from rich.markup import escape
    from rich.measure import Measurement
    from rich.table import Table
    from rich.text import Text

    table = Table(title=escape(title) if title is not None else None, header_style="bold" if output.color else "",
                  title_style="" if output.color else None)
    for column in columns:
        whole = column.right or column.whole
        table.add_column(column.header, justify="right" if column.right else "left", no_wrap=whole,
                         overflow="ellipsis" if whole else "fold")
    for n, cells in enumerate(rows):
        texts = [Text(c.text, style=c.style if output.color else "") if isinstance(c, Styled) else Text(c)
                 for c in cells]
        table.add_row(*texts, style=row_styles[n] if output.color and row_styles else None)
    out = io.StringIO()
    console = Console(file=out, width=100_000, force_terminal=output.color, no_color=not output.color,
                      color_system="standard" if output.color else None, highlight=False, _environ={})
    natural = Measurement.get(console, console.options, table).maximum
    console.width = min(natural, output.width) if output.width else natural
    console.print(table)
    return out.getvalue()


def _plain_table(columns: Sequence[Column], rows: Sequence[Sequence[str]], title: str | None,
                 width: int | None = None) -> str:
    widths = [max([len(c.header)] + [len(cells[i]) for cells in rows]) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell.rjust(w) if c.right else cell.ljust(w)
                         for cell, w, c in zip(cells, widths, columns, strict=True)).rstrip()

    lines = ([title] if title is not None else []) + [line([c.header for c in columns]),
                                                      line(["-" * w for w in widths]), *map(line, rows)]
    if width is not None:  # a terminal: the last column wraps under itself instead of the terminal's wrapping
        lines = [part for text in lines for part in _wrap_last(text, sum(widths[:-1]) + 2 * (len(widths) - 1), width)]
    return "\n".join(lines) + "\n"


def _wrap_last(line: str, indent: int, width: int) -> list[str]:
    """A plain table's line cut to `width`, what runs past it continued on lines indented to the last column."""
    room = width - indent
    if len(line) <= width or room < 20:
        return [line]
    head, rest = line[:indent], line[indent:]
    parts = [rest[i:i + room] for i in range(0, len(rest), room)]
    return [head + parts[0]] + [" " * indent + part for part in parts[1:]]


# --- autotune report -----------------------------------------------------------------------------------------
def _json_row(r: ExperimentRecord, typed: bool) -> dict[str, Any]:
    return {"rank": r.rank, "best": r.best, "name": r.name} | ({"gpu_type": r.gpu_type} if typed else {}) | {
            "state": r.state, "metric": r.metric,
            "reason": r.reason, "detail": r.detail, "attempt": r.attempt,
            "duration_s": round(r.duration, 3) if r.duration is not None else None, "peak_memory": r.peak_memory,
            "slots": format_slots(r.slots),
            "parameters": dict(r.parameters), "metrics": dict(r.metrics), "started_at": r.started,
            "finished_at": r.finished}


def render_report(directory: Path, fmt: str, output: Output = PLAIN) -> str:
    """`autotune report`: one row per experiment with every swept parameter and metric, as `fmt`."""
    if fmt not in FORMATS:
        raise UserError(f"unknown --format {fmt!r}; choose one of {', '.join(FORMATS)}")
    snap = load(directory, every_experiment=False)
    results = from_snapshot(snap)
    if fmt == "json":
        best = snap.best
        found = optimal(snap)
        return json_with_rows({"sweep": snap.name, "metric": snap.metric.name, "minimize": snap.metric.minimize,
                               "best": best.name if best else None, "counts": snap.counts(),
                               "parameters": list(results.parameters), "metrics": list(results.metrics),
                               "experiments": [_json_row(r, results.typed) for r in results],
                               "optimal": {"config": found[0], "command": found[1]} if found else None}
                              | _per_type(snap) | _confirmed(snap), "experiments")
    if fmt == "csv":
        return _csv(results)
    if fmt == "md":
        return _markdown(results)
    notes = [note for note in (confirmation(snap), memory_note(snap), batch_note(snap)) if note]
    return _report_table(results, output, notes) + _optimal_text(snap)


def _confirmed(snap: Snapshot) -> dict[str, Any]:
    """A tune's: how its winner was confirmed by re-runs (None: nothing was run again), what its memory model said."""
    if snap.meta.search is None:
        return {}
    return {"confirmation": confirmation(snap), "confirmed": (uncertain(snap) is None) if snap.runs else None,
            "memory": memory_note(snap), "batch": batch_note(snap)}


def _per_type(snap: Snapshot) -> dict[str, Any]:
    """A sweep on several GPU types: each type's best, and its config and command (a metric compares only within
    one type)."""
    if not snap.by_type:
        return {}
    return {"best_by_type": {t: a.name for t, a in snap.best_by_type.items()},
            "optimal_by_type": {t: {"config": o[0], "command": o[1]} for t in snap.best_by_type
                                if (o := optimal(snap, gpu_type=t)) is not None}}


def json_with_rows(document: Mapping[str, Any], key: str) -> str:
    """`document` as indented JSON, but the list under its top-level `key` one compact object a line: as easy
    to read, and written by json's C encoder (`indent=` makes it pure Python: seconds for 10,000 rows)."""
    rows = document[key]
    text = json.dumps({**document, key: []}, indent=2)
    inner = ",\n".join("    " + json.dumps(row) for row in rows)
    marker = f'\n  {json.dumps(key)}: []'  # the top level's: two spaces in, nested keys are deeper
    return text.replace(marker, marker[:-1] + (f"\n{inner}\n  ]" if rows else "]"), 1) + "\n"


def _csv(results: SweepResults) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=results.columns(), lineterminator="\n")
    writer.writeheader()
    for row in results.rows():
        writer.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in row.items()})
    return buffer.getvalue()


def _value_text(value: Any) -> str:
    """A parameter's value in a cell: text as it is, anything else as JSON; "-" where the experiment lacks it."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # as JSON writes it, without its cost on 10,000 rows
    return json.dumps(value, sort_keys=True)


def _why(r: ExperimentRecord) -> str:
    return f"[{r.reason}] {r.detail or ''}".rstrip() if r.reason else ""


def _duration(r: ExperimentRecord) -> str:
    return f"{r.duration:.1f}s" if r.duration is not None else ""


def _peak(r: ExperimentRecord) -> str:
    return memory(r.peak_memory) if r.peak_memory is not None else ""


def _markdown(results: SweepResults) -> str:
    typed, peaks = results.typed, results.measured_memory
    head = ["", "name", *(["GPU type"] if typed else []), "state", *results.parameters, *results.metric_columns(),
            "time", *(["peak memory"] if peaks else []), "reason"]
    return markdown_table(head, [
        ["**best**" if r.best else str(r.rank or ""), r.name, *([r.gpu_type or ""] if typed else []), r.state,
         *(_value_text(r.parameters[k]) for k in results.parameters),
         *(format_compact(r.metrics.get(m)) for m in results.metrics), _duration(r), *([_peak(r)] if peaks else []),
         f"{r.reason}: {r.detail}" if r.reason else ""] for r in results])


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
                    ("#", "name", "state", *results.metric_columns(), "time", "peak mem", "slots", "why"))
    columns = (Column("#", right=True), Column("name", whole=True),
               *([Column("GPU type", whole=True)] if results.typed else []), Column("state", whole=True),
               *(Column(short[k], right=True) for k in results.parameters),
               *(Column(m, right=True) for m in results.metric_columns()),
               Column("time", right=True), *([Column("peak mem", right=True)] if results.measured_memory else []),
               Column("slots"), Column("why"))
    cells = [_report_cells(r, results) for r in results]
    legend = [f"{short[k]} = {k}" for k in results.parameters if short[k] != k]
    notes = ["columns: " + ", ".join(legend)] if legend else []
    if results.typed:
        notes.append("ranked per GPU type: a metric compares only within one type")
    notes += more
    title = f"sweep {results.name}: {metric.name} ({metric.direction})"
    return render_table(columns, cells, title=title, notes=notes, output=output, keep=2,
                        row_styles=["bold" if r.best else "" for r in results])


def _report_cells(r: ExperimentRecord, results: SweepResults) -> tuple[Cell, ...]:
    return ("best" if r.best else str(r.rank or ""), r.name, *([r.gpu_type or ""] if results.typed else []),
            Styled(r.state, _STATE_STYLES.get(r.state, "")),
            *(_value_text(r.parameters[k]) for k in results.parameters),
            *(format_compact(r.metrics.get(m)) for m in results.metrics),
            _duration(r), *([_peak(r)] if results.measured_memory else []), format_slots(r.slots),
            Styled(_why(r), "red" if r.reason else ""))


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


# --- autotune status -----------------------------------------------------------------------------------------
STATUS_FORMATS = ("table", "json")


def render_status(directory: Path, fmt: str = "table") -> str:
    """Counts, the runner's liveness, what runs where for how long, and the best so far (table: lines for
    people; json)."""
    if fmt not in STATUS_FORMATS:
        raise UserError(f"unknown --format {fmt!r}; choose one of {', '.join(STATUS_FORMATS)}")
    snap = load(directory, every_experiment=False)
    pid = holder_pid(Path(directory))
    now = time.time()
    running = [a for a in snap.attempts if a.state == State.RUNNING]
    best = snap.best
    if fmt == "json":
        return json.dumps({
            "sweep": snap.name, "runner_pid": pid, "counts": snap.counts(), "total": len(snap.attempts),
            "running": [{"name": a.name, "attempt": a.attempt, "slots": dict(a.slots),
                         "elapsed_s": round(now - a.started_at, 3) if a.started_at else None} for a in running],
            "best": {"name": best.name, "metric": snap.metric.name, "value": snap.value(best)} if best else None,
        }, indent=2) + "\n"
    unfinished = any(a.state in (State.QUEUED, State.RUNNING, State.INTERRUPTED) for a in snap.attempts)
    lines = [f"sweep {snap.name}: " + ", ".join(f"{n} {s}" for s, n in sorted(snap.counts().items())) +
             f" of {len(snap.attempts)}",
             f"runner: pid {pid}" if pid else
             "runner: none (stopped; `autotune resume` finishes it)" if unfinished else "runner: done"]
    for a in running:
        elapsed = f"{now - a.started_at:.0f}s" if a.started_at else "?"
        lines.append(f"  running {a.name} (attempt {a.attempt}) on {format_slots(a.slots)} for {elapsed}")
    if best:
        lines.append(f"best so far: {best.name} {snap.metric.name}={format_value(snap.value(best))}")
    return "\n".join(lines) + "\n"


# --- the end of autotune run / resume ------------------------------------------------------------------------
def render_result(result: Result, fmt: str = "table") -> str:
    """How a sweep run by `run` or `resume` ended: counts, the best and its files, in lines or one JSON object."""
    if fmt not in STATUS_FORMATS:
        raise UserError(f"unknown --format {fmt!r}; choose one of {', '.join(STATUS_FORMATS)}")
    snap = result.snapshot
    best = snap.best
    command = snap.directory / OPTIMAL_COMMAND
    if fmt == "json":
        return json.dumps({
            "sweep": snap.name, "directory": str(snap.directory), "exit_code": result.exit_code,
            "interrupted": result.interrupted, "metric": snap.metric.name, "minimize": snap.metric.minimize,
            "total": len(snap.attempts), "counts": snap.counts(),
            "best": {"name": best.name, "value": snap.value(best), "metrics": dict(best.metrics),
                     "config": str(result.optimal_config) if result.optimal_config else None,
                     "command": str(command) if result.optimal_config else None} if best else None}
            | _confirmed(snap)) + "\n"
    counts = ", ".join(f"{n} {state}" for state, n in sorted(snap.counts().items()))
    if snap.meta.search is not None:  # tune: a run out of memory is an answer (that size does not fit)
        oom = sum(1 for a in snap.attempts if a.reason == Reason.OOM)
        counts += f" ({oom} of them out of memory: sizes that do not fit)" if oom else ""
    lines = [f"\n{len(snap.attempts)} experiments: {counts}"]
    lines += [note for note in (memory_note(snap), batch_note(snap)) if note]
    if best is None:
        lines.append("no experiment succeeded: no best configuration" + (" yet" if result.interrupted else ""))
    else:
        confirmed = confirmation(snap)
        lines += [f"best: {best.name} with {snap.metric.name} {snap.value(best) or 0:.6g}",
                  *([f"  {confirmed}"] if confirmed else []),
                  f"  config:  {result.optimal_config}", f"  command: {command}"]
    if result.interrupted:
        lines.append(f"interrupted: `autotune resume {snap.directory}` finishes the sweep")
    return "\n".join(lines) + "\n"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table (a `|` in a cell becomes `/`)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |" for cells in rows]
    return "\n".join(lines) + "\n"
