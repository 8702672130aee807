"""What a command asks of Slurm, as API: whether to run inside it, which allocation (this job's, the sweep's
recorded one while it still runs, or a new one of `nodes` x `gpus_per_node`), and the cluster it gives. The
command line parses its options into a `SlurmAsk` and prints; everything it decides is here."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import UserError
from ..cluster import Cluster
from . import parse
from .allocation import Allocation, cluster_of, current_job, describe, job_state, node_states, planned_cluster, request


@dataclass(frozen=True)
class SlurmAsk:
    """Whether to run inside Slurm, and the allocation to ask for if this is not inside one already."""

    slurm: bool = False
    nodes: int | None = None
    gpus_per_node: int | None = None
    partition: str | None = None
    time: str | None = None
    account: str | None = None

    def asked(self) -> list[str]:
        """The options given that ask Slurm for a new allocation."""
        return [name for name, value in (("--nodes", self.nodes), ("--gpus-per-node", self.gpus_per_node),
                                         ("--partition", self.partition), ("--time", self.time),
                                         ("--account", self.account)) if value is not None]

    def check(self, hostfile: Path | None = None, slots: int | None = None) -> None:
        """Options that contradict each other, before anything is asked of Slurm."""
        asked = self.asked()
        if asked and not self.slurm:
            raise UserError(f"{asked[0]} is for a Slurm allocation: add --slurm")
        if self.slurm and (hostfile is not None or slots is not None):
            raise UserError(f"--slurm takes its nodes from the allocation: leave out "
                            f"{'--hostfile' if hostfile is not None else '--slots'}")

    def allocation(self, recorded: Mapping[str, Any] | None = None,
                   log: Callable[[str], None] = lambda line: None) -> Allocation | None:
        """The allocation to run in (None: not in Slurm): this job's, else the sweep's recorded one while it still
        runs, else a new one (`nodes`, `gpus_per_node`), which the caller gives back (`release`). A Ctrl-C while
        it is queued withdraws it (`Withdrawn`)."""
        if not self.slurm and recorded is None:
            return None
        current = current_job()
        if current is not None:
            asked = self.asked()
            if asked:
                raise UserError(f"{asked[0]} asks for a new allocation; this runs inside Slurm job {current} "
                                "already: leave it out")
            return describe(current)
        if recorded is not None and self.nodes is None:
            job = job_state(str(recorded.get("job")))
            if job is not None and job.state == "RUNNING":
                return describe(job.id, owned=bool(recorded.get("owned")))
        if self.nodes is None or self.gpus_per_node is None:
            raise UserError("--slurm outside an allocation: give --nodes and --gpus-per-node (or run inside "
                            "salloc or sbatch)")
        log(f"asking Slurm for {self.nodes} node(s) x {self.gpus_per_node} GPU(s)")
        return request(self.nodes, self.gpus_per_node, partition=self.partition, time=self.time,
                       account=self.account, log=log)

    def planned(self, include: str = "", exclude: str = "") -> Cluster | None:
        """What `plan --slurm` plans for: the allocation this runs in, or one of the size asked (never asked
        for: a plan spends nothing); None without --slurm."""
        if not self.slurm:
            return None
        if self.nodes is not None or self.gpus_per_node is not None:
            if self.nodes is None or self.gpus_per_node is None:
                raise UserError("plan --slurm: give both --nodes and --gpus-per-node, or neither (this allocation)")
            return planned_cluster(self.nodes, self.gpus_per_node)
        current = current_job()
        if current is None:
            raise UserError("plan --slurm outside an allocation: give --nodes and --gpus-per-node")
        return allocation_cluster(describe(current), include, exclude)


def allocation_cluster(allocation: Allocation, include: str = "", exclude: str = "") -> Cluster:
    """The allocation's nodes and GPUs as the sweep's cluster (a hostfile's filters do not apply)."""
    if include or exclude:
        raise UserError("--include and --exclude pick hosts of a hostfile; with --slurm the allocation gives the "
                        "nodes")
    return cluster_of(allocation)


def this_allocation() -> tuple[Allocation, dict[str, parse.Node]]:
    """`hosts --slurm`: the allocation this runs in and its nodes' states."""
    job = current_job()
    if job is None:
        raise UserError("hosts --slurm: not inside a Slurm allocation (no SLURM_JOB_ID); run it in salloc or sbatch")
    allocation = describe(job)
    return allocation, node_states(allocation.nodes)
