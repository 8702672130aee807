"""Each attempt's exit status, written next to its logs, so that a runner that did not start it can judge it.

The runner that starts an attempt learns how it ended by waiting on it. One that takes over after a crash
cannot wait on processes it did not start, so every launch runs under a small POSIX sh wrapper (here and on
SSH hosts alike; nothing but sh's builtins is needed): it runs the launcher as its child, waits for it, writes
the exit status to `exit_status` in the attempt's directory and then ends as the launcher did, by the same
signal when a signal ended it. The status is one short line written by one builtin `printf` (no `mv`: a fork
and exec cost every run milliseconds of its slot); a reader trusts it only whole, ending in its newline, so a
wrapper killed mid-write leaves "no status", never a wrong one.

The wrapper is the attempt's process-group leader and carries its tag, so clean-up covers it. It traps
SIGTERM, SIGINT and SIGHUP with a no-op (a trap, not an ignore: its child starts with the default handlers),
so a stop signal sent to the group reaches the launcher, and the wrapper outlives it to record how it ended.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

from ..core.outcome import Outcome, aborted_at_exit, judge, steps_metric
from ..jsonvalues import JSON
from ..spec.interval import StepReading, measured_run
from ..spec.metrics import Metric
from ..spec.progress import Window, autotp_size, run_config, tp_size
from ..spec.sure import tolerance_of
from ..states import Reason, State
from . import tags
from .launch import MODEL_INFO, end_profile_step

FILENAME = "exit_status"
# How an attempt that ended while no runner was alive, without recording its exit status, is recorded.
UNRECORDED = "ended while no runner was alive, without recording its exit status"

_WRAPPER = (
    'f=$1; shift; trap : TERM INT HUP; "$@"; s=$?; '
    'printf "%s\\n" "$s" > "$f"; '
    'trap - TERM INT HUP; [ "$s" -gt 128 ] && kill -$((s - 128)) $$; exit "$s"'
)


def wrapped(argv: Sequence[str], status_path: str | Path) -> list[str]:
    """`argv`, run under the wrapper that records its exit status in `status_path`."""
    return ["sh", "-c", _WRAPPER, "sh", str(status_path), *argv]


def find_wrapper(tag: str) -> int | None:
    """The pid of the attempt's wrapper on this machine, found by its tag and its command line: for an attempt
    whose pid the ledger never got (the runner died between starting it and recording it)."""
    start = "\0".join(wrapped([], "")[:3]).encode()
    for pid in tags.find_tagged(tag):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(start):
                return pid
        except OSError:
            continue
    return None


def read(status_path: str | Path) -> int | None:
    """The recorded exit status as sh reports it (128+N when signal N ended it); None if none was recorded."""
    try:
        return parse(Path(status_path).read_text(encoding="ascii", errors="replace")[:16])
    except OSError:
        return None


def parse(text: str) -> int | None:
    """The status in the file's text; None unless it is whole (empty or cut short: the wrapper died writing)."""
    return int(text.strip()) if text.endswith("\n") and text.strip().isdigit() else None


def forget(directory: Path) -> None:
    """Drop the exit status of an attempt that we ended (cancel, timeout, Ctrl-C): it tells our stop, not the
    attempt's own end, and should the ledger fail to record the stop, a successor must not judge the attempt
    by it (a cancel read as `failed: exit status -15`)."""
    with contextlib.suppress(OSError):
        (Path(directory) / FILENAME).unlink(missing_ok=True)


def as_returncode(status: int) -> int:
    """A status as `subprocess` reports a local process's: -N when signal N ended it."""
    return -(status - 128) if 128 < status < 128 + 65 else status


def judge_files(exit_code: int | None, directory: Path, metric: Metric) -> Outcome:
    """Judge an attempt from its exit status and the files in its directory, as the runner that started it
    would have; with no exit status recorded (None) it is interrupted, to be run again. With what its steps
    said (`Outcome.measured`), where it left any (spec/progress.py): every backend judges here, so none reads
    them itself (one with no status too: a stop's end, its status dropped, reads as that stop, with its steps).
    The config it ran is read once, for its measured window, its tolerance, its profile window and its layout."""
    config = run_config(directory)
    measured = measured_run(directory, metric.name, Window.of(config or {}))
    if measured is not None and metric.name == THROUGHPUT:  # on its metric's scale (`_per_layout`)
        measured = measured.over(tp_size(config or {}))
    outcome = Outcome(State.INTERRUPTED, Reason.INTERRUPTED, UNRECORDED) if exit_code is None else \
        _judged(exit_code, directory, metric, measured, config)
    return outcome if measured is None else dataclasses.replace(outcome, measured=measured)


def _judged(exit_code: int, directory: Path, metric: Metric, measured: StepReading | None,
            config: dict[str, JSON] | None) -> Outcome:
    metrics = directory / "metrics.json"
    logs = [directory / "stderr.log", directory / "stdout.log"]
    if not metrics.exists() and (directory / MODEL_INFO).exists() and (exit_code == 0 or  # a profile run ended
                                                                         aborted_at_exit(exit_code, logs)):
        return _profiled(directory / MODEL_INFO)
    profile_end = end_profile_step(config) if config is not None else None
    outcome = judge(exit_code, metrics, metric, logs, profile_end)
    if config is None:  # not a file this runner wrote: nothing to add
        return outcome
    return _per_layout(_by_steps(outcome, config, metric.name, measured), directory, config)


def _by_steps(outcome: Outcome, config: dict[str, JSON], metric: str, measured: StepReading | None) -> Outcome:
    """A run measured until sure (its config's `autotuning.tolerance`, spec/sure.py) is ranked by its steps' mean
    however it ended, once sure or at its window's end: DeepSpeed's engine writes the trimmed mean of its forward,
    backward and step timers, another span of each step than its per-step lines time, so the runs of one tune
    that ended both ways would be ranked by two measures. The engine's figure stays beside it as METRIC_engine
    (over the TP size like the rest, `_per_layout`)."""
    interval = measured.interval if measured is not None else None
    if interval is None or outcome.state != State.SUCCEEDED or metric not in (outcome.metrics or {}) or \
            tolerance_of(config) is None:
        return outcome
    metrics = {**(outcome.metrics or {}), f"{metric}{ENGINE}": (outcome.metrics or {})[metric],
               **steps_metric(interval, metric)}
    return dataclasses.replace(outcome, metrics=metrics)


THROUGHPUT, AS_WRITTEN, PER_GPU = "throughput", "throughput_deepspeed", "throughput_per_gpu"
ENGINE = "_engine"  # METRIC_engine: DeepSpeed's own figure of a run ranked by its steps' mean (_by_steps)


def _per_layout(outcome: Outcome, directory: Path, config: dict[str, JSON]) -> Outcome:
    """A run with AutoTP (its config's `tensor_parallel.autotp_size`): DeepSpeed 0.19.8's engine writes as
    throughput its train_batch_size over the step time, and counts that batch over every rank, TP ranks
    included (tune/layout.py), so at size N each sample trained is counted N times: the throughput recorded is
    the samples trained per second (DeepSpeed's figure over N, kept as `throughput_deepspeed`), its interval and
    the engine's figure beside it over N too (its steps' reading is, `judge_files`), and `throughput_per_gpu`
    beside it (over the experiment's GPUs), so that layouts compare fairly. Other runs as they are."""
    if outcome.state != State.SUCCEEDED or not outcome.metrics or THROUGHPUT not in outcome.metrics:
        return outcome
    size = autotp_size(config)
    try:
        spec = json.loads((directory / "exp.json").read_text())
        world = int(spec.get("num_gpus", 1)) * int(spec.get("num_nodes", 1))
    except (OSError, ValueError, TypeError, AttributeError):  # not a file this runner wrote: nothing to add
        return outcome
    if size is None or world < 1:
        return outcome
    metrics = dict(outcome.metrics)
    if size > 1:
        # DeepSpeed's own figure: the metric, or beside the steps' mean, already over N (`judge_files`)
        written = f"{THROUGHPUT}{ENGINE}" if f"{THROUGHPUT}{ENGINE}" in metrics else THROUGHPUT
        metrics[AS_WRITTEN] = metrics[written]
        metrics[written] = metrics[written] / size
    metrics[PER_GPU] = metrics[THROUGHPUT] / world
    return dataclasses.replace(outcome, metrics=metrics)


def _profiled(path: Path) -> Outcome:
    """A profile run (`autotuning.model_info.profile`): it succeeded when DeepSpeed's engine wrote its model info,
    a JSON object with the parameter count; its numbers are the run's metrics (the ledger keeps them)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return Outcome(State.FAILED, Reason.METRICS, f"the model info file {path.name} cannot be read: {e}", 0)
    numbers = {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)} \
        if isinstance(data, dict) else {}
    if numbers.get("num_params", 0) <= 0:
        return Outcome(State.FAILED, Reason.METRICS, f"the model info file {path.name} holds no num_params", 0)
    return Outcome(State.SUCCEEDED, exit_code=0, metrics=numbers)
