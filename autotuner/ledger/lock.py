"""One runner per sweep: an exclusive flock on the results directory itself, which the kernel drops when the
runner dies.

The lock is on the directory, not only on a file in it: a user may delete a file while its holder lives (the
README says kill -9 leaves `runner.lock` behind, which invites it), and a second runner then started and ended
the first one's experiments. A directory that holds a sweep cannot be deleted. `runner.lock` is flocked too (on
a filesystem that cannot lock a directory, NFS for one, that is the lock, as it was before) and holds the
runner's pid for people; `holder_pid` finds the pid in the kernel's lock table even when the file is gone, so
`autotune cancel` and `status` still see a live runner (kill -9 leaves the file, never the lock).
"""
from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

LOCKFILE = "runner.lock"

# flock's answer where the filesystem cannot lock a directory (NFS emulates flock with POSIX locks, which a
# directory opened read-only cannot take): runner.lock's lock is then the only one.
_CANNOT_LOCK = (errno.EBADF, errno.EINVAL, errno.ENOLCK, errno.EOPNOTSUPP)


class SweepBusy(Exception):
    """Another live runner holds the sweep."""

    def __init__(self, pid: int | None):
        super().__init__(f"a runner (pid {pid}) is working on this sweep" if pid else "a runner holds this sweep")
        self.pid = pid


class SweepLock:
    """Held for the whole life of a runner; `release` (or process death) frees it."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.path = self.directory / LOCKFILE
        self._fds: list[int] = []

    def acquire(self) -> SweepLock:
        fds: list[int] = []
        try:
            fds.append(os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY))
            if not self._take(fds[-1], optional=True):
                os.close(fds.pop())
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            fds.append(fd)
            self._take(fd, optional=False)  # also excludes a runner of an autotuner that locked only the file
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            os.fsync(fd)
        except BaseException:
            for fd in fds:
                os.close(fd)  # closing drops what was taken
            raise
        self._fds = fds
        return self

    def _take(self, fd: int, optional: bool) -> bool:
        """An exclusive flock on `fd`, or SweepBusy. False (when `optional`): the filesystem cannot lock it."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SweepBusy(_locker(fd) or _pid_in(self.path)) from None
        except OSError as e:
            if optional and e.errno in _CANNOT_LOCK:
                return False
            raise
        return True

    def release(self) -> None:
        for fd in self._fds:
            os.close(fd)  # closing drops the flock
        self._fds = []

    def __enter__(self) -> SweepLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder_pid(directory: Path) -> int | None:
    """The pid of the live runner holding the sweep, or None when no runner holds it."""
    directory = Path(directory)
    for path, flags in ((directory, os.O_RDONLY | os.O_DIRECTORY), (directory / LOCKFILE, os.O_RDONLY)):
        try:
            fd = os.open(path, flags)
        except OSError:  # no runner.lock: no runner of an autotuner that locked only the file
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return _locker(fd) or _pid_in(directory / LOCKFILE)
            except OSError as e:
                if e.errno in _CANNOT_LOCK:
                    continue
                raise
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    return None


def _locker(fd: int) -> int | None:
    """The pid holding an exclusive flock on `fd`'s file, from the kernel's lock table (Linux): exact, and
    there whether or not runner.lock is."""
    try:
        st = os.fstat(fd)
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():  # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:2147729 0 EOF"; waiters have "->"
        fields = line.split()
        if len(fields) > 5 and fields[1:4] == ["FLOCK", "ADVISORY", "WRITE"] and fields[5] == where:
            return int(fields[4]) if fields[4].isdigit() and int(fields[4]) > 0 else None
    return None


def _pid_in(path: Path) -> int | None:
    try:
        text = path.read_text(errors="replace")[:64].strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
