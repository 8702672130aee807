"""SSH to the hosts of a sweep: one pooled connection per host, fabric on paramiko.

`SSHPool` holds one fabric `Connection` per host, opened on first use and shared by every command to that host;
a connection found dropped is re-opened once on the next use. Channels per host are bounded (sshd refuses
sessions beyond its `MaxSessions`, 10 by default). `~/.ssh/config` (or the given ssh config file) is honoured
through fabric: HostName, User, Port, IdentityFile, ProxyJump, ConnectTimeout, UserKnownHostsFile.

Host keys are checked against known_hosts as OpenSSH does, on every ProxyJump hop too (see hostkeys).

Every failure that comes from a host being unreachable (refused, timed out, connection lost, authentication,
host key) raises `HostDown`, so that callers have one thing to catch to mark a host down. A remote command
that runs and fails is not such a failure: it is a `CommandResult` with its exit code.

fabric and paramiko are imported on first use, not with this module (they take ~0.3 s to import).
"""
from __future__ import annotations

import logging
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any  # fabric and paramiko have no type information: their objects are Any

from ...errors import UserError
from .errors import CommandTimeout, HostDown, HostKeyError, RemoteStartError, describe
from .hostkeys import check_host_keys, fingerprint
from .process import Expired, RemoteProcess, collect, got_status, read_pid, remaining, signal_name, start_command

if TYPE_CHECKING:  # pragma: no cover
    from fabric import Connection

log = logging.getLogger(__name__)

DEFAULT_MAX_CHANNELS = 8
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_KEEPALIVE = 15


# --- results --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CommandResult:
    """What a short remote command gave back."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


# --- channel accounting --------------------------------------------------------------------------------------

class _Gate:
    """Bounds the channels open at once on one connection.

    At most `limit` channels are open, with one exception: when all of them are taken, a control command
    (a probe, a clean-up, a transfer) may still use `reserve` channels beyond, so that ending experiments never
    waits for experiments to end. With the defaults (8 + 1, plus an idle SFTP session) we stay within sshd's
    default MaxSessions of 10.
    """

    def __init__(self, limit: int, reserve: int = 1):
        if limit < 1:
            raise ValueError("max_channels must be at least 1")
        self.limit = limit
        self.reserve = reserve
        self.in_use = 0
        self.control = 0
        self.peak = 0
        self._cv = threading.Condition()

    def _admits(self, control: bool) -> bool:
        if self.in_use < self.limit:
            return True
        return control and self.control < self.reserve and self.in_use < self.limit + self.reserve

    def acquire(self, control: bool, timeout: float | None = None) -> bool:
        with self._cv:
            if not self._cv.wait_for(lambda: self._admits(control), timeout):
                return False
            self.in_use += 1
            self.control += control
            self.peak = max(self.peak, self.in_use)
            return True

    def release(self, control: bool) -> None:
        with self._cv:
            self.in_use -= 1
            self.control -= control
            self._cv.notify_all()


class _Host:
    """Per-host state of the pool."""

    def __init__(self, max_channels: int):
        self.lock = threading.Lock()  # guards conn replacement
        self.conn: Connection | None = None
        self.connects = 0
        self.gate = _Gate(max_channels)


# --- the pool -------------------------------------------------------------------------------------------------

class SSHPool:
    """One pooled SSH connection per host, with bounded channels; thread-safe.

    `ssh_config_path`: an ssh config file used *instead of* ~/.ssh/config and /etc/ssh/ssh_config (as `ssh -F`).
    `accept_new_hosts`: trust and record host keys not yet in known_hosts (keys that changed are still refused).
    `known_hosts`: the user known_hosts file to read and to record new keys in, instead of the ssh config's
    UserKnownHostsFile (default ~/.ssh/known_hosts).
    `max_channels`: channels open at once per host (see `_Gate`); keep it below sshd's MaxSessions.
    """

    def __init__(self, ssh_config_path: str | os.PathLike | None = None, *, accept_new_hosts: bool = False,
                 known_hosts: str | os.PathLike | None = None, max_channels: int = DEFAULT_MAX_CHANNELS,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT, keepalive: int = DEFAULT_KEEPALIVE,
                 user: str | None = None):
        self.ssh_config_path = str(ssh_config_path) if ssh_config_path is not None else None
        self.accept_new_hosts = accept_new_hosts
        self.known_hosts = str(known_hosts) if known_hosts is not None else None
        self.max_channels = max_channels
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self.user = user
        self._hosts: dict[str, _Host] = {}
        self._lock = threading.Lock()
        self._config: Any = None
        _Gate(max_channels)  # validate now, not on first use

    # --- lifecycle ---------------------------------------------------------------------------------------------
    def __enter__(self) -> SSHPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every connection (running remote processes lose their channel; they are not killed)."""
        with self._lock:
            hosts = list(self._hosts.values())
        for entry in hosts:
            with entry.lock:
                self._discard(entry)

    def connect_count(self, host: str) -> int:
        """How many times a connection to `host` was opened (1 while the pooled one lives)."""
        return self._entry(host).connects

    def peak_channels(self, host: str) -> int:
        """The most channels that were open at once to `host`."""
        return self._entry(host).gate.peak

    # --- connections -------------------------------------------------------------------------------------------
    def _entry(self, host: str) -> _Host:
        with self._lock:
            entry = self._hosts.get(host)
            if entry is None:
                entry = self._hosts[host] = _Host(self.max_channels)
            return entry

    def _fabric_config(self) -> Any:
        with self._lock:
            if self._config is None:
                from fabric import Config

                try:
                    if self.ssh_config_path is not None:
                        self._config = Config(runtime_ssh_path=self.ssh_config_path)
                    else:
                        self._config = Config()
                except FileNotFoundError as e:
                    raise UserError("ssh config file not found", path=e.filename or self.ssh_config_path) from e
                except Exception as e:  # paramiko's ConfigParseError and friends
                    raise UserError(f"cannot read ssh config: {e}", path=self.ssh_config_path) from e
            return self._config

    def _open(self, host: str, timeout: float | None) -> Connection:
        import paramiko
        from fabric import Connection

        config = self._fabric_config()
        wait = timeout if timeout is not None else self.connect_timeout
        try:
            conn = Connection(host, config=config, user=self.user,
                              connect_kwargs=dict(config.connect_kwargs, banner_timeout=wait, auth_timeout=wait))
        except Exception as e:  # e.g. a malformed user@host:port
            raise HostDown(host, f"invalid host: {e}") from e
        if timeout is not None or conn.connect_timeout is None:
            conn.connect_timeout = max(1, math.ceil(wait))
        if str(conn.ssh_config.get("identitiesonly", "no")).lower() == "yes" and conn.ssh_config.get("identityfile"):
            # As OpenSSH: only the configured keys, not every key in ~/.ssh or the agent (MaxAuthTries).
            conn.connect_kwargs.update(look_for_keys=False, allow_agent=False)
        check_host_keys(conn, host, self.known_hosts, self.accept_new_hosts)
        try:
            conn.open()
        except HostDown:
            conn.close()
            raise
        except paramiko.BadHostKeyException as e:
            conn.close()
            raise HostKeyError(host, f"host key {fingerprint(e.key)} does not match known_hosts; if it changed "
                                     f"on purpose, remove the old entry (ssh-keygen -R {conn.host})") from e
        except paramiko.AuthenticationException as e:
            conn.close()
            raise HostDown(host, f"authentication failed for {conn.user}@{conn.host}: {e}") from e
        except paramiko.ssh_exception.NoValidConnectionsError as e:
            conn.close()
            raise HostDown(host, f"connection refused ({conn.host} port {conn.port})") from e
        except TimeoutError as e:
            conn.close()
            raise HostDown(host, f"connection timed out ({conn.host} port {conn.port})") from e
        except socket.gaierror as e:
            conn.close()
            raise HostDown(host, f"cannot resolve {conn.host}: {e.strerror}") from e
        except (paramiko.SSHException, EOFError, OSError) as e:
            conn.close()
            raise HostDown(host, describe(e)) from e
        transport = conn.transport
        if self.keepalive:
            transport.set_keepalive(self.keepalive)
            _tcp_keepalive(transport.sock, self.keepalive)
        return conn

    def _discard(self, entry: _Host) -> None:
        """Drop a host's connection (caller holds entry.lock)."""
        if entry.conn is not None:
            try:
                entry.conn.close()
            except Exception as e:  # closing what is already broken
                log.debug("closing the connection to %s: %s", entry.conn.original_host, e)
        entry.conn = None

    def connection(self, host: str, timeout: float | None = None) -> Any:
        """The pooled fabric Connection to `host`, opened (or re-opened once, if it dropped) as needed."""
        entry = self._entry(host)
        with entry.lock:
            if entry.conn is not None and entry.conn.is_connected:
                return entry.conn
            if entry.conn is not None:
                self._discard(entry)
            entry.conn = self._open(host, timeout)
            entry.connects += 1
            return entry.conn

    def forget_if_dead(self, host: str, transport: Any) -> bool:
        """Discard the host's connection if it is the one on `transport` and that died; True if it died."""
        if transport is not None and transport.is_active():
            return False
        entry = self._entry(host)
        with entry.lock:
            if entry.conn is not None and entry.conn.transport is transport:
                self._discard(entry)
        return True

    def _session(self, host: str, timeout: float | None) -> Any:
        """A new session channel on the pooled connection; one fresh connection is tried if it was dead."""
        import paramiko

        for attempt in (1, 2):
            conn = self.connection(host, timeout)
            try:
                return conn.transport.open_session(timeout=timeout)
            except (paramiko.SSHException, EOFError, OSError) as e:
                if self.forget_if_dead(host, conn.transport) and attempt == 1:
                    continue
                raise HostDown(host, f"cannot open a channel: {describe(e)}") from e
        raise AssertionError("unreachable")

    # --- short commands ----------------------------------------------------------------------------------------
    def run(self, host: str, command: str, timeout: float | None = None) -> CommandResult:
        """Run a short shell command on `host` and return its exit code and output.

        `command` is a shell line for the login shell: quote what goes into it (shlex.quote). Raises HostDown
        when the host cannot be reached or the connection is lost, CommandTimeout (a HostDown) after `timeout`
        seconds, which also covers connecting.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        entry = self._entry(host)
        if not entry.gate.acquire(control=True, timeout=timeout):
            raise CommandTimeout(host, f"no free channel within {timeout:g}s")
        try:
            chan = self._session(host, remaining(deadline))
            try:
                return self._exec(host, chan, command, deadline)
            finally:
                chan.close()
        except Expired:
            raise CommandTimeout(host, f"command timed out after {timeout:g}s") from None
        finally:
            entry.gate.release(control=True)

    def _exec(self, host: str, chan: Any, command: str, deadline: float | None) -> CommandResult:
        import paramiko

        try:
            chan.exec_command(command)
            out, err = collect(chan, deadline)
        except (paramiko.SSHException, EOFError, OSError) as e:
            self.forget_if_dead(host, chan.get_transport())
            raise HostDown(host, f"connection lost: {describe(e)}") from e
        if not got_status(chan):
            raise HostDown(host, "connection lost while the command ran")
        return CommandResult(chan.exit_status, out.decode(errors="replace"), err.decode(errors="replace"))

    @contextmanager
    def control(self, host: str) -> Iterator[None]:
        """Hold one of the host's control channels (see `_Gate`) while the block runs: a channel opened by
        something other than `run`, such as an SFTP session, counts against the same bound."""
        entry = self._entry(host)
        entry.gate.acquire(control=True)
        try:
            yield
        finally:
            entry.gate.release(control=True)

    def is_up(self, host: str, timeout: float = 5.0) -> bool:
        """True if `host` answers a trivial command within `timeout` seconds (connecting included)."""
        try:
            return self.run(host, "true", timeout=timeout).ok
        except HostDown:
            return False

    # --- long processes ----------------------------------------------------------------------------------------
    def start(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str = ".",
              stdout_path: str = "/dev/null", stderr_path: str = "/dev/null",
              timeout: float | None = None) -> RemoteProcess:
        """Start `argv` on `host` in a session (process group) of its own and return once its pid is known.

        `env` is exported for it, `cwd` is its working directory (relative: to the login directory), its output
        goes to the remote files (their directories are created). The channel stays open while it runs:
        `RemoteProcess.wait()` returns its exit status. Blocks while `max_channels` channels to the host are
        open. `timeout` bounds connecting and the start itself. Raises HostDown, or RemoteStartError when the
        host answered but the command could not be started.
        """
        import paramiko

        line = start_command(argv, env or {}, cwd, stdout_path, stderr_path)
        deadline = None if timeout is None else time.monotonic() + timeout
        entry = self._entry(host)
        entry.gate.acquire(control=False)
        try:
            try:
                chan = self._session(host, remaining(deadline))
            except Expired:
                raise CommandTimeout(host, f"start timed out after {timeout:g}s") from None
            try:
                chan.exec_command(line)
                pid, early_err = read_pid(chan, deadline)
            except Expired:
                chan.close()
                raise CommandTimeout(host, f"start timed out after {timeout:g}s") from None
            except (paramiko.SSHException, EOFError, OSError) as e:
                chan.close()
                self.forget_if_dead(host, chan.get_transport())
                raise HostDown(host, f"connection lost: {describe(e)}") from e
            if pid is None:
                try:
                    out, err = collect(chan, time.monotonic() + 5)
                except Expired:
                    out, err = b"", b""
                chan.close()
                if not got_status(chan):
                    raise HostDown(host, "connection lost while starting the command")
                raise RemoteStartError(host, chan.exit_status, (early_err + out + err).decode(errors="replace"))
        except BaseException:
            entry.gate.release(control=False)
            raise
        return RemoteProcess(self, host, pid, list(argv), chan, lambda: entry.gate.release(control=False))

    def signal_group(self, host: str, pgid: int, sig: int | str = signal.SIGTERM,
                     timeout: float | None = 30.0) -> bool:
        """Send `sig` to the remote process group `pgid`; False if no such group is left."""
        # `kill -SIG -N` (no `--`): dash's builtin rejects `--` and reads `-s SIG -N` as an option.
        return self.run(host, f"kill -{signal_name(sig)} -{int(pgid)} 2>/dev/null", timeout).ok


# --- helpers --------------------------------------------------------------------------------------------------

def _tcp_keepalive(sock: object, seconds: int) -> None:
    """Let the kernel notice a silently vanished peer in about 5 x seconds (paramiko's keepalive alone only
    writes; with no TCP keepalive a dead link takes the retransmission timeout, many minutes)."""
    if not isinstance(sock, socket.socket):
        return  # a ProxyJump channel or a ProxyCommand pipe
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_KEEPIDLE"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, seconds)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, seconds)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 4)
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 4 * seconds * 1000)
    except OSError:
        pass
