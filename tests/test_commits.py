"""Which of the runner's commits wait for the disk: every one that a launch (or any action) follows, and not
the ones that only record what was launched (the pids), which no action waits on."""
import sqlite3
from contextlib import contextmanager
from pathlib import Path

from autotuner.core import Finished, Launched, MemoryRecord, Queued, Scheduler, SlotPool
from autotuner.core.outcome import Outcome
from autotuner.ledger.store import Ledger
from autotuner.states import State

from helpers import SWEEP_META, experiment

OK = Outcome(State.SUCCEEDED, metrics={"throughput": 1.0})


class Batches(MemoryRecord):
    """A record in memory that notes, for each step's transaction, whether it was asked to be synced."""

    def __init__(self):
        super().__init__()
        self.synced: list[bool] = []

    @contextmanager
    def batch(self, synced=True):
        self.synced.append(synced)
        yield


def test_only_a_step_that_records_nothing_but_launches_is_committed_unsynced():
    record = Batches()
    s = Scheduler(record, SlotPool({"h": [0, 1]}), "sid", Path("/results"), "throughput")
    exps = [experiment("a"), experiment("b"), experiment("c")]
    record.add_experiments(exps, 0.0)
    s.submit(Queued(e, 1) for e in exps)
    first = s.step([], 0.0)  # places a and b: synced before they are started
    a, b = first.start
    s.step([Launched(a, 10, None, 0.1), Launched(b, 11, None, 0.1)], 0.2)  # pids only
    third = s.step([Finished(a, OK, 1.0), Launched(b, 11, None, 0.1)], 1.0)  # frees a slot, places c
    c = third.start[0]
    s.step([Launched(c, 12, None, 1.1)], 1.2)
    s.submit([])  # something changed (work queued): the next step may place, whatever its events
    s.step([Launched(c, 12, None, 1.1)], 1.3)
    assert record.synced == [True, False, True, False, True]
    assert [r.experiment.name for r in third.start] == ["c"]


def test_an_unsynced_batch_is_committed_for_every_reader_and_the_ledger_syncs_again_after_it(tmp_path):
    ledger = Ledger.create(tmp_path, SWEEP_META)
    try:
        ledger.add_experiments([experiment("a")], 0.0)
        ledger.start("a", 1, slots={"localhost": [0]}, tag="sid.a.1", dir=str(tmp_path / "a"), at=1.0)
        with ledger.batch(synced=False):
            ledger.launched("a", 1, pid=4242, port=29500, at=1.5)
        reader = sqlite3.connect(tmp_path / "ledger.sqlite")  # another process's view: the commit is there
        assert reader.execute("SELECT pid, launched_at FROM attempts WHERE name = 'a'").fetchone() == (4242, 1.5)
        reader.close()
        assert ledger._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL again for what follows
        with ledger.batch():
            ledger.finish("a", 1, State.SUCCEEDED, 2.0)
        assert ledger._db.execute("PRAGMA synchronous").fetchone()[0] == 2
    finally:
        ledger.close()
