"""A Ray node lost at each step of a sweep's life, alone and together with the runner (kill -9), on the real Ray
test cluster (tests/ray_lab.py): while a runner attaches (reads the cluster and asks each node whether it sees
the results directory), adopts what a dead runner left, clears what nobody follows any more, ends it with no
runner (`cancel`), and closes. A node killed is still listed alive by Ray for some seconds (its health checks
must fail first): each step here runs in that window, and must take the node as a lost host, never end in a
traceback, and leave nothing of the sweep in Ray. Ray's own log lines (raylet errors, the "Raylet is
terminated" banner) never reach the runner's terminal: they go to the sweep's ray.log. The lost node with no
runner (`cancel`, `resume`) is tests/test_backend_suite.py's too, as on every backend.

Each test kills a worker node of the session's cluster and puts a new one in its place before it ends."""
from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from test_ray import lab_env, node_lines, standin

from autotuner.backends.ray.nodes import host_of
from autotuner.states import Reason, State

from cli_rig import attempts, autotune, finish, latest, sweep_id, tagged_pids, wait_until, write_sweep

# What only Ray prints: its C++ log lines ("[2026-11-28 18:22:01,860 W 19709 19709] rpc_client.h:153: ..."), the
# lines it relays from raylets ("(raylet) accessor.cc:475: ..."), its banners, Python tracebacks.
RAY_NOISE = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+ [A-Z] \d+ \d+\]|\(raylet\)|Raylet is terminated|\.cc:\d+|"
                       r"Traceback \(most recent call last\)|^\s+File \"", re.MULTILINE)


def left(ray_lab, results: Path) -> list[object]:
    """What is left of the sweep in Ray (placement groups, named actors) and on this machine (tagged processes)."""
    sweep = sweep_id(results)
    return [*ray_lab.placement_groups(), *ray_lab.actors(f"{sweep}."), *tagged_pids(str(sweep))]


def nothing_left(ray_lab, results: Path) -> None:
    """Nothing of the sweep left, once Ray has carried out the removals asked (it does them on its own time)."""
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not left(ray_lab, results), 120)
    assert left(ray_lab, results) == []


class Losing:
    """The workers by host name, and `kill(host)`: that worker killed (`ray_lab.kill_worker`), remembered so that
    a new node takes its place at the end."""

    def __init__(self, ray_lab) -> None:
        self.lab = ray_lab
        self.workers = {host_of(w.node_id): i for i, w in enumerate(ray_lab.workers)}
        self.killed: list[tuple[int, str]] = []

    def kill(self, host: str) -> None:
        self.killed.append((self.workers[host], self.lab.kill_worker(self.workers[host])))


@contextmanager
def losing_a_worker(ray_lab) -> Iterator[Losing]:
    """A worker the test kills is replaced by a new node at the end, and the test waits until Ray lists the
    whole cluster alive and the killed node dead."""
    losing = Losing(ray_lab)
    try:
        yield losing
    finally:
        for index, _ in losing.killed:
            ray_lab.replace_worker(index)
        wait_until(lambda: whole(ray_lab, [node_id for _, node_id in losing.killed]), 240,
                   "the cluster whole again, the dead node declared dead")


def whole(ray_lab, killed: list[str]) -> bool:
    """Every node of the lab alive in Ray's eyes, and no node killed still listed alive (Ray declares a dead node
    only once its health checks fail: until then a count of live nodes would take it for the new one)."""
    alive = {n["NodeID"] for n in ray_lab.alive()}
    return alive == {ray_lab.cluster.head_node.node_id, *(w.node_id for w in ray_lab.workers)} and \
        not set(killed) & alive


def own_lines_only(*outputs: str) -> None:
    """The runner printed its own lines only."""
    for text in outputs:
        assert not RAY_NOISE.search(text), text[-3000:]


def going_everywhere(proc, ray_lab, results: Path, names: list[str]) -> dict[str, str]:
    """`running_on` once it holds; else the runner ended and what it said, what the ledger and Ray hold."""
    try:
        return wait_until(lambda: running_on(results, names) or proc.poll() is not None, 180)  # type: ignore[return-value]
    finally:
        if not running_on(results, names):
            proc.kill()
            code, out, err = finish(proc)
            raise AssertionError(f"not going on every node: exit {code}\n{out}\n{err}\n{latest(results)}\n"
                                 f"{ray_lab.alive()}\n{ray_lab.placement_groups()}")


def running_on(results: Path, names: list[str]) -> dict[str, str]:
    """Experiment -> the host its running attempt holds, once each has started on every node it holds."""
    runs = {n: a for n, a in latest(results).items() if a.state == State.RUNNING}
    if set(runs) != set(names) or not all(len(node_lines(results, n)) == len(runs[n].slots) for n in names):
        return {}
    return {n: next(iter(runs[n].slots)) for n in names}


def three_runs(ray_lab, tmp_path: Path, runners) -> tuple[object, Path, list[str]]:
    """A sweep of three runs of 10 s on two GPUs each, started in the background: its runner, results, names."""
    spec = write_sweep(tmp_path, range(3), extra="num_gpus: 2")
    results = tmp_path / "r"
    proc = runners.start("run", spec, "--ray", "--launcher", standin(tmp_path, 10), "-o", results, "-q",
                         environ=lab_env(ray_lab), directory=results)
    return proc, results, ["s_x0", "s_x1", "s_x2"]


def test_a_node_lost_as_a_new_sweep_attaches_is_left_out(ray_lab, tmp_path):
    """Alone, at attach: a worker killed just before `run` (Ray still lists it alive): the check that each node
    sees the results directory finds it lost; the sweep runs on the others."""
    spec = write_sweep(tmp_path, range(3), extra="num_gpus: 2")
    results = tmp_path / "r"
    with losing_a_worker(ray_lab) as workers:
        victim = next(iter(workers.workers))
        workers.kill(victim)
        done = autotune("run", spec, "--ray", "--launcher", standin(tmp_path, 0.5), "-o", results,
                        environ=lab_env(ray_lab), timeout=400)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
        own_lines_only(done.stdout, done.stderr)
        runs = attempts(results)
        assert {a.name for a in runs if a.state == State.SUCCEEDED} == {"s_x0", "s_x1", "s_x2"}
        assert not [a for a in runs if a.state == State.SUCCEEDED and victim in a.slots]
        nothing_left(ray_lab, results)


def test_a_node_and_the_runner_lost_together_resume_adopts_recovers_and_reruns(ray_lab, tmp_path, runners):
    """Together, at attach, adoption and recovery: runs going on every node, an idle lease of the sweep left on
    the worker that dies, the worker killed and the runner killed -9 at once; `resume` (Ray still lists the
    node alive) checks the cluster, adopts the runs, clears the leftovers, and runs the lost node's run again
    elsewhere: nothing twice, nothing left in Ray."""
    proc, results, names = three_runs(ray_lab, tmp_path, runners)
    with losing_a_worker(ray_lab) as workers:
        hosts = going_everywhere(proc, ray_lab, results, names)
        victim_name, victim = next((n, h) for n, h in hosts.items() if h in workers.workers)
        workers.kill(victim)
        proc.send_signal(signal.SIGKILL)
        finish(proc)
        done = autotune("resume", results, environ=lab_env(ray_lab), timeout=600)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
        own_lines_only(done.stdout, done.stderr)
        runs = attempts(results)
        assert sorted((a.name, a.attempt) for a in runs if a.state == State.SUCCEEDED) == sorted(
            [(n, 1) for n in names if n != victim_name] + [(victim_name, 2)])  # adopted, and the lost one again
        lost = next(a for a in runs if a.name == victim_name and a.attempt == 1)
        assert lost.state == State.INTERRUPTED, lost
        nothing_left(ray_lab, results)


def test_a_node_ray_declared_dead_while_no_runner_was_alive_is_named_and_its_run_runs_again(ray_lab, tmp_path,
                                                                                             runners):
    """The runner killed -9, then a worker killed, and `resume` only once Ray lists that node dead: the node is no
    longer among the cluster's, yet the run a dead runner left on it is adopted and found lost with it, the host
    named, and run again elsewhere (before, the sweep's slots were read again without it, and its run was taken
    for one on slots not the sweep's: ended and queued again, the host never named)."""
    proc, results, names = three_runs(ray_lab, tmp_path, runners)
    with losing_a_worker(ray_lab) as workers:
        hosts = going_everywhere(proc, ray_lab, results, names)
        victim_name, victim = next((n, h) for n, h in hosts.items() if h in workers.workers)
        proc.send_signal(signal.SIGKILL)
        finish(proc)
        workers.kill(victim)
        dead = workers.killed[-1][1]
        wait_until(lambda: dead not in {n["NodeID"] for n in ray_lab.alive()}, 120, "Ray lists the node dead")
        done = autotune("resume", results, environ=lab_env(ray_lab), timeout=600)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
        own_lines_only(done.stdout, done.stderr)
        assert victim in done.stdout and "not theirs to hold" not in done.stderr, done.stdout + done.stderr
        runs = attempts(results)
        lost = next(a for a in runs if a.name == victim_name and a.attempt == 1)
        assert (lost.state, lost.reason) == (State.INTERRUPTED, Reason.LOST), lost
        assert sorted((a.name, a.attempt) for a in runs if a.state == State.SUCCEEDED) == sorted(
            [(n, 1) for n in names if n != victim_name] + [(victim_name, 2)])
        assert not [a for a in runs if a.name == victim_name and a.attempt == 2 and victim in a.slots]
        nothing_left(ray_lab, results)


def test_a_node_lost_as_the_runner_stops_and_closes(ray_lab, tmp_path, runners):
    """Alone, at the stop and close: runs going on every node, a worker killed and Ctrl-C at once: the runner
    ends the runs (one of them on a node that no longer answers), releases every lease and closes, in its own
    words only; Ray's log lines of the lost node are in the sweep's ray.log."""
    spec = write_sweep(tmp_path, range(3), extra="num_gpus: 2")
    results = tmp_path / "r"
    names = ["s_x0", "s_x1", "s_x2"]
    proc = runners.start("run", spec, "--ray", "--launcher", standin(tmp_path, 300), "-o", results, "--grace", "2",
                         environ=lab_env(ray_lab), directory=results)
    with losing_a_worker(ray_lab) as workers:
        hosts = going_everywhere(proc, ray_lab, results, names)
        workers.kill(next(h for h in hosts.values() if h in workers.workers))
        os.kill(proc.pid, signal.SIGINT)
        code, out, err = finish(proc, timeout=400)
        assert code == 130 and "Traceback" not in err, out + err
        own_lines_only(out, err)
        assert {a.state for a in attempts(results)} == {State.INTERRUPTED}, out + err
        assert (results / "ray.log").exists()
        nothing_left(ray_lab, results)
