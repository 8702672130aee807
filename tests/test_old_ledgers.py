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
from autotuner.backends.registry import backend_for, recorded_allocation
from autotuner.ledger.store import Ledger

LEDGERS = Path(__file__).resolve().parent / "data" / "ledgers"
VERSIONS = ["v6", "v7"]
KINDS = ["local", "ssh", "slurm", "ray"]
SWEEPS = [(version, kind) for version in VERSIONS for kind in KINDS]
BACKEND = {"local": "hosts", "ssh": "hosts", "slurm": "slurm", "ray": "ray"}


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
    with contextlib.closing(Ledger.open(directory)) as ledger:
        with contextlib.closing(backend_for(directory, ledger)) as backend:
            assert type(backend).kind == BACKEND[kind]  # type: ignore[attr-defined]
        meta = ledger.meta()
        allocation = recorded_allocation(meta)  # what `resume` re-enters before any cluster is asked
        assert allocation == ({"job": "41", "owned": False, "nodes": ["localhost"]} if kind == "slurm" else None)
        steps = [a.step for a in ledger.attempts()]
    assert steps[:2] == (["41.0", "41.0"] if kind == "slurm" else [None, None])


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
