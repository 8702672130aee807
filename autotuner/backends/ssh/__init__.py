"""Everything the runner does over SSH, and the names other modules use of it.

    pool.py      one pooled connection per host: the channel gate, short commands (`run`), starting remote
                 processes (`start`)
    hostkeys.py  host keys checked as OpenSSH does, ProxyJump hops included
    errors.py    HostDown (a host that cannot be used, whatever the cause) and friends
    process.py   RemoteProcess (a started command, followed through its channel) and reading a channel
    fanout.py    the one fan-out to many hosts: threads over the pool, or one pdsh process
    sftp.py      RemoteFiles: does a host share our filesystem; copying its files here
    cleanup.py   ending an attempt's tagged processes on other hosts
    probe.py     does each host answer (before a launch); what each host offers (`autotune hosts`)
    executor.py  SshExecutor: attempts whose first host is another machine
    watch.py     host_watcher: announces a lost host that answers again (a backends.watch.PollingWatcher)
    free_memory.py RemoteMemory: the hosts' GPU free memory, read off the dispatcher for the memory placement

Imports point inward: executor, watch and free_memory use the rest; pool imports only errors, hostkeys and process.
fabric and paramiko are imported on first use (a connection), never with these modules: the CLI starts fast.
"""
from .cleanup import end_tagged_remote, signal_tagged
from .errors import CommandTimeout, HostDown, HostKeyError, RemoteStartError
from .executor import SshExecutor
from .fanout import each, run_many
from .pool import CommandResult, SSHPool
from .probe import HostReport, check_hostfile, probe_hosts, unanswering
from .process import RemoteProcess, signal_name
from .sftp import RemoteFiles
from .watch import host_watcher

__all__ = [
    "CommandResult", "CommandTimeout", "HostDown", "HostKeyError", "HostReport", "RemoteFiles", "RemoteProcess",
    "RemoteStartError", "SSHPool", "SshExecutor", "check_hostfile", "each", "end_tagged_remote",
    "host_watcher", "probe_hosts", "run_many", "signal_name", "signal_tagged", "unanswering",
]
