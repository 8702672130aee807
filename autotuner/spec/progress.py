"""A run's per-step progress: when each training step ended and what it measured.

Two sources, read from the attempt's own directory (on the filesystem every node of a sweep shares, or copied
back with the logs), so that no backend needs to know of them:

The progress file (the contract for any script)
    The runner sets `AUTOTUNE_PROGRESS_PATH` (`PROGRESS_PATH_ENV`) to an absolute path beside
    `AUTOTUNE_METRICS_PATH`. A script may append one JSON object per line to it, one line per optimizer step,
    from one process (rank 0): `{"step": 12, "time": 1764361234.5, "throughput": 1834.2}`. `step` is the step's
    number (an integer from 0 to MAX_STEP), `time` when it ended (seconds since the epoch, `time.time()`), and the
    sweep's metric key, when present, what that step measured (a finite number >= 0). Lines that are not such
    objects (a half-written last line among them) are skipped. Writing it is optional: a run without it is judged by
    its metrics file alone.

DeepSpeed's own throughput lines
    A DeepSpeed run needs no change: the runner sets `steps_per_print` to 1 in the config each measured run gets
    (whatever the config says; the best run's command keeps the user's), so DeepSpeed's engine prints on rank 0,
    every optimizer step, a line such as
    `[2026-11-28 21:24:44,478] [INFO] [timer.py:264:stop] epoch=0/micro_step=4/global_step=4,
    RunningAvgSamplesPerSec=..., CurrSamplesPerSec=1834.2, ...` (`deepspeed/utils/timer.py`). Its time stamp
    (this machine's local time, to the millisecond) is when the step ended, and `CurrSamplesPerSec` its
    throughput. Read only when the run wrote no progress file.

The measured window (`Window`): the steps after the first start_profile_step + 1 a run makes, up to its window's
end, end_profile_step - start_profile_step steps later, from either source, so that one count of steps means one
thing (the steps its interval is worked out from, `steps_measured`, and what a run stopped early had left).
DeepSpeed's engine times its steps from start_profile_step on, and the first of them is the one its flops profiler
runs in, slower than the rest: its line is step start_profile_step + 1 (the lines number the steps made: its timer
prints none for the first two); the first lines of a progress file are the script's warm-up likewise. The run's
last step, end_profile_step + 1, is the window's last: DeepSpeed's engine writes its metrics and ends the run after
it. A progress file is one line a step (its contract), so its steps are counted by their place (their numbers are
the script's own, from 0 or 1), and all after the warm-up are kept: a DeepSpeed script's engine ends it at its
window's end, and a script that is none runs as long as it runs.
"""
from __future__ import annotations

import json
import math
import os
import re
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PROGRESS_PATH_ENV = "AUTOTUNE_PROGRESS_PATH"
PROGRESS_FILE = "progress.jsonl"
THROUGHPUT = "throughput"  # the metric DeepSpeed's lines measure, counted over TP ranks (`tp_size`)
LOGS = ("stdout.log", "stderr.log")  # an attempt's logs, where DeepSpeed's lines are read (stdout's first)
CONFIG_FILE = "ds_config.json"  # the config an attempt runs, in its directory (written before it starts)
MAX_STEPS = 100_000  # steps read of one run: the last ones; a longer file is read from its end
MAX_BYTES = 8 * 1024 * 1024  # of the progress file and of each log, read from the end
# The largest step number read (2^53, below which every whole number is a float): a larger one is no step's, and
# the arithmetic on steps (a step time over the steps between two lines) cannot hold it.
MAX_STEP = 2 ** 53
START = 3  # DeepSpeed's default start_profile_step

_DEEPSPEED = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\] \[INFO\] \[timer\.py:\d+:stop\] "
    r"epoch=\d+/micro_step=\d+/global_step=(\d{1,15}), "
    r"RunningAvgSamplesPerSec=[^,\n]*, CurrSamplesPerSec=([0-9.eE+\-]+),",  # one line: no line feed inside
    re.M)  # up to the comma after the value (", MemAllocated=" follows): a line half-written ("=18" of 1834.2) is none


@dataclass(frozen=True, slots=True)
class TrainStep:
    """One optimizer step: its number, when it ended (seconds since the epoch), and its value of the metric."""

    step: int
    at: float
    value: float | None = None


@dataclass(frozen=True)
class Window:
    """The steps of a run that are measured (see the module's doc): those after the first `skip` it makes, the
    window's end `most` steps later (None: none known)."""

    skip: int
    most: int | None = None

    @classmethod
    def of(cls, ds_config: Mapping[str, object]) -> Window:
        """The window of a config's profile steps (its `autotuning` section's, DeepSpeed's default start)."""
        section = ds_config.get("autotuning")
        section = section if isinstance(section, Mapping) else {}
        start, end = _step(section.get("start_profile_step")), _step(section.get("end_profile_step"))
        start = START if start is None else start
        return cls(start + 1, end - start if end is not None and end > start else None)

    def placed(self, made: list[TrainStep]) -> list[TrainStep]:
        """The measured steps of a run's whose places count the steps made (a progress file's): all after the
        skipped ones."""
        return made[self.skip:]

    def numbered(self, made: list[TrainStep]) -> list[TrainStep]:
        """The window's steps of a run's whose numbers count the steps made (DeepSpeed's lines)."""
        return [s for s in made if s.step > self.skip and (self.most is None or s.step <= self.skip + self.most)]


def run_config(directory: Path) -> dict[str, object] | None:
    """The config an attempt ran, from its directory; None where it cannot be read (not a file a runner wrote)."""
    try:
        config = json.loads((directory / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def autotp_size(config: Mapping[str, object]) -> int | None:
    """The AutoTP size a config declares (`tensor_parallel.autotp_size`, a positive integer); None where it declares
    none (or something DeepSpeed would not take as one). One reading for every place that asks."""
    section = config.get("tensor_parallel")
    size = section.get("autotp_size") if isinstance(section, Mapping) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 1 else None


def tp_size(config: Mapping[str, object]) -> int:
    """The tensor-parallel size of a config (`autotp_size`; 1 without): DeepSpeed 0.19.8 counts each sample trained
    that many times in its throughput (its train_batch_size spans the TP ranks), so a throughput measured of it is
    over that size (backends/exitstatus.py)."""
    return autotp_size(config) or 1


def read_steps(directory: Path, metric: str, window: Window) -> tuple[list[TrainStep], list[TrainStep]]:
    """The run's steps in order and those of them in its measured `window`: its progress file's, else DeepSpeed's
    throughput lines in its logs (only for the metric `throughput`; numbered by the steps made, its timer prints
    none of the first two); none when it left neither. The whole lines of each file's last MAX_BYTES. Read whole:
    a run judged at its end; the runner follows a running one with spec/followed.py, which reads the same."""
    steps = from_progress_file(directory / PROGRESS_FILE, metric)
    if steps or metric != THROUGHPUT:
        return steps, window.placed(steps)
    for log in LOGS:
        steps = from_deepspeed_log(read_tail(directory / log, MAX_BYTES, lines=True))
        if steps:
            return steps, window.numbered(steps)
    return [], []


def from_progress_file(path: Path, metric: str) -> list[TrainStep]:
    """The lines of a progress file that are whole step objects, in step order (a repeated step: its last line)."""
    found = {step.step: step for step in progress_steps(read_tail(path, MAX_BYTES, lines=True), metric)}
    return ordered(found)


def progress_steps(text: str, metric: str) -> list[TrainStep]:
    """The step objects among a progress file's lines (any of Python's line breaks ends one), in file order."""
    return [step for line in text.splitlines() if (step := _step_line(line, metric)) is not None]


def _step_line(line: str, metric: str) -> TrainStep | None:
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    number, at, value = data.get("step"), _finite(data.get("time")), _finite(data.get(metric))
    if not isinstance(number, int) or isinstance(number, bool) or not 0 <= number <= MAX_STEP or at is None or \
            at <= 0:
        return None
    return TrainStep(number, at, value if value is not None and value >= 0 else None)


def from_deepspeed_log(text: str) -> list[TrainStep]:
    """DeepSpeed's per-step throughput lines in a log's text, in step order."""
    found: dict[int, TrainStep] = {}
    for match in _DEEPSPEED.finditer(text):
        step = _deepspeed_step(match)
        if step is not None:
            found[step.step] = step
    return ordered(found)


def deepspeed_steps(line: str) -> list[TrainStep]:
    """The step of one line of a log (no line feed in it) that is DeepSpeed's throughput line: what
    `from_deepspeed_log` finds at that line's start."""
    match = _DEEPSPEED.match(line)
    step = _deepspeed_step(match) if match is not None else None
    return [step] if step is not None else []


def _deepspeed_step(match: re.Match[str]) -> TrainStep | None:
    stamp, millis, number, value = match.groups()
    try:
        at = time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000
    except (ValueError, OverflowError):
        return None
    speed = _finite_text(value)
    return TrainStep(int(number), at, speed if speed is not None and speed >= 0 else None)


def read_tail(path: Path, size: int, lines: bool = False) -> str:
    """At most `size` bytes from the end of a regular file, as text; nothing for a missing or odd file (a FIFO
    would block the reader, a device never end). `lines`: only the lines that start within them (a line cut by
    the tail's start is no line: its end alone could read as one)."""
    fd = open_regular(path)
    if fd is None:
        return ""
    try:
        start = max(0, os.fstat(fd).st_size - size)
        cut = lines and start > 0  # read the byte before too: the line it ends is cut, or it is a line feed
        os.lseek(fd, start - 1 if cut else start, os.SEEK_SET)
        chunks, left = [], size + 1 if cut else size
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        return (data.partition(b"\n")[2] if cut else data).decode(errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def open_regular(path: Path) -> int | None:
    """A descriptor of a regular file, opened so that nothing blocks; None for a missing or odd one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def ordered(found: dict[int, TrainStep]) -> list[TrainStep]:
    """Steps by their number in step order, the last MAX_STEPS of them."""
    return [found[k] for k in sorted(found)][-MAX_STEPS:]


def _step(value: object) -> int | None:
    """A profile step of a config (an integer >= 0); None for anything else."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _finite(value: object) -> float | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _finite_text(text: str) -> float | None:
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None
