"""Placements: *where* one experiment goes, given the slot pool (slots.py). `Pack` (best fit), `Spread` and
`GpuMemory` (only GPUs with room for its memory need, by free memory read when placing); `ByType` wraps one to
keep each experiment on one GPU type; `placement_named` builds the one a cluster needs. Small pieces handed to
the scheduler, each replaceable on its own.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..gpu.types import headroom
from ..limits import GiB
from .slots import Demand, Devices, GpuNeed, Only, Placement, Reservation, Slots, need_of, takes_one_gpu


def _reserve(pool: Slots, hosts: list[str], num_gpus: int) -> Reservation:
    hosts.sort(key=pool.order)
    return Reservation(tuple((h, tuple(pool.free_ids(h)[:num_gpus])) for h in hosts))


@dataclass(frozen=True)
class Pack:
    """Each node of the experiment goes to the host with the fewest free slots that still fit (best fit).

    Packing keeps large holes open for large experiments; ties go to hostfile order, then low slot ids.
    """

    name: str = "pack"

    def place(self, pool: Slots, demand: Demand) -> Reservation | None:
        hosts = list(itertools.islice(pool.fitting(demand.num_gpus), demand.num_nodes))
        if len(hosts) < demand.num_nodes:
            return None
        return _reserve(pool, hosts, demand.num_gpus)

    def could_fit(self, pool: Slots, demand: Demand) -> bool:
        return pool.could_fit(demand.num_nodes, demand.num_gpus, up_only=True)


@dataclass(frozen=True)
class Spread:
    """Each node of the experiment goes to the host with the most free slots: runs share hosts (PCIe, host
    memory, NICs) as little as they can, at the cost of holes that large experiments cannot use."""

    name: str = "spread"

    def place(self, pool: Slots, demand: Demand) -> Reservation | None:
        hosts = list(itertools.islice(pool.fitting(demand.num_gpus, fewest_first=False), demand.num_nodes))
        if len(hosts) < demand.num_nodes:
            return None
        return _reserve(pool, hosts, demand.num_gpus)

    def could_fit(self, pool: Slots, demand: Demand) -> bool:
        return pool.could_fit(demand.num_nodes, demand.num_gpus, up_only=True)


FreeMemory = Callable[[str], Mapping[int, int] | None]
"""Free bytes of each GPU (by slot id) of one host, read now; None where the host is not measured."""


@dataclass(frozen=True)
class GpuMemory:
    """Best fit, as `Pack`, on the GPUs that hold the experiment's memory need (`gpu_memory`) less a margin
    (`headroom`): the free memory `measure` reads now where it reads the host (this machine: NVML, so other
    users' processes count), else the size of the host's GPU type (`sizes`); a host of unknown size is not
    checked. Experiments that state no need are placed as by `Pack`.

    A GPU that a run of the sweep holds is not free in the pool from the moment the run is placed until it has
    ended, so a run that has not allocated its memory yet is never counted as room (slot id = GPU index, or for
    a MIG instance its own slot id, with its own size in `devices`)."""

    sizes: Mapping[str, int] = field(default_factory=dict)
    measure: FreeMemory | None = None
    name: str = "memory"
    devices: Devices = field(default_factory=dict)

    def place(self, pool: Slots, demand: Demand) -> Reservation | None:
        need = need_of(demand).memory
        if not need:
            return Pack().place(pool, demand)
        chosen: dict[str, list[int]] = {}
        for host in pool.fitting(demand.num_gpus):
            ids = self._holding(host, pool.free_ids(host), need)
            if len(ids) >= demand.num_gpus:
                chosen[host] = ids[:demand.num_gpus]
                if len(chosen) == demand.num_nodes:
                    return Reservation.of({h: chosen[h] for h in sorted(chosen, key=pool.order)})
        return None

    def could_fit(self, pool: Slots, demand: Demand) -> bool:
        need = need_of(demand).memory
        if not pool.could_fit(demand.num_nodes, demand.num_gpus, up_only=True):
            return False
        if not need:
            return True
        hosts = (h for h in pool.hosts if not pool.is_down(h))
        holding = (h for h in hosts if len(self._holding(h, sorted(pool.slot_ids(h)), need)) >= demand.num_gpus)
        return len(list(itertools.islice(holding, demand.num_nodes))) == demand.num_nodes

    def _holding(self, host: str, ids: list[int], need: int) -> list[int]:
        """Those of `ids` whose GPU has room for `need` bytes."""
        free = self.measure(host) if self.measure is not None else None
        own = self.devices.get(host)
        if not own:  # every GPU of the host alike: one size (the common case, kept quick for `plan` at scale)
            size = self.sizes.get(host)
            if free is None:
                return ids if size is None or size - headroom(size) >= need else []
            margin = headroom(size) if size is not None else GiB
            return [i for i in ids if free.get(i, 0) - margin >= need]
        held = []
        for i in ids:
            device = own.get(i)
            size = device.memory if device is not None else self.sizes.get(host)
            if free is None:
                fits = size is None or size - headroom(size) >= need
            else:
                fits = free.get(i, 0) - (headroom(size) if size is not None else GiB) >= need
            if fits:
                held.append(i)
        return held


PLACEMENTS: dict[str, Callable[[], Placement]] = {"pack": Pack, "spread": Spread, "memory": GpuMemory}


@dataclass(frozen=True)
class _TypeGroup:
    gpu_type: str | None
    hosts: frozenset[str]
    size: int | None  # memory of its smallest GPU; None: not known for every host
    slots: Mapping[str, frozenset[int]]  # of hosts whose slots are of several types: this type's
    mig: bool = False  # MIG instances: one GPU on one node only


_Part = tuple[frozenset[str], Mapping[str, frozenset[int]]]  # hosts, and the slots of those restricted


class ByType:
    """A placement kept to one GPU type per experiment: it places on one type's slots at a time, types in
    hostfile order, and the first that fits wins. Pinned (`gpu_type`): only that type; `mixed`: every slot at
    once. Hosts of no known type are one more type. A type whose GPUs are smaller than an experiment's memory
    need (less the headroom) is never tried, whatever the placement inside. The slots of a host that are
    `devices` of their own type (MIG instances beside whole GPUs) are their type's; MIG instances are offered
    to experiments of one GPU on one node only, mixed or not."""

    def __init__(self, placement: Placement, types: Mapping[str, str | None], sizes: Mapping[str, int] | None = None,
                 devices: Devices | None = None, slots: Mapping[str, Iterable[int]] | None = None):
        sizes, devices, slots = sizes or {}, devices or {}, slots or {}
        self.placement = placement
        self.name = getattr(placement, "name", type(placement).__name__)
        members: dict[tuple[str | None, bool], dict[str, set[int] | None]] = {}
        smallest: dict[tuple[str | None, bool], list[int | None]] = {}
        for host, gpu_type in types.items():  # every host of the pool, in hostfile order
            own = devices.get(host, {})
            plain = [i for i in slots.get(host, ()) if i not in own] if own else []
            if not own or plain:
                members.setdefault((gpu_type, False), {})[host] = set(plain) if own else None
                smallest.setdefault((gpu_type, False), []).append(sizes.get(host))
            for i, device in sorted(own.items()):
                key = (device.gpu_type, device.mig is not None)
                ids = members.setdefault(key, {}).setdefault(host, set())
                assert ids is not None
                ids.add(i)
                smallest.setdefault(key, []).append(device.memory)
        self._groups = [_TypeGroup(t, frozenset(hosts), _smallest(smallest[(t, mig)]),
                                   {h: frozenset(ids) for h, ids in hosts.items() if ids is not None}, mig)
                        for (t, mig), hosts in members.items()]
        self._every = frozenset(types)
        self._views: dict[tuple[GpuNeed, bool], list[_Part]] = {}

    def place(self, pool: Slots, demand: Demand) -> Reservation | None:
        for part in self._choices(need_of(demand), takes_one_gpu(demand)):
            found = self.placement.place(self._view(pool, part), demand)
            if found is not None:
                return found
        return None

    def could_fit(self, pool: Slots, demand: Demand) -> bool:
        return any(self.placement.could_fit(self._view(pool, part), demand)
                   for part in self._choices(need_of(demand), takes_one_gpu(demand)))

    def _choices(self, need: GpuNeed, one_gpu: bool) -> list[_Part]:
        """The slot sets to try, in order: each type's that may hold the need (all of them at once if mixed)."""
        known = self._views.get((need, one_gpu))
        if known is None:
            groups = [g for g in self._groups
                      if (need.gpu_type is None or g.gpu_type == need.gpu_type) and (one_gpu or not g.mig)
                      and not (need.memory and g.size is not None and g.size - headroom(g.size) < need.memory)]
            parts = [(g.hosts, g.slots) for g in groups]
            if need.mixed and need.gpu_type is None and groups:
                parts = [_union(groups)]
            # Every host: the very set `_view` looks for (by identity, not by comparing 1,024 names each time).
            known = self._views[(need, one_gpu)] = [(self._every if hosts == self._every else hosts, slots)
                                                    for hosts, slots in parts]
        return known

    def _view(self, pool: Slots, part: _Part) -> Slots:
        hosts, slots = part
        return pool if hosts is self._every and not slots else Only(pool, hosts, slots)


def _union(groups: Sequence[_TypeGroup]) -> _Part:
    """The slots of several types as one part: a host is restricted only where every group restricts it."""
    hosts = frozenset().union(*(g.hosts for g in groups))
    slots: dict[str, frozenset[int]] = {}
    for host in hosts:
        parts = [g.slots.get(host) for g in groups if host in g.hosts]
        if all(p is not None for p in parts):
            slots[host] = frozenset().union(*(p for p in parts if p is not None))
    return hosts, slots


def _smallest(sizes: Sequence[int | None]) -> int | None:
    return None if any(s is None for s in sizes) else min(s for s in sizes if s is not None)


def placement_named(name: str, types: Mapping[str, str | None] | None = None, sizes: Mapping[str, int] | None = None,
                    measure: FreeMemory | None = None, devices: Devices | None = None,
                    slots: Mapping[str, Iterable[int]] | None = None) -> Placement:
    """The placement of that name (PLACEMENTS) for a cluster: kept to one GPU type at a time (ByType) where
    `types` (host -> type, every host) knows any or some slots are `devices` of their own (then `slots`, every
    host's slot ids, says which are not); `sizes` (memory per GPU by host), the devices' own and `measure` (free
    memory now) are what `memory` places by."""
    base = GpuMemory(dict(sizes or {}), measure, devices=dict(devices or {})) if name == "memory" \
        else PLACEMENTS[name]()
    if not devices and (not types or all(t is None for t in types.values())):
        return base
    return ByType(base, types or {}, sizes, devices, slots)


