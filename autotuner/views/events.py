"""A sweep's events as they happen, for scripts (`--events FILE`: one JSON object a line) and for a log that is
not a terminal (one plain line an event on stdout). Both are scheduler observers: called on the dispatcher
thread with ("started" | "adopted", Run, None), ("finished", Run or an unstarted Queued, Outcome),
("requeued", Queued, Outcome), ("progress", Run, Outcome(running, measured=its steps so far)), ("host_down",
host name, Outcome saying why), ("host_up", host name, None) and ("stopping", sweep id, Outcome)
(see `core.roles.Observer`); they write what they are told and never wait. Progress goes to the JSON stream
only: a plain line every few seconds per run would bury the lines that say what ended.
"""
from __future__ import annotations

import errno
import json
import os
import re
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, cast

from ..core.outcome import Outcome
from ..errors import UserError
from ..jsonvalues import JSONObject
from ..spec.interval import timing_of
from ..spec.outputs import check_output
from ..states import State
from .snapshot import format_slots

if TYPE_CHECKING:
    from ..core.events import Queued, Run

# What the scheduler tells its observers.
# adopted: a run a dead runner started, followed to its end; requeued: queued again at once, as a new attempt.
STARTED, ADOPTED, FINISHED, REQUEUED = "started", "adopted", "finished", "requeued"
HOST_DOWN, HOST_UP = "host_down", "host_up"
STOPPING = "stopping"  # the sweep stops dispatching (Ctrl-C, a cancel of all of it, its deadline); told once
PROGRESS = "progress"  # a running attempt's steps so far (sweep/steps.py), in the Outcome's `measured`


# --- the JSON event stream -----------------------------------------------------------------------------------
def event_record(what: str, subject: Run | Queued, outcome: Outcome | None, metric: str, at: float) -> JSONObject:
    """One event as a JSON-ready dict: what, the attempt, where it ran, how it ended, when."""
    reservation = getattr(subject, "reservation", None)  # an unstarted Queued has none
    record = {"event": what, "timestamp": round(at, 6),
              "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(at)) + f".{int(at % 1 * 1000):03d}",
              "name": subject.experiment.name, "attempt": subject.attempt,
              "slots": reservation.as_dict() if reservation is not None else {}}
    if what in (STARTED, ADOPTED):
        return record | {"state": State.RUNNING, "reason": None, "detail": None, "metric": None, "metrics": {}}
    if what == PROGRESS:  # a running attempt's steps so far: its mean, interval and steps as the report's columns
        timing = timing_of(outcome.measured if outcome is not None else None, None)
        interval = timing.interval if timing is not None else None
        return record | {"state": State.RUNNING, "reason": None, "detail": None,
                         "metric": interval.mean if interval is not None else None,
                         "metrics": timing.columns(metric) if timing is not None else {}}
    if what == REQUEUED:  # queued again at once, as a new attempt; the outcome says why
        return record | {"state": State.QUEUED, "reason": outcome.reason if outcome is not None else None,
                         "detail": outcome.detail if outcome is not None else None, "metric": None, "metrics": {}}
    metrics = dict(outcome.metrics or {}) if outcome is not None else {}
    return record | {"state": outcome.state if outcome is not None else State.CANCELLED,
                     "reason": outcome.reason if outcome is not None else None,
                     "detail": outcome.detail if outcome is not None else None,
                     "metric": metrics.get(metric), "metrics": metrics}


class EventLog:
    """A scheduler observer that appends one JSON line per event to a file, flushed at once. The file is opened
    at the first event, so that a command refused before its sweep started (`check_events_path` told it could be
    written) leaves no file behind."""

    def __init__(self, path: Path, metric: str, *, clock: Callable[[], float] = time.time):
        self.path = Path(path)
        self.label = f"--events {self.path}"
        self._metric = metric
        self._clock = clock
        self._file: IO[str] | None = None

    def __call__(self, what: str, subject: Run | Queued | str, outcome: Outcome | None) -> None:
        if what == STOPPING:
            record = {"event": what, "timestamp": round(self._clock(), 6),
                      "state": outcome.state if outcome is not None else None,
                      "reason": outcome.reason if outcome is not None else None,
                      "detail": outcome.detail if outcome is not None else None}
        elif isinstance(subject, str):  # a host event
            record = {"event": what, "timestamp": round(self._clock(), 6), "host": subject}
            if outcome is not None and outcome.detail:
                record["detail"] = outcome.detail
        else:
            record = event_record(what, subject, outcome, self._metric, self._clock())
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115  # open for the sweep: close()
        self._file.write(json.dumps(record, sort_keys=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def check_events_path(path: Path) -> None:
    """Fail before anything is created when the events file cannot be written.

    Proven by writing, since permission bits say nothing to root and /dev/full or a full disk open fine and
    fail on write: a regular file takes one byte that is then truncated away (a file made for the test is
    removed again); a device or terminal takes an empty write. A FIFO must have a reader now (a blocking open
    would wait for one, silently, after the results directory was made); the end opened to check it stays open
    until the process exits, since closing it could end the reader's input. A socket is left alone. The
    sweep's own files (its ledger, above all) are refused: events written there would be lost, or worse.
    """
    path = Path(path)
    try:
        mode: int | None = path.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise UserError(f"cannot write the --events file: {e.strerror or e}", path) from None
    if mode is not None and stat.S_ISDIR(mode):
        raise UserError("is a directory; --events wants a file", path)
    if mode is None and not (path.parent if str(path.parent) else Path(".")).is_dir():
        raise UserError("no such directory for the --events file", path)
    check_output(path, "--events", ())
    if mode is not None and stat.S_ISFIFO(mode):
        try:
            _HELD.append(os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC))
        except OSError as e:
            raise UserError("a FIFO that nobody reads yet; start its reader first" if e.errno == errno.ENXIO
                            else f"cannot write the --events file: {e.strerror or e}", path) from None
        return
    if mode is not None and stat.S_ISSOCK(mode):
        if not os.access(path, os.W_OK):
            raise UserError("cannot write the --events file here", path)
        return
    try:
        _write_probe(path, regular=mode is None or stat.S_ISREG(mode), created=mode is None)
    except OSError as e:
        raise UserError(f"cannot write the --events file: {e.strerror or e}", path) from None


_HELD: list[int] = []  # write ends of --events FIFOs, open until the process exits (see check_events_path)


def _write_probe(path: Path, *, regular: bool, created: bool) -> None:
    """Write to `path` and take the write back (see `check_events_path`)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOCTTY | os.O_NONBLOCK, 0o666)
    try:
        if not regular:
            os.write(fd, b"")
            return
        size = os.fstat(fd).st_size
        try:
            os.write(fd, b"\n")
            os.fsync(fd)  # a full disk may take the byte into the page cache and refuse it here
        finally:
            os.ftruncate(fd, size)
    finally:
        os.close(fd)
        if created:
            path.unlink(missing_ok=True)


# --- plain lines ---------------------------------------------------------------------------------------------
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")  # colours, cursor moves, screen clears
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # newlines, tabs, bells...


def one_line(text: str) -> str:
    """A log line as a view repeats it: terminal escapes (a coloured log) and control characters dropped, on one
    line. A failure's detail is a line from the run's own log: it must not move the cursor or clear a screen."""
    return " ".join(_CONTROLS.sub(" ", _ESCAPES.sub("", text)).split())


MAX_VALUES = 8  # metric values on one line; a script may write hundreds (the ledger and --events keep them all)


def metric_values(metrics: Mapping[str, float] | None, metric: str) -> str:
    """`throughput=1235, latency=81.2`: the sweep's metric first, whatever its name, then the others the run
    wrote, in its file's order (DeepSpeed's `rank` is a rank, not a measurement), at most MAX_VALUES."""
    if not metrics:
        return ""
    names = ([metric] if metric in metrics else []) + [k for k in metrics if k not in (metric, "rank")]
    shown = ", ".join(f"{k}={metrics[k]:.4g}" for k in names[:MAX_VALUES])
    return shown + (f" (+{len(names) - MAX_VALUES} more)" if len(names) > MAX_VALUES else "")


def event_line(what: str, subject: Run | Queued | str, outcome: Outcome | None, metric: str = "throughput") -> str:
    """One event as a line a person scans: `start     NAME (attempt 2) on node-a:1 node-b:0,2`, `succeeded
    NAME throughput=1235, latency=81.2`, `failed    NAME [oom] CUDA out of memory`, `lost      host node-b:
    stopped answering`, `stopping  interrupted: interrupted by the user`."""
    if what == STOPPING:
        if outcome is None:
            return STOPPING
        return f"{STOPPING:<9} {outcome.state}" + (f": {one_line(outcome.detail)}" if outcome.detail else "")
    if isinstance(subject, str):  # a host event
        why = f": {one_line(outcome.detail)}" if what == HOST_DOWN and outcome and outcome.detail else ""
        return f"{'lost' if what == HOST_DOWN else 'back':<9} host {subject}{why}"
    name = subject.experiment.name
    if what in (STARTED, ADOPTED):
        where = format_slots(cast("Run", subject).reservation.slots, sep=" ")
        return f"{'start' if what == STARTED else 'adopt':<9} {name} (attempt {subject.attempt}) on {where}"
    if what == REQUEUED:
        why = f" [{outcome.reason}]" if outcome is not None and outcome.reason else ""
        return f"{'retry':<9} {name} (attempt {subject.attempt}){why}"
    if outcome is None:
        return f"{what:<9} {name}"
    values = metric_values(outcome.metrics, metric)
    value = f" {values}" if values else ""
    failed = outcome.state != State.SUCCEEDED and outcome.reason
    why = f" [{outcome.reason}] {one_line(outcome.detail or '')}" if failed else ""
    return f"{outcome.state:<9} {name}{value}{why}".rstrip()


class PlainPrinter:
    """A scheduler observer that prints one time-stamped line per event on stdout: what `autotune run` shows
    when stdout is not a terminal (a log file, a pipe) and there is no live view. `metric`: the sweep's, printed
    first on each result line."""

    label = "printing events on stdout"  # names it in the note when it fails (stdout closed) and is left out

    def __init__(self, metric: str = "throughput") -> None:
        self.metric = metric

    def __call__(self, what: str, subject: Run | Queued | str, outcome: Outcome | None) -> None:
        if what == PROGRESS:
            return
        print(f"{time.strftime('%H:%M:%S')} {event_line(what, subject, outcome, self.metric)}", flush=True)
