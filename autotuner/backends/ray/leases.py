"""Leases: what an attempt holds in Ray while it runs. A lease is a placement group with one bundle per node of the
attempt (its GPUs on each, STRICT_SPREAD, each bundle held to the node the scheduler picked by Ray's
`ray.io/node-id` label) and a detached actor pinned to each bundle (node.NodeLauncher), all reserved by the
runner's own connection to Ray.

A lease whose attempt ended on its own goes back to an idle pool, and the next attempt of the same shape on the
same nodes takes it: its actors are already running, so that attempt starts with one method call per node
instead of a new Ray worker per node (half a second or more each). An idle lease is released after IDLE seconds,
or at once when another attempt needs its GPUs, and every lease when the sweep's runner closes. A stopped
attempt's lease (timeout, cancel, a lost node) is released, never reused.

Names: the placement group `<sweep id>.ray-<8 hex>`, its actors that name and `.<rank>`, in the `autotune`
namespace, detached: they outlive a runner killed -9, and the next one finds them by the sweep's prefix and asks
each actor which attempt it runs (`in_ray`).

Ray is imported only once a cluster is reached (the caller hands in the connected module).
"""
from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any  # Ray comes in as a ModuleType (imported once a cluster is reached): what it returns is Any

from . import node
from .node import NodeLauncher

PLACED_WITHIN = 120.0  # seconds for Ray to reserve the GPUs (something outside the sweep may hold them)
IDLE = 5.0  # seconds an idle lease is kept for the next attempt of its shape
ASK_WITHIN = 30.0  # seconds for the actors found in Ray to say which attempt they run
NODE_LABEL = "ray.io/node-id"


@dataclass
class Lease:
    """One placement group and its actors, by rank (see the module docstring)."""

    name: str
    group: Any  # ray.util.placement_group.PlacementGroup; None for a lease found after a crash without one
    actors: list[Any]  # ActorHandle, one per bundle, in rank order
    nodes: tuple[str, ...]  # Ray's node ids, in rank order
    gpus: int  # per node
    idle_since: float = 0.0

    @property
    def shape(self) -> tuple[frozenset[str], int]:
        """What another attempt must ask for to run on it: its nodes, in any order, and their GPUs."""
        return frozenset(self.nodes), self.gpus

    def ranked(self, nodes: Sequence[str]) -> Lease:
        """The same lease, its actors in the rank order of `nodes` (the same nodes)."""
        order = [self.nodes.index(n) for n in nodes]
        self.actors, self.nodes = [self.actors[i] for i in order], tuple(nodes)
        return self


class NotPlaced(Exception):
    """Ray did not reserve the GPUs within PLACED_WITHIN seconds."""


@dataclass
class Leases:
    """The leases of one sweep's runner: taken by attempts, given back when they end (see the module docstring)."""

    ray: ModuleType  # connected
    sweep_id: str
    idle_for: float = IDLE
    clock: Callable[[], float] = time.monotonic
    _idle: list[Lease] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.ray.cloudpickle.register_pickle_by_value(node)  # the nodes need no autotuner
        self._actor = self.ray.remote(NodeLauncher)

    def take(self, nodes: Sequence[str], gpus: int) -> Lease:
        """A lease of `gpus` GPUs on each of `nodes` (Ray's ids, in rank order): an idle one of that shape, else a
        new one, once the idle leases on those nodes are released (a NotPlaced after PLACED_WITHIN seconds)."""
        shape = (frozenset(nodes), gpus)
        with self._lock:
            expired = self._expired_locked()
            found = next((lease for lease in self._idle if lease.shape == shape), None)
            if found is not None:
                self._idle.remove(found)
            in_the_way = [] if found else [lease for lease in self._idle if set(lease.nodes) & set(nodes)]
            self._idle = [lease for lease in self._idle if lease not in in_the_way]
        self._release_idle(expired + in_the_way)
        return found.ranked(nodes) if found is not None else self._reserve(tuple(nodes), gpus)

    def give_back(self, lease: Lease) -> None:
        """An attempt that ended on its own: its lease idle, for the next attempt of its shape."""
        with self._lock:
            lease.idle_since = self.clock()
            self._idle.append(lease)
            expired = self._expired_locked()
        self._release_idle(expired)

    def expire(self) -> None:
        """Idle leases past their time released."""
        with self._lock:
            expired = self._expired_locked()
        self._release_idle(expired)

    def close(self) -> None:
        """Every idle lease released: nothing of the sweep stays reserved in Ray."""
        with self._lock:
            idle, self._idle = self._idle, []
        self._release_idle(idle)

    def release(self, lease: Lease, grace: float) -> None:
        """Each node's launcher ended (SIGTERM, `grace` seconds, SIGKILL), the actors killed, the group removed."""
        stop_nodes(self.ray, lease.actors, grace)
        for actor in lease.actors:
            with contextlib.suppress(Exception):
                self.ray.kill(actor, no_restart=True)
        if lease.group is not None:  # a lease found after a crash whose group Ray had removed has none
            with contextlib.suppress(Exception):
                self.ray.util.remove_placement_group(lease.group)

    def _expired_locked(self) -> list[Lease]:
        """The idle leases past their time, taken out of the idle list (released by the caller, once it has let
        go of the lock: Ray's answers are not waited for while another attempt wants a lease)."""
        now = self.clock()
        old = [lease for lease in self._idle if now - lease.idle_since >= self.idle_for]
        self._idle = [lease for lease in self._idle if lease not in old]
        return old

    def _release_idle(self, leases: Sequence[Lease]) -> None:
        for lease in leases:  # nothing runs on them: no grace period to wait, each a message to Ray
            self.release(lease, 0)

    def _reserve(self, nodes: tuple[str, ...], gpus: int) -> Lease:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        name = f"{self.sweep_id}.ray-{secrets.token_hex(4)}"
        group = self.ray.util.placement_group([{"GPU": gpus}] * len(nodes), strategy="STRICT_SPREAD", name=name,
                                              lifetime="detached",
                                              bundle_label_selector=[{NODE_LABEL: n} for n in nodes])
        ready, _ = self.ray.wait([group.ready()], timeout=PLACED_WITHIN)
        if not ready:
            with contextlib.suppress(Exception):
                self.ray.util.remove_placement_group(group)
            raise NotPlaced(f"Ray did not reserve {gpus} GPU(s) on each of {len(nodes)} node(s) within "
                            f"{PLACED_WITHIN:g} s: something outside this sweep holds them")
        actors = [self._actor.options(
            name=f"{name}.{rank}", lifetime="detached", num_cpus=0, num_gpus=gpus, max_concurrency=8,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank),
        ).remote() for rank in range(len(nodes))]
        return Lease(name, group, actors, nodes, gpus)


def stop_nodes(ray: ModuleType, actors: Sequence[Any], grace: float, tag: str | None = None) -> None:
    """Every node's launcher (of attempt `tag`; None: whichever runs) ended: SIGTERM, the grace period, SIGKILL,
    the nodes side by side."""
    with contextlib.suppress(Exception):
        ray.wait([actor.stop.remote(tag, grace) for actor in actors], num_returns=len(actors), timeout=grace + 10)


def in_ray(ray: ModuleType, sweep_id: str) -> tuple[dict[str, Lease], list[Lease], list[Any]]:
    """What Ray holds of the sweep, as a runner that takes over finds it: the leases by the attempt each runs (or
    ran last), the leases whose actors do not answer as one, and the sweep's placement groups that have no actor
    any more."""
    from ray.util.placement_group import PlacementGroup

    prefix = f"{sweep_id}."
    groups = {pg["name"]: PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id)))
              for pg_id, pg in ray.util.placement_group_table().items()
              if pg["name"].startswith(prefix) and pg["state"] != "REMOVED"}
    actors: dict[str, dict[int, Any]] = {}
    for name in ray.util.list_named_actors():
        lease_name, _, rank = name.rpartition(".")
        if name.startswith(prefix) and rank.isdigit():
            with contextlib.suppress(ValueError):
                actors.setdefault(lease_name, {})[int(rank)] = ray.get_actor(name)
    by_tag: dict[str, Lease] = {}
    mute: list[Lease] = []
    for lease_name, ranked in actors.items():
        lease = Lease(lease_name, groups.get(lease_name), [ranked[r] for r in sorted(ranked)], (), 0)
        asks = [a.current.remote() for a in lease.actors]
        ready, _ = ray.wait(asks, num_returns=len(asks), timeout=ASK_WITHIN)
        tags = {_answer(ray, ask) for ask in ready} if len(ready) == len(asks) else set()
        if len(tags) == 1 and None not in tags:
            by_tag[str(next(iter(tags)))] = lease
        else:
            mute.append(lease)
    return by_tag, mute, [group for name, group in groups.items() if name not in actors]


def _answer(ray: ModuleType, ask: Any) -> str | None:
    try:
        return ray.get(ask)
    except ray.exceptions.RayError:
        return None
