"""Record the Slurm outputs in this directory from a real lab (tests/slurm_lab.py), for parsing tests.

    python tests/data/slurm/record.py            # about 80 s (one job waits out a 1-minute time limit)

Each file holds one command's output as Slurm printed it; `*.stderr` files hold what it wrote to stderr.
The job ids, times and ports differ from run to run; the shapes do not. README.md says what each file holds.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from slurm_lab import SlurmLab, wait_for  # noqa: E402  # the rig lives in tests/


def save(name: str, text: str) -> None:
    (HERE / name).write_text(text)
    print(f"{name}: {len(text.splitlines())} lines")


def salloc(lab: SlurmLab, *args: str) -> tuple[str, str]:
    """`salloc --no-shell ARGS`: (job id, its stderr)."""
    done = lab.run("salloc", "--no-shell", *args)
    found = re.search(r"Granted job allocation (\d+)", done.stderr)
    assert found, done.stderr
    return found.group(1), done.stderr


def start_step(lab: SlurmLab, job: str, name: str, node: str, seconds: int = 30) -> subprocess.Popen[str]:
    """A 1-GPU step on `node` sleeping `seconds`, in the background; returns once its task runs."""
    proc = subprocess.Popen(["srun", "--jobid", job, "--exact", "-N1", "-n1", "-w", node, "--gpus-per-node=1",
                             "--job-name", name, "bash", "-c", f"echo started; exec sleep {seconds}"],
                            env=lab.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "started\n", f"step {name} did not start"
    return proc


def stderr_of(proc: subprocess.Popen[str]) -> str:
    """What a finished srun wrote to stderr, and its exit status as a last comment line."""
    assert proc.stderr is not None
    return proc.stderr.read() + f"# srun exit status: {proc.wait()}\n"


def record_jobs(lab: SlurmLab) -> None:
    save("hostnames.txt", lab.run("scontrol", "show", "hostnames", "n[1-3]").stdout)
    for name, args in [("job-N3-gpus-per-node-2.txt", ["-N3", "--gpus-per-node=2"]),
                       ("job-N3-gres-gpu-2.txt", ["-N3", "--gres=gpu:2"]),
                       ("job-N2-gpus-per-node-1.txt", ["-N2", "--gpus-per-node=1"]),
                       ("job-N3-gpus-per-node-2-exclusive.txt", ["-N3", "--gpus-per-node=2", "--exclusive"]),
                       ("job-N3-gpus-per-node-2-cpus-per-gpu-1.txt", ["-N3", "--gpus-per-node=2", "--cpus-per-gpu=1"])]:
        job, _ = salloc(lab, *args)
        save(name, lab.run("scontrol", "show", "job", "-o", job).stdout)
        lab.release(job)
    save("job-cancelled.txt", lab.run("scontrol", "show", "job", "-o", job).stdout)


def record_steps(lab: SlurmLab) -> None:
    job, _ = salloc(lab, "-N2", "--gpus-per-node=2", "--exclusive")
    a = start_step(lab, job, "exp-a", "n1")
    b = start_step(lab, job, "exp-b", "n2")
    save("squeue-steps.txt", lab.run("squeue", "-h", "-s", "-j", job, "-o", "%i|%j|%N").stdout)
    with_t = lab.run("squeue", "-h", "-s", "-j", job, "-o", "%i|%j|%N|%T")
    save("squeue-steps-percent-T.txt", with_t.stdout)
    save("squeue-steps-percent-T.stderr", with_t.stderr)
    save("squeue-steps-state.txt", lab.run("squeue", "-h", "-s", "-j", job, "-O",
                                           "StepId:|,StepName:|,Nodes:|,StepState:|").stdout)
    save("step.txt", lab.run("scontrol", "show", "step", "-o", f"{job}.0").stdout)
    save("job-with-steps.txt", lab.run("scontrol", "show", "job", "-o", job).stdout)
    save("job-with-steps-detail.txt", lab.run("scontrol", "show", "job", "-o", "-d", job).stdout)
    save("nodes-with-steps-detail.txt", lab.run("scontrol", "show", "node", "-o", "-d").stdout)
    busy = lab.run("srun", "--jobid", job, "--exact", "-N1", "-n1", "-w", "n1", "--gpus-per-node=2", "--immediate",
                   "true", check=False)
    save("srun-busy-immediate.stderr", busy.stderr + f"# srun exit status: {busy.returncode}\n")
    lab.run("scancel", f"{job}.0")
    save("srun-step-cancelled.stderr", stderr_of(a))
    lab.drain("n2", "testdrain")
    save("nodes-draining.txt", lab.run("scontrol", "show", "node", "-o").stdout)
    lab.release(job)
    b.wait()
    lab.resume_node("n2")


def record_nodes(lab: SlurmLab) -> None:
    """n1 DRAINED (idle), n2 MIXED (half of it allocated), n3 DOWN (its slurmd stopped)."""
    job, _ = salloc(lab, "-N1", "-w", "n2", "--gpus-per-node=1")
    lab.drain("n1", "testdrain")
    lab.down("n3", "testdown")
    save("nodes-drained-mixed-down.txt", lab.run("scontrol", "show", "node", "-o").stdout)
    save("sinfo-nodes.txt", lab.run("sinfo", "-h", "-N", "-o", "%N|%T|%G").stdout)
    lab.release(job)
    lab.resume_node("n1")
    lab.start_node("n3")


def record_node_failure(lab: SlurmLab) -> None:
    """A job loses a node: its steps on other nodes are cancelled, the step on the lost node's srun says so."""
    job, _ = salloc(lab, "-N3", "--gpus-per-node=1", "--exclusive")
    on_n1 = start_step(lab, job, "exp-n1", "n1")
    on_n3 = start_step(lab, job, "exp-n3", "n3")
    lab.down("n3", "testdown")
    save("srun-node-failure-other-node.stderr", stderr_of(on_n1))
    save("srun-node-failure-lost-node.stderr", stderr_of(on_n3))
    wait_for("the job to end", lambda: not lab.run("squeue", "-h", "-j", job).stdout.strip(), 60)
    save("job-node-fail.txt", lab.run("scontrol", "show", "job", "-o", job).stdout)
    lab.start_node("n3")


def record_timeout(lab: SlurmLab) -> None:
    """A job with a 1-minute limit, a step running: the job before, while ending and after."""
    job, _ = salloc(lab, "-N1", "-w", "n1", "--gpus-per-node=1", "--exclusive", "-t", "1")
    step = start_step(lab, job, "exp-long", "n1", 300)
    save("job-time-limit-running.txt", lab.run("scontrol", "show", "job", "-o", job).stdout)
    save("srun-time-limit.stderr", stderr_of(step))
    wait_for("the job to end", lambda: not lab.run("squeue", "-h", "-j", job).stdout.strip(), 60)
    save("job-timeout.txt", lab.run("scontrol", "show", "job", "-o", job).stdout)


def main() -> None:
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="slurmlab-") as root, SlurmLab(Path(root)) as lab:
        record_jobs(lab)
        record_steps(lab)
        record_nodes(lab)
        record_node_failure(lab)
        record_timeout(lab)
    print(f"recorded in {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
