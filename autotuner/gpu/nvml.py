"""What accelerators this machine has, read through NVML (the `pynvml` module of nvidia-ml-py).

NVML answers without creating a CUDA context, so the CLI can count GPUs without importing torch. A machine with
no GPU or no driver is a normal state here (a laptop, a CPU test rig): it gives an empty list, never a crash.

A GPU in MIG mode runs no CUDA work itself: its MIG instances do, each with its own memory and UUID, and a CUDA
process can use one of them only. So such a GPU is not a slot; each of its MIG instances is. Slot ids: a whole
GPU keeps its NVML index (what DeepSpeed's `--include host:N` names), MIG instances are numbered after the last
GPU index, in NVML order (GPU, then MIG index).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any  # pynvml has no type information: its module (or a fake), its handles

from .. import limits
from ..errors import UserError, shown
from ..limits import GiB
from .types import type_of_gpu


@dataclass(frozen=True)
class Gpu:
    """One GPU, or one MIG instance, as NVML sees it. Memory in bytes; `index` is NVML's (for a MIG instance,
    its GPU's), which ignores CUDA_VISIBLE_DEVICES; `mig` the instance's index on its GPU, None for a whole GPU;
    `slot` the slot id a MIG instance is scheduled as (a whole GPU's is its index)."""

    index: int
    name: str
    memory_total: int
    memory_free: int | None  # None: not known (a MIG instance `autotune hosts` found with nvidia-smi)
    uuid: str
    mig: int | None = None
    slot: int | None = None

    @property
    def slot_id(self) -> int:
        return self.index if self.slot is None else self.slot


def _text(value: object) -> str:
    # Old bindings return bytes, newer ones str.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _mig_enabled(nvml: Any, handle: Any) -> bool:
    """Whether the GPU is in MIG mode now (GPUs without MIG answer NotSupported: not in MIG mode)."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError:
        return False
    return bool(current == nvml.NVML_DEVICE_MIG_ENABLE)


def _devices(nvml: Any, errors: list[str] | None = None) -> Iterator[tuple[int, int, int | None, Any]]:
    """(slot id, GPU index, MIG index or None, handle) of each slot NVML has: whole GPUs, and the MIG instances
    of GPUs in MIG mode (MIG indices without an instance are skipped). A device that cannot be read is left
    out, its reason added to `errors`; an error of the device count is raised."""
    count = nvml.nvmlDeviceGetCount()
    following = count
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            if not _mig_enabled(nvml, handle):
                yield index, index, None, handle
                continue
            slots = nvml.nvmlDeviceGetMaxMigDeviceCount(handle)
        except nvml.NVMLError as e:
            if errors is not None:
                errors.append(f"device {index}: {e}")
            continue
        before = following
        for mig in range(slots):
            try:
                instance = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, mig)
            except nvml.NVMLError_NotFound:
                continue
            except nvml.NVMLError as e:
                if errors is not None:
                    errors.append(f"device {index} MIG {mig}: {e}")
                continue
            yield following, index, mig, instance
            following += 1
        if following == before and errors is not None:
            errors.append(f"device {index} is in MIG mode without MIG instances (`nvidia-smi mig -cgi` makes them)")


def _mig_name(name: str, parent: str, total: int) -> str:
    """A MIG instance's name as NVML gives it ("NVIDIA A100-SXM4-40GB MIG 3g.20gb"); where it does not say
    MIG, its GPU's name with the instance's size, so that it never reads as a whole GPU."""
    return name if "MIG" in name.upper() else f"{parent} MIG {round(total / GiB)}gb"


def find_gpus(nvml: Any = None) -> tuple[list[Gpu], str]:
    """This machine's GPUs in NVML order, and why none were found when the list is empty (for the message);
    never an error: no GPU or no driver gives ([], why).

    `nvml` stands in for the `pynvml` module (tests pass a fake); by default the real one is imported here.
    """
    if nvml is None:
        try:
            import pynvml  # lazy: keeps `import autotuner.gpu.nvml` cheap
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
    errors: list[str] = []
    try:
        for slot, index, mig, handle in _devices(nvml, errors):
            try:
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                name = _text(nvml.nvmlDeviceGetName(handle))
                if mig is not None:
                    parent = _text(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(index)))
                    name = _mig_name(name, parent, int(memory.total))
                gpus.append(Gpu(index, name, int(memory.total), int(memory.free),
                                _text(nvml.nvmlDeviceGetUUID(handle)), mig, slot if mig is not None else None))
            except error as e:  # a lost or inaccessible device is skipped, the others are still usable
                errors.append(f"device {index}{'' if mig is None else f' MIG {mig}'}: {e}")
    except error as e:
        errors.append(str(e) or type(e).__name__)
    finally:
        with contextlib.suppress(error):
            nvml.nvmlShutdown()
    return gpus, errors[-1] if errors else reason


@dataclass(frozen=True)
class LocalSlots:
    """This machine's slots for a run with no hostfile: how many, of which accelerator, and for GPUs their type
    and memory (None where the GPUs are not all of one model, or are CPU slots)."""

    count: int
    accelerator: str
    gpu_type: str | None = None
    memory: int | None = None  # bytes per GPU: the smallest GPU's
    gpus: tuple[Gpu, ...] = ()  # each slot's GPU or MIG instance (GPUs only)


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
        return LocalSlots(len(gpus), "cuda", gpu_type(gpus), min(g.memory_total for g in gpus), tuple(gpus))
    raise UserError(f"no GPU found on this machine (NVML: {reason}); pass --slots N to run on N CPU slots")


def gpu_type(gpus: Sequence[Gpu]) -> str | None:
    """The one type of these GPUs (see gpus.type_of_gpu); None when there are none, or several models."""
    types = {type_of_gpu(g.name, g.memory_total) for g in gpus}
    return types.pop() if len(types) == 1 else None


class NvmlSession:
    """One NVML session, opened on first use and kept until `close` (an init per reading would cost more than the
    readings). No GPU or no driver opens as False: not measured, never an error. `nvml` stands in for the `pynvml`
    module (tests pass a fake); by default the real one, imported on the first `open`."""

    def __init__(self, nvml: Any = None):
        self.nvml = nvml
        self._ready: bool | None = None  # None: not tried yet

    def open(self) -> bool:
        if self._ready is None:
            if self.nvml is None:
                try:
                    import pynvml  # lazy, as in find_gpus
                except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency
                    self._ready = False
                    return False
                self.nvml = pynvml
            try:
                self.nvml.nvmlInit()
                self._ready = True
            except self.nvml.NVMLError:
                self._ready = False
        return self._ready

    def close(self) -> None:
        if self._ready:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlShutdown()
        self._ready = None


class FreeMemoryReader:
    """Free memory of this machine's GPUs, read from NVML whenever asked: what the memory placement checks at
    the moment it places. One NVML session for the reader's life (an init per placement would cost more than
    the reads); `close` ends it. No GPU or no driver reads as None: not measured, never an error.

    `mig`: the MIG instances a sweep recorded, slot id -> UUID. Their free memory is then read under those slot
    ids, found by UUID, so that instances made or destroyed since (which move the slot ids `find_gpus` would give)
    are never mistaken for them: an instance not recorded is left out, a recorded one gone reads as absent."""

    def __init__(self, nvml: Any = None, mig: Mapping[int, str] | None = None):
        self._session = NvmlSession(nvml)
        self._mig = {uuid: slot for slot, uuid in (mig or {}).items()}

    def read(self) -> dict[int, int] | None:
        """Free bytes by slot id (a GPU's NVML index, a MIG instance's own slot id: its own memory); a device that
        cannot be read is left out; None: no GPU is measured here."""
        if not self._session.open():
            return None
        nvml = self._session.nvml
        free: dict[int, int] = {}
        try:
            for slot, _index, mig, handle in _devices(nvml):
                with contextlib.suppress(nvml.NVMLError):
                    if mig is not None and self._mig:
                        recorded = self._mig.get(_text(nvml.nvmlDeviceGetUUID(handle)))
                        if recorded is None:
                            continue
                        slot = recorded
                    free[slot] = int(nvml.nvmlDeviceGetMemoryInfo(handle).free)
        except nvml.NVMLError:
            return None
        return free or None

    def close(self) -> None:
        self._session.close()
