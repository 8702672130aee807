"""Routing each attempt to the executor that runs it: this machine's own, or the SSH one."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .hostfile import is_local
from .scheduler import Run
from .ssh import SshExecutor


@dataclass
class Router:
    """One executor for a sweep on several hosts: this machine's attempts locally, the others over SSH."""

    local: object
    remote: SshExecutor

    def _for(self, run: Run):
        hosts = run.reservation.hosts
        return self.local if len(hosts) == 1 and is_local(hosts[0]) else self.remote

    def start(self, run: Run, post: Callable[[object], None]) -> None:
        self._for(run).start(run, post)

    def adopt(self, run: Run, pid: int | None, since: float, post: Callable[[object], None]) -> None:
        self._for(run).adopt(run, pid, since, post)

    def stop(self, run: Run, state: str, detail: str, reason: str | None = None) -> None:
        self._for(run).stop(run, state, detail, reason)

    def kill_all(self) -> None:
        self.local.kill_all()
        self.remote.kill_all()
