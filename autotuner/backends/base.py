"""The Backend contract: what one kind of cluster implements so that the runner can run a sweep on it.

The runner builds the backend the sweep's record names (`registry.backend_for`) and wires it to the scheduler,
the placement and the views; it never asks which kind it holds. A backend owns what differs between clusters:

- `reach`: before the sweep's lock, the cluster reached and whatever can refuse the sweep checked, nothing written
  (a refused command leaves the sweep byte for byte as it was);
- `admit`: before the lock too, after `reach`: what of the queue this cluster can serve (hosts that cannot take
  some runs), refused there when nothing of it can run; the runner applies it to its placement and queue;
- `attach`: the cluster checked against the sweep's record (the one member that writes it, holding the lock),
  returning the attached sweep (`Attached`), which alone has the members that run it:
- `read_memory`: the free-memory readers the placement needs, opened and returned (a `MemoryReading`: the
  reading the memory placement asks, and the observers that must hear the notes); the backend closes them;
- `executor(post)`: the one Executor that starts, adopts and stops attempts (built once, never swapped);
- `clear_strays` (attached), `end` and `recorded_code`: recovery after a crash (what a dead runner left that nobody
  follows; ending one attempt's processes wherever they run, and reading the status one recorded, for
  `recovery.recover`);
- `ready`: its hosts probed (down ones marked and watched), its readers started, before the first launch;
- `give_back`: with no runner alive and nothing of the sweep left to run (`cancel`), what autotune asked the
  cluster for on the sweep's behalf given back (a Slurm allocation);
- `close`: every resource it opened, in order, once.

A new backend is a package under backends/ with a class that has these members and `Kind`'s (its name, what it
builds from the options given), an `options.py` of the standard library alone declaring its flags and how it is
picked (`flags.Declared`: the command line builds its flags from it and routes their values to it), and one line
in kinds.py's `KINDS`.
`autotune hosts` asks the registry too (`registry.hosts_check`): each backend describes its hosts as a
`HostsCheck`, which the views render whatever the kind of cluster.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from ..core import Executor, Observer, Placement, Queued, SlotPool
from ..core.events import Post
from ..core.placement import FreeMemory
from ..core.slots import Devices
from ..jsonvalues import JSON
from ..ledger.meta import BackendRecord
from ..ledger.store import Attempt, Ledger, SweepMeta
from ..spec import Sweep
from .cluster import Cluster
from .flags import Declared, Given

Admit = Callable[[Placement, list[Queued]], tuple[Placement, list[Queued]]]
"""What `admit` found, applied once the lock is held: the runner's placement and queue -> those the cluster serves."""


def admit_all(placement: Placement, waiting: list[Queued]) -> tuple[Placement, list[Queued]]:
    """The `Admit` of a cluster that can serve every run it has room for."""
    return placement, waiting


@dataclass(frozen=True)
class MemoryReading:
    """What `read_memory` opened for a placement: the GPUs' free memory (host -> slot id -> free bytes now; None:
    not read) and the observers told the scheduler's notes before the user's (which GPUs the runs hold)."""

    measure: FreeMemory | None = None
    observers: tuple[Observer, ...] = ()


class Attached(Protocol):
    """A backend attached to its sweep (`Backend.attach`): the members that need the cluster checked against the
    sweep's record and the lock held. Only `attach` makes one, so the runner cannot call them before it."""

    def read_memory(self, placement: str, devices: Devices) -> MemoryReading:
        """The readers of the placement named: free memory is read only for `memory` (else nothing is opened).
        The backend owns them (`close`); `measure` and the observers are called on the dispatcher's thread."""
        ...

    def executor(self, post: Post) -> Executor:
        """The executor of every attempt of this run, built once; `post` is the dispatcher's. The backend owns
        it and closes it; the dispatcher's thread starts, adopts and stops runs through it."""
        ...

    def clear_strays(self, followed: Sequence[Attempt]) -> None:
        """End what a dead runner left running that no attempt in `followed` owns any more (blocks until it
        ended); after `executor`, before any run is adopted: the executor is handed what it will adopt."""
        ...

    def ready(self, slots: SlotPool, post: Post) -> None:
        """Before the first launch, after the adopted runs were handed to the executor: hosts that do not answer
        marked down in `slots` (and watched), readers started. The threads it starts post to `post` only."""
        ...


class Backend(Protocol):
    """One kind of cluster, opened for one run of a sweep (see the module docstring). Invariants every backend
    keeps, so that the runner and `cancel` can rely on them whatever the kind:

    Input/output: its constructor (and `Kind.opened`) does none: nothing read, reached, opened or written, the
    ledger included, until a member is called. `reach` and `admit` read the ledger and the cluster and write
    nothing; `attach` alone writes the sweep's record, and only while the caller holds the sweep's lock; `end`
    (recovery) opens only what ending an attempt needs.

    Threads: every member, its `Attached`'s too, is called from one thread, the caller's (`execute`'s or
    `cancel`'s), one at a time. What they hand out is used from others: the executor's `start`, `adopt` and
    `stop` and `MemoryReading.measure` and its observers on the dispatcher's thread (`kill_all` from any
    thread). The threads a backend starts (per attempt, the host watcher, the readers) only post events
    (`post`); they never write the ledger or call the runner.

    Blocking: a member may block on the cluster (SSH, Slurm, Ray commands, each bounded by the backend), never
    on the dispatcher (not started yet, or joined before `close`). What the dispatcher's thread calls returns
    at once: a stop is carried out on a thread of the executor's; `measure` asks this machine's NVML (a local
    call) or looks up what a reader read of other hosts, never asks a host over the network.

    Ownership: the ledger is the caller's, open for the backend's whole life. Everything the backend opens
    (connections, pools, the executor, readers, watchers) or hands out through its `Attached`, it owns: the
    caller closes none of it, only the backend, with `close`. What `reach` read is kept for `attach`.

    After `close`: nothing but `close` again, which does nothing. `close` closes whatever was reached, also
    after a refused `reach` or with nothing opened."""

    def reach(self, *, to_run: bool = True) -> None:
        """Before the sweep's lock is taken: the cluster reached and checked as far as can be without writing
        anything (a UserError when the sweep cannot run there, the sweep left as it was). `to_run=False`: reached
        only as far as `end` needs it (a cancel with no runner alive), not checked to run the sweep. Blocks on
        the cluster (a probe, a connection); what it opens is kept for the later members, and closed by `close`
        whether or not it refused."""
        ...

    def attach(self) -> Attached:
        """Holding the sweep's lock, before anything runs: the cluster checked against the sweep's record, and
        what changed recorded (a UserError when the sweep cannot run here). Returns the attached sweep, which
        alone has the members that run it; what they open is closed by this backend's `close`. Called once, after
        `reach` and `admit` (it reaches the cluster itself when `reach` was not called)."""
        ...

    def admit(self, slots: SlotPool, waiting: Sequence[Queued]) -> Admit:
        """Before the lock, after `reach`: what this cluster can serve of `waiting` (the queue as it will be once
        the lock is held), as the `Admit` the runner applies then; a UserError, with nothing written, when none of
        it can run. May block on a probe; what it opens for that it closes before returning."""
        ...

    def end(self, attempt: Attempt) -> None:
        """End every process of one attempt a dead runner left, on every host it used (blocks until they ended,
        within the grace period). Needs no lock and no `attach`: `cancel` with no runner calls it after
        `reach(to_run=False)`, the runner for runs found on slots not theirs; what it opens `close` closes."""
        ...

    def recorded_code(self, attempt: Attempt, status: int, directory: Path) -> int:
        """The exit status an attempt recorded beside its logs while no runner was alive, read as the runner
        that followed it would have (`recovery.recover`: the attempt then judged by it and its files)."""
        ...

    def give_back(self) -> str | None:
        """No runner alive, nothing of the sweep left to run: what autotune asked the cluster for on the sweep's
        behalf given back; a line saying what (or why it could not be), None when it holds nothing. Blocks on
        the cluster's answer; before `close`, and only from `cancel`."""
        ...

    def close(self) -> None:
        """Close what it and its `Attached` opened, each even when one before it fails, after the executor's runs
        have all ended (the dispatcher joined). Once: a second call does nothing, and nothing else may follow."""
        ...


def recorded(meta: SweepMeta | None, kind: str) -> Mapping[str, JSON] | None:
    """What the backend of `kind` recorded of its cluster (`meta.backend`'s data), when the sweep's record is its
    own; None when there is none or another kind's."""
    record = meta.backend if meta is not None else None
    return record.data if record is not None and record.kind == kind else None


def write_record(ledger: Ledger, kind: str, data: Mapping[str, JSON]) -> None:
    """The sweep's record of its cluster written as the backend of `kind` will read it back (`recorded`)."""
    ledger.set_meta("backend", BackendRecord(kind, data).to_json())


HostsJSON = Mapping[str, object] | Sequence[Mapping[str, object]]  # what `autotune hosts --format json` prints


@dataclass(frozen=True)
class HostsCheck:
    """`autotune hosts` of one cluster, as its backend found it: a row of cells per host, whether each host can
    run (the `state` column is coloured by it), the same as JSON, and whether the cluster can run a sweep (the
    command's exit status: 0, else 1)."""

    title: str
    columns: tuple[str, ...]  # the first one names the host: never wrapped
    rows: tuple[tuple[str, ...], ...]
    usable: tuple[bool, ...]  # one per row
    state: str  # the column that says whether the host can run
    json: HostsJSON
    ok: bool


class Withdrawn(KeyboardInterrupt):
    """What a backend asked the cluster for on the command's behalf, withdrawn by a Ctrl-C while it waited
    (`what`: it, in words)."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


class Kind(Protocol):
    """A backend's class as the registry sees it: which options name it, and what it builds from them. Each is
    asked in registry order (`kinds.KINDS`); the first that is `named` is the one, the last (the hosts backend)
    is named by anything. Its methods read only their own options of `given` (its `declared` flags, typed by
    `flags.routed`) and do no I/O but what they build or check. They are called from the caller's thread (the
    command line's, or a program's through the face), before any sweep's lock."""

    kind: ClassVar[str]  # the kind's name, as its record and messages say it
    declared: ClassVar[Declared]  # its flags and how it is picked (its package's options.py)

    @classmethod
    def named(cls, given: Given, record: SweepMeta | None) -> bool:
        """Whether the options given (or, with `record`, the sweep's record) name this kind of cluster."""
        ...

    @classmethod
    def check(cls, given: Given, command: str) -> None:
        """Its options given to `command`, checked before anything is asked of a cluster (a UserError), whether
        or not they name it: options that need another of its own, or that exclude the other kinds'."""
        ...

    @classmethod
    def held(cls, given: Given, recorded: Mapping[str, JSON] | None, log: Callable[[str], None],
             not_given_back: Callable[[str], None] | None) -> AbstractContextManager[Given]:
        """What the command runs in, held for its block (asked for, kept, given back however it ends):
        `given` with it added (`recorded`: the sweep's record of its backend, a resumed sweep's). See
        `registry.held`. May block while the cluster grants it (a Ctrl-C meanwhile: `Withdrawn`); what it asked
        for it owns, and gives back when the block ends, whichever way."""
        ...

    @classmethod
    def opened(cls, directory: Path, ledger: Ledger, given: Given, *, grace: float,
               log: Callable[[str], None]) -> Backend:
        """The backend of the sweep at `directory`: nothing read, reached or checked yet (`reach`, `attach`).
        The caller closes it (`close`), and keeps `ledger` open until then."""
        ...

    @classmethod
    def cluster(cls, given: Given, *, sweep: Sweep | None = None, log: Callable[[str], None] | None = None) -> Cluster:
        """The nodes a new sweep runs on (`cluster_for`): what this kind of cluster holds now (`sweep`: the
        sweep, whose files may name its nodes; `log` told what was chosen). Blocks on the cluster's answer."""
        ...

    @classmethod
    def planned(cls, given: Given, sweep: Sweep, log: Callable[[str], None]) -> Cluster:
        """What `autotune plan` plans for: the nodes a new sweep would run on, with nothing asked for (a plan
        spends nothing)."""
        ...

    @classmethod
    def hosts(cls, given: Given) -> HostsCheck:
        """`autotune hosts`: the hosts of this kind of cluster, described."""
        ...
