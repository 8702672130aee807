"""Sweeps inside a Slurm allocation: its nodes and GPUs are the cluster, each attempt is a job step.

`allocation` describes an allocation and runs Slurm's commands, `request` asks for one (its batch script the
`keeper` that gives it back once its holder is gone), `executor` runs attempts as steps, `watch` follows the
allocation's nodes and end while a sweep runs; `parse` reads Slurm's text."""
from __future__ import annotations

from .allocation import (
    Allocation,
    SlurmError,
    cancel_step,
    cluster_of,
    current_job,
    describe,
    planned_cluster,
)
from .executor import SlurmSteps, end_strays, slurm_executor
from .request import Withdrawn, release, request
from .watch import allocation_watcher

__all__ = ["Allocation", "SlurmError", "SlurmSteps", "Withdrawn", "allocation_watcher", "cancel_step", "cluster_of",
           "current_job", "describe", "end_strays", "planned_cluster", "release", "request", "slurm_executor"]
