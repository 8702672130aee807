"""The cluster a sweep runs on: which slot ids of which hosts it may use, and what kind of slots they are.

From a hostfile (filtered by --include / --exclude), or with no hostfile this machine: its GPUs as NVML finds
them, or `--slots N` CPU slots where there is none.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any  # pynvml has no type information: the module (or a fake) is Any

from ..core.events import Queued
from ..core.placement import ByType, Pack
from ..core.slots import Device, Devices, SlotPool
from ..errors import UserError, shown
from ..gpu import nvml as inventory
from ..gpu.nvml import Gpu, LocalSlots, local_inventory
from ..gpu.types import headroom, size_of_type, type_of_gpu
from ..ledger.meta import BackendRecord
from ..limits import memory
from ..spec import Sweep
from ..spec.hostfile import Host, is_local, load_hostfile, localhost_hosts, parse_filter, prices_of, select_slots


@dataclass(frozen=True)
class Cluster:
    """The slots a sweep may use: slot ids per host, what kind of accelerator they are, and of the hosts whose
    GPUs have a known type, that type and the memory of one GPU (bytes, where known)."""

    slots: Mapping[str, tuple[int, ...]]
    capacity: Mapping[str, int]  # every slot of each host, for the hostfile handed to DeepSpeed
    accelerator: str = "cuda"
    types: Mapping[str, str] = field(default_factory=dict)  # host -> GPU type; a host not here: unknown
    memory: Mapping[str, int] = field(default_factory=dict)  # host -> bytes per GPU, where known
    prices: Mapping[str, float] = field(default_factory=dict)  # GPU type -> a GPU-hour's price, as the hostfile says
    backend: BackendRecord | None = None  # what its backend records of it from the start (a Slurm allocation's)
    # host -> slot id -> the slots unlike their host's others (this machine's MIG instances): own type and memory
    devices: Devices = field(default_factory=dict)

    @classmethod
    def of(cls, hosts: Mapping[str, Host], selection: Mapping[str, Sequence[int]], accelerator: str) -> Cluster:
        """The hostfile's: a host's type is its `gpu=` attribute, its memory what the type's name states."""
        types = {h: hosts[h].attrs["gpu"] for h in selection if "gpu" in hosts[h].attrs}
        memory = {h: size for h, t in types.items() if (size := size_of_type(t)) is not None}
        return cls({h: tuple(ids) for h, ids in selection.items()}, {h: hosts[h].slots for h in selection},
                   accelerator, types, memory, prices=prices_of({h: hosts[h] for h in selection}))

    @property
    def host_types(self) -> dict[str, str | None]:
        """Every host's GPU type (None: unknown), in hostfile order: what a placement keeps experiments within."""
        return {h: self.types.get(h) for h in self.slots}

    def type_of_slot(self, host: str, slot: int) -> str | None:
        """The GPU type of one slot: its device's own, else its host's (None: unknown)."""
        device = self.devices.get(host, {}).get(slot)
        return device.gpu_type if device is not None else self.types.get(host)

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
    if any(g.mig is not None for g in found.gpus):
        return _with_mig(found, include, exclude)
    hosts = localhost_hosts(found.count)
    cluster = Cluster.of(hosts, select_slots(hosts, include, exclude), found.accelerator)
    if found.gpu_type is None:
        return cluster
    local = {h: found.gpu_type for h in cluster.slots}
    return replace(cluster, types=local, memory={h: found.memory for h in local if found.memory is not None})


def _with_mig(found: LocalSlots, include: str, exclude: str) -> Cluster:
    """This machine with GPUs in MIG mode: whole GPUs are slots as ever (their NVML index); each MIG instance is
    a slot of its own id (see inventory), a `Device` of its own type, memory and UUID. A GPU in MIG mode is no
    slot: `--include localhost:N` naming one is refused."""
    by_slot = {g.slot_id: g for g in found.gpus}
    hosts = localhost_hosts(max(by_slot) + 1)
    selected = select_slots(hosts, include, exclude)
    _refuse_mig_parents(by_slot, hosts, include, exclude)
    chosen = {h: tuple(i for i in ids if i in by_slot) for h, ids in selected.items()}
    chosen = {h: ids for h, ids in chosen.items() if ids}
    if not chosen:
        mig = sorted(g.slot_id for g in found.gpus if g.mig is not None)
        flag, listed = "--include" if include else "--exclude", ", ".join(map(str, mig))
        raise UserError(f"{flag} leaves no slot on this machine (a GPU in MIG mode is no slot itself; its MIG "
                        f"instances are: slots {listed} of localhost)")
    plain = [by_slot[i] for ids in chosen.values() for i in ids if by_slot[i].mig is None]
    devices = {h: {i: _device(by_slot[i]) for i in ids if by_slot[i].mig is not None} for h, ids in chosen.items()}
    kind = inventory.gpu_type(plain) if plain else None
    return Cluster(chosen, {h: hosts[h].slots for h in chosen}, found.accelerator,
                   {h: kind for h in chosen} if kind else {},
                   {h: min(g.memory_total for g in plain) for h in chosen} if plain else {},
                   devices={h: d for h, d in devices.items() if d})


def _refuse_mig_parents(by_slot: Mapping[int, Gpu], hosts: Mapping[str, Host], include: str, exclude: str) -> None:
    """--include/--exclude naming the id of a GPU in MIG mode: it is no slot, and neither picking nor leaving
    it out would touch its MIG instances, which is surely what was meant: refused, naming them."""
    option, spec = ("--include", include) if include.strip() else ("--exclude", exclude)
    if not spec.strip():
        return
    named = set().union(*(ids or set() for ids in parse_filter(spec.strip(), hosts, option).values()))
    for gpu in sorted(named - set(by_slot)):
        own = [str(g.slot_id) for g in by_slot.values() if g.index == gpu and g.mig is not None]
        raise UserError(f"{option} {shown(spec.strip())}: slot {gpu} is GPU {gpu}, in MIG mode: no slot itself; its "
                        f"MIG instances are slots {', '.join(own) or 'none'} of localhost")


def with_hosts_mig(cluster: Cluster, found: Mapping[str, Sequence[Gpu]], hostfile: Path | str,
                   log: Callable[[str], None]) -> Cluster:
    """The hostfile's cluster with each host whose GPUs are in MIG mode (`found`: its GPUs as the SSH probe
    lists them, ssh/probe.py) given the slots that host has, as this machine's are (`_with_mig`): whole GPUs keep
    their index, each MIG instance is a slot numbered after them, a `Device` of its profile's type, memory and
    UUID. The hostfile's `slots=N` counts GPUs for DeepSpeed's runner, which cannot use MIG instances: where it
    is not the host's GPU count, one line says so and the host's own slots are used. Picking some slots of such
    a host (--include/--exclude host:N) is refused: N would name no MIG instance for sure."""
    slots, capacity = dict(cluster.slots), dict(cluster.capacity)
    types, memory, devices = dict(cluster.types), dict(cluster.memory), dict(cluster.devices)
    for host, gpus in found.items():
        if host not in slots or not any(g.mig is not None for g in gpus):
            continue
        count = max(g.index for g in gpus) + 1
        if tuple(slots[host]) != tuple(range(capacity[host])):
            picked = ", ".join(map(str, slots[host]))
            raise UserError(f"--include/--exclude pick slots {picked} of {host}, whose GPUs are in MIG mode"
                            " (its slots are its MIG instances, numbered after its GPUs): pick the host "
                            "whole or leave it out", hostfile)
        ids = iter(range(count, count + len(gpus)))
        own = {g.index if g.mig is None else next(ids): g for g in gpus}
        if capacity[host] != count:
            log(f"{hostfile}: {host} slots={capacity[host]}, but the host has {count} GPU(s), in MIG mode or not: "
                f"using its {len(own)} slot(s) ({len(own) - sum(g.mig is None for g in gpus)} MIG instance(s))")
        slots[host], capacity[host] = tuple(sorted(own)), count
        plain = [g for g in gpus if g.mig is None]
        devices[host] = {i: _device(g) for i, g in own.items() if g.mig is not None}
        if not plain:
            types.pop(host, None)
            memory.pop(host, None)
        elif host not in types and (kind := inventory.gpu_type(plain)) is not None:
            types[host], memory[host] = kind, min(g.memory_total for g in plain)
    return replace(cluster, slots=slots, capacity=capacity, types=types, memory=memory, devices=devices)


def _device(gpu: Gpu) -> Device:
    return Device(type_of_gpu(gpu.name, gpu.memory_total), gpu.memory_total, gpu.uuid)


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
    named = list(dict.fromkeys([*(t for t in kinds.values() if t is not None),
                                *(d.gpu_type for own in cluster.devices.values() for d in own.values())]))
    by_type = ByType(Pack(), kinds, devices=cluster.devices, slots=cluster.slots)
    by_size = ByType(Pack(), kinds, cluster.memory, cluster.devices, cluster.slots)
    only_mig = bool(cluster.devices) and all(
        all(i in cluster.devices.get(h, {}) and cluster.devices[h][i].mig for i in ids)
        for h, ids in cluster.slots.items())
    # What fits depends only on an experiment's shape and needs: each is placed once, not once per experiment
    # (a sweep may hold 100,000 of a few shapes).
    fits_type: dict[tuple[int, int, str | None, bool], bool] = {}
    fits_size: dict[tuple[int, int, str | None, bool, int], bool] = {}
    for e in sweep.experiments:
        origin = sweep.origins.get(e.name)
        where = origin.path if origin else e.source
        kind = (e.num_nodes, e.num_gpus, e.gpu_type, e.gpu_mixed)
        if kind not in fits_type:  # the slots it asks for; its memory is checked below
            fits_type[kind] = by_type.could_fit(pool, Queued(replace(e, gpu_memory=None) if e.gpu_memory else e, 1))
        if only_mig and (e.num_gpus > 1 or e.num_nodes > 1):
            raise UserError(f"experiment {e.name} needs {e.num_nodes} node(s) with {e.num_gpus} GPU(s) each; the "
                            "cluster has only MIG instances, and a process can use one MIG instance only",
                            where, origin.line_of("num_nodes" if e.num_nodes > 1 else "num_gpus") if origin else None)
        if e.gpu_type is not None and e.gpu_type not in named:
            told = sweep.inputs is not None and sweep.inputs.gpu_type == e.gpu_type
            has = f"GPU types: {', '.join(named[:8])}" if named else "no host states a GPU type (gpu= in the hostfile)"
            if told:
                raise UserError(f"--gpu-type {e.gpu_type}: the cluster has no GPU of that type ({has})")
            raise UserError(f"experiment {e.name} is pinned to GPU type {e.gpu_type}, which the cluster lacks "
                            f"({has})", where, origin.gpu_type or origin.line if origin else None)
        if not fits_type[kind]:
            one = "" if e.gpu_mixed and not e.gpu_type else " of one GPU type"
            raise UserError(f"experiment {e.name} needs {e.num_nodes} node(s) with {e.num_gpus} slot(s) each{one}"
                            f"{' (' + e.gpu_type + ')' if e.gpu_type else ''}; no "
                            f"{'set of GPUs' if not one else 'type'} has that "
                            f"({_per_type(cluster, named)})"
                            + ("; `gpu_mixed: true` lets it span types" if not e.gpu_type and by_type.could_fit(
                                pool, Queued(replace(e, gpu_mixed=True, gpu_memory=None), 1)) else ""), where,
                            origin.line_of("num_nodes" if e.num_nodes > 1 else "num_gpus") if origin else None)
        if e.gpu_memory and (*kind, e.gpu_memory) not in fits_size:
            fits_size[(*kind, e.gpu_memory)] = by_size.could_fit(pool, Queued(e, 1))
        if e.gpu_memory and not fits_size[(*kind, e.gpu_memory)]:
            largest = max([*(cluster.memory[h] for h, t in kinds.items() if h in cluster.memory
                             and (e.gpu_type is None or t == e.gpu_type)),
                           *(d.memory for own in cluster.devices.values() for d in own.values() if d.memory
                             and (e.gpu_type is None or d.gpu_type == e.gpu_type))], default=0)
            raise UserError(f"experiment {e.name} needs {memory(e.gpu_memory)} on each GPU; the GPUs it may "
                            f"use have {memory(largest)}, {memory(headroom(largest))} of it kept free",
                            where, origin.gpu_memory or origin.line if origin else None)


def _per_type(cluster: Cluster, named: Sequence[str]) -> str:
    """Each type's node count and widest node, for a message: `A100-80GB: 2 node(s), at most 8 slot(s) on one`;
    MIG instances as such (they take one GPU each)."""
    parts = []
    for gpu_type in [*named[:4], None]:
        widths = {h: sum(1 for i in ids if cluster.type_of_slot(h, i) == gpu_type)
                  for h, ids in cluster.slots.items()}
        hosts = [h for h, n in widths.items() if n]
        if not hosts:
            continue
        mig = any(d.mig for own in cluster.devices.values() for d in own.values() if d.gpu_type == gpu_type)
        parts.append(f"{gpu_type or 'unknown'}: " + ("MIG instances, one GPU each" if mig else
                     f"{len(hosts)} node(s), at most {max(widths[h] for h in hosts)} slot(s) on one"))
    return "; ".join(parts)
