"""The cluster a sweep runs on: which slot ids of which hosts it may use, and what kind of slots they are.

From a hostfile (filtered by --include / --exclude), or with no hostfile this machine: its GPUs as NVML finds
them, or `--slots N` CPU slots where there is none.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .core.events import Queued
from .core.resources import ByType, Pack, SlotPool, headroom
from .errors import UserError, shown
from .gpus import show_size, size_of_type
from .hostfile import Host, is_local, load_hostfile, localhost_hosts, select_slots
from .inventory import local_inventory
from .spec import Sweep


@dataclass(frozen=True)
class Cluster:
    """The slots a sweep may use: slot ids per host, what kind of accelerator they are, and of the hosts whose
    GPUs have a known type, that type and the memory of one GPU (bytes, where known)."""

    slots: Mapping[str, tuple[int, ...]]
    capacity: Mapping[str, int]  # every slot of each host, for the hostfile handed to DeepSpeed
    accelerator: str = "cuda"
    types: Mapping[str, str] = field(default_factory=dict)  # host -> GPU type; a host not here: unknown
    memory: Mapping[str, int] = field(default_factory=dict)  # host -> bytes per GPU, where known
    slurm: Mapping[str, Any] | None = None  # the Slurm allocation it is (`Allocation.to_json`), if one

    @classmethod
    def of(cls, hosts: Mapping[str, Host], selection: Mapping[str, Sequence[int]], accelerator: str) -> Cluster:
        """The hostfile's: a host's type is its `gpu=` attribute, its memory what the type's name states."""
        types = {h: hosts[h].attrs["gpu"] for h in selection if "gpu" in hosts[h].attrs}
        memory = {h: size for h, t in types.items() if (size := size_of_type(t)) is not None}
        return cls({h: tuple(ids) for h, ids in selection.items()}, {h: hosts[h].slots for h in selection},
                   accelerator, types, memory)

    @property
    def host_types(self) -> dict[str, str | None]:
        """Every host's GPU type (None: unknown), in hostfile order: what a placement keeps experiments within."""
        return {h: self.types.get(h) for h in self.slots}

    @property
    def env(self) -> dict[str, str]:
        """What every experiment's environment needs for this kind of slot."""
        return {"DS_ACCELERATOR": "cpu"} if self.accelerator == "cpu" else {}


def local_or_hostfile_cluster(hostfile: Path | None, include: str = "", exclude: str = "",
                              cpu_slots: int | None = None, nvml: Any = None) -> Cluster:
    """The hostfile's slots (GPUs), or with no hostfile this machine's GPUs (their type and memory from NVML;
    `nvml` stands in for pynvml in tests), or `cpu_slots` CPU slots."""
    if hostfile is not None:
        if cpu_slots is not None:
            raise UserError("--slots is for a run on this machine; a hostfile gives the slots itself", hostfile)
        hosts = load_hostfile(hostfile)
        accelerator = "cpu" if all(h.attrs.get("accelerator") == "cpu" for h in hosts.values()) else "cuda"
        return Cluster.of(hosts, select_slots(hosts, include, exclude), accelerator)
    found = local_inventory(cpu_slots, nvml)
    hosts = localhost_hosts(found.count)
    cluster = Cluster.of(hosts, select_slots(hosts, include, exclude), found.accelerator)
    if found.gpu_type is None:
        return cluster
    local = {h: found.gpu_type for h in cluster.slots}
    return replace(cluster, types=local, memory={h: found.memory for h in local if found.memory is not None})


def spec_hostfile(sweep: Sweep, hostfile: Path | None, cpu_slots: int | None) -> tuple[Path | None, str | None]:
    """The hostfile to use, and a note for the user: DeepSpeed's experiment files name the one they were made
    for (`hostfile`). It is used when no --hostfile (nor --slots) is given, it exists, and they all name the
    same; otherwise the note says why it is not, so that the key is never silently ignored."""
    if hostfile is not None or not sweep.hostfiles:
        return hostfile, None
    first, where = sweep.hostfiles[0]
    path = shown(first, 200, quoted=False)
    if cpu_slots is not None:
        return None, f"--slots runs on this machine: ignoring the hostfile {path} named in {where}"
    other = next(((p, w) for p, w in sweep.hostfiles if p != first), None)
    if other is not None:
        return None, (f"the experiment files name different hostfiles ({path} in {where}, "
                      f"{shown(other[0], 200, quoted=False)} in {other[1]}): running on this machine; "
                      "--hostfile chooses one")
    if not os.path.isfile(first):
        return None, f"ignoring the hostfile {path} named in {where}: no such file; --hostfile chooses one"
    return Path(first), f"using the hostfile {path} named in {where} (--hostfile chooses another)"


def check_fits(sweep: Sweep, cluster: Cluster) -> None:
    """Every experiment must fit on the cluster as given, or nothing is launched: refused at the line of the
    sweep file that asks for too much (its num_nodes or num_gpus, else the experiment's own line); then what it
    asks of GPU types and memory (`check_gpu_needs`)."""
    pool = SlotPool(cluster.slots)
    for e in sweep.experiments:
        if not pool.could_fit(e.num_nodes, e.num_gpus):
            widest = max((len(ids) for ids in cluster.slots.values()), default=0)
            key = "num_gpus" if e.num_gpus > widest else "num_nodes"
            origin = sweep.origins.get(e.name)
            hint = ""
            if e.num_nodes > 1 and len(cluster.slots) == 1 and all(is_local(h) for h in cluster.slots):
                hint = "; this machine is one node: a hostfile of more nodes (--hostfile) gives the sweep more"
            raise UserError(f"experiment {e.name} needs {e.num_nodes} node(s) with {e.num_gpus} slot(s) each; "
                            f"the cluster has {len(cluster.slots)} node(s), at most {widest} slot(s) on one{hint}",
                            origin.path if origin else e.source, origin.line_of(key) if origin else None)
    check_gpu_needs(sweep, cluster)


def check_gpu_needs(sweep: Sweep, cluster: Cluster) -> None:
    """What an experiment asks of GPU types must be there: its pinned type (`gpu_type`, --gpu-type) on some
    host, its node and slot counts on one type's hosts (unless it may span types), and room for its memory
    need (`gpu_memory`) on GPUs of a size it can have. Each refusal is one line at the key that asks."""
    pool = SlotPool(cluster.slots)
    kinds = cluster.host_types
    named = list(dict.fromkeys(t for t in kinds.values() if t is not None))
    by_type = ByType(Pack(), kinds)
    by_size = ByType(Pack(), kinds, cluster.memory)
    for e in sweep.experiments:
        origin = sweep.origins.get(e.name)
        where = origin.path if origin else e.source
        queued = Queued(e, 1)
        if e.gpu_type is not None and e.gpu_type not in named:
            told = sweep.inputs is not None and sweep.inputs.gpu_type == e.gpu_type
            has = f"GPU types: {', '.join(named[:8])}" if named else "no host states a GPU type (gpu= in the hostfile)"
            if told:
                raise UserError(f"--gpu-type {e.gpu_type}: the cluster has no GPU of that type ({has})")
            raise UserError(f"experiment {e.name} is pinned to GPU type {e.gpu_type}, which the cluster lacks "
                            f"({has})", where, origin.gpu_type or origin.line if origin else None)
        if not by_type.could_fit(pool, queued):
            raise UserError(f"experiment {e.name} needs {e.num_nodes} node(s) with {e.num_gpus} slot(s) each of one "
                            f"GPU type{' (' + e.gpu_type + ')' if e.gpu_type else ''}; no type has that "
                            f"({_per_type(cluster, named)})"
                            + ("" if e.gpu_type else "; `gpu_mixed: true` lets it span types"), where,
                            origin.line_of("num_nodes" if e.num_nodes > 1 else "num_gpus") if origin else None)
        if e.gpu_memory and not by_size.could_fit(pool, queued):
            largest = max((cluster.memory[h] for h, t in kinds.items() if h in cluster.memory
                           and (e.gpu_type is None or t == e.gpu_type)), default=0)
            raise UserError(f"experiment {e.name} needs {show_size(e.gpu_memory)} on each GPU; the GPUs it may "
                            f"use have {show_size(largest)}, {show_size(headroom(largest))} of it kept free",
                            where, origin.gpu_memory or origin.line if origin else None)


def _per_type(cluster: Cluster, named: Sequence[str]) -> str:
    """Each type's node count and widest node, for a message: `A100-80GB: 2 node(s), at most 8 slot(s) on one`."""
    parts = []
    for gpu_type in [*named[:4], None]:
        hosts = [h for h, t in cluster.host_types.items() if t == gpu_type]
        if hosts:
            widest = max(len(cluster.slots[h]) for h in hosts)
            parts.append(f"{gpu_type or 'unknown'}: {len(hosts)} node(s), at most {widest} slot(s) on one")
    return "; ".join(parts)
