"""Sweeps inside a real Slurm cluster (tests/slurm_lab.py: munged, slurmctld and three slurmd on loopback, each node
with two fake GPUs that Slurm's GRES code hands out): each attempt is a job step on exactly the nodes and GPU counts
the scheduler reserved; stops, the allocation's end and an allocation asked for by autotune itself (a lost node,
kill -9 then resume or cancel, a stop: tests/test_backend_suite.py, as on every backend). The nodes are this
machine: "nothing left" is checked on its process table and in Slurm's step list."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from autotuner.ledger.store import Ledger
from autotuner.states import State

from cli_rig import (
    Runners,
    attempts,
    autotune,
    cli,
    finish,
    latest,
    sweep_id,
    tagged_pids,
    wait_until,
    write_sweep,
)

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "experiments" / "train.py"

# Each node's launcher (in place of DeepSpeed's) logs a SIGTERM if one comes (its trap set first, then said ready
# with the time), what Slurm and the runner gave it, and its first node writes the metrics; then it sleeps
# $STANDIN_SECONDS.
NODE_STANDIN = """\
#!/bin/sh
dir=$(dirname "$AUTOTUNE_METRICS_PATH")
trap 'echo "term $SLURM_NODEID" >> "$dir/signals.log"; [ -n "$pid" ] && kill $pid; exit 143' TERM
echo "ready $SLURM_NODEID $(date +%s.%N)" >> "$dir/ready.log"
echo "node=$SLURM_NODEID step=$SLURM_JOB_ID.$SLURM_STEP_ID host=$SLURMD_NODENAME gpus=$CUDA_VISIBLE_DEVICES args=$*" \
  >> "$dir/nodes.log"
if [ "$SLURM_NODEID" = 0 ]; then printf '{"throughput": 2.0, "latency": 1.0}\\n' > "$AUTOTUNE_METRICS_PATH"; fi
sleep "${STANDIN_SECONDS:-0.5}" &
pid=$!
wait $pid
"""


@pytest.fixture
def runners():
    rig = Runners()
    yield rig
    rig.cleanup()


@pytest.fixture
def allocation(slurm_lab):
    """A running allocation of the three nodes, two GPUs and both CPUs each; cancelled afterwards."""
    job = slurm_lab.allocate(3, 2, "--exclusive")
    yield job
    slurm_lab.release(job)


def lab_env(slurm_lab, job: str | None = None, **extra: object) -> dict[str, str]:
    environ = dict(slurm_lab.env) | {"AUTOTUNE_SLURM_POLL": "0.2"} | {k: str(v) for k, v in extra.items()}
    if job is not None:
        environ["SLURM_JOB_ID"] = job
    return environ


def standin(tmp_path: Path) -> str:
    path = tmp_path / "node.sh"
    path.write_text(NODE_STANDIN)
    return f"sh {path}"


def node_lines(results: Path, name: str) -> list[dict[str, str]]:
    """What each node of each attempt of `name` logged (node, step, host, gpus, args)."""
    log = results / name / "nodes.log"
    fields = re.compile(r"(\w+)=(\S*)")
    return [dict(fields.findall(line.split(" args=")[0])) | {"args": line.split(" args=", 1)[1]}
            for line in log.read_text().splitlines()] if log.exists() else []


def run_logs(run_dir: Path) -> str:
    """The ends of a run's logs, for a failure message that says why the run failed."""
    return "".join(f"\n--- {p.name}\n" + p.read_text(errors="replace")[-4000:] for p in sorted(run_dir.glob("*.log")))


def no_step_left(slurm_lab, job: str, sweep: str) -> bool:
    return not [s for s in slurm_lab.steps(job) if s.name.startswith(f"{sweep}.")] and not tagged_pids(sweep)


def test_each_experiment_is_a_step_on_exactly_its_nodes_and_gpus(slurm_lab, allocation, tmp_path):
    spec = write_sweep(tmp_path, range(6), extra="num_gpus: 1")
    two = write_sweep(tmp_path, range(2), name="m", extra="num_gpus: 2\n  num_nodes: 2", filename="two.hjson")
    results = tmp_path / "r"
    done = autotune("run", spec, two, "--slurm", "--launcher", standin(tmp_path), "-o", results, "-q",
                    environ=lab_env(slurm_lab, allocation, STANDIN_SECONDS=1.5))
    assert done.returncode == 0, done.stderr
    runs = {a.name: a for a in attempts(results)}
    assert len(runs) == 8 and all(a.state == State.SUCCEEDED and a.attempt == 1 for a in runs.values())
    steps = [a.handle for a in runs.values()]  # the Slurm backend's handle of an attempt: its step's id
    assert all(s and s.startswith(f"{allocation}.") for s in steps) and len(set(steps)) == 8  # one step each
    held: dict[str, list[tuple[float, float, set[str]]]] = defaultdict(list)
    for name, attempt in runs.items():
        lines = node_lines(results, name)
        hosts = list(attempt.slots)
        assert sorted(line["host"] for line in lines) == sorted(hosts)  # on exactly the reserved nodes
        for line in lines:
            assert line["step"] == attempt.handle
            gpus = line["gpus"].split(",")
            assert len(gpus) == attempt_gpus(name)  # exactly its GPU count on each node, as Slurm gave them
            rank = int(line["node"])
            assert f"--node_rank {rank}" in line["args"] and "--no_ssh" in line["args"]
            assert f"{hosts[rank]}:{line['gpus']}" in line["args"]  # DeepSpeed told those very GPUs
            held[line["host"]].append((attempt.started_at, attempt.finished_at, set(gpus)))
    for host, spans in held.items():  # runs that overlapped in time on one node had different GPUs
        for i, (start, end, gpus) in enumerate(spans):
            for other_start, other_end, other_gpus in spans[i + 1:]:
                if start < other_end and other_start < end:
                    assert not gpus & other_gpus, host
    assert no_step_left(slurm_lab, allocation, sweep_id(results))


def test_deepspeeds_shared_memory_buffers_are_removed_on_the_nodes_when_a_step_ends(slurm_lab, allocation,
                                                                                     tmp_path):
    """DeepSpeed's CPU allreduce leaves a 69 MB file in /dev/shm per rank and never removes it (see test_executor):
    each node of a step makes one the same way, named by the master's address and port; once the step has ended
    they are gone from its nodes (removed there, by a step of their own: the runner's machine may be no node), and
    a buffer of another port is left alone."""
    node = tmp_path / "shm_node.sh"
    node.write_text(f"""while [ $# -gt 0 ]; do case "$1" in --master_port) port=$2;; --master_addr) addr=$2;; esac
shift; done
echo "$SLURMD_NODENAME $addr $port" >> {tmp_path / 'buffers'}
: > "/dev/shm/deepspeed_allreduce_buffer_$(id -u)_${{addr}}_${{port}}_$SLURM_NODEID"
exec sh {tmp_path / 'node.sh'}
""")
    standin(tmp_path)
    spec = write_sweep(tmp_path, range(2), extra="num_gpus: 1")
    two = write_sweep(tmp_path, range(1), name="m", extra="num_gpus: 1\n  num_nodes: 2", filename="two.hjson")
    # port 3: no run of ours has it, nor another file's test of this (an xdist worker may run one at once)
    other = Path(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_3_0")
    other.touch()
    try:
        done = autotune("run", spec, two, "--slurm", "--launcher", f"sh {node}", "-o", tmp_path / "r", "-q",
                        environ=lab_env(slurm_lab, allocation, STANDIN_SECONDS=0.2))
        assert done.returncode == 0, done.stderr
        made = [line.split() for line in (tmp_path / "buffers").read_text().splitlines()]
        assert len(made) == 4 and {host for host, _, _ in made} <= set(slurm_lab.nodes)  # 1 + 1 + 2 nodes
        shm = Path("/dev/shm")
        assert [b for _, addr, port in made for b in shm.glob(f"deepspeed_allreduce_buffer_*_{addr}_{port}_*")] == []
        assert other.exists()  # not a run of ours
        assert no_step_left(slurm_lab, allocation, sweep_id(tmp_path / "r"))
    finally:
        other.unlink(missing_ok=True)


def test_a_steps_buffers_are_removed_under_its_first_nodes_address_by_a_step_on_its_nodes(slurm_lab, allocation,
                                                                                          monkeypatch):
    """The removal is the Slurm executor's own, on the step's nodes, for the address its ranks were told (the
    first node's, which is not this machine's): with n1 reached at 127.0.0.9, the buffers named by it go, and
    those named by this machine's address (what a local clean-up would remove) stay."""
    from types import SimpleNamespace

    from autotuner.backends.slurm.allocation import allocation_of
    from autotuner.backends.slurm.executor import slurm_executor
    from autotuner.spec.metrics import metric_named

    for key, value in slurm_lab.env.items():
        monkeypatch.setenv(key, value)
    found = allocation_of(allocation)
    moved = type(found)(**{**found.__dict__, "addresses": {**found.addresses, "n1": "127.0.0.9"}})
    executor = slurm_executor("", metric_named("throughput"), time.monotonic, allocation=moved)
    theirs = [Path(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.9_23456_{rank}") for rank in (0, 1)]
    ours = Path(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_23456_0")
    for path in (*theirs, ours):
        path.touch()
    try:
        run = SimpleNamespace(tag="buffers-test.1", reservation=SimpleNamespace(hosts=("n1", "n2")))
        executor.remove_buffers(run, 23456)  # type: ignore[arg-type]
        assert not [p for p in theirs if p.exists()]
        assert ours.exists()
    finally:
        for path in (*theirs, ours):
            path.unlink(missing_ok=True)


def test_buffers_are_removed_in_an_allocation_that_counts_its_gpus_per_job(slurm_lab, monkeypatch):
    """`salloc --gpus=2 -N2`: a step that names no GPUs of its own inherits the job's two, which no single node
    holds, and Slurm refuses it ("Invalid generic resource"); the removal step asks for none."""
    from types import SimpleNamespace

    from autotuner.backends.slurm.allocation import allocation_of
    from autotuner.backends.slurm.executor import slurm_executor
    from autotuner.spec.metrics import metric_named

    for key, value in slurm_lab.env.items():
        monkeypatch.setenv(key, value)
    job = slurm_lab.allocate(2, 0, "--gpus=2", "--ntasks=2")
    buffer = Path(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_23457_0")
    buffer.touch()
    try:
        found = allocation_of(job)
        assert sum(found.gpus.values()) == 2
        executor = slurm_executor("", metric_named("throughput"), time.monotonic, allocation=found)
        run = SimpleNamespace(tag="buffers-test.2", reservation=SimpleNamespace(hosts=(found.nodes[0],)))
        executor.remove_buffers(run, 23457)  # type: ignore[arg-type]
        assert not buffer.exists()
    finally:
        buffer.unlink(missing_ok=True)
        slurm_lab.release(job)


def attempt_gpus(name: str) -> int:
    return 2 if name.startswith("m_") else 1


def _lines(path: Path) -> list[str]:
    """A stand-in's log's lines; none where it never wrote one."""
    return path.read_text().splitlines() if path.exists() else []


def test_a_timeout_and_a_cancel_end_the_step_and_leave_nothing(slurm_lab, allocation, tmp_path, runners):
    spec = write_sweep(tmp_path, range(2), extra="num_gpus: 1\n  num_nodes: 2")
    results = tmp_path / "timeout"
    done = autotune("run", spec, "--slurm", "--launcher", standin(tmp_path), "-o", results, "-q", "--timeout", "5",
                    "--grace", "2", environ=lab_env(slurm_lab, allocation, STANDIN_SECONDS=120))
    assert done.returncode == 1, done.stderr
    assert {a.state for a in attempts(results)} == {State.TIMED_OUT}
    with Ledger.open(results) as ledger:
        asked = {(n, k): at for n, k, at in ledger._db.execute("SELECT name, attempt, at FROM stops")}
    running = 0
    for a in attempts(results):  # each node's launcher running when the stop came was asked to end (SIGTERM)
        # before the step was killed (one that Slurm started later, under load, is only killed with its step)
        ready = dict(line.split()[1:] for line in _lines(results / a.name / "ready.log"))
        termed = {line.split()[1] for line in _lines(results / a.name / "signals.log")}
        before = {node for node, at in ready.items() if float(at) < asked[(a.name, a.attempt)]}
        assert before <= termed, (ready, termed, asked)
        running += len(before)
    assert running  # the path was taken: launchers were running when the time was up (5 s after the launch)
    assert no_step_left(slurm_lab, allocation, sweep_id(results))

    results = tmp_path / "cancel"
    proc = runners.start("run", spec, "--slurm", "--launcher", standin(tmp_path), "-o", results, "-q",
                         environ=lab_env(slurm_lab, allocation, STANDIN_SECONDS=120), directory=results)
    wait_until(lambda: len(slurm_lab.steps(allocation)) == 2, 60, "both steps running")
    assert autotune("cancel", results, environ=lab_env(slurm_lab)).returncode == 0
    code, _, err = finish(proc)
    assert code == 1, err
    assert {a.state for a in attempts(results)} == {State.CANCELLED}, err
    assert no_step_left(slurm_lab, allocation, sweep_id(results))


def test_the_allocation_end_interrupts_and_resume_in_a_new_one_finishes(slurm_lab, tmp_path, runners):
    spec = write_sweep(tmp_path, range(3), extra="num_gpus: 1")
    results = tmp_path / "r"
    first = slurm_lab.allocate(2, 2, "--exclusive", "--time=10")
    try:
        proc = runners.start("run", spec, "--slurm", "--launcher", standin(tmp_path), "-o", results, "-q",
                             "--grace", "1", environ=lab_env(slurm_lab, first, STANDIN_SECONDS=120),
                             directory=results)
        wait_until(lambda: len(slurm_lab.steps(first)) == 3, 60, "three steps running")
        # The time limit now ends the allocation 33 s from now: the runner stops 31 s (grace + 30) before.
        end = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 33))
        slurm_lab.run("scontrol", "update", f"jobid={first}", f"EndTime={end}")
        code, _, err = finish(proc, timeout=60)
        assert code == 130, err
        assert {a.state for a in attempts(results)} == {State.INTERRUPTED}
        assert all("time limit" in (a.detail or "") for a in attempts(results))
        assert no_step_left(slurm_lab, first, sweep_id(results))
    finally:
        slurm_lab.release(first)
    second = slurm_lab.allocate(1, 2, "--exclusive")
    try:
        done = autotune("resume", results, "-q", environ=lab_env(slurm_lab, second, STANDIN_SECONDS=0.5))
        assert done.returncode == 0, done.stderr
        final = latest(results)
        assert all(a.state == State.SUCCEEDED and a.attempt == 2 and a.handle.startswith(f"{second}.")
                   for a in final.values())
    finally:
        slurm_lab.release(second)


def test_outside_an_allocation_autotune_asks_for_one_and_gives_it_back(slurm_lab, tmp_path):
    spec = write_sweep(tmp_path, range(2), extra="num_gpus: 1")
    results = tmp_path / "r"
    done = autotune("run", spec, "--slurm", "--nodes", "2", "--gpus-per-node", "1", "--launcher", standin(tmp_path),
                    "-o", results, "-q", environ=lab_env(slurm_lab))
    assert done.returncode == 0, done.stderr
    job = re.search(r"gave Slurm job (\d+) back", done.stderr).group(1)
    assert all(a.handle.startswith(f"{job}.") for a in attempts(results))
    wait_until(lambda: not slurm_lab.run("squeue", "-h", "-j", job, check=False).stdout.strip(), 30, "job gone")


# A program of the user's: autotuner.run with a Slurm ask, once with an output path that is refused after the
# allocation was granted, once to its end. It prints the job each call ran in, as the sweep's record names it.
API_PROGRAM = """
import sys
from pathlib import Path

import autotuner

spec, results, launcher = sys.argv[1], Path(sys.argv[2]), sys.argv[3].split()
ask = autotuner.SlurmAsk(slurm=True, nodes=1, gpus_per_node=1)
sweep = autotuner.load_sweep([spec])
(results.parent / "a-file").write_text("")
try:
    autotuner.run(sweep, ask, results.parent / "a-file" / "r", launcher=launcher)
except autotuner.UserError as e:
    print("refused:", e)
result = autotuner.run(sweep, ask, results, launcher=launcher)
print("exit", result.exit_code, "job", result.snapshot.meta.backend.data["job"])
"""


def test_the_python_api_asks_for_an_allocation_and_gives_it_back_however_run_ends(slurm_lab, tmp_path):
    """The allocation is held by the Slurm backend for `autotuner.run`, not by the command line: a program that
    calls it with a Slurm ask leaves nothing in Slurm, whether the run was refused or went to its end."""
    spec = write_sweep(tmp_path, range(2), extra="num_gpus: 1")
    results = tmp_path / "r"
    done = subprocess.run([sys.executable, "-c", API_PROGRAM, str(spec), str(results), standin(tmp_path)],
                          env=lab_env(slurm_lab) | {"PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "refused:" in done.stdout and "exit 0 job " in done.stdout, done.stdout
    assert {a.state for a in attempts(results)} == {State.SUCCEEDED}
    wait_until(lambda: not slurm_lab.run("squeue", "-h", "-n", "autotune", "-o", "%i").stdout.strip(), 60,
               "both allocations given back")


def test_a_real_two_node_deepspeed_run_as_one_step(slurm_lab, allocation, tmp_path):
    extra = 'num_nodes: 2\n  num_gpus: 1\n  env: {GLOO_SOCKET_IFNAME: "lo", DS_ACCELERATOR: "cpu"}'
    (tmp_path / "sweep.hjson").write_text(f"""{{
  name: ds
  script: {TRAIN}
  args: ["--steps", "7", "--hidden", "64"]
  {extra}
  ds_config: {{train_micro_batch_size_per_gpu: 4, optimizer: {{type: "Adam", params: {{lr: 0.001, torch_adam: true}}}}}}
  space: {{"gradient_accumulation_steps": [1]}}
}}""")
    results = tmp_path / "r"
    done = autotune("run", tmp_path / "sweep.hjson", "--slurm", "--timeout", "300", "-o", results, "-q",
                    environ=lab_env(slurm_lab, allocation), timeout=400)
    (attempt,) = attempts(results)
    assert done.returncode == 0, done.stdout + done.stderr + str(attempt.detail) + run_logs(results / attempt.name)
    assert len(attempt.slots) == 2
    log = (results / attempt.name / "stdout.log").read_text() + (results / attempt.name / "stderr.log").read_text()
    assert "world_size=2" in log.replace(" ", "") or "dist_world_size=2" in log
    assert json.loads((results / attempt.name / "metrics.json").read_text())["throughput"] > 0
    assert no_step_left(slurm_lab, allocation, sweep_id(results))


# Node 0 measures and then runs on; node 1, once the metrics are written, says LAST_WORDS and its launcher exits
# 250, as DeepSpeed's does when its rank aborts: srun then ends node 0's with SIGTERM and itself exits 143. The
# pause before the exit is the launcher's own (it logs the rank's end first): srun may drop what a task wrote just
# before an exit that makes it end the step.
ABORTING_STANDIN = """\
#!/bin/sh
if [ "$SLURM_NODEID" = 0 ]; then printf '{"throughput": 2.0}\\n' > "$AUTOTUNE_METRICS_PATH"; exec sleep 60; fi
while [ ! -s "$AUTOTUNE_METRICS_PATH" ]; do sleep 0.1; done
printf '%s\\n' "$LAST_WORDS" >&2
sleep 0.5
exit 250
"""


@pytest.mark.parametrize("last_words, state", [
    ("terminate called without an active exception", State.SUCCEEDED),  # gloo's threads, at the rank's exit
    ("RuntimeError: the rank failed", State.FAILED),
])
def test_a_step_is_judged_by_the_node_whose_failure_ended_it(slurm_lab, allocation, tmp_path, last_words, state):
    spec = write_sweep(tmp_path, [1], extra="num_gpus: 1\n  num_nodes: 2")
    (tmp_path / "node.sh").write_text(ABORTING_STANDIN)
    results = tmp_path / "r"
    done = autotune("run", spec, "--slurm", "--launcher", f"sh {tmp_path / 'node.sh'}", "-o", results, "-q",
                    environ=lab_env(slurm_lab, allocation, LAST_WORDS=last_words))
    (attempt,) = attempts(results)
    assert "Exited with exit code 250" in (results / attempt.name / "stderr.log").read_text()
    assert (attempt.state, attempt.exit_code) == (state, 250), attempt.detail
    assert done.returncode == (0 if state == State.SUCCEEDED else 1), done.stderr
    assert ("aborted at exit" if state == State.SUCCEEDED else last_words) in attempt.detail
    assert no_step_left(slurm_lab, allocation, sweep_id(results))


@pytest.mark.parametrize("args, says", [
    (["--nodes", "2"], "--nodes is for a Slurm allocation: add --slurm"),
    (["--slurm", "--slots", "2"], "--slurm takes its nodes from the allocation: leave out --slots"),
    (["--slurm"], "--slurm outside an allocation: give --nodes and --gpus-per-node"),
    (["--slurm", "--nodes", "1", "--gpus-per-node", "1", "--partition", "nosuch"], "Invalid partition name"),
])
def test_bad_slurm_asks_are_one_line(slurm_lab, tmp_path, args, says):
    spec = write_sweep(tmp_path, range(1))
    done = autotune("run", spec, *args, "-o", tmp_path / "r", environ=lab_env(slurm_lab))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in done.stderr, done.stderr  # no note before
    assert not (tmp_path / "r").exists()


def test_slurm_commands_missing_is_one_line(tmp_path):
    spec = write_sweep(tmp_path, range(1))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")} | {
        "SLURM_JOB_ID": "7", "PATH": str(Path(os.__file__).parent)}  # no Slurm command on PATH
    done = subprocess.run([os.sys.executable, "-m", "autotuner.cli", "run", str(spec), "--slurm"],
                          capture_output=True, text=True, env=environ, timeout=60)
    assert done.returncode == 2 and "scontrol: no such command" in done.stderr, done.stderr


def test_hosts_shows_the_allocation_and_a_drained_node(slurm_lab, allocation):
    environ = lab_env(slurm_lab, allocation)
    done = autotune("hosts", "--slurm", "--format", "json", environ=environ)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["job"] == allocation and [n["node"] for n in shown["nodes"]] == ["n1", "n2", "n3"]
    assert all(n["gpus"] == 2 and n["cpus"] == 2 and not n["lost"] for n in shown["nodes"])
    slurm_lab.drain("n2", "bad-dimm")
    try:
        done = autotune("hosts", "--slurm", environ=environ)
    finally:
        slurm_lab.resume_node("n2")
    assert done.returncode == 1  # a node the allocation cannot use
    row = next(line for line in done.stdout.splitlines() if " n2 " in line)
    assert "DRAIN" in row and "bad-dimm" in row and "nothing (lost)" in row
    outside = autotune("hosts", "--slurm", environ=lab_env(slurm_lab))
    assert outside.returncode == 2 and "not inside a Slurm allocation" in outside.stderr


HOSTS_CHECK = ("import sys, autotuner; check = autotuner.hosts_check(slurm=True); "
               "sys.stdout.write(autotuner.render_hosts_check(check, sys.argv[1])); sys.exit(0 if check.ok else 1)")


def test_hosts_check_of_the_allocation_is_what_hosts_slurm_prints(slurm_lab, allocation):
    """The API `autotune hosts --slurm` is a face of: the registry picks the Slurm backend, which reads the
    allocation this runs in."""
    environ = lab_env(slurm_lab, allocation)
    shown = autotune("hosts", "--slurm", "--format", "json", environ=environ)
    api = subprocess.run([os.sys.executable, "-c", HOSTS_CHECK, "json"], capture_output=True, text=True,
                         env=environ, timeout=120)
    assert shown.returncode == api.returncode == 0 and api.stdout == shown.stdout, api.stderr
    slurm_lab.drain("n3", "fan")
    try:
        api = subprocess.run([os.sys.executable, "-c", HOSTS_CHECK, "md"], capture_output=True, text=True,
                             env=environ, timeout=120)
    finally:
        slurm_lab.resume_node("n3")
    assert api.returncode == 1, api.stderr  # check.ok: a node the allocation cannot use
    assert next(line for line in api.stdout.splitlines() if line.startswith("| n3 ")).endswith("nothing (lost) |")


def test_plan_for_this_allocation_or_one_of_a_size_asks_nothing_of_slurm(slurm_lab, allocation, tmp_path):
    spec = write_sweep(tmp_path, range(12), extra="num_gpus: 1\n  estimate: 60")
    inside = autotune("plan", spec, "--slurm", "--format", "json", environ=lab_env(slurm_lab, allocation))
    assert inside.returncode == 0, inside.stderr
    assert json.loads(inside.stdout)["plans"][0]["makespan_s"]["at_estimates"] == 120.0  # 12 x 60 s on 6 GPUs
    jobs = slurm_lab.run("squeue", "-h", "-o", "%i").stdout.split()
    sized = autotune("plan", spec, "--slurm", "--nodes", "4", "--gpus-per-node", "3", "--format", "json",
                     environ=lab_env(slurm_lab))
    assert sized.returncode == 0, sized.stderr
    assert json.loads(sized.stdout)["plans"][0]["makespan_s"]["at_estimates"] == 60.0  # on 12 GPUs
    assert slurm_lab.run("squeue", "-h", "-o", "%i").stdout.split() == jobs  # no allocation asked for


def test_tune_inside_slurm_searches_on_steps(slurm_lab, allocation, tmp_path):
    (tmp_path / "train.py").write_text("# stand-in: the launcher never runs it\n")
    (tmp_path / "ds.json").write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": [2, 3]},
        "autotuning": {"enabled": True, "metric": "throughput", "max_train_micro_batch_size_per_gpu": 64}}))
    # Each run long enough for Slurm to list its step (a run out of memory at once may end before squeue shows it).
    environ = lab_env(slurm_lab, allocation, OOM_STANDIN_LOG=tmp_path / "launches.log", OOM_STANDIN_SECONDS=0.5)
    done = autotune("tune", "--slurm", "-o", tmp_path / "res", "--launcher", f"sh {ROOT / 'tests' / 'oom_standin.sh'}",
                    "train.py", "--deepspeed_config", "ds.json", environ=environ, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "best: train_z3_mbs45 with throughput" in done.stdout  # the fake GPU's largest fit of stage 3
    runs = attempts(tmp_path / "res")
    assert all(a.handle and a.handle.startswith(f"{allocation}.") for a in runs)
    assert no_step_left(slurm_lab, allocation, sweep_id(tmp_path / "res"))


# Writes its metrics only at the end: a run cut short by its node's failure has none.
# Ends once the test opens $GATE (after its node was lost and the run started again): however slow the machine, the
# node fails under the step, never after it ended (a 6 s sleep did, at load 12).
METRICS_AT_THE_END = """\
#!/bin/sh
while [ ! -e "$GATE" ]; do sleep 0.05; done
if [ "$SLURM_NODEID" = 0 ]; then printf '{"throughput": 2.0}\\n' > "$AUTOTUNE_METRICS_PATH"; fi
"""


def test_a_node_failing_under_a_step_loses_its_run_which_runs_again_elsewhere(slurm_lab, tmp_path, runners):
    """Slurm ends the step of a node that fails and its srun exits 0: the run is lost with the node, not
    failed, and runs again on another. The allocation survives its node (--no-kill). Not --exclusive: Slurm
    22.05 never gives back the no-share count of a node taken out of an exclusive job, which leaves that node
    unusable to shared jobs after every later exclusive job on it (see SlurmLab.down)."""
    job = slurm_lab.allocate(2, 1, "--no-kill")
    spec = write_sweep(tmp_path, range(1), extra="num_gpus: 1")
    launcher = tmp_path / "late.sh"
    launcher.write_text(METRICS_AT_THE_END)
    results = tmp_path / "r"
    gate = tmp_path / "gate"
    environ = lab_env(slurm_lab, job, GATE=gate) | {"AUTOTUNE_SLURM_POLL": "60"}  # not the watcher
    proc = runners.start("run", spec, "--slurm", "--launcher", f"sh {launcher}", "-o", results, "-q",
                         environ=environ, directory=results)
    try:
        wait_until(lambda: (results / "ledger.sqlite").exists() and any(a.handle for a in attempts(results)), 60,
                   "the step recorded")
        (node,) = attempts(results)[0].slots
        slurm_lab.down(node, "psu")
        wait_until(lambda: len(attempts(results)) == 2, 120, "the run started again after its node was lost")
        gate.touch()
        code, _, err = finish(proc)
    finally:
        slurm_lab.start_node(node)  # back in service once its slurmd registers (ReturnToService=2)
        slurm_lab.release(job)
    assert code == 0, (err, [(a.attempt, a.state, a.reason, a.detail, a.slots, (Path(a.dir) / "stderr.log").read_text())
                             for a in attempts(results)])
    first, again = attempts(results)
    assert (first.state, first.reason) == (State.INTERRUPTED, "lost") and node in (first.detail or "")
    assert again.state == State.SUCCEEDED and node not in again.slots


def test_ctrl_c_gives_back_the_allocation_autotune_asked_for(slurm_lab, tmp_path, runners):
    spec = write_sweep(tmp_path, range(2), extra="num_gpus: 1")
    results = tmp_path / "r"
    proc = runners.start("run", spec, "--slurm", "--nodes", "1", "--gpus-per-node", "2", "--launcher",
                         standin(tmp_path), "-o", results, "-q", environ=lab_env(slurm_lab, STANDIN_SECONDS=120),
                         directory=results)
    wait_until(lambda: (results / "ledger.sqlite").exists() and len([a for a in attempts(results) if a.handle]) == 2,
               60, "two steps recorded")
    job = attempts(results)[0].handle.split(".")[0]
    proc.send_signal(signal.SIGINT)
    code, _, err = finish(proc)
    assert code == 130, err
    assert f"gave Slurm job {job} back" in err
    assert {a.state for a in attempts(results)} == {State.INTERRUPTED}
    wait_until(lambda: not slurm_lab.run("squeue", "-h", "-j", job, check=False).stdout.strip(), 30, "job gone")


def test_a_job_id_that_is_no_allocation_is_one_line(slurm_lab, tmp_path):
    spec = write_sweep(tmp_path, range(1))
    done = autotune("run", spec, "--slurm", "-o", tmp_path / "r", environ=lab_env(slurm_lab, "987654"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Invalid job id" in done.stderr, done.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_allocation_is_pending_withdraws_the_request(slurm_lab, tmp_path, runners, sig):
    """Ctrl-C (or SIGTERM) sent to autotune alone while its job waits in the queue: the pending job is
    withdrawn, and nothing can start later in an allocation nobody gives back. Five nodes of a three-node
    partition: the job waits forever."""
    spec = write_sweep(tmp_path, range(1), extra="num_gpus: 1")
    results = tmp_path / "r"
    proc = runners.start("run", spec, "--slurm", "--nodes", "5", "--gpus-per-node", "1", "--launcher",
                         standin(tmp_path), "-o", results, "-q", environ=lab_env(slurm_lab))

    def pending() -> list[str]:
        return slurm_lab.run("squeue", "-h", "-t", "PD", "-n", "autotune", "-o", "%i").stdout.split()

    (job,) = wait_until(pending, 30, "the allocation queued")
    proc.send_signal(sig)  # to autotune only, not its process group
    code, _, err = finish(proc, timeout=60)
    try:
        assert code == 130, err
        assert f"Slurm job {job}" in err and "Traceback" not in err
        wait_until(lambda: not pending(), 10, "the pending job withdrawn")
    finally:
        slurm_lab.run("scancel", "-n", "autotune", "-t", "PD", check=False)
    assert not (results / "ledger.sqlite").exists()


def hanging_standin(directory: Path, command: str, flag: Path) -> Path:
    """A stand-in for the Slurm command `command`, first on PATH: it hangs while `flag` exists (a slurmctld
    that does not answer), and is the real command otherwise. Returns the directory to put on PATH."""
    import shutil

    real = shutil.which(command)
    assert real is not None
    directory.mkdir(exist_ok=True)
    path = directory / command
    path.write_text(f"#!/bin/sh\n# stand-in for {command}: hangs while {flag} exists\n"
                    f"while [ -e {flag} ]; do sleep 0.1; done\nexec {real} \"$@\"\n")
    path.chmod(0o755)
    return directory


def test_a_slurm_that_does_not_answer_as_runs_end_fails_none_of_them(slurm_lab, allocation, tmp_path, runners):
    """squeue hangs (past AUTOTUNE_SLURM_TIMEOUT) while the steps end: each run is judged by what it did,
    once, never failed and run again because Slurm could not be asked whether its step was gone."""
    spec = write_sweep(tmp_path, range(3), extra="num_gpus: 1")
    results = tmp_path / "r"
    flag = tmp_path / "hang"
    bin_dir = hanging_standin(tmp_path / "bin", "squeue", flag)
    environ = lab_env(slurm_lab, allocation, STANDIN_SECONDS=3, AUTOTUNE_SLURM_TIMEOUT=1)
    environ["PATH"] = f"{bin_dir}:{environ['PATH']}"
    proc = runners.start("run", spec, "--slurm", "--launcher", standin(tmp_path), "-o", results, "-q",
                         environ=environ, directory=results)
    wait_until(lambda: (results / "ledger.sqlite").exists() and len([a for a in attempts(results) if a.handle]) == 3,
               60, "three steps recorded")
    flag.touch()
    try:
        wait_until(lambda: all((Path(a.dir) / "exit_status").exists() for a in attempts(results)), 60,
                   "the runs ended")
        time.sleep(3)  # the runner asks Slurm whether the steps are gone: no answer
    finally:
        flag.unlink()
    code, _, err = finish(proc)
    runs = attempts(results)
    assert code == 0, (err, [(a.name, a.state, a.detail) for a in runs])
    assert len(runs) == 3 and {a.state for a in runs} == {State.SUCCEEDED}
    assert no_step_left(slurm_lab, allocation, sweep_id(results))


def test_an_allocation_with_fewer_cpus_than_gpus_runs_an_experiment_on_all_its_gpus(slurm_lab, tmp_path):
    """One CPU for two GPUs: a two-GPU experiment's step asks for the one CPU there is (it asked for two, and
    Slurm refused every such step: "More processors requested than permitted")."""
    job = slurm_lab.allocate(1, 2, "--ntasks=1", "--cpus-per-task=1")
    try:
        spec = write_sweep(tmp_path, range(2), extra="num_gpus: 2")
        results = tmp_path / "r"
        done = autotune("run", spec, "--slurm", "--launcher", standin(tmp_path), "-o", results, "-q",
                        environ=lab_env(slurm_lab, job, STANDIN_SECONDS=0.2))
        assert "holds 1 CPU(s) for 2 GPU(s)" in done.stderr
        assert done.returncode == 0, (done.stderr, [(a.name, a.detail) for a in attempts(results)])
        assert all(line["gpus"] == "0,1" for a in attempts(results) for line in node_lines(results, a.name))
        assert no_step_left(slurm_lab, job, sweep_id(results))
    finally:
        slurm_lab.release(job)


def test_a_controller_that_cannot_be_reached_for_a_moment_does_not_end_the_sweep(slurm_lab, allocation, tmp_path,
                                                                                 runners):
    """`scontrol show job` failing as it does while slurmctld restarts ("Unable to contact slurm controller")
    is no word on the job: the watcher asks again, the sweep goes on (it read as the allocation gone, and
    interrupted the sweep)."""
    import shutil

    flag = tmp_path / "unreachable"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        "#!/bin/sh\n# stand-in for scontrol: `show job` cannot reach the controller while the flag exists\n"
        f'if [ -e {flag} ] && [ "$2" = job ]; then\n'
        '  echo "slurm_load_jobs error: Unable to contact slurm controller (connect failure)" >&2; exit 1\nfi\n'
        f'exec {shutil.which("scontrol")} "$@"\n')
    (bin_dir / "scontrol").chmod(0o755)
    spec = write_sweep(tmp_path, range(2), extra="num_gpus: 1")
    results = tmp_path / "r"
    environ = lab_env(slurm_lab, allocation, STANDIN_SECONDS=3)
    environ["PATH"] = f"{bin_dir}:{environ['PATH']}"
    proc = runners.start("run", spec, "--slurm", "--launcher", standin(tmp_path), "-o", results, "-q",
                         environ=environ, directory=results)
    wait_until(lambda: (results / "ledger.sqlite").exists() and len([a for a in attempts(results) if a.handle]) == 2,
               60, "two steps recorded")
    flag.touch()
    time.sleep(1.5)  # several looks of the watcher (every 0.2 s)
    flag.unlink()
    code, _, err = finish(proc)
    runs = attempts(results)
    assert code == 0, (err, [(a.name, a.state, a.detail) for a in runs])
    assert len(runs) == 2 and {a.state for a in runs} == {State.SUCCEEDED}


def test_an_allocation_that_cannot_be_given_back_is_one_line_and_exit_2(slurm_lab, tmp_path):
    """scancel gets no answer at the end: the job autotune asked for still runs, and the user is told which, and
    how to end it, in one line (it was a traceback)."""
    flag = tmp_path / "hang"
    flag.touch()
    bin_dir = hanging_standin(tmp_path / "bin", "scancel", flag)
    spec = write_sweep(tmp_path, range(1), extra="num_gpus: 1")
    environ = lab_env(slurm_lab, STANDIN_SECONDS=0.2, AUTOTUNE_SLURM_TIMEOUT=1)
    environ["PATH"] = f"{bin_dir}:{environ['PATH']}"
    done = autotune("run", spec, "--slurm", "--nodes", "1", "--gpus-per-node", "1", "--launcher", standin(tmp_path),
                    "-o", tmp_path / "r", "-q", environ=environ)
    flag.unlink()
    running = slurm_lab.run("squeue", "-h", "-n", "autotune", "-o", "%i").stdout.split()
    for job in running:
        slurm_lab.release(job)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (job,) = running
    (line,) = [line for line in done.stderr.splitlines() if "not given back" in line]
    assert f"Slurm job {job} was not given back" in line and f"`scancel {job}`" in line
    assert [a.state for a in attempts(tmp_path / "r")] == [State.SUCCEEDED]


def test_a_results_directory_a_node_does_not_share_is_one_line_before_anything_runs(slurm_lab, tmp_path):
    """n3's slurmd (and so its steps) runs in a mount namespace of its own, with an empty tmpfs over the
    directory the results go in: a node that does not share it, as a node's local /tmp is not shared. The
    sweep is refused in one line naming the node, nothing launched (each run placed there failed, with a word
    about DeepSpeed's profile window), and the results directory `run` had made is gone again."""
    private = tmp_path / "private"
    private.mkdir()
    slurm_lab.stop_node("n3")
    apart = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                              f"mount -t tmpfs tmpfs {private} && exec /usr/sbin/slurmd -D -N n3"],
                             env=slurm_lab.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    job = None
    try:
        wait_until(lambda: apart.poll() is None and "RESP" not in slurm_lab.node_state("n3")
                   and "DOWN" not in slurm_lab.node_state("n3"), 30, "n3 apart")
        job = slurm_lab.allocate(3, 1)
        spec = write_sweep(tmp_path, range(3), extra="num_gpus: 1")
        done = autotune("run", spec, "--slurm", "--launcher", standin(tmp_path), "-o", private / "r", "-q",
                        environ=lab_env(slurm_lab, job, STANDIN_SECONDS=0.2))
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert "node(s) n3 of Slurm job" in line and "do not see this results directory" in line
        assert not (private / "r").exists()  # refused: nothing launched, nothing written
        shared = autotune("run", spec, "--slurm", "--launcher", standin(tmp_path), "-o", tmp_path / "r", "-q",
                          environ=lab_env(slurm_lab, job, STANDIN_SECONDS=0.2))
        assert shared.returncode == 0, shared.stderr
    finally:
        if job is not None:
            slurm_lab.release(job)
        os.killpg(apart.pid, signal.SIGTERM)
        apart.wait(timeout=30)
        slurm_lab.start_node("n3")


@pytest.mark.parametrize("args", [["--time", "1:00"], ["--partition", "debug"], ["--account", "a"],
                                  ["--nodes", "1"]])
def test_asks_for_a_new_allocation_inside_one_are_one_line(slurm_lab, allocation, tmp_path, args):
    """Inside an allocation, --time, --partition and --account (like --nodes) would ask for another one: refused
    in one line, not silently dropped."""
    spec = write_sweep(tmp_path, range(1))
    done = autotune("run", spec, "--slurm", *args, "-o", tmp_path / "r", environ=lab_env(slurm_lab, allocation))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert f"{args[0]} asks for a new allocation" in line and f"Slurm job {allocation}" in line
    assert not (tmp_path / "r").exists()


def test_a_step_held_back_by_a_step_not_ours_is_told_and_runs_once_free(slurm_lab, allocation, tmp_path):
    """A step of the job that autotune did not start holds n1's GPUs: the step of the run placed there waits,
    unlisted, and the user is told why past STEP_SHOWS_WITHIN (30 s; 5 s here, AUTOTUNE_SLURM_STEP_WAIT); it runs
    once they are free, once. The holder ends only once the user was told (however slowly the run started under
    load)."""
    holder = subprocess.Popen(["srun", "--jobid", allocation, "--exact", "-N1", "-n1", "-w", "n1",
                               "--gpus-per-node", "2", "-c2", "sleep", "600"],
                              env=slurm_lab.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    told = "Slurm has not started its step in 5 s"
    stderr = tmp_path / "stderr"
    try:
        wait_until(lambda: [s for s in slurm_lab.steps(allocation) if s.name == "sleep"], 30, "the holder listed")
        spec = write_sweep(tmp_path, range(1), extra="num_gpus: 2")  # n1 first: placed there
        results = tmp_path / "r"
        with open(stderr, "w") as err:
            run = subprocess.Popen(cli("run", spec, "--slurm", "--launcher", standin(tmp_path), "-o", results, "-q"),
                                   env=lab_env(slurm_lab, allocation, STANDIN_SECONDS=0.2,
                                               AUTOTUNE_SLURM_STEP_WAIT=5), stdout=subprocess.DEVNULL,
                                   stderr=err, cwd=ROOT)
        try:
            wait_until(lambda: run.poll() is not None or told in stderr.read_text(), 180, "the user told")
        finally:
            holder.kill()
            holder.wait()
            code = run.wait(timeout=120)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert code == 0, stderr.read_text()
    (attempt,) = attempts(results)
    assert attempt.slots == {"n1": [0, 1]} and attempt.state == State.SUCCEEDED
    assert told in stderr.read_text()
    assert len(node_lines(results, attempt.name)) == 1


def test_sigterm_before_the_sweep_runs_gives_back_the_allocation_autotune_asked_for(slurm_lab, tmp_path, runners):
    """SIGTERM once the allocation is granted but before the sweep's own handler is in place (here: while the
    first srun, a stand-in that hangs, checks the results directory): the allocation is given back (SIGTERM's
    default ended autotune there and left it held until its time limit)."""
    flag = tmp_path / "hang"
    flag.touch()
    bin_dir = hanging_standin(tmp_path / "bin", "srun", flag)
    spec = write_sweep(tmp_path, range(1), extra="num_gpus: 1")
    environ = lab_env(slurm_lab)
    environ["PATH"] = f"{bin_dir}:{environ['PATH']}"
    proc = runners.start("run", spec, "--slurm", "--nodes", "1", "--gpus-per-node", "1", "--launcher",
                         standin(tmp_path), "-o", tmp_path / "r", "-q", environ=environ)

    def running() -> list[str]:
        return slurm_lab.run("squeue", "-h", "-t", "R", "-n", "autotune", "-o", "%i").stdout.split()

    try:
        (job,) = wait_until(running, 30, "the allocation granted")
        wait_until(lambda: (tmp_path / "r" / "ledger.sqlite").exists(), 30, "the sweep set up")
        time.sleep(0.5)  # in the stand-in srun
        proc.send_signal(signal.SIGTERM)
        code, _, err = finish(proc, timeout=60)
        assert f"gave Slurm job {job} back" in err, (code, err)
        wait_until(lambda: not running(), 10, "the allocation given back")
    finally:
        flag.unlink()
        for left in running():
            slurm_lab.release(left)
