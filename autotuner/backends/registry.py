"""Which backend runs a sweep, and which one `autotune hosts` asks: the list of every kind of cluster, asked in
order, each naming itself from the options given or the sweep's record (see base.Kind). Adding a kind is one
line in `BACKENDS`."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..ledger.store import Ledger, SweepMeta
from ..spec import Sweep
from .base import Backend, Given, HostsCheck, Kind
from .cluster import Cluster
from .hosts.hosts import HostsBackend, Ssh
from .ray.backend import RayBackend
from .slurm.allocation import Allocation
from .slurm.backend import SlurmBackend

# Asked in this order; the first named wins: a Ray record first, the hosts backend (named by anything) last.
BACKENDS: tuple[type[Kind], ...] = (RayBackend, SlurmBackend, HostsBackend)


def kind_of(given: Given, record: SweepMeta | None = None) -> type[Kind]:
    """The kind of cluster the options given, else the sweep's record, name."""
    return next(kind for kind in BACKENDS if kind.named(given, record))


def backend_for(directory: Path, ledger: Ledger, *, ssh: Ssh | None = None, allocation: Allocation | None = None,
                ray: str | None = None, grace: float = 10.0,
                log: Callable[[str], None] = lambda line: None) -> Backend:
    """The backend the sweep's record names (an allocation given makes it a Slurm sweep from now on, a Ray
    address, "" for the default one, a Ray sweep). Nothing is checked yet (`attach`): recovery alone (`end`)
    needs no allocation."""
    given = _given(ssh=ssh, allocation=allocation, ray=ray)
    return kind_of(given, ledger.meta()).opened(directory, ledger, given, grace=grace, log=log)


def cluster_for(hostfile: str | Path | None = None, *, include: str = "", exclude: str = "", slots: int | None = None,
                ray: str | None = None, allocation: Allocation | None = None, sweep: Sweep | None = None,
                log: Callable[[str], None] | None = None, probe: Ssh | None = None) -> Cluster:
    """The nodes a new sweep runs on, from the backend the options name: the Ray cluster's live nodes (`ray`: its
    address, "" for the default one), the Slurm allocation's nodes and GPUs (`allocation`), else the hosts
    backend's (a hostfile's, this machine's, CPU slots: `hosts_cluster`)."""
    given = _given(hostfile=hostfile, include=include, exclude=exclude, slots=slots, ray=ray, allocation=allocation,
                   sweep=sweep, log=log, probe=probe)
    return kind_of(given).cluster(given)


def hosts_check(hostfile: str | Path = "hostfile", ssh: Ssh | None = None, *, slurm: bool = False,
                ray: str | None = None) -> HostsCheck:
    """`autotune hosts`: the hosts of the cluster the options name, as its backend finds them: the Ray cluster's
    live nodes (`ray`: its address, "" for the default one), the nodes of the Slurm allocation this runs in
    (`slurm`), else the hostfile's hosts probed over SSH (`ssh`: how they are reached)."""
    given = _given(hostfile=hostfile, ssh=ssh, slurm=slurm, ray=ray)
    return kind_of(given).hosts(given)


def _given(**options: object) -> Given:
    """The options given: those left at None (or False) are not."""
    return {name: value for name, value in options.items() if value is not None and value is not False}
