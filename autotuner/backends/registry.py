"""Which backend runs a sweep, and which one `autotune hosts` asks: the kinds of cluster `kinds.KINDS` lists,
asked in order, each naming itself from the options given or the sweep's record (see base.Kind). Every entry
point takes the options by name and routes them: no signature is the union of the backends' options.
`check` reaches no cluster; `planned`, `cluster_for` and `hosts_check` read one that is there (Ray's nodes,
an allocation's) and ask it for nothing; `held` alone asks for something (a Slurm allocation) and gives it back."""
from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import cast

from ..jsonvalues import JSON
from ..ledger.store import Ledger, SweepMeta
from ..spec import Sweep
from . import kinds
from .base import Backend, Given, HostsCheck, Kind
from .cluster import Cluster
from .flags import given_of


def backends() -> tuple[type[Kind], ...]:
    """The backends' classes, in `kinds.KINDS`' order (each imported on first use)."""
    return tuple(_class_of(declared.backend) for declared in kinds.KINDS)


def _class_of(path: str) -> type[Kind]:
    module, name = path.split(":")
    return cast(type[Kind], getattr(importlib.import_module(module), name))


def kind_of(given: Given, record: SweepMeta | None = None) -> type[Kind]:
    """The kind of cluster the options given, else the sweep's record, name."""
    return next(kind for kind in backends() if kind.named(given, record))


def backend_for(directory: Path, ledger: Ledger, given: Given | None = None, *, grace: float = 10.0,
                log: Callable[[str], None] = lambda line: None) -> Backend:
    """The backend the sweep's record names (an allocation given makes it a Slurm sweep from now on, a Ray
    address, "" for the default one, a Ray sweep). It reads the sweep's record (the ledger's meta) to pick the
    kind, and nothing else: the backend's constructor reads, reaches and writes nothing (`reach`, `attach`);
    recovery alone (`end`) needs no allocation. The caller closes it."""
    options = given_of(given or {})
    return kind_of(options, ledger.meta()).opened(directory, ledger, options, grace=grace, log=log)


def check(command: str, given: Given) -> None:
    """The options given to `command`, checked by every backend before anything is asked of a cluster: a
    UserError for the first that is wrong."""
    options = given_of(given)
    for kind in reversed(backends()):  # the default kind's first, as the command line lists them
        kind.check(options, command)


@contextlib.contextmanager
def held(given: Given, recorded: Mapping[str, JSON] | None = None, *, log: Callable[[str], None] = lambda line: None,
         not_given_back: Callable[[str], None] | None = None) -> Iterator[Given]:
    """What the command runs in, held by each backend for the block (a Slurm allocation: asked for, kept, given
    back however it ends; `recorded`: a resumed sweep's record of its backend): the options to run with, what
    is held added. `log` hears the notes; one that could not be given back goes to `not_given_back` when given
    (else it is raised, once the block ended well)."""
    with contextlib.ExitStack() as stack:
        options: Given = given_of(given)
        for kind in backends():
            options = stack.enter_context(kind.held(options, recorded, log, not_given_back))
        yield options


def cluster_for(given: Given | None = None, /, *, sweep: Sweep | None = None,
                log: Callable[[str], None] | None = None, **options: object) -> Cluster:
    """The nodes a new sweep runs on, from the backend the options name: the Ray cluster's live nodes (`ray`: its
    address, "" for the default one), the Slurm allocation's nodes and GPUs (`allocation`), else the hosts
    backend's (a hostfile's, this machine's, CPU slots: `hosts_cluster`; `probe`: its hosts' MIG instances). The
    options by keyword, or as one mapping (`given`, the command line's), or both."""
    routed = given_of({**(given or {}), **options})
    return kind_of(routed).cluster(routed, sweep=sweep, log=log)


def planned(given: Given, sweep: Sweep, log: Callable[[str], None]) -> Cluster:
    """What `autotune plan` plans for, from the backend the options name; nothing is asked of a cluster."""
    options = given_of(given)
    return kind_of(options).planned(options, sweep, log)


def hosts_check(hostfile: object = "hostfile", ssh: object = None, **given: object) -> HostsCheck:
    """`autotune hosts`: the hosts of the cluster the options name, as its backend finds them: the Ray cluster's
    live nodes (`ray`: its address, "" for the default one), the nodes of the Slurm allocation this runs in
    (`slurm`), else the hostfile's hosts probed over SSH (`ssh`: how they are reached). Each value is read by the
    backend that declares it, as its type there says (`flags.routed`)."""
    options = given_of({"hostfile": hostfile, "ssh": ssh, **given})
    return kind_of(options).hosts(options)
