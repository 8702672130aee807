"""Queue policies: *which* waiting experiments start now (`BackfillQueue`; `fifo` is the same with no
overtaking).

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

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

from .slots import Demand, Placement, Reservation, SlotPool, need_of

D = TypeVar("D", bound=Demand)


def shape(item: Demand) -> Hashable:
    """The kind of an item for the queue: items of one kind fit (or not) alike, so its GPU needs are part of it."""
    return (item.num_nodes, item.num_gpus, need_of(item))


class _Line(Generic[D]):
    """The waiting items of one kind, in queue order, and how often its head was overtaken. A pass keeps the
    lines themselves in its heap, so it never hashes a kind (a tuple holding a GpuNeed) per item it looks at."""

    __slots__ = ("bypassed", "items", "kind")

    def __init__(self, kind: Hashable):
        self.kind = kind
        self.items: deque[tuple[int, D]] = deque()
        self.bypassed = 0


class BackfillQueue(Generic[D]):
    """Queue order with backfill and a bounded number of overtakes (see the module docstring)."""

    def __init__(self, max_bypass: int, kind: Callable[[D], Hashable] = shape, name: str = "backfill"):
        self.max_bypass = max_bypass
        self.name = name
        self._kind = kind
        self._lines: dict[Hashable, _Line[D]] = {}
        self._back = itertools.count()
        self._front = itertools.count(-1, -1)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __iter__(self) -> Iterator[D]:
        """The waiting items in queue order."""
        return (item for _, item in heapq.merge(*(line.items for line in self._lines.values()),
                                                key=lambda entry: entry[0]))

    def push(self, item: D) -> None:
        self._line(item).items.append((next(self._back), item))
        self._size += 1

    def push_front(self, item: D) -> None:
        """Re-queued work (a lost host's experiments) goes first: it has waited already."""
        line = self._line(item)
        line.items.appendleft((next(self._front), item))
        line.bypassed = 0
        self._size += 1

    def _line(self, item: D) -> _Line[D]:
        kind = self._kind(item)
        line = self._lines.get(kind)
        if line is None:
            line = self._lines[kind] = _Line(kind)
        return line

    def remove(self, match: Callable[[D], bool]) -> list[D]:
        """Drop the waiting items for which `match(item)` is true; returns them, in queue order."""
        gone: list[tuple[int, D]] = []
        for kind, line in list(self._lines.items()):
            keep = deque(entry for entry in line.items if not match(entry[1]))
            if len(keep) == len(line.items):
                continue
            gone += [entry for entry in line.items if match(entry[1])]
            if keep and keep[0] is not line.items[0]:
                line.bypassed = 0
            line.items = keep
            if not keep:
                del self._lines[kind]
        self._size -= len(gone)
        return [item for _, item in sorted(gone, key=lambda entry: entry[0])]

    def select(self, pool: SlotPool, placement: Placement) -> list[tuple[D, Reservation]]:
        """Take from the pool, and return, every waiting item that starts now."""
        started: list[tuple[D, Reservation]] = []
        heads = [(line.items[0][0], line) for line in self._lines.values()]  # positions are unique: never a tie
        heapq.heapify(heads)
        blocked: list[_Line[D]] = []  # lines whose head does not fit now, oldest first
        while heads and pool.any_free():
            _, line = heapq.heappop(heads)
            item = line.items[0][1]
            # Every placement needs that many hosts with that many free slots: a cheap look at the index first.
            enough = pool.count_fitting(item.num_gpus) >= item.num_nodes
            reservation = placement.place(pool, item) if enough else None
            if reservation is None:
                if not placement.could_fit(pool, item):
                    continue  # it needs hosts that are down (or GPUs with more room): it holds nothing meanwhile
                blocked.append(line)
                if line.bypassed >= self.max_bypass:
                    break  # it has been overtaken enough: what frees up next is held for it
                continue
            pool.take(reservation)
            started.append((item, reservation))
            line.items.popleft()
            self._size -= 1
            for earlier in blocked:
                earlier.bypassed += 1
            if line.items:
                line.bypassed = 0
                heapq.heappush(heads, (line.items[0][0], line))
            else:
                del self._lines[line.kind]
        return started


def fifo(kind: Callable[[Demand], Hashable] = shape) -> BackfillQueue:
    """Strict queue order: nothing overtakes the oldest waiting experiment."""
    return BackfillQueue(0, kind, name="fifo")
