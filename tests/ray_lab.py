"""A real Ray cluster on this machine for the Ray backend's tests: a head and two worker nodes (separate raylets,
each with two fake GPUs that Ray hands out as it would real ones), all on loopback.

`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` is set in the cluster's environment and in every client's (the tests'
`autotune` runs): without it Ray swaps 127.0.0.1 for this machine's outside address and clients hang on it.
The test process itself connects too (namespace `lab`), to see what is reserved and which actors live.
"""
from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
os.environ.update(LOOPBACK)  # read by Ray when it is imported, so before that

import ray  # noqa: E402
from ray._private import ray_constants  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

GPUS_PER_NODE = 2
# A lost node declared dead after three failed health checks a second apart (~3 s), not Ray's five three seconds
# apart (~14 s measured): every node-loss test waits that out. A check fails on a refused connection (the raylet is
# gone) or after Ray's own 10 s timeout, so a raylet slow under load is not mistaken for a lost one.
HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}


@dataclass
class RayLab:
    """The running cluster: its address, its nodes (host name as autotune names them -> Ray's node id)."""

    cluster: Cluster
    address: str
    workers: list = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """What a client process needs: this cluster as its RAY_ADDRESS, on loopback."""
        return {**LOOPBACK, "RAY_ADDRESS": self.address}

    def alive(self) -> list[dict]:
        return [n for n in ray.nodes() if n["Alive"]]

    def placement_groups(self) -> list[dict]:
        """Placement groups that still hold resources (not removed)."""
        return [pg for pg in ray.util.placement_group_table().values() if pg["state"] != "REMOVED"]

    def actors(self, prefix: str = "") -> list[str]:
        """Named actors alive in any namespace whose name starts with `prefix`."""
        return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix)]

    def kill_worker(self, index: int) -> str:
        """End worker node `index` as a lost machine would: its raylet and every process that descends from it
        (the launchers its actors started in sessions of their own outlive the raylet otherwise); its node id."""
        node = self.workers[index]
        node_id = node.node_id
        raylet = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
        on_it = descendants(raylet)
        self.cluster.remove_node(node, allow_graceful=False)
        for pid in on_it:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return node_id

    def replace_worker(self, index: int) -> None:
        """A new worker node in place of worker `index` (a node Ray lost never comes back under its id)."""
        self.workers[index] = self.cluster.add_node(num_cpus=2, num_gpus=GPUS_PER_NODE, node_ip_address="127.0.0.1")
        self.cluster.wait_for_nodes(timeout=180)


def descendants(pid: int) -> list[int]:
    """Every live process under `pid`, from /proc (children of children too)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = open(f"/proc/{entry}/stat").read()  # noqa: SIM115
                children.setdefault(int(stat.rpartition(")")[2].split()[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def start() -> RayLab:
    """Head and two workers up and seen by Ray (this loaded machine may take a minute)."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": GPUS_PER_NODE,
                                                            "node_ip_address": "127.0.0.1",
                                                            "_system_config": HEALTH_CHECKS})
    lab = RayLab(cluster, cluster.address)
    for _ in range(2):
        lab.workers.append(cluster.add_node(num_cpus=2, num_gpus=GPUS_PER_NODE, node_ip_address="127.0.0.1"))
    ray.init(address=cluster.address, namespace="lab", log_to_driver=False)
    cluster.wait_for_nodes(timeout=180)
    return lab


def stop(lab: RayLab) -> None:
    ray.shutdown()
    lab.cluster.shutdown()


@contextlib.contextmanager
def running() -> Iterator[RayLab]:
    lab = start()
    try:
        yield lab
    finally:
        stop(lab)


if __name__ == "__main__":  # hold a cluster for working by hand: its address printed, Ctrl-C ends it
    with running() as held:
        print(held.address, flush=True)
        while True:
            time.sleep(3600)
