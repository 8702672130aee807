"""What the command line asks of Ray: `--ray [ADDRESS]` read from argv, checked against the options it excludes,
and the cluster it names read for `run`, `tune`, `plan` and `hosts` (Ray imported only then)."""
from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from ...errors import UserError
from ..base import HostsCheck
from ..cluster import Cluster
from .address import parse
from .connect import address_of, connect, source_of
from .nodes import RayNode, cluster_of, read_nodes

# What follows a bare `--ray` as its address, rather than as the next argument (a spec file, an option).
# What `--ray VALUE` takes as its address: a word Ray knows, any scheme:// (ray://; http:// is Ray's to refuse,
# with its own advice), host:port, [v6]:port.
_ADDRESS = re.compile(r"auto|local|[A-Za-z][A-Za-z0-9+.-]*://\S+|\[[0-9A-Fa-f:.]+\]:\d+|[A-Za-z0-9._-]+:\d+")


def optional_ray_value(argv: list[str]) -> list[str]:
    """`--ray` takes an optional ADDRESS: a bare `--ray` not followed by an address becomes `--ray=` (the
    default: RAY_ADDRESS, else auto)."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--":
            break
        if arg == "--ray" and not (i + 1 < len(out) and _ADDRESS.fullmatch(out[i + 1])
                                   and not Path(out[i + 1]).exists()):
            out[i] = "--ray="
    return out


def check(ray: str | None, *, hostfile: Path | None = None, slots: int | None = None, slurm: bool = False,
          include: str = "", exclude: str = "") -> None:
    """--ray takes its nodes from the cluster: the options that name other nodes are refused with it; its address
    (or RAY_ADDRESS's) is read before anything else is (address.parse: nothing of the network asked yet)."""
    if ray is None:
        return
    parse(address_of(ray or None), source_of(ray or None))
    for given, name in ((hostfile is not None, "--hostfile"), (slots is not None, "--slots"), (slurm, "--slurm"),
                        (bool(include), "--include"), (bool(exclude), "--exclude")):
        if given:
            raise UserError(f"--ray takes its nodes from the Ray cluster: leave out {name}")


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
