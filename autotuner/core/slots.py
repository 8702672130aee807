"""Slots: which GPU slots of which hosts are free (`SlotPool`: bookkeeping only: free slot ids per host,
all-or-nothing take and give back, hosts up or down, and an index of hosts by how many slots they have free, so
that a placement on 1,024 hosts reads a few buckets instead of every host), and what an experiment needs of
them: its GPU needs (type, memory), the devices (MIG instances) a slot may be (the headroom kept free on a GPU is
a GPU fact: gpu/types.py).
"""
from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


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
    slots, for c >= 1 (a full host is never looked for: filing it only cost every take and give-back of a busy
    cluster's whole nodes); `_counts` the sorted counts whose bucket is not empty.
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
        if not count:
            return
        bucket = self._by_free.get(count)
        if bucket is None:
            bucket = self._by_free[count] = []
            bisect.insort(self._counts, count)
        bisect.insort(bucket, self._index[host])

    def _unfile(self, host: str) -> None:
        count = len(self._free[host])
        if not count:
            return
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
        return bool(self._counts)

    def can_take(self, reservation: Reservation) -> bool:
        """Whether every slot of `reservation` is one of this pool's, on a host that is up, and free."""
        free, down = self._free, self._down  # a loop, not all(genexpr): called for every run placed
        for host, ids in reservation.slots:
            if host in down or host not in free or not free[host].issuperset(ids):
                return False
        return True

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


