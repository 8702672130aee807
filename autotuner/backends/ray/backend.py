"""The Ray backend: a sweep on the nodes of a Ray cluster (KubeRay on Kubernetes, `ray up`, Anyscale), reached
as a client; each attempt a lease (a placement group and an actor per node, leases.py) taken by the runner's
own connection (executor.py). See backends/base.py for the contract.

The cluster is read from Ray when the runner attaches (nodes, GPUs, their type), checked to share the results
directory with this machine, and recorded in the ledger (the backend's record: its address and each host's node id), so
that `resume` and `cancel` reach it again. A node Ray reports dead is a lost host (NodeWatcher). What a dead
runner left in Ray is found by the sweep's name and each actor's answer to which attempt it runs: the leases of
attempts being adopted are followed, the rest released.
"""
from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import (  # Ray comes in as a ModuleType (imported once a cluster is reached): what it returns is Any
    Any,
    ClassVar,
)

from ...core import Executor, Queued, SlotPool
from ...core.events import Post
from ...core.slots import Devices
from ...errors import UserError
from ...files import write_atomic
from ...jsonvalues import JSON
from ...ledger.store import Attempt, Ledger, SweepMeta
from ...spec import Sweep
from ...spec.hostfile import HOSTFILE, format_hostfile
from ...spec.metrics import metric_named
from ...states import State
from ..base import Admit, Given, HostsCheck, MemoryReading, admit_all, recorded, write_record
from ..cluster import Cluster
from ..flags import Declared, routed
from ..launch import Launcher
from ..recovery import as_it_ran
from .ask import check, nodes_check, ray_cluster, ray_nodes
from .connect import MESSAGES, RAY_LOG, address_of, connect, is_connected, owned, source_of
from .executor import RayExecutor
from .leases import Lease, Leases, in_ray
from .nodes import RayNode, cluster_of, read_nodes, record_of
from .options import DECLARED, RayGiven
from .watch import NodeWatcher

SEEN_WITHIN = 60.0  # seconds for every node to say whether it sees the results directory
ASK_AGAIN = 0.5  # seconds before a node Ray lists alive, whose task it could not place, is asked again


class RayBackend:
    """Attempts on the Ray cluster at `address` (None: as the sweep recorded, else RAY_ADDRESS, else auto)."""

    kind: ClassVar[str] = "ray"
    declared: ClassVar[Declared] = DECLARED

    @classmethod
    def named(cls, given: Given, record: SweepMeta | None) -> bool:
        return routed(RayGiven, given).ray is not None or recorded(record, cls.kind) is not None

    @classmethod
    def check(cls, given: Given, command: str) -> None:
        if command != "hosts":  # `hosts --ray` shows the cluster's nodes whatever else is given
            check(routed(RayGiven, given).ray, given)

    @classmethod
    def held(cls, given: Given, recorded: Mapping[str, JSON] | None, log: Callable[[str], None],
             not_given_back: Callable[[str], None] | None) -> AbstractContextManager[Given]:
        return _connection_held(given) if routed(RayGiven, given).ray is not None else contextlib.nullcontext(given)

    @classmethod
    def opened(cls, directory: Path, ledger: Ledger, given: Given, *, grace: float,
               log: Callable[[str], None]) -> RayBackend:
        return cls(directory, ledger, routed(RayGiven, given).ray or None, grace=grace, log=log)

    @classmethod
    def cluster(cls, given: Given, *, sweep: Sweep | None = None, log: Callable[[str], None] | None = None) -> Cluster:
        return ray_cluster(routed(RayGiven, given).ray or "")

    @classmethod
    def planned(cls, given: Given, sweep: Sweep, log: Callable[[str], None]) -> Cluster:
        return cls.cluster(given, sweep=sweep, log=log)  # the cluster as it is: nothing is asked of it

    @classmethod
    def hosts(cls, given: Given) -> HostsCheck:
        with owned():  # nothing runs after the check: a connection made for it is shut (a program's own is kept)
            return nodes_check(*ray_nodes(routed(RayGiven, given).ray or ""))

    def __init__(self, directory: Path, ledger: Ledger, address: str | None = None, *, grace: float = 10.0,
                 log: Callable[[str], None] = lambda line: None):
        self.directory, self.ledger, self.grace, self.log = directory, ledger, grace, log
        self.given = address  # read with the sweep's record by `target`, when the cluster is first reached
        self._target: tuple[str, str] | None = None
        self._ray: ModuleType | None = None
        self._owns = False  # whether `ray` made the connection (else it is its maker's to shut: `held`, a program)
        self._leases: Leases | None = None
        self._attached: RayAttached | None = None
        self._closed = False
        self._found: dict[str, Lease] | None = None  # what a dead runner left, by attempt (for `end` alone)
        self._nodes: list[RayNode] | None = None  # the live nodes as `reach` read them
        self._lost: dict[str, str] = {}  # host -> why: nodes that died (or were dying) as `reach` asked them

    @property
    def address(self) -> str:
        """The cluster's address: the one given, else the one the sweep recorded, else RAY_ADDRESS, else auto."""
        return self.target()[0]

    def target(self) -> tuple[str, str]:
        """The address to reach and where it comes from (as a refusal names it), read once from the options given
        and the sweep's record: the constructor reads nothing."""
        if self._target is None:
            known = (recorded(self.ledger.meta(), self.kind) or {}).get("address")
            address = self.given or (str(known) if known else None) or address_of(None)
            source = source_of(self.given) if self.given or not known else "the Ray address the sweep recorded"
            self._target = address, source
        return self._target

    def ray(self) -> ModuleType:
        """Ray, this process connected to the sweep's cluster on first use (`close` shuts a connection made
        here; one the process held already is its maker's)."""
        if self._ray is None:
            address, source = self.target()
            self._owns = not is_connected()
            self._ray = connect(address, self.directory, source)
        return self._ray

    def leases(self) -> Leases:
        if self._leases is None:
            self._leases = Leases(self.ray(), self.ledger.meta().sweep_id)
        return self._leases

    def reach(self, *, to_run: bool = True) -> None:
        """Before the sweep's lock is taken: the cluster reached, read and checked to share the results directory
        (a UserError, with nothing of the sweep written, when the sweep cannot run there). A node that dies or is
        dying meanwhile is a lost host (left out at `ready`), never a failure of the check. `to_run=False`: only
        connected (`end` asks Ray what a dead runner left; a cluster with no GPU left can still have it)."""
        ray = self.ray()
        if not to_run:
            return
        nodes = read_nodes(ray.nodes())
        if not cluster_of(nodes).slots:
            raise UserError(f"the Ray cluster at {self.address} has no live node with a GPU", self.directory)
        unseen, lost = sharing(self.ray(), [n for n in nodes if n.gpus > 0], self.directory)
        if unseen:
            raise UserError(f"node(s) {', '.join(unseen)} of the Ray cluster at {self.address} do not see this "
                            "results directory (each node's launcher writes its logs there, the first node the "
                            "metrics): put it on storage the nodes share (NFS, a shared volume of the pods)",
                            self.directory)
        if not [n for n in nodes if n.gpus > 0 and n.host not in lost]:
            raise UserError(f"the Ray cluster at {self.address} has no live node with a GPU (" + "; ".join(
                f"{host}: {why}" for host, why in lost.items()) + ")", self.directory)
        self._nodes, self._lost = nodes, lost

    def admit(self, slots: SlotPool, waiting: Sequence[Queued]) -> Admit:
        return admit_all  # every node is reached through Ray, none over ssh

    def attach(self) -> RayAttached:
        """Holding the lock: the cluster `reach` read recorded (the nodes found lost too, marked down at
        `ready`: an attempt a dead runner left on one is adopted, and found lost)."""
        if self._nodes is None:
            self.reach()
        nodes = self._nodes or []
        meta = self.ledger.meta()
        cluster = _with_gone(cluster_of(nodes), meta, self.ledger.in_state(State.RUNNING))
        self._lost.update(dict.fromkeys(set(cluster.slots) - {n.host for n in nodes}, "Ray no longer lists the node"))
        record = record_of(self.address, nodes)
        MESSAGES.to(self.directory / RAY_LOG)  # the lock held: what Ray says from now on is the sweep's to keep
        if recorded(meta, self.kind) != record or dict(meta.slots) != dict(cluster.slots):
            for key, value in (("slots", {h: list(ids) for h, ids in cluster.slots.items()}),
                               ("capacity", dict(cluster.capacity)), ("gpu_types", dict(cluster.types)),
                               ("gpu_memory", dict(cluster.memory))):
                self.ledger.set_meta(key, value)
            write_record(self.ledger, self.kind, record)
            write_atomic(self.directory / HOSTFILE, format_hostfile(dict(cluster.capacity)))
        self._attached = RayAttached(self, self._lost)
        return self._attached

    def end(self, attempt: Attempt) -> None:
        """The actors and placement group that run the attempt ended (its nodes' launchers first, within the
        grace period), for `recovery.recover` (a cancel with no runner alive)."""
        if self._found is None:
            self._found, mute, orphans = in_ray(self.ray(), self.ledger.meta().sweep_id)
            for silent in mute:
                self.leases().release(silent, self.grace)
            self.remove_groups(orphans)
        found = self._found.pop(attempt.tag, None) if attempt.tag else None
        if found is not None:
            self.leases().release(found, self.grace)

    def recorded_code(self, attempt: Attempt, status: int, directory: Path) -> int:
        return as_it_ran(attempt, status, directory)

    def give_back(self) -> str | None:
        """Nothing here: `close` releases what the sweep holds in Ray (its leases), runner or not."""
        return None

    def close(self) -> None:
        """The executor (every attempt has ended; its idle leases released), the node watcher, what a dead
        runner left that `end` did not (a cancel with no runner: nothing of the sweep runs any more), then the
        connection to Ray when `ray` made it. Once: a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        with contextlib.ExitStack() as stack:
            stack.callback(MESSAGES.to, None)
            if self._ray is not None and self._owns:
                stack.callback(self._ray.shutdown)
            if self._found:
                stack.callback(self._release_found)
            if self._attached is not None:
                stack.callback(self._attached.close)

    def _release_found(self) -> None:
        found, self._found = self._found or {}, {}
        for lease in found.values():
            self.leases().release(lease, self.grace)

    def remove_groups(self, groups: Sequence[Any]) -> None:
        """Placement groups of the sweep whose actors are gone, removed."""
        for group in groups:
            with contextlib.suppress(Exception):
                self.ray().util.remove_placement_group(group)


@contextlib.contextmanager
def _connection_held(given: Given) -> Iterator[Given]:
    """`held` with `--ray`: the connection the command makes to read the cluster (`cluster`) and runs on, owned
    by the block and shut at its end (see `connect.owned`)."""
    with owned():
        yield given


class RayAttached:
    """A sweep attached to its Ray cluster (`RayBackend.attach`): the members that run it (base.Attached), on its
    backend's connection and leases. What they open (the executor, the node watcher), it owns; its backend's
    `close` closes it first."""

    def __init__(self, backend: RayBackend, lost: dict[str, str]):
        self.backend, self.lost = backend, lost  # lost: host -> why, the nodes that died as `reach` asked them
        self.ledger, self.grace, self.log = backend.ledger, backend.grace, backend.log
        self._executor: RayExecutor | None = None
        self._watcher: NodeWatcher | None = None

    def read_memory(self, placement: str, devices: Devices) -> MemoryReading:
        """Nothing is read: Ray hands each attempt whole GPUs; a GPU's type states its memory where known."""
        return MemoryReading()

    def executor(self, post: Post) -> Executor:
        meta = self.ledger.meta()
        nodes = dict((recorded(meta, self.backend.kind) or {}).get("nodes") or {})
        self._watcher = NodeWatcher(self.backend.ray, nodes, post)
        self._executor = RayExecutor(self.backend.ray(), self.backend.leases(), metric_named(meta.metric), time.time,
                                     Launcher(meta.launcher), dict(meta.env), self.grace, nodes=nodes,
                                     capacity=dict(meta.capacity), on_lost=self._watcher.watch)
        return self._executor

    def clear_strays(self, followed: Sequence[Attempt]) -> None:
        """The leases of attempts being adopted handed to the executor; every other lease, placement group and
        actor of this sweep in Ray (a dead runner's) released."""
        by_tag, mute, orphans = in_ray(self.backend.ray(), self.ledger.meta().sweep_id)
        keep = {a.tag for a in followed if a.tag}
        ended = [lease for tag, lease in by_tag.items() if tag not in keep] + mute
        for lease in ended:
            self.backend.leases().release(lease, self.grace)
        self.backend.remove_groups(orphans)
        if self._executor is not None:
            self._executor.adoptable.update({tag: lease for tag, lease in by_tag.items() if tag in keep})
        if ended or orphans:
            self.log(f"{len(ended) + len(orphans)} lease(s) a dead runner left in the Ray cluster that no runner "
                     "follows any more: their actors and placement groups ended")

    def ready(self, slots: SlotPool, post: Post) -> None:
        """Nodes the sweep recorded that Ray no longer lists alive, or that died as `reach` asked them, are left
        out (and watched: back when Ray lists them alive)."""
        if self._watcher is not None:
            dead = dict.fromkeys(self._watcher.dead_now(), "Ray reports the node dead") | self.lost
            for host, why in dead.items():
                if host in slots.hosts:
                    self.log(f"node {host} left out: {why}")
                    slots.mark_down(host)
                    self._watcher.watch(host)

    def close(self) -> None:
        """The executor (every attempt has ended; its idle leases released), then the node watcher."""
        closing: list[RayExecutor | NodeWatcher | None] = [self._executor, self._watcher]
        with contextlib.ExitStack() as stack:
            for resource in reversed([r for r in closing if r is not None]):
                stack.callback(resource.close)


def _with_gone(cluster: Cluster, meta: SweepMeta, running: Sequence[Attempt]) -> Cluster:
    """The live nodes' cluster, and the recorded hosts a dead runner's attempts still run on that Ray lists no
    more (it declared them dead while no runner was alive): kept, so that those attempts are adopted and found
    lost with their host, as under a runner, rather than taken for attempts on slots not the sweep's."""
    gone = {h: meta.slots[h] for a in running for h in a.slots if h in meta.slots and h not in cluster.slots}
    if not gone:
        return cluster
    return replace(cluster, slots={**cluster.slots, **gone},
                   capacity={**cluster.capacity, **{h: meta.capacity.get(h, len(ids)) for h, ids in gone.items()}},
                   types={**cluster.types, **{h: t for h in gone if (t := (meta.gpu_types or {}).get(h))}},
                   memory={**cluster.memory, **{h: m for h in gone if (m := (meta.gpu_memory or {}).get(h))}})


def sharing(ray: ModuleType, nodes: Sequence[RayNode], directory: Path) -> tuple[list[str], dict[str, str]]:
    """The nodes that do not see a file written in `directory` now (each asked by a task pinned to it), and those
    that died, or did not answer within SEEN_WITHIN seconds, as they were asked (host -> why). Ray lists a dead
    node alive for some seconds (its task then waits, and fails once Ray declares it dead), and a node that has
    just joined before its scheduler knows it (its task fails at once while Ray lists it alive: asked again)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from . import node

    ray.cloudpickle.register_pickle_by_value(node)
    probe = directory / f".autotune-shared-{secrets.token_hex(4)}"
    probe.write_text("")
    sees = ray.remote(node.sees)

    def ask(n: RayNode) -> Any:
        return sees.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n.id, soft=False)) \
            .remote(str(probe.resolve()))

    unseen: list[str] = []
    lost: dict[str, str] = {}
    end = time.monotonic() + SEEN_WITHIN
    try:
        asks = {ask(n): n for n in nodes}
        while asks:
            ready, _ = ray.wait(list(asks), num_returns=1, timeout=max(0.0, end - time.monotonic()))
            if not ready:
                break
            n = asks.pop(ready[0])
            try:
                if not ray.get(ready[0]):
                    unseen.append(n.host)
            except ray.exceptions.RayError as e:
                if time.monotonic() < end and n.id in {m["NodeID"] for m in ray.nodes() if m["Alive"]}:
                    time.sleep(ASK_AGAIN)
                    asks[ask(n)] = n
                else:
                    lost[n.host] = f"lost as it was asked ({type(e).__name__})"
        for pending, n in asks.items():
            lost[n.host] = f"did not answer within {SEEN_WITHIN:g} s"
            with contextlib.suppress(Exception):
                ray.cancel(pending, force=True)
        return unseen, lost
    finally:
        probe.unlink(missing_ok=True)
