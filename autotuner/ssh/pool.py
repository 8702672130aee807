"""SSH to the hosts of a sweep: one pooled connection per host, fabric on paramiko.

`SSHPool` holds one fabric `Connection` per host, opened on first use and shared by every command to that host;
a connection found dropped is re-opened once on the next use. Channels per host are bounded (sshd refuses
sessions beyond its `MaxSessions`, 10 by default). `~/.ssh/config` (or the given ssh config file) is honoured
through fabric: HostName, User, Port, IdentityFile, ProxyJump, ConnectTimeout, UserKnownHostsFile.

Host keys are checked against known_hosts as OpenSSH does. Fabric's own default is to trust any key it has
not seen (paramiko's AutoAddPolicy, and no known_hosts loaded at all), on every hop of a ProxyJump too: the
pool replaces that policy on each connection it opens. An unknown key is refused with `HostKeyError` unless
the user opted in (`accept_new_hosts=True`, or `StrictHostKeyChecking accept-new` in the ssh config), in which
case it is appended to the user's known_hosts file. A key that differs from the known one is always refused.

Every failure that comes from a host being unreachable (refused, timed out, connection lost, authentication,
host key) raises `HostDown`, so that callers have one thing to catch to mark a host down. A remote command
that runs and fails is not such a failure: it is a `Result` with its exit code.

fabric and paramiko are imported on first use, not with this module (they take ~0.3 s to import).
"""
from __future__ import annotations

import math
import os
import re
import select
import shlex
import signal as _signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from . import tags
from .errors import UserError

if TYPE_CHECKING:  # pragma: no cover
    from fabric import Connection

DEFAULT_MAX_CHANNELS = 8
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_KEEPALIVE = 15
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PID_MARK = b"autotune-pid:"


# --- errors and results --------------------------------------------------------------------------------------

class HostDown(Exception):
    """A host could not be reached or used over SSH. `reason` says why, in a few words."""

    def __init__(self, host: str, reason: str):
        super().__init__(host, reason)
        self.host = host
        self.reason = reason

    def __str__(self) -> str:
        return f"host {self.host}: {self.reason}"


class HostKeyError(HostDown):
    """The host's key is not in known_hosts (and the user did not opt in), or differs from the known one."""


class CommandTimeout(HostDown):
    """A short command did not finish within its timeout: the host is not answering in time."""


class RemoteStartError(RuntimeError):
    """A remote process could not be started (missing working directory, unwritable log directory, ...)."""

    def __init__(self, host: str, exit_code: int | None, stderr: str):
        super().__init__(host, exit_code, stderr)
        self.host = host
        self.exit_code = exit_code
        self.stderr = stderr

    def __str__(self) -> str:
        detail = self.stderr.strip().splitlines()[-1] if self.stderr.strip() else "no output"
        return f"host {self.host}: could not start the command (exit {self.exit_code}): {detail}"


@dataclass(frozen=True)
class Result:
    """What a short remote command gave back."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def signal_name(sig: int | str) -> str:
    """'TERM' for signal.SIGTERM, 15, 'TERM' or 'SIGTERM' (the form `kill -NAME` takes)."""
    if isinstance(sig, str):
        name = sig.upper().removeprefix("SIG")
        _signal.Signals["SIG" + name]  # KeyError on a name that is no signal
        return name
    return _signal.Signals(sig).name.removeprefix("SIG")


def start_command(argv: Sequence[str], env: Mapping[str, str], cwd: str, stdout_path: str,
                  stderr_path: str) -> str:
    """The remote shell line behind `SSHPool.start` (every piece quoted; exposed for tests and debugging).

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
        self.lock = threading.Lock()  # guards conn / sftp replacement
        self.conn: Connection | None = None
        self.connects = 0
        self.gate = _Gate(max_channels)
        self.sftp: Any = None
        self.sftp_conn: Any = None
        self.sftp_lock = threading.Lock()


# --- host keys ------------------------------------------------------------------------------------------------

def _paths(value: str | None, defaults: Sequence[str]) -> list[str]:
    if not value:
        return [os.path.expanduser(p) for p in defaults]
    return [os.path.expanduser(p) for p in value.split() if p.lower() != "none"]


class _KeyPolicy:
    """paramiko missing-host-key policy: refuse, or (opted in) append to the user's known_hosts and go on."""

    def __init__(self, alias: str, accept: bool, known_hosts_file: str | None, hash_names: bool):
        self.alias = alias
        self.accept = accept
        self.known_hosts_file = known_hosts_file
        self.hash_names = hash_names

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        if not self.accept:
            raise HostKeyError(self.alias, "unknown host key (not in known_hosts); pass --accept-new-hosts to "
                                           "trust it")
        from paramiko.hostkeys import HostKeys

        name = HostKeys.hash_host(hostname) if self.hash_names else hostname
        client.get_host_keys().add(hostname, key.get_name(), key)
        if self.known_hosts_file:
            path = Path(self.known_hosts_file)
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(path, "a") as f:
                f.write(f"{name} {key.get_name()} {key.get_base64()}\n")


def _fingerprint(key: Any) -> str:
    import base64
    import hashlib

    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"{key.get_name()} SHA256:{digest}"


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
        self._fs_cache: dict[tuple[str, str], bool] = {}
        _Gate(max_channels)  # validate now, not on first use

    # --- lifecycle ---------------------------------------------------------------------------------------------
    def __enter__(self) -> "SSHPool":
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

    def _secure(self, conn: Any, alias: str) -> None:
        """Check host keys on `conn` and on every ProxyJump hop before it, as OpenSSH would."""
        from fabric import Connection

        hop, name = conn, alias
        while isinstance(hop, Connection):
            cfg = hop.ssh_config
            if self.known_hosts is not None:
                user_files = [self.known_hosts]
            else:
                user_files = _paths(cfg.get("userknownhostsfile"), ["~/.ssh/known_hosts", "~/.ssh/known_hosts2"])
            global_files = _paths(cfg.get("globalknownhostsfile"),
                                  ["/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2"])
            for path in global_files + user_files:
                if os.path.isfile(path):
                    hop.client.load_system_host_keys(path)
            strict = str(cfg.get("stricthostkeychecking", "ask")).lower()
            accept = self.accept_new_hosts or strict in ("accept-new", "no", "off")
            hashed = str(cfg.get("hashknownhosts", "no")).lower() == "yes"
            hop.client.set_missing_host_key_policy(
                _KeyPolicy(name, accept, user_files[0] if user_files else None, hashed))
            hop = hop.gateway
            name = getattr(hop, "original_host", name)

    def _open(self, host: str, timeout: float | None) -> Any:
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
        self._secure(conn, host)
        try:
            conn.open()
        except HostDown:
            conn.close()
            raise
        except paramiko.BadHostKeyException as e:
            conn.close()
            raise HostKeyError(host, f"host key {_fingerprint(e.key)} does not match known_hosts; if it changed "
                                     f"on purpose, remove the old entry (ssh-keygen -R {conn.host})") from e
        except paramiko.AuthenticationException as e:
            conn.close()
            raise HostDown(host, f"authentication failed for {conn.user}@{conn.host}: {e}") from e
        except paramiko.ssh_exception.NoValidConnectionsError as e:
            conn.close()
            raise HostDown(host, f"connection refused ({conn.host} port {conn.port})") from e
        except (socket.timeout, TimeoutError) as e:
            conn.close()
            raise HostDown(host, f"connection timed out ({conn.host} port {conn.port})") from e
        except socket.gaierror as e:
            conn.close()
            raise HostDown(host, f"cannot resolve {conn.host}: {e.strerror}") from e
        except (paramiko.SSHException, EOFError, OSError) as e:
            conn.close()
            raise HostDown(host, _describe(e)) from e
        transport = conn.transport
        if self.keepalive:
            transport.set_keepalive(self.keepalive)
            _tcp_keepalive(transport.sock, self.keepalive)
        return conn

    def _discard(self, entry: _Host) -> None:
        """Drop a host's connection (caller holds entry.lock)."""
        for thing in (entry.sftp, entry.conn):
            if thing is not None:
                try:
                    thing.close()
                except Exception:
                    pass
        entry.sftp = entry.sftp_conn = entry.conn = None

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

    def _forget_if_dead(self, host: str, transport: Any) -> bool:
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
                if self._forget_if_dead(host, conn.transport) and attempt == 1:
                    continue
                raise HostDown(host, f"cannot open a channel: {_describe(e)}") from e
        raise AssertionError("unreachable")

    # --- short commands ----------------------------------------------------------------------------------------
    def run(self, host: str, command: str, timeout: float | None = None) -> Result:
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
            chan = self._session(host, _remaining(deadline))
            try:
                return self._exec(host, chan, command, deadline)
            finally:
                chan.close()
        except _Expired:
            raise CommandTimeout(host, f"command timed out after {timeout:g}s") from None
        finally:
            entry.gate.release(control=True)

    def _exec(self, host: str, chan: Any, command: str, deadline: float | None) -> Result:
        import paramiko

        try:
            chan.exec_command(command)
            out, err = _collect(chan, deadline)
        except (paramiko.SSHException, EOFError, OSError) as e:
            self._forget_if_dead(host, chan.get_transport())
            raise HostDown(host, f"connection lost: {_describe(e)}") from e
        if not _got_status(chan):
            raise HostDown(host, "connection lost while the command ran")
        return Result(chan.exit_status, out.decode(errors="replace"), err.decode(errors="replace"))

    def is_up(self, host: str, timeout: float = 5.0) -> bool:
        """True if `host` answers a trivial command within `timeout` seconds (connecting included)."""
        try:
            return self.run(host, "true", timeout=timeout).ok
        except HostDown:
            return False

    # --- long processes ----------------------------------------------------------------------------------------
    def start(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str = ".",
              stdout_path: str = "/dev/null", stderr_path: str = "/dev/null",
              timeout: float | None = None) -> "RemoteProcess":
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
        release = _Once(lambda: entry.gate.release(control=False))
        try:
            try:
                chan = self._session(host, _remaining(deadline))
            except _Expired:
                raise CommandTimeout(host, f"start timed out after {timeout:g}s") from None
            try:
                chan.exec_command(line)
                pid, early_err = _read_pid(chan, deadline)
            except _Expired:
                chan.close()
                raise CommandTimeout(host, f"start timed out after {timeout:g}s") from None
            except (paramiko.SSHException, EOFError, OSError) as e:
                chan.close()
                self._forget_if_dead(host, chan.get_transport())
                raise HostDown(host, f"connection lost: {_describe(e)}") from e
            if pid is None:
                try:
                    out, err = _collect(chan, time.monotonic() + 5)
                except _Expired:
                    out, err = b"", b""
                chan.close()
                if not _got_status(chan):
                    raise HostDown(host, "connection lost while starting the command")
                raise RemoteStartError(host, chan.exit_status, (early_err + out + err).decode(errors="replace"))
        except BaseException:
            release()
            raise
        return RemoteProcess(self, host, pid, list(argv), chan, release)

    def signal_group(self, host: str, pgid: int, sig: int | str = _signal.SIGTERM,
                     timeout: float | None = 30.0) -> bool:
        """Send `sig` to the remote process group `pgid`; False if no such group is left."""
        # `kill -SIG -N` (no `--`): dash's builtin rejects `--` and reads `-s SIG -N` as an option.
        return self.run(host, f"kill -{signal_name(sig)} -{int(pgid)} 2>/dev/null", timeout).ok

    # --- tagged processes --------------------------------------------------------------------------------------
    def find_tagged(self, host: str, tag: str, timeout: float | None = 30.0) -> list[int]:
        """PIDs on `host` whose environment carries AUTOTUNE_TAG=`tag`."""
        return _pids(self.run(host, tags.find_command(tag), timeout).stdout)

    def signal_tagged(self, host: str, tag: str, sig: int | str = _signal.SIGKILL,
                      timeout: float | None = 30.0) -> list[int]:
        """Send `sig` to every process on `host` carrying the tag; returns the PIDs signalled."""
        return _pids(self.run(host, tags.kill_command(tag, signal_name(sig)), timeout).stdout)

    def run_many(self, hosts: Iterable[str], command: str, timeout: float | None = None, *,
                 fanout: str = "pool") -> dict[str, Result | HostDown]:
        """Run `command` on every host at once; per host its Result, or the HostDown that stopped it.

        fanout="pool" uses the pooled connections (one thread per host); fanout="pdsh" runs one `pdsh -R ssh`
        (OpenSSH, the same ssh config and known_hosts), for many hosts without opening pooled connections.
        """
        hosts = list(dict.fromkeys(hosts))
        if fanout == "pdsh":
            return self.pdsh_run(hosts, command, timeout)
        if fanout != "pool":
            raise ValueError(f"fanout must be 'pool' or 'pdsh', not {fanout!r}")

        def one(host: str) -> Result | HostDown:
            try:
                return self.run(host, command, timeout)
            except HostDown as e:
                return e

        if not hosts:
            return {}
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(32, len(hosts)), thread_name_prefix="ssh-fanout") as pool:
            return dict(zip(hosts, pool.map(one, hosts)))

    def find_tagged_many(self, hosts: Iterable[str], tag: str, timeout: float | None = 30.0, *,
                         fanout: str = "pool") -> dict[str, list[int] | HostDown]:
        results = self.run_many(hosts, tags.find_command(tag), timeout, fanout=fanout)
        return {h: r if isinstance(r, HostDown) else _pids(r.stdout) for h, r in results.items()}

    def signal_tagged_many(self, hosts: Iterable[str], tag: str, sig: int | str = _signal.SIGKILL,
                           timeout: float | None = 30.0, *, fanout: str = "pool") -> dict[str, list[int] | HostDown]:
        results = self.run_many(hosts, tags.kill_command(tag, signal_name(sig)), timeout, fanout=fanout)
        return {h: r if isinstance(r, HostDown) else _pids(r.stdout) for h, r in results.items()}

    def pdsh_args(self) -> str:
        """The ssh options pdsh must append (PDSH_SSH_ARGS_APPEND) to reach hosts the way this pool does."""
        args = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, math.ceil(self.connect_timeout))}"]
        if self.ssh_config_path:
            args = ["-F", self.ssh_config_path] + args
        if self.known_hosts:
            args += ["-o", f"UserKnownHostsFile={self.known_hosts}"]
        if self.accept_new_hosts:
            args += ["-o", "StrictHostKeyChecking=accept-new"]
        if self.user:
            args += ["-l", self.user]
        return " ".join(shlex.quote(a) for a in args)

    def pdsh_run(self, hosts: Sequence[str], command: str,
                 timeout: float | None = None) -> dict[str, Result | HostDown]:
        """`run_many` through one pdsh process. Needs pdsh on this machine (not on the hosts)."""
        import shutil
        import subprocess
        import uuid

        pdsh = shutil.which("pdsh")
        if pdsh is None:
            raise RuntimeError("pdsh is not installed")
        hosts = list(dict.fromkeys(hosts))
        if not hosts:
            return {}
        for host in hosts:
            if not host or "," in host or host.startswith("-") or any(c.isspace() for c in host):
                raise ValueError(f"host name unusable with pdsh: {host!r}")
        # The exit status of each host comes back in its output: pdsh -S only gives the largest one.
        marker = f"__autotune_rc_{uuid.uuid4().hex[:12]}"
        remote = f"( {command}\n); echo {marker}=$?"
        argv = [pdsh, "-R", "ssh", "-S", "-f", str(min(64, len(hosts))), "-w", ",".join(hosts)]
        argv += ["-t", str(max(1, math.ceil(self.connect_timeout)))]
        if timeout is not None:
            argv += ["-u", str(max(1, math.ceil(timeout)))]
        env = dict(os.environ, PDSH_SSH_ARGS_APPEND=self.pdsh_args(), PDSH_RCMD_TYPE="ssh")
        proc = subprocess.run(argv + [remote], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, errors="replace",
                              timeout=None if timeout is None else timeout + self.connect_timeout + 10)
        out: dict[str, list[str]] = {h: [] for h in hosts}
        err: dict[str, list[str]] = {h: [] for h in hosts}
        notes: dict[str, list[str]] = {h: [] for h in hosts}
        codes: dict[str, int] = {}
        for line in proc.stdout.splitlines():
            host, sep, text = line.partition(": ")
            if host in out and sep:
                if text.startswith(marker + "="):
                    codes[host] = int(text.split("=", 1)[1])
                else:
                    out[host].append(text)
        for line in proc.stderr.splitlines():
            if line.startswith("pdsh@"):  # pdsh's own words: "pdsh@me: host: ssh exited with exit code 255"
                _, _, rest = line.partition(": ")
                host, _, text = rest.partition(": ")
                if host in notes:
                    notes[host].append(text)
                continue
            host, sep, text = line.partition(": ")
            if host in err and sep:
                err[host].append(text)
        results: dict[str, Result | HostDown] = {}
        for host in hosts:
            if host in codes:
                results[host] = Result(codes[host], _lines(out[host]), _lines(err[host]))
            else:
                why = (err[host] + notes[host]) or ["no answer"]
                results[host] = HostDown(host, "; ".join(why[-2:]))
        return results

    # --- files --------------------------------------------------------------------------------------------------
    def shares_filesystem(self, host: str, path: str | os.PathLike, timeout: float | None = 30.0) -> bool:
        """True if `host` sees this machine's directory `path` (e.g. over NFS) under the same name.

        Decided once per host and directory by writing a marker file with a random token here and reading it
        there. A host that does not see it yet (an NFS cache) is taken as not sharing, which is merely slower.
        """
        import uuid

        directory = os.path.realpath(path)
        key = (host, directory)
        if key in self._fs_cache:
            return self._fs_cache[key]
        token = uuid.uuid4().hex
        marker = Path(directory) / f".autotune-fs-{token}"
        marker.write_text(token)
        try:
            result = self.run(host, f"cat -- {shlex.quote(str(marker))} 2>/dev/null", timeout)
        finally:
            marker.unlink(missing_ok=True)
        shared = result.ok and result.stdout.strip() == token
        self._fs_cache[key] = shared
        return shared

    def _sftp(self, host: str, entry: _Host) -> Any:
        conn = self.connection(host)
        with entry.lock:
            if entry.sftp is None or entry.sftp_conn is not conn:
                if entry.sftp is not None:
                    try:
                        entry.sftp.close()
                    except Exception:
                        pass
                entry.sftp = conn.client.open_sftp()
                entry.sftp_conn = conn
            return entry.sftp

    def _sftp_call(self, host: str, fn: Any) -> Any:
        """Run fn(sftp) on the host's one SFTP session (serialised), mapping connection failures to HostDown."""
        import paramiko

        entry = self._entry(host)
        entry.gate.acquire(control=True)
        try:
            with entry.sftp_lock:
                for attempt in (1, 2):
                    try:
                        sftp = self._sftp(host, entry)
                        return fn(sftp)
                    except (paramiko.SSHException, EOFError, OSError) as e:
                        if isinstance(e, OSError) and getattr(e, "errno", None) is not None:
                            raise  # the server answered: no such file, permission denied, ...
                        conn = entry.sftp_conn
                        if conn is not None and self._forget_if_dead(host, conn.transport) and attempt == 1:
                            continue
                        raise HostDown(host, f"sftp: {_describe(e)}") from e
        finally:
            entry.gate.release(control=True)

    def get(self, host: str, remote_path: str, local_path: str | os.PathLike) -> bool:
        """Copy a remote file here over SFTP; False (nothing copied) when it is already here because `host`
        shares our filesystem and both paths are the same. The local file appears whole or not at all."""
        import uuid

        local = Path(local_path)
        if os.path.abspath(remote_path) == os.path.abspath(local) and local.parent.is_dir() \
                and self.shares_filesystem(host, local.parent):
            return False
        local.parent.mkdir(parents=True, exist_ok=True)
        part = local.with_name(local.name + f".part-{uuid.uuid4().hex[:8]}")
        try:
            self._sftp_call(host, lambda sftp: sftp.get(remote_path, str(part)))
            os.replace(part, local)
        finally:
            part.unlink(missing_ok=True)
        return True

    def get_dir(self, host: str, remote_dir: str, local_dir: str | os.PathLike) -> int:
        """Copy a remote directory tree here (see `get`); returns the number of files copied."""
        import stat
        import uuid

        local = Path(local_dir)
        if os.path.abspath(remote_dir) == os.path.abspath(local) and local.is_dir() \
                and self.shares_filesystem(host, local):
            return 0
        copied = 0
        todo = [(remote_dir.rstrip("/") or "/", local)]
        while todo:
            rdir, ldir = todo.pop()
            ldir.mkdir(parents=True, exist_ok=True)
            for attr in self._sftp_call(host, lambda sftp: sftp.listdir_attr(rdir)):
                rpath = f"{rdir}/{attr.filename}"
                if stat.S_ISDIR(attr.st_mode or 0):
                    todo.append((rpath, ldir / attr.filename))
                elif stat.S_ISREG(attr.st_mode or 0):
                    part = ldir / f".{attr.filename}.part-{uuid.uuid4().hex[:8]}"
                    try:
                        self._sftp_call(host, lambda sftp: sftp.get(rpath, str(part)))
                        os.replace(part, ldir / attr.filename)
                    finally:
                        part.unlink(missing_ok=True)
                    copied += 1
        return copied


class RemoteProcess:
    """A command started by `SSHPool.start`, running in its own session on `host`; `pid` is also its pgid."""

    def __init__(self, pool: SSHPool, host: str, pid: int, argv: list[str], channel: Any, release: "_Once"):
        self.pool = pool
        self.host = host
        self.pid = pid
        self.argv = argv
        self.returncode: int | None = None
        self.lost = False
        self._chan = channel
        self._release = release
        self._done = threading.Lock()

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until the remote command ends; its exit status (128+N if signal N ended it), or None if the
        connection to the host was lost first (the command may or may not still run there: it is not known).
        Raises TimeoutError if `timeout` seconds pass first."""
        if not self._chan.status_event.wait(timeout):
            raise TimeoutError(f"{self.host}: pid {self.pid} still running after {timeout:g}s")
        with self._done:
            if self.returncode is None and not self.lost:
                if _got_status(self._chan):
                    self.returncode = self._chan.exit_status
                else:
                    self.lost = True
                    self.pool._forget_if_dead(self.host, self._chan.get_transport())
                self._finish()
        return self.returncode

    def poll(self) -> int | None:
        """The exit status if the command has ended, else None (see `lost` to tell a lost connection)."""
        if self._chan.status_event.is_set():
            return self.wait()
        return None

    def signal(self, sig: int | str = _signal.SIGTERM) -> bool:
        """Send `sig` to the remote process group; False if it is gone. Raises HostDown if the host is."""
        return self.pool.signal_group(self.host, self.pid, sig)

    def close(self) -> None:
        """Stop following the process (it keeps running) and give its channel back to the pool."""
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


# --- helpers --------------------------------------------------------------------------------------------------

class _Expired(Exception):
    pass


class _Once:
    def __init__(self, fn: Any):
        self._fn = fn
        self._lock = threading.Lock()
        self._done = False

    def __call__(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        self._fn()


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise _Expired()
    return left


def _wait_readable(chan: Any, deadline: float | None) -> None:
    left = _remaining(deadline)
    ready, _, _ = select.select([chan], [], [], left)
    if not ready and deadline is not None and time.monotonic() >= deadline:
        raise _Expired()


def _drain(chan: Any, out: bytearray, err: bytearray) -> None:
    while chan.recv_ready():
        out += chan.recv(65536)
    while chan.recv_stderr_ready():
        err += chan.recv_stderr(65536)


def _collect(chan: Any, deadline: float | None) -> tuple[bytes, bytes]:
    """Everything the command writes until it ends, both streams read as they come (no window stalls)."""
    out, err = bytearray(), bytearray()
    while True:
        _drain(chan, out, err)
        if chan.eof_received or chan.closed:
            break
        _wait_readable(chan, deadline)
    # Any stderr sent before EOF is buffered by now; the exit status follows EOF.
    _drain(chan, out, err)
    left = _remaining(deadline)
    if not chan.status_event.wait(left):
        raise _Expired()
    _drain(chan, out, err)
    return bytes(out), bytes(err)


def _read_pid(chan: Any, deadline: float | None) -> tuple[int | None, bytes]:
    """The pid from the `autotune-pid:N` line of a start, or None if the output ended without one; and the
    rest of what came (stdout lines before it, stderr), for the error message."""
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


def _got_status(chan: Any) -> bool:
    """True if the server sent an exit status: the channel ended because the command did, not the connection.

    paramiko sets exit_status only from an `exit-status` message and leaves it at -1 otherwise; a wire status
    is an unsigned 32-bit number, never -1.
    """
    return chan.exit_status != -1


def _tcp_keepalive(sock: Any, seconds: int) -> None:
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


def _describe(e: BaseException) -> str:
    if isinstance(e, EOFError):
        return "connection closed by the remote end"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror.lower()
    return str(e) or type(e).__name__


def _pids(text: str) -> list[int]:
    return sorted({int(word) for word in text.split() if word.isdigit()})


def _lines(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)
