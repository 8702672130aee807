"""The Backend contract as every kind keeps it (backends/base.py): building one reaches and writes nothing,
members return what they open. Recorded sweeps (tests/recorded.py), no cluster reached."""
from __future__ import annotations

import contextlib

import pytest
from test_registry import recorded

from autotuner.backends.base import Attached, MemoryReading
from autotuner.backends.hosts.hosts import HostsAttached
from autotuner.backends.ray.backend import RayAttached
from autotuner.backends.registry import backend_for
from autotuner.backends.slurm.allocation import Allocation
from autotuner.backends.slurm.backend import SlurmAttached

RECORDS = {  # the backend's record as each kind's `attach` writes it (kind, data)
    "hosts": {},
    "slurm": {"kind": "slurm", "data": {"job": "41", "owned": True, "nodes": ["node-a", "node-b"]}},
    "ray": {"kind": "ray", "data": {"address": "127.0.0.1:6379", "nodes": {}}},
}


@pytest.mark.parametrize("kind", list(RECORDS))
def test_a_backend_built_has_reached_opened_and_written_nothing(kind, tmp_path):
    # The hosts backend's constructor opened an SSH pool and recorded the SSH settings in the ledger although
    # nothing was checked yet (and `cancel` built it for recovery alone): now `attach` does, holding the lock.
    with contextlib.closing(recorded(tmp_path, **RECORDS[kind])) as ledger:
        before = ledger.meta()
        with contextlib.closing(backend_for(tmp_path / "r", ledger)) as backend:
            assert type(backend).kind == kind  # type: ignore[attr-defined]
            assert ledger.meta() == before
            assert getattr(backend, "pool", None) is None


# Each kind's attached sweep as its `attach` builds it once the cluster is checked (no cluster here to check).
ATTACHED = {
    "hosts": lambda backend: HostsAttached(backend, None, None),
    "slurm": lambda backend: SlurmAttached(backend, Allocation("41", ("node-a", "node-b"), {"node-a": 1, "node-b": 1})),
    "ray": lambda backend: RayAttached(backend, {}),
}
RUN_MEMBERS = ("read_memory", "executor", "clear_strays", "ready")  # base.Attached's (`admit`: the backend's)


@pytest.mark.parametrize("kind", list(RECORDS))
def test_only_the_attached_sweep_has_the_members_that_run_it(kind, tmp_path):
    # They were the backend's own, guarded by "attach first" asserts: the runner's order was a convention.
    with contextlib.closing(recorded(tmp_path, **RECORDS[kind])) as ledger, \
            contextlib.closing(backend_for(tmp_path / "r", ledger)) as backend:
        assert [m for m in RUN_MEMBERS if hasattr(backend, m)] == []
        assert callable(backend.admit)  # judged before the lock: a refusal leaves the sweep as it was
        attached: Attached = ATTACHED[kind](backend)
        assert [m for m in RUN_MEMBERS if not callable(getattr(attached, m, None))] == []


@pytest.mark.parametrize("kind", list(RECORDS))
def test_read_memory_returns_what_it_opened(kind, tmp_path):
    # It returned nothing and set `measure` and `observers` on the backend, which the runner then read.
    with contextlib.closing(recorded(tmp_path, **RECORDS[kind])) as ledger, \
            contextlib.closing(backend_for(tmp_path / "r", ledger)) as backend:
        attached = ATTACHED[kind](backend)
        reading = attached.read_memory("pack", {})
        assert reading == MemoryReading()  # a CPU sweep packed: nothing to read
        assert not hasattr(attached, "measure") and not hasattr(attached, "observers")
        attached.close()


@pytest.mark.parametrize("kind", list(RECORDS))
def test_close_with_nothing_opened_and_again_is_harmless(kind, tmp_path):
    with contextlib.closing(recorded(tmp_path, **RECORDS[kind])) as ledger:
        backend = backend_for(tmp_path / "r", ledger)
        backend.close()
        backend.close()
