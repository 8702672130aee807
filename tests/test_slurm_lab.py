"""The Slurm lab works as the Slurm backend's tests need: steps inside one allocation get GPUs, run side by side
on one node, and the lab's helpers see them."""
from __future__ import annotations

import subprocess
import time

import pytest

# Each step's task writes its CUDA_VISIBLE_DEVICES, then waits (at most 20 s) for the other step's file: if the
# steps ran one after another, the first would never see the second's and would fail.
RENDEZVOUS = ('echo "$CUDA_VISIBLE_DEVICES" > "$1/$2.gpus"; '
              'for _ in $(seq 400); do [ -e "$1/$3.gpus" ] && exit 0; sleep 0.05; done; exit 1')


@pytest.fixture
def job(slurm_lab):
    """One node, both its GPUs and both its CPUs (a step takes a CPU: two steps side by side need two)."""
    job = slurm_lab.allocate(1, 2, "--exclusive")
    yield job
    slurm_lab.release(job)


def step(slurm_lab, job: str, name: str, *command: str) -> subprocess.Popen[str]:
    return subprocess.Popen(["srun", "--jobid", job, "--exact", "-N1", "-n1", "--gpus-per-node=1",
                             "--job-name", name, *command], env=slurm_lab.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_step_gets_one_gpu(slurm_lab, job):
    proc = step(slurm_lab, job, "one", "printenv", "CUDA_VISIBLE_DEVICES")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out.strip() in ("0", "1")


def test_two_steps_run_at_once_on_one_node_on_different_gpus(slurm_lab, job, tmp_path):
    a = step(slurm_lab, job, "side-a", "bash", "-c", RENDEZVOUS, "-", str(tmp_path), "a", "b")
    b = step(slurm_lab, job, "side-b", "bash", "-c", RENDEZVOUS, "-", str(tmp_path), "b", "a")
    for proc in (a, b):
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    assert {(tmp_path / "a.gpus").read_text().strip(), (tmp_path / "b.gpus").read_text().strip()} == {"0", "1"}


def test_the_lab_lists_a_running_step_by_name(slurm_lab, job, tmp_path):
    started = tmp_path / "started"
    proc = step(slurm_lab, job, "listed", "bash", "-c", f'touch "{started}"; exec sleep 60')
    try:
        while not started.exists():
            assert proc.poll() is None, proc.communicate()[1]
            time.sleep(0.02)
        (found,) = [s for s in slurm_lab.steps(job) if s.name == "listed"]
        assert found.step_id.startswith(f"{job}.")
        assert found.nodes in slurm_lab.nodes
        slurm_lab.run("scancel", found.step_id)
        proc.communicate(timeout=30)
        assert proc.returncode == 137  # SIGKILLed by the cancel, not ended by itself
    finally:
        proc.kill()
        proc.communicate()


def test_drain_and_resume(slurm_lab):
    slurm_lab.drain("n3")
    try:
        assert "DRAIN" in slurm_lab.node_state("n3")
    finally:
        slurm_lab.resume_node("n3")
    assert slurm_lab.node_state("n3") == "IDLE"


def test_a_request_not_granted_in_time_is_withdrawn(slurm_lab):
    """All three nodes held whole: a request for one waits; past its timeout it is withdrawn, not left queued to
    start later and hold the nodes the next test asks for (one slow grant used to chain into failures)."""
    held = slurm_lab.allocate(3, 2, "--exclusive")
    try:
        with pytest.raises(RuntimeError, match="not granted in 2 s"):
            slurm_lab.allocate(1, 1, timeout=2)
        assert slurm_lab.run("squeue", "-h", "-o", "%i").stdout.split() == [held]
    finally:
        slurm_lab.release(held)
