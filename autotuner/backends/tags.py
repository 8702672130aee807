"""Finding and ending an experiment's processes by the tag in their environment.

Every process an experiment starts inherits `AUTOTUNE_TAG=<tag>`; the tag is unique to one attempt of one
experiment of one sweep. Matching the exact `NAME=value` entry of /proc/PID/environ finds those processes and
nothing else, unlike `pkill -f <name>`, which hits anything whose command line happens to match.
The same check runs remotely as a shell snippet (`find_command`), so local and remote clean-up agree.
"""
from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
from pathlib import Path

TAG_ENV = "AUTOTUNE_TAG"
_SAFE_TAG = re.compile(r"^[A-Za-z0-9._:/@+-]+$")


def check_tag(tag: str) -> str:
    """A tag is matched literally and goes into shell snippets: keep it to a plain alphabet."""
    if not _SAFE_TAG.match(tag):
        raise ValueError(f"unsafe tag {tag!r}")
    return tag


def find_tagged(tag: str, proc: Path = Path("/proc")) -> list[int]:
    """PIDs of live processes on this machine whose environment carries exactly this tag.

    Runs after every attempt, so it reads each environ with plain os calls and splits only the few that
    contain the tag's bytes at all.
    """
    needle = f"{TAG_ENV}={check_tag(tag)}".encode()
    me = str(os.getpid())
    found = []
    proc_fd = os.open(proc, os.O_RDONLY | os.O_DIRECTORY)
    try:  # each environ opened relative to /proc's descriptor: no path built and resolved per process
        for name in os.listdir(proc_fd):
            if not name.isdigit() or name == me:
                continue
            environ = _read(f"{name}/environ", proc_fd)
            if needle in environ and needle in environ.split(b"\0"):
                found.append(int(name))
    finally:
        os.close(proc_fd)
    return sorted(found)


def carries(pid: int, tag: str, proc: Path = Path("/proc")) -> bool:
    """Whether process `pid` is alive here and carries exactly this tag."""
    needle = f"{TAG_ENV}={check_tag(tag)}".encode()
    return needle in _read(os.path.join(proc, str(pid), "environ")).split(b"\0")


def tag_of(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The tag process `pid` carries, if it is alive here and carries one (what a GPU's process list is matched
    against: NVML names processes by pid only)."""
    prefix = f"{TAG_ENV}=".encode()
    for entry in _read(os.path.join(proc, str(pid), "environ")).split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix):].decode("utf-8", "replace")
    return None


_CHUNK = 1 << 16


def _read(path: str, dir_fd: int | None = None) -> bytes:
    """The whole file, or b"" when it is gone or not ours to read. A /proc file gives all it has in one read,
    so a short read is its end (no second read per process to find it)."""
    try:
        fd = os.open(path, os.O_RDONLY, dir_fd=dir_fd)
    except OSError:
        return b""
    chunks = []
    try:
        while chunk := os.read(fd, _CHUNK):
            chunks.append(chunk)
            if len(chunk) < _CHUNK:
                break
    except OSError:
        return b""
    finally:
        os.close(fd)
    return b"".join(chunks)


def signal_tagged(tag: str, sig: int = signal.SIGKILL) -> list[int]:
    """Send `sig` to every process carrying the tag; returns the PIDs signalled."""
    pids = find_tagged(tag)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    return pids


def find_command(tag: str) -> str:
    """A POSIX shell command that prints the PIDs carrying `tag`, one per line, on any Linux host."""
    needle = shlex.quote(f"{TAG_ENV}={check_tag(tag)}")
    return (
        "for e in /proc/[0-9]*/environ; do "
        f"grep -qxzF -e {needle} \"$e\" 2>/dev/null && p=${{e#/proc/}} && echo ${{p%/environ}}; "
        "done; true"
    )


def carries_command(pid: int, tag: str) -> str:
    """A POSIX shell command that succeeds if process `pid` is alive and carries `tag`, on any Linux host."""
    return f"grep -qxzF -e {shlex.quote(f'{TAG_ENV}={check_tag(tag)}')} /proc/{int(pid)}/environ 2>/dev/null"


def kill_command(tag: str, sig: str = "KILL") -> str:
    """A POSIX shell command that sends `sig` to every process carrying `tag` and prints their PIDs."""
    return f"for p in $({find_command(tag)}); do [ \"$p\" != $$ ] && kill -{sig} $p 2>/dev/null && echo $p; done; true"
