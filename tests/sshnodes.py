"""Real sshd servers on loopback addresses, standing in for the nodes of a cluster in tests.

Node i listens on 127.0.0.(i+1) port 22 (or a free port when 22 is taken on that address), with its own host
key and its own client key pair, all under one temporary directory. The rig writes a `known_hosts` file with the
nodes' host keys and an ssh `config` naming them `node-1`, `node-2`, ... so that OpenSSH (and pdsh through it)
and fabric (through `ssh_config_path`) reach them by name.

`Node.stop()` simulates a lost node: it ends the listening sshd *and* every process descended from it, since
the sessions already open (and the commands they run) would otherwise outlive the listener.
`Node.start()` brings it back on the same address, port and host key.

Each node's sessions find `Node.bin` (empty until a test puts something there) first on their PATH: that is where
a test puts fakes of tools a real node has and this machine lacks, such as `fake_nvidia_smi.py` as `nvidia-smi`.

Needs root (sshd must switch users and bind port 22), /usr/sbin/sshd, ssh-keygen and /run/sshd.
"""
from __future__ import annotations

import contextlib
import errno
import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

SSHD = "/usr/sbin/sshd"
# The PATH sshd gives a session (Debian's build: root's, else a user's); each node's own bin directory goes first.
SESSION_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" if os.geteuid() == 0 \
    else "/usr/local/bin:/usr/bin:/bin:/usr/games"
PRIVSEP_DIR = Path("/run/sshd")


def unavailable_reason() -> str | None:
    """Why this machine cannot run the rig, or None when it can."""
    if not os.path.exists(SSHD):
        return f"{SSHD} not installed (apt-get install openssh-server)"
    if shutil.which("ssh-keygen") is None:
        return "ssh-keygen not installed"
    if os.geteuid() != 0:
        return "the sshd test nodes need root"
    return None


def _keygen(path: Path, comment: str) -> str:
    """An ed25519 key pair at `path` / `path`.pub; returns the public key line (type and base64)."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL)
    kind, b64 = path.with_name(path.name + ".pub").read_text().split()[:2]
    return f"{kind} {b64}"


def _port_free(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
        return True


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _children_map() -> dict[int, list[int]]:
    """Parent pid -> child pids, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name (field 2) is in parentheses and may hold spaces: split after the last ')'.
        fields = stat[stat.rfind(b")") + 2:].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` in the process tree (not `pid` itself)."""
    tree = _children_map()
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


class Node:
    """One sshd on one loopback address: a stand-in for a cluster node."""

    def __init__(self, name: str, address: str, port: int, directory: Path):
        self.name = name
        self.address = address
        self.port = port
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.host_key = _keygen(self.dir / "ssh_host_ed25519_key", f"{name}-host")
        self.client_key_path = self.dir / "client_ed25519"
        client_pub = _keygen(self.client_key_path, f"autotune-test@{name}")
        self.authorized_keys = self.dir / "authorized_keys"
        self.authorized_keys.write_text(client_pub + "\n")
        self.bin = self.dir / "bin"  # first on the PATH of the node's sessions: fakes of the node's tools
        self.bin.mkdir(exist_ok=True)
        self.config_path = self.dir / "sshd_config"
        self.log_path = self.dir / "sshd.log"
        self.config_path.write_text("\n".join([
            f"Port {port}",
            f"ListenAddress {address}",
            f"HostKey {self.dir / 'ssh_host_ed25519_key'}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            f"PidFile {self.dir / 'sshd.pid'}",
            "UsePAM no",
            "StrictModes no",  # the keys live under /tmp
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "MaxSessions 10",  # sshd's default, spelt out: ssh.SSHPool keeps below it
            "MaxStartups 100",  # many parallel connects (probes, benchmarks) must not be dropped
            "PermitUserEnvironment no",
            "AcceptEnv AUTOTUNE_*",
            f"SetEnv PATH={self.bin}:{SESSION_PATH}",
            "UseDNS no",
            "PrintMotd no",
            "X11Forwarding no",
            "Subsystem sftp internal-sftp",
            "LogLevel INFO",
            "",
        ]))
        self._proc: subprocess.Popen | None = None
        self._log = None
        self.killed: set[int] = set()  # pids ended by stop(): re-parented, they may linger as zombies a while

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running else None

    def known_hosts_line(self) -> str:
        if self.port == 22:
            names = f"{self.name},{self.address}"
        else:
            names = f"[{self.name}]:{self.port},[{self.address}]:{self.port}"
        return f"{names} {self.host_key}"

    def ssh_config_block(self, known_hosts: Path) -> str:
        return "\n".join([
            f"Host {self.name}",
            f"    HostName {self.address}",
            f"    Port {self.port}",
            f"    User {getpass.getuser()}",
            f"    IdentityFile {self.client_key_path}",
            "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {known_hosts}",
            "    GlobalKnownHostsFile /dev/null",
            "    StrictHostKeyChecking yes",
            "    BatchMode yes",
            "",
        ])

    def start(self, timeout: float = 10.0) -> None:
        """Start (or restart) the sshd; returns once its port accepts connections."""
        if self.running:
            return
        PRIVSEP_DIR.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115  # sshd's output for its whole life; closed by stop()
        self._proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config_path)], stdin=subprocess.DEVNULL,
                                      stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
                                      preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                self._close_log()
                raise RuntimeError(f"sshd for {self.name} exited with {self._proc.returncode}: "
                                   f"{self.log_path.read_text(errors='replace')[-2000:]}")
            try:
                socket.create_connection((self.address, self.port), timeout=0.5).close()
                return
            except OSError as e:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"sshd for {self.name} did not accept on {self.address}:{self.port}") from e
                time.sleep(0.02)

    def stop(self) -> None:
        """Lose the node: freeze the sshd and everything below it, then kill them all.

        Stopping first means no session process gets to report its children's deaths (an exit status) to a
        client before it dies itself, as on a node that really went away; repeating the scan catches processes
        forked while it ran.
        """
        if self._proc is None:
            return
        root = self._proc.pid
        if self._proc.poll() is None:
            _kill(root, signal.SIGSTOP)
        stopped: set[int] = set()
        while True:
            fresh = descendants(root) - stopped
            if not fresh:
                break
            for pid in fresh:
                _kill(pid, signal.SIGSTOP)
            stopped |= fresh
        for pid in stopped | {root}:
            _kill(pid, signal.SIGKILL)
        self.killed |= stopped
        self._proc.wait()
        self._proc = None
        self._close_log()
        # Orphans are re-parented and reaped elsewhere; wait until none of them is left running.
        deadline = time.monotonic() + 5
        while any(_alive(pid) for pid in stopped) and time.monotonic() < deadline:
            time.sleep(0.01)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __repr__(self) -> str:
        state = "up" if self.running else "down"
        return f"Node({self.name} {self.address}:{self.port} {state})"


def _die_with_parent() -> None:
    """In the forked child: have the kernel SIGKILL the listener if the test process dies without tearing down."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] != b"Z"


class SSHNodes:
    """A set of test nodes plus the client files (ssh config, known_hosts) that reach them by name."""

    def __init__(self, root: Path, count: int, first_address: int = 2):
        self.root = Path(root)
        self.nodes: list[Node] = []
        for i in range(count):
            address = f"127.0.0.{first_address + i}"
            port = 22 if _port_free(address, 22) else _free_port(address)
            self.nodes.append(Node(f"node-{i + 1}", address, port, self.root / f"node-{i + 1}"))
        self.config_path, self.known_hosts_path = self.client_files(self.root)

    def client_files(self, directory: Path, known: Iterable[Node] | None = None) -> tuple[Path, Path]:
        """Write `config` and `known_hosts` into `directory`; only the `known` nodes' keys (default: all) go into
        known_hosts. Returns (config path, known_hosts path)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        known_hosts = directory / "known_hosts"
        config = directory / "config"
        known = self.nodes if known is None else list(known)
        known_hosts.write_text("".join(node.known_hosts_line() + "\n" for node in known))
        config.write_text("\n".join(node.ssh_config_block(known_hosts) for node in self.nodes))
        return config, known_hosts

    @property
    def names(self) -> list[str]:
        return [node.name for node in self.nodes]

    def __getitem__(self, key: int | str) -> Node:
        if isinstance(key, int):
            return self.nodes[key]
        for node in self.nodes:
            if node.name == key:
                return node
        raise KeyError(key)

    def __iter__(self):
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def pdsh_env(self) -> dict[str, str]:
        """Environment for `pdsh -R ssh -w node-1,...` to reach the nodes through this rig's ssh config."""
        return {"PDSH_RCMD_TYPE": "ssh", "PDSH_SSH_ARGS_APPEND": f"-F {self.config_path}"}

    def start(self) -> None:
        for node in self.nodes:
            node.start()

    def close(self, linger: float = 10.0) -> list[int]:
        """Stop every node and everything running under it; then wait up to `linger` seconds until init has
        reaped the orphans too (until then `ps` shows them as `[sshd] <defunct>`). Returns pids still there."""
        for node in self.nodes:
            node.stop()
        pending = set().union(*(node.killed for node in self.nodes))
        deadline = time.monotonic() + linger
        while pending and time.monotonic() < deadline:
            pending = {pid for pid in pending if os.path.exists(f"/proc/{pid}") and not _alive(pid)}
            if pending:
                time.sleep(0.05)
        return sorted(pending)


def start_nodes(count: int, root: Path) -> SSHNodes:
    """Start `count` nodes under `root`; on any failure the ones already started are stopped."""
    nodes = SSHNodes(root, count)
    try:
        nodes.start()
    except BaseException:
        nodes.close()
        raise
    return nodes
