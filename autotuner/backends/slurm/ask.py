"""What a command asks of Slurm, as API: whether to run inside it, which allocation (this job's, the sweep's
recorded one while it still runs, or a new one of `nodes` x `gpus_per_node`), and the cluster it gives. The
command line parses its options into a `SlurmAsk` and prints; everything it decides is here."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

from ... import limits
from ...errors import UserError
from ..base import HostsCheck
from ..cluster import Cluster
from . import parse
from .allocation import Allocation, allocation_of, cluster_of, current_job, job_state, node_states, planned_cluster
from .keeper import hold, let_go
from .options import SlurmFields, SlurmGiven
from .request import request


@dataclass(frozen=True)
class SlurmAsk(SlurmFields):
    """Whether to run inside Slurm, and the allocation to ask for if this is not inside one already."""

    def asked(self) -> list[str]:
        """The options given that ask Slurm for a new allocation."""
        return [name for name, value in (("--nodes", self.nodes), ("--gpus-per-node", self.gpus_per_node),
                                         ("--partition", self.partition), ("--time", self.time),
                                         ("--account", self.account)) if value is not None]

    def check(self, given: Mapping[str, object] | None = None) -> None:
        """What can be told wrong with the ask before Slurm is asked anything: options that need --slurm, options
        that --slurm replaces (of `given`, the other backends' options: a hostfile, slots, --include, --exclude),
        a size past the limits (a plan would build it), a time limit Slurm cannot read."""
        given = given or {}
        asked = self.asked()
        if asked and not self.slurm:
            raise UserError(f"{asked[0]} is for a Slurm allocation: add --slurm")
        replaced = [f"--{name}" for name in ("hostfile", "slots") if given.get(name) is not None]
        if self.slurm and replaced:
            raise UserError(f"--slurm takes its nodes from the allocation: leave out {replaced[0]}")
        if self.slurm and (given.get("include") or given.get("exclude")):
            raise UserError("--include and --exclude pick hosts of a hostfile; with --slurm the allocation gives "
                            "the nodes")
        if self.gpus_per_node is not None and self.gpus_per_node > limits.SLOTS_PER_HOST:
            raise UserError(f"--gpus-per-node {self.gpus_per_node:,} is more than {limits.SLOTS_PER_HOST:,}, the most "
                            "slots one host may have")
        if self.nodes is not None and self.nodes * (self.gpus_per_node or 1) > limits.SLOTS:
            raise UserError(f"--nodes {self.nodes:,} x --gpus-per-node {self.gpus_per_node or 1:,} is more than "
                            f"{limits.SLOTS:,} slots, the most a cluster may have")
        values = [(o, v) for o, v in (("--time", self.time), ("--partition", self.partition),
                                     ("--account", self.account)) if v is not None]
        problem = next((p for o, v in values if (p := parse.value_problem(o, v)) is not None), None)
        if problem is not None:
            raise UserError(problem)

    def check_runnable(self) -> None:
        """For `run` and `tune` (which need an allocation now): inside one, nothing asks for another; outside,
        the size to ask for is given. Told before any other command is run."""
        if not self.slurm:
            return
        current = current_job()
        if current is not None and self.asked():
            raise UserError(f"{self.asked()[0]} asks for a new allocation; this runs inside Slurm job {current} "
                            "already: leave it out")
        if current is None and (self.nodes is None or self.gpus_per_node is None):
            raise UserError("--slurm outside an allocation: give --nodes and --gpus-per-node (or run inside "
                            "salloc or sbatch)")

    def allocation(self, recorded: Mapping[str, object] | None = None,
                   log: Callable[[str], None] = lambda line: None) -> Allocation | None:
        """The allocation to run in (None: not in Slurm): this job's, else the sweep's recorded one while it still
        runs (whatever size is asked: a new one would wait in the queue behind it), else a new one (`nodes`,
        `gpus_per_node`). One autotune asked for is kept by this process from now on, and given back by the
        caller (`release`), or by its keeper once this process is gone. A Ctrl-C while it is queued withdraws
        it (`request.JobWithdrawn`)."""
        if not self.slurm and recorded is None:
            return None
        current = current_job()
        if current is not None:
            asked = self.asked()
            if asked:
                raise UserError(f"{asked[0]} asks for a new allocation; this runs inside Slurm job {current} "
                                "already: leave it out")
            if recorded is not None and str(recorded.get("job")) == current and recorded.get("owned"):
                return _taken_over(current, recorded)  # the sweep's own, which autotune asked for
            return allocation_of(current)
        if recorded is not None:
            job = job_state(str(recorded.get("job")))
            if job is not None and job.state == "RUNNING":
                if self.asked():
                    log(f"Slurm job {job.id}, the allocation this sweep runs in, still runs: resuming in it "
                        f"({', '.join(self.asked())} not used; `scancel {job.id}` first to ask for a new one)")
                if recorded.get("owned"):
                    return _taken_over(job.id, recorded)
                return allocation_of(job.id)
        if self.nodes is None or self.gpus_per_node is None:
            raise UserError("--slurm outside an allocation: give --nodes and --gpus-per-node (or run inside "
                            "salloc or sbatch)")
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
        return allocation_cluster(allocation_of(current), include, exclude)


def ask_of(options: SlurmGiven) -> SlurmAsk:
    """The allocation the Slurm backend's options ask for (or name, inside one)."""
    return SlurmAsk(**{field.name: getattr(options, field.name) for field in fields(SlurmFields)})


def _taken_over(job: str, recorded: Mapping[str, object]) -> Allocation:
    """The allocation autotune asked for a sweep, taken over by this process (`resume`): its keeper signalled
    from here on, as often as its recorded bound asks."""
    keep = recorded.get("keep")
    bound = keep if isinstance(keep, int) and not isinstance(keep, bool) else None
    hold(job, bound)
    try:
        return allocation_of(job, owned=True, keep=bound)
    except BaseException:
        let_go(job)  # left to its keeper: what runs in it may still be adopted
        raise


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
    allocation = allocation_of(job)
    return allocation, node_states(allocation.nodes)


def allocation_check(allocation: Allocation, nodes: Mapping[str, parse.Node]) -> HostsCheck:
    """`autotune hosts --slurm`: one row per node of the allocation: its state in Slurm, the GPUs (and their
    type), CPUs and memory the allocation holds there, and the widest experiment that can run on it. The
    allocation can run when Slurm has taken no node out."""
    usable = [h for h in allocation.nodes if not (h in nodes and nodes[h].lost)]
    rows: list[dict[str, object]] = []
    cells: list[tuple[str, ...]] = []
    for host in allocation.nodes:
        node = nodes.get(host)
        gpus, lost = allocation.gpus.get(host, 0), node is not None and node.lost
        state = "+".join(sorted(node.states)) if node is not None else "unknown"
        reason = node.reason if node is not None else None
        gpu_type, cpus, memory = allocation.types.get(host), allocation.cpus.get(host), allocation.memory_mb.get(host)
        can = "nothing (lost)" if lost else f"up to {gpus} GPU(s) here, {len(usable)} node(s) at once"
        rows.append({"node": host, "address": allocation.address(host), "state": state, "reason": reason,
                     "gpus": gpus, "gpu_type": gpu_type, "cpus": cpus, "memory_mb": memory or None, "can_run": can,
                     "lost": lost})
        cells.append((host, allocation.address(host), state + (f" ({reason})" if reason else ""),
                      f"{gpus}" + (f" x {gpu_type}" if gpu_type else ""), str(cpus or "-"),
                      f"{memory} MB" if memory else "not tracked", can))
    ends = f", ends {allocation.end_time}" if allocation.end_time else ""
    return HostsCheck(f"Slurm job {allocation.job}{ends}", ("node", "address", "state", "GPUs", "CPUs", "memory",
                                                            "can run"),
                      tuple(cells), tuple(not r["lost"] for r in rows), "state",
                      {"job": allocation.job, "end_time": allocation.end_time, "nodes": rows},
                      not any(n.lost for n in nodes.values()))
