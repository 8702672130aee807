"""The nodes of a Ray cluster as a sweep's hosts: each live node with GPUs, its GPU count, the GPU type Ray
knows (its `accelerator_type:` resource), CPUs and memory. A host is named by Ray's node id (`ray-` and its
first 12 hex digits): nodes of one cluster may share an address (pods behind one IP, our loopback test
cluster), and a node that comes back under a new id is a new host."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...gpu.types import TYPE_NAME, size_of_type
from ...jsonvalues import JSON, JSONObject
from ..cluster import Cluster

ACCELERATOR = "accelerator_type:"
PREFIX = "ray-"


@dataclass(frozen=True)
class RayNode:
    """One live node of the cluster, as Ray reports it."""

    host: str
    id: str
    ip: str
    gpus: int
    cpus: float
    memory: int  # bytes Ray may hand out on it
    gpu_type: str | None


def host_of(node_id: str) -> str:
    return PREFIX + node_id[:12]


def read_nodes(reported: Sequence[Mapping[str, JSON]]) -> list[RayNode]:
    """The live nodes of `ray.nodes()`, in the order Ray lists them."""
    nodes = []
    for n in reported:
        if not n.get("Alive"):
            continue
        resources = n.get("Resources") or {}
        types = [k[len(ACCELERATOR):] for k in resources if k.startswith(ACCELERATOR)]
        gpu_type = types[0] if len(types) == 1 and TYPE_NAME.fullmatch(types[0]) else None
        nodes.append(RayNode(host_of(n["NodeID"]), n["NodeID"], n.get("NodeManagerAddress", ""),
                             int(resources.get("GPU", 0)), float(resources.get("CPU", 0)),
                             int(resources.get("memory", 0)), gpu_type))
    return nodes


def cluster_of(nodes: Sequence[RayNode]) -> Cluster:
    """The sweep's cluster: every node with a GPU, its GPUs as counts (Ray picks which GPUs each attempt gets,
    as Slurm does), their type where Ray knows it."""
    with_gpus = [n for n in nodes if n.gpus > 0]
    slots = {n.host: tuple(range(n.gpus)) for n in with_gpus}
    types = {n.host: n.gpu_type for n in with_gpus if n.gpu_type is not None}
    memory = {h: size for h, t in types.items() if (size := size_of_type(t)) is not None}
    return Cluster(slots, {h: len(ids) for h, ids in slots.items()}, "cuda", types, memory)


def record_of(address: str, nodes: Sequence[RayNode]) -> JSONObject:
    """What the ledger keeps of the cluster (the backend's record): how to reach it, and each host's node id and
    address."""
    return {"address": address, "nodes": {n.host: {"id": n.id, "ip": n.ip} for n in nodes if n.gpus > 0}}
