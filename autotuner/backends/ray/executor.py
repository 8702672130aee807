"""Running attempts on a Ray cluster from the runner's own connection to it: each attempt takes a lease (a
placement group with a bundle per node and an actor on each, leases.py), starts DeepSpeed's per-node launcher
on each node from its actor, and is followed on a thread of its own until every node's launcher has ended. One
node's launcher failing ends the others.

Ending an attempt (a stop: timeout, cancel, Ctrl-C, a lost host): every node's launcher gets SIGTERM, the grace
period, SIGKILL, from its actor; the lease is then released (actors killed, placement group removed). A lease
whose attempt ended on its own is given back for the next attempt of its shape. A node Ray loses under an
attempt (its actor dies) makes the attempt interrupted and its host lost, to run again elsewhere.

After a crash of the runner, the next one finds each running attempt's lease by what its actors say they run
(`adoptable`, filled by the backend) and follows it the same way; an attempt whose lease is gone is judged by
the exit status its nodes wrote (node.py); with none, it is lost with a node Ray reports dead (its actors died
with it while no runner was alive), else interrupted.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from ...core.events import Finished, HostLost, Key, Launched, Post, Run
from ...core.outcome import Outcome, classify
from ...jsonvalues import JSONObject
from ...spec.hostfile import format_hostfile
from ...spec.metrics import Metric
from ...states import Reason, State
from ...threads import Workers
from .. import exitstatus
from ..attempt import prepare_directory, record_attempt
from ..launch import Command, Launcher, comm_buffer_prefix, deepspeed_command, with_autotuning
from ..local.ports import free_port
from ..stops import Stops
from .leases import Lease, Leases, NotPlaced, stop_nodes
from .node import STATUS

LOST_WITHIN = 60.0  # seconds for Ray to report dead the node under an actor that died


@dataclass
class RayExecutor:
    """Attempts on the Ray cluster `ray` is connected to (see the module docstring); an Executor."""

    ray: ModuleType
    leases: Leases
    metric: Metric
    clock: Callable[[], float]
    launcher: Launcher = field(default_factory=Launcher)
    env: Mapping[str, str] = field(default_factory=dict)
    grace: float = 10.0
    nodes: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # host -> {id, ip} (the record's nodes)
    capacity: Mapping[str, int] = field(default_factory=dict)  # host -> its GPUs, for DeepSpeed's hostfile
    on_lost: Callable[[str], None] = lambda host: None  # a host found lost here (the watcher follows it)
    adoptable: dict[str, Lease] = field(default_factory=dict)  # tag -> the lease a dead runner left running it

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[Key, Lease] = {}  # the lease of each attempt under way
        self._ports: set[int] = set()
        self._stops = Stops()
        self._workers = Workers("ray-executor")
        self._closing = threading.Event()
        self._workers.start("expire", self._expire)

    # --- the Executor interface ---------------------------------------------------------------------------
    def start(self, run: Run, post: Post) -> None:
        """The attempt's directory and files written here, then the attempt left to a thread of its own (a
        lease may take Ray a while to reserve)."""
        with self._lock:
            port = free_port(self._ports)
            self._ports.add(port)
        try:
            config, command = self._command(run, port)
            prepare_directory(run)
            self._prepare(run)
        except Exception as e:  # our own failure to launch (disk full, ...): recorded, never lost
            self._forget(run, port)
            why = f"cannot start {run.experiment.name}: {e.strerror if isinstance(e, OSError) else e}"
            post(Finished(run, self._stops.settle(run.key, Outcome(State.FAILED, Reason.LAUNCH, why)), self.clock()))
            return
        self._workers.start(f"run-{run.tag}", self._attempt, run, port, post, config, command)

    def adopt(self, run: Run, pid: int | None, post: Post) -> None:
        """Follow an attempt a dead runner started, through the lease that runs it; without one, judged by the
        exit status its nodes wrote."""
        lease = self.adoptable.pop(run.tag, None)
        if lease is not None:
            lease.nodes = tuple(self.nodes.get(h, {}).get("id", h) for h in run.reservation.hosts)
            lease.gpus = run.experiment.num_gpus
            with self._lock:
                self._held[run.key] = lease
            if self._stops.killing:
                self._stops.ask(run.key, *Stops.KILLED)
        self._workers.start(f"adopted-{run.tag}", self._adopted, run, lease, post)

    def stop(self, run: Run, state: State, detail: str, reason: Reason | None = None) -> None:
        """Ask for the stop, and end the nodes' launchers on a thread of their own (the grace period must not
        hold up the dispatcher); the attempt's thread then records the stop's outcome."""
        self._stops.ask(run.key, state, detail, reason)
        with self._lock:
            lease = self._held.get(run.key)
        if lease is not None:
            self._workers.start(f"stop-{run.tag}", stop_nodes, self.ray, lease.actors, self.grace, run.tag)

    def kill_all(self) -> None:
        """Immediate: every attempt's launchers SIGKILLed and its lease released; each recorded interrupted."""
        with self._lock:
            self._stops.kill_all(self._held)
            held = list(self._held.values())
        for lease in held:
            self.leases.release(lease, 0)

    def close(self) -> None:
        """The attempts' threads joined (each ends once its nodes' launchers have), then every idle lease
        released."""
        self._closing.set()
        self._workers.close(timeout=self.grace + 30)
        self.leases.close()

    # --- one attempt --------------------------------------------------------------------------------------
    def _command(self, run: Run, port: int) -> tuple[JSONObject, Command]:
        """The config the attempt runs and DeepSpeed's command for it (its first node as the master)."""
        metrics_path = str(run.dir / "metrics.json")
        config = with_autotuning(run.experiment.config(), metrics_path, self.metric.name)
        launcher = Launcher(self.launcher.executable, self.nodes[run.reservation.hosts[0]]["ip"],
                            self.launcher.options)
        return config, deepspeed_command(
            run.experiment, run.reservation, config, hostfile=str(run.dir / "hostfile"), master_port=port,
            metric_path=metrics_path, tag=run.tag, cwd=str(Path(run.experiment.script).parent),
            launcher=launcher, env=self.env, placement=())

    def _prepare(self, run: Run) -> None:
        """The hostfile DeepSpeed's launcher reads on each node, and no node's status of an earlier attempt."""
        (run.dir / "hostfile").write_text(format_hostfile({h: self.capacity.get(h, run.experiment.num_gpus)
                                                           for h in run.reservation.hosts}))
        nodes = run.dir / "nodes"
        nodes.mkdir(exist_ok=True)
        for old in nodes.glob(f"*.{STATUS}"):
            old.unlink(missing_ok=True)
        for name in ("stdout.log", "stderr.log"):
            (run.dir / name).write_bytes(b"")

    def _attempt(self, run: Run, port: int, post: Post, config: JSONObject, command: Command) -> None:
        """The attempt's own thread: a lease, the nodes' launchers, their end; the outcome is posted whatever
        goes wrong, after the lease is given back or released (the next attempt may need its GPUs)."""
        lease: Lease | None = None
        clean = False
        try:
            try:
                hosts = run.reservation.hosts
                lease = self.leases.take([self.nodes[h]["id"] for h in hosts], run.experiment.num_gpus)
                with self._lock:
                    self._held[run.key] = lease
                if self._stops.asked(run.key):  # stopped while Ray reserved it: nothing started
                    outcome = Outcome(State.INTERRUPTED, Reason.INTERRUPTED, "stopped before it started")
                else:
                    launched = self.clock()  # before the launchers start: no step of the run comes before it
                    pid = self._start_nodes(run, lease, port, command)
                    post(Launched(run, pid, port, launched))
                    record_attempt(run, config, command)
                    outcome, clean = self._follow(run, lease, post)
            except NotPlaced as e:
                outcome = Outcome(State.FAILED, Reason.LAUNCH, str(e))
            except Exception as e:  # e.g. the results disk filled up, or a node lost as its launcher started
                if lease is not None and isinstance(e, self.ray.exceptions.RayActorError):
                    outcome = self._lost(run, lease, e, post)
                else:
                    outcome = Outcome(State.FAILED, Reason.LAUNCH, f"{type(e).__name__}: {e}")
            self._finish(run, lease, clean, outcome, post)
        finally:
            self._forget(run, port)

    def _adopted(self, run: Run, lease: Lease | None, post: Post) -> None:
        clean = False
        try:
            if lease is None:
                outcome = self._unfollowed(run, post)
            else:
                outcome, clean = self._follow(run, lease, post)
        except Exception as e:
            outcome = Outcome(State.FAILED, Reason.LAUNCH, f"{type(e).__name__}: {e}")
        self._finish(run, lease, clean, outcome, post)
        self._forget(run, None)

    def _start_nodes(self, run: Run, lease: Lease, port: int, command: Command) -> int:
        """Each node's launcher started from its actor (stopped at once if a stop came meanwhile); the first
        node's pid. The first node writes the attempt's stdout and stderr, the others theirs under nodes/."""
        words = len(self.launcher.executable)
        hosts = run.reservation.hosts
        master = self.nodes[hosts[0]]["ip"]
        buffers = comm_buffer_prefix("{uid}", master, port)
        logs = [node_logs(run.dir, rank) for rank in range(len(hosts))]
        starts = [actor.start.remote(run.tag, list(command.argv[:words]), list(command.argv[words:]), list(hosts),
                                     run.experiment.num_gpus, rank, dict(command.env), command.cwd, str(out),
                                     str(err), str(run.dir), buffers)
                  for rank, (actor, (out, err)) in enumerate(zip(lease.actors, logs, strict=True))]
        pids = self.ray.get(starts)
        if self._stops.asked(run.key):  # a stop that came while they started found nothing to end
            stop_nodes(self.ray, lease.actors, self.grace, run.tag)
        return int(pids[0])

    def _follow(self, run: Run, lease: Lease, post: Post) -> tuple[Outcome, bool]:
        """Each node's exit status as it ends; the first failure ends the others. The outcome, and whether the
        lease is clean for another attempt (every launcher ended on its own, no stop asked)."""
        waits = {actor.wait.remote(run.tag): rank for rank, actor in enumerate(lease.actors)}
        code: int | None = 0
        while waits:
            done, _ = self.ray.wait(list(waits), num_returns=1)
            for ref in done:
                rank = waits.pop(ref)
                try:
                    status = self.ray.get(ref)
                except self.ray.exceptions.RayError as e:
                    return self._lost(run, lease, e, post), False
                status = 1 if status is None else int(status)
                if status != 0 and code == 0:
                    code = status
                    note = (f"node {rank} ({run.reservation.hosts[rank]}) ended with exit status {status}: ending "
                            f"the others{_telling(run.dir, rank, status)}\n")
                    with contextlib.suppress(OSError), open(run.dir / "stderr.log", "a") as err:
                        err.write(note)
                    stop_nodes(self.ray, lease.actors, self.grace, run.tag)
        return exitstatus.judge_files(code, run.dir, self.metric), not self._stops.asked(run.key)

    def _unfollowed(self, run: Run, post: Post) -> Outcome:
        """An adopted attempt with no lease left in Ray: judged by the exit status its nodes wrote; with none, its
        actors ended unheard, so it is lost with a node of it that Ray reports dead (as under a runner), if one is."""
        status = exitstatus.read(run.dir / exitstatus.FILENAME)
        gone = self._dead_host(run) if status is None else None
        if gone is not None:
            return self._host_lost(gone, post)
        return exitstatus.judge_files(status, run.dir, self.metric)

    def _lost(self, run: Run, lease: Lease, error: Exception, post: Post) -> Outcome:
        """A node's actor died under the attempt: its node is taken as lost when Ray says so, the other nodes'
        launchers ended."""
        stop_nodes(self.ray, lease.actors, self.grace, run.tag)
        why = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        gone = self._dead_host(run)
        if gone is None:
            return Outcome(State.FAILED, Reason.LAUNCH, f"an actor of the attempt died: {why}")
        return self._host_lost(gone, post)

    def _dead_host(self, run: Run) -> str | None:
        """A host of the attempt that Ray reports dead, waited for a while (Ray marks a node dead once its health
        checks have failed, and lists it alive until then); None when none is."""
        ids = {self.nodes.get(h, {}).get("id", h): h for h in run.reservation.hosts}
        end = time.monotonic() + LOST_WITHIN
        while True:
            gone = [h for i, h in ids.items() if i not in {n["NodeID"] for n in self.ray.nodes() if n["Alive"]}]
            if gone or time.monotonic() > end or self._closing.is_set() or self._stops.killing:
                return gone[0] if gone else None
            time.sleep(0.5)

    def _host_lost(self, host: str, post: Post) -> Outcome:
        post(HostLost(host, "Ray reports the node dead"))
        self.on_lost(host)
        return Outcome(State.INTERRUPTED, Reason.LOST, f"node {host} lost: Ray reports it dead")

    def _finish(self, run: Run, lease: Lease | None, clean: bool, outcome: Outcome, post: Post) -> None:
        """The lease given back (clean) or released, then the outcome posted, as the stop asked says."""
        if lease is not None:
            with self._lock:
                self._held.pop(run.key, None)
            if clean and not self._stops.killing:
                self.leases.give_back(lease)
            else:
                self.leases.release(lease, 0)
        settled = self._stops.settle(run.key, outcome)
        if settled is not outcome:  # ended on our request: its recorded status tells our stop, not its end
            exitstatus.forget(run.dir)
        post(Finished(run, settled, self.clock()))

    def _forget(self, run: Run, port: int | None) -> None:
        with self._lock:
            if port is not None:
                self._ports.discard(port)
            self._held.pop(run.key, None)

    def _expire(self) -> None:
        """Idle leases released once past their time, while the runner lives."""
        while not self._closing.wait(self.leases.idle_for / 2):
            with contextlib.suppress(Exception):
                self.leases.expire()


def _telling(directory: Path, rank: int, status: int) -> str:
    """A further node's telling line (out of memory, a config refused, ...), as the note that it failed repeats it
    in the attempt's own stderr.log: the attempt is judged by its own logs, so a rank out of memory on the second
    node reads as out of memory, not as a crash (which would give up a tune's stage)."""
    if rank == 0:
        return ""
    out, err = node_logs(directory, rank)
    _, line = classify(status, [err, out])
    return f"; it said: {line}" if line else ""


def node_logs(directory: Path, rank: int) -> tuple[Path, Path]:
    """Where the launcher of node `rank` writes its stdout and stderr: the first node the attempt's own, the
    others theirs under nodes/."""
    if rank == 0:
        return directory / "stdout.log", directory / "stderr.log"
    return directory / "nodes" / f"{rank}.stdout.log", directory / "nodes" / f"{rank}.stderr.log"
