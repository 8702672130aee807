"""One executor for a sweep on several hosts: this machine's attempts run locally, the others over SSH."""
from __future__ import annotations

from dataclasses import dataclass

from ...core.events import Post, Run
from ...core.roles import Executor
from ...spec.hostfile import is_local
from ...states import Reason, State


@dataclass
class Router:
    """Sends each run to the executor for where it runs: `local` when its one host is this machine, else
    `remote`. Both are told everything that concerns every run (kill_all, close)."""

    local: Executor
    remote: Executor

    def _for(self, run: Run) -> Executor:
        hosts = run.reservation.hosts
        return self.local if len(hosts) == 1 and is_local(hosts[0]) else self.remote

    def start(self, run: Run, post: Post) -> None:
        self._for(run).start(run, post)

    def adopt(self, run: Run, pid: int | None, post: Post) -> None:
        self._for(run).adopt(run, pid, post)

    def stop(self, run: Run, state: State, detail: str, reason: Reason | None = None) -> None:
        self._for(run).stop(run, state, detail, reason)

    def kill_all(self) -> None:
        self.local.kill_all()
        self.remote.kill_all()

    def close(self) -> None:
        self.local.close()
        self.remote.close()
