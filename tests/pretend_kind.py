"""A kind of cluster that exists only for the tests: declared as a backend declares itself (a flag, how it is
picked, where its class is) and added to `kinds.KINDS` by a test, to show that the registry and the command line
take a new kind with no edit of their own."""
from __future__ import annotations

import contextlib

from autotuner.backends.base import Given, HostsCheck
from autotuner.backends.cluster import Cluster
from autotuner.backends.flags import Declared, Flag, routed
from autotuner.errors import UserError
from autotuner.ledger.store import SweepMeta

PRETEND = Declared("pretend", (
    Flag("pretend", ("--pretend",), str | None, "Run on a pretend cluster named NAME.",
         frozenset({"run", "tune", "resume", "plan", "hosts"}), metavar="NAME"),
), picked="--pretend", backend="pretend_kind:Pretend")


class PretendGiven:
    """The pretend kind's own options, typed."""

    def __init__(self, pretend: str | None = None) -> None:
        self.pretend = pretend


class Pretend:
    """A kind of cluster added to the list by its one line: it names itself by its own option."""

    kind = "pretend"
    declared = PRETEND

    def __init__(self, given: Given) -> None:
        self.given = dict(given)

    @classmethod
    def named(cls, given: Given, record: SweepMeta | None) -> bool:
        return routed(PretendGiven, given).pretend is not None

    @classmethod
    def check(cls, given: Given, command: str) -> None:
        if routed(PretendGiven, given).pretend == "bad":
            raise UserError("--pretend bad: no such pretend cluster")

    @classmethod
    def held(cls, given, recorded, log, not_given_back):
        return contextlib.nullcontext(given)

    @classmethod
    def opened(cls, directory, ledger, given, *, grace, log):
        return cls(given)

    @classmethod
    def cluster(cls, given: Given, *, sweep=None, log=None) -> Cluster:
        return Cluster({"pretend-node": (0, 1)}, {"pretend-node": 2})

    @classmethod
    def planned(cls, given, sweep, log) -> Cluster:
        return cls.cluster(given)

    @classmethod
    def hosts(cls, given: Given) -> HostsCheck:
        name = routed(PretendGiven, given).pretend
        return HostsCheck(f"pretend cluster {name}", ("host",), (("pretend-node",),), (True,), "host", [], True)
