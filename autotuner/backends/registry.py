"""Which backend runs a sweep: the one place that knows every kind of cluster (see base.py)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..ledger.store import Ledger
from .base import Backend
from .hosts import HostsBackend, Ssh
from .ray.backend import RayBackend
from .slurm.allocation import Allocation
from .slurm.backend import SlurmBackend


def backend_for(directory: Path, ledger: Ledger, *, ssh: Ssh | None = None, allocation: Allocation | None = None,
                ray: str | None = None, grace: float = 10.0,
                log: Callable[[str], None] = lambda line: None) -> Backend:
    """The backend the sweep's record names (an allocation given makes it a Slurm sweep from now on, a Ray
    address, "" for the default one, a Ray sweep). Nothing is checked yet (`attach`): recovery alone (`end`)
    needs no allocation."""
    if ray is not None or ledger.meta().ray is not None:
        return RayBackend(directory, ledger, ray or None, grace=grace, log=log)
    if allocation is not None or ledger.meta().slurm is not None:
        return SlurmBackend(directory, ledger, allocation, grace=grace, log=log)
    return HostsBackend(directory, ledger, ssh=ssh, grace=grace, log=log)
