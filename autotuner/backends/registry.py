"""Which backend runs a sweep, and which one `autotune hosts` asks: the one place that knows every kind of
cluster (see base.py)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..ledger.store import Ledger, SweepMeta
from ..spec import Sweep
from .base import Backend, HostsCheck
from .cluster import Cluster
from .hosts.hosts import HostsBackend, Ssh, hosts_cluster
from .ray.ask import nodes_check, ray_cluster, ray_nodes
from .ray.backend import RayBackend
from .slurm.allocation import Allocation
from .slurm.ask import allocation_check, allocation_cluster, this_allocation
from .slurm.backend import SlurmBackend
from .ssh.probe import check_hostfile, hostfile_check


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


def recorded_allocation(meta: SweepMeta) -> dict[str, object] | None:
    """For `resume`, before any cluster is asked: the Slurm allocation the sweep's backend runs in (job id,
    whether ours), to run in again while it still runs; None when its record names another backend (as
    `backend_for` picks it: a Ray record first)."""
    if meta.ray is not None or meta.slurm is None:
        return None
    return dict(meta.slurm)


def cluster_for(hostfile: str | Path | None = None, *, include: str = "", exclude: str = "", slots: int | None = None,
                ray: str | None = None, allocation: Allocation | None = None, sweep: Sweep | None = None,
                log: Callable[[str], None] | None = None, probe: Ssh | None = None) -> Cluster:
    """The nodes a new sweep runs on, from the backend the options name: the Ray cluster's live nodes (`ray`: its
    address, "" for the default one), the Slurm allocation's nodes and GPUs (`allocation`), else the hosts
    backend's (a hostfile's, this machine's, CPU slots: `hosts_cluster`)."""
    if ray is not None:
        return ray_cluster(ray)
    if allocation is not None:
        return allocation_cluster(allocation, include, exclude)
    return hosts_cluster(hostfile, include=include, exclude=exclude, slots=slots, sweep=sweep, log=log, probe=probe)


def hosts_check(hostfile: str | Path = "hostfile", ssh: Ssh | None = None, *, slurm: bool = False,
                ray: str | None = None) -> HostsCheck:
    """`autotune hosts`: the hosts of the cluster the options name, as its backend finds them: the Ray cluster's
    live nodes (`ray`: its address, "" for the default one), the nodes of the Slurm allocation this runs in
    (`slurm`), else the hostfile's hosts probed over SSH (`ssh`: how they are reached)."""
    if ray is not None:
        return nodes_check(*ray_nodes(ray))
    if slurm:
        return allocation_check(*this_allocation())
    ssh = ssh or Ssh()
    listed, reports = check_hostfile(hostfile, ssh.config, ssh.accept_new_hosts)
    return hostfile_check(f"hosts of {hostfile}", listed, reports)
