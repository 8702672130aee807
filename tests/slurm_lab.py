"""A real Slurm cluster on this machine, for tests: munged, slurmctld and three slurmd, loopback only.

Debian's Slurm is built with multiple-slurmd support, so several `slurmd`, each with its own node name and port,
are the nodes `n1`, `n2`, `n3` of one cluster (`CPUs=2`, `Gres=gpu:2` each). The GPUs are character devices made
with mknod under the lab's directory: Slurm's GRES code accepts them and sets `CUDA_VISIBLE_DEVICES` for steps,
so placement on GPUs goes through the real path. Every file (config, keys, sockets, spool, state, logs, pid
files) lives under one directory; the ports are picked free at start, so two labs on one machine do not collide.

Every Slurm command needs `lab.env` (`SLURM_CONF` points at the lab's slurm.conf; the caller's `SLURM_*`
variables are left out, so a test run inside a real allocation does not talk to it).

    lab = SlurmLab(Path("/tmp/lab"))
    lab.start()                       # returns once sinfo shows 3 idle nodes
    job = lab.allocate(2, gpus_per_node=1)
    subprocess.run(["srun", "--jobid", job, "--exact", "-N1", "-n1", "--gpus-per-node=1", "env"], env=lab.env)
    lab.release(job)
    lab.stop()

`python tests/slurm_lab.py DIR` starts one and keeps it until Ctrl-C, printing how to reach it.
Needs root (slurmd runs steps as their users, mknod) and the packages slurmctld, slurmd, slurm-client, munge.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

NODES = ("n1", "n2", "n3")
GPUS_PER_NODE = 2
CPUS_PER_NODE = 2
DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")
CLIENTS = ("munge", "salloc", "srun", "squeue", "sinfo", "scontrol", "scancel")


class Step(NamedTuple):
    """One job step as squeue lists it."""

    step_id: str  # "JOB.STEP", as Slurm prints it
    name: str
    nodes: str  # Slurm's host list, e.g. "n[1-2]"


def unavailable_reason() -> str | None:
    """Why this machine cannot run the lab, or None when it can."""
    for path in DAEMONS:
        if not os.path.exists(path):
            return f"{path} not installed (apt-get install slurmctld slurmd slurm-client munge)"
    for name in CLIENTS:
        if shutil.which(name) is None:
            return f"{name} not installed (apt-get install slurm-client munge)"
    if os.geteuid() != 0:
        return "the Slurm lab needs root"
    return None


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on this machine now (the kernel's choice, all held until all are chosen)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("0.0.0.0", 0))  # the daemons listen on every address
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def wait_for(what: str, check: Callable[[], bool], timeout: float, interval: float = 0.05) -> None:
    """Poll `check` until it is true; RuntimeError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"slurm lab: timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def _alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] != b"Z"


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _die_with_parent() -> None:
    """In the forked daemon: have the kernel SIGKILL it if the test process dies without stopping the lab."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class SlurmLab:
    """munged + slurmctld + one slurmd per node, all under `root`; see the module's docstring."""

    def __init__(self, root: Path, nodes: Sequence[str] = NODES, gpus_per_node: int = GPUS_PER_NODE,
                 cpus_per_node: int = CPUS_PER_NODE, slurmd_timeout: int = 300):
        self.root = Path(root).resolve()
        self.nodes = tuple(nodes)
        self.gpus_per_node = gpus_per_node
        self.cpus_per_node = cpus_per_node
        self.slurmd_timeout = slurmd_timeout  # seconds until the controller marks a silent node DOWN (Slurm's default)
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket.2"
        self.log_dir = self.root / "log"
        self.run_dir = self.root / "run"
        self.ctld_port = 0
        self.node_ports: dict[str, int] = {}
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SALLOC_", "SRUN_"))}
        self.env["SLURM_CONF"] = str(self.conf)
        self._procs: dict[str, subprocess.Popen] = {}
        self.start_seconds = 0.0  # how long the last start() / stop() took
        self.stop_seconds = 0.0

    # --- start / stop -----------------------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        """Write the configuration, start the daemons; returns once sinfo shows every node idle."""
        began = time.monotonic()
        try:
            self._write_files()
            self._spawn("munged", ["/usr/sbin/munged", "--foreground", "--force",
                                   f"--socket={self.munge_socket}", f"--key-file={self.root / 'munge' / 'munge.key'}",
                                   f"--pid-file={self.pid_file('munged')}", f"--log-file={self.log_dir / 'munged.log'}",
                                   f"--seed-file={self.root / 'munge' / 'munged.seed'}"])
            wait_for("munged", lambda: self._ok(["munge", "-S", str(self.munge_socket), "-n"], "munged"), timeout)
            self._spawn("slurmctld", ["/usr/sbin/slurmctld", "-D", "-c"])
            wait_for("slurmctld", lambda: self._ok(["scontrol", "ping"], "slurmctld", b"UP"), timeout)
            for node in self.nodes:
                self._spawn(f"slurmd-{node}", ["/usr/sbin/slurmd", "-D", "-N", node])
            wait_for(f"{len(self.nodes)} idle nodes", self._all_idle, timeout)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel every job, then end the daemons by the pids in their pid files: the slurmd first, then
        slurmctld, then munged (SIGTERM, SIGKILL after `timeout`); and any step daemon of this lab left over."""
        began = time.monotonic()
        if self._running("slurmctld"):
            for node in self.nodes:  # a job on a node without its slurmd would wait in COMPLETING
                if f"slurmd-{node}" not in self._procs:
                    self.run("scontrol", "update", f"nodename={node}", "state=down", "reason=stopping", check=False)
            self._cancel_all(timeout)
        self._end([f"slurmd-{node}" for node in self.nodes], timeout)
        self._end(["slurmctld"], timeout)
        self._end(["munged"], timeout)
        self._end_stepds(timeout)
        self.stop_seconds = time.monotonic() - began

    def pid_file(self, daemon: str) -> Path:
        """The pid file of `munged`, `slurmctld` or `slurmd-NODE`."""
        return self.run_dir / f"{daemon}.pid"

    def daemon_pid(self, daemon: str) -> int | None:
        """The pid in `daemon`'s pid file, or None when there is none (not started, or not written yet)."""
        try:
            return int(self.pid_file(daemon).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def stop_node(self, node: str, timeout: float = 10.0) -> None:
        """End one node's slurmd (its running steps go on); the controller marks it DOWN after SlurmdTimeout."""
        self._end([f"slurmd-{node}"], timeout)

    def down(self, node: str, reason: str = "test", timeout: float = 10.0) -> None:
        """Lose a node at once: end its slurmd and mark it DOWN (waiting for SlurmdTimeout would take minutes).
        A job holding it ends with NODE_FAIL unless it was allocated with --no-kill.

        Never under an --exclusive --no-kill job: Slurm (22.05, still in its master) takes the node out of the
        job (`excise_node_from_job` -> `make_node_idle`) without giving back its count of exclusive jobs, which
        only `make_node_comp` decrements. From then on, every exclusive job that ends on that node leaves it
        unusable to shared jobs (its bit in `share_node_bitmap` stays clear) until the node next answers an RPC
        while idle (a ping: SlurmdTimeout / 3). A shared `salloc` that needs it waits PENDING (Resources), its
        nodes IDLE+PLANNED, for up to three minutes; checked: four rounds of an exclusive batch job on the node
        then `salloc -N3`, each waiting 116 to 210 s, against 0.0 s without --exclusive."""
        self.stop_node(node, timeout)
        self.run("scontrol", "update", f"nodename={node}", "state=down", f"reason={reason}")

    def start_node(self, node: str, timeout: float = 30.0) -> None:
        """Start one node's slurmd again (after `stop_node`)."""
        self._spawn(f"slurmd-{node}", ["/usr/sbin/slurmd", "-D", "-N", node])
        wait_for(f"{node} to respond", lambda: self._responding(node), timeout)

    def _responding(self, node: str) -> bool:
        self._check_alive(f"slurmd-{node}")
        state = self.node_state(node)
        return bool(state) and "DOWN" not in state and "NOT_RESPONDING" not in state

    def __enter__(self) -> SlurmLab:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what tests need --------------------------------------------------------------------------------------

    def run(self, *args: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """A Slurm command against this lab; its output as text."""
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, check=check,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def allocate(self, nodes: int, gpus_per_node: int = 0, *extra: str, timeout: float = 30.0) -> str:
        """`salloc --no-shell`: an allocation of `nodes` nodes (and GPUs on each); returns its job id. A request
        not granted within `timeout` is withdrawn before the error (SIGINT, as Ctrl-C: salloc revokes it; its job
        cancelled too), so that it cannot start later and hold the nodes the next tests ask for."""
        args = ["salloc", "--no-shell", f"--nodes={nodes}", *extra]
        if gpus_per_node:
            args.append(f"--gpus-per-node={gpus_per_node}")
        proc = subprocess.Popen(args, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                _, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            queued = re.search(r"job allocation (\d+)", err)
            if queued:
                self.run("scancel", queued.group(1), check=False)
            raise RuntimeError(f"salloc not granted in {timeout:g} s (withdrawn): {err.strip()}; squeue:\n"
                               f"{self.run('squeue', '-a', check=False).stdout}") from None
        found = re.search(r"Granted job allocation (\d+)", err)
        if proc.returncode != 0 or not found:
            raise RuntimeError(f"salloc failed ({proc.returncode}): {err.strip()}")
        return found.group(1)

    def release(self, job: str, timeout: float = 30.0) -> None:
        """Cancel `job`; returns once squeue lists none of it."""
        self.run("scancel", job)
        wait_for(f"job {job} to end", lambda: not self.run("squeue", "-h", "-j", job, check=False).stdout.strip(),
                 timeout)

    def drain(self, node: str, reason: str = "test") -> None:
        self.run("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")

    def resume_node(self, node: str, timeout: float = 30.0) -> None:
        """Undo `drain`; returns once the node answers again (Slurm marks a resumed node NOT_RESPONDING until its
        slurmd answers a ping, about 0.1 s)."""
        self.run("scontrol", "update", f"nodename={node}", "state=resume")
        wait_for(f"{node} to resume", lambda: self._responding(node) and "DRAIN" not in self.node_state(node),
                 timeout)

    def node_state(self, node: str) -> str:
        """Slurm's state of `node`, as `scontrol show node` prints it (e.g. `IDLE`, `MIXED+DRAIN`)."""
        shown = self.run("scontrol", "show", "node", "-o", node).stdout
        found = re.search(r"\bState=(\S+)", shown)
        return found.group(1) if found else ""

    def steps(self, job: str) -> list[Step]:
        """The job's steps squeue lists now."""
        shown = self.run("squeue", "-h", "-s", "-j", job, "-o", "%i|%j|%N", check=False).stdout
        return [Step(*line.split("|", 2)) for line in shown.splitlines() if line.count("|") >= 2]

    # --- inside -----------------------------------------------------------------------------------------------

    def _write_files(self) -> None:
        for sub in ("munge", "log", "run", "state", "spool", "dev"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        key = self.root / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o400)
        for i in range(self.gpus_per_node):
            device = self.root / "dev" / f"nvidia{i}"
            if not device.exists():
                os.mknod(device, 0o666 | 0o020000, os.makedev(195, i))  # a character device, as GRES requires
        ports = free_ports(1 + len(self.nodes))
        self.ctld_port = ports[0]
        self.node_ports = dict(zip(self.nodes, ports[1:], strict=True))
        self.conf.write_text(self._slurm_conf())
        gpu_files = f"{self.root}/dev/nvidia[0-{self.gpus_per_node - 1}]"
        (self.root / "gres.conf").write_text(f"NodeName={','.join(self.nodes)} Name=gpu File={gpu_files}\n")

    def _slurm_conf(self) -> str:
        d = self.root
        host = socket.gethostname().split(".")[0]
        lines = [
            "ClusterName=lab",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.munge_socket}",
            "SlurmUser=root", "SlurmdUser=root",
            f"StateSaveLocation={d}/state", f"SlurmdSpoolDir={d}/spool/%n",
            f"SlurmctldPidFile={self.pid_file('slurmctld')}", f"SlurmdPidFile={d}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={d}/log/slurmctld.log", f"SlurmdLogFile={d}/log/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/backfill", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt", f"JobCompLoc={d}/log/jobcomp.txt",
            "JobAcctGatherType=jobacct_gather/none",
            "MinJobAge=300",
            "MailProg=/bin/true",
            f"SlurmdTimeout={self.slurmd_timeout}",
            "GresTypes=gpu",
        ]
        for node in self.nodes:
            lines.append(f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={self.node_ports[node]} "
                         f"CPUs={self.cpus_per_node} Gres=gpu:{self.gpus_per_node} State=UNKNOWN")
        lines.append(f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP "
                     "OverSubscribe=NO")
        return "\n".join(lines) + "\n"

    def _spawn(self, daemon: str, args: list[str]) -> None:
        """Start one daemon in the foreground of its own session, its output into the lab's log directory."""
        with open(self.log_dir / f"{daemon}.out", "ab") as out:
            self._procs[daemon] = subprocess.Popen(args, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                                                   stderr=subprocess.STDOUT, start_new_session=True,
                                                   preexec_fn=_die_with_parent)

    def _running(self, daemon: str) -> bool:
        proc = self._procs.get(daemon)
        return proc is not None and proc.poll() is None

    def _check_alive(self, daemon: str) -> None:
        """RuntimeError when `daemon` was started and has exited: waiting on it would only time out."""
        if not self._running(daemon) and daemon in self._procs:
            raise RuntimeError(f"slurm lab: {daemon} exited with {self._procs[daemon].returncode}:\n"
                               f"{self._log_tail(daemon)}")

    def _log_tail(self, daemon: str, lines: int = 20) -> str:
        """The last lines of what `daemon` wrote (its log file, else its captured output)."""
        for path in (self.log_dir / f"{daemon}.log", self.log_dir / f"{daemon}.out"):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").strip()
                if text:
                    return f"{path}:\n" + "\n".join(text.splitlines()[-lines:])
        return f"(nothing in {self.log_dir})"

    def _ok(self, args: list[str], daemon: str, expect: bytes = b"") -> bool:
        """True when `args` succeeds (and prints `expect`); RuntimeError when `daemon` has exited meanwhile."""
        self._check_alive(daemon)
        done = subprocess.run(args, env=self.env, capture_output=True, stdin=subprocess.DEVNULL, check=False)
        return done.returncode == 0 and expect in done.stdout

    def _all_idle(self) -> bool:
        for node in self.nodes:
            self._check_alive(f"slurmd-{node}")
        shown = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout.split()
        states = dict(zip(shown[::2], shown[1::2], strict=False))
        return all(states.get(node) == "idle" for node in self.nodes)

    def _cancel_all(self, timeout: float) -> None:
        """Cancel every job and wait (up to `timeout`) until squeue lists none: their steps end with them."""
        jobs = self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
        if jobs:
            self.run("scancel", *jobs, check=False)
        with contextlib.suppress(RuntimeError):  # stopping goes on regardless
            wait_for("every job to end", lambda: not self.run("squeue", "-h", "-o", "%i", check=False).stdout.strip(),
                     timeout)

    def _end(self, daemons: list[str], timeout: float) -> None:
        """SIGTERM the daemons (pids from their pid files, else as started), SIGKILL those left after `timeout`."""
        pids = {}
        for daemon in daemons:
            pid = self.daemon_pid(daemon)
            proc = self._procs.get(daemon)
            if proc is not None and (pid is None or pid != proc.pid):
                pid = proc.pid  # not written yet, or a stale file from an earlier start
            if pid is not None and _alive(pid):
                pids[daemon] = pid
                _kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while any(_alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
            self._reap(daemons)
            time.sleep(0.02)
        for pid in pids.values():
            if _alive(pid):
                _kill(pid, signal.SIGKILL)
        for daemon in daemons:
            proc = self._procs.pop(daemon, None)
            if proc is not None:
                proc.wait()
            with contextlib.suppress(FileNotFoundError):
                self.pid_file(daemon).unlink()

    def _reap(self, daemons: list[str]) -> None:
        for daemon in daemons:
            proc = self._procs.get(daemon)
            if proc is not None:
                proc.poll()

    def _end_stepds(self, timeout: float) -> None:
        """Kill what is left of the lab's steps: a slurmd's death does not end its steps, so a stepd (and its
        tasks) of a node stopped by `stop_node` or `down` may still run. A stepd is known by the lab's SLURM_CONF
        in its environment (it inherits the slurmd's); it is frozen first so that it starts nothing new while
        its tasks are killed with it."""
        mark = f"SLURM_CONF={self.conf}".encode()
        stepds = [pid for pid in _pids() if _cmdline(pid).startswith(b"slurmstepd") and mark in _environ(pid)]
        for pid in stepds:
            _kill(pid, signal.SIGSTOP)
        doomed = set(stepds).union(*(_descendants(pid) for pid in stepds))
        for pid in doomed:
            _kill(pid, signal.SIGKILL)
        with contextlib.suppress(RuntimeError):
            wait_for("step daemons to end", lambda: not any(_alive(pid) for pid in doomed), timeout)


def _pids() -> list[int]:
    return [int(entry.name) for entry in os.scandir("/proc") if entry.name.isdigit()]


def _descendants(root: int) -> set[int]:
    """Every live process below `root` (read from /proc), not `root` itself."""
    children: dict[int, list[int]] = {}
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        children.setdefault(int(stat[stat.rfind(b")") + 2:].split()[1]), []).append(pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def main(argv: Sequence[str]) -> int:
    """Start a lab in the directory named by `argv[1]`, print how to use it, keep it until Ctrl-C."""
    if len(argv) != 2:
        print("usage: python tests/slurm_lab.py DIRECTORY")
        return 2
    lab = SlurmLab(Path(argv[1]))
    lab.start()
    print(f"slurm lab up in {lab.start_seconds:.2f} s: export SLURM_CONF={lab.conf}   (Ctrl-C stops it)", flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        lab.stop()
        print(f"stopped in {lab.stop_seconds:.2f} s")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv))
