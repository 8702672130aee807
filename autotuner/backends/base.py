"""The Backend contract: what one kind of cluster implements so that the runner can run a sweep on it.

The runner builds the backend the sweep's record names (`registry.backend_for`) and wires it to the scheduler,
the placement and the views; it never asks which kind it holds. A backend owns what differs between clusters:

- `reach`: before the sweep's lock, the cluster reached and whatever can refuse the sweep checked, nothing written
  (a refused command leaves the sweep byte for byte as it was);
- `attach` and `read_memory`: the cluster checked against the sweep's record; free-memory readers opened;
- `executor(post)`: the one Executor that starts, adopts and stops attempts (built once, never swapped);
- `measure` and `observers`: the GPUs' free memory for the memory placement, and who must hear the notes;
- `admit`: the placement and the queue as this cluster can serve them (hosts that cannot take some runs);
- `clear_strays` and `end`: recovery after a crash (what a dead runner left that nobody follows; ending one
  attempt's processes wherever they run, for `recovery.recover`);
- `ready`: its hosts probed (down ones marked and watched), its readers started, before the first launch;
- `give_back`: with no runner alive and nothing of the sweep left to run (`cancel`), what autotune asked the
  cluster for on the sweep's behalf given back (a Slurm allocation);
- `close`: every resource it opened, in order, once.

A new backend is a package under backends/ with a class that has these members, and one line in registry.py.
`autotune hosts` asks the registry too (`registry.hosts_check`): each backend describes its hosts as a
`HostsCheck`, which the views render whatever the kind of cluster.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..core import Executor, Observer, Placement, Queued, SlotPool
from ..core.events import Post
from ..core.placement import FreeMemory
from ..core.slots import Devices
from ..ledger.store import Attempt


class Backend(Protocol):
    """One kind of cluster, opened for one run of a sweep (see the module docstring)."""

    measure: FreeMemory | None  # host -> slot id -> free bytes now, for the memory placement (None: not read)
    observers: list[Observer]  # told the scheduler's notes before the user's observers

    def reach(self) -> None:
        """Before the sweep's lock is taken: the cluster reached and checked as far as can be without writing
        anything (a UserError when the sweep cannot run there, the sweep left as it was)."""
        ...

    def attach(self) -> None:
        """Holding the sweep's lock, before anything runs: the cluster checked against the sweep's record, and
        what changed recorded (a UserError when the sweep cannot run here)."""
        ...

    def read_memory(self, placement: str, devices: Devices) -> None:
        """Set `measure` (and `observers`) for the placement named: free memory is read only for `memory`."""
        ...

    def executor(self, post: Post) -> Executor:
        """The executor of every attempt of this run; `post` is the dispatcher's."""
        ...

    def admit(self, placement: Placement, slots: SlotPool, waiting: list[Queued]) -> tuple[Placement, list[Queued]]:
        """The placement and the queue this cluster can serve now (a UserError when nothing can run)."""
        ...

    def clear_strays(self, followed: Sequence[Attempt]) -> None:
        """End what a dead runner left running that no attempt in `followed` owns any more."""
        ...

    def end(self, attempt: Attempt) -> None:
        """End every process of one attempt a dead runner left, on every host it used."""
        ...

    def ready(self, slots: SlotPool, post: Post) -> None:
        """Before the first launch: hosts that do not answer marked down (and watched), readers started."""
        ...

    def give_back(self) -> str | None:
        """No runner alive, nothing of the sweep left to run: what autotune asked the cluster for on the sweep's
        behalf given back; a line saying what (or why it could not be), None when it holds nothing."""
        ...

    def close(self) -> None:
        """Close what it opened, once, after the executor's runs have all ended."""
        ...


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
