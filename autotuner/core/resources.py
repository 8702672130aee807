"""Slots: which GPU slots of which hosts are free, and the small policies that hand them out.

Three narrow pieces, each replaceable on its own:
- `SlotPool` is bookkeeping only: free slot ids per host, all-or-nothing take and give back, hosts up or down,
  and an index of hosts by how many slots they have free, so that a placement on 1,024 hosts reads a few
  buckets instead of every host.
- A placement (`Pack`, `Spread`) decides *where* one experiment goes, given the pool.
- A queue policy (`BackfillQueue`; `fifo` is the same with no overtaking) decides *which* waiting experiments
  start now.

The queue policy, in full: experiments start in queue order. One that does not fit right now is passed over
so that smaller ones behind it can use slots that would otherwise sit idle (backfill). Each time the oldest
waiting experiment of a kind (its node and slot counts) is overtaken, its bypass count grows; once it reaches
`max_bypass`, nothing behind it may start until it has started. Running experiments always finish, so the
slots it needs come free and it cannot starve; small experiments keep the rest of the machine busy meanwhile.
An experiment that needs more than the hosts now up could give (some are down) holds nothing: it waits for a
host to come back.

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
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


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
        self._fits: dict[tuple[int, int, bool], bool] = {}
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

    def could_fit(self, num_nodes: int, num_gpus: int, *, up_only: bool = False) -> bool:
        """Whether the experiment fits on this pool when every slot is free."""
        key = (num_nodes, num_gpus, up_only)
        known = self._fits.get(key)
        if known is None:
            hosts = [h for h in self._all if not (up_only and h in self._down)]
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
    """What a placement reads of the pool (a `SlotPool`, or a view of one that hides some hosts)."""

    def fitting(self, num_gpus: int, *, fewest_first: bool = True) -> Iterator[str]: ...

    def free_ids(self, host: str) -> list[int]: ...

    def order(self, host: str) -> int: ...


class Placement(Protocol):
    """Chooses slots for one experiment among the free ones, or None if it does not fit now. It must be
    monotone: what does not fit does not fit on fewer free slots either (the queue relies on it)."""

    def place(self, pool: Slots, demand: Demand) -> Reservation | None: ...


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


PLACEMENTS: dict[str, Callable[[], Placement]] = {"pack": Pack, "spread": Spread}


D = TypeVar("D", bound=Demand)


def shape(item: Demand) -> Hashable:
    """The kind of an item for the queue: items of one kind fit (or not) alike."""
    return (item.num_nodes, item.num_gpus)


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
                if not pool.could_fit(item.num_nodes, item.num_gpus, up_only=True):
                    continue  # it needs hosts that are down: it waits for them and holds nothing meanwhile
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
