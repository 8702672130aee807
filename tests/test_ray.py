"""Sweeps on a real Ray cluster (tests/ray_lab.py: a head and two worker raylets on loopback, two fake GPUs each,
which Ray hands out as real ones): each attempt a placement group with a bundle per node on exactly the nodes the
scheduler reserved, each node's launcher started from an actor there with the GPUs Ray gave it; stops, bad asks
(kill -9 then resume or cancel, a node lost, a stop: tests/test_backend_suite.py, as on every backend). "Nothing
left" is checked in Ray (placement groups, named actors) and on this machine's process table."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from autotuner.backends.flags import bare_values
from autotuner.backends.ray.node import include_of
from autotuner.backends.ray.nodes import cluster_of, host_of, read_nodes
from autotuner.backends.ray.options import DECLARED as RAY
from autotuner.states import State

from cli_rig import attempts, autotune, env, finish, sweep_id, tagged_pids, wait_until, write_sweep

# Each node's launcher (in place of DeepSpeed's) logs what Ray and the runner gave it (its parent: the actor), and
# its first node writes the metrics; then it sleeps $STANDIN_SECONDS (or what the file $STANDIN_SECONDS_FILE
# says), and logs a SIGTERM if one comes.
NODE_STANDIN = """\
#!/bin/sh
dir=$(dirname "$AUTOTUNE_METRICS_PATH")
echo "node=$AUTOTUNE_RAY_NODE_ID gpus=$CUDA_VISIBLE_DEVICES actor=$PPID args=$*" >> "$dir/nodes.log"
case "$*" in *"--node_rank 0 "*) printf '{"throughput": 2.0, "latency": 1.0}\\n' > "$AUTOTUNE_METRICS_PATH";; esac
seconds=${STANDIN_SECONDS:-$(cat "$STANDIN_SECONDS_FILE" 2>/dev/null)}
sleep "${seconds:-0.5}" &
pid=$!
trap 'echo term >> "$dir/signals.log"; kill $pid; exit 143' TERM
wait $pid
"""


def standin(tmp_path: Path, seconds: float = 0.5) -> str:
    """The launcher: its seconds in its own words (a node's environment is its own, not the runner's)."""
    path = tmp_path / "node.sh"
    path.write_text(NODE_STANDIN)
    return f"env STANDIN_SECONDS={seconds:g} sh {path}"


def lab_env(ray_lab, **extra: object) -> dict[str, str]:
    return dict(os.environ) | ray_lab.env | {"AUTOTUNE_RAY_POLL": "0.3"} | {k: str(v) for k, v in extra.items()}


def node_lines(results: Path, name: str) -> list[dict[str, str]]:
    log = results / name / "nodes.log"
    fields = re.compile(r"(\w+)=(\S*)")
    return [dict(fields.findall(line.split(" args=")[0])) | {"args": line.split(" args=", 1)[1]}
            for line in log.read_text().splitlines()] if log.exists() else []


def nothing_left(ray_lab, results: Path) -> bool:
    sweep = sweep_id(results)
    return not ray_lab.placement_groups() and not ray_lab.actors(f"{sweep}.") and not tagged_pids(str(sweep))


# --- without a cluster ------------------------------------------------------------------------------------------

def optional_ray_value(argv: list[str]) -> list[str]:
    return bare_values(argv, RAY.flags)


def test_a_bare_ray_option_takes_the_default_address_and_an_address_when_one_follows(tmp_path):
    spec = tmp_path / "s.hjson"
    spec.write_text("{}")
    assert optional_ray_value(["run", "s.hjson", "--ray"]) == ["run", "s.hjson", "--ray="]
    assert optional_ray_value(["run", "--ray", "10.0.0.1:6379", "s.hjson"]) == ["run", "--ray", "10.0.0.1:6379",
                                                                               "s.hjson"]
    assert optional_ray_value(["run", "--ray", "auto"])[1:] == ["--ray", "auto"]
    assert optional_ray_value(["run", "--ray", "ray://head:10001"])[1:] == ["--ray", "ray://head:10001"]
    assert optional_ray_value(["run", "--ray", str(spec)])[1:] == ["--ray=", str(spec)]  # a file, not an address
    assert optional_ray_value(["run", "--ray", "-q"])[1:] == ["--ray=", "-q"]


def test_each_node_is_told_its_own_gpus_and_the_others_counts():
    assert include_of(["a", "b"], 2, 1, "2,3") == "a:0,1@b:2,3"
    assert include_of(["a"], 1, 0, None) == "a:0"


def test_the_cluster_is_the_live_nodes_with_gpus_and_their_type():
    reported = [
        {"NodeID": "a" * 56, "Alive": True, "NodeManagerAddress": "10.0.0.1",
         "Resources": {"GPU": 8.0, "CPU": 96.0, "memory": 1e12, "accelerator_type:H100-80GB": 1.0}},
        {"NodeID": "b" * 56, "Alive": True, "NodeManagerAddress": "10.0.0.2", "Resources": {"CPU": 8.0}},
        {"NodeID": "c" * 56, "Alive": False, "NodeManagerAddress": "10.0.0.3", "Resources": {"GPU": 8.0}},
    ]
    nodes = read_nodes(reported)
    assert [n.host for n in nodes] == [host_of("a" * 56), host_of("b" * 56)]
    cluster = cluster_of(nodes)
    assert dict(cluster.slots) == {host_of("a" * 56): tuple(range(8))}  # the CPU-only node runs nothing
    assert cluster.types == {host_of("a" * 56): "H100-80GB"} and cluster.memory == {host_of("a" * 56): 80 * 10**9}


def test_ray_not_installed_is_one_line(tmp_path):
    shadow = tmp_path / "shadow" / "ray"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no ray here')\n")  # as if Ray were not installed
    spec = write_sweep(tmp_path, range(1), extra="num_gpus: 1")
    environ = dict(os.environ) | {"PYTHONPATH": f"{Path(__file__).resolve().parents[1]}:{shadow.parent}"}
    done = autotune("run", spec, "--ray", "-o", tmp_path / "r", environ=environ)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["autotune: error: --ray needs Ray: pip install 'ds-autotune[ray]'"]
    assert not (tmp_path / "r").exists()


# --- on the lab cluster -----------------------------------------------------------------------------------------

def test_each_experiment_runs_on_exactly_its_reserved_nodes_and_gpus(ray_lab, tmp_path):
    spec = write_sweep(tmp_path, range(4), extra="num_gpus: 1")
    two = write_sweep(tmp_path, range(2), name="m", extra="num_gpus: 2\n  num_nodes: 2", filename="two.hjson")
    results = tmp_path / "r"
    done = autotune("run", spec, two, "--ray", "--launcher", standin(tmp_path, 1.5), "-o", results, "-q",
                    environ=lab_env(ray_lab), timeout=300)
    assert done.returncode == 0, done.stderr
    runs = {a.name: a for a in attempts(results)}
    assert len(runs) == 6 and all(a.state == State.SUCCEEDED and a.attempt == 1 for a in runs.values())
    ids = {host_of(n["NodeID"]): n["NodeID"] for n in ray_lab.alive()}
    held: dict[str, list[tuple[float, float, set[str]]]] = defaultdict(list)
    for name, attempt in runs.items():
        hosts = list(attempt.slots)
        lines = sorted(node_lines(results, name), key=lambda line: int(line["args"].split("--node_rank ")[1][0]))
        assert [line["node"] for line in lines] == [ids[h] for h in hosts]  # on exactly the reserved nodes
        for rank, line in enumerate(lines):
            gpus = line["gpus"].split(",")
            assert len(gpus) == (2 if name.startswith("m_") else 1)  # exactly its GPU count, as Ray gave them
            assert f"--node_rank {rank}" in line["args"] and "--no_ssh" in line["args"]
            assert f"{hosts[rank]}:{line['gpus']}" in line["args"]  # DeepSpeed told those very GPUs
            held[hosts[rank]].append((attempt.started_at, attempt.finished_at, set(gpus)))
    for host, spans in held.items():  # runs that overlapped in time on one node had different GPUs
        for i, (start, end, gpus) in enumerate(spans):
            for other_start, other_end, other_gpus in spans[i + 1:]:
                if start < other_end and other_start < end:
                    assert not gpus & other_gpus, host
    assert nothing_left(ray_lab, results)


# The second node's rank runs out of memory; the first waits for it, as DeepSpeed's ranks do, and says nothing.
OOM_ON_SECOND = """\
#!/bin/sh
case "$*" in *"--node_rank 1 "*) echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB" >&2
    exit 1;; esac
sleep 60 &
trap 'kill $!; exit 143' TERM
wait $!
"""


def test_a_rank_out_of_memory_on_the_second_node_is_judged_out_of_memory(ray_lab, tmp_path):
    """Ray writes the further nodes' logs apart (nodes/RANK.stderr.log); the attempt is judged by its own logs,
    where the note that node 1 failed now repeats its telling line: out of memory, not a crash (which gives up a
    tune's stage instead of bounding its sizes)."""
    two = write_sweep(tmp_path, range(1), name="m", extra="num_gpus: 1\n  num_nodes: 2", filename="two.hjson")
    (tmp_path / "oom.sh").write_text(OOM_ON_SECOND)
    results = tmp_path / "r"
    done = autotune("run", two, "--ray", "--launcher", f"sh {tmp_path / 'oom.sh'}", "-o", results, "-q",
                    environ=lab_env(ray_lab), timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    (attempt,) = attempts(results)
    assert (attempt.state, attempt.reason) == (State.FAILED, "oom"), attempt
    assert "CUDA out of memory" in (attempt.detail or "")
    assert nothing_left(ray_lab, results)


# A program of the user's: autotuner.run on the Ray cluster RAY_ADDRESS names, connected to it first by itself
# (`own`) or not; it prints whether it is still connected afterwards.
API_PROGRAM = """
import sys

import ray

import autotuner

spec, results, launcher, own = sys.argv[1:]
if own == "own":
    ray.init(namespace="autotune", log_to_driver=False)
result = autotuner.run(autotuner.load_sweep([spec]), {"ray": ""}, results, launcher=launcher.split())
print("exit", result.exit_code, "connected", ray.is_initialized())
"""


@pytest.mark.parametrize("own, left", [("own", True), ("none", False)])
def test_the_python_api_shuts_only_the_ray_connection_it_made(ray_lab, tmp_path, own, left):
    """The connection `autotuner.run` makes (to read the cluster, then run on it) is shut when it returns; one the
    program made itself is the program's, and stays open."""
    spec = write_sweep(tmp_path, range(1), extra="num_gpus: 1")
    done = subprocess.run([sys.executable, "-c", API_PROGRAM, str(spec), str(tmp_path / "r"), standin(tmp_path),
                           own], env=env(**lab_env(ray_lab)), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"exit 0 connected {left}" in done.stdout, done.stdout + done.stderr


def test_the_next_attempt_of_a_shape_runs_from_the_actors_of_the_one_before(ray_lab, tmp_path):
    """Each experiment takes every GPU of the cluster, so they run one after another on the same three nodes: the
    second and third start from the first one's lease (its actors), and the sweep leaves nothing behind."""
    spec = write_sweep(tmp_path, range(3), extra="num_gpus: 2\n  num_nodes: 3")
    results = tmp_path / "r"
    done = autotune("run", spec, "--ray", "--launcher", standin(tmp_path, 0.3), "-o", results, "-q",
                    environ=lab_env(ray_lab), timeout=300)
    assert done.returncode == 0, done.stderr
    actors = {a.name: {line["actor"] for line in node_lines(results, a.name)} for a in attempts(results)}
    assert all(len(pids) == 3 for pids in actors.values())
    assert actors["s_x0"] == actors["s_x1"] == actors["s_x2"]
    assert nothing_left(ray_lab, results)


def test_a_timeout_and_a_cancel_end_the_run_on_every_node_and_release_its_placement_group(ray_lab, tmp_path,
                                                                                           runners):
    spec = write_sweep(tmp_path, range(1), extra="num_gpus: 1\n  num_nodes: 2")
    results = tmp_path / "timeout"
    done = autotune("run", spec, "--ray", "--launcher", standin(tmp_path, 300), "-o", results, "-q", "--timeout", "8",
                    "--grace", "3", environ=lab_env(ray_lab), timeout=300)
    assert done.returncode == 1, done.stderr
    (attempt,) = attempts(results)
    assert attempt.state == State.TIMED_OUT
    assert (results / attempt.name / "signals.log").read_text().split() == ["term", "term"]  # SIGTERM on each node
    assert nothing_left(ray_lab, results)

    results = tmp_path / "cancel"
    proc = runners.start("run", spec, "--ray", "--launcher", standin(tmp_path, 300), "-o", results, "-q",
                         environ=lab_env(ray_lab), directory=results)
    wait_until(lambda: len(node_lines(results, "s_x0")) == 2, 120, "both nodes running")
    assert autotune("cancel", results, environ=lab_env(ray_lab)).returncode == 0
    code, _, err = finish(proc, timeout=120)
    assert code == 1, err
    assert {a.state for a in attempts(results)} == {State.CANCELLED}, err
    assert nothing_left(ray_lab, results)


def leftovers(ray_lab, sweep: str) -> None:
    """What a dead runner may leave in Ray that no attempt runs on: an idle lease (a placement group and its actor,
    as the runner gives back a lease for the next attempt of its shape) and a placement group whose actors are
    gone. Made here as the runner makes them (detached, named by the sweep, in its namespace)."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from autotuner.backends.ray import node

    ray.cloudpickle.register_pickle_by_value(node)
    idle = ray.util.placement_group([{"GPU": 1}], name=f"{sweep}.ray-0dd1e000", lifetime="detached")
    empty = ray.util.placement_group([{"GPU": 1}], name=f"{sweep}.ray-0e0e0e0e", lifetime="detached")
    ray.get([idle.ready(), empty.ready()], timeout=120)
    actor = ray.remote(node.NodeLauncher).options(
        name=f"{sweep}.ray-0dd1e000.0", namespace="autotune", lifetime="detached", num_cpus=0, num_gpus=1,
        scheduling_strategy=PlacementGroupSchedulingStrategy(idle, placement_group_bundle_index=0)).remote()
    assert ray.get(actor.current.remote(), timeout=120) is None


def test_resume_cleans_up_what_ray_holds_of_runs_nobody_follows(ray_lab, tmp_path, runners):
    """The runner killed -9 with two runs going on two nodes each, and leases nothing runs on left in Ray:
    resume follows the runs to their end (none runs twice) and ends the leftovers."""
    spec = write_sweep(tmp_path, range(2), extra="num_gpus: 1\n  num_nodes: 2")
    results = tmp_path / "r"
    proc = runners.start("run", spec, "--ray", "--launcher", standin(tmp_path, 8), "-o", results, "-q",
                         environ=lab_env(ray_lab), directory=results)
    wait_until(lambda: all(len(node_lines(results, f"s_x{i}")) == 2 for i in range(2)), 120, "both runs going")
    proc.send_signal(signal.SIGKILL)
    finish(proc)
    leftovers(ray_lab, sweep_id(results))
    assert len(ray_lab.placement_groups()) == 4 and len(ray_lab.actors(f"{sweep_id(results)}.")) == 5
    done = autotune("resume", results, "-q", environ=lab_env(ray_lab), timeout=300)
    assert done.returncode == 0, done.stderr
    runs = attempts(results)
    assert sorted((a.name, a.attempt, a.state) for a in runs) == [  # adopted, not run again
        ("s_x0", 1, State.SUCCEEDED), ("s_x1", 1, State.SUCCEEDED)]
    assert "lease(s) a dead runner left" in done.stderr + done.stdout
    assert nothing_left(ray_lab, results)


def test_tune_on_ray_searches_with_runs_out_of_memory_as_answers(ray_lab, tmp_path):
    (tmp_path / "train.py").write_text("# stand-in: the launcher never runs it\n")
    (tmp_path / "ds.json").write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": [2, 3]},
        "autotuning": {"enabled": True, "metric": "throughput", "max_train_micro_batch_size_per_gpu": 64}}))
    standin = Path(__file__).resolve().parent / "oom_standin.sh"
    launcher = f"env OOM_STANDIN_LOG={tmp_path / 'launches.log'} sh {standin}"  # the node's environment is its own
    done = autotune("tune", "--ray", "-o", tmp_path / "res", "--launcher", launcher, "train.py",
                    "--deepspeed_config", "ds.json", environ=lab_env(ray_lab), cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "best: train_z3_mbs45 with throughput" in done.stdout  # the fake GPU's largest fit of stage 3
    assert any(a.reason == "oom" for a in attempts(tmp_path / "res"))  # OOM read from the first node's output
    assert nothing_left(ray_lab, tmp_path / "res")


def test_hosts_and_plan_read_the_cluster_from_ray(ray_lab, tmp_path):
    done = autotune("hosts", "--ray", "-f", "json", environ=lab_env(ray_lab))
    assert done.returncode == 0, done.stderr
    nodes = json.loads(done.stdout)["nodes"]
    assert len(nodes) == len(ray_lab.alive()) and all(n["gpus"] == 2 for n in nodes)
    # The same through the API's one entry for every kind of cluster (the registry picks the Ray backend).
    api = subprocess.run([sys.executable, "-c", "import sys, autotuner; check = autotuner.hosts_check(ray=''); "
                          "sys.stdout.write(autotuner.render_hosts_check(check, 'json')); import ray; "
                          "print('connected', ray.is_initialized(), file=sys.stderr); sys.exit(not check.ok)"],
                         capture_output=True, text=True, env=lab_env(ray_lab), timeout=180)
    assert api.returncode == 0, api.stderr
    assert "connected False" in api.stderr  # the connection the check made is shut: nothing runs after it
    assert sorted(n["node_id"] for n in json.loads(api.stdout)["nodes"]) == sorted(n["node_id"] for n in nodes)
    spec = write_sweep(tmp_path, range(4), extra="num_gpus: 2\n  num_nodes: 2", filename="p.hjson")
    done = autotune("plan", spec, "--ray", "--duration", "10", "-f", "json", environ=lab_env(ray_lab))
    assert done.returncode == 0, done.stderr
    assert not ray_lab.placement_groups()  # a plan reserves nothing


@pytest.mark.parametrize(("args", "says"), [
    (["--ray", "127.0.0.1:9"], "no Ray cluster answers at 127.0.0.1:9"),
    (["--ray", "http://127.0.0.1:8265"], "http:// is not a Ray cluster's address"),  # the dashboard's, not Ray's
    (["--ray", "--hostfile", "hostfile"], "leave out --hostfile"),
])
def test_bad_ray_asks_are_one_line(ray_lab, tmp_path, args, says):
    spec = write_sweep(tmp_path, range(1), extra="num_gpus: 1")
    done = autotune("run", spec, *args, "-o", tmp_path / "r", environ=lab_env(ray_lab), timeout=180)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert not (tmp_path / "r").exists()


def test_a_cluster_too_small_for_an_experiment_is_one_line(ray_lab, tmp_path):
    spec = write_sweep(tmp_path, range(1), extra="num_gpus: 1\n  num_nodes: 5")
    done = autotune("run", spec, "--ray", "-o", tmp_path / "r", environ=lab_env(ray_lab))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not ray_lab.placement_groups()


TRAIN = Path(__file__).resolve().parent.parent / "experiments" / "train.py"


def test_a_real_two_node_deepspeed_run_through_the_per_node_launchers(ray_lab, tmp_path):
    (tmp_path / "sweep.hjson").write_text(f"""{{
  name: ds
  script: {TRAIN}
  args: ["--steps", "7", "--hidden", "64"]
  num_nodes: 2
  num_gpus: 1
  env: {{GLOO_SOCKET_IFNAME: "lo", DS_ACCELERATOR: "cpu"}}
  ds_config: {{train_micro_batch_size_per_gpu: 4, optimizer: {{type: "Adam", params: {{lr: 0.001, torch_adam: true}}}}}}
  space: {{"gradient_accumulation_steps": [1]}}
}}""")
    results = tmp_path / "r"
    done = autotune("run", tmp_path / "sweep.hjson", "--ray", "--timeout", "300", "-o", results, "-q",
                    environ=lab_env(ray_lab), timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    (attempt,) = attempts(results)
    assert len(attempt.slots) == 2
    log = (results / attempt.name / "stdout.log").read_text() + (results / attempt.name / "stderr.log").read_text()
    assert "dist_world_size=2" in log.replace(" ", ""), log[-3000:]
    assert json.loads((results / attempt.name / "metrics.json").read_text())["throughput"] > 0
    assert nothing_left(ray_lab, results)


