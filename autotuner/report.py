"""What a sweep found: experiments ranked by the metric, the best one, and the files a user takes away.

Everything here reads the ledger (and nothing else), so it works the same on a running sweep, a finished one
and one that crashed: `summary.txt`, `ds_config_optimal.json` and `cmd_optimal.txt` can be rewritten any time.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from .files import write_atomic, write_json_atomic
from .launch import Launcher, optimal_command, without_autotuning
from .ledger import Attempt, Ledger, SweepMeta
from .metrics import Metric, metric_named
from .spec import Experiment
from .states import State

OPTIMAL_CONFIG = "ds_config_optimal.json"
OPTIMAL_COMMAND = "cmd_optimal.txt"
SUMMARY = "summary.txt"


@dataclass(frozen=True)
class Snapshot:
    """A sweep as its ledger shows it now."""

    directory: Path
    name: str
    metric: Metric
    experiments: Mapping[str, Experiment]
    attempts: Sequence[Attempt]  # latest attempt of each experiment, in sweep order
    meta: SweepMeta

    @cached_property
    def ranked(self) -> list[Attempt]:
        """Succeeded attempts best first, then every other attempt in sweep order (computed once)."""
        done = [a for a in self.attempts if a.state == State.SUCCEEDED and a.metric is not None]
        done.sort(key=lambda a: self.metric.sort_key(a.metric))
        chosen = {id(a) for a in done}  # not `a not in done`: that compared dataclasses, O(n^2) on 10k
        return done + [a for a in self.attempts if id(a) not in chosen]

    @property
    def best(self) -> Attempt | None:
        ranked = self.ranked
        return ranked[0] if ranked and ranked[0].state == State.SUCCEEDED and ranked[0].metric is not None else None

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for attempt in self.attempts:
            counts[attempt.state] = counts.get(attempt.state, 0) + 1
        return counts


def snapshot(directory: Path, *, every_experiment: bool = True) -> Snapshot:
    """The sweep now. `every_experiment=False` reads only the best experiment's spec (enough for status,
    the report and the optimal files): decoding 10,000 specs took most of `autotune status`'s time."""
    with Ledger.open(directory) as ledger:  # damage found mid-read ends as one line too
        meta = ledger.meta()
        name, metric, attempts = meta.name, metric_named(meta.metric), ledger.latest()
        if every_experiment:
            experiments = {e.name: e for e in ledger.experiments()}
        else:
            best = Snapshot(Path(directory), name, metric, {}, attempts, meta).best
            experiments = {e.name: e for e in ledger.experiments([best.name] if best else [])}
        return Snapshot(Path(directory), name, metric, experiments, attempts, meta)


def optimal(snap: Snapshot, launcher: Launcher = Launcher()) -> tuple[dict, str] | None:
    """The best config (autotuning section removed) and a runnable command for it, as the files hold them;
    computed from the ledger, so it is there for a sweep that still runs, before the files are written."""
    best = snap.best
    if best is None:
        return None
    experiment = snap.experiments[best.name]
    env = dict(snap.meta.env)
    config_path = (snap.directory / OPTIMAL_CONFIG).resolve()
    return without_autotuning(experiment.config()), optimal_command(experiment, str(config_path), launcher, env)


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


def format_value(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"


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
