"""An allocation autotune asked for is given back when the process holding it is gone, however it ended, within
its keeper's bound (AUTOTUNE_SLURM_KEEP, set short here); a `resume` within the bound takes it over, with or
without allocation options, and never asks for a second one that would queue behind it; `cancel` with no runner
alive gives it back. On the real Slurm cluster of tests/slurm_lab.py (three nodes of two fake GPUs)."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_slurm import lab_env, node_lines, standin

from autotuner.backends.slurm import keeper
from autotuner.ledger.lock import holder_pid
from autotuner.states import State

from cli_rig import Runners, attempts, autotune, finish, latest, sweep_id, tagged_pids, wait_until, write_sweep

ASK = ("--slurm", "--nodes", "3", "--gpus-per-node", "2")  # the whole lab: a second allocation would queue
SLOTS = 6


@pytest.fixture
def runners(slurm_lab):
    """Background runners; afterwards every allocation of autotune's still in the lab is given back."""
    rig = Runners()
    yield rig
    rig.cleanup()
    for job in slurm_lab.run("squeue", "-h", "-n", "autotune", "-o", "%i", check=False).stdout.split():
        slurm_lab.release(job)


def listed(slurm_lab, job: str) -> bool:
    """Whether Slurm still lists the job (pending, running or completing)."""
    return bool(slurm_lab.run("squeue", "-h", "-j", job, check=False).stdout.strip())


def asked_and_killed(slurm_lab, tmp_path: Path, runners: Runners, experiments: int, seconds: float,
                     keep: int) -> tuple[Path, str, dict[str, str]]:
    """`autotune run` outside an allocation asks for the whole lab (keeper bound `keep`), starts a step on every
    GPU, and is killed -9 (alone, as an OOM kill or a crash would): its results, its job and its environment."""
    spec = write_sweep(tmp_path, range(experiments), extra="num_gpus: 1")
    results = tmp_path / "r"
    environ = lab_env(slurm_lab, STANDIN_SECONDS=seconds, AUTOTUNE_SLURM_KEEP=keep)
    proc = runners.start("run", spec, *ASK, "--launcher", standin(tmp_path), "-o", results, "-q", environ=environ,
                         directory=results)
    try:
        wait_until(lambda: proc.poll() is not None or ((results / "ledger.sqlite").exists()
                   and len([a for a in attempts(results) if a.handle]) == min(experiments, SLOTS)), 120,
                   "steps recorded")
    except AssertionError as e:
        raise AssertionError(f"{e}; Slurm lists:\n{slurm_lab.run('squeue', '-a', '-s', check=False).stdout}"
                             f"{slurm_lab.run('squeue', '-a', check=False).stdout}") from None
    assert proc.poll() is None, finish(proc)
    job = attempts(results)[0].handle.split(".")[0]
    proc.kill()
    finish(proc)
    assert listed(slurm_lab, job)  # the runner is gone; its allocation and steps are not, yet
    return results, job, environ


def succeeded_once(results: Path, experiments: int) -> bool:
    """Every experiment succeeded, in one attempt that ran once (adopted ones were not run again)."""
    runs = attempts(results)
    return (len({a.name for a in runs}) == experiments and all(a.state == State.SUCCEEDED for a in runs)
            and len(runs) == experiments and all(len(node_lines(results, a.name)) == 1 for a in runs))


def test_kill_9_of_the_runner_gives_back_the_allocation_it_asked_for_within_the_bound(slurm_lab, tmp_path, runners):
    results, job, _ = asked_and_killed(slurm_lab, tmp_path, runners, SLOTS, 600, keep=8)
    wait_until(lambda: not listed(slurm_lab, job), 8 + 120, "the allocation given back by its keeper")
    wait_until(lambda: not tagged_pids(sweep_id(results)), 60, "the srun of each step ended with the allocation")


def test_kill_9_then_resume_with_allocation_options_resumes_in_the_sweeps_own_allocation(slurm_lab, tmp_path,
                                                                                          runners):
    """Asking for the size the sweep was run on again would queue a second allocation behind the first, which
    holds the whole lab: the resume runs in the first and gives it back."""
    results, job, environ = asked_and_killed(slurm_lab, tmp_path, runners, 9, 3, keep=300)
    done = autotune("resume", results, *ASK, "-q", environ=environ, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"Slurm job {job}, the allocation this sweep runs in, still runs: resuming in it" in done.stderr
    assert f"gave Slurm job {job} back" in done.stderr
    assert succeeded_once(results, 9), [(a.name, a.attempt, a.state, a.handle) for a in attempts(results)]
    assert all(a.handle.startswith(f"{job}.") for a in attempts(results))
    wait_until(lambda: not listed(slurm_lab, job), 60, "the allocation given back")


def test_kill_9_then_resume_without_options_keeps_the_allocation_past_the_bound(slurm_lab, tmp_path, runners):
    """The resume takes the allocation over: its keeper hears the resume, which runs three rounds of 8 s after
    the adopted ones (more than the 15 s bound), and is not given back under it."""
    results, job, environ = asked_and_killed(slurm_lab, tmp_path, runners, 4 * SLOTS, 8, keep=15)
    done = autotune("resume", results, "-q", environ=environ, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"gave Slurm job {job} back" in done.stderr
    assert succeeded_once(results, 4 * SLOTS), [(a.name, a.attempt, a.state, a.detail) for a in attempts(results)]
    assert all(a.handle.startswith(f"{job}.") for a in attempts(results))


def test_kill_9_of_a_resumed_runner_gives_the_allocation_back_too(slurm_lab, tmp_path, runners):
    results, job, environ = asked_and_killed(slurm_lab, tmp_path, runners, SLOTS, 600, keep=20)
    resumed = runners.start("resume", results, "-q", environ=environ, directory=results)
    wait_until(lambda: holder_pid(results) == resumed.pid, 60, "the resume holding the sweep")
    resumed.kill()
    finish(resumed)
    wait_until(lambda: not listed(slurm_lab, job), 20 + 120, "the allocation given back by its keeper")


def test_cancel_with_no_runner_gives_back_the_allocation_autotune_asked_for(slurm_lab, tmp_path, runners):
    results, job, environ = asked_and_killed(slurm_lab, tmp_path, runners, SLOTS, 600, keep=3600)
    done = autotune("cancel", results, environ=environ)
    assert done.returncode == 0, done.stderr
    assert f"gave Slurm job {job} back" in done.stdout
    assert {a.state for a in attempts(results)} <= {State.CANCELLED, State.INTERRUPTED}
    wait_until(lambda: not listed(slurm_lab, job), 60, "the allocation given back")  # its keeper would wait an hour


def test_a_partial_cancel_with_no_runner_leaves_the_allocation_to_a_resume(slurm_lab, tmp_path, runners):
    """Experiments are left to run: the allocation stays for `resume`, which finishes them in it. Two of eight
    never started (six slots): one is cancelled, the other is left, however soon the six running ones end."""
    results, job, environ = asked_and_killed(slurm_lab, tmp_path, runners, SLOTS + 2, 3, keep=300)
    queued = sorted(a.name for a in attempts(results) if a.state == State.QUEUED)
    assert len(queued) == 2, [(a.name, a.state) for a in attempts(results)]
    done = autotune("cancel", results, queued[0], environ=environ)
    assert done.returncode == 0, done.stderr
    assert "gave" not in done.stdout and listed(slurm_lab, job)
    resumed = autotune("resume", results, "-q", environ=environ, timeout=300)
    assert resumed.returncode == 1, resumed.stderr  # the sweep ended with a cancelled experiment
    assert f"gave Slurm job {job} back" in resumed.stderr
    final = latest(results)
    assert final[queued[0]].state == State.CANCELLED
    assert all(a.state == State.SUCCEEDED and a.handle.startswith(f"{job}.") for n, a in final.items()
               if n != queued[0])


def test_the_keeper_gives_back_its_job_after_the_bound_even_when_heartbeats_hit_its_commands(tmp_path):
    """The keeper's script alone (scancel a stand-in that logs its arguments): heartbeats sent to the shell and
    its children at once, as `scancel --signal=USR1 --batch` sends them, kill its `date` and `sleep` mid-way;
    it must neither die of it nor miss its end, which it reaches by cancelling its job (a shell that died of a
    bad arithmetic would never call scancel)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scancel").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "scancel.log"}\n')
    (bin_dir / "scancel").chmod(0o755)
    environ = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "41"}
    proc = subprocess.Popen(["sh", "-c", keeper.script(2)], env=environ, start_new_session=True,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: catches_usr1(proc.pid), 30, "the keeper's trap set")
        for _ in range(300):
            os.killpg(proc.pid, signal.SIGUSR1)
            time.sleep(0.002)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    assert (tmp_path / "scancel.log").read_text() == "41\n"
    assert "no heartbeat for 2 s: giving Slurm job 41 back" in err


def catches_usr1(pid: int) -> bool:
    """Whether the process has a handler for SIGUSR1 (its shell has run `trap ... USR1`)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGUSR1 - 1) & 1)
    return False
