"""The runner's step reader: one thread that reads, every few seconds, what each running attempt's steps say so
far and posts it to the dispatcher (`Progress`): the scheduler keeps it in the ledger for `status`, the live view
and the dashboard, and the search stops what cannot win (tune/outclass.py). It reads the new bytes of each
attempt's logs too (its further nodes' as well, where a backend writes them apart under nodes/), for a line that
says it ran out of memory (core/outcome.py's class `oom`): such a run is ended at once, every rank, instead of
waiting for its launcher to notice.

Every backend runs its attempts in directories on the filesystem the runner shares with its nodes (the logs,
the metrics and the progress file are written there), so this one reader serves them all. It follows the
attempts the dispatcher tells it of (an `Observer`: started, adopted, finished), and reads a file only once this
attempt has written it (modified since the attempt was placed): an earlier attempt's files, still there until
the executor moves them aside, are never taken for this one's.
"""
from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..core import Key, Post, Progress, Queued, Run
from ..core.outcome import Outcome, oom_line
from ..spec.followed import FollowedSteps
from ..spec.interval import RATES, measure
from ..spec.progress import LOGS, PROGRESS_FILE, THROUGHPUT, Window, run_config, tp_size
from ..threads import Workers

POLL_ENV = "AUTOTUNE_PROGRESS_POLL"  # seconds between two readings (tests set it low)
DEFAULT_POLL = 2.0
NODES = "nodes"  # where a backend that starts a launcher per node writes the further nodes' logs (Ray: RANK.stderr.log)
_CHUNK = 1024 * 1024  # the most of a log read at once: beyond it, a log that grew faster is read from its end
# A file's time stamp comes from the kernel's coarse clock, a tick behind `time.time()`: a file made just after
# an attempt was placed can carry a time a few milliseconds before it.
_TICK = 0.1


@dataclass
class _Log:
    """How far one log was read: its inode (a new file starts again at 0), the offset, an unfinished last line."""

    inode: int = -1
    offset: int = 0
    partial: str = ""


@dataclass
class _Followed:
    run: Run
    since: float | None  # when it was placed (None: adopted, its files are its own)
    last: tuple[int, int] | None = None  # the step count and the last step at the last reading posted
    logs: dict[str, _Log] = field(default_factory=dict)
    ended: bool = False  # out of memory, posted: nothing more to read
    window: Window | None = None  # its measured steps, from its config (read once, at its first reading)
    steps_read: FollowedSteps | None = None  # its files' steps, kept between readings (from its first)
    tp: int = 1  # its config's TP size: a throughput DeepSpeed counts that many times (spec/progress.py tp_size)


class StepReader:
    """Reads the running attempts' steps and logs every `interval` seconds on its one thread (while `reading`);
    told which attempts run as an observer of the dispatcher's notes."""

    label = "the step reader"

    def __init__(self, post: Post, metric: str, interval: float, clock: Callable[[], float] = time.time):
        self.post, self.metric, self.interval, self.clock = post, metric, interval, clock
        self._followed: dict[Key, _Followed] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._workers = Workers("steps")

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Its thread, from the start of the block to its end (joined then, within a reading under way)."""
        self._workers.start("reader", self._loop)
        try:
            yield
        finally:
            self._stop.set()
            self._workers.close(timeout=30)

    def __call__(self, what: str, subject: Run | Queued | str, outcome: Outcome | None) -> None:
        """The dispatcher's notes: a run started or adopted is followed, one finished is let go."""
        if not isinstance(subject, Run):
            return
        with self._lock:
            if what in ("started", "adopted"):
                self._followed[subject.key] = _Followed(subject, self.clock() if what == "started" else None)
            elif what == "finished":
                self._followed.pop(subject.key, None)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.check()

    def check(self) -> None:
        """One reading of every attempt followed: an out-of-memory line, else new steps, posted."""
        with self._lock:
            followed = list(self._followed.values())
        for one in followed:
            if self._stop.is_set():
                return
            if not one.ended:
                self._read(one)

    def _read(self, one: _Followed) -> None:
        directory = one.run.dir
        for path in logs_of(directory):
            line = oom_line(self._new_text(path, one))
            if line is not None:
                one.ended = True
                self.post(Progress(one.run, None, f"ran out of memory while it ran: {line}"))
                return
        if not all(self._own(directory / name, one.since) for name in (PROGRESS_FILE, *LOGS)):
            return
        if one.window is None or one.steps_read is None:
            config = run_config(directory) or {}
            one.window, one.tp = Window.of(config), tp_size(config) if self.metric == THROUGHPUT else 1
            one.steps_read = FollowedSteps(directory, self.metric)
        steps, measured = one.steps_read.read(one.window)
        last = (len(steps), steps[-1].step) if steps else None
        if last == one.last:  # the count alone stops moving once a long run's steps fill the bounds kept of them
            return
        one.last = last
        reading = measure(steps, measured, rate=self.metric in RATES)
        if reading is not None:
            self.post(Progress(one.run, reading.over(one.tp)))  # on the scale its metric is recorded on

    @staticmethod
    def _own(path: Path, since: float | None) -> bool:
        """Not an earlier attempt's file: absent, empty (nothing to mislead), or modified since this attempt was
        placed."""
        try:
            info = os.stat(path)
        except OSError:
            return True
        return since is None or info.st_size == 0 or info.st_mtime >= since - _TICK

    def _new_text(self, path: Path, one: _Followed) -> str:
        """What this attempt's log gained since the last reading, in whole lines."""
        try:
            info = os.stat(path)
        except OSError:
            return ""
        if not stat.S_ISREG(info.st_mode) or (one.since is not None and info.st_mtime < one.since - _TICK):
            return ""  # a FIFO would block the reader; an older file is an earlier attempt's
        log = one.logs.setdefault(str(path), _Log())
        if info.st_ino != log.inode or info.st_size < log.offset:
            log.inode, log.offset, log.partial = info.st_ino, 0, ""
        if info.st_size - log.offset > _CHUNK:
            log.offset, log.partial = info.st_size - _CHUNK, ""
        try:
            with open(path, "rb") as f:
                f.seek(log.offset)
                data = f.read(_CHUNK)
        except OSError:
            return ""
        log.offset += len(data)
        text = log.partial + data.decode(errors="replace")
        whole, _, partial = text.rpartition("\n")
        log.partial = partial[-_CHUNK:]  # a line that never ends (a progress bar's returns) kept bounded
        return whole


def logs_of(directory: Path) -> list[Path]:
    """An attempt's logs: its own, and those of its further nodes where a backend writes them apart (under
    nodes/: a rank out of memory on the second node says so only there)."""
    try:
        nodes = sorted(p for p in (directory / NODES).iterdir() if p.name.endswith(LOGS))
    except OSError:
        nodes = []
    return [directory / name for name in LOGS] + nodes
