"""The one exception type for bad input: the CLI prints it as a single line and exits 2."""
from __future__ import annotations

import errno
import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from . import limits

SHOWN = 60  # the most characters of one user value a message repeats


@dataclass
class UserError(Exception):
    """A problem in what the user gave us, located as precisely as we can (file, line, column)."""

    message: str
    path: str | Path | None = None
    line: int | None = None
    col: int | None = None

    def __str__(self) -> str:
        where = [_short_path(str(self.path))] if self.path is not None else []
        if self.path is not None and self.line is not None:
            where.append(str(self.line))
            if self.col is not None:
                where.append(str(self.col))
        return ":".join(where) + (": " if where else "") + self.message


def _short_path(path: str, limit: int = 200) -> str:
    """A path as the error line names it: whole when it is of a sane length, else its start and end (where the
    file's own name is) around an ellipsis, so that a 10,000-character path cannot fill the screen."""
    path = " ".join(path.split())  # no newline may break the one line
    return path if len(path) <= limit else f"{path[:limit // 2 - 2]}...{path[-(limit // 2 - 1):]}"


LINE = 480  # the most characters of the one line an error is printed as


def one_line(text: str, limit: int = LINE) -> str:
    """A message as the one line an error is: newlines made spaces, and one longer than `limit` cut in the middle
    (its start says what, its end often what to do). Messages quote user values through `shown`; this bounds
    the line whatever a message joins (a list of 3,000 names a user gave)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else f"{text[:limit * 2 // 3 - 3]} ... {text[-(limit // 3 - 2):]}"


def shown(value: object, limit: int = SHOWN, *, quoted: bool = True) -> str:
    """A user value as a message repeats it: a string quoted (unless not `quoted`), on one line, at most `limit`
    characters.

    A 10,000-character name or a 31-digit number must not fill the screen, and a newline in a value must not
    break the one-line error; every message that quotes a value the user wrote goes through here.
    """
    if isinstance(value, bool) or value is None:
        text = {True: "true", False: "false", None: "null"}[value]
    elif isinstance(value, int) and abs(value) >= 10 ** 15:  # str() of a huge int is slow, refused past 4300 digits
        text = f"about {'-' if value < 0 else ''}10^{int(abs(value).bit_length() * math.log10(2))}"
    elif isinstance(value, int):
        text = str(value)
    elif isinstance(value, float):
        text = "infinity" if math.isinf(value) else f"{value:.15g}"
    elif isinstance(value, str):
        text = repr(value) if quoted else repr(value)[1:-1]
    else:
        try:
            text = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, for a message: "a directory", "a pipe", "a device"..."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a pipe"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_user_file(path: str | Path, what: str, limit: int = limits.FILE_BYTES) -> str:
    """The text of a file the user named (`what` says which, e.g. "hostfile"); any failure is a UserError.

    Only regular files, and at most `limit` bytes of them: /dev/zero, a pipe with no writer or a huge file must
    be refused, not read until memory runs out or waited on forever. (A pipe such as /dev/stdin could not be
    read again by `resume` either.)
    """
    try:
        # O_NONBLOCK: opening a FIFO that has no writer returns at once instead of waiting for one.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UserError(f"{what}: no such file", path) from None
    except OSError as e:
        raise UserError(f"cannot read {what}: {e.strerror or e}", path) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UserError(f"{what} is {file_kind(mode)}, not a regular file", path)
        os.set_blocking(fd, True)
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            article = "an" if what[:1] in "aeiou" else "a"
            raise UserError(f"{what} is larger than {limits.size(limit)}, the limit for {article} {what}", path)
        return b"".join(chunks).decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UserError(f"{what} is not UTF-8 text", path) from None
    except OSError as e:
        message = f"{what} is a directory" if e.errno == errno.EISDIR else f"cannot read {what}: {e.strerror or e}"
        raise UserError(message, path) from None
    finally:
        os.close(fd)
