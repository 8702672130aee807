"""The registry, the one place that knows every kind of cluster: which backend a sweep's record names, for the
runner, `cancel` and `resume` alike. Recorded sweeps (prepare, then the ledger's meta set as each backend's
`attach` records it); no cluster is reached."""
from __future__ import annotations

import ast
import contextlib
from collections.abc import Mapping
from pathlib import Path

import pytest

import autotuner
from autotuner.backends import kinds, registry
from autotuner.backends.flags import COMMANDS, routed
from autotuner.backends.hosts.hosts import HostsBackend
from autotuner.backends.hosts.options import HostsGiven
from autotuner.backends.ray.backend import RayBackend
from autotuner.backends.ray.options import RayGiven
from autotuner.backends.registry import backend_for
from autotuner.backends.slurm.backend import SlurmBackend
from autotuner.backends.slurm.held import own_data
from autotuner.backends.slurm.options import SlurmGiven
from autotuner.errors import UserError
from autotuner.ledger.store import Ledger

from pretend_kind import PRETEND, Pretend
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


def test_a_kind_added_to_the_list_is_asked_with_no_other_edit(monkeypatch):
    # Each entry point asks the list: a new kind's options reach it whichever caller passes them (the options
    # every kind is given, the runner's and the API's keywords, route by name; none is a union of signatures).
    monkeypatch.setattr(kinds, "KINDS", (PRETEND, *kinds.KINDS))
    assert registry.kind_of({"pretend": "x"}) is Pretend
    assert registry.kind_of({}) is HostsBackend  # not given: not named
    given = {"pretend": "x", "hostfile": "h"}
    assert registry.cluster_for(given).slots == {"pretend-node": (0, 1)}
    assert registry.cluster_for(pretend="x").slots == {"pretend-node": (0, 1)}
    assert registry.hosts_check(pretend="x").title == "pretend cluster x"
    with pytest.raises(UserError, match="no such pretend cluster"):
        registry.check("run", {"pretend": "bad"})
    with registry.held(given) as running:
        assert running == given


def test_the_registry_branches_on_no_kind():
    # The registry asks the list in order; a kind named in an `if` of its own would be the if-chain again.
    tree = ast.parse(Path(registry.__file__).read_text())
    functions = [f for f in tree.body if isinstance(f, ast.FunctionDef)]
    branches = [ast.unparse(n.test) for f in functions for n in ast.walk(f) if isinstance(n, ast.If | ast.IfExp)]
    assert branches == [], branches


def test_every_kind_declares_its_options_and_how_it_is_picked():
    assert [d.kind for d in kinds.KINDS] == ["ray", "slurm", "hosts"]
    assert [k.kind for k in registry.backends()] == ["ray", "slurm", "hosts"]
    assert [k.declared for k in registry.backends()] == list(kinds.KINDS)  # the class's own declaration
    owners: dict[str, str] = {}
    for declared in kinds.KINDS:
        assert declared.picked
        for flag in declared.flags:
            assert flag.help and flag.commands and flag.decls, flag
            assert owners.setdefault(flag.name, declared.kind) == declared.kind, flag  # routed, never shared
        for command in COMMANDS:
            names = [f.name for f in declared.of(command)]
            assert len(names) == len(set(names)), (declared.kind, command)  # one flag a name per command


def test_each_kind_reads_its_own_options_typed():
    # What the router hands a backend, as its own typed record: the values it declares, the others' left out.
    given = {"slurm": True, "nodes": 2, "ray": "", "hostfile": Path("h"), "ssh_config": Path("c")}
    assert routed(SlurmGiven, given) == SlurmGiven(slurm=True, nodes=2)
    assert routed(RayGiven, given) == RayGiven(ray="")
    assert routed(HostsGiven, given) == HostsGiven(hostfile=Path("h"), ssh_config=Path("c"))


@pytest.mark.parametrize("given", [{}, {"ray": "127.0.0.1:1"}, {"allocation": None}], ids=["recorded", "ray", "none"])
def test_a_backend_opened_reads_nothing_until_a_member_is_called(tmp_path, given):
    # Constructors do no I/O: every kind's backend is built over a ledger already closed (any read of it raises)
    # and a results directory that is not there, and closed, twice, with nothing reached.
    ledger = recorded(tmp_path, "ray", RAY)
    ledger.close()
    for kind in registry.backends():
        backend = kind.opened(tmp_path / "absent", ledger, given, grace=1.0, log=lambda line: None)
        backend.close()
        backend.close()
    assert not (tmp_path / "absent").exists()
