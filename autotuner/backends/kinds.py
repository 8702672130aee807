"""Every kind of cluster, as its backend declares itself (flags, how it is picked, where its class is), asked
in this order: the first named wins (a Ray record first; the hosts backend, named by anything, last). Adding a
backend is one line here. Standard library only: the command line reads it without importing a backend."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from .flags import Declared, Flag
from .hosts.options import DECLARED as HOSTS
from .ray.options import DECLARED as RAY
from .slurm.options import DECLARED as SLURM

KINDS: tuple[Declared, ...] = (RAY, SLURM, HOSTS)


def flags_of(command: str, kinds: tuple[Declared, ...] | None = None) -> tuple[Flag, ...]:
    """The backends' flags `command` takes, the default kind's first."""
    return tuple(f for d in reversed(KINDS if kinds is None else kinds) for f in d.of(command))


def every_flag() -> tuple[Flag, ...]:
    """Every flag of every backend, whichever commands take it."""
    return tuple(flag for declared in KINDS for flag in declared.flags)


def inputs(command: str, given: Mapping[str, object]) -> list[Path]:
    """The files the backends' flags given to `command` name for it to read (what it writes must not replace
    them)."""
    return [value for flag in flags_of(command) if flag.reads and isinstance(value := given.get(flag.name), Path)]
