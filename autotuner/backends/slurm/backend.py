"""The Slurm backend: a sweep inside one allocation, its nodes the cluster, each attempt a job step (see
executor.py); the allocation watched for lost nodes and its end. See backends/base.py for the contract."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import ClassVar

from ...core import Executor, Queued, SlotPool
from ...core.events import Post
from ...core.slots import Devices, devices_from_json
from ...errors import UserError
from ...files import write_atomic
from ...gpu.nvml import FreeMemoryReader
from ...jsonvalues import JSON
from ...ledger.store import Attempt, Ledger, SweepMeta
from ...spec import Sweep
from ...spec.hostfile import HOSTFILE, format_hostfile, is_local
from ...spec.metrics import metric_named
from ..base import Admit, Given, HostsCheck, MemoryReading, admit_all, recorded, write_record
from ..cluster import Cluster
from ..exitstatus import as_returncode
from ..flags import Declared, routed
from ..launch import Launcher
from ..local.cleanup import end_tagged
from ..local.gpus import free_memory_here, peaks_watched
from ..local.peaks import PeakMemory
from ..recovery import as_it_ran
from ..watch import PollingWatcher
from .allocation import KIND, Allocation, SlurmError, cancel_step, cluster_of, job_state
from .ask import allocation_check, allocation_cluster, ask_of, this_allocation
from .executor import end_strays, slurm_executor, step_status
from .held import held_given
from .options import DECLARED, SlurmGiven
from .request import release
from .shared import unshared_nodes
from .watch import allocation_watcher


def check_allocation(directory: Path, allocation: Allocation | None) -> Allocation:
    """A sweep started in Slurm runs in an allocation whose nodes see its results directory: this one (a
    UserError, with nothing written, otherwise)."""
    if allocation is None:
        raise UserError("this sweep runs inside Slurm: resume it with --slurm, inside an allocation or with "
                        "--nodes and --gpus-per-node for a new one", directory)
    unseen = unshared_nodes(allocation, directory)
    if unseen:
        raise UserError(f"node(s) {', '.join(unseen)} of Slurm job {allocation.job} do not see this results "
                        "directory (the first node of each experiment writes its metrics there): put it on a "
                        "filesystem the nodes share, such as home or project space", directory)
    return allocation


def use_allocation(directory: Path, ledger: Ledger, allocation: Allocation) -> None:
    """The allocation `check_allocation` passed, recorded: a new one (resume after the last one ended) replaces
    the nodes the sweep may use; what ran on the old ones ended with it."""
    meta = ledger.meta()
    cluster = cluster_of(allocation)
    if recorded(meta, SlurmBackend.kind) == allocation.to_json() and dict(meta.slots) == dict(cluster.slots):
        return
    for key, value in (("slots", {h: list(ids) for h, ids in cluster.slots.items()}),
                       ("capacity", dict(cluster.capacity)), ("gpu_types", dict(cluster.types)),
                       ("gpu_memory", dict(cluster.memory))):
        ledger.set_meta(key, value)
    write_record(ledger, SlurmBackend.kind, allocation.to_json())
    write_atomic(directory / HOSTFILE, format_hostfile(dict(cluster.capacity)))


class SlurmBackend:
    """Attempts as job steps of `allocation` (None: only recovery, `end`, is possible; see base.Backend)."""

    kind: ClassVar[str] = KIND
    declared: ClassVar[Declared] = DECLARED

    @classmethod
    def named(cls, given: Given, record: SweepMeta | None) -> bool:
        options = routed(SlurmGiven, given)
        return options.allocation is not None or options.slurm or recorded(record, cls.kind) is not None

    @classmethod
    def check(cls, given: Given, command: str) -> None:
        if command == "hosts":  # --slurm there is all it takes
            return
        ask = ask_of(routed(SlurmGiven, given))
        ask.check(given)
        if command in ("run", "tune"):  # they need an allocation now
            ask.check_runnable()

    @classmethod
    def held(cls, given: Given, recorded: Mapping[str, JSON] | None, log: Callable[[str], None],
             not_given_back: Callable[[str], None] | None) -> AbstractContextManager[Given]:
        return held_given(given, recorded, log, not_given_back)

    @classmethod
    def opened(cls, directory: Path, ledger: Ledger, given: Given, *, grace: float,
               log: Callable[[str], None]) -> SlurmBackend:
        return cls(directory, ledger, routed(SlurmGiven, given).allocation, grace=grace, log=log)

    @classmethod
    def cluster(cls, given: Given, *, sweep: Sweep | None = None, log: Callable[[str], None] | None = None) -> Cluster:
        allocation = routed(SlurmGiven, given).allocation
        if allocation is None:
            raise UserError("--slurm: no allocation held for this sweep")
        return allocation_cluster(allocation, str(given.get("include") or ""), str(given.get("exclude") or ""))

    @classmethod
    def planned(cls, given: Given, sweep: Sweep, log: Callable[[str], None]) -> Cluster:
        planned = ask_of(routed(SlurmGiven, given)).planned(str(given.get("include") or ""),
                                                          str(given.get("exclude") or ""))
        if planned is None:  # named by an allocation given, not by --slurm
            return cls.cluster(given, sweep=sweep, log=log)
        return planned

    @classmethod
    def hosts(cls, given: Given) -> HostsCheck:
        return allocation_check(*this_allocation())

    def __init__(self, directory: Path, ledger: Ledger, allocation: Allocation | None, *, grace: float = 10.0,
                 log: Callable[[str], None] = lambda line: None):
        self.directory, self.ledger, self.allocation, self.grace, self.log = directory, ledger, allocation, grace, log
        self._checked: Allocation | None = None  # the allocation `reach` checked
        self._attached: SlurmAttached | None = None

    def reach(self, *, to_run: bool = True) -> None:
        """Before the lock: the allocation checked (one there, its nodes seeing the results directory); nothing
        to reach for `end` (a Slurm that cannot be asked is logged there)."""
        if to_run and self._checked is None:
            self._checked = check_allocation(self.directory, self.allocation)

    def admit(self, slots: SlotPool, waiting: Sequence[Queued]) -> Admit:
        return admit_all  # Slurm starts every step on its nodes without ssh

    def attach(self) -> SlurmAttached:
        """The allocation `reach` checked recorded; the sweep run as its job steps from here on."""
        allocation = self._checked or check_allocation(self.directory, self.allocation)
        self._checked = allocation
        use_allocation(self.directory, self.ledger, allocation)
        self._attached = SlurmAttached(self, allocation)
        return self._attached

    def end(self, attempt: Attempt) -> None:
        if attempt.handle:  # the attempt's job step: Slurm ends it on every node
            cancel_step(attempt.handle)
        if attempt.tag:  # srun itself ran here
            end_tagged(attempt.tag, self.grace)

    def recorded_code(self, attempt: Attempt, status: int, directory: Path) -> int:
        """A step's srun ran here: its status as a local returncode, then as the node whose failure ended the
        step, if one did (`step_status`)."""
        if attempt.handle is None:
            return as_it_ran(attempt, status, directory)
        return step_status(as_returncode(status), directory)

    def give_back(self) -> str | None:
        """The sweep's recorded allocation, when autotune asked for it and it still runs, given back (`cancel`
        with no runner alive: nothing would run in it until its keeper gave it back)."""
        ours = recorded(self.ledger.meta(), self.kind) or {}
        if not ours.get("owned"):
            return None
        job = str(ours.get("job"))
        try:
            state = job_state(job)
            if state is None or state.state != "RUNNING":
                return None
            release(job)
        except SlurmError as e:
            return f"Slurm job {job} was not given back ({e}): `scancel {job}` ends it"
        return f"gave Slurm job {job} back"

    def close(self) -> None:
        """What the attached sweep opened (nothing before `attach`), once: a second call does nothing."""
        attached, self._attached = self._attached, None
        if attached is not None:
            attached.close()


class SlurmAttached:
    """A Slurm sweep attached to the allocation `SlurmBackend.attach` checked and recorded: the members that run
    it (base.Attached). What they open, it owns; its backend's `close` closes it."""

    def __init__(self, backend: SlurmBackend, allocation: Allocation):
        self.backend, self.allocation = backend, allocation
        self.ledger, self.grace, self.log = backend.ledger, backend.grace, backend.log
        self._local_memory: FreeMemoryReader | None = None
        self._executor: Executor | None = None
        self._peaks: PeakMemory | None = None
        self._watcher: PollingWatcher | None = None

    def read_memory(self, placement: str, devices: Devices) -> MemoryReading:
        """With the memory placement: the GPUs of this machine when it is one of the allocation's nodes."""
        local = free_memory_here(self.ledger.meta(), devices, placement)
        self._local_memory = local
        if local is None:
            return MemoryReading()

        def measure(host: str) -> dict[int, int] | None:
            return local.read() if is_local(host) else None
        return MemoryReading(measure)

    def executor(self, post: Post) -> Executor:
        meta = self.ledger.meta()
        self._watcher = allocation_watcher(self.allocation, post, margin=self.grace + 30)
        devices = devices_from_json(meta.devices)
        steps = slurm_executor(str((self.backend.directory / HOSTFILE).resolve()), metric_named(meta.metric),
                               time.time, Launcher(meta.launcher), dict(meta.env), self.grace,
                               allocation=self.allocation, on_lost=self._watcher.watch)
        self._executor, self._peaks = peaks_watched(steps, meta, devices)
        return self._executor

    def clear_strays(self, followed: Sequence[Attempt]) -> None:
        """Steps of this sweep that no attempt being adopted owns: cancelled."""
        ended = end_strays(self.allocation, self.ledger.meta().sweep_id, {a.tag for a in followed if a.tag})
        if ended:
            self.log(f"{len(ended)} job step(s) a dead runner left in Slurm job {self.allocation.job} that no "
                     "attempt follows any more: cancelled")

    def ready(self, slots: SlotPool, post: Post) -> None:
        """Nothing to probe: the allocation watcher reports the nodes Slurm marks down."""

    def close(self) -> None:
        """The reader, the executor (every step has ended), the peaks, the allocation watcher."""
        closing = [self._local_memory, self._executor, self._peaks, self._watcher]
        with contextlib.ExitStack() as stack:
            for resource in reversed([r for r in closing if r is not None]):
                stack.callback(resource.close)
