"""One contract suite, the same test bodies run against every real backend (as Optuna runs one storage suite
against every storage): this machine (`--slots`), SSH hosts (tests/sshnodes.py), a Slurm allocation
(tests/slurm_lab.py) and a Ray cluster (tests/ray_lab.py). A new backend is added to `CLUSTERS` and passes it.

Every cluster offers three places for a two-slot run (this machine: six slots), and every sweep is three such
runs, one per place, each a stand-in that waits at a gate the test opens when it chooses (for one run or all, to
succeed or fail); so each case is deterministic: what the runner adopts, stops, loses or leaves to `cancel` is
still running when it does, and what ends while no runner is alive has ended. The stand-in holds a stop
(SIGTERM) until the test releases it, so a runner can be killed while its stop is under way. Nothing is left of
a sweep: no tagged process on this machine (every node is this machine), and nothing the cluster itself holds
for it (Slurm steps, Ray placement groups and actors)."""
from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from test_ray_faults import losing_a_worker, own_lines_only

from autotuner.backends.ray.nodes import host_of
from autotuner.states import Reason, State

import cli_rig as rig
from cli_rig import PREAMBLE, WRITE_METRICS, Runners, env

NAMES = ["s_x0", "s_x1", "s_x2"]

# Logs its launch, says its stop is armed ($READY.NAME), waits until $GATE/all or $GATE/NAME exists, then
# succeeds ($GATE/NAME.fail: fails, exit 3). A SIGTERM is noted ($STOPPED.NAME) and held until $RELEASE exists,
# then it ends as a stopped script does (143).
GATED = PREAMBLE + """\
trap 'touch "$STOPPED.$name"; while [ ! -e "$RELEASE" ]; do sleep 0.02; done; exit 143' TERM
touch "$READY.$name"
while [ ! -e "$GATE/all" ] && [ ! -e "$GATE/$name" ] && [ ! -e "$GATE/$name.fail" ]; do sleep 0.02; done
if [ -e "$GATE/$name.fail" ]; then exit 3; fi
""" + WRITE_METRICS


@dataclass
class Where:
    """One real cluster as the suite reaches it: the options that pick it, the environment `autotune` needs
    there, the hosts the test may lose (`lose(host)` -> the words the runner must say of it), and what the
    cluster itself may still hold of a sweep (`holds(sweep)`); `given`: Python that sets `given`, what
    `backend_for` takes of this cluster beyond the sweep's record (as the command line gives it); `own_lines`:
    fails when what `autotune` printed holds lines that are the cluster's, not its own."""

    kind: str
    args: tuple[object, ...]
    environ: dict[str, str]
    losable: list[str] = field(default_factory=list)
    lose: Callable[[str], list[str]] = lambda host: [host]
    holds: Callable[[str], list[object]] = lambda sweep: []
    given: str = "given = {}"
    own_lines: Callable[[str], None] = lambda text: None


@contextlib.contextmanager
def local(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Where]:
    yield Where("local", ("--slots", 6), env())


@contextlib.contextmanager
def ssh(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Where]:
    nodes = request.getfixturevalue("ssh_nodes")  # all up again at the start of each test
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{name} slots=2 accelerator=cpu\n" for name in nodes.names))

    def lose(host: str) -> list[str]:
        nodes[host].stop()  # its sshd and everything under it
        return [host]

    yield Where("ssh", ("-H", hostfile, "--ssh-config", nodes.config_path), env(), list(nodes.names), lose)


@contextlib.contextmanager
def slurm(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Where]:
    lab = request.getfixturevalue("slurm_lab")
    job = lab.allocate(3, 2, "--exclusive")
    drained: list[str] = []

    def lose(host: str) -> list[str]:
        drained.append(host)
        lab.drain(host, "failing-fan")
        return [host, "failing-fan"]  # the node, and Slurm's reason

    environ = {k: v for k, v in env().items() if not k.startswith(("SLURM_", "SALLOC_", "SRUN_"))}
    environ |= {"SLURM_CONF": lab.env["SLURM_CONF"], "SLURM_JOB_ID": job, "AUTOTUNE_SLURM_POLL": "0.2"}
    try:
        yield Where("slurm", ("--slurm",), environ, ["n1", "n2", "n3"], lose,
                    lambda sweep: [s for s in lab.steps(job) if s.name.startswith(f"{sweep}.")],
                    "from autotuner.backends.slurm.ask import this_allocation\n"
                    "given = {'allocation': this_allocation()[0]}  # --slurm: the allocation SLURM_JOB_ID names")
    finally:
        for node in drained:
            lab.resume_node(node)
        lab.release(job)


@contextlib.contextmanager
def ray(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Where]:
    lab = request.getfixturevalue("ray_lab")
    with losing_a_worker(lab) as workers:  # a worker killed is replaced at the end, the cluster whole again
        def lose(host: str) -> list[str]:
            workers.kill(host)
            return [host]

        yield Where("ray", ("--ray",), env(**lab.env, AUTOTUNE_RAY_POLL=0.3), [host_of(w.node_id) for w in lab.workers],
                    lose, lambda sweep: [*lab.placement_groups(), *lab.actors(f"{sweep}.")],
                    own_lines=own_lines_only)


CLUSTERS = {"local": local, "ssh": ssh, "slurm": slurm, "ray": ray}
LABS = {"ssh": "ssh_nodes", "slurm": "slurm_lab", "ray": "ray_lab"}  # the lab fixture each cluster asks for


def reaching(kinds: list[str]) -> list[object]:
    """`where`'s params: each marked with the lab it asks for at run time (tests/conftest.py groups by it)."""
    return [pytest.param(kind, marks=[pytest.mark.lab(LABS[kind])] if kind in LABS else []) for kind in kinds]


@pytest.fixture(params=reaching(list(CLUSTERS)))
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Where]:
    with CLUSTERS[request.param](request, tmp_path) as reached:
        yield reached


class Sweep:
    """The suite's sweep on one cluster: three runs at the gate, the files the stand-ins are told on their
    command line (a Ray node's environment is its own, not the runner's)."""

    def __init__(self, where: Where, tmp_path: Path, runners: Runners, *, release: bool = True):
        self.where, self.runners = where, runners
        self.dir, self.log, self.gate = tmp_path / "out", tmp_path / "launches.log", tmp_path / "gate"
        self.flags, self.release = tmp_path / "flags", tmp_path / "release"
        self.flags.mkdir()
        self.gate.mkdir()
        if release:
            self.release.touch()
        self.spec = rig.write_sweep(tmp_path, range(3), extra="num_gpus: 2")
        files = {"LAUNCH_LOG": self.log, "GATE": self.gate, "RELEASE": self.release,
                 "READY": self.flags / "ready", "STOPPED": self.flags / "stopped"}
        self.launcher = "env " + " ".join(f"{k}={v}" for k, v in files.items()) + " " + rig.write_launcher(tmp_path,
                                                                                                   GATED)

    def start(self, *more: object) -> subprocess.Popen:
        return self.runners.start("run", self.spec, *self.where.args, "--launcher", self.launcher, "-o", self.dir,
                                  *more, environ=self.where.environ, directory=self.dir)

    def going(self, proc: subprocess.Popen) -> dict[str, str]:
        """Once every run is going (its stop armed): experiment -> its host."""
        def ready() -> dict[str, str]:
            if proc.poll() is not None:
                raise AssertionError(f"the runner ended: {rig.finish(proc)}")
            runs = rig.latest(self.dir)
            if sorted(rig.launched(self.dir)) != NAMES or not all((self.flags / f"ready.{n}").exists() for n in NAMES):
                return {}
            return {n: next(iter(runs[n].slots)) for n in NAMES}

        return rig.wait_until(ready, 180, "every run going")  # type: ignore[return-value]

    def kill_9(self, proc: subprocess.Popen) -> str:
        """The runner killed (-9); its runs outlive it. Returns the sweep's id."""
        proc.kill()
        proc.wait()
        sweep = rig.sweep_id(self.dir)
        assert sweep and rig.tagged_pids(sweep)
        return sweep

    def open(self, name: str = "all", *, fail: bool = False) -> None:
        """Let `name`'s run end (every run's by default): succeed, or fail with exit 3."""
        (self.gate / (f"{name}.fail" if fail else name)).touch()

    def ended_while_away(self, *names: str) -> None:
        """Once each of `names` ended with no runner alive: its status recorded beside its logs, nothing of it left."""
        sweep = rig.sweep_id(self.dir)
        rig.wait_until(lambda: all((self.dir / n / "exit_status").exists() and not rig.tagged_pids(f"{sweep}.{n}")
                                   for n in names), 120, f"{names} ended")

    def run(self, *args: object) -> subprocess.CompletedProcess:
        return rig.autotune(*args, environ=self.where.environ, timeout=600)

    def tries(self) -> dict[str, list[tuple[int, str, str | None]]]:
        runs: dict[str, list[tuple[int, str, str | None]]] = {}
        for a in rig.attempts(self.dir):
            runs.setdefault(a.name, []).append((a.attempt, a.state, a.reason))
        return runs

    def left(self) -> list[object]:
        sweep = str(rig.sweep_id(self.dir))
        return [*rig.tagged_pids(sweep), *self.where.holds(sweep)]

    def nothing_left(self) -> None:
        """Nothing of the sweep anywhere, once the cluster carried out the removals asked (Ray on its own time)."""
        with contextlib.suppress(AssertionError):
            rig.wait_until(lambda: not self.left(), 120)
        assert self.left() == []


CLOSE_TWICE = """\
import sys, threading
from pathlib import Path
from autotuner.backends.registry import backend_for
from autotuner.core import SlotPool
from autotuner.ledger.lock import SweepLock
from autotuner.ledger.store import Ledger

directory = Path(sys.argv[1])
exec(sys.argv[2])
with Ledger.open(directory) as ledger, SweepLock(directory):
    backend = backend_for(directory, ledger, given)  # the kind its record names
    backend.reach()
    attached = backend.attach()
    post = lambda event: None
    attached.executor(post)
    attached.ready(SlotPool(ledger.meta().slots), post)
    backend.close()
    backend.close()
print(sorted(t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon))
"""


def test_a_sweep_runs_each_experiment_once_and_its_backend_closes_twice(where, tmp_path, runners):
    sweep = Sweep(where, tmp_path, runners)
    sweep.open()
    code, out, err = rig.finish(sweep.start(), 300)
    assert code == 0, (out, err)
    assert sweep.tries() == {n: [(1, State.SUCCEEDED, None)] for n in NAMES}
    assert {a.name: a.metric for a in rig.attempts(sweep.dir)} == {n: rig.expected_throughput(n) for n in NAMES}
    assert sorted(rig.launches(sweep.log)) == [(n, 1) for n in NAMES]
    sweep.nothing_left()
    # The backend of the finished sweep, opened, attached, readied and closed twice: no error, nothing left.
    done = subprocess.run([sys.executable, "-c", CLOSE_TWICE, str(sweep.dir), where.given], env=where.environ,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "[]", (done.stdout, done.stderr)
    sweep.nothing_left()


def test_resume_after_kill_9_adopts_the_runs_still_going_and_runs_none_twice(where, tmp_path, runners):
    """One run ends while no runner is alive (kept as it ended), two still go (adopted, followed to their end)."""
    sweep = Sweep(where, tmp_path, runners)
    proc = sweep.start("-q")
    sweep.going(proc)
    sweep.kill_9(proc)
    sweep.open("s_x0")
    sweep.ended_while_away("s_x0")
    resumed = runners.start("resume", sweep.dir, environ=where.environ, directory=sweep.dir)
    adopted: set[str] = set()  # s_x0 too, where its end is read by the executor that adopts it
    while not {"s_x1", "s_x2"} <= adopted:  # e.g. 12:00:00 adopt NAME (attempt 1) on ...
        words = resumed.stdout.readline().split()
        assert words, rig.finish(resumed)
        if words[1:2] == ["adopt"]:
            adopted.add(words[2])
    sweep.open()  # only now: the other runs end under the runner that adopted them
    code, out, err = rig.finish(resumed, 300)
    assert code == 0, (out, err)
    assert sweep.tries() == {n: [(1, State.SUCCEEDED, None)] for n in NAMES}
    assert rig.latest(sweep.dir)["s_x0"].metric == rig.expected_throughput("s_x0")
    assert sorted(rig.launches(sweep.log)) == [(n, 1) for n in NAMES]  # launched once, by the runner that died
    sweep.nothing_left()


def test_a_stop_then_kill_9_during_it_reads_as_the_stop(where, tmp_path, runners):
    """A cancel of one run, then Ctrl-C, and the runner killed while its runs hold the SIGTERM: `resume` reads
    each as the stop it was under (cancelled; interrupted, and run again), never as a failure."""
    sweep = Sweep(where, tmp_path, runners, release=False)
    proc = sweep.start("-q", "--grace", 300)
    sweep.going(proc)
    assert sweep.run("cancel", sweep.dir, "s_x0").returncode == 0
    rig.wait_until(lambda: (sweep.flags / "stopped.s_x0").exists(), 120, "s_x0 told to stop")
    proc.send_signal(signal.SIGINT)
    rig.wait_until(lambda: all((sweep.flags / f"stopped.{n}").exists() for n in NAMES), 120, "every run told to stop")
    sweep.kill_9(proc)
    sweep.release.touch()
    sweep.ended_while_away(*NAMES)
    sweep.open()
    done = sweep.run("resume", sweep.dir, "-q")
    assert done.returncode == 1, done.stdout + done.stderr  # a cancelled experiment is no success (--fail-on any)
    assert sweep.tries() == {"s_x0": [(1, State.CANCELLED, Reason.CANCELLED)]} | {
        n: [(1, State.INTERRUPTED, Reason.INTERRUPTED), (2, State.SUCCEEDED, None)] for n in NAMES[1:]}
    sweep.nothing_left()


LOSABLE = reaching([kind for kind in CLUSTERS if kind != "local"])  # this machine alone has no other host to lose


@pytest.mark.parametrize("where", LOSABLE, indirect=True)
def test_a_lost_host_its_run_runs_again_elsewhere(where, tmp_path, runners):
    sweep = Sweep(where, tmp_path, runners)
    proc = sweep.start()
    hosts = sweep.going(proc)
    victim, host = next((n, h) for n, h in hosts.items() if h in where.losable)
    told = where.lose(host)
    rig.wait_until(lambda: rig.latest(sweep.dir)[victim].state != State.RUNNING, 180, f"{victim} lost with {host}")
    sweep.open()
    code, out, err = rig.finish(proc, 300)
    assert code == 0, (out, err)
    assert all(word in out for word in told), out  # the user is told which host, and why where the cluster says
    where.own_lines(out + err)
    runs = sweep.tries()
    assert runs.pop(victim)[:1] == [(1, State.INTERRUPTED, Reason.LOST)]
    again = rig.latest(sweep.dir)[victim]
    assert (again.attempt, again.state) == (2, State.SUCCEEDED) and host not in again.slots
    assert runs == {n: [(1, State.SUCCEEDED, None)] for n in NAMES if n != victim}
    sweep.nothing_left()


@pytest.mark.parametrize("where", LOSABLE, indirect=True)
def test_a_host_lost_while_no_runner_is_alive_its_run_runs_again_elsewhere_on_resume(where, tmp_path, runners):
    """The runner killed (-9), then a host lost: `resume` adopts the runs still going, takes the lost host's
    run as lost (never failed) and runs it again on another host."""
    sweep = Sweep(where, tmp_path, runners)
    proc = sweep.start("-q")
    hosts = sweep.going(proc)
    victim, host = next((n, h) for n, h in hosts.items() if h in where.losable)
    sweep.kill_9(proc)
    told = where.lose(host)
    resumed = runners.start("resume", sweep.dir, environ=where.environ, directory=sweep.dir)
    rig.wait_until(lambda: rig.latest(sweep.dir)[victim].attempt == 2 or resumed.poll() is not None, 180,
                   f"{victim} lost with {host}")
    sweep.open()
    code, out, err = rig.finish(resumed, 300)
    assert code == 0, (out, err)
    assert all(word in out for word in told), (out, err)
    where.own_lines(out + err)
    runs = sweep.tries()
    assert runs.pop(victim)[:1] == [(1, State.INTERRUPTED, Reason.LOST)], (out, err)
    again = rig.latest(sweep.dir)[victim]
    assert (again.attempt, again.state) == (2, State.SUCCEEDED) and host not in again.slots
    assert runs == {n: [(1, State.SUCCEEDED, None)] for n in NAMES if n != victim}
    sweep.nothing_left()


@pytest.mark.parametrize("where", LOSABLE, indirect=True)
def test_cancel_with_no_runner_and_a_host_lost_ends_everything(where, tmp_path, runners):
    """The runner killed (-9), then a host lost: `cancel` ends what still runs on the others and records every
    run cancelled, the lost host's too, with nothing left anywhere."""
    sweep = Sweep(where, tmp_path, runners)
    proc = sweep.start("-q")
    hosts = sweep.going(proc)
    host = next(h for h in hosts.values() if h in where.losable)
    sweep.kill_9(proc)
    where.lose(host)
    done = sweep.run("cancel", sweep.dir)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    where.own_lines(done.stdout + done.stderr)
    assert {n: a.state for n, a in rig.latest(sweep.dir).items()} == dict.fromkeys(NAMES, State.CANCELLED)
    sweep.nothing_left()


def test_cancel_with_no_runner_ends_everything_on_every_node(where, tmp_path, runners):
    """One run succeeds and one fails (exit 3) while no runner is alive, one still goes: `cancel` records the two
    as they ended, by the status each recorded, and ends the third wherever it runs."""
    sweep = Sweep(where, tmp_path, runners)
    proc = sweep.start("-q")
    hosts = sweep.going(proc)
    assert len(set(hosts.values())) == (1 if where.kind == "local" else 3)  # a run on every node
    sweep.kill_9(proc)
    sweep.open("s_x0")
    sweep.open("s_x1", fail=True)
    sweep.ended_while_away("s_x0", "s_x1")
    done = sweep.run("cancel", sweep.dir)
    assert done.returncode == 0, done.stdout + done.stderr
    final = rig.latest(sweep.dir)
    assert {n: a.state for n, a in final.items()} == {"s_x0": State.SUCCEEDED, "s_x1": State.FAILED,
                                                       "s_x2": State.CANCELLED}
    assert (final["s_x0"].attempt, final["s_x0"].metric) == (1, rig.expected_throughput("s_x0"))
    assert (final["s_x1"].attempt, final["s_x1"].exit_code) == (1, 3)
    assert sorted(rig.launches(sweep.log)) == [(n, 1) for n in NAMES]
    sweep.nothing_left()
