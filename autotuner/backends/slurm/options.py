"""The Slurm backend's flags (run inside an allocation: this job's, or one asked for and given back), declared
for the command line, standard library only. Picked by --slurm, by an allocation given, or by the sweep's
record; SLURM_JOB_ID says which allocation. `plan` takes --nodes and --gpus-per-node as its own (they size the
training run too) and hands them on by these names."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..flags import Declared, Flag

if TYPE_CHECKING:
    from .allocation import Allocation

_RUNS = frozenset({"run", "tune", "resume"})
_PLAN = frozenset({"plan"})

DECLARED = Declared("slurm", (
    Flag("slurm", ("--slurm",), bool, "Run inside a Slurm allocation: this job's (SLURM_JOB_ID), or one asked for "
                                      "with --nodes and --gpus-per-node and given back at the end.", _RUNS,
         default=False),
    Flag("slurm", ("--slurm",), bool, "Plan for this Slurm allocation, or for one of --nodes x --gpus-per-node "
                                      "(nothing is asked of Slurm).", _PLAN, default=False),
    Flag("slurm", ("--slurm",), bool, "The nodes of this Slurm allocation instead of a hostfile.",
         frozenset({"hosts"}), default=False),
    Flag("nodes", ("--nodes",), int | None, "With --slurm outside an allocation: nodes to ask for.", _RUNS, min=1),
    Flag("gpus_per_node", ("--gpus-per-node",), int | None,
         "With --slurm outside an allocation: GPUs per node to ask for.", _RUNS, min=1),
    Flag("partition", ("--partition",), str | None, "With --slurm --nodes: the Slurm partition.", _RUNS),
    Flag("time", ("--time",), str | None, "With --slurm --nodes: the allocation's time limit (Slurm's syntax).",
         _RUNS),
    Flag("account", ("--account",), str | None, "With --slurm --nodes: the Slurm account.", _RUNS),
), picked="--slurm (SLURM_JOB_ID: the allocation this runs in), an allocation given, or the sweep's record",
    backend="autotuner.backends.slurm.backend:SlurmBackend")


@dataclass(frozen=True)
class SlurmFields:
    """What a Slurm ask holds: whether to run inside Slurm, and the allocation to ask for outside one (the flags
    above). `ask.SlurmAsk`, the face's, adds what is decided of it; `SlurmGiven` the allocation held."""

    slurm: bool = False
    nodes: int | None = None
    gpus_per_node: int | None = None
    partition: str | None = None
    time: str | None = None
    account: str | None = None


@dataclass(frozen=True)
class SlurmGiven(SlurmFields):
    """The Slurm backend's options, as given (`allocation`: the one held for the command)."""

    allocation: Allocation | None = None
