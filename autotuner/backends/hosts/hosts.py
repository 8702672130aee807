"""The hosts backend: this machine and the SSH hosts of a hostfile, each run routed by where it runs (a run on
this machine alone runs here, any other over SSH from its first host). See base.py for the contract."""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ...core import Executor, Placement, Queued, Reservation, SlotPool
from ...core.events import Post
from ...core.slots import Demand, Devices, Only, Slots, devices_from_json
from ...errors import UserError
from ...gpu.nvml import FreeMemoryReader
from ...jsonvalues import JSON
from ...ledger.store import Attempt, Ledger, SweepMeta
from ...spec import Sweep
from ...spec.hostfile import HOSTFILE, is_local
from ...spec.metrics import metric_named
from ..base import Admit, Given, HostsCheck, MemoryReading, admit_all, recorded, write_record
from ..cluster import Cluster, local_or_hostfile_cluster, spec_hostfile, with_hosts_mig
from ..flags import Declared, routed
from ..launch import Launcher
from ..local.cleanup import end_tagged
from ..local.executor import LocalExecutor
from ..local.gpus import free_memory_here, peaks_watched
from ..local.peaks import PeakMemory
from ..recovery import as_it_ran
from ..ssh import SshExecutor, SSHPool, end_tagged_remote, host_watcher, unanswering
from ..ssh.free_memory import RemoteMemory, nvidia_smi
from ..ssh.probe import check_hostfile, hostfile_check, mig_hosts
from ..watch import PollingWatcher
from .options import DECLARED, HostsGiven
from .routing import Router

KIND = "hosts"  # the kind's name, as its record in the ledger says it


@dataclass
class Ssh:
    """How other hosts are reached (kept in the ledger, so `resume` reaches them the same way)."""

    config: str | None = None  # ssh config file used instead of ~/.ssh/config
    accept_new_hosts: bool = False
    remote_root: str | None = None  # where logs go on hosts that do not share our filesystem

    def to_json(self) -> dict[str, str | bool | None]:
        return {"config": self.config, "accept_new_hosts": self.accept_new_hosts, "remote_root": self.remote_root}


def hosts_cluster(hostfile: str | Path | None = None, *, include: str = "", exclude: str = "",
                  slots: int | None = None, sweep: Sweep | None = None, log: Callable[[str], None] | None = None,
                  probe: Ssh | None = None) -> Cluster:
    """The hosts backend's cluster: a hostfile's hosts, this machine's GPUs, or CPU slots (`autotuner.load_cluster`
    says how each is chosen)."""
    path = Path(hostfile) if hostfile is not None else None
    if sweep is not None:
        path, note = spec_hostfile(sweep, path, slots)
        if note and log is not None:
            log(note)
    cluster = local_or_hostfile_cluster(path, include, exclude, slots)
    if probe is None or path is None:
        return cluster
    return probed_cluster(cluster, path, probe, log or (lambda line: None))


def probed_cluster(cluster: Cluster, hostfile: Path, ssh: Ssh | None, log: Callable[[str], None]) -> Cluster:
    """A hostfile's cluster with its other hosts probed over SSH (`ssh`: how; None: not probed): one whose GPUs
    are in MIG mode has its MIG instances as slots (cluster.with_hosts_mig)."""
    remote = [h for h in cluster.slots if not is_local(h)]
    if ssh is None or not remote or cluster.accelerator == "cpu":
        return cluster
    return with_hosts_mig(cluster, mig_hosts(remote, ssh.config, ssh.accept_new_hosts), hostfile, log)


def ssh_given(options: HostsGiven, resolved: bool = True) -> Ssh | None:
    """How SSH hosts are reached, as given: whole (`ssh`), else from the flags (the config file's path absolute
    with `resolved`: a resumed sweep reads it again from anywhere); None: none given, as the sweep recorded."""
    if options.ssh is not None:
        return options.ssh
    if options.ssh_config is None and not options.accept_new_hosts and options.remote_dir is None:
        return None
    config = options.ssh_config.resolve() if resolved and options.ssh_config is not None else options.ssh_config
    return Ssh(str(config) if config is not None else None, options.accept_new_hosts, options.remote_dir)


def check_ssh_config(path: Path | None) -> None:
    """An ssh config file named on the command line must be there before anything is created or launched."""
    if path is None:
        return
    if not path.is_file():
        raise UserError("--ssh-config: no such file" if not path.exists() else "--ssh-config: not a file", path)
    if not os.access(path, os.R_OK):
        raise UserError("--ssh-config: cannot read this file", path)


def recorded_ssh(meta: SweepMeta) -> Ssh:
    """How the sweep's last runner reached its hosts, as it recorded (the defaults before one did)."""
    return Ssh(**dict(recorded(meta, KIND) or {}))


def ssh_pool(ledger: Ledger, ssh: Ssh | None) -> SSHPool | None:
    """A pool of SSH connections when the sweep has hosts other than this machine, else None (`ssh`: None, as the
    sweep last ran). Nothing is written: `HostsBackend.attach` records the settings."""
    meta = ledger.meta()
    if all(is_local(h) for h in meta.slots):
        return None
    ssh = ssh or recorded_ssh(meta)
    return SSHPool(ssh.config, accept_new_hosts=ssh.accept_new_hosts)


class HostsBackend:
    """This machine and SSH hosts (see the module docstring and base.Backend)."""

    kind: ClassVar[str] = KIND
    declared: ClassVar[Declared] = DECLARED

    @classmethod
    def named(cls, given: Given, record: SweepMeta | None) -> bool:
        """The cluster of every sweep no other kind claims: asked last."""
        return True

    @classmethod
    def check(cls, given: Given, command: str) -> None:
        check_ssh_config(routed(HostsGiven, given).ssh_config)

    @classmethod
    def held(cls, given: Given, recorded: Mapping[str, JSON] | None, log: Callable[[str], None],
             not_given_back: Callable[[str], None] | None) -> AbstractContextManager[Given]:
        return contextlib.nullcontext(given)  # nothing asked for: the hosts are there

    @classmethod
    def opened(cls, directory: Path, ledger: Ledger, given: Given, *, grace: float,
               log: Callable[[str], None]) -> HostsBackend:
        return cls(directory, ledger, ssh=ssh_given(routed(HostsGiven, given)), grace=grace, log=log)

    @classmethod
    def cluster(cls, given: Given, *, sweep: Sweep | None = None, log: Callable[[str], None] | None = None) -> Cluster:
        options = routed(HostsGiven, given)
        probe = (ssh_given(options) or Ssh()) if options.probe is True else options.probe or None
        return hosts_cluster(options.hostfile, include=options.include, exclude=options.exclude,
                             slots=options.slots, sweep=sweep, log=log, probe=probe)

    @classmethod
    def planned(cls, given: Given, sweep: Sweep, log: Callable[[str], None]) -> Cluster:
        options = routed(HostsGiven, given)
        return hosts_cluster(options.hostfile, include=options.include, exclude=options.exclude,
                             slots=options.slots, sweep=sweep, log=log)

    @classmethod
    def hosts(cls, given: Given) -> HostsCheck:
        options = routed(HostsGiven, given)
        hostfile = options.hostfile or "hostfile"
        ssh = ssh_given(options, resolved=False) or Ssh()
        listed, reports = check_hostfile(hostfile, ssh.config, ssh.accept_new_hosts)
        return hostfile_check(f"hosts of {hostfile}", listed, reports)

    def __init__(self, directory: Path, ledger: Ledger, *, ssh: Ssh | None = None, grace: float = 10.0,
                 log: Callable[[str], None] = lambda line: None):
        self.directory, self.ledger, self.ssh, self.grace, self.log = directory, ledger, ssh, grace, log
        self.pool: SSHPool | None = None  # opened by `reach`, `attach` or `end` when the sweep has other hosts
        self._silent: dict[str, str] | None = None  # the hosts that did not answer `reach` (host -> why)
        self._attached: HostsAttached | None = None

    def reach(self, *, to_run: bool = True) -> None:
        """Before the lock, with hosts other than this machine: the sweep's hostfile there (their launcher reads
        it) and the hosts probed over SSH, none answering a UserError (those that do not are left out at
        `ready`). Nothing to reach for `end`: a host that does not answer is left alone there."""
        if not to_run or self._silent is not None:
            return
        if self.pool is None:
            self.pool = ssh_pool(self.ledger, self.ssh)
        if self.pool is None:
            return
        hostfile = self.directory / HOSTFILE
        if not hostfile.is_file():
            raise UserError(("not a file" if hostfile.exists() else "missing") + ": it lists the sweep's hosts for "
                            "DeepSpeed's launcher (`autotune run` wrote it); put it back, or start the sweep again",
                            hostfile)
        hosts = list(self.ledger.meta().slots)
        self._silent = unanswering(self.pool, [h for h in hosts if not is_local(h)])
        if len(self._silent) == len(hosts):
            raise UserError("no host of the sweep answers (" + "; ".join(list(self._silent.values())[:3]) +
                            "; see `autotune hosts`)", hostfile)

    def admit(self, slots: SlotPool, waiting: Sequence[Queued]) -> Admit:
        """Before the lock: what of `waiting` can run, once this machine's own names (localhost, 127.0.0.1) are
        probed over SSH.

        DeepSpeed's multi-node launcher reaches every node over ssh (pdsh), this machine too: with no sshd
        answering here, every multi-node launch on it fails and is retried. Such names stay usable for
        single-node experiments (run directly) but are kept out of multi-node placements; a multi-node
        experiment that then cannot fit stays queued for `resume`. Nothing at all can run: a UserError, before
        the lock (the sweep left as it was).
        """
        local = [h for h in slots.hosts if is_local(h)]
        if not local or not any(item.num_nodes > 1 for item in waiting):
            return admit_all
        probing = self.pool or self.pool_as_recorded()
        try:
            silent = unanswering(probing, local)
        finally:
            if probing is not self.pool:
                probing.close()
        if not silent:
            return admit_all
        answering = [h for h in slots.hosts if h not in silent]

        def can_run(item: Queued) -> bool:
            return item.num_nodes == 1 or sum(
                1 for h in answering if slots.capacity(h) >= item.num_gpus) >= item.num_nodes

        why = "; ".join(list(silent.values())[:3]) + " (a multi-node launch reaches every node over ssh, this " \
            "machine's names too)"
        if not any(can_run(item) for item in waiting):
            raise UserError(f"no experiment can run: {why}; see `autotune hosts`", self.directory / HOSTFILE)

        def admitted(placement: Placement, queue: list[Queued]) -> tuple[Placement, list[Queued]]:
            runnable = [item for item in queue if can_run(item)]
            if len(runnable) < len(queue):
                self.log(f"{why}: {len(queue) - len(runnable)} multi-node experiment(s) left queued; "
                         f"`autotune resume {self.directory}` runs them once it answers")
            return SingleNodeOn(frozenset(silent), placement), runnable
        return admitted

    def attach(self) -> HostsAttached:
        """Holding the lock: the SSH pool opened when the sweep has other hosts (unless `reach` opened it), and the
        settings this run reaches them with recorded, so that `resume` and `cancel` reach them the same way."""
        if self.pool is None:
            self.pool = ssh_pool(self.ledger, self.ssh)
        if self.pool is not None:
            meta = self.ledger.meta()
            settings = (self.ssh or recorded_ssh(meta)).to_json()
            if recorded(meta, KIND) != settings:
                write_record(self.ledger, KIND, settings)
        self._attached = HostsAttached(self, self.pool, self._silent)
        return self._attached

    def end(self, attempt: Attempt) -> None:
        if not attempt.tag:
            return
        end_tagged(attempt.tag, self.grace)
        remote = [host for host in attempt.slots if not is_local(host)]
        if remote:
            if self.pool is None:  # recovery with no runner: reached as the sweep recorded
                self.pool = self.pool_as_recorded()
            end_tagged_remote(self.pool, remote, attempt.tag)

    def pool_as_recorded(self) -> SSHPool:
        """A pool reaching the hosts as given, else as the sweep recorded; nothing written (`attach` records)."""
        ssh = self.ssh or recorded_ssh(self.ledger.meta())
        return SSHPool(ssh.config, accept_new_hosts=ssh.accept_new_hosts)

    def recorded_code(self, attempt: Attempt, status: int, directory: Path) -> int:
        return as_it_ran(attempt, status, directory)

    def give_back(self) -> str | None:
        """Nothing: the hosts of a hostfile were not asked for."""
        return None

    def close(self) -> None:
        """What the attached sweep opened, then the pool: each closed even when one before it fails, once (a
        second call does nothing)."""
        (pool, self.pool), (attached, self._attached) = (self.pool, None), (self._attached, None)
        with contextlib.ExitStack() as stack:
            if pool is not None:
                stack.callback(pool.close)
            if attached is not None:
                stack.callback(attached.close)


class HostsAttached:
    """A sweep on this machine and SSH hosts, attached (`HostsBackend.attach`): the members that run it
    (base.Attached), on the pool its backend opened (None: this machine alone). What they open, it owns; its
    backend's `close` closes it before the pool."""

    def __init__(self, backend: HostsBackend, pool: SSHPool | None, silent: dict[str, str] | None):
        self.backend, self.pool, self._silent = backend, pool, silent
        self.directory, self.ledger = backend.directory, backend.ledger
        self.grace, self.log = backend.grace, backend.log
        self._local_memory: FreeMemoryReader | None = None
        self._remote_memory: RemoteMemory | None = None
        self._executor: Executor | None = None
        self._peaks: PeakMemory | None = None
        self._watcher: PollingWatcher | None = None
        self._remote: SshExecutor | None = None

    def read_memory(self, placement: str, devices: Devices) -> MemoryReading:
        """With the memory placement: this machine's GPUs read through NVML when placing, the other hosts'
        kept fresh over SSH by a RemoteMemory (MIG instances are read on this machine only)."""
        meta = self.ledger.meta()
        local = free_memory_here(meta, devices, placement)
        remote_hosts = {h: ids for h, ids in meta.slots.items() if not is_local(h) and not devices.get(h)}
        remote = None
        if placement == "memory" and self.pool is not None and remote_hosts:
            remote = RemoteMemory(nvidia_smi(self.pool), remote_hosts, meta.gpu_memory)
        self._local_memory, self._remote_memory = local, remote
        if local is None and remote is None:
            return MemoryReading()

        def measure(host: str) -> dict[int, int] | None:
            if is_local(host):
                return local.read() if local is not None else None
            return remote.free(host) if remote is not None else None
        return MemoryReading(measure, (remote.note,) if remote is not None else ())  # which GPUs the runs hold

    def executor(self, post: Post) -> Executor:
        meta = self.ledger.meta()
        devices = devices_from_json(meta.devices)
        hostfile = self.directory / HOSTFILE
        metric, launcher, env = metric_named(meta.metric), Launcher(meta.launcher), dict(meta.env)
        cpu_slots = {h: list(ids) for h, ids in meta.slots.items() if is_local(h)} if meta.accelerator == "cpu" else {}
        executor: Executor = LocalExecutor(str(hostfile.resolve()), metric, time.time, launcher, env, self.grace,
                                           devices, cpu_slots)
        remote = None
        if self.pool is not None:
            self._watcher = host_watcher(self.pool, post)
            ssh = recorded_ssh(meta)
            remote = SshExecutor(self.pool, hostfile.read_text(), metric, time.time, launcher, env, self.grace,
                                 ssh.remote_root, on_lost=self._watcher.watch, devices=devices)
            executor = Router(executor, remote)
        self._executor, self._peaks = peaks_watched(executor, meta, devices)
        self._remote = remote
        return self._executor

    def clear_strays(self, followed: Sequence[Attempt]) -> None:
        """Nothing to do: a process is found by its attempt's tag, and every attempt left is adopted or ended."""

    def ready(self, slots: SlotPool, post: Post) -> None:
        """Hosts that do not answer are left out until they do (watched); none answering is a UserError. Then
        the first reading of every host's GPUs, and the readings kept fresh."""
        hosts = list(slots.hosts)
        if self.pool is not None and self._watcher is not None:
            silent = self._silent if self._silent is not None else unanswering(
                self.pool, [h for h in hosts if not is_local(h)])
            for host, trouble in silent.items():
                self.log(f"{trouble}: left out until it answers")
                slots.mark_down(host)
                self._watcher.watch(host)
            if all(slots.is_down(h) for h in hosts):
                raise UserError("no host of the sweep answers (see `autotune hosts`)", self.directory / HOSTFILE)
        if self._remote_memory is not None:  # the first placement sees every host's GPUs as they are now
            for host in hosts:
                if slots.is_down(host):
                    self._remote_memory.note("host_down", host)
            self._remote_memory.read_now()
            self._remote_memory.start(post)

    def close(self) -> None:
        """The readers, the executor (every run has posted its end: its threads are ending), the peaks, the
        watcher, the SSH executor: each closed even when one before it fails."""
        closing = [self._local_memory, self._remote_memory, self._executor, self._peaks, self._watcher, self._remote]
        with contextlib.ExitStack() as stack:
            for resource in reversed([r for r in closing if r is not None]):
                stack.callback(resource.close)


@dataclass(frozen=True)
class SingleNodeOn:
    """A placement that puts only single-node experiments on `hosts` (see HostsBackend.admit)."""

    hosts: frozenset[str]
    placement: Placement

    def place(self, pool: Slots, demand: Demand) -> Reservation | None:
        return self.placement.place(self._seen(pool, demand), demand)

    def could_fit(self, pool: Slots, demand: Demand) -> bool:
        return self.placement.could_fit(self._seen(pool, demand), demand)

    def _seen(self, pool: Slots, demand: Demand) -> Slots:
        """The pool without `hosts`, for a multi-node experiment."""
        return Only(pool, frozenset(pool.hosts) - self.hosts) if demand.num_nodes > 1 else pool
