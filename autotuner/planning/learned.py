"""GPU memory needs learned from what runs held: for the memory placement, an experiment that states no
`gpu_memory` needs what the same config was measured to hold at its peak (peaks.py) plus a margin.

Where a figure comes from, best first: the sweep's own earlier attempts of the experiment (a retry, a resumed
sweep), then an earlier sweep's runs of the same config (`--from DIR`: matched by digest, as durations.py
matches them; another config of the same name is another need). The figure of an earlier sweep is recorded in
the new sweep's ledger when it is prepared (meta `learned_memory`), so `resume` needs that sweep no more.
A stated `gpu_memory` always wins: the user knows what the run will hold. A learned need is placed as a stated
one, so one that no GPU the experiment may use could hold is refused as a stated one is (`check_learned`), before
a results directory is made or a plan drawn, never found out as `failed [placement]` or a schedule without it.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from ..core.events import Queued
from ..core.placement import ByType, Pack
from ..core.slots import Devices, SlotPool
from ..errors import UserError
from ..gpu.types import headroom
from ..ledger.store import open_sweep
from ..limits import memory
from ..spec import Experiment

MARGIN = 10  # percent over the measured peak: runs of one config vary (data, allocator fragmentation)
STEP = 256 << 20  # needs are rounded up to this: experiments of one need are one kind for the queue (core/queues.py)


def need_of_peak(peak: int, usable: int | None = None) -> int:
    """What a config measured at `peak` bytes is taken to need on each GPU: the peak and the margin, rounded up
    to a STEP (needs that differ by a few bytes would each be a kind of their own in the queue). Capped at
    `usable` (`largest_usable`), but never below the peak: a config that ran is never made unplaceable by the
    margin."""
    need = -(-(peak + peak * MARGIN // 100) // STEP) * STEP
    return need if usable is None else min(need, max(usable, peak))


def largest_usable(memory: Mapping[str, int] | None, devices: Devices | None) -> int | None:
    """What the biggest GPU of a cluster holds less the placement's headroom: its hosts' GPUs (`memory`, bytes
    per GPU by host) and the slots of a size of their own (`devices`: MIG instances, so that a config measured on
    a MIG instance of a machine of MIG instances only is never made too big for it by the margin). None: no GPU
    size is known."""
    sizes = [*(memory or {}).values(), *(d.memory for own in (devices or {}).values() for d in own.values()
                                         if d.memory)]
    return max((size - headroom(size) for size in sizes), default=None)


class Peaks(dict[str, int]):
    """An earlier sweep's peaks by config digest, and the sweep they were read from (`--from DIR`), which a
    refused need names."""

    def __init__(self, found: Mapping[str, int], source: Path) -> None:
        super().__init__(found)
        self.source = source


def peaks_by_digest(directory: Path, required: bool = True) -> Peaks:
    """An earlier sweep's peaks by config digest. `required`: a UserError when it measured none (a CPU sweep, a
    GPU sweep that NVML could not watch), which a user who asked to learn memory from it must hear."""
    with open_sweep(Path(directory)) as ledger:
        by_name = ledger.peaks()
        digests = ledger.digests()
    if not by_name and required:
        raise UserError("--from: this sweep has no measured GPU memory to learn from", directory)
    found: dict[str, int] = {}
    for name, peak in by_name.items():
        if name in digests:
            found[digests[name]] = max(found.get(digests[name], 0), peak)
    return Peaks(found, Path(directory))


def learned_needs(experiments: Sequence[Experiment], by_digest: Mapping[str, int],
                  usable: int | None = None) -> dict[str, int]:
    """The need of each experiment that states none and whose config was measured, by name."""
    return {e.name: need_of_peak(peak, usable) for e in experiments
            if e.gpu_memory is None and (peak := by_digest.get(e.digest))}


def with_needs(experiments: Iterable[Experiment], needs: Mapping[str, int]) -> list[Experiment]:
    """The experiments, each that states no `gpu_memory` given its learned need (not part of its digest, nor of
    the spec `resume` compares: the ledger keeps the spec as the user wrote it)."""
    return [replace(e, gpu_memory=needs[e.name]) if e.gpu_memory is None and e.name in needs else e
            for e in experiments]


def needs_of_sweep(recorded: Mapping[str, int] | None, own: Mapping[str, int],
                   usable: int | None = None) -> dict[str, int]:
    """What a sweep's runner places by: the needs recorded when it was prepared (`--from`), overridden by the
    peaks measured of its own attempts (`own`: `Ledger.peaks`)."""
    return dict(recorded or {}) | {name: need_of_peak(peak, usable) for name, peak in own.items()}


def check_learned(experiments: Sequence[Experiment], needs: Mapping[str, int], source: Path | None,
                  slots: Mapping[str, Sequence[int]], types: Mapping[str, str | None] | None = None,
                  sizes: Mapping[str, int] | None = None, devices: Devices | None = None) -> None:
    """A learned need is placed as a stated one: an experiment whose need (`needs`, learned from `source`) no GPU
    it may use holds beside the headroom is refused up front, one line naming `--from` and the sweep, as a stated
    `gpu_memory` is (backends.cluster.check_gpu_needs). Its shape is that check's: one that does not fit for
    another reason is left to it. The cluster as `plan_sweep` takes it: slots, types, sizes by host, devices."""
    if not needs:
        return
    kinds = dict(types) if types else dict.fromkeys(slots)
    pool = SlotPool(slots)
    by_type = ByType(Pack(), kinds, devices=devices, slots=slots)
    by_size = ByType(Pack(), kinds, sizes, devices, slots)
    fits: dict[tuple[int, int, str | None, bool, int], bool] = {}  # one placement per shape and need
    for e in experiments:  # 100,000 of them in a large plan: an experiment is copied only for a shape not seen
        need = needs.get(e.name)
        if need is None or e.gpu_memory is not None:
            continue
        kind = (e.num_nodes, e.num_gpus, e.gpu_type, e.gpu_mixed, need)
        if kind not in fits:
            fits[kind] = (by_size.could_fit(pool, Queued(replace(e, gpu_memory=need), 1))
                          or not by_type.could_fit(pool, Queued(e, 1)))
        if not fits[kind]:
            largest = max([*(size for host, size in (sizes or {}).items()
                             if e.gpu_type is None or kinds.get(host) == e.gpu_type),
                           *(d.memory for own in (devices or {}).values() for d in own.values() if d.memory
                             and (e.gpu_type is None or d.gpu_type == e.gpu_type))], default=0)
            raise UserError(f"--from: experiment {e.name} needs {memory(need)} on each GPU, learned from "
                            f"what its config held there; the GPUs it may use have {memory(largest)}, "
                            f"{memory(headroom(largest))} of it kept free: run it on larger GPUs, or leave it out",
                            source)
