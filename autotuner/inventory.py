"""What accelerators this machine has, read through NVML (the `pynvml` module of nvidia-ml-py).

NVML answers without creating a CUDA context, so the CLI can count GPUs without importing torch. A machine with
no GPU or no driver is a normal state here (a laptop, a CPU test rig): it gives an empty list, never a crash.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from . import limits
from .errors import UserError, shown


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


def local_slots(cpu_slots: int | None, nvml: Any = None) -> tuple[int, str]:
    """(slot count, accelerator) for a run on this machine with no hostfile.

    An explicit `cpu_slots` always means CPU slots, even on a GPU machine: the user asked for them.
    Otherwise one slot per GPU, and no GPU is a UserError that says how to run on CPU instead.
    """
    if cpu_slots is not None:
        if isinstance(cpu_slots, bool) or not isinstance(cpu_slots, int) or cpu_slots < 1:
            raise UserError(f"--slots must be a positive integer, got {shown(cpu_slots)}")
        if cpu_slots > limits.SLOTS_PER_HOST:
            raise UserError(f"--slots {shown(cpu_slots)} is more than {limits.SLOTS_PER_HOST}, "
                            "the most slots one host may have")
        return cpu_slots, "cpu"
    gpus, reason = find_gpus(nvml)
    if gpus:
        return len(gpus), "cuda"
    raise UserError(f"no GPU found on this machine (NVML: {reason}); pass --slots N to run on N CPU slots")
