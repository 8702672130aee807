"""A command running on another host, and reading its channel against a deadline.

`SSHPool.start` runs `start_command`'s shell line in a channel that stays open while the command runs; the
line prints the command's pid (marked, as login scripts may print too) before it execs. `read_pid` reads that
mark; `RemoteProcess` then follows the command through its channel: the channel's exit status is the
command's own. `collect` reads a short command's output to its end. Package-internal: `ssh/__init__` exports
only `RemoteProcess`.
"""
from __future__ import annotations

import re
import select
import shlex
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any  # paramiko has no type information: its channels are Any

if TYPE_CHECKING:  # pragma: no cover
    from .pool import SSHPool

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PID_MARK = b"autotune-pid:"


def signal_name(sig: int | str) -> str:
    """'TERM' for signal.SIGTERM, 15, 'TERM' or 'SIGTERM' (the form `kill -NAME` takes)."""
    if isinstance(sig, str):
        name = sig.upper().removeprefix("SIG")
        signal.Signals["SIG" + name]  # KeyError on a name that is no signal
        return name
    return signal.Signals(sig).name.removeprefix("SIG")


def start_command(argv: Sequence[str], env: Mapping[str, str], cwd: str, stdout_path: str,
                  stderr_path: str) -> str:
    """The remote shell line behind `SSHPool.start` (every piece quoted).

    The login shell changes directory, exports the environment and runs `setsid`, which puts the command in a
    new session (so a new process group, whose id is its pid). Inside it a POSIX sh prints its own pid (the
    pid the command keeps across `exec`; marked, as login scripts may print too), creates the log directories
    and execs the command with its output in the log files. The trailing `; exit $?` keeps the login shell
    from exec'ing setsid itself, so setsid is never a group leader and never forks (`-w` covers a shell that
    forks anyway); the channel's exit status is then the command's own (128+N when signal N ended it).
    """
    if not argv:
        raise ValueError("empty argv")
    for name in env:
        if not _ENV_NAME.match(name):
            raise ValueError(f"invalid environment variable name {name!r}")
    inner = ('o=$1; e=$2; shift 2; mkdir -p -- "$(dirname -- "$o")" "$(dirname -- "$e")" || exit 125; '
             f'echo {_PID_MARK.decode()}$$; exec "$@" >"$o" 2>"$e" </dev/null')
    parts = [f"cd -- {shlex.quote(cwd)}"]
    if env:
        parts.append("export " + " ".join(f"{k}={shlex.quote(str(v))}" for k, v in env.items()))
    run = " ".join(shlex.quote(a) for a in ["setsid", "-w", "sh", "-c", inner, "sh", stdout_path, stderr_path,
                                              *argv])
    parts.append(run)
    return " && ".join(parts) + "; exit $?"


class RemoteProcess:
    """A command started by `SSHPool.start`, running in its own session on `host`; `pid` is also its pgid."""

    def __init__(self, pool: SSHPool, host: str, pid: int, argv: list[str], channel: Any,
                 release: Callable[[], None]):
        self.pool = pool
        self.host = host
        self.pid = pid
        self.argv = argv
        self.returncode: int | None = None
        self.lost = False
        self._chan = channel
        self._release = Once(release)
        self._done = threading.Lock()

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until the remote command ends; its exit status (128+N if signal N ended it), or None if the
        connection to the host was lost first (the command may or may not still run there: it is not known).
        Raises TimeoutError if `timeout` seconds pass first."""
        if not self._chan.status_event.wait(timeout):
            raise TimeoutError(f"{self.host}: pid {self.pid} still running after {timeout:g}s")
        with self._done:
            if self.returncode is None and not self.lost:
                if got_status(self._chan):
                    self.returncode = self._chan.exit_status
                else:
                    self.lost = True
                    self.pool.forget_if_dead(self.host, self._chan.get_transport())
                self._finish()
        return self.returncode

    def poll(self) -> int | None:
        """The exit status if the command has ended, else None (see `lost` to tell a lost connection)."""
        if self._chan.status_event.is_set():
            return self.wait()
        return None

    def signal(self, sig: int | str = signal.SIGTERM) -> bool:
        """Send `sig` to the remote process group; False if it is gone. Raises HostDown if the host is."""
        return self.pool.signal_group(self.host, self.pid, sig)

    def close(self) -> None:
        """Stop following the process (it keeps running) and give its channel back to the pool: a follower
        that gives up before the end (an adopted attempt whose clean-up failed) must not hold a channel."""
        with self._done:
            self._finish()

    def _finish(self) -> None:
        try:
            self._chan.close()
        finally:
            self._release()

    def __repr__(self) -> str:
        state = "lost" if self.lost else ("running" if self.returncode is None else f"exit {self.returncode}")
        return f"RemoteProcess({self.host} pid {self.pid} {state})"


# --- reading a channel against a deadline ----------------------------------------------------------------------

class Expired(Exception):
    """The deadline passed while reading a channel."""


class Once:
    """Calls `fn` the first time it is called, never again (a channel's slot is given back once)."""

    def __init__(self, fn: Callable[[], None]):
        self._fn = fn
        self._lock = threading.Lock()
        self._done = False

    def __call__(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        self._fn()


def remaining(deadline: float | None) -> float | None:
    """Seconds left until `deadline` (a time.monotonic() value; None: no limit); Expired when none are."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise Expired()
    return left


def _wait_readable(chan: Any, deadline: float | None) -> None:
    left = remaining(deadline)
    ready, _, _ = select.select([chan], [], [], left)
    if not ready and deadline is not None and time.monotonic() >= deadline:
        raise Expired()


def _drain(chan: Any, out: bytearray, err: bytearray) -> None:
    while chan.recv_ready():
        out += chan.recv(65536)
    while chan.recv_stderr_ready():
        err += chan.recv_stderr(65536)


def collect(chan: Any, deadline: float | None) -> tuple[bytes, bytes]:
    """Everything the command writes until it ends, both streams read as they come (no window stalls)."""
    out, err = bytearray(), bytearray()
    while True:
        _drain(chan, out, err)
        if chan.eof_received or chan.closed:
            break
        _wait_readable(chan, deadline)
    # Any stderr sent before EOF is buffered by now; the exit status follows EOF.
    _drain(chan, out, err)
    left = remaining(deadline)
    if not chan.status_event.wait(left):
        raise Expired()
    _drain(chan, out, err)
    return bytes(out), bytes(err)


def read_pid(chan: Any, deadline: float | None) -> tuple[int | None, bytes]:
    """The pid from the mark `start_command` prints, or None if the output ended without one; and the rest
    of what came (stdout lines before it, stderr), for the error message."""
    buf, err = bytearray(), bytearray()
    while True:
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        if chan.recv_ready():
            buf += chan.recv(1)  # byte by byte: nothing after the pid line is consumed
            if buf.endswith(b"\n"):
                line = bytes(buf).strip()
                if line.startswith(_PID_MARK) and line[len(_PID_MARK):].isdigit():
                    return int(line[len(_PID_MARK):]), bytes(err)
                err += buf
                buf.clear()
            continue
        if chan.eof_received or chan.closed:
            return None, bytes(err + buf)
        _wait_readable(chan, deadline)


def got_status(chan: Any) -> bool:
    """True if the server sent an exit status: the channel ended because the command did, not the connection.

    paramiko sets exit_status only from an `exit-status` message and leaves it at -1 otherwise; a wire status
    is an unsigned 32-bit number, never -1.
    """
    return bool(chan.exit_status != -1)
