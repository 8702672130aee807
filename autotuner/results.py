"""The files a sweep leaves for people: summary.txt, the best config (ds_config_optimal.json) and its command.

All three come from the ledger's read model alone, so the runner rewrites them whenever a sweep ends (finished,
interrupted or resumed) and the report shows the same config and command before they are written.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .files import write_atomic, write_json_atomic
from .launch import Launcher, optimal_command, without_autotuning
from .metrics import format_value
from .states import State

if TYPE_CHECKING:  # the views import this module: a runtime import back would make a cycle
    from .views.snapshot import Snapshot

OPTIMAL_CONFIG = "ds_config_optimal.json"
OPTIMAL_COMMAND = "cmd_optimal.txt"
SUMMARY = "summary.txt"


def optimal(snap: Snapshot, launcher: Launcher = Launcher()) -> tuple[dict, str] | None:
    """The best config (autotuning section removed) and a runnable command for it, as the files hold them;
    computed from the ledger, so it is there for a sweep that still runs, before the files are written."""
    best = snap.best
    if best is None:
        return None
    experiment = snap.experiments[best.name]
    config_path = (snap.directory / OPTIMAL_CONFIG).resolve()
    return without_autotuning(experiment.config()), optimal_command(experiment, str(config_path), launcher, snap.env)


def write_outcome_files(snap: Snapshot, launcher: Launcher) -> Path | None:
    """summary.txt always; the optimal config and command when there is a best. Returns the config's path."""
    write_atomic(snap.directory / SUMMARY, summary_text(snap))
    found = optimal(snap, launcher)
    if found is None:
        return None
    config, command = found
    config_path = snap.directory / OPTIMAL_CONFIG
    write_json_atomic(config_path, config)
    write_atomic(snap.directory / OPTIMAL_COMMAND, command + "\n")
    return config_path


def summary_text(snap: Snapshot) -> str:
    """A plain table in the spirit of DeepSpeed's autotuning summary, then one line per experiment."""
    best = snap.best
    counts = snap.counts()
    lines = [
        f"sweep: {snap.name}    metric: {snap.metric.name} ({snap.metric.direction})",
        "",
        f"| {'tuning_space':<12} | {'num_experiments':>15} | {'best_metric_val':>15} | best_exp_name",
        f"| {snap.name[:12]:<12} | {len(snap.attempts):>15} | {format_value(best.metric if best else None):>15} | "
        f"{best.name if best else '-'}",
        "",
        "states: " + ", ".join(f"{state} {n}" for state, n in sorted(counts.items())),
        "",
    ]
    for attempt in snap.ranked:
        mark = "*" if best is not None and attempt.name == best.name else " "
        why = f"  [{attempt.reason}] {attempt.detail or ''}".rstrip() if attempt.state != State.SUCCEEDED else ""
        lines.append(f"{mark} {attempt.name:<40} {attempt.state:<11} {format_value(attempt.metric):>12}{why}")
    if best is not None:
        lines += ["", f"best: {best.name}", f"config: {OPTIMAL_CONFIG}", f"command: {OPTIMAL_COMMAND}"]
    return "\n".join(lines) + "\n"
