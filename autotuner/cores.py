"""CPU slots bound to disjoint cores: what keeps concurrent CPU runs from measuring each other.

Two DeepSpeed runs on CPU slots of one machine each start as many threads as the machine has cores, so each one's
throughput says how much the other took. A run on CPU slots is therefore started under `taskset -c` with the
cores of its slots only (slot i of n on a host gets the i-th n-th of the cores this process may use), and with
OMP_NUM_THREADS (which torch's intra-op pool follows) sized to its share per rank. DeepSpeed's own launcher
options (`--bind_cores_to_rank`, `--bind_core_list`) need numactl, which a machine may lack; taskset is
util-linux's, always there, and the ranks inherit the binding. With more slots than cores, slots share cores
(`shares` says so).
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

OMP_THREADS = "OMP_NUM_THREADS"


def usable_cores() -> list[int]:
    """The cores this process may run on, in order."""
    return sorted(os.sched_getaffinity(0))


def slot_cores(slot: int, slots: int, cores: Sequence[int]) -> list[int]:
    """The cores of slot `slot` of `slots` on a host: an equal share of `cores`, disjoint from the other slots'
    while there are at least as many cores as slots; else the one core it shares."""
    if slots > len(cores):
        return [cores[slot * len(cores) // slots]]
    return list(cores[slot * len(cores) // slots:(slot + 1) * len(cores) // slots])


def shares(slots: int, cores: Sequence[int]) -> bool:
    """Whether CPU slots on a host share cores (more slots than cores)."""
    return slots > len(cores)


def core_list(cores: Sequence[int]) -> str:
    """`taskset -c`'s list: runs of consecutive cores as ranges (0-3,6)."""
    parts: list[str] = []
    start = prev = None
    for core in sorted(cores):
        if prev is not None and core == prev + 1:
            prev = core
            continue
        if start is not None:
            parts.append(f"{start}-{prev}" if prev != start else f"{start}")
        start = prev = core
    if start is not None:
        parts.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ",".join(parts)


def bound(argv: Sequence[str], env: Mapping[str, str], slots: Sequence[int], host_slots: int,
          cores: Sequence[int]) -> tuple[list[str], dict[str, str]]:
    """`argv` run on the cores of `slots` (of `host_slots` on the host), and `env` with OMP_NUM_THREADS its cores
    per rank (one rank per slot), unless the user's environment sets it."""
    mine = sorted({c for slot in slots for c in slot_cores(slot, host_slots, cores)})
    threads = max(1, len(mine) // max(1, len(slots)))
    return ["taskset", "-c", core_list(mine), *argv], {OMP_THREADS: str(threads), **env}
