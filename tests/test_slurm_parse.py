"""Reading Slurm's text (autotuner/backends/slurm/parse.py) on output recorded from a real Slurm 22.05 cluster
(tests/data/slurm, see its README), and on hand-made lines for what the lab cannot show (typed GPUs, tracked
memory, zero-padded host lists)."""
from pathlib import Path

import pytest

from autotuner.backends.recovery import recover
from autotuner.backends.slurm import parse
from autotuner.backends.slurm.backend import SlurmBackend
from autotuner.backends.slurm.watch import end_seconds
from autotuner.ledger.store import Ledger
from autotuner.states import State

from helpers import SWEEP_META, experiment

DATA = Path(__file__).parent / "data" / "slurm"


def text(name: str) -> str:
    return (DATA / name).read_text()


def test_host_lists_expand_as_scontrol_show_hostnames_does():
    assert parse.expand_hosts("n[1-3]") == text("hostnames.txt").split()
    assert parse.expand_hosts("gpu[01-03,10],login,a[1-2]b[7-8]") == [
        "gpu01", "gpu02", "gpu03", "gpu10", "login", "a1b7", "a1b8", "a2b7", "a2b8"]
    with pytest.raises(ValueError):
        parse.expand_hosts("n[x-3]")


def test_an_allocation_with_per_node_detail():
    job = parse.job(text("job-with-steps-detail.txt"))
    assert (job.state, job.nodes) == ("RUNNING", ("n1", "n2"))
    assert job.shares["n1"] == parse.NodeShare(cpus=2, memory_mb=0, gpus=parse.Gpus(2, (0, 1)))
    assert job.end_time is None  # no time limit: EndTime=Unknown


@pytest.mark.parametrize("name, nodes, gpus, cpus", [
    ("job-N3-gpus-per-node-2.txt", 3, 2, 1),  # one CPU per node: fewer CPUs than GPUs
    ("job-N3-gres-gpu-2.txt", 3, 2, 1),
    ("job-N2-gpus-per-node-1.txt", 2, 1, 1),
    ("job-N3-gpus-per-node-2-exclusive.txt", 3, 2, 2),
    ("job-N3-gpus-per-node-2-cpus-per-gpu-1.txt", 3, 2, 2),
])
def test_allocations_without_detail_read_from_the_per_node_request(name, nodes, gpus, cpus):
    job = parse.job(text(name))
    assert job.state == "RUNNING" and len(job.nodes) == nodes
    assert {(s.gpus.count if s.gpus else 0, s.cpus) for s in job.shares.values()} == {(gpus, cpus)}


@pytest.mark.parametrize("name, state, end", [
    ("job-cancelled.txt", "CANCELLED", "2026-11-23T22:01:41"),
    ("job-timeout.txt", "TIMEOUT", "2026-11-23T22:03:11"),
    ("job-node-fail.txt", "NODE_FAIL", "2026-11-23T22:01:47"),
    ("job-time-limit-running.txt", "RUNNING", "2026-11-23T22:02:58"),
])
def test_a_jobs_state_and_end(name, state, end):
    job = parse.job(text(name))
    assert (job.state, job.end_time) == (state, end)
    assert end_seconds(job.end_time) is not None


def test_node_states_drained_down_mixed():
    nodes = {n.name: n for n in parse.nodes(text("nodes-drained-mixed-down.txt"))}
    assert nodes["n1"].states == {"IDLE", "DRAIN"} and nodes["n1"].lost
    assert nodes["n1"].reason == "testdrain [root@2026-11-23T22:01:44]"  # a value with a space, whole
    assert nodes["n2"].states == {"MIXED"} and not nodes["n2"].lost and nodes["n2"].reason is None
    assert nodes["n3"].states == {"DOWN"} and nodes["n3"].lost
    assert all(n.address == "127.0.0.1" and n.gpus == parse.Gpus(2) for n in nodes.values())
    draining = {n.name: n for n in parse.nodes(text("nodes-draining.txt"))}
    assert draining["n2"].states == {"ALLOCATED", "DRAIN"} and draining["n2"].lost
    assert not draining["n1"].lost


def test_a_node_that_does_not_answer_is_lost():
    (node,) = parse.nodes("NodeName=g7 NodeAddr=10.0.0.7 Gres=gpu:a100:8(S:0-1) State=MIXED* Reason=(null)")
    assert node.lost and "NOT_RESPONDING" in node.states and node.gpus == parse.Gpus(8, (), "a100")


def test_steps_and_their_names():
    steps = parse.steps(text("squeue-steps.txt"))
    assert steps == [parse.Step("6.0", "exp-a", ("n1",)), parse.Step("6.1", "exp-b", ("n2",))]
    # %T is not a step field: squeue prints it as is; the first three fields still read
    assert [s.id for s in parse.steps(text("squeue-steps-percent-T.txt"))] == ["6.0", "6.1"]


def test_the_first_bad_exit_of_a_step_that_srun_ended():
    # n2's launcher exited 250 (its rank aborted at exit); srun then ended n1's with SIGTERM and exited 143
    assert parse.first_bad_exit(text("srun-rank-aborted-at-exit.stderr")) == 250
    # a node failure, a cancel, a time limit: no task's own exit status tells
    for name in ("srun-node-failure-other-node.stderr", "srun-step-cancelled.stderr", "srun-time-limit.stderr"):
        assert parse.first_bad_exit(text(name)) is None, name
    # two statuses of their own, or a task that ended by a signal the step's kill does not send: not one story
    assert parse.first_bad_exit("srun: error: n1: task 0: Exited with exit code 1\n"
                                "srun: error: n2: task 1: Exited with exit code 2\n") is None
    assert parse.first_bad_exit("srun: error: n1: task 0: Segmentation fault (core dumped)\n"
                                "srun: error: n2: task 1: Exited with exit code 250\n") is None
    assert parse.first_bad_exit("srun: error: n1: tasks 0-1: Exited with exit code 3\n"
                                "srun: error: n2: task 2: Killed\n") == 3


def test_the_first_bad_exit_after_a_rank_s_unended_line_or_before_a_carriage_return():
    """srun's lines share the file the ranks write to: after a progress bar's last "\r 99%|..." with no newline,
    or ended "\r\n", the node that exited 250 was not found and a step that measured was judged by srun's 143."""
    aborted = text("srun-rank-aborted-at-exit.stderr")
    assert parse.first_bad_exit("\r 99%|#########9| 99/100 [00:09<00:00]" + aborted) == 250
    assert parse.first_bad_exit(aborted.replace("\n", "\r\n")) == 250
    assert parse.first_bad_exit("srun: error: gpu-node.rack-1.example: tasks 0-3: Exited with exit code 250\r\n"
                                "srun: error: gpu-node.rack-2: tasks 4-7: Terminated\r\n") == 250
    # "exit code 0" is no bad exit srun reports: a script's line made to look like srun's tells nothing
    assert parse.first_bad_exit("srun: error: n9: task 0: Exited with exit code 0\n"
                                "srun: error: n1: task 0: Terminated\n") is None


def test_the_job_sbatch_submitted():
    assert parse.submitted_job("41\n") == "41"
    assert parse.submitted_job("41;lab\n") == "41"  # --parsable on a federation names the cluster
    assert parse.submitted_job("") is None
    assert parse.submitted_job("sbatch: error: Batch job submission failed: Invalid partition name specified") is None


def test_typed_gpus_and_tracked_memory_in_detail():
    line = ("JobId=77 JobState=RUNNING NodeList=g[01-02] EndTime=2026-12-01T08:00:00 JOB_GRES=gpu:h100:16 "
            "Nodes=g01 CPU_IDs=0-31 Mem=512000 GRES=gpu:h100:8(IDX:0-7) "
            "Nodes=g02 CPU_IDs=0-15,32-47 Mem=512000 GRES=gpu:h100:8(IDX:0-7) MinCPUsNode=1")
    job = parse.job(line)
    assert job.nodes == ("g01", "g02") and job.end_time == "2026-12-01T08:00:00"
    assert job.shares["g02"] == parse.NodeShare(32, 512000, parse.Gpus(8, tuple(range(8)), "h100"))
    assert parse.gpus_of("gres/gpu:a100=4") == parse.Gpus(4, (), "a100")
    assert parse.gpus_of("gpu:2(IDX:1,3),shard:0") == parse.Gpus(2, (1, 3))
    assert parse.gpus_of("mps:100") is None


def test_a_step_that_ended_while_no_runner_was_alive_is_judged_by_its_first_failing_node(tmp_path):
    """`cancel` with no runner (backends/recovery): a step whose n2 rank measured and then aborted at exit, and
    whose wrapper recorded srun's 143, counts as measured, as it does when the runner follows it."""
    with Ledger.create(tmp_path, SWEEP_META) as ledger:
        ledger.add_experiments([experiment("a"), experiment("b")], at=1.0)
        for name, stderr in (("a", text("srun-rank-aborted-at-exit.stderr")),
                             ("b", "RuntimeError: the rank failed\nsrun: error: n2: task 1: Exited with exit code 1\n"
                                   "srun: error: n1: task 0: Terminated\n")):
            run = tmp_path / name
            run.mkdir()
            (run / "stderr.log").write_text(stderr)
            (run / "metrics.json").write_text('{"throughput": 3.0}')
            (run / "exit_status").write_text("143\n")
            ledger.start(name, 1, slots={"n1": [0], "n2": [0]}, tag=f"t.{name}.1", dir=str(run), at=2.0)
            ledger.launched(name, 1, pid=2 ** 22 + 1, port=None, at=2.0, handle="7.1")
        recover(ledger, 3.0, end=lambda attempt: None, code=SlurmBackend(tmp_path, ledger, None).recorded_code)
        got = {a.name: (a.state, a.exit_code, a.detail) for a in ledger.latest()}
    assert got["a"][:2] == (State.SUCCEEDED, 250) and "aborted at exit" in got["a"][2]
    assert got["b"] == (State.FAILED, 1, "RuntimeError: the rank failed")
