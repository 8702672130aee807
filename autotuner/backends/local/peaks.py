"""The peak GPU memory of each attempt that runs on this machine, read from NVML while it runs.

NVML lists the processes that hold memory on a GPU with the bytes each holds (`usedGpuMemory`: the CUDA context,
the allocator's cache, all the process has on the device), but names them by pid only: a pid is an attempt's when
its environment carries the attempt's tag (tags.py). One thread, owned by the runner, reads the GPUs of the
attempts that run every `period` seconds, and sleeps without waking while none runs; the dispatcher never waits
on it. An attempt's peak is the most its processes held together on any one of its GPUs at one reading: what
`gpu_memory` states (memory on each GPU). A reading is a sample, so a spike between two is missed; PyTorch's
caching allocator keeps what it once took, so a training run's holding climbs to its peak and stays there.

No GPU, no driver, a driver that will not list processes, pids from another PID namespace (a container shown the
host's pids): nothing is measured, never an error.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any  # pynvml has no type information: the module (or a fake) is Any

from ...core.events import Event, Finished, Key, Post, Run
from ...core.roles import Executor
from ...gpu.nvml import NvmlSession
from ...states import Reason, State
from ...threads import Workers
from .. import tags

log = logging.getLogger(__name__)

PERIOD = 1.0  # seconds between two readings while attempts run: NVML answers in microseconds, runs last minutes


class PeakMemory:
    """The most each watched attempt has held on one of its GPUs so far (bytes), read by a thread of its own.

    `nvml` stands in for the `pynvml` module (tests pass a fake); by default the real one, imported on the first
    `watch`. One NVML session from then until `close`. `mig`: the sweep's MIG instances, slot id -> UUID: their
    slot ids are no NVML index (gpu/nvml.py), so each is read through the handle of its UUID."""

    def __init__(self, nvml: Any = None, period: float | None = None, proc: Path = Path("/proc"),
                 mig: Mapping[int, str] | None = None):
        self._session = NvmlSession(nvml)  # a CPU sweep never loads pynvml: opened on the first watch
        self._mig = dict(mig or {})
        self._period = PERIOD if period is None else period
        self._proc = proc
        self._cond = threading.Condition()
        self._watched: dict[Key, tuple[str, frozenset[int]]] = {}  # attempt -> (its tag, its GPUs' NVML indices)
        self._peaks: dict[Key, int] = {}
        self._closed = False
        self._workers = Workers("peak-memory")
        self._reading = False
        self._unseen_told = False  # NVML's pids not in our /proc: said once
        self._failed_told = False  # a reading that raised: said once

    def watch(self, key: Key, tag: str, gpus: frozenset[int]) -> None:
        """Read the attempt's GPUs from now until `done(key)`; nothing when there are none, or no NVML."""
        if not gpus or not self._session.open():
            return
        with self._cond:
            if self._closed:
                return
            self._watched[key] = (tag, gpus)
            if not self._reading:
                self._reading = True
                self._workers.start("reader", self._loop)
            self._cond.notify()

    def done(self, key: Key) -> int | None:
        """The attempt's peak in bytes (None: never seen holding GPU memory), and it is watched no more."""
        with self._cond:
            self._watched.pop(key, None)
            return self._peaks.pop(key, None)

    def close(self) -> None:
        """End the reading thread (at its next wake-up: at once), then the NVML session."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._workers.close()
        self._session.close()

    def _loop(self) -> None:
        """Read while attempts are watched; wait on the condition (no wake-ups) while none is."""
        with self._cond:
            while True:
                while not self._watched and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                watched = dict(self._watched)
                self._cond.release()
                try:
                    held = self._reading_of(watched)
                finally:
                    self._cond.acquire()
                for key, used in held.items():
                    if key in self._watched:
                        self._peaks[key] = max(self._peaks.get(key, 0), used)
                if not self._closed:  # a close that came while reading found no one waiting to notify
                    self._cond.wait(self._period)

    def _reading_of(self, watched: Mapping[Key, tuple[str, frozenset[int]]]) -> dict[Key, int]:
        """`_read`, where anything it raises loses that one reading, not every later one: a binding or a driver
        that fails in a way NVMLError does not cover (a malformed process entry, a handle of the wrong type) must
        not leave the rest of the sweep unmeasured. Said once, with its traceback under --debug."""
        try:
            return self._read(watched)
        except Exception as e:  # a sample lost, never the reader
            if not self._failed_told:
                self._failed_told = True
                log.warning("reading the GPUs' memory failed (%s: %s); that reading is lost, the next is made as "
                            "ever", type(e).__name__, e)
                log.debug("the failed reading", exc_info=True)
            return {}

    def _read(self, watched: Mapping[Key, tuple[str, frozenset[int]]]) -> dict[Key, int]:
        """What each watched attempt holds now on the GPU where it holds the most."""
        nvml = self._session.nvml
        owner = {tag: key for key, (tag, _) in watched.items()}
        on_gpu: dict[tuple[Key, int], int] = {}
        for index in sorted(set().union(*(gpus for _, gpus in watched.values()))):
            try:
                handle = (nvml.nvmlDeviceGetHandleByUUID(self._mig[index]) if index in self._mig
                          else nvml.nvmlDeviceGetHandleByIndex(index))
                processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except nvml.NVMLError:  # a lost GPU, a driver that does not list processes: not measured
                continue
            for process in processes:
                used = getattr(process, "usedGpuMemory", None)  # None: NVML cannot say (pynvml's N/A)
                if not used:
                    continue
                tag = tags.tag_of(process.pid, self._proc)
                if tag is None and not self._unseen_told and not (self._proc / str(process.pid)).exists():
                    self._unseen_told = True
                    log.info("NVML lists a process on GPU %d (pid %d) that is not visible here: pids of another PID "
                             "namespace (a container?) are not measured", index, process.pid)
                key = owner.get(tag or "")
                if key is not None and index in watched[key][1]:
                    on_gpu[(key, index)] = on_gpu.get((key, index), 0) + int(used)
        held: dict[Key, int] = {}
        for (key, _), used in on_gpu.items():
            held[key] = max(held.get(key, 0), used)
        return held


class PeakWatching:
    """An executor whose runs on this machine's GPUs are watched by a `PeakMemory`: each run's `Finished`
    carries its peak (`peak_memory`), which the scheduler records with the attempt's end."""

    def __init__(self, executor: Executor, peaks: PeakMemory, local: Callable[[str], bool]):
        self.executor = executor
        self.peaks = peaks
        self._local = local

    def start(self, run: Run, post: Post) -> None:
        self._watch(run)  # first: a launch that fails posts its Finished inside start
        self.executor.start(run, self._posting(run, post))

    def adopt(self, run: Run, pid: int | None, post: Post) -> None:
        self._watch(run)
        self.executor.adopt(run, pid, self._posting(run, post))

    def stop(self, run: Run, state: State, detail: str, reason: Reason | None = None) -> None:
        self.executor.stop(run, state, detail, reason)

    def kill_all(self) -> None:
        self.executor.kill_all()

    def close(self) -> None:
        self.executor.close()

    def _watch(self, run: Run) -> None:
        gpus = frozenset(i for host, ids in run.reservation.slots if self._local(host) for i in ids)
        self.peaks.watch(run.key, run.tag, gpus)

    def _posting(self, run: Run, post: Post) -> Post:
        def posting(event: Event) -> None:
            if isinstance(event, Finished) and event.run.key == run.key:
                event = replace(event, peak_memory=self.peaks.done(run.key))
            post(event)
        return posting
