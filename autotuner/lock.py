"""One runner per sweep: an exclusive flock on `runner.lock`, which the kernel drops when the runner dies.

The lock file holds the runner's pid, so another terminal can find it (`autotune cancel` signals it) and can
tell a live runner from a dead one (kill -9 leaves the file, never the lock).
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCKFILE = "runner.lock"


class SweepBusy(Exception):
    """Another live runner holds the sweep."""

    def __init__(self, pid: int | None):
        super().__init__(f"a runner (pid {pid}) is working on this sweep" if pid else "a runner holds this sweep")
        self.pid = pid


class SweepLock:
    """Held for the whole life of a runner; `release` (or process death) frees it."""

    def __init__(self, directory: Path):
        self.path = Path(directory) / LOCKFILE
        self._fd: int | None = None

    def acquire(self) -> "SweepLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SweepBusy(holder_pid(self.path.parent)) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> "SweepLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder_pid(directory: Path) -> int | None:
    """The pid of the live runner holding the sweep, or None when no runner holds it."""
    path = Path(directory) / LOCKFILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.read(fd, 64).decode().strip()
            return int(text) if text.isdigit() else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
