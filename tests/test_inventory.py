from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml
import pytest

from autotuner.errors import UserError
from autotuner.gpu.nvml import Gpu, find_gpus, local_inventory

GiB = 1024**3


@dataclass
class FakeDevice:
    """A GPU, or a MIG instance. `mig`: None, a GPU without MIG (NVML answers NotSupported); a list, a GPU in MIG
    mode whose MIG indices hold those instances (None: no instance at that index, NVML's NotFound)."""

    name: str | bytes
    total: int
    free: int
    uuid: str | bytes
    fails: type[pynvml.NVMLError] | None = None
    mig: list[FakeDevice | None] | None = None
    # The compute processes on it, as (pid, bytes used; None: NVML cannot say), read at each call: a test hands in
    # what the stand-in runs it started hold. None: the driver will not list processes (NVMLError_NotSupported).
    processes: Callable[[], list[tuple[int, int | None]]] | None = field(default=lambda: [])


@dataclass
class FakeNvml:
    """Stands in for the pynvml module: same function names and signatures, real NVMLError classes and constants."""

    devices: list[FakeDevice] = field(default_factory=list)
    init_error: type[pynvml.NVMLError] | None = None
    count_error: type[pynvml.NVMLError] | None = None
    calls: list[str] = field(default_factory=list)
    NVMLError = pynvml.NVMLError
    NVMLError_NotFound = pynvml.NVMLError_NotFound
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error:
            raise self.init_error()

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        if self.count_error:
            raise self.count_error()
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        if not 0 <= index < len(self.devices):  # as NVML answers an index it has no GPU of
            raise pynvml.NVMLError_InvalidArgument()
        device = self.devices[index]
        if device.fails:
            raise device.fails()
        return device

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> FakeDevice:
        """A whole GPU's or a MIG instance's handle by its UUID, as NVML finds either."""
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for device in self.devices:
            for found in [device, *(device.mig or [])]:
                if found is not None and (found.uuid.decode() if isinstance(found.uuid, bytes) else found.uuid) == text:
                    return found
        raise pynvml.NVMLError_NotFound()

    def nvmlDeviceGetName(self, handle: FakeDevice) -> str | bytes:
        return handle.name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeDevice) -> SimpleNamespace:
        return SimpleNamespace(total=handle.total, free=handle.free, used=handle.total - handle.free)

    def nvmlDeviceGetUUID(self, handle: FakeDevice) -> str | bytes:
        return handle.uuid

    def nvmlDeviceGetMigMode(self, device: FakeDevice) -> list[int]:
        if device.mig is None:
            raise pynvml.NVMLError_NotSupported()
        return [pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE]  # [current, pending]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: FakeDevice) -> int:
        return len(device.mig or [])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: FakeDevice, index: int) -> FakeDevice:
        instance = (device.mig or [])[index]
        if instance is None:
            raise pynvml.NVMLError_NotFound()
        return instance

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeDevice) -> list[SimpleNamespace]:
        """As pynvml's: objects with `pid` and `usedGpuMemory` (None where NVML reports it not available)."""
        self.calls.append("processes")
        if handle.processes is None:
            raise pynvml.NVMLError_NotSupported()
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in handle.processes()]


def two_gpus() -> FakeNvml:
    return FakeNvml([FakeDevice("NVIDIA A100-SXM4-80GB", 80 * GiB, 79 * GiB, "GPU-aaaa"),
                     FakeDevice(b"NVIDIA H100 80GB HBM3", 80 * GiB, 10 * GiB, b"GPU-bbbb")])


def test_find_gpus_reads_every_device_and_decodes_bytes() -> None:
    nvml = two_gpus()
    assert find_gpus(nvml)[0] == [
        Gpu(0, "NVIDIA A100-SXM4-80GB", 80 * GiB, 79 * GiB, "GPU-aaaa"),
        Gpu(1, "NVIDIA H100 80GB HBM3", 80 * GiB, 10 * GiB, "GPU-bbbb"),
    ]
    assert nvml.calls == ["init", "shutdown"]


@pytest.mark.parametrize("error", [pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded,
                                   pynvml.NVMLError_NoPermission])
def test_no_driver_is_an_empty_list_without_shutdown(error: type[pynvml.NVMLError]) -> None:
    nvml = FakeNvml(init_error=error)
    assert find_gpus(nvml)[0] == []
    assert nvml.calls == ["init"]  # shutdown only after a successful init


def test_failure_after_init_still_shuts_down() -> None:
    nvml = FakeNvml(count_error=pynvml.NVMLError_Unknown)
    assert find_gpus(nvml)[0] == []
    assert nvml.calls == ["init", "shutdown"]


def test_lost_device_is_skipped_others_kept() -> None:
    nvml = two_gpus()
    nvml.devices[0].fails = pynvml.NVMLError_GpuIsLost
    assert [g.index for g in find_gpus(nvml)[0]] == [1]
    assert nvml.calls == ["init", "shutdown"]


def test_zero_devices() -> None:
    assert find_gpus(FakeNvml())[0] == []


def local_slots(cpu_slots: int | None, nvml: FakeNvml) -> tuple[int, str]:
    found = local_inventory(cpu_slots, nvml)
    return found.count, found.accelerator


def test_local_slots_one_per_gpu() -> None:
    assert local_slots(None, nvml=two_gpus()) == (2, "cuda")


def test_explicit_cpu_slots_win_even_with_gpus() -> None:
    assert local_slots(3, nvml=two_gpus()) == (3, "cpu")
    assert local_slots(2, nvml=FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound)) == (2, "cpu")


@pytest.mark.parametrize("bad", [0, -1])
def test_cpu_slots_must_be_positive(bad: int) -> None:
    with pytest.raises(UserError, match="--slots must be a positive integer"):
        local_slots(bad, nvml=two_gpus())


def test_no_gpu_and_no_slots_says_what_to_do() -> None:
    with pytest.raises(UserError) as info:
        local_slots(None, nvml=FakeNvml(init_error=pynvml.NVMLError_DriverNotLoaded))
    assert str(info.value) == ("no GPU found on this machine (NVML: Driver Not Loaded); "
                               "pass --slots N to run on N CPU slots")
    with pytest.raises(UserError, match=r"NVML: no devices\)"):
        local_slots(None, nvml=FakeNvml())


def test_real_pynvml_never_raises() -> None:
    gpus = find_gpus()[0]
    assert all(isinstance(g, Gpu) for g in gpus)
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        assert gpus == []  # this machine has no GPU or no driver: a normal state
    else:
        pynvml.nvmlShutdown()


def test_import_is_cheap() -> None:
    code = "import sys, autotuner.gpu.nvml; print(sorted({'torch', 'deepspeed', 'pynvml'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
