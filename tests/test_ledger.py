
from dataclasses import fields, replace

import pytest

from autotuner.ledger.attempt import Attempt
from autotuner.ledger.store import Ledger, TransitionError
from autotuner.states import Reason, State
from autotuner.views.analysis import swept_specs

from helpers import SWEEP_META, experiment


@pytest.fixture
def ledger(tmp_path):
    ledger = Ledger.create(tmp_path, SWEEP_META)
    ledger.add_experiments([experiment("a"), experiment("b"), experiment("c")], at=1.0)
    yield ledger
    ledger.close()


def test_new_experiments_are_queued_in_order(ledger):
    assert [(a.name, a.attempt, a.state) for a in ledger.latest()] == [
        ("a", 1, State.QUEUED), ("b", 1, State.QUEUED), ("c", 1, State.QUEUED)]
    assert [e.name for e in ledger.experiments()] == ["a", "b", "c"]
    assert ledger.meta() == SWEEP_META


def test_an_attempt_moves_queued_running_terminal_with_times_slots_and_tag(ledger, tmp_path):
    ledger.start("a", 1, slots={"h": [0, 1]}, tag="t.a.1", dir=str(tmp_path / "a"), at=2.0)
    ledger.launched("a", 1, pid=1234, port=29500, at=2.1)
    ledger.finish("a", 1, State.SUCCEEDED, at=5.0, exit_code=0, metric=12.5, metrics={"throughput": 12.5})
    a = ledger.attempts("a")[0]
    assert (a.state, a.queued_at, a.started_at, a.launched_at, a.finished_at) == (State.SUCCEEDED, 1.0, 2.0, 2.1, 5.0)
    assert (a.slots, a.tag, a.pid, a.port, a.metric, a.duration) == ({"h": [0, 1]}, "t.a.1", 1234, 29500, 12.5, 3.0)
    transitions = ledger._db.execute("SELECT state FROM transitions WHERE name = 'a' ORDER BY seq").fetchall()
    assert [t["state"] for t in transitions] == [State.QUEUED, State.RUNNING, State.SUCCEEDED]


def test_terminal_states_are_final(ledger):
    ledger.finish("b", 1, State.CANCELLED, at=2.0)
    with pytest.raises(TransitionError):
        ledger.finish("b", 1, State.FAILED, at=3.0)
    with pytest.raises(TransitionError):
        ledger.start("b", 1, slots={}, tag="t", dir="d", at=3.0)
    with pytest.raises(TransitionError):
        ledger.finish("a", 1, State.RUNNING, at=3.0)  # not a terminal state


def test_requeue_makes_a_new_attempt_only_after_a_terminal_one(ledger):
    with pytest.raises(TransitionError):
        ledger.requeue(["a"], at=2.0)  # still queued
    ledger.start("a", 1, slots={"h": [0]}, tag="t", dir="d", at=2.0)
    ledger.finish("a", 1, State.INTERRUPTED, at=3.0, reason="interrupted")
    assert ledger.requeue(["a"], at=4.0) == {"a": 2}
    assert [(a.attempt, a.state) for a in ledger.attempts("a")] == [(1, State.INTERRUPTED), (2, State.QUEUED)]
    assert ledger.latest()[0].attempt == 2


def test_readers_see_committed_state_while_the_writer_works(ledger, tmp_path):
    reader = Ledger.open(tmp_path)
    ledger.start("c", 1, slots={"h": [0]}, tag="t", dir="d", at=2.0)
    assert {a.name: a.state for a in reader.latest()}["c"] == State.RUNNING
    reader.close()


def test_create_refuses_an_existing_ledger(ledger, tmp_path):
    with pytest.raises(FileExistsError):
        Ledger.create(tmp_path, SWEEP_META)


def test_wal_mode_and_full_sync(ledger):
    assert ledger._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert ledger._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_a_request_written_while_requests_are_taken_stays_pending(ledger, tmp_path):
    """The taker marks handled only what it read: a request that lands in between is not lost."""
    other = Ledger.open(tmp_path)
    ledger.request("cancel", ["a"], 1.0)
    sneaked = []

    def between(statement):  # the taker has read the pending requests and is about to mark them
        if statement.startswith("BEGIN") and not sneaked:
            sneaked.append(True)
            other.request("cancel", ["b"], 2.0)

    ledger._db.set_trace_callback(between)
    assert ledger.take_requests() == [("cancel", ["a"])]
    ledger._db.set_trace_callback(None)
    assert sneaked and ledger.take_requests() == [("cancel", ["b"])]
    assert ledger.take_requests() == []
    other.close()


def test_the_meta_table_reads_as_typed_settings_and_keeps_its_json_and_unknown_keys(tmp_path):
    """An existing ledger's meta table (one JSON value per key, as `prepare` always wrote it, plus a key a
    newer autotuner might add) reads as a SweepMeta, and writes back the very same rows."""
    import json
    import sqlite3

    rows = {"name": "s", "metric": "loss:min", "sweep_id": "ab12", "source": "sweep.hjson", "created": 1700000000.5,
            "slots": {"node-a": [0, 1], "localhost": [2]}, "capacity": {"node-a": 2, "localhost": 4},
            "accelerator": "cpu", "env": {"DS_ACCELERATOR": "cpu"}, "launcher": ["sh", "launcher.sh"],
            "reload": {"specs": ["sweep.hjson"]},
            "backend": {"kind": "hosts",
                        "data": {"config": None, "accept_new_hosts": False, "remote_root": "/scratch"}},
            "from_the_future": [1, {"x": True}]}
    directory = tmp_path / "old"
    directory.mkdir()
    Ledger.create(directory, SWEEP_META).close()
    db = sqlite3.connect(directory / "ledger.sqlite")
    with db:
        db.execute("DELETE FROM meta")
        db.executemany("INSERT INTO meta VALUES (?, ?)", [(k, json.dumps(v)) for k, v in rows.items()])
    db.close()
    with Ledger.open(directory) as ledger:
        meta = ledger.meta()
    assert (meta.name, meta.metric, meta.sweep_id, meta.created, meta.accelerator) == (
        "s", "loss:min", "ab12", 1700000000.5, "cpu")
    assert meta.slots == {"node-a": (0, 1), "localhost": (2,)} and meta.launcher == ("sh", "launcher.sh")
    assert meta.env == {"DS_ACCELERATOR": "cpu"} and meta.backend is not None and meta.backend.kind == "hosts"
    assert meta.backend.data["remote_root"] == "/scratch"
    assert meta.extra == {"from_the_future": [1, {"x": True}]}
    assert meta.to_json() == rows

    again = tmp_path / "again"
    again.mkdir()
    Ledger.create(again, meta).close()
    db = sqlite3.connect(again / "ledger.sqlite")
    assert {k: json.loads(v) for k, v in db.execute("SELECT key, value FROM meta")} == rows
    db.close()


def test_attempts_read_back_as_the_typed_vocabulary(ledger):
    ledger.finish("a", 1, State.FAILED, at=2.0, reason=Reason.OOM, detail="CUDA out of memory")
    a = ledger.attempts("a")[0]
    assert a.state is State.FAILED and a.reason is Reason.OOM and a.terminal
    assert ledger.states()["b"] == (1, State.QUEUED) and ledger.states()["b"][1] is State.QUEUED


def test_the_swept_values_are_kept_as_experiments_are_added(tmp_path):
    """Added one or a few at a time, as a tune and a resume add them, in shapes that change: what the ledger
    keeps is what working them out from every spec says; kept leaves that do not cover every experiment (added
    by a writer that keeps none) are not used, and the next add works every value out again."""
    configs = [{"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 0}},
               {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 0}},
               {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 3, "offload_param": {
                   "device": "cpu"}}},
               {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 3}, "fp16": {"enabled": True}},
               {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}, "fp16": {"enabled": True}},
               {"train_micro_batch_size_per_gpu": 2, "zero_optimization": 3}]
    with Ledger.create(tmp_path, SWEEP_META) as ledger:
        for i, batch in enumerate([[0], [1], [2, 3], [4], [5]]):
            ledger.add_experiments([experiment(f"e{j}", ds_config=configs[j], num_gpus=1 + (j == 4))
                                    for j in batch], at=1.0)
            keys, rows = swept_specs(ledger.specs())
            assert ledger.swept_values() == (keys, [(f"e{j}", row) for j, row in enumerate(rows)]), i
        assert ledger.swept_values()[0] == ["train_micro_batch_size_per_gpu", "zero_optimization.stage", "num_gpus",
                                     "zero_optimization.offload_param.device", "fp16.enabled"]
        ledger._db.execute("UPDATE leaves SET value = json_set(value, '$.count', 2)")
        assert ledger.swept_values() is None
        ledger.add_experiments([experiment("e6", ds_config=configs[0])], at=1.0)
        keys, rows = swept_specs(ledger.specs())
        assert ledger.swept_values() == (keys, [(f"e{j}", row) for j, row in enumerate(rows)])


def test_an_attempt_read_holds_every_field_in_order_and_an_older_versions_missing_ones_as_none(ledger, tmp_path):
    """Rows are selected in Attempt's field order and made into attempts by position (rows.decode_attempts): what
    is read equals what Attempt itself would hold, whichever query; a ledger from before a column (a Slurm step,
    a peak) reads it as None."""
    ledger.start("a", 1, slots={"h": [0]}, tag="t.a.1", dir=str(tmp_path / "a"), at=2.0)
    ledger.launched("a", 1, pid=1234, port=29500, at=2.1, handle="7.0")
    ledger.finish("a", 1, State.FAILED, at=5.0, reason=Reason.OOM, exit_code=1, detail="out of memory",
                  peak_memory=3 << 30)
    expected = Attempt(name="a", attempt=1, state=State.FAILED, queued_at=1.0, reason=Reason.OOM,
                       detail="out of memory", started_at=2.0, finished_at=5.0, slots={"h": [0]}, tag="t.a.1",
                       pid=1234, launched_at=2.1, port=29500, dir=str(tmp_path / "a"), exit_code=1, metric=None,
                       metrics={}, handle="7.0", peak_memory=3 << 30)
    for read in (ledger.latest()[0], ledger.attempts("a")[0], ledger.attempts()[0], ledger.in_state(State.FAILED)[0]):
        assert read == expected and list(vars(read)) == [f.name for f in fields(Attempt)]
    ledger._db.executescript("ALTER TABLE attempts DROP COLUMN peak_memory; ALTER TABLE attempts DROP COLUMN handle; "
                             "DROP TABLE swept; DROP TABLE leaves; DROP TABLE stops; DROP TABLE measures; "
                             "PRAGMA user_version = 1;")
    with Ledger.open(tmp_path) as old:
        assert old.attempts("a")[0] == replace(expected, handle=None, peak_memory=None)


@pytest.mark.parametrize("odd, said", [
    ({"reason": "error"}, "'error' is no reason"),
    ({"metric": float("inf")}, "the metric inf is no finite number"),
    ({"metrics": {"throughput": float("nan")}}, "a metric that is no finite number"),
])
def test_the_writer_refuses_what_every_reader_would_refuse_and_writes_nothing(ledger, odd, said):
    """A reason outside the vocabulary, or a metric JSON and the readers have no number for: written, every read
    command would refuse the whole ledger as corrupt. The writer refuses it first; the attempt stays as it was."""
    ledger.start("a", 1, slots={"h": [0]}, tag="t", dir="d", at=2.0)
    with pytest.raises(ValueError, match=said):
        ledger.finish("a", 1, State.FAILED, at=3.0, **odd)
    assert ledger.attempts("a")[0].state == State.RUNNING
    ledger.finish("a", 1, State.FAILED, at=3.0, reason=Reason.OOM, metrics={"throughput": 1.0})
    assert ledger.latest()[0].reason == Reason.OOM


def test_slot_seconds_count_every_ended_attempts_slots_and_stop_at_until(ledger):
    """GPU-hours (views/status.py): each ended attempt's slots times its run time, retries included, a running
    one not yet; `until` (the best's end) cuts what ran past it and leaves out what started after it."""
    ledger.start("a", 1, slots={"h": [0, 1]}, tag="t.a.1", dir="a", at=0.0)
    ledger.finish("a", 1, State.FAILED, at=100.0, reason=Reason.LAUNCH)
    ledger.requeue(["a"], at=100.0)
    ledger.start("a", 2, slots={"h": [0], "g": [3]}, tag="t.a.2", dir="a", at=100.0)
    ledger.finish("a", 2, State.SUCCEEDED, at=110.0, metric=1.0, metrics={"throughput": 1.0})
    ledger.start("b", 1, slots={"h": [2]}, tag="t.b.1", dir="b", at=50.0)
    ledger.finish("b", 1, State.SUCCEEDED, at=250.0, metric=2.0, metrics={"throughput": 2.0})
    ledger.start("c", 1, slots={"h": [1]}, tag="t.c.1", dir="c", at=200.0)  # still running
    assert ledger.slot_seconds() == (2 * 100 + 2 * 10 + 200, 0)
    assert ledger.slot_seconds(until=105.0) == (2 * 100 + 2 * 10 + 200, 2 * 100 + 2 * 5 + 55)
