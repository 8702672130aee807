"""What accelerators this machine has, read through NVML (the `pynvml` module of nvidia-ml-py).

NVML answers without creating a CUDA context, so the CLI can count GPUs without importing torch. A machine with
no GPU or no driver is a normal state here (a laptop, a CPU test rig): it gives an empty list, never a crash.
"""
from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import limits
from .errors import UserError, shown
from .gpus import type_of_gpu


@dataclass(frozen=True)
class Gpu:
    """One GPU as NVML sees it. Memory in bytes; `index` is NVML's, which ignores CUDA_VISIBLE_DEVICES."""

    index: int
    name: str
    memory_total: int
    memory_free: int
    uuid: str


def _text(value: Any) -> str:
    # Old bindings return bytes, newer ones str.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def find_gpus(nvml: Any = None) -> tuple[list[Gpu], str]:
    """This machine's GPUs in NVML order, and why none were found when the list is empty (for the message);
    never an error: no GPU or no driver gives ([], why).

    `nvml` stands in for the `pynvml` module (tests pass a fake); by default the real one is imported here.
    """
    if nvml is None:
        try:
            import pynvml  # lazy: keeps `import autotuner.inventory` cheap
        except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
            return [], f"pynvml not importable: {e}"
        nvml = pynvml
    error = nvml.NVMLError
    try:
        nvml.nvmlInit()
    except error as e:
        return [], str(e) or type(e).__name__
    gpus: list[Gpu] = []
    reason = "no devices"
    try:
        count = nvml.nvmlDeviceGetCount()
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                gpus.append(Gpu(index, _text(nvml.nvmlDeviceGetName(handle)), int(memory.total),
                                int(memory.free), _text(nvml.nvmlDeviceGetUUID(handle))))
            except error as e:  # a lost or inaccessible device is skipped, the others are still usable
                reason = f"device {index}: {e}"
    except error as e:
        reason = str(e) or type(e).__name__
    finally:
        with contextlib.suppress(error):
            nvml.nvmlShutdown()
    return gpus, reason


@dataclass(frozen=True)
class LocalSlots:
    """This machine's slots for a run with no hostfile: how many, of which accelerator, and for GPUs their type
    and memory (None where the GPUs are not all of one model, or are CPU slots)."""

    count: int
    accelerator: str
    gpu_type: str | None = None
    memory: int | None = None  # bytes per GPU: the smallest GPU's


def local_slots(cpu_slots: int | None, nvml: Any = None) -> tuple[int, str]:
    """(slot count, accelerator) for a run on this machine with no hostfile (see `local_inventory`)."""
    found = local_inventory(cpu_slots, nvml)
    return found.count, found.accelerator


def local_inventory(cpu_slots: int | None, nvml: Any = None) -> LocalSlots:
    """This machine's slots for a run with no hostfile.

    An explicit `cpu_slots` always means CPU slots, even on a GPU machine: the user asked for them.
    Otherwise one slot per GPU, and no GPU is a UserError that says how to run on CPU instead.
    """
    if cpu_slots is not None:
        if isinstance(cpu_slots, bool) or not isinstance(cpu_slots, int) or cpu_slots < 1:
            raise UserError(f"--slots must be a positive integer, got {shown(cpu_slots)}")
        if cpu_slots > limits.SLOTS_PER_HOST:
            raise UserError(f"--slots {shown(cpu_slots)} is more than {limits.SLOTS_PER_HOST}, "
                            "the most slots one host may have")
        return LocalSlots(cpu_slots, "cpu")
    gpus, reason = find_gpus(nvml)
    if gpus:
        return LocalSlots(len(gpus), "cuda", gpu_type(gpus), min(g.memory_total for g in gpus))
    raise UserError(f"no GPU found on this machine (NVML: {reason}); pass --slots N to run on N CPU slots")


def gpu_type(gpus: Sequence[Gpu]) -> str | None:
    """The one type of these GPUs (see gpus.type_of_gpu); None when there are none, or several models."""
    types = {type_of_gpu(g.name, g.memory_total) for g in gpus}
    return types.pop() if len(types) == 1 else None


class FreeMemory:
    """Free memory of this machine's GPUs, read from NVML whenever asked: what the memory placement checks at
    the moment it places. One NVML session for the reader's life (an init per placement would cost more than
    the reads); `close` ends it. No GPU or no driver reads as None: not measured, never an error."""

    def __init__(self, nvml: Any = None):
        self._nvml = nvml
        self._ready: bool | None = None  # None: not tried yet

    def _open(self) -> bool:
        if self._ready is None:
            if self._nvml is None:
                try:
                    import pynvml  # lazy, as in find_gpus
                except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency
                    self._ready = False
                    return False
                self._nvml = pynvml
            try:
                self._nvml.nvmlInit()
                self._ready = True
            except self._nvml.NVMLError:
                self._ready = False
        return self._ready

    def read(self) -> dict[int, int] | None:
        """Free bytes by NVML index (a GPU that cannot be read is left out); None: no GPU is measured here."""
        if not self._open():
            return None
        nvml = self._nvml
        free: dict[int, int] = {}
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                with contextlib.suppress(nvml.NVMLError):
                    free[index] = int(nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(index)).free)
        except nvml.NVMLError:
            return None
        return free or None

    def close(self) -> None:
        if self._ready:
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()
        self._ready = None
