"""GPU-hours accounted: what each experiment's attempts held (their GPUs times their wall time, every attempt that
ended: failed, retried and re-run ones too), the sweep's in all, what the best config took (its runs and its
confirming re-runs), what was spent until the best ended, and what went to runs stopped for a reason given (a
run stopped because it could not win). Worked out once here from the ledger (ledger/spent.py), for `status`, the
end of `run`, `report` in every format, `compare` and the dashboard. A CPU slot counts as one.

And what stopping saved, an estimate (`saved_hours`): what was not run cannot be measured. Each attempt stopping
ended before its profile window's end (stopped because it could not win, or ended once measured until sure) would
have run on to its measured window's end (`end_profile_step` - `start_profile_step` steps past the ones before it,
spec/progress.py `Window`, the same count as its measured steps); the window's steps left after the last one it
measured, at its own median step time, on its slots, are what it saved. Its start-up was paid either way, and the
run's next steps are taken to last as long as the ones it made.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import overload

from ..backends.launch import with_autotuning
from ..ledger.spent import Spent
from ..ledger.store import Ledger
from ..spec.progress import Window
from ..states import Reason
from .snapshot import Snapshot

HOUR = 3600.0
# The reason a run stopped because it could not win is recorded with: its GPU-hours are a figure of their own
# (`GpuHours.stopped`), shown where not zero.
STOPPED: str | None = Reason.OUTCLASSED


@dataclass(frozen=True)
class GpuHours:
    """A sweep's GPU-hours: each experiment's, in all, on the best config, until the best ended, and on runs
    recorded with the stopping reason (`on_best`, `to_best`: None while there is no best)."""

    per_experiment: Mapping[str, float]  # rounded to the microhour, as every output gives it
    spent: float
    on_best: float | None
    to_best: float | None
    stopped: float
    saved: float = 0.0  # estimated: the steps runs stopped early did not make (`saved_hours`)

    def to_json(self) -> dict[str, float | None]:
        """The sweep's figures (not each experiment's), rounded to the microhour."""
        return {"spent": _rounded(self.spent), "on_best": _rounded(self.on_best),
                "to_best": _rounded(self.to_best), "stopped": _rounded(self.stopped), "saved": _rounded(self.saved)}

    def line(self) -> str:
        """One line for people: spent, on the best config, until the best ended; the stopped runs' and the
        estimate of what stopping saved, where any."""
        parts = [f"GPU-hours: {hours_text(self.spent)} spent"]
        if self.on_best is not None:
            parts.append(f"{hours_text(self.on_best)} on the best")
        if self.to_best is not None:
            parts.append(f"{hours_text(self.to_best)} until it ended")
        if self.stopped:
            parts.append(f"{hours_text(self.stopped)} on runs stopped early")
        if self.saved:
            parts.append(f"about {hours_text(self.saved)} saved by stopping (estimated)")
        return ", ".join(parts)


def hours_text(hours: float | None) -> str:
    """GPU-hours as every view writes them: 4 significant digits (a CPU run of seconds is 0.001 of an hour)."""
    return "" if hours is None else f"{hours:,.4g}"


@overload
def _rounded(hours: float) -> float: ...


@overload
def _rounded(hours: None) -> None: ...


def _rounded(hours: float | None) -> float | None:
    """To the microhour, as every output gives GPU-hours."""
    return None if hours is None else round(hours, 6)


def best_runs(snap: Snapshot) -> list[str]:
    """The names whose attempts ran the best config: the best experiment, and its confirming re-runs (a tune)."""
    best = snap.best
    if best is None:
        return []
    return next(([a.name for a in runs] for runs in snap.runs.values() if any(a.name == best.name for a in runs)),
                [best.name])


def experiment_hours(ledger: Ledger, names: Sequence[str] | None = None) -> dict[str, float]:
    """name -> GPU-hours its ended attempts held, rounded to the microhour: of every experiment with one, or of
    `names` (the dashboard's rows that moved)."""
    return {name: _rounded(h.seconds / HOUR) for name, h in ledger.spent_by_name(names=names).items()}


def saved_hours(ledger: Ledger) -> float:
    """The GPU-hours stopping saved, estimated (see the module): for each attempt it ended early, the steps its
    window had left after the last one it measured, times its median step time times its slots."""
    windows: dict[str, int] = {}  # by autotuning section (a tune's runs share one): its window worked out once
    saved = 0.0
    for stop in ledger.early_stops():
        key = json.dumps(stop.autotuning, sort_keys=True)
        if key not in windows:
            windows[key] = Window.of(with_autotuning({"autotuning": stop.autotuning}, "", "")).most or 0
        saved += max(windows[key] - stop.steps, 0) * stop.step_seconds * stop.slots
    return saved / HOUR


def gpu_hours(snap: Snapshot, ledger: Ledger | None = None, stopped: str | None = STOPPED,
              each: bool = True) -> GpuHours:
    """The sweep's GPU-hours (see the module), read from `ledger` (the dashboard's read-only one) or the sweep's
    own. `stopped`: the reason whose runs' GPU-hours count apart. `each=False`: the sweep's figures alone
    (`status`), `per_experiment` then holds only the best config's runs."""
    if ledger is None:
        with Ledger.open(Path(snap.directory)) as own:
            return _hours(snap, own, stopped, each)
    return _hours(snap, ledger, stopped, each)


def _hours(snap: Snapshot, ledger: Ledger, stopped: str | None, each: bool) -> GpuHours:
    best = snap.best
    until = best.finished_at if best is not None else None
    runs = best_runs(snap)
    held = ledger.spent_by_name(until, stopped, None if each else runs)
    if not each:
        found = ledger.spent_in_all(until, stopped)
    else:  # the sweep's figures summed from its experiments'
        listed = held.values()
        found = Spent(sum(h.seconds for h in listed), sum(h.until for h in listed), sum(h.with_reason for h in listed))
    on_best = sum(held[name].seconds for name in runs if name in held) / HOUR if best is not None else None
    return GpuHours({name: _rounded(h.seconds / HOUR) for name, h in held.items()}, found.seconds / HOUR, on_best,
                    found.until / HOUR if until is not None else None, found.with_reason / HOUR, saved_hours(ledger))
