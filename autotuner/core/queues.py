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
