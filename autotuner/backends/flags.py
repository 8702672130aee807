"""What a backend declares of itself for the command line: its flags (name, type, help, default, which commands
take them) and how it is picked. Standard library only: the command line builds its flags from these without
importing a backend, and routes each value given to the backend that declared it (`registry`).
"""
from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

# The options a caller gave, by name, each backend reading its own (`routed` into its typed record): the command
# line's flags as the backends declare them, `cluster_for`'s and `hosts_check`'s keywords, the runner's Options.
# A name not given, or given as None (False for a switch), is absent.
Given = Mapping[str, object]

COMMANDS = frozenset({"run", "tune", "resume", "plan", "hosts"})  # the commands that reach a cluster


@dataclass(frozen=True)
class Flag:
    """One flag of one backend: `name` is the keyword its value is routed by (the options every backend is
    given), `decls` what the user types. A flag whose help or default differs between commands is declared once
    per set of commands, under one name."""

    name: str
    decls: tuple[str, ...]
    type: object  # the annotation the command line parses the value as (bool: a switch)
    help: str
    commands: frozenset[str]
    default: object = None
    metavar: str | None = None
    min: int | None = None
    reads: bool = False  # names a file the command reads (what it writes must not replace it)
    bare: re.Pattern[str] | None = None  # the value is optional: a bare flag not followed by one of these is ""

    def __post_init__(self) -> None:
        unknown = self.commands - COMMANDS
        if unknown:
            raise ValueError(f"{self.name}: no command {', '.join(sorted(unknown))}")


@dataclass(frozen=True)
class Declared:
    """A backend as the command line sees it: its kind, its flags, how it is picked (`picked`: a flag, the
    sweep's record, the environment), and where its class is (`module:Class`, imported only to run)."""

    kind: str
    flags: tuple[Flag, ...]
    picked: str
    backend: str

    def of(self, command: str) -> tuple[Flag, ...]:
        """The flags `command` takes."""
        return tuple(f for f in self.flags if command in f.commands)


def given_of(values: Given) -> dict[str, object]:
    """The options given, as every backend reads them: those left at None (or False, a switch off) are not."""
    return {name: value for name, value in values.items() if value is not None and value is not False}


def routed(make: Callable[..., T], given: Given) -> T:
    """A backend's own options (`make`: its typed record of them) from the options given to every backend: the
    values it takes, by name; the rest are other backends'. The command line parsed each as its flag declares."""
    taken = inspect.signature(make).parameters
    return make(**{name: value for name, value in given.items() if name in taken})


def bare_values(argv: list[str], flags: tuple[Flag, ...]) -> list[str]:
    """Flags whose value is optional (`Flag.bare`): a bare one not followed by a value it takes becomes
    `--flag=`, its empty value (what it means is its backend's). A file that is there is the next argument, not
    the value, whatever it looks like."""
    optional = {decl: flag.bare for flag in flags if flag.bare is not None for decl in flag.decls}
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--":
            break
        pattern = optional.get(arg)
        if pattern is not None and not (i + 1 < len(out) and pattern.fullmatch(out[i + 1])
                                            and not os.path.exists(out[i + 1])):
            out[i] = f"{arg}="
    return out
