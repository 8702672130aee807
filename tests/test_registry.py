"""The registry, the one place that knows every kind of cluster: which backend a sweep's record names, for the
runner, `cancel` and `resume` alike. Recorded sweeps (prepare, then the ledger's meta set as each backend's
`attach` records it); no cluster is reached."""
from __future__ import annotations

import ast
import contextlib
from collections.abc import Mapping
from pathlib import Path

import autotuner
from autotuner.backends import registry
from autotuner.backends.base import BackendOption, Given, HostsCheck
from autotuner.backends.cluster import Cluster
from autotuner.backends.hosts.hosts import HostsBackend
from autotuner.backends.ray.backend import RayBackend
from autotuner.backends.registry import backend_for
from autotuner.backends.slurm.backend import SlurmBackend
from autotuner.backends.slurm.held import own_data
from autotuner.ledger.store import Ledger, SweepMeta

from recorded import grid_sweep, two_nodes

SLURM = {"job": "41", "owned": True, "nodes": ["n1", "n2"]}
RAY = {"address": "127.0.0.1:6379", "nodes": {}}


def recorded(tmp_path, kind: str | None = None, data: Mapping[str, object] | None = None) -> Ledger:
    """A sweep on two SSH hosts (node-a, node-b), its backend's record set as that kind's `attach` writes it."""
    autotuner.prepare(grid_sweep(mbs=(4,)), two_nodes(), tmp_path / "r", launcher=["sh", "-c", "true"])
    ledger = Ledger.open(tmp_path / "r")
    if kind is not None:
        ledger.set_meta("backend", {"kind": kind, "data": dict(data or {})})
    return ledger


def test_each_record_names_its_backend_for_the_runner_cancel_and_resume(tmp_path):
    cases = [((), HostsBackend, None), (("slurm", SLURM), SlurmBackend, SLURM), (("ray", RAY), RayBackend, None)]
    for n, (record, kind, allocation) in enumerate(cases):
        with contextlib.closing(recorded(tmp_path / str(n), *record)) as ledger, \
                contextlib.closing(backend_for(tmp_path / str(n) / "r", ledger)) as backend:
            assert type(backend) is kind
        plan = autotuner.resume_plan(tmp_path / str(n) / "r")
        assert plan.recorded == ({"kind": record[0], "data": record[1]} if record else None)
        assert own_data(plan.recorded) == allocation  # the allocation resume re-enters


class Pretend:
    """A kind of cluster added to the registry by its one line: it names itself by its own option."""

    kind = "pretend"
    options = (BackendOption("pretend", "str | None", "a pretend cluster", "flag, record"),)

    def __init__(self, given: Given) -> None:
        self.given = dict(given)

    @classmethod
    def named(cls, given: Given, record: SweepMeta | None) -> bool:
        return "pretend" in given

    @classmethod
    def opened(cls, directory, ledger, given, *, grace, log):
        return cls(given)

    @classmethod
    def cluster(cls, given: Given) -> Cluster:
        return Cluster({"pretend-node": (0, 1)}, {"pretend-node": 2})

    @classmethod
    def hosts(cls, given: Given) -> HostsCheck:
        return HostsCheck("pretend", ("host",), (("pretend-node",),), (True,), "host", [], True)


def test_a_kind_added_to_the_list_is_asked_with_no_other_edit(monkeypatch, tmp_path):
    # Each entry point asks the list: a new kind's options reach it whichever caller passes them (the options
    # every kind is given, the runner's and the API's keywords, route by name; none is a union of signatures).
    monkeypatch.setattr(registry, "BACKENDS", (Pretend, *registry.BACKENDS))
    assert registry.kind_of({"pretend": "x"}) is Pretend
    assert registry.kind_of({}) is HostsBackend  # not given: not named
    given = {"pretend": "x", "hostfile": "h"}
    assert registry.kind_of(given).cluster(given).slots == {"pretend-node": (0, 1)}
    assert registry.kind_of(given).hosts(given).title == "pretend"


def test_the_registry_branches_on_no_kind():
    # The registry asks the list in order; a kind named in an `if` of its own would be the if-chain again.
    tree = ast.parse(Path(registry.__file__).read_text())
    functions = [f for f in tree.body if isinstance(f, ast.FunctionDef)]
    branches = [ast.unparse(n.test) for f in functions for n in ast.walk(f) if isinstance(n, ast.If | ast.IfExp)]
    assert branches == [], branches


def test_every_kind_declares_its_options_and_how_it_is_picked():
    assert [k.kind for k in registry.BACKENDS] == ["ray", "slurm", "hosts"]
    names = [o.name for k in registry.BACKENDS for o in k.options]
    assert len(names) == len(set(names)), names  # an option is one kind's: routed, never shared
    for kind in registry.BACKENDS:
        for option in kind.options:
            assert option.help and option.type
            assert set(option.picks.split(", ")) <= {"flag", "record", "environment", "any"}, option
