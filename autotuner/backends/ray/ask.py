"""What the command line asks of Ray: `--ray [ADDRESS]` checked against the options it excludes, and the cluster
it names read for `run`, `tune`, `plan` and `hosts` (Ray imported only then)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from ...errors import UserError
from ..base import HostsCheck
from ..cluster import Cluster
from .address import parse
from .connect import address_of, connect, source_of
from .nodes import RayNode, cluster_of, read_nodes


def check(ray: str | None, given: Mapping[str, object] | None = None) -> None:
    """--ray takes its nodes from the cluster: the options that name other nodes (of `given`, the other
    backends' options) are refused with it; its address (or RAY_ADDRESS's) is read before anything else is
    (address.parse: nothing of the network asked yet)."""
    if ray is None:
        return
    parse(address_of(ray or None), source_of(ray or None))
    given = given or {}
    for name in ("hostfile", "slots", "slurm", "include", "exclude"):
        value = given.get(name)
        if value is not None and value is not False and value != "":
            raise UserError(f"--ray takes its nodes from the Ray cluster: leave out --{name}")


def ray_nodes(ray: str) -> tuple[str, list[RayNode]]:
    """The address `--ray` names and the cluster's live nodes (this process connected to it)."""
    address = address_of(ray or None)
    return address, read_nodes(connect(address, source=source_of(ray or None)).nodes())


def ray_cluster(ray: str) -> Cluster:
    """The sweep's cluster: the nodes of the Ray cluster with GPUs (a UserError when there is none)."""
    address, nodes = ray_nodes(ray)
    cluster = cluster_of(nodes)
    if not cluster.slots:
        raise UserError(f"the Ray cluster at {address} has no live node with a GPU")
    return cluster


def nodes_check(address: str, nodes: Sequence[RayNode]) -> HostsCheck:
    """`autotune hosts --ray`: one row per live node: its host name, Ray's node id and address, GPUs (type),
    CPUs and memory as Ray counts them, and what it can run. The cluster can run when a node has a GPU."""
    can = [f"up to {n.gpus} GPU(s) here" if n.gpus else "nothing (no GPU)" for n in nodes]
    rows = [{"host": n.host, "node_id": n.id, "address": n.ip, "gpus": n.gpus, "gpu_type": n.gpu_type, "cpus": n.cpus,
             "memory_bytes": n.memory, "can_run": c} for n, c in zip(nodes, can, strict=True)]
    cells = tuple((n.host, n.id[:16], n.ip, f"{n.gpus}" + (f" x {n.gpu_type}" if n.gpu_type else ""), f"{n.cpus:g}",
                   f"{n.memory / 2**30:.1f} GiB", c) for n, c in zip(nodes, can, strict=True))
    return HostsCheck(f"Ray cluster at {address}: {len(nodes)} live node(s)",
                      ("host", "node id", "address", "GPUs", "CPUs", "memory", "can run"), cells,
                      tuple(n.gpus > 0 for n in nodes), "can run", {"address": address, "nodes": rows},
                      any(n.gpus for n in nodes))
