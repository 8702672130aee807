"""The registry, the one place that knows every kind of cluster: which backend a sweep's record names, for the
runner, `cancel` and `resume` alike. Recorded sweeps (prepare, then the ledger's meta set as each backend's
`attach` records it); no cluster is reached."""
from __future__ import annotations

import contextlib

import autotuner
from autotuner.backends.hosts.hosts import HostsBackend
from autotuner.backends.ray.backend import RayBackend
from autotuner.backends.registry import backend_for, recorded_allocation
from autotuner.backends.slurm.backend import SlurmBackend
from autotuner.ledger.store import Ledger

from recorded import grid_sweep, two_nodes

SLURM = {"job": "41", "owned": True, "nodes": ["n1", "n2"]}
RAY = {"address": "10.0.0.1:6379", "nodes": {}}


def recorded(tmp_path, **meta: object) -> Ledger:
    autotuner.prepare(grid_sweep(mbs=(4,)), two_nodes(), tmp_path / "r", launcher=["sh", "-c", "true"])
    ledger = Ledger.open(tmp_path / "r")
    for key, value in meta.items():
        ledger.set_meta(key, value)
    return ledger


def test_each_record_names_its_backend_for_the_runner_cancel_and_resume(tmp_path):
    cases = [({}, HostsBackend, None), ({"slurm": SLURM}, SlurmBackend, SLURM),
             ({"slurm": SLURM, "ray": RAY}, RayBackend, None)]  # moved from Slurm to Ray: Ray's from then on
    for n, (meta, kind, allocation) in enumerate(cases):
        with contextlib.closing(recorded(tmp_path / str(n), **meta)) as ledger:
            with contextlib.closing(backend_for(tmp_path / str(n) / "r", ledger)) as backend:
                assert type(backend) is kind
            assert recorded_allocation(ledger.meta()) == allocation
        assert autotuner.resume_plan(tmp_path / str(n) / "r").slurm == allocation  # the allocation resume re-enters
