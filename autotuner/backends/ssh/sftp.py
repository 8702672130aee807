"""Files from other hosts: whether a host sees our filesystem, and copying its files here over SFTP.

A host that shares our filesystem (NFS) under the same path needs no copy at all; any other host's files come
over one SFTP session per host, opened on the host's pooled connection and counted as one of its control
channels (see `SSHPool.control`), so copying never waits for experiments to end.
"""
from __future__ import annotations

import logging
import os
import shlex
import stat
import threading
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar  # paramiko and fabric have no type information: their objects are Any

from .errors import HostDown, describe
from .pool import SSHPool

log = logging.getLogger(__name__)
T = TypeVar("T")


class _Session:
    """One host's SFTP session and the connection it was opened on (a new connection needs a new session)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # one SFTP request at a time on the session
        self.client: Any = None
        self.conn: Any = None


class RemoteFiles:
    """Copies files from the hosts of `pool` here; thread-safe. `close()` ends the SFTP sessions."""

    def __init__(self, pool: SSHPool):
        self.pool = pool
        self._sessions: dict[str, _Session] = {}
        self._shared: dict[tuple[str, str], bool] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            with session.lock:
                _close(session)

    def shares_filesystem(self, host: str, path: str | os.PathLike, timeout: float | None = 30.0) -> bool:
        """True if `host` sees this machine's directory `path` (e.g. over NFS) under the same name.

        Decided once per host and directory by writing a marker file with a random token here and reading it
        there. A host that does not see it yet (an NFS cache) is taken as not sharing, which is merely slower.
        """
        directory = os.path.realpath(path)
        key = (host, directory)
        if key in self._shared:
            return self._shared[key]
        token = uuid.uuid4().hex
        marker = Path(directory) / f".autotune-fs-{token}"
        marker.write_text(token)
        try:
            result = self.pool.run(host, f"cat -- {shlex.quote(str(marker))} 2>/dev/null", timeout)
        finally:
            marker.unlink(missing_ok=True)
        shared = result.ok and result.stdout.strip() == token
        self._shared[key] = shared
        return shared

    def get(self, host: str, remote_path: str, local_path: str | os.PathLike) -> bool:
        """Copy a remote file here; False (nothing copied) when it is already here because `host` shares our
        filesystem and both paths are the same. The local file appears whole or not at all."""
        local = Path(local_path)
        if os.path.abspath(remote_path) == os.path.abspath(local) and local.parent.is_dir() \
                and self.shares_filesystem(host, local.parent):
            return False
        local.parent.mkdir(parents=True, exist_ok=True)
        self._copy(host, remote_path, local, local.with_name(local.name + f".part-{uuid.uuid4().hex[:8]}"))
        return True

    def get_dir(self, host: str, remote_dir: str, local_dir: str | os.PathLike) -> int:
        """Copy a remote directory tree here (see `get`); returns the number of files copied."""
        local = Path(local_dir)
        if os.path.abspath(remote_dir) == os.path.abspath(local) and local.is_dir() \
                and self.shares_filesystem(host, local):
            return 0
        copied = 0
        todo = [(remote_dir.rstrip("/") or "/", local)]
        while todo:
            rdir, ldir = todo.pop()
            ldir.mkdir(parents=True, exist_ok=True)
            for attr in self._call(host, partial(_listdir, rdir)):
                rpath = f"{rdir}/{attr.filename}"
                if stat.S_ISDIR(attr.st_mode or 0):
                    todo.append((rpath, ldir / attr.filename))
                elif stat.S_ISREG(attr.st_mode or 0):
                    part = ldir / f".{attr.filename}.part-{uuid.uuid4().hex[:8]}"
                    self._copy(host, rpath, ldir / attr.filename, part)
                    copied += 1
        return copied

    def _copy(self, host: str, remote_path: str, local: Path, part: Path) -> None:
        """Fetch into `part`, then rename it to `local`: a reader never sees half a file."""
        try:
            self._call(host, lambda sftp: sftp.get(remote_path, str(part)))
            os.replace(part, local)
        finally:
            part.unlink(missing_ok=True)

    def _session(self, host: str) -> _Session:
        with self._lock:
            return self._sessions.setdefault(host, _Session())

    def _call(self, host: str, fn: Callable[[Any], T]) -> T:
        """fn(sftp) on the host's one SFTP session (serialised), mapping connection failures to HostDown."""
        import paramiko

        session = self._session(host)
        with self.pool.control(host), session.lock:
            for attempt in (1, 2):
                try:
                    return fn(self._client(host, session))
                except (paramiko.SSHException, EOFError, OSError) as e:
                    if isinstance(e, OSError) and getattr(e, "errno", None) is not None:
                        raise  # the server answered: no such file, permission denied, ...
                    conn = session.conn
                    if conn is not None and self.pool.forget_if_dead(host, conn.transport) and attempt == 1:
                        continue
                    raise HostDown(host, f"sftp: {describe(e)}") from e
        raise AssertionError("unreachable")

    def _client(self, host: str, session: _Session) -> Any:
        """The session's SFTP client, opened anew when the pooled connection was (caller holds session.lock)."""
        conn = self.pool.connection(host)
        if session.client is None or session.conn is not conn:
            _close(session)
            session.client = conn.client.open_sftp()
            session.conn = conn
        return session.client


def _listdir(path: str, sftp: Any) -> list[Any]:
    return list(sftp.listdir_attr(path))


def _close(session: _Session) -> None:
    if session.client is not None:
        try:
            session.client.close()
        except Exception as e:  # its connection is gone already
            log.debug("closing an SFTP session: %s", e)
    session.client = session.conn = None
