"""Slots: which GPU slots of which hosts are free, and the small policies that hand them out.

Three narrow pieces, each replaceable on its own:
- `SlotPool` is bookkeeping only: free slot ids per host, all-or-nothing take and give back, hosts up or down,
  and an index of hosts by how many slots they have free, so that a placement on 1,024 hosts reads a few
  buckets instead of every host.
- A placement (`Pack`, `Spread`, `GpuMemory`) decides *where* one experiment goes, given the pool; `ByType`
  wraps one to keep each experiment on one GPU type.
- A queue policy (`BackfillQueue`; `fifo` is the same with no overtaking) decides *which* waiting experiments
  start now.

The queue policy, in full: experiments start in queue order. One that does not fit right now is passed over
so that smaller ones behind it can use slots that would otherwise sit idle (backfill). Each time the oldest
waiting experiment of a kind (its node and slot counts and its GPU needs: type, memory) is overtaken, its
bypass count grows; once it reaches `max_bypass`, nothing behind it may start until it has started. Running
experiments always finish, so the slots it needs come free and it cannot starve; small experiments keep the rest
of the machine busy meanwhile. An experiment that needs more than the hosts now up could give (some are down, or
their GPUs lack the memory it needs) holds nothing: it waits for a host to come back.

Experiments of one kind are interchangeable for fitting: once one does not fit, none behind it of the same kind
does in the same pass (the pool only shrinks while a pass places). So the queue keeps one line per kind and a
pass looks at the head of each line: its cost grows with the number of kinds, not with the queue's length.
"""
from __future__ import annotations

import bisect
import heapq
import itertools
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from ..limits import GiB


@dataclass(frozen=True)
class Reservation:
    """Exact slot ids on each host of one experiment, in host order."""

    slots: tuple[tuple[str, tuple[int, ...]], ...]

    @classmethod
    def of(cls, slots: Mapping[str, Iterable[int]]) -> Reservation:
        return cls(tuple((host, tuple(sorted(ids))) for host, ids in slots.items()))

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(host for host, _ in self.slots)

    @property
    def size(self) -> int:
        return sum(len(ids) for _, ids in self.slots)

    def as_dict(self) -> dict[str, list[int]]:
        return {host: list(ids) for host, ids in self.slots}


class SlotPool:
    """Free slot ids per host. Takes and gives back whole reservations, never parts of one.

    `_by_free[c]` holds, in host order (as hostfile indices), the hosts that are up and have exactly `c` free
    slots; `_counts` the sorted counts whose bucket is not empty.
    """

    def __init__(self, hosts: Mapping[str, Sequence[int]]):
        self._all = {host: frozenset(ids) for host, ids in hosts.items()}
        self._free = {host: set(ids) for host, ids in hosts.items()}
        self._index = {host: i for i, host in enumerate(hosts)}
        self._names = list(hosts)
        self._down: set[str] = set()
        self._by_free: dict[int, list[int]] = {}
        self._counts: list[int] = []
        self._fits: dict[tuple[int, int, bool, frozenset[str] | None], bool] = {}
        for host in self._names:
            self._file(host)

    # --- the index ----------------------------------------------------------------------------------------
    def _file(self, host: str) -> None:
        count = len(self._free[host])
        bucket = self._by_free.get(count)
        if bucket is None:
            bucket = self._by_free[count] = []
            bisect.insort(self._counts, count)
        bisect.insort(bucket, self._index[host])

    def _unfile(self, host: str) -> None:
        count = len(self._free[host])
        bucket = self._by_free[count]
        del bucket[bisect.bisect_left(bucket, self._index[host])]
        if not bucket:
            del self._by_free[count]
            del self._counts[bisect.bisect_left(self._counts, count)]

    # --- reading ------------------------------------------------------------------------------------------
    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(self._all)

    def capacity(self, host: str) -> int:
        return len(self._all[host])

    def free(self) -> dict[str, frozenset[int]]:
        """Free slots of the hosts that are up, in host order."""
        return {h: frozenset(ids) for h, ids in self._free.items() if h not in self._down}

    def free_ids(self, host: str) -> list[int]:
        """The free slot ids of one host, lowest first."""
        return sorted(self._free[host])

    def order(self, host: str) -> int:
        """The host's place in the hostfile: placements list a reservation's hosts in this order."""
        return self._index[host]

    def fitting(self, num_gpus: int, *, fewest_first: bool = True) -> Iterator[str]:
        """Hosts that are up with at least `num_gpus` free slots: fewest free first (or most), then host order."""
        start = bisect.bisect_left(self._counts, max(num_gpus, 1))
        counts = self._counts[start:] if fewest_first else reversed(self._counts[start:])
        for count in counts:
            for index in self._by_free[count]:
                yield self._names[index]

    def count_fitting(self, num_gpus: int) -> int:
        """How many hosts that are up have at least `num_gpus` free slots."""
        start = bisect.bisect_left(self._counts, max(num_gpus, 1))
        return sum(len(self._by_free[c]) for c in self._counts[start:])

    def free_count(self) -> int:
        """Free slots on the hosts that are up."""
        return sum(count * len(self._by_free[count]) for count in self._counts)

    def any_free(self) -> bool:
        return bool(self._counts) and self._counts[-1] > 0

    def can_take(self, reservation: Reservation) -> bool:
        """Whether every slot of `reservation` is one of this pool's, on a host that is up, and free."""
        return all(host in self._free and host not in self._down and self._free[host].issuperset(ids)
                   for host, ids in reservation.slots)

    def slot_ids(self, host: str) -> frozenset[int]:
        """Every slot id of a host, free or not."""
        return self._all[host]

    def could_fit(self, num_nodes: int, num_gpus: int, *, up_only: bool = False,
                  among: frozenset[str] | None = None) -> bool:
        """Whether the experiment fits on this pool (on its hosts `among`, when given) when every slot is free."""
        key = (num_nodes, num_gpus, up_only, among)
        known = self._fits.get(key)
        if known is None:
            hosts = [h for h in self._all if not (up_only and h in self._down) and (among is None or h in among)]
            known = self._fits[key] = sum(1 for h in hosts if len(self._all[h]) >= num_gpus) >= num_nodes
        return known

    # --- changing -----------------------------------------------------------------------------------------
    def take(self, reservation: Reservation) -> None:
        if not self.can_take(reservation):
            raise ValueError(f"slots {reservation.as_dict()} are not free")
        for host, ids in reservation.slots:
            self._unfile(host)
            self._free[host].difference_update(ids)
            self._file(host)

    def give_back(self, reservation: Reservation) -> None:
        for host, ids in reservation.slots:
            up = host not in self._down
            if up:
                self._unfile(host)
            self._free[host].update(ids)
            if up:
                self._file(host)

    def mark_down(self, host: str) -> None:
        if host not in self._down:
            self._unfile(host)
            self._down.add(host)
            self._fits.clear()

    def mark_up(self, host: str) -> None:
        if host in self._down:
            self._down.discard(host)
            self._file(host)
            self._fits.clear()

    def is_down(self, host: str) -> bool:
        return host in self._down


class Demand(Protocol):
    """What placement and the queue need to know of a waiting item."""

    @property
    def num_nodes(self) -> int: ...

    @property
    def num_gpus(self) -> int: ...


class Slots(Protocol):
    """What a placement reads of the pool (a `SlotPool`, or a view of one that hides some hosts: `Only`)."""

    @property
    def hosts(self) -> tuple[str, ...]: ...

    def is_down(self, host: str) -> bool: ...

    def slot_ids(self, host: str) -> frozenset[int]: ...

    def fitting(self, num_gpus: int, *, fewest_first: bool = True) -> Iterator[str]: ...

    def free_ids(self, host: str) -> list[int]: ...

    def order(self, host: str) -> int: ...

    def could_fit(self, num_nodes: int, num_gpus: int, *, up_only: bool = False,
                  among: frozenset[str] | None = None) -> bool: ...


class Placement(Protocol):
    """Chooses slots for one experiment among the free ones, or None if it does not fit now. It must be
    monotone: what does not fit does not fit on fewer free slots either (the queue relies on it).

    `could_fit`: whether it would fit on the hosts that are up were all their slots free. What would not is
    skipped by the queue without holding anything back (it waits for hosts, or is failed when nothing runs)."""

    def place(self, pool: Slots, demand: Demand) -> Reservation | None: ...

    def could_fit(self, pool: Slots, demand: Demand) -> bool: ...


@dataclass(frozen=True)
class GpuNeed:
    """What an experiment asks of its GPUs beyond how many: one type (`gpu_type`; None: any), leave to span
    types (`mixed`), and memory on each GPU (bytes; None: nothing stated)."""

    gpu_type: str | None = None
    mixed: bool = False
    memory: int | None = None


NO_NEED = GpuNeed()


def need_of(demand: Demand) -> GpuNeed:
    """A demand's `gpu_need` (a `Queued` has one); a plain demand needs nothing beyond its slots."""
    need = getattr(demand, "gpu_need", None)
    return need if isinstance(need, GpuNeed) else NO_NEED




def headroom(size: int) -> int:
    """What is kept free on a GPU of `size` bytes beyond an experiment's stated need (CUDA's own context,
    allocator slack, a need stated a little low): 5% of it, at least 1 GiB."""
    return max(GiB, size // 20)


@dataclass(frozen=True)
class Device:
    """A slot unlike the other slots of its host: its own GPU type and memory (bytes, where known), and for a MIG
    instance its UUID. A CUDA process can use one MIG instance only, so a MIG slot takes only experiments of one
    GPU on one node."""

    gpu_type: str
    memory: int | None = None
    mig: str | None = None  # the MIG instance's UUID (`MIG-...`), what CUDA_VISIBLE_DEVICES names it by

    def to_json(self) -> dict[str, object]:
        return {k: v for k, v in (("gpu_type", self.gpu_type), ("memory", self.memory), ("mig", self.mig))
                if v is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Device:
        memory, mig = data.get("memory"), data.get("mig")
        return cls(str(data["gpu_type"]), memory if isinstance(memory, int) else None,
                   mig if isinstance(mig, str) else None)


def devices_to_json(devices: Mapping[str, Mapping[int, Device]]) -> dict[str, dict[str, dict[str, object]]]:
    """Devices as the ledger keeps them (JSON: slot ids as strings)."""
    return {h: {str(i): d.to_json() for i, d in own.items()} for h, own in devices.items()}


def devices_from_json(data: Mapping[str, Mapping[str, Mapping[str, object]]] | None) -> dict[str, dict[int, Device]]:
    return {h: {int(i): Device.from_json(d) for i, d in own.items()} for h, own in (data or {}).items()}


Devices = Mapping[str, Mapping[int, Device]]
"""host -> slot id -> Device, for the slots that differ from their host (hosts with all slots alike: absent)."""


def takes_one_gpu(demand: Demand) -> bool:
    """Whether a demand can run on a MIG instance: one GPU on one node."""
    return demand.num_nodes == 1 and demand.num_gpus == 1


@dataclass(frozen=True)
class Only:
    """The pool as a placement sees it when only the hosts `among` may be used (one GPU type, say), and of the
    hosts in `slots` only those slot ids (a host whose slots are of several types)."""

    pool: Slots
    among: frozenset[str]
    slots: Mapping[str, frozenset[int]] = field(default_factory=dict)

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(h for h in self.pool.hosts if h in self.among)

    def is_down(self, host: str) -> bool:
        return self.pool.is_down(host)

    def slot_ids(self, host: str) -> frozenset[int]:
        ids = self.pool.slot_ids(host)
        return ids & self.slots[host] if host in self.slots else ids

    def fitting(self, num_gpus: int, *, fewest_first: bool = True) -> Iterator[str]:
        return (h for h in self.pool.fitting(num_gpus, fewest_first=fewest_first)
                if h in self.among and (h not in self.slots or len(self.free_ids(h)) >= max(num_gpus, 1)))

    def free_ids(self, host: str) -> list[int]:
        ids = self.pool.free_ids(host)
        return [i for i in ids if i in self.slots[host]] if host in self.slots else ids

    def order(self, host: str) -> int:
        return self.pool.order(host)

    def could_fit(self, num_nodes: int, num_gpus: int, *, up_only: bool = False,
                  among: frozenset[str] | None = None) -> bool:
        hosts = self.among if among is None else self.among & among
        if not self.slots:
            return self.pool.could_fit(num_nodes, num_gpus, up_only=up_only, among=hosts)
        usable = (h for h in self.pool.hosts if h in hosts and not (up_only and self.pool.is_down(h))
                  and len(self.slot_ids(h)) >= num_gpus)
        return len(list(itertools.islice(usable, num_nodes))) == num_nodes


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
            known = self._views[(need, one_gpu)] = parts
        return known

    def _view(self, pool: Slots, part: _Part) -> Slots:
        hosts, slots = part
        return pool if hosts == self._every and not slots else Only(pool, hosts, slots)


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


D = TypeVar("D", bound=Demand)


def shape(item: Demand) -> Hashable:
    """The kind of an item for the queue: items of one kind fit (or not) alike, so its GPU needs are part of it."""
    return (item.num_nodes, item.num_gpus, need_of(item))


class BackfillQueue(Generic[D]):
    """Queue order with backfill and a bounded number of overtakes (see the module docstring)."""

    def __init__(self, max_bypass: int, kind: Callable[[D], Hashable] = shape, name: str = "backfill"):
        self.max_bypass = max_bypass
        self.name = name
        self._kind = kind
        self._lines: dict[Hashable, deque[tuple[int, D]]] = {}
        self._bypassed: dict[Hashable, int] = {}  # overtakes of each line's head
        self._back = itertools.count()
        self._front = itertools.count(-1, -1)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __iter__(self) -> Iterator[D]:
        """The waiting items in queue order."""
        return (item for _, item in heapq.merge(*self._lines.values(), key=lambda entry: entry[0]))

    def push(self, item: D) -> None:
        self._line(item).append((next(self._back), item))
        self._size += 1

    def push_front(self, item: D) -> None:
        """Re-queued work (a lost host's experiments) goes first: it has waited already."""
        self._line(item).appendleft((next(self._front), item))
        self._bypassed[self._kind(item)] = 0
        self._size += 1

    def _line(self, item: D) -> deque[tuple[int, D]]:
        kind = self._kind(item)
        line = self._lines.get(kind)
        if line is None:
            line = self._lines[kind] = deque()
            self._bypassed[kind] = 0
        return line

    def remove(self, match: Callable[[D], bool]) -> list[D]:
        """Drop the waiting items for which `match(item)` is true; returns them, in queue order."""
        gone: list[tuple[int, D]] = []
        for kind, line in list(self._lines.items()):
            keep = deque(entry for entry in line if not match(entry[1]))
            if len(keep) == len(line):
                continue
            gone += [entry for entry in line if match(entry[1])]
            if keep and keep[0] is not line[0]:
                self._bypassed[kind] = 0
            self._lines[kind] = keep
            if not keep:
                del self._lines[kind], self._bypassed[kind]
        self._size -= len(gone)
        return [item for _, item in sorted(gone, key=lambda entry: entry[0])]

    def select(self, pool: SlotPool, placement: Placement) -> list[tuple[D, Reservation]]:
        """Take from the pool, and return, every waiting item that starts now."""
        started: list[tuple[D, Reservation]] = []
        heads = [(line[0][0], kind) for kind, line in self._lines.items()]
        heapq.heapify(heads)
        blocked: list[Hashable] = []  # kinds whose head does not fit now, oldest first
        while heads and pool.any_free():
            _, kind = heapq.heappop(heads)
            line = self._lines[kind]
            item = line[0][1]
            # Every placement needs that many hosts with that many free slots: a cheap look at the index first.
            enough = pool.count_fitting(item.num_gpus) >= item.num_nodes
            reservation = placement.place(pool, item) if enough else None
            if reservation is None:
                if not placement.could_fit(pool, item):
                    continue  # it needs hosts that are down (or GPUs with more room): it holds nothing meanwhile
                blocked.append(kind)
                if self._bypassed[kind] >= self.max_bypass:
                    break  # it has been overtaken enough: what frees up next is held for it
                continue
            pool.take(reservation)
            started.append((item, reservation))
            line.popleft()
            self._size -= 1
            for earlier in blocked:
                self._bypassed[earlier] += 1
            if line:
                self._bypassed[kind] = 0
                heapq.heappush(heads, (line[0][0], kind))
            else:
                del self._lines[kind], self._bypassed[kind]
        return started


def fifo(kind: Callable[[Demand], Hashable] = shape) -> BackfillQueue:
    """Strict queue order: nothing overtakes the oldest waiting experiment."""
    return BackfillQueue(0, kind, name="fifo")
