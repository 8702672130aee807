"""The Slurm backend: a sweep inside one allocation, its nodes the cluster, each attempt a job step (see
executor.py); the allocation watched for lost nodes and its end. See backends/base.py for the contract."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ...core import Executor, Observer, Placement, Queued, SlotPool
from ...core.events import Post
from ...core.placement import FreeMemory
from ...core.slots import Devices, devices_from_json
from ...errors import UserError
from ...files import write_atomic
from ...gpu.nvml import FreeMemory as LocalFreeMemory
from ...ledger.store import Attempt, Ledger
from ...spec.hostfile import HOSTFILE, format_hostfile, is_local
from ...spec.metrics import metric_named
from ..launch import Launcher
from ..local.cleanup import end_tagged
from ..local.gpus import free_memory_here, measured
from ..local.peaks import PeakMemory
from ..watch import PollingWatcher
from .allocation import Allocation, SlurmError, cancel_step, cluster_of, job_state
from .executor import end_strays, slurm_executor
from .request import release
from .shared import unshared_nodes
from .watch import allocation_watcher


def use_allocation(directory: Path, ledger: Ledger, allocation: Allocation | None) -> None:
    """A sweep started in Slurm runs in an allocation: this one. A new allocation (resume after the last one
    ended) replaces the nodes the sweep may use; what ran on the old ones ended with it."""
    meta = ledger.meta()
    if allocation is None:
        raise UserError("this sweep runs inside Slurm: resume it with --slurm, inside an allocation or with "
                        "--nodes and --gpus-per-node for a new one", directory)
    unseen = unshared_nodes(allocation, directory)
    if unseen:
        raise UserError(f"node(s) {', '.join(unseen)} of Slurm job {allocation.job} do not see this results "
                        "directory (the first node of each experiment writes its metrics there): put it on a "
                        "filesystem the nodes share, such as home or project space", directory)
    cluster = cluster_of(allocation)
    if meta.slurm == allocation.to_json() and dict(meta.slots) == dict(cluster.slots):
        return
    for key, value in (("slots", {h: list(ids) for h, ids in cluster.slots.items()}),
                       ("capacity", dict(cluster.capacity)), ("gpu_types", dict(cluster.types)),
                       ("gpu_memory", dict(cluster.memory)), ("slurm", allocation.to_json())):
        ledger.set_meta(key, value)
    write_atomic(directory / HOSTFILE, format_hostfile(dict(cluster.capacity)))


class SlurmBackend:
    """Attempts as job steps of `allocation` (None: only recovery, `end`, is possible; see base.Backend)."""

    def __init__(self, directory: Path, ledger: Ledger, allocation: Allocation | None, *, grace: float = 10.0,
                 log: Callable[[str], None] = lambda line: None):
        self.directory, self.ledger, self.allocation, self.grace, self.log = directory, ledger, allocation, grace, log
        self.measure: FreeMemory | None = None
        self.observers: list[Observer] = []
        self._local_memory: LocalFreeMemory | None = None
        self._executor: Executor | None = None
        self._peaks: PeakMemory | None = None
        self._watcher: PollingWatcher | None = None

    def reach(self) -> None:
        """Nothing to reach before the lock: the allocation is checked (and recorded) at `attach`."""

    def attach(self) -> None:
        """The allocation checked against the sweep and recorded (a UserError when there is none)."""
        use_allocation(self.directory, self.ledger, self.allocation)

    def read_memory(self, placement: str, devices: Devices) -> None:
        """With the memory placement: the GPUs of this machine when it is one of the allocation's nodes."""
        local = free_memory_here(self.ledger.meta(), devices, placement)
        self._local_memory = local
        if local is not None:
            def measure(host: str) -> dict[int, int] | None:
                return local.read() if is_local(host) else None
            self.measure = measure

    def executor(self, post: Post) -> Executor:
        assert self.allocation is not None, "attach first"
        meta = self.ledger.meta()
        self._watcher = allocation_watcher(self.allocation, post, margin=self.grace + 30)
        devices = devices_from_json(meta.devices)
        steps = slurm_executor(str((self.directory / HOSTFILE).resolve()), metric_named(meta.metric), time.time,
                               Launcher(meta.launcher), dict(meta.env), self.grace, allocation=self.allocation,
                               on_lost=self._watcher.watch)
        self._executor, self._peaks = measured(steps, meta, devices)
        return self._executor

    def admit(self, placement: Placement, slots: SlotPool, waiting: list[Queued]) -> tuple[Placement, list[Queued]]:
        return placement, waiting  # Slurm starts every step on its nodes without ssh

    def clear_strays(self, followed: Sequence[Attempt]) -> None:
        """Steps of this sweep that no attempt being adopted owns: cancelled."""
        assert self.allocation is not None, "attach first"
        ended = end_strays(self.allocation, self.ledger.meta().sweep_id, {a.tag for a in followed if a.tag})
        if ended:
            self.log(f"{len(ended)} job step(s) a dead runner left in Slurm job {self.allocation.job} that no "
                     "attempt follows any more: cancelled")

    def end(self, attempt: Attempt) -> None:
        if attempt.step:  # Slurm ends the step on every node
            cancel_step(attempt.step)
        if attempt.tag:  # srun itself ran here
            end_tagged(attempt.tag, self.grace)

    def ready(self, slots: SlotPool, post: Post) -> None:
        """Nothing to probe: the allocation watcher reports the nodes Slurm marks down."""

    def give_back(self) -> str | None:
        """The sweep's recorded allocation, when autotune asked for it and it still runs, given back (`cancel`
        with no runner alive: nothing would run in it until its keeper gave it back)."""
        recorded = self.ledger.meta().slurm or {}
        if not recorded.get("owned"):
            return None
        job = str(recorded.get("job"))
        try:
            state = job_state(job)
            if state is None or state.state != "RUNNING":
                return None
            release(job)
        except SlurmError as e:
            return f"Slurm job {job} was not given back ({e}): `scancel {job}` ends it"
        return f"gave Slurm job {job} back"

    def close(self) -> None:
        """The reader, the executor (every step has ended), the peaks, the allocation watcher."""
        closing = [self._local_memory, self._executor, self._peaks, self._watcher]
        with contextlib.ExitStack() as stack:
            for resource in reversed([r for r in closing if r is not None]):
                stack.callback(resource.close)
