"""The hosts backend's flags (a hostfile's hosts, this machine, CPU slots; how SSH hosts are reached): declared
for the command line, standard library only. Picked when no other backend is."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..flags import Declared, Flag

if TYPE_CHECKING:
    from .hosts import Ssh

_NEW = frozenset({"run", "tune", "plan"})  # the commands that choose a new sweep's nodes
_SSH = frozenset({"run", "tune", "resume"})


def _slots(command: str, help: str) -> Flag:
    return Flag("slots", ("--slots",), int | None, help, frozenset({command}), min=1)


DECLARED = Declared("hosts", (
    Flag("hostfile", ("--hostfile", "-H"), Path | None, "DeepSpeed hostfile; none = this machine.", _NEW,
         reads=True),
    Flag("hostfile", ("--hostfile", "-H"), Path, "DeepSpeed hostfile.", frozenset({"hosts"}), default=Path("hostfile"),
         reads=True),
    Flag("include", ("--include", "-i"), str, "DeepSpeed syntax, e.g. worker-0:0,1@worker-1.", _NEW, default=""),
    Flag("exclude", ("--exclude", "-e"), str, "DeepSpeed syntax, e.g. worker-1:0.", _NEW, default=""),
    _slots("run", "Run on this many CPU slots of this machine (no GPU needed)."),
    _slots("tune", "Tune on this many CPU slots of this machine (no GPU needed)."),
    _slots("plan", "Plan for this many slots of this machine."),
    Flag("ssh_config", ("--ssh-config",), Path | None, "ssh config file to use instead of ~/.ssh/config.",
         _SSH | {"hosts"}, reads=True),
    Flag("accept_new_hosts", ("--accept-new-hosts",), bool, "Trust (and record) host keys not yet in known_hosts.",
         _SSH | {"hosts"}, default=False),
    Flag("remote_dir", ("--remote-dir",), str | None,
         "Where runs write on hosts without our filesystem; copied back over SFTP.", _SSH),
), picked="by anything: the cluster of every sweep no other backend claims",
    backend="autotuner.backends.hosts.hosts:HostsBackend")


@dataclass(frozen=True)
class HostsGiven:
    """The hosts backend's options, as given (the flags above, or the API's keywords: `ssh`, `probe`)."""

    hostfile: str | Path | None = None  # none: this machine (`autotune hosts`: ./hostfile)
    include: str = ""
    exclude: str = ""
    slots: int | None = None
    ssh_config: Path | None = None
    accept_new_hosts: bool = False
    remote_dir: str | None = None
    ssh: Ssh | None = None  # how SSH hosts are reached, given whole (the API); else from the three flags above
    probe: Ssh | bool | None = None  # how the hostfile's hosts are probed for MIG instances (True: as `ssh` says)
