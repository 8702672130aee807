"""Slots: which GPU slots of which hosts are free, and the small policies that hand them out.

Three narrow pieces, each replaceable on its own:
- `SlotPool` is bookkeeping only: free slot ids per host, all-or-nothing take and give back, hosts up or down.
- A placement (`BestFit`) decides *where* one experiment goes, given the free slots.
- `BackfillQueue` decides *which* waiting experiments start now.

The queue policy, in full: experiments start in queue order. One that does not fit right now is passed over
so that smaller ones behind it can use slots that would otherwise sit idle (backfill). Each time a waiting
experiment is overtaken by one behind it, its bypass count grows; once it reaches `max_bypass`, nothing behind
it may start until it has started. Running experiments always finish, so the slots it needs come free and it
cannot starve; small experiments keep the rest of the machine busy meanwhile. An experiment that needs more
than the hosts now up could give (some are down) holds nothing: it waits for a host to come back.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
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
    """Free slot ids per host. Takes and gives back whole reservations, never parts of one."""

    def __init__(self, hosts: Mapping[str, Sequence[int]]):
        self._all = {host: frozenset(ids) for host, ids in hosts.items()}
        self._free = {host: set(ids) for host, ids in hosts.items()}
        self._down: set[str] = set()

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(self._all)

    def capacity(self, host: str) -> int:
        return len(self._all[host])

    def free(self) -> dict[str, frozenset[int]]:
        """Free slots of the hosts that are up, in host order."""
        return {h: frozenset(ids) for h, ids in self._free.items() if h not in self._down}

    def can_take(self, reservation: Reservation) -> bool:
        """Whether every slot of `reservation` is one of this pool's, on a host that is up, and free."""
        return all(host in self._free and host not in self._down and set(ids) <= self._free[host]
                   for host, ids in reservation.slots)

    def take(self, reservation: Reservation) -> None:
        if not self.can_take(reservation):
            raise ValueError(f"slots {reservation.as_dict()} are not free")
        for host, ids in reservation.slots:
            self._free[host].difference_update(ids)

    def give_back(self, reservation: Reservation) -> None:
        for host, ids in reservation.slots:
            self._free[host].update(ids)

    def mark_down(self, host: str) -> None:
        self._down.add(host)

    def mark_up(self, host: str) -> None:
        self._down.discard(host)

    def is_down(self, host: str) -> bool:
        return host in self._down

    def could_fit(self, num_nodes: int, num_gpus: int, *, up_only: bool = False) -> bool:
        """Whether the experiment fits on this pool when every slot is free."""
        hosts = [h for h in self._all if not (up_only and h in self._down)]
        return sum(1 for h in hosts if len(self._all[h]) >= num_gpus) >= num_nodes


class Placement(Protocol):
    """Chooses slots for one experiment among the free ones, or None if it does not fit now."""

    def place(self, free: Mapping[str, frozenset[int]], num_nodes: int, num_gpus: int) -> Reservation | None: ...


class BestFit:
    """Packs: each node of the experiment goes to the host with the fewest free slots that still fit.

    Packing keeps large holes open for large experiments; ties go to hostfile order, then low slot ids.
    """

    def place(self, free: Mapping[str, frozenset[int]], num_nodes: int, num_gpus: int) -> Reservation | None:
        order = {host: i for i, host in enumerate(free)}
        fitting = [h for h, ids in free.items() if len(ids) >= num_gpus]
        if len(fitting) < num_nodes:
            return None
        chosen = sorted(fitting, key=lambda h: (len(free[h]), order[h]))[:num_nodes]
        chosen.sort(key=order.__getitem__)
        return Reservation.of({h: sorted(free[h])[:num_gpus] for h in chosen})


class Demand(Protocol):
    """What the queue needs to know of a waiting item."""

    @property
    def num_nodes(self) -> int: ...

    @property
    def num_gpus(self) -> int: ...


D = TypeVar("D", bound=Demand)


@dataclass
class _Waiting(Generic[D]):
    item: D
    bypassed: int = 0


@dataclass
class BackfillQueue(Generic[D]):
    """Queue order with backfill and a bounded number of overtakes (see the module docstring)."""

    max_bypass: int
    _waiting: list[_Waiting[D]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self._waiting)

    def __iter__(self) -> Iterator[D]:
        return (w.item for w in self._waiting)

    def push(self, item: D) -> None:
        self._waiting.append(_Waiting(item))

    def push_front(self, item: D) -> None:
        """Re-queued work (a lost host's experiments) goes first: it has waited already."""
        self._waiting.insert(0, _Waiting(item))

    def remove(self, match: Callable[[D], bool]) -> list[D]:
        """Drop the waiting items for which `match(item)` is true; returns them."""
        gone = [w.item for w in self._waiting if match(w.item)]
        self._waiting = [w for w in self._waiting if not match(w.item)]
        return gone

    def select(self, pool: SlotPool, placement: Placement) -> list[tuple[D, Reservation]]:
        """Take from the pool, and return, every waiting item that starts now."""
        started: list[tuple[D, Reservation]] = []
        blocked: list[_Waiting[D]] = []
        for waiting in list(self._waiting):
            free = pool.free()
            if not any(free.values()):
                break  # nothing more can start: no need to try the rest (10,000 queued cost 17 ms an event)
            item = waiting.item
            reservation = placement.place(free, item.num_nodes, item.num_gpus)
            if reservation is None and not pool.could_fit(item.num_nodes, item.num_gpus, up_only=True):
                continue  # it needs hosts that are down: it waits for them and holds nothing meanwhile
            if reservation is None:
                blocked.append(waiting)
                if waiting.bypassed >= self.max_bypass:
                    break  # it has been overtaken enough: what frees up next is held for it
                continue
            pool.take(reservation)
            started.append((item, reservation))
            self._waiting.remove(waiting)
            for earlier in blocked:
                earlier.bypassed += 1
        return started
