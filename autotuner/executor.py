"""Running attempts on this machine: one thread per attempt, each in a process group and session of its own.

The thread starts DeepSpeed's launcher, waits on it (with the experiment's timeout), ends whatever of it is
left, judges the result and posts events to the dispatcher. Ending is always the same sequence: SIGTERM to
the process group, a grace period, then SIGKILL to the group and to every process still carrying the tag.
The launcher runs under the exit-status wrapper (see exitstatus), so a runner that takes over after a crash
can follow the attempt to its end (`adopt`) and judge it as this one would have.
"""
from __future__ import annotations

import os
import random
import select
import shutil
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from . import exitstatus, tags
from .cleanup import end_group
from .files import write_atomic, write_json_atomic
from .launch import MASTER_PORTS, Command, Launcher, deepspeed_command, with_autotuning
from .ledger import INTERRUPTED, SUCCEEDED, TIMED_OUT
from .metrics import Metric
from .outcome import LOST, TIMEOUT, Outcome
from .scheduler import Finished, Launched, Run

EXP_FILES = ("exp.json", "ds_config.json", "cmd.txt", "stdout.log", "stderr.log", "metrics.json",
             exitstatus.FILENAME)


def free_port(taken: set[int]) -> int:
    """A master port free on this machine now, not handed to another running attempt, and outside the
    ephemeral range (see launch.MASTER_PORTS), so nothing else is given it before the launcher binds it."""
    while True:
        port = random.randint(*MASTER_PORTS)
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        return port


def keep_previous_attempt(directory: Path, attempt: int) -> None:
    """Move an earlier attempt's files into attempt-N/ so the experiment's directory shows the latest one."""
    if attempt <= 1 or not directory.exists():
        return
    previous = directory / f"attempt-{attempt - 1}"
    previous.mkdir(exist_ok=True)
    for name in EXP_FILES:
        if (directory / name).exists():
            os.replace(directory / name, previous / name)


def prepare_directory(run: Run) -> None:
    """The attempt's own directory, with an earlier attempt's files moved aside and no stale metrics."""
    keep_previous_attempt(run.dir, run.attempt)
    run.dir.mkdir(parents=True, exist_ok=True)
    (run.dir / "metrics.json").unlink(missing_ok=True)
    (run.dir / exitstatus.FILENAME).unlink(missing_ok=True)


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
        if self._fd is not None:
            poller = select.poll()
            poller.register(self._fd, select.POLLIN)
            if not poller.poll(None if timeout is None else max(0, int(timeout * 1000))):
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
        status = exitstatus.read(self._status_path)
        return None if status is None else exitstatus.as_returncode(status)


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


def record_attempt(run: Run, config: dict, command: Command) -> None:
    """exp.json, ds_config.json and cmd.txt: what this attempt is, what it runs, and how."""
    write_json_atomic(run.dir / "exp.json", {**run.experiment.to_json(), "attempt": run.attempt,
                                             "slots": run.reservation.as_dict(), "tag": run.tag})
    write_json_atomic(run.dir / "ds_config.json", config)
    write_atomic(run.dir / "cmd.txt", command.shell() + "\n")


Key = tuple[str, int]  # Run.key: (experiment, attempt)


class Stops:
    """Stop requests for running attempts (cancel, Ctrl-C, timeout, a lost host) and how an attempt's outcome
    reads once one was made. Shared by the local and the SSH executor; thread-safe."""

    KILLED = (INTERRUPTED, "killed at once (interrupted twice)", None)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked: dict[Key, tuple[str, str, str | None]] = {}
        self.killing = False  # kill_all was called: no grace period any more, and late starts are killed too

    def ask(self, key: Key, state: str, detail: str, reason: str | None = None) -> None:
        """The first request wins: a cancel is not turned into a timeout by the timer that fires after it."""
        with self._lock:
            self._asked.setdefault(key, (state, detail, reason))

    def asked(self, key: Key) -> bool:
        with self._lock:
            return key in self._asked

    def kill_all(self, keys: Iterable[Key]) -> None:
        with self._lock:
            self.killing = True
            for key in keys:
                self._asked.setdefault(key, self.KILLED)

    def settle(self, key: Key, outcome: Outcome) -> Outcome:
        """The outcome to record: the stop's, unless the attempt succeeded before the stop reached it, or its
        host was lost (then it runs again elsewhere)."""
        with self._lock:
            request = self._asked.pop(key, None)
        if request is None or outcome.state == SUCCEEDED or outcome.reason == LOST:
            return outcome
        state, detail, reason = request
        return Outcome(state, reason or state, detail, outcome.exit_code)


@dataclass
class LocalExecutor:
    """Runs attempts as local processes through DeepSpeed's launcher."""

    hostfile: str
    metric: Metric
    clock: Callable[[], float]
    launcher: Launcher = field(default_factory=Launcher)
    env: Mapping[str, str] = field(default_factory=dict)
    default_timeout: float | None = None
    grace: float = 10.0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: dict[tuple[str, int], subprocess.Popen] = {}
        self._tags: dict[tuple[str, int], str] = {}
        self._ports: set[int] = set()
        self._stops = Stops()

    # --- the Executor interface ---------------------------------------------------------------------------
    def start(self, run: Run, post: Callable[[object], None]) -> None:
        """Spawn the launcher here, on the dispatcher's thread (a fork and exec: about a millisecond), then
        leave the attempt to a thread of its own. Spawning here rather than on the new thread keeps a freed
        slot from waiting on thread start-up when many runs end at once."""
        with self._lock:
            port = free_port(self._ports)
            self._ports.add(port)
        try:
            config, command = self.command(run, port)
            prepare_directory(run)
            proc = self._spawn(run, command)
        except Exception as e:  # our own failure to launch (command missing, disk full, ...): recorded, never lost
            self._forget(run, port)
            why = f"cannot start {run.experiment.name}: {e.strerror if isinstance(e, OSError) else e}"
            post(Finished(run, self._stops.settle(run.key, Outcome("failed", "launch", why)), self.clock()))
            return
        post(Launched(run, proc.pid, port, self.clock()))
        watch = partial(self._watch, run, proc, config, command)
        threading.Thread(target=self._attempt, args=(run, proc, port, post, watch), name=f"run-{run.tag}",
                         daemon=True).start()

    def adopt(self, run: Run, pid: int | None, since: float, post: Callable[[object], None]) -> None:
        """Follow an attempt a dead runner started (its leader `pid`, started at `since`) to its end, on a
        thread of its own; it is stopped like any run meanwhile. Ended already: judged from its files."""
        proc = Adopted(pid, run.tag, run.dir / exitstatus.FILENAME)
        if proc.pid is not None:
            self._track(run, proc)
        follow = partial(self._follow, run, proc, since)
        threading.Thread(target=self._attempt, args=(run, proc, None, post, follow), name=f"adopted-{run.tag}",
                         daemon=True).start()

    def stop(self, run: Run, state: str, detail: str, reason: str | None = None) -> None:
        self._stops.ask(run.key, state, detail, reason)
        with self._lock:
            proc = self._procs.get(run.key)
        if proc is not None:
            threading.Thread(target=self._end, args=(proc, run.tag), daemon=True).start()

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

    # --- one attempt, on its own thread -------------------------------------------------------------------
    def command(self, run: Run, port: int) -> tuple[dict, Command]:
        """The config this attempt runs (autotuning section included) and the command that runs it."""
        metrics_path = str(run.dir / "metrics.json")
        config = with_autotuning(run.experiment.config(), metrics_path, self.metric.name)
        return config, deepspeed_command(
            run.experiment, run.reservation, config, hostfile=self.hostfile, master_port=port,
            metric_path=metrics_path, tag=run.tag, cwd=str(Path(run.experiment.script).parent),
            launcher=self.launcher, env=self.env)

    def _spawn(self, run: Run, command: Command) -> subprocess.Popen:
        argv = exitstatus.wrapped(command.argv, run.dir / exitstatus.FILENAME)
        with open(run.dir / "stdout.log", "wb") as out, open(run.dir / "stderr.log", "wb") as err:
            proc = subprocess.Popen(argv, cwd=command.cwd or None, env={**os.environ, **command.env},
                                    stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        self._track(run, proc)
        return proc

    def _track(self, run: Run, proc: subprocess.Popen | Adopted) -> None:
        with self._lock:
            self._procs[run.key] = proc
            self._tags[run.key] = run.tag
        if self._stops.killing:
            self._stops.ask(run.key, *Stops.KILLED)

    def _forget(self, run: Run, port: int | None) -> None:
        with self._lock:
            self._ports.discard(port)
            self._procs.pop(run.key, None)
            self._tags.pop(run.key, None)

    def _attempt(self, run: Run, proc: subprocess.Popen | Adopted, port: int | None, post: Callable[[object], None],
                 follow: Callable[[], Outcome]) -> None:
        """The attempt's own thread: `follow` it to its outcome, which is posted whatever goes wrong."""
        try:
            outcome = follow()
        except Exception as e:  # e.g. the results disk filled up, or a process SIGKILL does not end
            try:
                end_group(proc.pid, run.tag, 0, lambda _: False)
            except Exception:
                pass  # the outcome is posted whatever is left: the slot must not be lost with it
            outcome = Outcome("failed", "launch", f"{type(e).__name__}: {e}")
        finally:
            self._forget(run, port)
        settled = self._stops.settle(run.key, outcome)
        if settled is not outcome:  # ended on our request: its recorded status tells our stop, not its own end
            exitstatus.forget(run.dir)
        post(Finished(run, settled, self.clock()))

    def _watch(self, run: Run, proc: subprocess.Popen, config: dict, command: Command) -> Outcome:
        # The ledger already holds the attempt; these files document it, so they need not delay the start.
        record_attempt(run, config, command)
        return self._follow(run, proc, self.clock())

    def _follow(self, run: Run, proc: subprocess.Popen | Adopted, since: float) -> Outcome:
        """Wait for the attempt (its timeout counted from `since`), end whatever of it is left, judge it."""
        if self._stops.asked(run.key):
            self._end(proc, run.tag)
        timeout = run.experiment.timeout or self.default_timeout
        try:
            exit_code = proc.wait(timeout=None if timeout is None else max(0.0, since + timeout - self.clock()))
        except subprocess.TimeoutExpired:
            self._stops.ask(run.key, TIMED_OUT, f"ran past its timeout of {timeout:g} s", TIMEOUT)
            self._end(proc, run.tag)
            exit_code = proc.wait()
        end_group(proc.pid, run.tag, 0, lambda _: False)  # whatever of it outlived the launcher
        return exitstatus.judge_files(exit_code, run.dir, self.metric)

    def _end(self, proc: subprocess.Popen | Adopted, tag: str) -> None:
        def gone_within(seconds: float) -> bool:
            try:
                proc.wait(timeout=seconds)
                return True
            except subprocess.TimeoutExpired:
                return False

        end_group(proc.pid, tag, 0 if self._stops.killing else self.grace, gone_within)


def launcher_for_this_python() -> Launcher:
    """DeepSpeed's launcher installed beside this Python if there is one, else `deepspeed` from PATH."""
    beside = Path(sys.executable).parent / "deepspeed"
    return Launcher(executable=(str(beside),) if beside.exists() else (shutil.which("deepspeed") or "deepspeed",))
