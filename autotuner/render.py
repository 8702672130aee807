"""A sweep's ranking rendered for people (a rich table, Markdown) and for programs (JSON, CSV)."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from .errors import UserError
from .ledger import FILENAME, Attempt
from .report import (
    OPTIMAL_COMMAND,
    OPTIMAL_CONFIG,
    Snapshot,
    format_value,
    optimal,
    snapshot,
)
from .states import State

FORMATS = ("table", "json", "csv", "md")
COLUMNS = ("rank", "best", "name", "state", "metric", "reason", "detail", "attempt", "duration_s", "slots")


def load(directory: Path, every_experiment: bool = True) -> Snapshot:
    if not (Path(directory) / FILENAME).exists():
        raise UserError("no sweep here (no ledger.sqlite)", directory)
    return snapshot(Path(directory), every_experiment=every_experiment)


def rows(snap: Snapshot) -> list[dict]:
    best = snap.best
    out = []
    for rank, a in enumerate(snap.ranked, 1):
        out.append({
            "rank": rank if a.state == State.SUCCEEDED else None,
            "best": best is not None and a.name == best.name,
            "name": a.name, "state": a.state, "metric": a.metric,
            "reason": a.reason, "detail": a.detail, "attempt": a.attempt,
            "duration_s": round(a.duration, 3) if a.duration is not None else None,
            "slots": _slots(a),
        })
    return out


def _slots(a: Attempt) -> str:
    return "@".join(f"{h}:{','.join(map(str, ids))}" for h, ids in a.slots.items())


def render_report(directory: Path, fmt: str) -> str:
    if fmt not in FORMATS:
        raise UserError(f"unknown --format {fmt!r}; choose one of {', '.join(FORMATS)}")
    snap = load(directory, every_experiment=False)
    table = rows(snap)
    if fmt == "json":
        best = snap.best
        found = optimal(snap)
        return json.dumps({"sweep": snap.name, "metric": snap.metric.name, "minimize": snap.metric.minimize,
                           "best": best.name if best else None, "counts": snap.counts(), "experiments": table,
                           "optimal": {"config": found[0], "command": found[1]} if found else None},
                          indent=2) + "\n"
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(table)
        return buffer.getvalue()
    if fmt == "md":
        head = ["", "name", "state", snap.metric.name, "reason"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in table:
            why = f"{r['reason']}: {r['detail']}" if r["reason"] else ""
            lines.append(f"| {'**best**' if r['best'] else (r['rank'] or '')} | {r['name']} | {r['state']} | "
                         f"{format_value(r['metric'])} | {why.replace('|', '/')} |")
        return "\n".join(lines) + "\n"
    if len(table) > RICH_ROWS:
        return _plain_table(snap, table)
    return _rich_table(snap, table)


# rich lays out and renders every cell on its own (about 0.7 ms a row here: 7 s for a sweep of 10,000), so a
# larger table is laid out by hand: the same columns, one line per experiment, the reason running to the end.
RICH_ROWS = 1000


def _cells(r: dict) -> tuple[str, ...]:
    why = f"[{r['reason']}] {r['detail'] or ''}" if r["reason"] else ""
    return ("best" if r["best"] else str(r["rank"] or ""), r["name"], r["state"], format_value(r["metric"]),
            f"{r['duration_s']:.1f}s" if r["duration_s"] is not None else "", r["slots"], why)


def _title(snap: Snapshot) -> str:
    return f"sweep {snap.name}: {snap.metric.name} ({snap.metric.direction})"


def _plain_table(snap: Snapshot, table: list[dict]) -> str:
    head = ("#", "name", "state", snap.metric.name, "time", "slots", "why")
    right = (True, False, False, True, True, False, False)
    body = [_cells(r) for r in table]
    widths = [max([len(h)] + [len(c[i]) for c in body]) for i, h in enumerate(head)]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)).rstrip()

    lines = [_title(snap), line(head), line(tuple("-" * w for w in widths)), *map(line, body)]
    return "\n".join(lines) + "\n" + _optimal_text(snap)


def _optimal_text(snap: Snapshot) -> str:
    found = optimal(snap)
    if found is None:
        return ""
    config, command = found
    later = "" if (snap.directory / OPTIMAL_CONFIG).exists() else " (the file is written when the sweep ends)"
    return (f"\nbest config, {OPTIMAL_CONFIG}{later}:\n{json.dumps(config, indent=2, sort_keys=True)}\n"
            f"\ncommand, {OPTIMAL_COMMAND}:\n{command}\n")


def _rich_table(snap: Snapshot, table: list[dict]) -> str:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=_title(snap))
    for column, justify in (("#", "right"), ("name", "left"), ("state", "left"), (snap.metric.name, "right"),
                            ("time", "right"), ("slots", "left"), ("why", "left")):
        t.add_column(column, justify=justify)
    for r in table:
        style = "bold green" if r["best"] else ("red" if r["state"] not in (State.SUCCEEDED, "queued", "running") else None)
        *cells, why = _cells(r)
        t.add_row(*cells, escape(why), style=style)  # the reason is not rich markup
    console = Console(file=io.StringIO(), width=160, force_terminal=False)
    console.print(t)
    return console.file.getvalue() + _optimal_text(snap)


def render_status(directory: Path, as_json: bool) -> str:
    """Counts, the runner's liveness, what runs where for how long, and the best so far."""
    import time

    from .lock import holder_pid

    snap = load(directory, every_experiment=False)
    pid = holder_pid(Path(directory))
    now = time.time()
    running = [a for a in snap.attempts if a.state == "running"]
    best = snap.best
    if as_json:
        return json.dumps({
            "sweep": snap.name, "runner_pid": pid, "counts": snap.counts(), "total": len(snap.attempts),
            "running": [{"name": a.name, "attempt": a.attempt, "slots": dict(a.slots),
                         "elapsed_s": round(now - a.started_at, 3) if a.started_at else None} for a in running],
            "best": {"name": best.name, "metric": snap.metric.name, "value": best.metric} if best else None,
        }, indent=2) + "\n"
    lines = [f"sweep {snap.name}: " + ", ".join(f"{n} {s}" for s, n in sorted(snap.counts().items())) +
             f" of {len(snap.attempts)}",
             f"runner: pid {pid}" if pid else "runner: none (stopped; `autotune resume` finishes it)"
             if any(a.state in ("queued", "running", "interrupted") for a in snap.attempts) else "runner: done"]
    for a in running:
        elapsed = f"{now - a.started_at:.0f}s" if a.started_at else "?"
        lines.append(f"  running {a.name} (attempt {a.attempt}) on {_slots(a)} for {elapsed}")
    if best:
        lines.append(f"best so far: {best.name} {snap.metric.name}={format_value(best.metric)}")
    return "\n".join(lines) + "\n"


def render_hosts(title: str, listed, reports, as_json: bool) -> str:
    """`autotune hosts`: one row per host (reachable or why not, slots, GPUs with free memory, versions, load)."""
    if as_json:
        return json.dumps([dict(r.to_json(), slots=listed[r.host].slots) for r in reports], indent=2) + "\n"
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("host", "slots", "state", "GPUs", "python", "deepspeed", "load"):
        table.add_column(column)
    for r in reports:
        gpus = ", ".join(f"{g.name} {g.memory_free / 2**30:.0f}/{g.memory_total / 2**30:.0f} GiB free"
                         for g in r.gpus) or ("error: " + r.gpu_error if r.gpu_error else "none")
        load = " ".join(f"{x:.2f}" for x in r.loadavg) if r.loadavg else ""
        table.add_row(r.host, str(listed[r.host].slots), "up" if r.reachable else f"down: {r.reason}",
                      gpus if r.reachable else "", r.python or "", r.deepspeed or "", load,
                      style=None if r.reachable else "red")
    console = Console(file=io.StringIO(), width=160, force_terminal=False)
    console.print(table)
    return console.file.getvalue()
