"""A sweep's files read for the page (a run's stdout and stderr followed as they grow, its config), never a
file outside the sweep's directory: a path is resolved (symlinks followed) and must still lie inside it.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

CHUNK = 256 * 1024  # the most one request returns: a long log is followed in pieces


class Refused(Exception):
    """A request the dashboard refuses (a path it does not serve, a bad value, no token): the HTTP status and
    one line saying why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Piece:
    """Bytes of a file from `offset`; `next` is where the following piece starts, `size` the file's size now."""

    data: bytes
    offset: int
    next: int
    size: int


def inside(sweep: Path, relative: str) -> Path:
    """The file `relative` names in the sweep's directory; Refused when it names none, or lies outside (through
    `..`, an absolute path or a symlink), or is not a regular file (a FIFO would block the reader)."""
    if not relative or "\0" in relative or "\\" in relative or len(relative) > 4096:
        raise Refused(400, "a path relative to the sweep's directory is needed")
    if PurePosixPath(relative).is_absolute():
        raise Refused(403, "absolute paths are refused: name a file inside the sweep")
    base = sweep.resolve()
    target = (base / relative).resolve()
    if target != base and base not in target.parents:
        raise Refused(403, "that path leads outside the sweep")
    try:
        mode = os.stat(target).st_mode
    except OSError:
        raise Refused(404, "no such file in the sweep") from None
    if not stat.S_ISREG(mode):
        raise Refused(404, "not a regular file")
    return target


def read_piece(path: Path, offset: int) -> Piece:
    """The bytes from `offset` (negative: the last CHUNK of the file), cut after the last newline of a full
    piece so that a line, and a character, is never split between two. A file removed or made unreadable since
    `inside` looked (a run's directory cleaned, a log rotated) is refused as such, never an error of the server."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = max(size - CHUNK, 0) if offset < 0 else min(offset, size)
            f.seek(start)
            data = f.read(CHUNK)
    except OSError as e:
        raise Refused(404, f"cannot read that file: {e.strerror or 'unreadable'}") from None
    if len(data) == CHUNK and b"\n" in data:
        data = data[:data.rindex(b"\n") + 1]
    return Piece(data, start, start + len(data), size)
