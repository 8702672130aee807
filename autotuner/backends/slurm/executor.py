"""Running attempts as Slurm job steps inside one allocation: no ssh, no pdsh.

Each attempt is one `srun --exact` step on exactly the nodes the scheduler reserved and the GPU count it asked
for on each; Slurm picks which GPUs and sets `CUDA_VISIBLE_DEVICES` per node. On every node the step runs
DeepSpeed's launcher without ssh (`--no_ssh --node_rank $SLURM_NODEID`), its `--include` naming the GPUs
Slurm gave that node, so the ranks use exactly those. `srun` itself runs here, as the local executor runs the
launcher: under the exit-status wrapper, in a session of its own, so a runner that takes over after a crash
follows it (`adopt`) just the same.

The step is named by the attempt's tag: it is found by that name (`squeue -s`), its id recorded in the
ledger, and it is ended with `scancel`: SIGTERM first, then, after the grace period, a kill, and the attempt
ends only once Slurm no longer lists the step. The results directory must be on a filesystem the nodes share
(as clusters share home and project directories): the first node's rank 0 writes the metrics there.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ...core.events import HostLost, Post, Run
from ...core.outcome import Outcome, log_tail
from ...jsonvalues import JSONObject
from ...spec.hostfile import format_hostfile
from ...spec.metrics import Metric
from ...states import Reason, State
from .. import exitstatus
from ..launch import Command, Launcher, comm_buffer_prefix, deepspeed_command, with_autotuning
from ..local.executor import Adopted, Child, LocalExecutor
from ..watch import env_seconds
from . import parse
from .allocation import Allocation, SlurmError, cancel_step, node_states, slurm, steps

log = logging.getLogger(__name__)
_NODE_FAILURE = re.compile(r"^srun: error: Node failure on (\S+)$", re.M)  # srun's own word for a lost node
STEP_SHOWS_WITHIN = 30.0  # seconds to wait for a new step to be listed before its start is recorded anyway
STEP_SHOWS_ENV = "AUTOTUNE_SLURM_STEP_WAIT"  # seconds, in place of STEP_SHOWS_WITHIN
STEP_ENDS_WITHIN = 60.0  # seconds to wait, after the kill, for Slurm to stop listing a step
SRUN_TAIL = 65536  # bytes of the end of a step's stderr.log searched for srun's own last lines
BUFFERS_WITHIN = 30.0  # seconds for the step that removes an ended run's /dev/shm buffers on its nodes
# Our own job's settings that srun would read from its environment and that conflict with the step's own.
_SRUN_INPUTS = ("SLURM_CPUS_PER_TASK", "SLURM_MEM_PER_CPU", "SLURM_MEM_PER_GPU", "SLURM_MEM_PER_NODE",
                "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE", "SLURM_TRES_PER_TASK", "SLURM_DISTRIBUTION",
                "SLURM_GPUS_PER_NODE", "SLURM_GPUS", "SLURM_CPUS_PER_GPU", "SLURM_EXACT", "SLURM_OVERLAP")

# Run by bash on every node of the step: DeepSpeed's launcher, told its node rank and the GPUs Slurm gave this
# node (the other nodes' GPU counts are all it needs of them). Arguments: the launcher's argv prefix (its
# first {k} words), then the rest of the command.
_NODE = """me="${{SLURM_NODEID:?not inside a Slurm step}}"
ids="${{CUDA_VISIBLE_DEVICES:-{default}}}"
include=""
i=0
for node in {nodes}; do
  if [ "$i" -eq "$me" ]; then part="$node:$ids"; else part="$node:{default}"; fi
  include="${{include:+$include@}}$part"
  i=$((i + 1))
done
exec "${{@:1:{k}}}" --no_ssh --node_rank "$me" --include "$include" "${{@:{rest}}}"
"""


def step_status(status: int, directory: Path) -> int:
    """How a step ended: srun's exit status, or where one node's bad exit made srun end the others (srun's
    own status is then theirs, SIGTERM's), that node's (`parse.first_bad_exit`, from srun's lines in the
    attempt's stderr.log)."""
    if status == 0:
        return status
    first = parse.first_bad_exit(log_tail(directory / "stderr.log", SRUN_TAIL))
    return status if first is None else first


def step_shows_within() -> float:
    """Seconds a new step may go unlisted before its start is recorded anyway and the user told why
    (`AUTOTUNE_SLURM_STEP_WAIT`, else STEP_SHOWS_WITHIN): the tests' lab holds a step back on purpose."""
    return env_seconds(STEP_SHOWS_ENV, STEP_SHOWS_WITHIN)


def srun_environment() -> dict[str, str]:
    """Ours without our own job's step settings, which srun would read as those of the step it starts."""
    return {k: v for k, v in os.environ.items() if k not in _SRUN_INPUTS}


def node_script(nodes: tuple[str, ...], gpus: int, launcher_words: int) -> str:
    """The bash text each node of a step runs (see `_NODE`)."""
    return _NODE.format(default=",".join(map(str, range(gpus))), nodes=" ".join(map(shlex.quote, nodes)),
                        k=launcher_words, rest=launcher_words + 1)


def srun_argv(allocation: Allocation, run: Run, node_argv: list[str]) -> list[str]:
    """The step for one attempt: exactly its nodes, its GPU count on each, CPUs (and memory, where Slurm tracks
    it) in proportion, killed whole if one node's launcher fails, named by the attempt's tag."""
    hosts = run.reservation.hosts
    gpus = run.experiment.num_gpus
    argv = ["srun", "--jobid", allocation.job, "--exact", "--nodes", str(len(hosts)), "--nodelist", ",".join(hosts),
            "--ntasks", str(len(hosts)), "--ntasks-per-node", "1", "--gpus-per-node", str(gpus),
            "--cpus-per-task", str(min(allocation.cpus_for(h, gpus) for h in hosts)),
            "--kill-on-bad-exit=1", "--job-name", run.tag, "--export", "ALL", "--quiet"]
    memory = [allocation.memory_per_gpu_mb(h) for h in hosts]
    if all(m is not None for m in memory):
        argv += ["--mem-per-gpu", f"{min(m for m in memory if m is not None)}M"]
    return [*argv, *node_argv]


@dataclass
class SlurmSteps:
    """Attempts as steps of `allocation` (see the module docstring): the Processes a LocalExecutor runs here."""

    allocation: Allocation
    metric: Metric
    launcher: Launcher = field(default_factory=Launcher)
    env: Mapping[str, str] = field(default_factory=dict)
    poll: float = 0.05  # seconds between looks at the step list while waiting on Slurm
    on_lost: Callable[[str], None] = lambda node: None  # a node found lost here (the watcher follows it back)
    waits_for_start: bool = True  # Launched once Slurm lists the step, with its id

    def __post_init__(self) -> None:
        self._job = self.allocation.job
        self._steps_lock = threading.Lock()
        self._steps_read: tuple[float, list[parse.Step]] = (float("-inf"), [])

    def command(self, run: Run, port: int) -> tuple[JSONObject, Command]:
        metrics_path = str(run.dir / "metrics.json")
        config = with_autotuning(run.experiment.config(), metrics_path, self.metric.name)
        hosts = run.reservation.hosts
        launcher = Launcher(self.launcher.executable, self.allocation.address(hosts[0]), self.launcher.options)
        inner = deepspeed_command(
            run.experiment, run.reservation, config, hostfile=str(run.dir / "hostfile"), master_port=port,
            metric_path=metrics_path, tag=run.tag, cwd=str(Path(run.experiment.script).parent),
            launcher=launcher, env=self.env, placement=())
        words = len(launcher.executable)
        node = ["bash", "-c", node_script(hosts, run.experiment.num_gpus, words), "autotune-step", *inner.argv]
        return config, Command(tuple(srun_argv(self.allocation, run, node)), inner.env, inner.cwd)

    def environment(self, command: Command) -> dict[str, str]:
        """Ours without our own job's step settings (srun would read them as the step's), plus the attempt's."""
        return {**srun_environment(), **command.env}

    def prepare(self, run: Run) -> None:
        """The hostfile DeepSpeed's launcher reads on each node: the step's nodes, each with its GPUs."""
        gpus = self.allocation.total_gpus
        (run.dir / "hostfile").write_text(format_hostfile({h: gpus.get(h, run.experiment.num_gpus)
                                                           for h in run.reservation.hosts}))

    def await_start(self, run: Run, proc: Child) -> str | None:
        """The step's id once Slurm lists it; None if srun ended first or it took too long (a step waiting for
        resources a moment ago's step still held). Looks back off from `poll` to half a second."""
        within = step_shows_within()
        end = time.monotonic() + within
        pause = self.poll
        while time.monotonic() < end:
            found = self._step_of(run.tag, fresh=False)
            if found is not None:
                return found
            if _ended(proc):
                return None
            time.sleep(pause)
            pause = min(0.5, pause * 1.5)
        log.warning("%s: Slurm has not started its step in %g s: something else holds its nodes' GPUs or CPUs (a "
                    "step of Slurm job %s that is not ours?); it starts once they are free, its timeout counted "
                    "from now", run.tag, within, self._job)
        return None

    def _step_of(self, tag: str, *, fresh: bool = True) -> str | None:
        """The id of the step named `tag`, from a step list read now, or (not `fresh`) up to `poll` seconds ago:
        attempts starting together share one squeue rather than each asking slurmctld many times a second."""
        with self._steps_lock:
            if fresh or time.monotonic() - self._steps_read[0] > self.poll:
                try:
                    self._steps_read = (time.monotonic(), steps(self._job))
                except SlurmError as e:  # a slurmctld that does not answer fails no run: the step is not known
                    log.warning("cannot list the steps of Slurm job %s: %s", self._job, e)
                    return None
            listed = self._steps_read[1]
        return next((s.id for s in listed if s.name == tag), None)

    def ended(self, run: Run, outcome: Outcome, post: Post) -> Outcome:
        """Nothing of the step may outlive srun. A run that did not succeed on a node Slurm marks lost, or that
        srun says a node failure ended (it then exits 0, and Slurm may mark the node only later), was lost with
        the node: interrupted, to run again elsewhere, and the node reported at once rather than at the
        watcher's next look."""
        self._end_step(run.tag)
        if outcome.state == State.FAILED:
            outcome = self._as_its_first_failure(run, outcome)
        if outcome.state == State.SUCCEEDED:
            return outcome
        lost = self._lost_node(run)
        if lost is None:
            return outcome
        node, why = lost
        post(HostLost(node, why))
        self.on_lost(node)
        return Outcome(State.INTERRUPTED, Reason.LOST, f"node {node} lost: {why}")

    def _as_its_first_failure(self, run: Run, outcome: Outcome) -> Outcome:
        """A failed step judged again by the exit status of the node whose failure made srun end the rest
        (`step_status`): a rank that measured and then aborted at exit on one node then counts, as it does on
        one machine."""
        if outcome.exit_code is None:
            return outcome
        status = step_status(outcome.exit_code, run.dir)
        if status == outcome.exit_code:
            return outcome
        return exitstatus.judge_files(status, run.dir, self.metric)

    def remove_buffers(self, run: Run, port: int) -> None:
        """On the step's nodes (where its ranks ran, named by the first node's address): one short step that
        overlaps whatever else runs there, so it never waits for a free CPU. Best effort: a node that cannot be
        reached keeps them until it reboots."""
        hosts = run.reservation.hosts
        name = comm_buffer_prefix('"$(id -u)"', shlex.quote(self.allocation.address(hosts[0])), port)
        argv = ["srun", "--jobid", self._job, "--overlap", "--nodes", str(len(hosts)), "--nodelist", ",".join(hosts),
                "--ntasks", str(len(hosts)), "--ntasks-per-node", "1", "--gres=none", "--job-name", f"{run.tag}.shm",
                "--quiet", "sh", "-c", f"rm -f -- /dev/shm/{name}*"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=BUFFERS_WITHIN, env=srun_environment(),
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("cannot remove DeepSpeed's /dev/shm buffers of %s on %s: %s", run.tag, ",".join(hosts), e)
            return
        if done.returncode != 0:
            log.warning("cannot remove DeepSpeed's /dev/shm buffers of %s on %s: %s", run.tag, ",".join(hosts),
                        (done.stderr or done.stdout).strip()[-300:])

    def _lost_node(self, run: Run) -> tuple[str, str] | None:
        """A node of the run that Slurm marks lost, or that srun reported failing; and why, in words."""
        try:
            marked = [n for n in node_states(run.reservation.hosts).values() if n.lost]
        except SlurmError:
            marked = []
        if marked:
            return marked[0].name, f"Slurm marks it {marked[0].why}"
        told = _NODE_FAILURE.findall(log_tail(run.dir / "stderr.log", SRUN_TAIL))
        failed = [node for node in told if node in run.reservation.hosts]
        return (failed[0], "srun reported a node failure") if failed else None

    def end(self, proc: Child | Adopted, tag: str, grace: float, killing: bool) -> None:
        """SIGTERM to the step's tasks on every node (`scancel --signal`: a signal to srun itself would kill
        them at once) and the grace period for them to end; then the step killed and waited for until Slurm no
        longer lists it (the executor then ends whatever is left of srun's group)."""
        step = self._step_of(tag)
        if step is not None and not killing:
            try:
                slurm("scancel", "--signal=TERM", step, check=False)  # its exit status says nothing (22.05: 225)
            except SlurmError as e:  # not told: srun's group still gets SIGTERM, the grace, then SIGKILL
                log.warning("cannot signal Slurm step %s: %s", step, e)
            else:
                with contextlib.suppress(subprocess.TimeoutExpired, TimeoutError):
                    proc.wait(timeout=grace)
        self._end_step(tag)

    def _end_step(self, tag: str) -> None:
        """Kill the step named `tag` if Slurm still lists it, and wait until it does not."""
        step = self._step_of(tag)
        if step is not None:
            cancel_step(step, STEP_ENDS_WITHIN)

    def kill_all(self, tags: list[str]) -> None:
        """Every step of ours cancelled (srun's groups are killed already)."""
        mine = set(tags)
        try:
            for step in steps(self._job):
                if step.name in mine:
                    slurm("scancel", step.id, check=False)
        except SlurmError as e:  # srun's groups are killed already: Slurm ends their steps without being told
            log.warning("cannot cancel the steps of Slurm job %s: %s", self._job, e)


def slurm_executor(hostfile: str, metric: Metric, clock: Callable[[], float], launcher: Launcher | None = None,
                   env: Mapping[str, str] | None = None, grace: float = 10.0, *, allocation: Allocation,
                   on_lost: Callable[[str], None] = lambda node: None, poll: float = 0.05) -> LocalExecutor:
    """The executor of a Slurm sweep: this machine's, its processes srun's steps (composition: SlurmSteps)."""
    launcher, env = launcher or Launcher(), env or {}
    steps_here = SlurmSteps(allocation, metric, launcher, env, poll=poll, on_lost=on_lost)
    return LocalExecutor(hostfile, metric, clock, launcher, env, grace, processes=steps_here)



def _ended(proc: Child) -> bool:
    try:
        proc.wait(timeout=0)
    except subprocess.TimeoutExpired:
        return False
    return True


def end_strays(allocation: Allocation, sweep_id: str, keep: set[str]) -> list[str]:
    """Cancel the steps of this sweep (named `sweep_id.`...) that no attempt being adopted owns: what a dead
    runner left that nobody follows any more. Returns their names."""
    ended = []
    for step in steps(allocation.job):
        if step.name.startswith(f"{sweep_id}.") and step.name not in keep:
            slurm("scancel", step.id, check=False)
            ended.append(step.name)
    return ended
