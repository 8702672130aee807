"""Running attempts on this machine, each in a process group and session of its own.

`start` spawns DeepSpeed's launcher on the dispatcher's thread, then leaves the attempt to a thread of its
own, which waits on it (see `Stops.wait`), ends whatever of it is left, judges the result
and posts `Finished`. Ending is always the same sequence: SIGTERM to the process group, a grace period, then
SIGKILL to the group and to every process still carrying the tag. The launcher runs under the exit-status
wrapper (see exitstatus), so a runner that takes over after a crash can follow the attempt to its end
(`adopt`) and judge it as this one would have. Every thread here is owned by the executor's `Workers`:
`close()` joins them, and a failure in one is logged, never printed over the live view.
"""
from __future__ import annotations

import contextlib
import math
import os
import select
import subprocess
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Protocol

from ...core.events import Finished, Key, Launched, Post, Run
from ...core.outcome import Outcome
from ...core.slots import Devices
from ...jsonvalues import JSONObject
from ...spec.metrics import Metric
from ...states import Reason, State
from ...threads import Workers
from .. import exitstatus, tags
from ..attempt import prepare_directory, record_attempt
from ..launch import Command, Launcher, comm_buffer_prefix, deepspeed_command, mig_of, with_autotuning
from ..stops import Stops
from . import cores
from .cleanup import end_group
from .ports import free_port


class Adopted:
    """An attempt's process-group leader (its exit-status wrapper) that a dead runner started, followed as
    `subprocess.Popen` follows a child: `wait` blocks on a pidfd (no polling) until it ends, then returns the
    exit status the wrapper recorded, or None if none was. `pid` is None when it was gone already."""

    def __init__(self, pid: int | None, tag: str, status_path: Path):
        self._status_path = status_path
        pid = pid or exitstatus.find_wrapper(tag)
        self._fd = _pidfd_of(pid, tag) if pid else None
        self.pid = pid if self._fd is not None else None
        if self._fd is not None:
            weakref.finalize(self, os.close, self._fd)

    def wait(self, timeout: float | None = None) -> int | None:
        if self._fd is not None and not _ended_within(self._fd, timeout):
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
        status = exitstatus.read(self._status_path)
        return None if status is None else exitstatus.as_returncode(status)


class Child:
    """A launched process, waited on without polling. `Popen.wait(timeout)` sleeps in steps of up to 50 ms, and
    every attempt has a timeout (a default one too): each run held its slot ~25 ms past its end. A pidfd wakes
    the waiter the moment the process ends; `Popen.wait()` then reaps it."""

    def __init__(self, proc: subprocess.Popen[bytes]):
        self._proc = proc
        self.pid = proc.pid
        try:  # our child: not reaped before we wait on it, so the pid is its own
            self._fd: int | None = os.pidfd_open(proc.pid)
        except OSError:  # a kernel before 5.3: Popen's own (polling) wait
            self._fd = None
        if self._fd is not None:
            weakref.finalize(self, os.close, self._fd)

    def wait(self, timeout: float | None = None) -> int:
        if self._fd is None:
            return self._proc.wait(timeout)
        if timeout is not None and self._proc.returncode is None and not _ended_within(self._fd, timeout):
            raise subprocess.TimeoutExpired(self._proc.args, timeout)
        return self._proc.wait()


def _ended_within(pidfd: int, timeout: float | None) -> bool:
    """Whether the process behind `pidfd` ends within `timeout` seconds (None: waits for it). poll() takes at
    most 2^31-1 ms (24.8 days), so a longer wait is made of such pieces rather than overflowing."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    if timeout is None:
        return bool(poller.poll(None))
    left_ms = max(0, math.ceil(timeout * 1000))
    while True:
        piece = min(left_ms, 2**31 - 1)
        if poller.poll(piece):
            return True
        left_ms -= piece
        if left_ms <= 0:
            return False


def _pidfd_of(pid: int, tag: str) -> int | None:
    """A pidfd for `pid` if it is alive and carries the tag (checked after opening it, so the pidfd is the
    tagged process's even if the number is reused a moment later); None otherwise."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    if tags.carries(pid, tag):
        return fd
    os.close(fd)
    return None


SHM = Path("/dev/shm")


def remove_comm_buffers(master_addr: str, port: int, shm: Path = SHM) -> None:
    """Remove what DeepSpeed's CPU allreduce (its shm comm op) leaves behind: a 69 MB buffer per rank in
    /dev/shm, named by the master's address and port, which DeepSpeed 0.19 never unlinks (shm.cpp defines
    `shared_close` and never calls it). On this machine 349 runs filled its 24 GB of RAM with them, and the OOM
    killer then ended training runs. Called once the attempt's processes are gone: its port is still its own."""
    prefix = comm_buffer_prefix(os.getuid(), master_addr, port)
    try:  # names compared as they are: a glob compiled a pattern for every run (its port), 1.4 ms of CPU each
        with os.scandir(shm) as entries:
            names = [entry.name for entry in entries if entry.name.startswith(prefix)]
    except OSError:
        return
    for name in names:
        with contextlib.suppress(OSError):
            (shm / name).unlink()


class Processes(Protocol):
    """What differs in how an attempt's processes run from this machine: DeepSpeed's launcher itself (`Here`),
    or a Slurm job step started by srun here (slurm/executor.py: `SlurmSteps`). The executor owns the rest:
    ports, the attempt's thread, stops, the exit-status wrapper, the process group."""

    waits_for_start: bool  # True: Launched is posted once `await_start` returns, on the attempt's thread

    def command(self, run: Run, port: int) -> tuple[JSONObject, Command]:
        """The config this attempt runs (autotuning section included) and the command that runs it."""
        ...

    def environment(self, command: Command) -> dict[str, str]:
        """The command's whole environment."""
        ...

    def prepare(self, run: Run) -> None:
        """Files the command reads, written into the attempt's directory before it is spawned."""
        ...

    def await_start(self, run: Run, proc: Child) -> str | None:
        """(`waits_for_start` only) once it runs: its id where it has one (a step's), recorded with Launched."""
        ...

    def ended(self, run: Run, outcome: Outcome, post: Post) -> Outcome:
        """After the launcher ended and was judged: what is left of it ended; the outcome, maybe amended."""
        ...

    def end(self, proc: Child | Adopted, tag: str, grace: float, killing: bool) -> None:
        """Before the process group is ended (stop, timeout): ending it as this kind of process is ended."""
        ...

    def remove_buffers(self, run: Run, port: int) -> None:
        """DeepSpeed's leaked /dev/shm buffers of an attempt that has ended, where its ranks ran."""
        ...

    def kill_all(self, tags: list[str]) -> None:
        """After every group was killed (`LocalExecutor.kill_all`): anything else of those attempts."""
        ...


@dataclass
class Here:
    """DeepSpeed's launcher run here, in a process group and session of its own (see Processes)."""

    hostfile: str
    metric: Metric
    launcher: Launcher = field(default_factory=Launcher)
    env: Mapping[str, str] = field(default_factory=dict)
    devices: Devices = field(default_factory=dict)  # this machine's MIG instances, by host and slot id
    cpu_slots: Mapping[str, Sequence[int]] = field(default_factory=dict)  # this machine's CPU slots, by host
    waits_for_start: bool = False

    def command(self, run: Run, port: int) -> tuple[JSONObject, Command]:
        metrics_path = str(run.dir / "metrics.json")
        config = with_autotuning(run.experiment.config(), metrics_path, self.metric.name)
        command = deepspeed_command(
            run.experiment, run.reservation, config, hostfile=self.hostfile, master_port=port,
            metric_path=metrics_path, tag=run.tag, cwd=str(Path(run.experiment.script).parent),
            launcher=self.launcher, env=self.env, mig=mig_of(run.reservation, self.devices))
        return config, self._on_own_cores(run, command)

    def _on_own_cores(self, run: Run, command: Command) -> Command:
        """A run on CPU slots of this machine, bound to its slots' cores (cores.py); any other as it is."""
        if len(run.reservation.slots) != 1 or run.reservation.hosts[0] not in self.cpu_slots:
            return command
        host, ids = run.reservation.slots[0]
        order = sorted(self.cpu_slots[host])
        argv, env = cores.bound(command.argv, command.env, [order.index(i) for i in ids if i in order], len(order),
                                cores.usable_cores())
        return Command(tuple(argv), env, command.cwd)

    def environment(self, command: Command) -> dict[str, str]:
        """Ours, plus the attempt's."""
        return {**os.environ, **command.env}

    def prepare(self, run: Run) -> None:
        """Nothing beyond the attempt's own files."""

    def await_start(self, run: Run, proc: Child) -> str | None:
        return None

    def ended(self, run: Run, outcome: Outcome, post: Post) -> Outcome:
        return outcome

    def end(self, proc: Child | Adopted, tag: str, grace: float, killing: bool) -> None:
        """Nothing beyond the process group."""

    def remove_buffers(self, run: Run, port: int) -> None:
        """Here, where its ranks ran (see `remove_comm_buffers`)."""
        remove_comm_buffers(self.launcher.master_addr, port)

    def kill_all(self, tags: list[str]) -> None:
        """Nothing beyond the process groups."""


@dataclass
class LocalExecutor:
    """Runs attempts as local processes: DeepSpeed's launcher (`Here`, by default) or what `processes` starts."""

    hostfile: str
    metric: Metric
    clock: Callable[[], float]
    launcher: Launcher = field(default_factory=Launcher)
    env: Mapping[str, str] = field(default_factory=dict)
    grace: float = 10.0
    devices: Devices = field(default_factory=dict)  # this machine's MIG instances, by host and slot id
    cpu_slots: Mapping[str, Sequence[int]] = field(default_factory=dict)  # this machine's CPU slots, by host
    processes: Processes | None = None  # None: DeepSpeed's launcher here (Here)

    def __post_init__(self) -> None:
        self._how: Processes = self.processes or Here(self.hostfile, self.metric, self.launcher, self.env,
                                                      self.devices, self.cpu_slots)
        self._lock = threading.Lock()
        self._procs: dict[Key, Child | Adopted] = {}
        self._tags: dict[Key, str] = {}
        self._ports: set[int] = set()
        self._stops = Stops()
        self._workers = Workers("local-executor")

    # --- the Executor interface ---------------------------------------------------------------------------
    def start(self, run: Run, post: Post) -> None:
        """Spawn the launcher here, on the dispatcher's thread (a fork and exec: about a millisecond), then
        leave the attempt to a thread of its own. Spawning here rather than on the new thread keeps a freed
        slot from waiting on thread start-up when many runs end at once."""
        with self._lock:
            port = free_port(self._ports)
            self._ports.add(port)
        try:
            config, command = self._how.command(run, port)
            prepare_directory(run)
            self._how.prepare(run)
            spawned = self.clock()  # the launch: before the spawn, so that no step of the run can come before it
            proc = self._spawn(run, command)
        except Exception as e:  # our own failure to launch (command missing, disk full, ...): recorded, never lost
            self._forget(run, port)
            why = f"cannot start {run.experiment.name}: {e.strerror if isinstance(e, OSError) else e}"
            outcome = Outcome(State.FAILED, Reason.LAUNCH, why)
            post(Finished(run, self._stops.settle(run.key, outcome), self.clock()))
            return
        if not self._how.waits_for_start:  # the pid recorded at once, here
            post(Launched(run, proc.pid, port, spawned))
        self._workers.start(f"run-{run.tag}", self._attempt, run, proc, port, post,
                            partial(self._watch, run, proc, config, command, port, post, spawned))

    def adopt(self, run: Run, pid: int | None, post: Post) -> None:
        """Follow an attempt a dead runner started (its leader `pid`) to its end, on a
        thread of its own; it is stopped like any run meanwhile. Ended already: judged from its files."""
        proc = Adopted(pid, run.tag, run.dir / exitstatus.FILENAME)
        if proc.pid is not None:
            self._track(run, proc)
        self._workers.start(f"adopted-{run.tag}", self._attempt, run, proc, None, post,
                            partial(self._follow, run, proc, post))

    def stop(self, run: Run, state: State, detail: str, reason: Reason | None = None) -> None:
        """Ask for the stop, and end the attempt's processes on a thread of their own (the grace period must
        not hold up the dispatcher); the attempt's thread then records the stop's outcome."""
        self._stops.ask(run.key, state, detail, reason)
        with self._lock:
            proc = self._procs.get(run.key)
        if proc is not None:
            self._workers.start(f"stop-{run.tag}", self._end, proc, run.tag)

    def kill_all(self) -> None:
        """Immediate: SIGKILL every running attempt's group and tagged processes, from any thread.

        Each is recorded interrupted (not judged by its exit status: -9 would read as the OOM killer), and an
        attempt still being started is killed as soon as it exists.
        """
        with self._lock:
            self._stops.kill_all(self._procs)
            running = [(self._tags[key], proc) for key, proc in self._procs.items()]
        for tag, proc in running:
            end_group(proc.pid, tag, 0, lambda _: False)
        self._how.kill_all([tag for tag, _ in running])

    def close(self) -> None:
        """Join the attempt and stop threads: each ends once its processes have (a stop's within the grace)."""
        self._workers.close(timeout=self.grace + 30)

    # --- one attempt, on its own thread -------------------------------------------------------------------
    def _spawn(self, run: Run, command: Command) -> Child:
        argv = exitstatus.wrapped(command.argv, run.dir / exitstatus.FILENAME)
        with open(run.dir / "stdout.log", "wb") as out, open(run.dir / "stderr.log", "wb") as err:
            proc = Child(subprocess.Popen(argv, cwd=command.cwd or None, env=self._how.environment(command),
                                          stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True))
        self._track(run, proc)
        return proc

    def _track(self, run: Run, proc: Child | Adopted) -> None:
        with self._lock:
            self._procs[run.key] = proc
            self._tags[run.key] = run.tag
        if self._stops.killing:
            self._stops.ask(run.key, *Stops.KILLED)

    def _forget(self, run: Run, port: int | None) -> None:
        with self._lock:
            if port is not None:
                self._ports.discard(port)
            self._procs.pop(run.key, None)
            self._tags.pop(run.key, None)

    def _attempt(self, run: Run, proc: Child | Adopted, port: int | None, post: Post,
                 follow: Callable[[], Outcome]) -> None:
        """The attempt's own thread: `follow` it to its outcome, which is posted whatever goes wrong; then
        DeepSpeed's leaked buffers are removed, after the post so that the freed slot never waits on it (the
        port stays the attempt's until then: no new run can take the buffers' names)."""
        try:
            try:
                outcome = follow()
            except Exception as e:  # e.g. the results disk filled up, or a process SIGKILL does not end
                with contextlib.suppress(Exception):  # the outcome is posted whatever is left: the slot must not
                    end_group(proc.pid, run.tag, 0, lambda _: False)  # be lost with it
                outcome = Outcome(State.FAILED, Reason.LAUNCH, f"{type(e).__name__}: {e}")
            finally:
                self._forget(run, None)
            settled = self._stops.settle(run.key, outcome)
            if settled is not outcome:  # ended on our request: its recorded status tells our stop, not its end
                exitstatus.forget(run.dir)
            post(Finished(run, settled, self.clock()))
        finally:
            if port is not None:
                with contextlib.suppress(Exception):
                    self.remove_buffers(run, port)
                self._forget(run, port)

    def remove_buffers(self, run: Run, port: int) -> None:
        """DeepSpeed's leaked /dev/shm buffers of an attempt that has ended, where its ranks ran."""
        self._how.remove_buffers(run, port)

    def _watch(self, run: Run, proc: Child, config: JSONObject, command: Command, port: int,
               post: Post, spawned: float) -> Outcome:
        if self._how.waits_for_start:
            post(Launched(run, proc.pid, port, spawned, self._how.await_start(run, proc)))
        # The ledger already holds the attempt; these files document it, so they need not delay the start.
        record_attempt(run, config, command)
        return self._follow(run, proc, post)

    def _follow(self, run: Run, proc: Child | Adopted, post: Post) -> Outcome:
        """Wait for the attempt (see `Stops.wait`), end whatever of it is left, judge it."""
        exit_code = self._stops.wait(run, proc, end=partial(self._end, proc, run.tag))
        end_group(proc.pid, run.tag, 0, lambda _: False)  # whatever of it outlived the launcher
        return self._how.ended(run, exitstatus.judge_files(exit_code, run.dir, self.metric), post)

    def _end(self, proc: Child | Adopted, tag: str) -> None:
        def gone_within(seconds: float) -> bool:
            try:
                proc.wait(timeout=seconds)
                return True
            except subprocess.TimeoutExpired:
                return False

        self._how.end(proc, tag, self.grace, self._stops.killing)
        end_group(proc.pid, tag, 0 if self._stops.killing else self.grace, gone_within)
