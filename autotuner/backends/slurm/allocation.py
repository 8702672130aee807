"""The Slurm allocation a sweep runs in: the one this process is inside (`SLURM_JOB_ID`), or one asked for
(request.py) and given back at the end. Its nodes and GPUs become the sweep's cluster: no hostfile. Here: what
an allocation holds, the one way Slurm commands are run, and what they say of jobs, steps and nodes.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from ...errors import UserError
from ...gpu.types import size_of_type
from ...ledger.meta import BackendRecord
from ..cluster import Cluster
from ..watch import env_seconds
from . import parse

log = logging.getLogger(__name__)

KIND = "slurm"  # the kind's name, as its record in the ledger says it (`SlurmBackend.kind`)
COMMAND_TIMEOUT = 60.0  # seconds for one scontrol/squeue/scancel call: slurmctld answers in milliseconds
TIMEOUT_ENV = "AUTOTUNE_SLURM_TIMEOUT"  # seconds, in place of COMMAND_TIMEOUT


def command_timeout() -> float:
    """Seconds one Slurm command may take (`AUTOTUNE_SLURM_TIMEOUT`, else COMMAND_TIMEOUT)."""
    return env_seconds(TIMEOUT_ENV, COMMAND_TIMEOUT)


class SlurmError(UserError):
    """A Slurm command failed or is missing: one line, naming the command."""


def slurm(*argv: str, timeout: float | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one Slurm command; a missing command, a hang or (with `check`) a failure is a SlurmError."""
    timeout = command_timeout() if timeout is None else timeout
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]}: no such command (is this a Slurm cluster?)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{shlex.join(argv)}: no answer in {timeout:g} s (is slurmctld up?)") from None
    if check and done.returncode != 0:
        raise SlurmError(failure(argv, done.stderr or done.stdout, done.returncode))
    return done


def failure(argv: Sequence[str], said: str, code: int) -> str:
    """One line for a failed Slurm command: its last line of output (which names the command), else the
    command and its exit status."""
    lines = said.strip().splitlines()
    if not lines:
        return f"{shlex.join(argv)}: exit status {code}"
    last = lines[-1].strip()[:300]
    return last if last.startswith(f"{argv[0]}:") else f"{argv[0]}: {last}"


@dataclass(frozen=True)
class Allocation:
    """An allocation's nodes and what it holds on each; `owned`: asked for by us, given back by us."""

    job: str
    nodes: tuple[str, ...]
    gpus: Mapping[str, int]  # per node
    cpus: Mapping[str, int] = field(default_factory=dict)
    memory_mb: Mapping[str, int] = field(default_factory=dict)  # 0 or missing: not tracked
    addresses: Mapping[str, str] = field(default_factory=dict)  # where the other nodes reach each
    types: Mapping[str, str] = field(default_factory=dict)  # GPU type, where GRES names one
    total_gpus: Mapping[str, int] = field(default_factory=dict)  # every GPU of each node, held or not
    end_time: str | None = None
    owned: bool = False
    keep: int | None = None  # owned: seconds its keeper gives it back after its holder's last heartbeat (keeper.py)

    def to_json(self) -> dict[str, str | bool | int]:
        """What the ledger keeps (the backend's record): enough to find the job again, and to keep one we asked
        for."""
        recorded: dict[str, str | bool | int] = {"job": self.job, "owned": self.owned}
        if self.keep is not None:
            recorded["keep"] = self.keep
        return recorded

    def warnings(self) -> list[str]:
        """What will slow the sweep down in this allocation, for the user: nodes where it holds fewer CPUs
        than GPUs (every step needs a CPU per node: steps beyond the CPUs wait for one)."""
        short = [h for h in self.nodes if 0 < self.cpus.get(h, 0) < self.gpus.get(h, 0)]
        if not short:
            return []
        first = short[0]
        return [f"Slurm job {self.job} holds {self.cpus[first]} CPU(s) for {self.gpus[first]} GPU(s) on {first}"
                f"{f' and {len(short) - 1} other node(s)' if len(short) > 1 else ''}: experiments beyond the CPUs "
                "wait for one; ask for CPUs too (--cpus-per-gpu, or --exclusive)"]

    def address(self, node: str) -> str:
        return self.addresses.get(node, node)

    def cpus_per_gpu(self, node: str) -> int:
        """CPUs a step gets per GPU on `node`: the allocation's CPUs shared out evenly, at least one."""
        gpus = self.gpus.get(node, 0)
        return max(1, self.cpus.get(node, 0) // gpus) if gpus else 1

    def cpus_for(self, node: str, gpus: int) -> int:
        """CPUs a step of `gpus` GPUs asks for on `node`: its share, but never more than the allocation holds
        there (one CPU for two GPUs: a two-GPU step gets the one)."""
        wanted, held = self.cpus_per_gpu(node) * gpus, self.cpus.get(node, 0)
        return max(1, min(wanted, held)) if held else wanted

    def memory_per_gpu_mb(self, node: str) -> int | None:
        """Memory (MB) a step asks per GPU where memory is tracked, so that steps do not each claim all of it
        and run one after another; None where it is not tracked."""
        memory, gpus = self.memory_mb.get(node, 0), self.gpus.get(node, 0)
        return memory // gpus if memory and gpus else None


def current_job() -> str | None:
    """The job this process runs inside, if any."""
    return os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID") or None


def allocation_of(job_id: str, *, owned: bool = False, keep: int | None = None) -> Allocation:
    """The allocation of job `job_id`, which must be running and hold GPUs (`owned`, `keep`: one we asked for,
    and its keeper's bound)."""
    text = slurm("scontrol", "show", "job", "-d", "-o", job_id).stdout
    line = next((line for line in text.splitlines() if line.strip()), "")
    job = parse.job(line)
    if job.state != "RUNNING":
        raise SlurmError(f"Slurm job {job_id} is {job.state or 'unknown'}, not running: no allocation to use")
    nodes = {n.name: n for n in parse.nodes(slurm("scontrol", "show", "node", "-o", ",".join(job.nodes)).stdout)}
    gpus = {}
    for host in job.nodes:
        share = job.shares.get(host)
        held = share.gpus if share is not None else None
        gpus[host] = held.count if held is not None else 0
    if not any(gpus.values()):
        raise SlurmError(f"Slurm job {job_id} holds no GPUs: ask for them (--gpus-per-node G, or --gres=gpu:G)")
    types = {h: t for h in job.nodes if (s := job.shares.get(h)) and s.gpus and (t := s.gpus.type)}
    return Allocation(job.id or job_id, tuple(h for h in job.nodes if gpus[h]), gpus,
                      {h: s.cpus for h, s in job.shares.items()}, {h: s.memory_mb for h, s in job.shares.items()},
                      {h: n.address for h, n in nodes.items()}, types,
                      {h: n.gpus.count for h, n in nodes.items() if n.gpus is not None}, job.end_time, owned,
                      keep if owned else None)


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM taken as Ctrl-C while a request waits in Slurm's queue, or while an allocation of ours is held:
    its default would end us at once, the request left queued or the allocation held until its keeper's bound."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def cancel_step(step: str, within: float = 60.0) -> None:
    """End a job step (`J.S`) on every node and wait until Slurm no longer lists it; a Slurm that cannot be
    asked (its commands missing, its controller down) is logged and left: the ledger still records the end."""
    job = step.split(".")[0]
    try:
        slurm("scancel", step, check=False)
        end = time.monotonic() + within
        while time.monotonic() < end and any(s.id == step for s in steps(job)):
            time.sleep(0.05)
    except SlurmError as e:
        log.warning("cannot end Slurm step %s: %s", step, e)


def node_states(hosts: Sequence[str]) -> dict[str, parse.Node]:
    """The nodes' states now, by name."""
    return {n.name: n for n in parse.nodes(slurm("scontrol", "show", "node", "-o", ",".join(hosts)).stdout)}


def job_state(job_id: str) -> parse.Job | None:
    """The job now; None once Slurm has forgotten it ("Invalid job id"). Any other failure (slurmctld
    restarting, unreachable) says nothing about the job: a SlurmError."""
    done = slurm("scontrol", "show", "job", "-d", "-o", job_id, check=False)
    line = next((line for line in done.stdout.splitlines() if line.strip()), "")
    if done.returncode == 0:
        return parse.job(line) if line else None
    if "Invalid job id" in done.stderr:
        return None
    raise SlurmError(failure(("scontrol", "show", "job", job_id), done.stderr or done.stdout, done.returncode))


def steps(job_id: str) -> list[parse.Step]:
    """The job's running steps."""
    return parse.steps(slurm("squeue", "-h", "-s", "-j", job_id, "-o", parse.STEP_FORMAT, check=False).stdout)


def cluster_of(allocation: Allocation) -> Cluster:
    """The sweep's cluster: each node of the allocation with the GPUs it holds there (their type where GRES
    names one). Slot ids are counts only: Slurm picks the GPUs of each step."""
    slots = {h: tuple(range(allocation.gpus[h])) for h in allocation.nodes}
    memory = {h: size for h, t in allocation.types.items() if (size := size_of_type(t)) is not None}
    return Cluster(slots, {h: len(ids) for h, ids in slots.items()}, "cuda", dict(allocation.types), memory,
                   backend=BackendRecord(KIND, allocation.to_json()))


def planned_cluster(nodes: int, gpus_per_node: int) -> Cluster:
    """An allocation not asked for, to plan for (`autotune plan --slurm --nodes N --gpus-per-node G`)."""
    slots = {f"node{i + 1}": tuple(range(gpus_per_node)) for i in range(nodes)}
    return Cluster(slots, {h: gpus_per_node for h in slots})
