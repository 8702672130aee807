"""Ending an attempt's processes on other hosts, found by the tag in their environment (see tags).

The remote half of cleanup: the same /proc check as on this machine, run as a shell snippet on each host.
"""
from __future__ import annotations

import shlex
import shutil
import signal
import time
from collections.abc import Iterable, Sequence

from .. import tags
from ..launch import comm_buffer_prefix
from .errors import HostDown
from .fanout import Fanout, run_many
from .pool import SSHPool
from .process import signal_name


def signal_tagged(pool: SSHPool, hosts: Iterable[str], tag: str, sig: int | str = signal.SIGKILL,
                  timeout: float | None = 30.0, *, fanout: Fanout = "pool") -> dict[str, list[int] | HostDown]:
    """Send `sig` to every process carrying the tag on each host; per host the PIDs signalled, or the
    HostDown that kept it from being asked."""
    results = run_many(pool, hosts, tags.kill_command(tag, signal_name(sig)), timeout, fanout=fanout)
    return {host: r if isinstance(r, HostDown) else _pids(r.stdout) for host, r in results.items()}


def end_tagged_remote(pool: SSHPool, hosts: Sequence[str], tag: str) -> None:
    """SIGKILL what carries the tag on `hosts` until nothing does; a host that is down is left alone (what ran
    there is gone with it, or is ended when a later resume finds it).

    Several hosts are asked at once: through one pdsh process when pdsh is installed, else over the pooled
    connections; a single host over its pooled connection.
    """
    fanout: Fanout = "pdsh" if len(hosts) > 1 and shutil.which("pdsh") else "pool"
    todo = list(hosts)
    for _ in range(50):
        signalled = signal_tagged(pool, todo, tag, signal.SIGKILL, timeout=30, fanout=fanout)
        todo = [host for host, pids in signalled.items() if not isinstance(pids, HostDown) and pids]
        if not todo:
            return
        time.sleep(0.1)
    raise RuntimeError(f"processes tagged {tag} survive SIGKILL on {', '.join(todo)}")


def remove_comm_buffers(pool: SSHPool, hosts: Sequence[str], master_addr: str, port: int) -> None:
    """executor.remove_comm_buffers on other hosts: DeepSpeed's CPU allreduce buffers of a run that has ended,
    on each of its hosts that answers (best effort: a host that does not keeps them until it reboots)."""
    name = comm_buffer_prefix('"$(id -u)"', shlex.quote(master_addr), port)
    run_many(pool, hosts, f"rm -f -- /dev/shm/{name}*", 30)


def _pids(text: str) -> list[int]:
    return sorted({int(word) for word in text.split() if word.isdigit()})
