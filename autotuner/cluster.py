"""The cluster a sweep runs on: which slot ids of which hosts it may use, and what kind of slots they are.

From a hostfile (filtered by --include / --exclude), or with no hostfile this machine: its GPUs as NVML finds
them, or `--slots N` CPU slots where there is none.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .core.resources import SlotPool
from .errors import UserError, shown
from .hostfile import Host, is_local, load_hostfile, localhost_hosts, select_slots
from .inventory import local_slots
from .spec import Sweep


@dataclass(frozen=True)
class Cluster:
    """The slots a sweep may use: slot ids per host, and what kind of accelerator they are."""

    slots: Mapping[str, tuple[int, ...]]
    capacity: Mapping[str, int]  # every slot of each host, for the hostfile handed to DeepSpeed
    accelerator: str = "cuda"

    @classmethod
    def of(cls, hosts: Mapping[str, Host], selection: Mapping[str, Sequence[int]], accelerator: str) -> Cluster:
        return cls({h: tuple(ids) for h, ids in selection.items()}, {h: hosts[h].slots for h in selection},
                   accelerator)

    @property
    def env(self) -> dict[str, str]:
        """What every experiment's environment needs for this kind of slot."""
        return {"DS_ACCELERATOR": "cpu"} if self.accelerator == "cpu" else {}


def local_or_hostfile_cluster(hostfile: Path | None, include: str = "", exclude: str = "",
                              cpu_slots: int | None = None) -> Cluster:
    """The hostfile's slots (GPUs), or with no hostfile this machine's GPUs, or `cpu_slots` CPU slots."""
    if hostfile is not None:
        if cpu_slots is not None:
            raise UserError("--slots is for a run on this machine; a hostfile gives the slots itself", hostfile)
        hosts = load_hostfile(hostfile)
        accelerator = "cpu" if all(h.attrs.get("accelerator") == "cpu" for h in hosts.values()) else "cuda"
    else:
        count, accelerator = local_slots(cpu_slots)
        hosts = localhost_hosts(count)
    return Cluster.of(hosts, select_slots(hosts, include, exclude), accelerator)


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
    sweep file that asks for too much (its num_nodes or num_gpus, else the experiment's own line)."""
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
