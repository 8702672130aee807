"""Running attempts whose first host is another machine, over SSH.

DeepSpeed's launcher runs on the first host of the reservation, started over the pooled SSH connection in a
session of its own. For one node it launches the ranks there; for several it uses its own multi-node launcher
(pdsh by default) with the sweep's hostfile and `--include` for exactly the reserved slots, reaching the other
nodes the way DeepSpeed users already set up (node-to-node SSH). The experiment's environment reaches every
rank through DeepSpeed's env file (`DS_ENV_FILE`), so every process on every node carries the attempt's tag:
clean-up ends exactly those processes on each node and checks that none remain.

Logs and metrics are written on the first host: straight into the results directory when that host shares
our filesystem, else under `remote_root` and copied back over SFTP when the attempt ends. So is the exit
status the launcher's wrapper records (see exitstatus), which lets a runner that takes over after a crash
follow the attempt to its end (`adopt`) and judge it.
"""
from __future__ import annotations

import contextlib
import logging
import random
import shlex
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from ...core.events import Finished, HostLost, Launched, Post, Run
from ...core.outcome import Outcome
from ...core.slots import Devices
from ...spec.metrics import Metric
from ...states import Reason, State
from ...threads import Workers
from .. import exitstatus, tags
from ..attempt import prepare_directory, record_attempt
from ..launch import MASTER_PORTS, Launcher, deepspeed_command, mig_of, with_autotuning
from ..stops import Stops
from .cleanup import end_tagged_remote, remove_comm_buffers
from .errors import HostDown, RemoteStartError
from .pool import SSHPool
from .process import RemoteProcess
from .sftp import RemoteFiles

log = logging.getLogger(__name__)


def env_file_text(env: Mapping[str, str]) -> str:
    """DeepSpeed's env file: `KEY=VALUE` lines that its multi-node launcher exports on every node.

    The launcher pastes each value into `export KEY=VALUE;` unquoted, so values are shell-quoted here.
    """
    return "".join(f"{k}={shlex.quote(str(v))}\n" for k, v in env.items())


def write_file_command(path: str, text: str) -> str:
    """A shell command that creates `path` (and its directory) holding exactly `text`."""
    directory = shlex.quote(str(Path(path).parent))
    return f"mkdir -p -- {directory} && printf %s {shlex.quote(text)} > {shlex.quote(path)}"


@dataclass
class SshExecutor:
    """Runs attempts whose first host is not this machine; same interface as LocalExecutor."""

    pool: SSHPool
    hostfile_text: str
    metric: Metric
    clock: Callable[[], float]
    launcher: Launcher
    env: Mapping[str, str] = field(default_factory=dict)
    grace: float = 10.0
    remote_root: str | None = None  # None: write into the results directory (a shared filesystem)
    on_lost: Callable[[str], None] = lambda host: None
    devices: Devices = field(default_factory=dict)  # the hosts' MIG instances: a run on one names its UUID

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: dict[tuple[str, int], RemoteProcess | AdoptedRemote] = {}
        self._stops = Stops()
        self._addresses: dict[str, str] = {}
        self._files = RemoteFiles(self.pool)
        self._workers = Workers("ssh")  # each attempt's thread, and each stop's

    # --- the Executor interface ---------------------------------------------------------------------------
    def start(self, run: Run, post: Post) -> None:
        self._workers.start(f"attempt-{run.tag}", self._attempt, run, post, partial(self._execute, run, post))

    def adopt(self, run: Run, pid: int | None, post: Post) -> None:
        """Follow an attempt a dead runner started on its first host (its leader `pid`) to
        its end, on a thread of its own; it is stopped like any run meanwhile."""
        self._workers.start(f"adopted-{run.tag}", self._attempt, run, post, partial(self._adopted, run, pid))

    def stop(self, run: Run, state: State, detail: str, reason: Reason | None = None) -> None:
        self._stops.ask(run.key, state, detail, reason)
        with self._lock:
            proc = self._procs.get(run.key)
        if proc is not None:  # ending it takes a grace period: not on the dispatcher's thread
            self._workers.start(f"stop-{run.tag}", self._end, run, proc)

    def kill_all(self) -> None:
        """Immediate: SIGKILL each running attempt's process group; each is then recorded interrupted."""
        with self._lock:
            self._stops.kill_all(self._procs)
            running = list(self._procs.values())
        for proc in running:
            try:
                proc.signal(signal.SIGKILL)
            except HostDown as e:  # its attempt ends as lost
                log.debug("kill: %s", e)

    def close(self, timeout: float | None = 60.0) -> None:
        """Join the attempt and stop threads (each within `timeout` seconds) and end the SFTP sessions; the
        pool's connections are its owner's to close."""
        self._workers.close(timeout)
        self._files.close()

    # --- one attempt --------------------------------------------------------------------------------------
    def _address(self, host: str) -> str:
        """The address the other nodes reach `host` at (the master address), looked up when first needed:
        a host that was down at the start has one too once it is back."""
        if host in self._addresses:
            return self._addresses[host]
        address = master_address(self.pool, host)
        if address != host:  # the name itself is only a fallback: ask again next time
            self._addresses[host] = address
        return address

    def workdir(self, run: Run) -> str:
        """Where the attempt's logs and metrics are written on its first host."""
        if self.remote_root is None:
            return str(run.dir)
        return f"{self.remote_root.rstrip('/')}/{run.tag.split('.')[0]}/{run.dir.name}"

    def _attempt(self, run: Run, post: Post, follow: Callable[[], Outcome]) -> None:
        try:
            outcome = follow()
        except HostDown as e:
            self._lost(run, e.host, post)
            outcome = Outcome(State.INTERRUPTED, Reason.LOST, str(e))
            self._clean_quietly(run, [h for h in run.reservation.hosts if h != e.host])  # ranks on the others
        except Exception as e:  # our own failure to launch, or a clean-up that failed: recorded, never lost
            log.debug("attempt %s failed to launch or clean up", run.tag, exc_info=True)
            outcome = Outcome(State.FAILED, Reason.LAUNCH, f"{type(e).__name__}: {e}")
            self._clean_quietly(run)
        finally:
            with self._lock:
                self._procs.pop(run.key, None)
        settled = self._stops.settle(run.key, outcome)
        if settled is not outcome:  # ended on our request: its recorded status tells our stop, not its own end
            self._forget_status(run)
        post(Finished(run, settled, self.clock()))

    def _forget_status(self, run: Run) -> None:
        """exitstatus.forget, here and, without a shared filesystem, on the first host."""
        exitstatus.forget(run.dir)
        if self.remote_root is not None:
            try:
                self.pool.run(run.reservation.hosts[0],
                              f"rm -f -- {shlex.quote(f'{self.workdir(run)}/{exitstatus.FILENAME}')}", timeout=30)
            except HostDown as e:  # the host is down: nothing of the attempt is left to be misread there
                log.debug("forgetting the exit status of %s: %s", run.tag, e)

    def _clean_quietly(self, run: Run, hosts: Sequence[str] | None = None) -> None:
        """Best effort, for paths that are already failing: the outcome must still be posted."""
        try:
            self._clean(run, hosts)
        except Exception:
            log.warning("clean-up of %s failed", run.tag, exc_info=True)

    def _execute(self, run: Run, post: Post) -> Outcome:
        first = run.reservation.hosts[0]
        workdir = self.workdir(run)
        prepare_directory(run)
        metrics_path = f"{workdir}/metrics.json"
        config = with_autotuning(run.experiment.config(), metrics_path, self.metric.name)
        multi = len(run.reservation.hosts) > 1
        launcher = Launcher(self.launcher.executable, self._address(first) if multi else "127.0.0.1",
                            self.launcher.options)
        env = dict(self.env)
        if multi:
            env["DS_ENV_FILE"] = f"{workdir}/deepspeed_env"
        # A master port taken on the node fails the launch fast, and the launch is retried.
        master_port = random.randint(*MASTER_PORTS)
        command = deepspeed_command(
            run.experiment, run.reservation, config, hostfile=f"{workdir}/hostfile",
            master_port=master_port, metric_path=metrics_path, tag=run.tag,
            cwd=str(Path(run.experiment.script).parent), launcher=launcher, env=env,
            mig=mig_of(run.reservation, self.devices))
        status_path = f"{workdir}/{exitstatus.FILENAME}"
        setup = [write_file_command(f"{workdir}/hostfile", self.hostfile_text),
                 f"rm -f -- {shlex.quote(metrics_path)} {shlex.quote(status_path)}"]
        if multi:
            exported = {k: v for k, v in command.env.items() if k != "DS_ENV_FILE"}
            setup.append(write_file_command(env["DS_ENV_FILE"], env_file_text(exported)))
        prepared = self.pool.run(first, " && ".join(setup), timeout=60)
        if not prepared.ok:
            return Outcome(State.FAILED, Reason.LAUNCH,
                           f"cannot prepare {workdir} on {first}: {prepared.stderr.strip()[:200]}")
        launched = self.clock()  # before the spawn, so that no step of the run can come before its launch
        try:
            proc = self.pool.start(first, exitstatus.wrapped(command.argv, status_path), command.env, command.cwd,
                                   f"{workdir}/stdout.log", f"{workdir}/stderr.log", timeout=60)
        except RemoteStartError as e:
            record_attempt(run, config, command)
            return Outcome(State.FAILED, Reason.LAUNCH, f"{first}: {str(e)[:300]}")
        self._track(run, proc)
        post(Launched(run, proc.pid, None, launched))
        record_attempt(run, config, command)
        try:
            return self._follow(run, proc)
        finally:  # its processes are gone (or their host is): the port is still the attempt's own
            with contextlib.suppress(Exception):
                remove_comm_buffers(self.pool, run.reservation.hosts, launcher.master_addr, master_port)

    def _adopted(self, run: Run, pid: int | None) -> Outcome:
        proc = AdoptedRemote.found(self.pool, run.reservation.hosts[0], pid, run.tag,
                                   f"{self.workdir(run)}/{exitstatus.FILENAME}")
        if proc.pid is not None:
            self._track(run, proc)
        try:
            return self._follow(run, proc)
        finally:
            proc.close()

    def _track(self, run: Run, proc: RemoteProcess | AdoptedRemote) -> None:
        with self._lock:
            self._procs[run.key] = proc
        if self._stops.killing:
            self._stops.ask(run.key, *Stops.KILLED)

    def _follow(self, run: Run, proc: RemoteProcess | AdoptedRemote) -> Outcome:
        """Wait for the attempt (see `Stops.wait`), end whatever of it is left on every host, fetch its files,
        judge it."""
        first = run.reservation.hosts[0]
        exit_code = self._stops.wait(run, proc, end=partial(self._end, run, proc))
        if exit_code is None and proc.lost:
            raise HostDown(first, "connection lost while the experiment ran")
        self._clean(run)
        if self.remote_root is not None:
            self._files.get_dir(first, self.workdir(run), run.dir)
        down = [h for h in run.reservation.hosts[1:] if exit_code != 0 and not self.pool.is_up(h)]
        if down:
            raise HostDown(down[0], "stopped answering while the experiment ran")
        return exitstatus.judge_files(exit_code, run.dir, self.metric)

    def _end(self, run: Run, proc: RemoteProcess | AdoptedRemote) -> None:
        """SIGTERM the launcher's group, a grace period, then SIGKILL everything tagged on every node."""
        try:
            proc.signal(signal.SIGTERM)
            proc.wait(0 if self._stops.killing else self.grace)
        except (HostDown, TimeoutError):
            pass
        self._clean(run)

    def _clean(self, run: Run, hosts: Sequence[str] | None = None) -> None:
        """End every process carrying the attempt's tag on each of its hosts, until none is left."""
        end_tagged_remote(self.pool, list(run.reservation.hosts if hosts is None else hosts), run.tag)

    def _lost(self, run: Run, host: str, post: Post) -> None:
        post(HostLost(host, "stopped answering"))
        self.on_lost(host)


class AdoptedRemote:
    """The process-group leader (the exit-status wrapper) of an attempt that a dead runner started on `host`,
    followed as `RemoteProcess` follows one started here. `wait` blocks on a remote `tail --pid` started over
    the pooled connection (a long-running channel, like an experiment's own: the control reserve stays
    free), then reads the exit status the wrapper recorded: None if none was, or if the host stopped
    answering (then `lost`). `pid` is None when the leader was gone already."""

    @classmethod
    def found(cls, pool: SSHPool, host: str, pid: int | None, tag: str, status_path: str) -> AdoptedRemote:
        """The leader `pid` asked on `host` whether it still runs the attempt `tag`, and waited on if it does."""
        alive = pid is not None and pool.run(host, tags.carries_command(pid, tag), timeout=30).ok
        waiter = pool.start(host, ["tail", f"--pid={pid}", "-f", "/dev/null"], timeout=60) if alive else None
        return cls(pool, host, pid if alive else None, status_path, waiter)

    def __init__(self, pool: SSHPool, host: str, pid: int | None, status_path: str, waiter: RemoteProcess | None):
        self.pool, self.host, self.pid, self.status_path = pool, host, pid, status_path
        self.lost = False
        self._waiter = waiter
        self._lock = threading.Lock()
        self._status: int | None = None
        self._read = False

    def wait(self, timeout: float | None = None) -> int | None:
        """The recorded exit status once the leader ended; TimeoutError after `timeout` seconds."""
        if self._waiter is not None and self._waiter.wait(timeout) is None:
            self.lost = True
            return None
        with self._lock:
            if not self._read:
                text = self.pool.run(self.host, f"cat -- {shlex.quote(self.status_path)}", timeout=30).stdout
                self._status, self._read = exitstatus.parse(text), True
            return self._status

    def signal(self, sig: int | str = signal.SIGTERM) -> bool:
        return self.pid is not None and self.pool.signal_group(self.host, self.pid, sig)

    def close(self) -> None:
        if self._waiter is not None:
            self._waiter.close()


def master_address(pool: SSHPool, host: str) -> str:
    """The address other nodes reach `host` at: its HostName in the ssh config, else its name."""
    try:
        return str(pool.connection(host).host)
    except HostDown:
        return host
