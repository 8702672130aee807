"""This machine's GPUs as every backend that runs attempts here reads them: free memory for the memory
placement, and each attempt's peak memory while it runs (`peaks.PeakWatching`)."""
from __future__ import annotations

from collections.abc import Mapping

from ...core.roles import Executor
from ...core.slots import Devices
from ...gpu.nvml import FreeMemoryReader
from ...ledger.store import SweepMeta
from ...spec.hostfile import is_local
from .peaks import PeakMemory, PeakWatching


def local_mig(devices: Devices) -> dict[int, str]:
    """This machine's MIG instances, slot id -> UUID: NVML readers find them by UUID, not by index."""
    return {i: d.mig for h, own in devices.items() if is_local(h) for i, d in own.items() if d.mig}


def _gpus_here(meta: SweepMeta, slots: Mapping[str, object]) -> bool:
    return meta.accelerator != "cpu" and any(is_local(h) for h in slots)


def free_memory_here(meta: SweepMeta, devices: Devices, placement: str) -> FreeMemoryReader | None:
    """A reader of this machine's GPUs' free memory, when the memory placement places on them."""
    return FreeMemoryReader(mig=local_mig(devices)) if placement == "memory" and _gpus_here(meta, meta.slots) else None


def peaks_watched(executor: Executor, meta: SweepMeta, devices: Devices) -> tuple[Executor, PeakMemory | None]:
    """`executor`, its runs on this machine's GPUs watched for their peak memory (and the watcher, to close)."""
    if not _gpus_here(meta, meta.slots):
        return executor, None
    peaks = PeakMemory(mig=local_mig(devices))
    return PeakWatching(executor, peaks, is_local), peaks
