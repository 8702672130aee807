"""What `autotune report`, `status` and `hosts` print: a sweep's ranking for people (a table, Markdown) and for
programs (JSON, CSV), where it stands, and the hosts of a hostfile; and `render_table`, the one table renderer
every view that prints a table uses.
"""
from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UserError
from ..inventory import gpu_type as type_of_gpus
from ..lock import holder_pid
from ..metrics import format_value
from ..results import command_file, config_file, optimal
from ..states import State
from .snapshot import Snapshot, format_slots, load

if TYPE_CHECKING:
    from ..hostfile import Host
    from ..ssh.probe import HostReport

FORMATS = ("table", "json", "csv", "md")
COLUMNS = ("rank", "best", "name", "state", "metric", "reason", "detail", "attempt", "duration_s", "slots")
TYPED_COLUMNS = ("rank", "best", "name", "gpu_type", *COLUMNS[3:])  # a sweep that ran on several GPU types
# rich lays out and renders every cell on its own (about 0.7 ms a row here: 7 s for a sweep of 10,000), so a
# larger table is laid out by hand: the same columns, one line per row, the last column running to the end.
RICH_ROWS = 1000
_WIDTH = 160


# --- the table renderer --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    header: str
    right: bool = False  # numbers: aligned right


def render_table(columns: Sequence[Column], rows: Sequence[Sequence[str]], *, title: str | None = None,
                 notes: Sequence[str] = ()) -> str:
    """Rows of plain-text cells as a boxed rich table (cells are never read as markup), or laid out by hand
    beyond RICH_ROWS rows; then `notes`, one line each. No colour: the text is the same on a terminal and in a
    file."""
    if len(rows) > RICH_ROWS:
        return _plain_table(columns, rows, title) + "".join(note + "\n" for note in notes)
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    table = Table(title=escape(title) if title is not None else None)
    for column in columns:
        table.add_column(column.header, justify="right" if column.right else "left")
    for cells in rows:
        table.add_row(*map(Text, cells))
    out = io.StringIO()
    console = Console(file=out, width=_WIDTH, force_terminal=False)
    console.print(table)
    if notes:
        console.print("\n".join(notes), markup=False, highlight=False)
    return out.getvalue()


def _plain_table(columns: Sequence[Column], rows: Sequence[Sequence[str]], title: str | None) -> str:
    widths = [max([len(c.header)] + [len(cells[i]) for cells in rows]) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell.rjust(w) if c.right else cell.ljust(w)
                         for cell, w, c in zip(cells, widths, columns, strict=True)).rstrip()

    lines = ([title] if title is not None else []) + [line([c.header for c in columns]),
                                                      line(["-" * w for w in widths]), *map(line, rows)]
    return "\n".join(lines) + "\n"


# --- autotune report -----------------------------------------------------------------------------------------
def rows(snap: Snapshot) -> list[dict]:
    """One dict per experiment, ranked: the report's JSON and CSV rows, and what the tables are made of. A sweep
    that ran on several GPU types is ranked per type, each type's best marked, with a `gpu_type` per row."""
    if snap.by_type:
        return _rows_by_type(snap)
    best = snap.best
    out = []
    for rank, a in enumerate(snap.ranked, 1):
        out.append({
            "rank": rank if a.state == State.SUCCEEDED else None,
            "best": best is not None and a.name == best.name,
            "name": a.name, "state": a.state, "metric": a.metric,
            "reason": a.reason, "detail": a.detail, "attempt": a.attempt,
            "duration_s": round(a.duration, 3) if a.duration is not None else None,
            "slots": format_slots(a.slots),
        })
    return out


def _rows_by_type(snap: Snapshot) -> list[dict]:
    bests = {id(a) for a in snap.best_by_type.values()}
    ranks: dict[str | None, int] = {}
    out = []
    for a in snap.ranked:
        kind = snap.type_of(a)
        if a.state == State.SUCCEEDED:
            ranks[kind] = ranks.get(kind, 0) + 1
        out.append({
            "rank": ranks[kind] if a.state == State.SUCCEEDED else None, "best": id(a) in bests,
            "name": a.name, "gpu_type": kind, "state": a.state, "metric": a.metric,
            "reason": a.reason, "detail": a.detail, "attempt": a.attempt,
            "duration_s": round(a.duration, 3) if a.duration is not None else None,
            "slots": format_slots(a.slots),
        })
    return out


def render_report(directory: Path, fmt: str) -> str:
    if fmt not in FORMATS:
        raise UserError(f"unknown --format {fmt!r}; choose one of {', '.join(FORMATS)}")
    snap = load(directory, every_experiment=False)
    table = rows(snap)
    typed = snap.by_type
    if fmt == "json":
        best = snap.best
        found = optimal(snap)
        per_type: dict[str, dict] = {}
        if typed:
            per_type["best_by_type"] = {t: a.name for t, a in snap.best_by_type.items()}
            per_type["optimal_by_type"] = {t: {"config": o[0], "command": o[1]} for t in snap.best_by_type
                                           if (o := optimal(snap, gpu_type=t)) is not None}
        return json.dumps({"sweep": snap.name, "metric": snap.metric.name, "minimize": snap.metric.minimize,
                           "best": best.name if best else None, "counts": snap.counts(), "experiments": table,
                           "optimal": {"config": found[0], "command": found[1]} if found else None} | per_type,
                          indent=2) + "\n"
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=TYPED_COLUMNS if typed else COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(table)
        return buffer.getvalue()
    if fmt == "md":
        head = ["", "name", *(["GPU type"] if typed else []), "state", snap.metric.name, "reason"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in table:
            why = f"{r['reason']}: {r['detail']}" if r["reason"] else ""
            kind = f"{r['gpu_type'] or ''} | " if typed else ""
            lines.append(f"| {'**best**' if r['best'] else (r['rank'] or '')} | {r['name']} | {kind}{r['state']} | "
                         f"{format_value(r['metric'])} | {why.replace('|', '/')} |")
        return "\n".join(lines) + "\n"
    columns = (Column("#", right=True), Column("name"), *([Column("GPU type")] if typed else []), Column("state"),
               Column(snap.metric.name, right=True), Column("time", right=True), Column("slots"), Column("why"))
    title = f"sweep {snap.name}: {snap.metric.name} ({snap.metric.direction})"
    notes = ["ranked per GPU type: a metric compares only within one type"] if typed else []
    return render_table(columns, [_cells(r, typed) for r in table], title=title, notes=notes) + _optimal_text(snap)


def _cells(r: dict, typed: bool = False) -> tuple[str, ...]:
    why = f"[{r['reason']}] {r['detail'] or ''}" if r["reason"] else ""
    return ("best" if r["best"] else str(r["rank"] or ""), r["name"], *([r["gpu_type"] or ""] if typed else []),
            r["state"], format_value(r["metric"]), f"{r['duration_s']:.1f}s" if r["duration_s"] is not None else "",
            r["slots"], why)


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
def render_status(directory: Path, as_json: bool) -> str:
    """Counts, the runner's liveness, what runs where for how long, and the best so far."""
    snap = load(directory, every_experiment=False)
    pid = holder_pid(Path(directory))
    now = time.time()
    running = [a for a in snap.attempts if a.state == State.RUNNING]
    best = snap.best
    if as_json:
        return json.dumps({
            "sweep": snap.name, "runner_pid": pid, "counts": snap.counts(), "total": len(snap.attempts),
            "running": [{"name": a.name, "attempt": a.attempt, "slots": dict(a.slots),
                         "elapsed_s": round(now - a.started_at, 3) if a.started_at else None} for a in running],
            "best": {"name": best.name, "metric": snap.metric.name, "value": best.metric} if best else None,
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
        lines.append(f"best so far: {best.name} {snap.metric.name}={format_value(best.metric)}")
    return "\n".join(lines) + "\n"


# --- autotune hosts ------------------------------------------------------------------------------------------
def render_hosts(title: str, listed: Mapping[str, Host], reports: Sequence[HostReport], as_json: bool) -> str:
    """`autotune hosts`: one row per host (reachable or why not, slots, GPUs with free memory, versions, load),
    and its GPU type where one is known: the hostfile's `gpu=`, with the type its GPUs have if that differs."""
    types = {r.host: (listed[r.host].attrs.get("gpu"), type_of_gpus(r.gpus)) for r in reports}
    if as_json:
        return json.dumps([dict(r.to_json(), slots=listed[r.host].slots, gpu_type=types[r.host][0] or types[r.host][1],
                                gpu_type_found=types[r.host][1]) for r in reports], indent=2) + "\n"
    typed = any(stated or found for stated, found in types.values())
    names = ("host", "slots", *(["type"] if typed else []), "state", "GPUs", "python", "deepspeed", "load")
    cells = [_host_cells(r, listed[r.host].slots, _type_cell(*types[r.host]) if typed else None) for r in reports]
    return render_table([Column(name) for name in names], cells, title=title)


def _type_cell(stated: str | None, found: str | None) -> str:
    if stated and found and stated != found:
        return f"{stated} (found {found})"
    return stated or found or ""


def _host_cells(r: HostReport, slots: int, kind: str | None = None) -> tuple[str, ...]:
    gpus = ", ".join(f"{g.name} {g.memory_free / 2**30:.0f}/{g.memory_total / 2**30:.0f} GiB free"
                     for g in r.gpus) or ("error: " + r.gpu_error if r.gpu_error else "none")
    load = " ".join(f"{x:.2f}" for x in r.loadavg) if r.loadavg else ""
    return (r.host, str(slots), *([kind] if kind is not None else []),
            "up" if r.reachable else f"down: {r.reason}", gpus if r.reachable else "",
            r.python or "", r.deepspeed or "", load)
