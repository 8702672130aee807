"""Makes the ledgers of one schema version under this folder (`vN/`, N the version of the autotuner on the
path), one results directory per kind of cluster, as that version writes them: run once with that version first
on the path and never again, so that the tests read sweeps written by older versions, as users' directories are
(v6: main at fd5cc13; v7: main at 7031d34, the last before the backend's record and the attempt's handle became
opaque):

    PYTHONPATH=/path/to/that/checkout python tests/data/ledgers/make.py

Each is a sweep of three experiments on two CPU slots of this machine (launcher `sh -c true`), its records set
as that kind's runner records them (the backend's meta, each attempt's Slurm step): the first succeeded, the
second failed, the third left as the kind allows (local and SSH: running, as a runner killed with -9 leaves it,
its pid one no process has; Slurm and Ray: queued, so nothing of a cluster is asked to end it)."""
from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import autotuner
from autotuner.ledger.schema import SCHEMA_VERSION
from autotuner.ledger.store import Ledger
from autotuner.states import State

WHERE = Path("/tmp/autotune-ledger-fixtures")  # where they are made: the paths inside them name it
HERE = Path(__file__).resolve().parent / f"v{SCHEMA_VERSION}"
T0 = 1_700_000_000.0
SPEC = """{
  name: fx
  script: train.py
  ds_config: {"train_micro_batch_size_per_gpu": 4}
  space: {train_micro_batch_size_per_gpu: [1, 2, 4]}
}
"""
RECORDS = {
    "local": {},
    "ssh": {"ssh": {"config": None, "accept_new_hosts": True, "remote_root": None}},
    "slurm": {"slurm": {"job": "41", "owned": False, "nodes": ["localhost"]}},
    "ray": {"ray": {"address": "127.0.0.1:6379", "nodes": {"localhost": ["0" * 56, "127.0.0.1"]}}},
}
STEPS = {"slurm": "41.0"}


def make(kind: str) -> Path:
    directory = WHERE / kind
    sweep = autotuner.load_sweep([WHERE / "sweep.hjson"])
    autotuner.prepare(sweep, autotuner.load_cluster(slots=2), directory, launcher=["sh", "-c", "true"])
    ledger = Ledger.open(directory)
    try:
        for key, value in RECORDS[kind].items():
            ledger.set_meta(key, value)
        first, second, third = (e.name for e in sweep.experiments)
        for n, name in enumerate((first, second)):
            ledger.start(name, 1, slots={"localhost": [n]}, tag=f"fixture.{kind}.{name}",
                         dir=str(directory / name), at=T0 + n)
            ledger.launched(name, 1, pid=4_000_000 + n, port=29500 + n, at=T0 + n + 0.5, step=STEPS.get(kind))
        ledger.finish(first, 1, State.SUCCEEDED, T0 + 10, exit_code=0, metric=123.0,
                      metrics={"throughput": 123.0, "latency": 8.1})
        ledger.finish(second, 1, State.FAILED, T0 + 11, reason="exit", exit_code=1, detail="exit status 1")
        if kind in ("local", "ssh"):
            ledger.start(third, 1, slots={"localhost": [0]}, tag=f"fixture.{kind}.{third}",
                         dir=str(directory / third), at=T0 + 12)
            ledger.launched(third, 1, pid=4_000_002, port=29502, at=T0 + 12.5)
    finally:
        ledger.close()
    db = sqlite3.connect(directory / "ledger.sqlite")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    for left in ("ledger.sqlite-wal", "ledger.sqlite-shm"):  # one file: nothing beside it
        (directory / left).unlink(missing_ok=True)
    return directory


def main() -> None:
    shutil.rmtree(WHERE, ignore_errors=True)
    WHERE.mkdir(parents=True)
    (WHERE / "sweep.hjson").write_text(SPEC)
    (WHERE / "train.py").write_text("")
    HERE.mkdir(exist_ok=True)
    for kind in RECORDS:
        made = make(kind)
        shutil.rmtree(HERE / kind, ignore_errors=True)
        shutil.copytree(made, HERE / kind)
    shutil.copy(WHERE / "sweep.hjson", HERE / "sweep.hjson")


if __name__ == "__main__":
    main()
