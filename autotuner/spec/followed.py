"""A running attempt's steps, read as its files grow: what progress.py `read_steps` reads whole, kept between
readings so that each reading parses only the lines written since. The runner's step reader (sweep/steps.py) reads
every running attempt every few seconds; a whole read of a long run's files is megabytes each time.

Each reading says what a whole read says at that moment (tests/test_followed.py compares them): the same source
(the progress file, else DeepSpeed's lines in stdout.log, else in stderr.log), the steps of the whole lines that
start within a file's last MAX_BYTES, a repeated step's last line, at most MAX_STEPS in step order, and an
unfinished last line read as a whole read reads it (again at the next reading, until it ends).

A file replaced (another inode), cut short, or rewritten in place (its first bytes, or its last bytes read, are
not what they were) is read again from its start; one that grew by more than MAX_BYTES since is read from its last
MAX_BYTES, as a whole read would. A file rewritten in place with the same bytes at both places is taken as grown.
What is kept of a file between readings: its steps (at most MAX_STEPS, the highest), where each of their lines
starts (a step whose line leaves the last MAX_BYTES goes), and its unfinished last line (at most MAX_BYTES). A step
left out for MAX_STEPS whose line is still within the last MAX_BYTES comes back when a kept one's line leaves them
(only in a file whose step numbers go back): the file is then read again from its last MAX_BYTES.
"""
from __future__ import annotations

import functools
import os
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .progress import (
    LOGS,
    MAX_BYTES,
    MAX_STEPS,
    PROGRESS_FILE,
    THROUGHPUT,
    TrainStep,
    Window,
    deepspeed_steps,
    open_regular,
    ordered,
    progress_steps,
)

Parse = Callable[[str], list[TrainStep]]  # one line's steps (a line without its line feed)
FINGER = 64  # of a file's first bytes and the last read, compared at the next reading: one rewritten is read anew
CHUNK = 1024 * 1024  # the most read at once


@dataclass
class _Kept:
    """What a reading of one file keeps for the next."""

    identity: tuple[int, int] | None = None  # the file's device and inode
    pos: int = 0  # the next byte to read
    line_start: int = 0  # where the unfinished last line starts
    partial: bytes = b""  # its bytes so far (none while `cut`)
    cut: bool = False  # it starts before the last MAX_BYTES: no line, skipped to its end
    finger: bytes = b""  # the last bytes read
    opening: bytes = b""  # the file's first bytes
    found: dict[int, TrainStep] = field(default_factory=dict)  # the steps by number, each its last line's
    starts: array[int] = field(default_factory=lambda: array("q"))  # where each step line starts, in file order
    lines: list[TrainStep] = field(default_factory=list)  # each such line's step
    head: int = 0  # the lines before it have left the last MAX_BYTES
    left_out: int = -1  # the last start of a line whose step was left out for MAX_STEPS
    sorted: list[TrainStep] | None = field(default_factory=list)  # `found` in step order (None: to sort)
    unfinished: list[TrainStep] | None = None  # the unfinished line's steps (None: to parse)


class FollowedFile:
    """One file's steps, kept between readings (see the module's doc)."""

    def __init__(self, path: Path, parse: Parse):
        self.path, self.parse = path, parse
        self.kept = _Kept()

    def steps(self) -> list[TrainStep]:
        """The file's steps now, in step order: what `from_progress_file` or `from_deepspeed_log` reads of it."""
        fd = open_regular(self.path)
        if fd is None:
            self.kept = _Kept()
            return []
        try:
            self._catch_up(fd)
        except OSError:
            self.kept = _Kept()
            return []
        finally:
            os.close(fd)
        return self._now()

    def _catch_up(self, fd: int, again: bool = True) -> None:
        """Read what the file gained; start over where it is another file, or has more new than a whole read."""
        info = os.fstat(fd)
        kept, identity = self.kept, (info.st_dev, info.st_ino)
        if identity != kept.identity or info.st_size < kept.pos or not _same(fd, kept):
            kept = self.kept = _Kept(identity)
        window = max(0, info.st_size - MAX_BYTES)
        if window > kept.pos:  # from the byte before the window: the line it ends is cut, or it is a line feed
            kept = self.kept = _Kept(identity, pos=window - 1, line_start=window - 1, cut=True)
        if len(kept.opening) < FINGER:
            kept.opening = os.pread(fd, FINGER, 0)
        while kept.pos < info.st_size:
            data = os.pread(fd, min(CHUNK, info.st_size - kept.pos), kept.pos)
            if not data:
                break
            self._take(data)
        if not kept.cut and kept.line_start < window:
            kept.partial, kept.cut, kept.unfinished = b"", True, None
        if self._leave(window) and kept.left_out >= window and again:
            self.kept = _Kept(identity, pos=max(0, window - 1), line_start=max(0, window - 1), cut=window > 0)
            self._catch_up(fd, again=False)

    def _take(self, data: bytes) -> None:
        """Take `data`, the file's bytes from the kept position: the steps of each line it ends; what follows its
        last line feed is the unfinished line."""
        kept = self.kept
        start, kept.pos = kept.pos, kept.pos + len(data)
        kept.finger, kept.unfinished = (kept.finger + data)[-FINGER:], None
        last = data.rfind(b"\n")
        if last < 0:
            if not kept.cut:
                kept.partial += data
            return
        at = start
        for i, piece in enumerate(data[:last].split(b"\n")):
            line, line_start, cut = (kept.partial + piece, kept.line_start, kept.cut) if i == 0 else (piece, at, False)
            at += len(piece) + 1
            if not cut:
                for step in self.parse(line.decode(errors="replace")):
                    self._add(step, line_start)
        kept.partial, kept.cut, kept.line_start = data[last + 1:], False, start + last + 1
        self._cap()

    def _add(self, step: TrainStep, line_start: int) -> None:
        kept = self.kept
        kept.starts.append(line_start)
        kept.lines.append(step)
        again = step.step in kept.found
        kept.found[step.step] = step
        if kept.sorted is not None:
            if not again and (not kept.sorted or step.step > kept.sorted[-1].step):
                kept.sorted.append(step)
            else:
                kept.sorted = None

    def _cap(self) -> None:
        """At most MAX_STEPS kept, the highest; where the last line of those left out starts."""
        kept = self.kept
        excess = len(kept.found) - MAX_STEPS
        if excess <= 0:
            return
        steps = self._sorted()
        out = {id(step) for step in steps[:excess]}
        for step in steps[:excess]:
            del kept.found[step.step]
        del steps[:excess]
        for i in range(kept.head, len(kept.lines)):  # each step is one line's: its line is found once
            if id(kept.lines[i]) in out:
                out.discard(id(kept.lines[i]))
                kept.left_out = max(kept.left_out, kept.starts[i])
                if not out:
                    break

    def _leave(self, window: int) -> bool:
        """Let the steps whose lines start before `window` go; whether a kept one went."""
        kept, gone = self.kept, []
        while kept.head < len(kept.starts) and kept.starts[kept.head] < window:
            step = kept.lines[kept.head]
            kept.head += 1
            if kept.found.get(step.step) is step:
                del kept.found[step.step]
                gone.append(step)
        if kept.head > 4096 and kept.head * 2 > len(kept.starts):
            del kept.starts[:kept.head], kept.lines[:kept.head]
            kept.head = 0
        if gone and kept.sorted is not None:
            if kept.sorted[:len(gone)] == gone:  # the lowest went (a file in step order): one number, one kept step
                del kept.sorted[:len(gone)]
            else:
                kept.sorted = None
        return bool(gone)

    def _sorted(self) -> list[TrainStep]:
        kept = self.kept
        if kept.sorted is None:
            kept.sorted = [kept.found[n] for n in sorted(kept.found)]
        return kept.sorted

    def _now(self) -> list[TrainStep]:
        """The steps kept, with those of the unfinished last line (read again until it ends)."""
        kept, steps = self.kept, self._sorted()
        if kept.cut or not kept.partial:
            return list(steps)
        if kept.unfinished is None:
            kept.unfinished = self.parse(kept.partial.decode(errors="replace"))
        if not kept.unfinished:
            return list(steps)
        found = dict(kept.found)
        for step in kept.unfinished:
            found[step.step] = step
        return ordered(found)


def _same(fd: int, kept: _Kept) -> bool:
    """Whether the file's first bytes and the last bytes read are still where they were (not a file rewritten in
    place: one rewritten with the same bytes at both places is taken as grown)."""
    return (not kept.opening or os.pread(fd, len(kept.opening), 0) == kept.opening) and \
        (not kept.finger or os.pread(fd, len(kept.finger), kept.pos - len(kept.finger)) == kept.finger)


class FollowedSteps:
    """A run's steps as `read_steps` reads them, each of its files followed (see the module's doc)."""

    def __init__(self, directory: Path, metric: str):
        self.metric = metric
        self.progress = FollowedFile(directory / PROGRESS_FILE, functools.partial(progress_steps, metric=metric))
        self.logs = [FollowedFile(directory / name, deepspeed_steps) for name in LOGS]

    def read(self, window: Window) -> tuple[list[TrainStep], list[TrainStep]]:
        """The run's steps in order and those of them in its measured `window` (`read_steps`)."""
        steps = self.progress.steps()
        if steps or self.metric != THROUGHPUT:
            return steps, window.placed(steps)
        for log in self.logs:
            steps = log.steps()
            if steps:
                return steps, window.numbered(steps)
        return [], []
