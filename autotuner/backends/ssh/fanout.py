"""Doing one thing on many hosts at once: the one fan-out every multi-host call goes through.

`each` calls a function for every host, one thread per host over the pooled connections. `run_many` runs one
shell command everywhere, over those threads or through one `pdsh -R ssh` process (OpenSSH with the pool's
ssh config and known_hosts), which reaches many hosts without opening a pooled connection to each.
"""
from __future__ import annotations

import math
import os
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, TypeVar

from .errors import HostDown
from .pool import CommandResult, SSHPool

T = TypeVar("T")
Fanout = Literal["pool", "pdsh"]
MAX_THREADS = 64


def each(hosts: Iterable[str], fn: Callable[[str], T]) -> dict[str, T]:
    """fn(host) for every distinct host at once; results keyed by host, in the order of `hosts`.

    `fn` should not raise (an exception is raised here once every call has ended). One host is called on this
    thread; the pool's threads are joined before this returns.
    """
    hosts = list(dict.fromkeys(hosts))
    if len(hosts) <= 1:
        return {host: fn(host) for host in hosts}
    with ThreadPoolExecutor(max_workers=min(MAX_THREADS, len(hosts)), thread_name_prefix="ssh-fanout") as workers:
        return dict(zip(hosts, workers.map(fn, hosts), strict=True))


def run_many(pool: SSHPool, hosts: Iterable[str], command: str, timeout: float | None = None, *,
             fanout: Fanout = "pool") -> dict[str, CommandResult | HostDown]:
    """Run `command` on every host at once; per host its CommandResult, or the HostDown that stopped it.

    fanout="pdsh" needs pdsh on this machine (not on the hosts).
    """
    if fanout == "pdsh":
        return _pdsh(pool, list(dict.fromkeys(hosts)), command, timeout)
    if fanout != "pool":
        raise ValueError(f"fanout must be 'pool' or 'pdsh', not {fanout!r}")

    def one(host: str) -> CommandResult | HostDown:
        try:
            return pool.run(host, command, timeout)
        except HostDown as e:
            return e

    return each(hosts, one)


def _pdsh_ssh_args(pool: SSHPool) -> str:
    """The ssh options pdsh must append (PDSH_SSH_ARGS_APPEND) to reach hosts the way `pool` does."""
    args = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, math.ceil(pool.connect_timeout))}"]
    if pool.ssh_config_path:
        args = ["-F", pool.ssh_config_path, *args]
    if pool.known_hosts:
        args += ["-o", f"UserKnownHostsFile={pool.known_hosts}"]
    if pool.accept_new_hosts:
        args += ["-o", "StrictHostKeyChecking=accept-new"]
    if pool.user:
        args += ["-l", pool.user]
    return " ".join(shlex.quote(a) for a in args)


def _pdsh(pool: SSHPool, hosts: Sequence[str], command: str,
          timeout: float | None) -> dict[str, CommandResult | HostDown]:
    pdsh = shutil.which("pdsh")
    if pdsh is None:
        raise RuntimeError("pdsh is not installed")
    if not hosts:
        return {}
    for host in hosts:
        if not host or "," in host or host.startswith("-") or any(c.isspace() for c in host):
            raise ValueError(f"host name unusable with pdsh: {host!r}")
    # The exit status of each host comes back in its output: pdsh -S only gives the largest one.
    marker = f"__autotune_rc_{uuid.uuid4().hex[:12]}"
    remote = f"( {command}\n); echo {marker}=$?"
    argv = [pdsh, "-R", "ssh", "-S", "-f", str(min(64, len(hosts))), "-w", ",".join(hosts)]
    argv += ["-t", str(max(1, math.ceil(pool.connect_timeout)))]
    if timeout is not None:
        argv += ["-u", str(max(1, math.ceil(timeout)))]
    env = dict(os.environ, PDSH_SSH_ARGS_APPEND=_pdsh_ssh_args(pool), PDSH_RCMD_TYPE="ssh")
    proc = subprocess.run([*argv, remote], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          errors="replace", timeout=None if timeout is None else timeout + pool.connect_timeout + 10)
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
    results: dict[str, CommandResult | HostDown] = {}
    for host in hosts:
        if host in codes:
            results[host] = CommandResult(codes[host], _lines(out[host]), _lines(err[host]))
        else:
            why = (err[host] + notes[host]) or ["no answer"]
            results[host] = HostDown(host, "; ".join(why[-2:]))
    return results


def _lines(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)
