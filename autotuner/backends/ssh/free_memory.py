"""Free memory of the GPUs of SSH hosts, for the memory placement: read over each host's pooled connection and
kept here, fresh, by a thread of its own; the placement only looks the latest values up.

A placement decides in microseconds, a reading costs a pooled SSH round trip and an nvidia-smi (tens of ms), so
no placement ever waits for one (`RemoteMemory.free` takes a lock held only to copy a few numbers). Readings
are taken
- of every host at the start, before anything is placed (`read_now`), and of a lost host once it is back;
- of a host where one of the sweep's runs ended (its GPUs held our own run's memory until then), and of the
  hosts the placement looked at (something waits for memory there: the GPUs of other users' processes may
  empty): once the host's last reading is `period` seconds old. So while something waits, its hosts are read
  every `period` seconds, and no host is read more often however short the runs.
Each round is followed by a `MemoryRead` event: the scheduler places again with the new values.

What the placement gets, per GPU (slot id = GPU index, as on this machine):
- the free memory of the latest reading asked for while no run of this sweep held that GPU: a reading taken
  while our run held it shows our run's memory, gone once the run ends, so the GPU keeps the value it had
  before (what other users held then; the next reading between our runs updates it). A reading
  asked for just before a run was placed shows the GPU as the run found it, before it allocated; that run's
  slot is the pool's until the run ends, so it can never make room for a second run of ours;
- for a GPU never read so (our run held it at every reading, or the host's nvidia-smi does not show it): the
  host's stated size (its GPU type's), else the GPU's total memory as reported, else nothing (no room: not a
  GPU the host shows).
A host whose readings have not answered for `stale_after` seconds (or never) is not measured (None): judged by
its type's size, as before readings existed. A host that cannot be read is never an error here; a lost one is
the executor's HostLost, and is not read again until it is back.

nvidia-smi is the reader (`--query-gpu`, as `autotune hosts` probes): it is on every host with the NVIDIA
driver, whatever Python the host has; asking NVML through `python -c` would need nvidia-ml-py in the host's
Python, and start that Python each time.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from ...core.events import MemoryRead, Post, Run
from ...threads import Workers
from .errors import HostDown
from .fanout import each
from .pool import SSHPool
from .probe import parse_nvidia_smi

log = logging.getLogger(__name__)

QUERY = "nvidia-smi --query-gpu=index,name,memory.free,memory.total,uuid --format=csv,noheader,nounits"
"""The reading: the same query as the probe of `autotune hosts`, parsed by the same code."""

Read = Callable[[str], Mapping[int, tuple[int, int]] | None]
"""One host's GPUs now: {index: (free bytes, total bytes)}, or None where they cannot be read. May block."""


def nvidia_smi(pool: SSHPool, timeout: float = 10.0) -> Read:
    """Reads a host's GPUs with nvidia-smi over its pooled connection. A host that is down, has no nvidia-smi or
    whose driver fails reads as None."""
    def read(host: str) -> Mapping[int, tuple[int, int]] | None:
        try:
            result = pool.run(host, QUERY, timeout)
        except HostDown as e:
            log.debug("GPU memory of %s not read: %s", host, e)
            return None
        if not result.ok:
            log.debug("GPU memory of %s not read: nvidia-smi exit %d", host, result.exit_code)
            return None
        try:
            gpus = parse_nvidia_smi(result.stdout.splitlines())
        except ValueError as e:
            log.debug("GPU memory of %s not read: %s", host, e)
            return None
        return {g.index: (g.memory_free, g.memory_total) for g in gpus if g.memory_free is not None} or None
    return read


class RemoteMemory:
    """The latest free memory of each GPU of some hosts (see the module docstring); thread-safe.

    `slots`: each host's slot ids; `sizes`: the hosts' stated memory per GPU (their type's). `read` may block;
    it is only called by `read_now` and the rounds, never by `free`. `note` is an Observer: the scheduler's
    notes say which GPUs the sweep holds."""

    def __init__(self, read: Read, slots: Mapping[str, Sequence[int]], sizes: Mapping[str, int] | None = None, *,
                 period: float = 10.0, stale_after: float = 120.0, clock: Callable[[], float] = time.monotonic):
        self._read = read
        self._slots = {h: tuple(ids) for h, ids in slots.items()}
        self._sizes = dict(sizes or {})
        self.period = period
        self.stale_after = stale_after
        self._clock = clock
        self._gpus: dict[str, dict[int, int]] = {h: {} for h in self._slots}  # free bytes, latest counted reading
        self._totals: dict[str, dict[int, int]] = {h: {} for h in self._slots}  # each GPU's size, as reported
        self._asked_at: dict[str, float] = {}  # when each host was last read (asked for)
        self._read_at: dict[str, float] = {}  # when each host's last reading that answered was asked for
        self._held: dict[str, set[int]] = {h: set() for h in self._slots}  # GPUs our runs hold
        self._wanted: set[str] = set()  # hosts to read once their period is up (looked at, a run ended there)
        self._down: set[str] = set()
        self._cv = threading.Condition()
        self._closed = False
        self._post: Post | None = None
        self._workers: Workers | None = None

    # --- the placement's side (the dispatcher thread): never blocks on a reading ---------------------------
    def free(self, host: str) -> dict[int, int] | None:
        """Free bytes per GPU (slot id) of `host`: each GPU's latest reading taken while the sweep did not hold
        it, where none the stated size; None: not measured (the host has not answered a reading for
        `stale_after` seconds, or ever; or it is not a host of this reader)."""
        if host not in self._slots:
            return None
        now = self._clock()
        with self._cv:
            if host not in self._wanted:  # read again once its period is up (at once if it is already)
                self._wanted.add(host)
                self._cv.notify()
            answered = self._read_at.get(host)
            if answered is None or now - answered > self.stale_after:
                return None
            gpus, totals = self._gpus[host], self._totals[host]
            size = self._sizes.get(host)
            values = {}
            for i in self._slots[host]:
                if i in gpus:
                    values[i] = gpus[i]
                elif size is not None or i in totals:
                    values[i] = size if size is not None else totals[i]
            return values

    def note(self, what: str, subject: Run | object, outcome: object = None) -> None:
        """An Observer of the scheduler: which GPUs runs of the sweep hold, which hosts are lost or back."""
        with self._cv:
            if isinstance(subject, Run) and what in ("started", "adopted", "finished"):
                for host, ids in subject.reservation.slots:
                    if host not in self._slots:
                        continue
                    if what == "finished":
                        self._held[host].difference_update(ids)
                        self._wanted.add(host)
                    else:
                        self._held[host].update(ids)
            elif isinstance(subject, str) and subject in self._slots and what in ("host_down", "host_up"):
                if what == "host_down":
                    self._down.add(subject)
                else:
                    self._down.discard(subject)
                    self._asked_at.pop(subject, None)  # at once
                    self._wanted.add(subject)
            else:
                return
            self._cv.notify()

    # --- the reading side -----------------------------------------------------------------------------------
    def read_now(self, hosts: Iterable[str] | None = None) -> None:
        """Read `hosts` (default: every host that is not down) at once, in parallel; blocks until done."""
        with self._cv:
            chosen = [h for h in (self._slots if hosts is None else hosts) if h in self._slots and h not in self._down]
        self._read_hosts(chosen)

    def _due_in(self, now: float) -> float | None:
        """Seconds from `now` until the next round is due (0: now); None: nothing to read until something happens.
        Called holding the condition."""
        waits = [self._next_read(h) - now for h in self._wanted - self._down]
        return max(0.0, min(waits)) if waits else None

    def _next_read(self, host: str) -> float:
        """The earliest time a wanted host is read again: `period` after its last reading; never read: now."""
        at = self._asked_at.get(host)
        return float("-inf") if at is None else at + self.period

    def round(self) -> list[str]:
        """Read the wanted hosts whose period is up (a run ended there, the placement looked at it, it is back)
        and tell the scheduler; returns them."""
        now = self._clock()
        with self._cv:
            hosts = sorted(h for h in self._wanted - self._down if self._next_read(h) <= now)
        self._read_hosts(hosts)
        if hosts and self._post is not None:
            self._post(MemoryRead(tuple(hosts)))
        return hosts

    def _read_hosts(self, hosts: Sequence[str]) -> None:
        if hosts:
            each(hosts, self._read_one)

    def _read_one(self, host: str) -> None:
        with self._cv:
            at = self._clock()
            held = frozenset(self._held[host])  # GPUs whose reading would show our own runs' memory
            self._wanted.discard(host)
            self._asked_at[host] = at
        try:
            values = self._read(host)
        except Exception:  # a bug or a fault no reader foresaw: the host goes unmeasured, the sweep goes on
            log.exception("reading the GPU memory of %s failed", host)
            return
        if values is None:
            return
        with self._cv:
            self._read_at[host] = max(at, self._read_at.get(host, at))
            gpus = self._gpus[host]
            for index, (free, total) in values.items():
                self._totals[host][index] = total
                if index not in held:
                    gpus[index] = free

    # --- the thread -----------------------------------------------------------------------------------------
    def start(self, post: Post) -> None:
        """Keep the readings fresh on a thread of this reader's own, telling `post` after each round."""
        self._post = post
        self._workers = Workers("gpu-memory")
        self._workers.start("reader", self._loop)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closed and (wait := self._due_in(self._clock())) != 0.0:
                    self._cv.wait(wait)
                if self._closed:
                    return
            self.round()

    def close(self) -> None:
        """Stop reading; returns once the thread has ended (a reading under way ends within its timeout)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._workers is not None:
            self._workers.close(timeout=30)
