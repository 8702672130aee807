"""Sweeps written by older versions (tests/data/ledgers/vN, made by the main of schema N with make.py there, one
per kind of cluster: local, SSH, Slurm, Ray) still report, cancel and resume: the users' results directories of
today must outlive every change of the ledger's format. No cluster is reached (Slurm's and Ray's are only
recorded; their third experiment waits queued)."""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest

import autotuner
from autotuner.backends.registry import backend_for
from autotuner.backends.slurm.held import own_data
from autotuner.ledger.schema import SCHEMA_VERSION
from autotuner.ledger.store import Ledger

LEDGERS = Path(__file__).resolve().parent / "data" / "ledgers"
VERSIONS = ["v6", "v7"]
KINDS = ["local", "ssh", "slurm", "ray"]
SWEEPS = [(version, kind) for version in VERSIONS for kind in KINDS]
BACKEND = {"local": "hosts", "ssh": "hosts", "slurm": "slurm", "ray": "ray"}
# What each kind's runner recorded of its cluster (make.py's RECORDS), as the backend's record reads it.
DATA = {"local": None, "ssh": {"config": None, "accept_new_hosts": True, "remote_root": None},
        "slurm": {"job": "41", "owned": False, "nodes": ["localhost"]},
        "ray": {"address": "127.0.0.1:6379", "nodes": {"localhost": ["0" * 56, "127.0.0.1"]}}}
HANDLES = {"slurm": ["41.0", "41.0"]}  # each attempt's handle: the Slurm job step it ran as


def copied(version: str, kind: str, tmp_path: Path) -> Path:
    """The kind's sweep of that version copied (the fixture is never written)."""
    directory = tmp_path / kind
    shutil.copytree(LEDGERS / version / kind, directory)
    return directory


@pytest.mark.parametrize(("version", "kind"), SWEEPS)
def test_an_old_sweep_reports_as_it_was_written(version, kind, tmp_path):
    directory = copied(version, kind, tmp_path)
    results = autotuner.load(directory)
    states = {r.name: r.state.value for r in results}
    running = "running" if kind in ("local", "ssh") else "queued"
    assert states == {"fx_mbs1": "succeeded", "fx_mbs2": "failed", "fx_mbs4": running}, states
    assert "fx_mbs1" in autotuner.render_report(directory, "md", autotuner.Output())
    assert "1 succeeded" in autotuner.render_status(directory, "table")


@pytest.mark.parametrize(("version", "kind"), SWEEPS)
def test_an_old_sweep_names_its_backend_and_keeps_its_records(version, kind, tmp_path):
    directory = copied(version, kind, tmp_path)
    with contextlib.closing(Ledger.open(directory)) as ledger:  # read as it is, not migrated
        with contextlib.closing(backend_for(directory, ledger)) as backend:
            assert type(backend).kind == BACKEND[kind]  # type: ignore[attr-defined]
        record = ledger.meta().backend
        handles = [a.handle for a in ledger.attempts()]
    assert (record.kind, dict(record.data)) == (BACKEND[kind], DATA[kind]) if record else DATA[kind] is None
    assert handles[:2] == HANDLES.get(kind, [None, None])
    plan = autotuner.resume_plan(directory)
    assert own_data(plan.recorded) == (DATA[kind] if kind == "slurm" else None)  # what `resume` re-enters


@pytest.mark.parametrize(("version", "kind"), SWEEPS)
def test_an_old_sweep_migrated_keeps_its_record_and_handles_as_the_backend_reads_them(version, kind, tmp_path):
    directory = copied(version, kind, tmp_path)
    with contextlib.closing(Ledger.open(directory)) as ledger:
        unmigrated = (ledger.meta().backend, ledger.attempts())
        ledger.upgrade()
        assert ledger.version() == SCHEMA_VERSION
        assert (ledger.meta().backend, ledger.attempts()) == unmigrated
        assert not {"ssh", "slurm", "ray"} & set(ledger.meta().extra)  # folded into the one record


@pytest.mark.parametrize("version", VERSIONS)
def test_an_old_sweep_that_moved_from_slurm_to_ray_is_rays_read_or_migrated(version, tmp_path):
    # Before schema 8 each kind wrote its own key, and the registry asked Ray first: a sweep resumed on a Ray
    # cluster after Slurm kept both. The one record is Ray's, read as it is and once migrated.
    directory = copied(version, "ray", tmp_path)
    with contextlib.closing(Ledger.open(directory)) as ledger:
        ledger.set_meta("slurm", DATA["slurm"])
        assert ledger.meta().backend.kind == "ray"
        ledger.upgrade()
        assert ledger.meta().backend.kind == "ray" and dict(ledger.meta().backend.data) == DATA["ray"]
        with contextlib.closing(backend_for(directory, ledger)) as backend:
            assert type(backend).kind == "ray"  # type: ignore[attr-defined]


@pytest.mark.parametrize(("version", "kind"), SWEEPS)
def test_an_old_sweep_cancels_with_no_runner(version, kind, tmp_path):
    directory = copied(version, kind, tmp_path)
    cancellation = autotuner.cancel(directory)
    states = {r.name: r.state.value for r in autotuner.load(directory)}
    assert states["fx_mbs4"] == "cancelled", (states, str(cancellation))
    assert states["fx_mbs1"] == "succeeded" and states["fx_mbs2"] == "failed"


@pytest.mark.parametrize(("version", "kind"), [(v, k) for v, k in SWEEPS if k in ("local", "ssh")])
def test_an_old_sweep_killed_while_running_resumes_to_its_end(version, kind, tmp_path):
    # The runner that wrote it died with its third run out (a pid no process has): recovered, run again here.
    directory = copied(version, kind, tmp_path)
    result = autotuner.execute(directory, autotuner.Options())
    states = {r.name: r.state.value for r in autotuner.load(directory)}
    assert states["fx_mbs1"] == "succeeded" and states["fx_mbs2"] == "failed"
    # Its run, adopted, is gone (started long ago, past its timeout): it ends, never left running or queued.
    assert states["fx_mbs4"] in ("failed", "timed_out"), states
    assert result.exit_code == 1
