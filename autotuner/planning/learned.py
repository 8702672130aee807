"""GPU memory needs learned from what runs held: for the memory placement, an experiment that states no
`gpu_memory` needs what the same config was measured to hold at its peak (peaks.py) plus a margin.

Where a figure comes from, best first: the sweep's own earlier attempts of the experiment (a retry, a resumed
sweep), then an earlier sweep's runs of the same config (`--from DIR`: matched by digest, as durations.py
matches them; another config of the same name is another need). The figure of an earlier sweep is recorded in
the new sweep's ledger when it is prepared (meta `learned_memory`), so `resume` needs that sweep no more.
A stated `gpu_memory` always wins: the user knows what the run will hold.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from ..core.slots import Devices
from ..errors import UserError
from ..gpu.types import headroom
from ..ledger.store import open_sweep
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


def peaks_by_digest(directory: Path, required: bool = True) -> dict[str, int]:
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
    return found


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
