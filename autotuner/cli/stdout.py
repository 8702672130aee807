"""stdout for the command line: a write that fails (a pipe closed by `| head`, a full disk, /dev/full) is left
out with one note on stderr, never a traceback. Every command printed through a plain sys.stdout, and each
failed there differently: `report > /dev/full` with a traceback, `run` with one after it had made its results
directory. The command goes on (a sweep is never stopped by its output); a command whose output is its whole
product (report, status, ...) then exits 1 rather than 0, so a script does not take a cut file for the result."""
from __future__ import annotations

import contextlib
import io
import os
import sys

# Commands whose exit status says how a sweep went, whatever became of what they printed.
SWEEPS = ("run", "tune", "resume")


class _Forgiving(io.RawIOBase):
    """File descriptor `fd` for writing: the first failure is told on stderr, it and every later write dropped."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd
        self.failed: OSError | None = None

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: bytes) -> int:  # type: ignore[override]  # RawIOBase's takes any buffer
        if self.failed is None:
            try:
                return os.write(self._fd, data)
            except OSError as e:
                self.failed = e
                with contextlib.suppress(OSError):  # stderr closed too: the exit status is all that is left
                    os.write(2, f"autotune: note: stdout cannot be written ({e.strerror or e}): what this command "
                                "prints is left out\n".encode())
        return len(data)


_RAW: _Forgiving | None = None


def install() -> None:
    """Put a forgiving stdout in place of sys.stdout (same descriptor, encoding, errors and line buffering)."""
    global _RAW
    _RAW = None  # a failure told in an earlier call (the CLI called in-process) is no part of this one
    current = sys.stdout
    try:
        fd = current.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test harness's capture): left as it is
        return
    current.flush()
    _RAW = _Forgiving(fd)
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(_RAW), encoding=current.encoding, errors=current.errors,
                                  line_buffering=bool(current.line_buffering) or os.isatty(fd))


def exit_code(args: list[str], code: int) -> int:
    """`code`, or 1 where it was 0 and the command's printed output, its product, could not be written."""
    if _RAW is None or _RAW.failed is None or code != 0:
        return code
    command = next((a for a in args if not a.startswith("-")), "")
    return code if command in SWEEPS else 1


def flush() -> None:
    """Write what is buffered (a failure is told and dropped like any other)."""
    if _RAW is not None:
        sys.stdout.flush()
