"""The Ray backend: a sweep on the nodes of a Ray cluster (KubeRay on Kubernetes, `ray up`, Anyscale), reached
as a client; each attempt a placement group and an actor per node (executor.py, driver.py). See backends/base.py
for the contract.

The cluster is read from Ray when the runner attaches (nodes, GPUs, their type), checked to share the results
directory with this machine, and recorded in the ledger (`meta.ray`: its address and each host's node id), so
that `resume` and `cancel` reach it again. A node Ray reports dead is a lost host (NodeWatcher).
"""
from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ...core import Executor, Observer, Placement, Queued, SlotPool
from ...core.events import Post
from ...core.placement import FreeMemory
from ...core.slots import Devices
from ...errors import UserError
from ...files import write_atomic
from ...ledger.store import Attempt, Ledger
from ...spec.hostfile import HOSTFILE, format_hostfile
from ...spec.metrics import metric_named
from ..launch import Launcher
from ..local.cleanup import end_tagged
from ..local.executor import LocalExecutor
from .connect import address_of, connect
from .executor import RayDrivers
from .nodes import RayNode, cluster_of, read_nodes, record_of
from .watch import NodeWatcher

SEEN_WITHIN = 60.0  # seconds for every node to say whether it sees the results directory


class RayBackend:
    """Attempts on the Ray cluster at `address` (None: as the sweep recorded, else RAY_ADDRESS, else auto)."""

    def __init__(self, directory: Path, ledger: Ledger, address: str | None = None, *, grace: float = 10.0,
                 log: Callable[[str], None] = lambda line: None):
        self.directory, self.ledger, self.grace, self.log = directory, ledger, grace, log
        recorded = (ledger.meta().ray or {}).get("address")
        self.address = address or recorded or address_of(None)
        self.measure: FreeMemory | None = None  # GPUs are read by nobody here: Ray hands them out
        self.observers: list[Observer] = []
        self._ray: ModuleType | None = None
        self._executor: LocalExecutor | None = None
        self._watcher: NodeWatcher | None = None

    def ray(self) -> ModuleType:
        if self._ray is None:
            self._ray = connect(self.address, self.directory)
        return self._ray

    def attach(self) -> None:
        """The cluster read, checked to share the results directory, and recorded (a UserError if not)."""
        nodes = read_nodes(self.ray().nodes())
        cluster = cluster_of(nodes)
        if not cluster.slots:
            raise UserError(f"the Ray cluster at {self.address} has no live node with a GPU", self.directory)
        unseen = unshared_nodes(self.ray(), [n for n in nodes if n.gpus > 0], self.directory)
        if unseen:
            raise UserError(f"node(s) {', '.join(unseen)} of the Ray cluster at {self.address} do not see this "
                            "results directory (each node's launcher writes its logs there, the first node the "
                            "metrics): put it on storage the nodes share (NFS, a shared volume of the pods)",
                            self.directory)
        meta = self.ledger.meta()
        record = record_of(self.address, nodes)
        if meta.ray == record and dict(meta.slots) == dict(cluster.slots):
            return
        for key, value in (("slots", {h: list(ids) for h, ids in cluster.slots.items()}),
                           ("capacity", dict(cluster.capacity)), ("gpu_types", dict(cluster.types)),
                           ("gpu_memory", dict(cluster.memory)), ("ray", record)):
            self.ledger.set_meta(key, value)
        write_atomic(self.directory / HOSTFILE, format_hostfile(dict(cluster.capacity)))

    def read_memory(self, placement: str, devices: Devices) -> None:
        """Nothing is read: Ray hands each attempt whole GPUs; a GPU's type states its memory where known."""

    def executor(self, post: Post) -> Executor:
        meta = self.ledger.meta()
        record = dict(meta.ray or {})
        self._watcher = NodeWatcher(self.ray, dict(record.get("nodes") or {}), post)
        launcher, env = Launcher(meta.launcher), dict(meta.env)
        drivers = RayDrivers(self.address, metric_named(meta.metric), launcher, env, self.grace,
                             nodes=dict(record.get("nodes") or {}), capacity=dict(meta.capacity),
                             release=self.release, on_lost=self._watcher.watch)
        self._executor = LocalExecutor(str((self.directory / HOSTFILE).resolve()), metric_named(meta.metric),
                                       time.time, launcher, env, self.grace, processes=drivers)
        return self._executor

    def admit(self, placement: Placement, slots: SlotPool, waiting: list[Queued]) -> tuple[Placement, list[Queued]]:
        return placement, waiting  # every node is reached through Ray, none over ssh

    def clear_strays(self, followed: Sequence[Attempt]) -> None:
        """Actors and placement groups of this sweep that no attempt being adopted owns: ended."""
        keep = {a.tag for a in followed if a.tag}
        ended = [tag for tag in self.tags_in_ray(self.ledger.meta().sweep_id) if tag not in keep]
        for tag in ended:
            self.release(tag, self.grace)
        if ended:
            self.log(f"{len(ended)} attempt(s) a dead runner left in the Ray cluster that no runner follows any "
                     "more: their actors and placement groups ended")

    def end(self, attempt: Attempt) -> None:
        """The attempt's driver ended here (by its tag), then its actors and placement group in Ray."""
        if attempt.tag:
            end_tagged(attempt.tag, self.grace)
            self.release(attempt.tag, self.grace)

    def ready(self, slots: SlotPool, post: Post) -> None:
        """Nodes the sweep recorded that Ray no longer lists alive are left out (watched)."""
        if self._watcher is not None:
            for host in self._watcher.dead_now():
                self.log(f"Ray reports node {host} dead: left out")
                slots.mark_down(host)

    def close(self) -> None:
        """The executor (every attempt has ended), the node watcher, then the connection to Ray."""
        closing: list[Any] = [self._executor, self._watcher]
        with contextlib.ExitStack() as stack:
            if self._ray is not None:
                stack.callback(self._ray.shutdown)
            for resource in reversed([r for r in closing if r is not None]):
                stack.callback(resource.close)

    # --- what Ray holds of the sweep ----------------------------------------------------------------------
    def tags_in_ray(self, sweep_id: str) -> set[str]:
        """The tags of this sweep's attempts that still have a named actor or placement group in Ray."""
        ray = self.ray()
        prefix = f"{sweep_id}."
        tags = {name.rsplit(".", 1)[0] for name in ray.util.list_named_actors() if name.startswith(prefix)}
        tags |= {pg["name"] for pg in ray.util.placement_group_table().values()
                 if pg["name"].startswith(prefix) and pg["state"] != "REMOVED"}
        return tags

    def release(self, tag: str, grace: float) -> None:
        """End what Ray holds of the attempt `tag`: each node's launcher (SIGTERM, `grace` seconds, SIGKILL), its
        actors, its placement group. Nothing there: nothing done."""
        ray = self.ray()
        actors = []
        for name in ray.util.list_named_actors():
            if name.startswith(f"{tag}."):
                with contextlib.suppress(ValueError):
                    actors.append(ray.get_actor(name))
        with contextlib.suppress(Exception):
            ray.wait([a.stop.remote(grace) for a in actors], num_returns=len(actors), timeout=grace + 10)
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        with contextlib.suppress(ValueError):
            ray.util.remove_placement_group(ray.util.get_placement_group(tag))


def unshared_nodes(ray: ModuleType, nodes: Sequence[RayNode], directory: Path) -> list[str]:
    """The nodes that do not see a file written in `directory` now (each asked by a task pinned to it)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from . import node

    ray.cloudpickle.register_pickle_by_value(node)
    probe = directory / f".autotune-shared-{secrets.token_hex(4)}"
    probe.write_text("")
    try:
        sees = ray.remote(node.sees)
        asks = [sees.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n.id, soft=False))
                .remote(str(probe.resolve())) for n in nodes]
        ready, _ = ray.wait(asks, num_returns=len(asks), timeout=SEEN_WITHIN)
        return [n.host for n, ask in zip(nodes, asks, strict=True) if ask not in ready or not ray.get(ask)]
    finally:
        probe.unlink(missing_ok=True)
