"""Atomic file writes: a reader, or a runner killed mid-write, sees the old file or the new one, never half.

Results are shared: a colleague reading the sweep's directory must be able to read the best config, so files
are created the way `open()` would create them (0666 less the umask), not 0600 as `mkstemp` makes them.
"""
from __future__ import annotations

import json
import os
import secrets
from pathlib import Path


def write_atomic(path: str | Path, data: str | bytes, *, sync_dir: bool = True) -> None:
    """Write `data` to a temp file beside `path`, fsync it, rename it over `path`, fsync the directory
    (`sync_dir=False`: the caller syncs it once after several files, see `sync_directory`)."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)  # the umask applies
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync_dir:
        sync_directory(path.parent)


def write_json_atomic(path: str | Path, data: object, *, sync_dir: bool = True) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n", sync_dir=sync_dir)


def sync_directory(directory: str | Path) -> None:
    """Make a rename or a new entry in `directory` durable (a crash after it cannot undo it)."""
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
