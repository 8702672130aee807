"""What `autotune status` prints (where a sweep stands: counts, the runner, what runs where, the best so far)
and how `autotune run` / `resume` end (counts, the best and its files), as lines for people or one JSON object.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UserError
from ..ledger.lock import holder_pid
from ..ledger.store import Attempt, Ledger
from ..spec.interval import interval_text
from ..spec.metrics import format_value
from ..states import Reason, State
from .cost import title as cost_title
from .gpu_hours import gpu_hours
from .report import confirmed_json
from .snapshot import Snapshot, format_slots, load
from .summary import CHEAPEST_COMMAND, OPTIMAL_COMMAND, batch_note, confirmation, memory_note, recorded_costing

if TYPE_CHECKING:
    from ..sweep.run import Result

STATUS_FORMATS = ("table", "json")


def render_status(directory: Path, fmt: str = "table", *, keep: list[object] | None = None) -> str:
    """Counts, the runner's liveness, what runs where for how long, and the best so far (table: lines for
    people; json). What it read is added to `keep`, if given (see `render_report`)."""
    if fmt not in STATUS_FORMATS:
        raise UserError(f"unknown --format {fmt!r}; choose one of {', '.join(STATUS_FORMATS)}")
    snap = load(directory, every_experiment=False)
    if keep is not None:
        keep.append(snap)
    pid = holder_pid(Path(directory))
    now = time.time()
    running = [a for a in snap.attempts if a.state == State.RUNNING]
    best = snap.best
    so_far = progress(Path(directory), running, snap.metric.name)
    if fmt == "json":
        return json.dumps({
            "sweep": snap.name, "runner_pid": pid, "counts": snap.counts(), "total": len(snap.attempts),
            "running": [{"name": a.name, "attempt": a.attempt, "slots": dict(a.slots),
                         "elapsed_s": round(now - a.started_at, 3) if a.started_at else None,
                         "so_far": so_far.get((a.name, a.attempt))} for a in running],
            "best": {"name": best.name, "metric": snap.metric.name, "value": snap.value(best)} if best else None,
            "gpu_hours": gpu_hours(snap, each=False).to_json(),
        }, indent=2) + "\n"
    unfinished = any(a.state in (State.QUEUED, State.RUNNING, State.INTERRUPTED) for a in snap.attempts)
    lines = [f"sweep {snap.name}: " + ", ".join(f"{n} {s}" for s, n in sorted(snap.counts().items())) +
             f" of {len(snap.attempts)}",
             f"runner: pid {pid}" if pid else
             "runner: none (stopped; `autotune resume` finishes it)" if unfinished else "runner: done"]
    for a in running:
        elapsed = f"{now - a.started_at:.0f}s" if a.started_at else "?"
        lines.append(f"  running {a.name} (attempt {a.attempt}) on {format_slots(a.slots)} for {elapsed}"
                     f"{progress_text(so_far.get((a.name, a.attempt)), snap.metric.name)}")
    if best:
        lines.append(f"best so far: {best.name} {snap.metric.name}={format_value(snap.value(best))}"
                     f"{interval_text(best.metrics, snap.metric.name)}")
    lines.append(gpu_hours(snap, each=False).line())
    return "\n".join(lines) + "\n"


def progress(directory: Path, running: list[Attempt], metric: str) -> dict[tuple[str, int], dict[str, float]]:
    """What each running attempt's steps said so far, as the runner last read them (the ledger's `measures`): the
    report's columns (steps_measured, step_s, startup_s, METRIC_low, METRIC_high) and METRIC, the mean so far."""
    if not running:
        return {}
    with Ledger.open(directory) as ledger:
        measures = ledger.measures()
    found = {}
    for a in running:
        timing = measures.get((a.name, a.attempt))
        if timing is not None:
            found[(a.name, a.attempt)] = timing.columns(metric) | ({metric: timing.interval.mean}
                                                                   if timing.interval is not None else {})
    return found


def progress_text(so_far: dict[str, float] | None, metric: str) -> str:
    """A running attempt's progress as its status line ends: `, throughput 2,180 so far (95% interval 2,150 to
    2,210 over 12 steps)`, or `, 3 steps so far` before they bound the metric; nothing before its steps were read."""
    if not so_far:
        return ""
    if metric not in so_far:
        return f", {so_far.get('steps_measured', 0):.0f} steps so far"
    return f", {metric} {format_value(so_far[metric])} so far{interval_text(so_far, metric)}"


# --- the end of autotune run / resume ------------------------------------------------------------------------
def _training(snap: Snapshot) -> list[str]:
    """Of a tune for a training run: the fastest and the cheapest within its deadline (and its files)."""
    priced = recorded_costing(snap)
    if priced is None:
        return []
    cheaper = (snap.directory / CHEAPEST_COMMAND).exists() and snap.best is not None \
        and priced.cheapest not in (None, snap.best.name)
    return [f"training run ({cost_title(priced)}):", *(f"  {line}" for line in priced.verdict),
            *([f"  cheapest's command: {snap.directory / CHEAPEST_COMMAND}"] if cheaper else [])]


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
            "gpu_hours": gpu_hours(snap, each=False).to_json(),
            "best": {"name": best.name, "value": snap.value(best), "metrics": dict(best.metrics),
                     "config": str(result.optimal_config) if result.optimal_config else None,
                     "command": str(command) if result.optimal_config else None} if best else None}
            | confirmed_json(snap) | ({"training": priced.to_json()} if (priced := recorded_costing(snap)) else {})
        ) + "\n"
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
        lines += [f"best: {best.name} with {snap.metric.name} {snap.value(best) or 0:.6g}"
                  f"{interval_text(best.metrics, snap.metric.name)}",
                  *([f"  {confirmed}"] if confirmed else []),
                  f"  config:  {result.optimal_config}", f"  command: {command}"]
        lines += _training(snap)
    lines.append(gpu_hours(snap, each=False).line())
    if result.interrupted:
        lines.append(f"interrupted: `autotune resume {snap.directory}` finishes the sweep")
    return "\n".join(lines) + "\n"

