"""The files a sweep leaves for people: summary.txt, the best config (ds_config_optimal.json) and its command.

All three come from the ledger's read model alone, so the runner rewrites them whenever a sweep ends (finished,
interrupted or resumed) and the report shows the same config and command before they are written. A sweep that
ran on several GPU types also leaves each type's best (`ds_config_optimal.TYPE.json`, `cmd_optimal.TYPE.txt`);
the two plain files then hold the best of its first type (hostfile order) that has one.
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


def config_file(gpu_type: str | None = None) -> str:
    """The best config's file name: the sweep's, or one GPU type's."""
    return OPTIMAL_CONFIG if gpu_type is None else f"ds_config_optimal.{gpu_type}.json"


def command_file(gpu_type: str | None = None) -> str:
    return OPTIMAL_COMMAND if gpu_type is None else f"cmd_optimal.{gpu_type}.txt"


def optimal(snap: Snapshot, launcher: Launcher = Launcher(), gpu_type: str | None = None) -> tuple[dict, str] | None:
    """The best config (autotuning section removed) and a runnable command for it, as the files hold them;
    computed from the ledger, so it is there for a sweep that still runs, before the files are written. With
    `gpu_type`, that type's best."""
    best = snap.best if gpu_type is None else snap.best_by_type.get(gpu_type)
    if best is None:
        return None
    experiment = snap.experiments[best.name]
    config_path = (snap.directory / config_file(gpu_type)).resolve()
    return without_autotuning(experiment.config()), optimal_command(experiment, str(config_path), launcher, snap.env)


def write_outcome_files(snap: Snapshot, launcher: Launcher) -> Path | None:
    """summary.txt always; the optimal config and command when there is a best, and each GPU type's when the
    sweep ran on several. Returns the (sweep's) config's path."""
    write_atomic(snap.directory / SUMMARY, summary_text(snap))
    for gpu_type in snap.best_by_type if snap.by_type else ():
        _write_optimal(snap, launcher, gpu_type)
    return _write_optimal(snap, launcher, None)


def _write_optimal(snap: Snapshot, launcher: Launcher, gpu_type: str | None) -> Path | None:
    found = optimal(snap, launcher, gpu_type)
    if found is None:
        return None
    config, command = found
    config_path = snap.directory / config_file(gpu_type)
    write_json_atomic(config_path, config)
    write_atomic(snap.directory / command_file(gpu_type), command + "\n")
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
    typed = snap.by_type
    marked = {id(a) for a in snap.best_by_type.values()} if typed else {id(best)} if best is not None else set()
    for attempt in snap.ranked:
        mark = "*" if id(attempt) in marked else " "
        kind = f" {snap.type_of(attempt) or '-':<20}" if typed else ""
        why = f"  [{attempt.reason}] {attempt.detail or ''}".rstrip() if attempt.state != State.SUCCEEDED else ""
        lines.append(f"{mark} {attempt.name:<40}{kind} {attempt.state:<11} {format_value(attempt.metric):>12}{why}")
    if best is not None:
        lines += ["", f"best: {best.name}", f"config: {OPTIMAL_CONFIG}", f"command: {OPTIMAL_COMMAND}"]
    if typed:
        lines += ["", "best per GPU type (a metric compares only within one type):"]
        lines += [f"  {t}: {a.name} {snap.metric.name} {format_value(a.metric)}; config: {config_file(t)}, "
                  f"command: {command_file(t)}" for t, a in snap.best_by_type.items()]
    return "\n".join(lines) + "\n"
