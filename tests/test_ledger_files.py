"""Ledgers that are not what the code expects, and the lock a user could break.

Each bad ledger is made with real SQLite from a real sweep's ledger (autotuner.prepare, the code `autotune run`
uses, with attempts recorded through the Ledger API): damaged pages, a truncated or empty file, a directory in
its place, a newer schema version, a column renamed, added or dropped, a table missing, JSON that does not
decode. Every command that opens a ledger answers each with one line naming the file, exit status 2, and
leaves the results directory exactly as it was. A ledger from before schema versions is read as it is and
migrated by the runner.
"""
from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

import autotuner
from autotuner.backends.cluster import local_or_hostfile_cluster
from autotuner.errors import UserError
from autotuner.ledger.lock import LOCKFILE, SweepBusy, SweepLock, holder_pid
from autotuner.ledger.store import FILENAME, SCHEMA_VERSION, Ledger
from autotuner.spec.load import load_sweep
from autotuner.states import State
from autotuner.views.analysis import swept_specs
from autotuner.views.records import from_snapshot
from autotuner.views.snapshot import load, snapshot

from cli_rig import (
    PREAMBLE,
    SLEEP_THEN_SUCCEED,
    WRITE_METRICS,
    autotune,
    env,
    finish,
    launched,
    launches,
    states,
    sweep_id,
    tagged_pids,
    wait_until,
    write_launcher,
    write_sweep,
)
from helpers import experiment

PAGE = 4096


def snapshot_of(directory: Path) -> dict:
    """Every path under `directory`, and each file's mtime and bytes: what "nothing changed" compares. (Not the
    directories' mtimes: SQLite's -wal and -shm files come and go beside a WAL ledger any reader opens.)"""
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) if p.is_file() else "directory" for p in directory.rglob("*")}


def one_line_error(result, *fragments: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def make_sweep(directory: Path, count: int, *, finished: int = 0) -> Path:
    """A real sweep's results directory (not run): `count` experiments, the first `finished` of them recorded
    succeeded with metrics (every fifth failed), the rest queued. Returns the results directory."""
    directory.mkdir(parents=True, exist_ok=True)
    spec = write_sweep(directory, range(count), name="s",
                       extra="  args: [" + ", ".join(f'"--pad{i}"' for i in range(20)) + "]")  # fuller pages
    launcher = write_launcher(directory, SLEEP_THEN_SUCCEED)
    results = directory / "out"
    autotuner.prepare(load_sweep([spec]), local_or_hostfile_cluster(None, cpu_slots=2), results,
                      launcher=launcher.split())
    with Ledger.open(results) as ledger:
        ledger._db.execute("PRAGMA synchronous=OFF")  # setting up, not what is tested: no fsync per transition
        for i in range(finished):
            name = f"s_x{i}"
            ledger.start(name, 1, slots={"localhost": [i % 2]}, tag=f"t.{name}.1", dir=str(results / name), at=1.0)
            if i % 5 == 4:
                ledger.finish(name, 1, State.FAILED, 2.0, reason="exit", detail="exit status 1", exit_code=1)
            else:
                ledger.finish(name, 1, State.SUCCEEDED, 2.0, exit_code=0, metric=float(i + 1),
                              metrics={"throughput": float(i + 1), "latency": 1.0})
    return results


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A sweep whose ledger spans many pages: 600 experiments, 400 of them finished."""
    results = make_sweep(tmp_path_factory.mktemp("pristine"), 600, finished=400)
    assert (results / FILENAME).stat().st_size > 100 * PAGE
    return results


def sql(*statements: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        db = sqlite3.connect(path, isolation_level=None)
        try:
            for statement in statements:
                db.execute(statement)
        finally:
            db.close()
    return damage


def overwrite_pages(path: Path) -> None:
    """Garbage over the pages from a quarter to nine tenths of the file: page 1 (the schema) and the meta
    table's page stay whole, so the file opens, and the damage is met only when a query reaches it."""
    data = bytearray(path.read_bytes())
    start, end = len(data) // PAGE // 4 * PAGE, len(data) * 9 // 10
    for at in range(start, end):
        data[at] = (at * 131 + 7) % 251
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def replace_with_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "keep").write_text("a file, so the directory is not empty\n")


def without_not_null(path: Path) -> None:
    """experiments rebuilt with the same columns but no NOT NULL, and a NULL where the code needs a value."""
    sql("CREATE TABLE e2 (name TEXT PRIMARY KEY, position INTEGER, digest TEXT, spec TEXT)",
        "INSERT INTO e2 SELECT * FROM experiments", "DROP TABLE experiments", "ALTER TABLE e2 RENAME TO experiments",
        "UPDATE experiments SET spec = NULL WHERE position = 0")(path)


# (damage, what the one line says besides the ledger's path)
BAD_LEDGERS = {
    "not_a_database": (lambda p: p.write_bytes(b"this is not a database, just garbage " * 300),
                       "not a sweep ledger"),
    "empty_file": (lambda p: p.write_bytes(b""), "not a sweep ledger (it has none of a ledger's tables)"),
    "directory": (replace_with_directory, "not a sweep ledger (a directory)"),
    "damaged_pages": (overwrite_pages, "corrupt sweep ledger"),
    "truncated": (truncate, "corrupt sweep ledger"),
    "newer_version": (sql("PRAGMA user_version = 9"),
                      "written by a newer autotuner (ledger schema 9; this one reads up to 8): upgrade autotuner"),
    "column_renamed": (sql("ALTER TABLE attempts RENAME COLUMN metric TO metric_value"),
                       "corrupt sweep ledger: table attempts: no column metric; unknown column metric_value"),
    "column_added": (sql("ALTER TABLE attempts ADD COLUMN gpu TEXT"),
                     "corrupt sweep ledger: table attempts: unknown column gpu"),
    "column_dropped": (sql("ALTER TABLE attempts DROP COLUMN metrics"),
                       "corrupt sweep ledger: table attempts: no column metrics"),
    "column_renamed_before_versions": (sql("DROP TABLE measures", "DROP TABLE stops",
                                           "ALTER TABLE attempts DROP COLUMN handle",
                                           "ALTER TABLE attempts DROP COLUMN peak_memory",
                                           "ALTER TABLE attempts RENAME COLUMN state TO status",
                                           "PRAGMA user_version = 0"),
                                       "corrupt sweep ledger: table attempts: no column state; unknown column status"),
    "table_missing": (sql("DROP TABLE requests"), "corrupt sweep ledger: no table requests"),
    "not_null_dropped": (without_not_null,
                         "corrupt sweep ledger: the columns of table experiments are not declared"),
    "negative_version": (sql("PRAGMA user_version = -1"), "corrupt sweep ledger: schema version -1"),
    "meta_key_missing": (sql("DELETE FROM meta WHERE key = 'metric'"),
                         "corrupt sweep ledger: meta 'metric' is missing"),
    "meta_null": (sql("UPDATE meta SET value = 'null' WHERE key = 'name'"),
                  "corrupt sweep ledger: meta 'name' is not a str"),
    "meta_not_json": (sql("UPDATE meta SET value = '{\"localhost\": [0,' WHERE key = 'slots'"),
                      "corrupt sweep ledger: meta 'slots' is not JSON"),
    "slots_not_json": (sql("UPDATE attempts SET slots = '{\"localhost\": [0' WHERE slots IS NOT NULL"),
                       "corrupt sweep ledger: attempts.slots is not JSON"),
    "metrics_not_json": (sql("UPDATE attempts SET metrics = '{\"throughput\": ' WHERE metrics IS NOT NULL"),
                         "corrupt sweep ledger: attempts.metrics is not JSON"),
    "metrics_not_an_object": (sql("UPDATE attempts SET metrics = '[1, 2]' WHERE metrics IS NOT NULL"),
                              "corrupt sweep ledger: attempts.metrics is not a JSON object"),
    "spec_not_json": (sql("UPDATE experiments SET spec = '{\"name\": '"),
                      "corrupt sweep ledger: experiments.spec is not JSON"),
    "peak_not_a_number": (sql("UPDATE attempts SET peak_memory = 'lots'"),
                          "has a peak_memory that is no whole number of bytes ('lots')"),
    "peak_a_real": (sql("UPDATE attempts SET peak_memory = 1.5e300"), "has a peak_memory that is no whole number"),
    # Found by a hostile tester: `report --format json` handed NaN and Infinity on as JSON no reader takes.
    "metrics_nan": (sql("UPDATE attempts SET metrics = '{\"throughput\": NaN}' WHERE metrics IS NOT NULL"),
                    "corrupt sweep ledger: attempts.metrics is not JSON"),
    "metric_infinite": (sql("UPDATE attempts SET metric = 9e999 WHERE metric IS NOT NULL"),
                        "has a metric that is no finite number (inf)"),
    "metric_text": (sql("UPDATE attempts SET metric = 'fast' WHERE metric IS NOT NULL"),
                    "has a metric that is no finite number (fast)"),
}

# Damage that the runner (resume) and cancel, which write, refuse before they write; readers show what is there.
# Each made resume fail with a traceback: an attempt of no experiment, a time no clock reads.
BAD_FOR_WRITERS = {
    "orphan_attempt": (sql("INSERT INTO attempts (name, attempt, state, queued_at) VALUES ('ghost', 1, 'queued', 0)"),
                       "attempts: ghost is an attempt of no experiment"),
    "time_huge": (sql("UPDATE attempts SET started_at = 1e300 WHERE started_at IS NOT NULL"),
                  "has a started_at that is no time (1e+300)"),
    "time_negative": (sql("UPDATE attempts SET finished_at = -5 WHERE finished_at IS NOT NULL"),
                      "has a finished_at that is no time (-5.0)"),
    "stop_unknown_state": (sql("INSERT INTO stops VALUES ('s_x500', 1, 'paused', 'cancelled', 'x', 1.0)"),
                           "stops.state 'paused' is not one this autotuner knows"),
    "stop_unknown_reason": (sql("INSERT INTO stops VALUES ('s_x500', 1, 'cancelled', 'bored', 'x', 1.0)"),
                            "stops.reason 'bored' is not one this autotuner knows"),
}


def bad_copy(pristine: Path, tmp_path: Path, damage: Callable[[Path], None]) -> Path:
    results = tmp_path / "bad"
    shutil.copytree(pristine, results)
    damage(results / FILENAME)
    return results


@pytest.mark.parametrize("kind", BAD_LEDGERS)
def test_every_command_refuses_a_bad_ledger_in_one_line_and_changes_nothing(kind, pristine, tmp_path):
    damage, words = BAD_LEDGERS[kind]
    results = bad_copy(pristine, tmp_path, damage)
    good = tmp_path / "good"
    shutil.copytree(pristine, good)
    before = snapshot_of(tmp_path)
    path = str(results / FILENAME)
    for command in (["status", results], ["report", results], ["compare", good, results], ["resume", results, "-q"],
                    ["cancel", results, "s_x500"]):
        one_line_error(autotune(*command), path, words)
    assert snapshot_of(tmp_path) == before  # no runner.lock, no -wal or -shm left, the ledger untouched


@pytest.mark.parametrize("kind", BAD_LEDGERS)
def test_the_python_api_raises_user_error_and_writes_nothing(kind, pristine, tmp_path):
    damage, words = BAD_LEDGERS[kind]
    results = bad_copy(pristine, tmp_path, damage)
    before = snapshot_of(results)
    for call in (lambda: snapshot(results), lambda: autotuner.execute(results), lambda: autotuner.cancel(results, [])):
        with pytest.raises(UserError) as caught:
            call()
        assert str(caught.value).startswith(str(results / FILENAME) + ": "), caught.value
        assert words in str(caught.value)
    assert snapshot_of(results) == before
    assert not (results / LOCKFILE).exists()


@pytest.mark.parametrize("kind", BAD_FOR_WRITERS)
def test_resume_and_cancel_refuse_rows_no_writer_of_ours_leaves(kind, pristine, tmp_path):
    damage, words = BAD_FOR_WRITERS[kind]
    results = bad_copy(pristine, tmp_path, damage)
    before = snapshot_of(tmp_path)
    for command in (["resume", results, "-q"], ["cancel", results, "s_x500"]):
        one_line_error(autotune(*command), str(results / FILENAME), words)
    assert snapshot_of(tmp_path) == before


def test_damage_met_mid_read_is_found_only_by_the_query_that_reaches_it(pristine, tmp_path):
    """The damaged-pages ledger opens (its first pages are whole): the error comes from a query, converted at
    the ledger's one boundary, not from the check at open."""
    results = bad_copy(pristine, tmp_path, overwrite_pages)
    with Ledger.open(results) as ledger:
        assert ledger.meta().name == "s"
    with pytest.raises(UserError, match="corrupt sweep ledger: database disk image is malformed"), \
            Ledger.open(results) as ledger:
        ledger.attempts()


def test_a_newer_ledger_is_refused_by_name_even_with_columns_this_version_does_not_know(pristine, tmp_path):
    results = bad_copy(pristine, tmp_path, sql("ALTER TABLE attempts ADD COLUMN gpu TEXT",
                                               "ALTER TABLE meta RENAME COLUMN value TO json",
                                               "PRAGMA user_version = 9"))
    line = one_line_error(autotune("status", results))
    assert line == (f"autotune: error: {results / FILENAME}: written by a newer autotuner "
                    "(ledger schema 9; this one reads up to 8): upgrade autotuner")


def test_a_new_ledger_carries_the_schema_version(pristine):
    db = sqlite3.connect(pristine / FILENAME)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 8
    finally:
        db.close()


# --- a ledger from before schema versions (version 0) ---------------------------------------------------------
# Version 1's tables, no version: what main wrote before versions.
VERSION_7 = ("ALTER TABLE attempts RENAME COLUMN handle TO step",)
VERSION_6 = (*VERSION_7, "DROP TABLE measures")
VERSION_4 = (*VERSION_6, "DROP TABLE stops")
VERSION_3 = (*VERSION_4, "DROP INDEX experiments_position", "DROP TABLE swept", "DROP TABLE leaves")
VERSION_0 = (*VERSION_3, "ALTER TABLE attempts DROP COLUMN peak_memory", "ALTER TABLE attempts DROP COLUMN step",
             "PRAGMA user_version = 0")


def test_a_version_0_ledger_is_read_unchanged_and_migrated_by_resume(tmp_path):
    results = make_sweep(tmp_path, 4, finished=2)
    sql(*VERSION_0)(results / FILENAME)
    ledger_bytes = (results / FILENAME).read_bytes()
    before = snapshot_of(tmp_path)

    for command in (["status", results], ["report", results, "--format", "json"], ["compare", results, results]):
        done = autotune(*command)
        assert done.returncode == 0, done.stderr
    assert "s_x1" in autotune("report", results).stdout
    assert (results / FILENAME).read_bytes() == ledger_bytes  # readers write nothing, no version either
    assert snapshot_of(tmp_path) == before
    with Ledger.open(results) as ledger:
        assert ledger.version() == 0

    log = tmp_path / "launches.log"
    done = autotune("resume", results, "-q", environ=env(LAUNCH_LOG=log))
    assert done.returncode == 0, done.stderr
    assert states(results) == dict.fromkeys(["s_x0", "s_x1", "s_x2", "s_x3"], State.SUCCEEDED)
    assert sorted(name for name, _ in launches(log)) == ["s_x2", "s_x3"]  # what had succeeded did not run again
    with Ledger.open(results) as ledger:
        assert ledger.version() == SCHEMA_VERSION


def test_migration_is_one_transaction_by_the_runner_only(tmp_path):
    results = make_sweep(tmp_path, 2)
    sql(*VERSION_0)(results / FILENAME)
    statements: list[str] = []
    with Ledger.open(results) as ledger:
        ledger._db.set_trace_callback(statements.append)
        ledger.upgrade()
        assert ledger.version() == SCHEMA_VERSION
        assert "handle" in [c[1] for c in ledger._db.execute("PRAGMA table_info(attempts)")]
        statements.clear()
        ledger.upgrade()  # already current: nothing written
    assert not any(s.startswith(("BEGIN", "PRAGMA user_version =")) for s in statements), statements


def test_a_version_2_ledger_is_read_as_it_is_and_resume_adds_the_peak_memory_column(tmp_path):
    """Version 2 had no peak GPU memory per attempt: readers see none, the runner migrates it and the attempts
    already recorded keep every value they had."""
    results = make_sweep(tmp_path, 3, finished=1)
    sql(*VERSION_3, "ALTER TABLE attempts DROP COLUMN peak_memory", "PRAGMA user_version = 2")(results / FILENAME)
    ledger_bytes = (results / FILENAME).read_bytes()
    with Ledger.open(results) as ledger:
        assert ledger.version() == 2
        before = [a.to_json() for a in ledger.attempts()]
        assert before and all(a["peak_memory"] is None for a in before)
    report = autotune("report", results, "--format", "json")
    assert report.returncode == 0 and all(r["peak_memory"] is None for r in json.loads(report.stdout)["experiments"])
    assert (results / FILENAME).read_bytes() == ledger_bytes
    done = autotune("resume", results, "-q", environ=env(LAUNCH_LOG=tmp_path / "launches.log"))
    assert done.returncode == 0, done.stderr
    with Ledger.open(results) as ledger:
        assert ledger.version() == SCHEMA_VERSION == 8
        assert "peak_memory" in [c[1] for c in ledger._db.execute("PRAGMA table_info(attempts)")]
        kept = {(a.name, a.attempt): a.to_json() for a in ledger.attempts()}
    assert all(kept[(a["name"], a["attempt"])] == a for a in before if a["state"] == State.SUCCEEDED)


def test_a_version_3_ledger_is_reported_from_its_specs_and_resume_keeps_its_swept_values(tmp_path):
    """Version 3 kept no swept values: readers work them out from the specs, writing nothing; the runner's
    migration keeps them from then on, and the report says the same before and after."""
    results = make_sweep(tmp_path, 3, finished=1)
    before = json.loads(autotune("report", results, "--format", "json").stdout)
    assert before["parameters"] == ["x"]
    sql(*VERSION_3, "PRAGMA user_version = 3")(results / FILENAME)
    ledger_bytes = (results / FILENAME).read_bytes()
    with Ledger.open(results) as ledger:
        assert ledger.version() == 3 and ledger.swept_values() is None
    read = json.loads(autotune("report", results, "--format", "json").stdout)
    assert (results / FILENAME).read_bytes() == ledger_bytes
    assert read == before
    done = autotune("resume", results, "-q", environ=env(LAUNCH_LOG=tmp_path / "launches.log"))
    assert done.returncode == 0, done.stderr
    with Ledger.open(results) as ledger:
        assert ledger.version() == SCHEMA_VERSION
        assert ledger.swept_values() == (["x"], [(f"s_x{i}", {"x": i}) for i in range(3)])
    after = json.loads(autotune("report", results, "--format", "json").stdout)
    assert after["parameters"] == ["x"]  # the runs ranked anew: by name
    assert {r["name"]: r["parameters"] for r in after["experiments"]} == \
        {r["name"]: r["parameters"] for r in before["experiments"]}


def test_a_version_4_ledger_is_read_as_it_is_and_the_runner_indexes_its_positions(tmp_path):
    """Version 4 had no index on the experiments' positions: readers read it as it is (SQLite sorts), writing
    nothing; the runner's migration adds the index and keeps the swept values it finds whole."""
    results = make_sweep(tmp_path, 3, finished=1)
    before = autotune("report", results, "--format", "json").stdout
    sql(*VERSION_4, "DROP INDEX experiments_position", "PRAGMA user_version = 4")(results / FILENAME)
    ledger_bytes = (results / FILENAME).read_bytes()
    assert autotune("report", results, "--format", "json").stdout == before
    assert (results / FILENAME).read_bytes() == ledger_bytes
    statements: list[str] = []
    with Ledger.open(results) as ledger:
        ledger._db.set_trace_callback(statements.append)
        ledger.upgrade()
        assert ledger.version() == SCHEMA_VERSION == 8
        plan = " ".join(str(tuple(r)) for r in ledger._db.execute("EXPLAIN QUERY PLAN SELECT name FROM experiments "
                                                              "ORDER BY position"))
        assert "experiments_position" in plan and "TEMP B-TREE" not in plan
        assert ledger.swept_values() == (["x"], [(f"s_x{i}", {"x": i}) for i in range(3)])
    assert not any("swept" in s for s in statements if s.startswith(("INSERT", "DELETE"))), statements


def test_a_version_5_ledger_is_read_as_it_is_and_the_runner_adds_the_stops_table(tmp_path):
    """Version 5 recorded no stops: readers read it as it is, writing nothing; the runner's migration adds the
    table, and what was recorded reads the same."""
    results = make_sweep(tmp_path, 3, finished=1)
    before = autotune("report", results, "--format", "json").stdout
    sql(*VERSION_4, "PRAGMA user_version = 5")(results / FILENAME)
    ledger_bytes = (results / FILENAME).read_bytes()
    with Ledger.open(results) as ledger:
        assert ledger.version() == 5 and ledger.stops_asked() == {}
    assert autotune("report", results, "--format", "json").stdout == before
    assert (results / FILENAME).read_bytes() == ledger_bytes
    with Ledger.open(results) as ledger:
        ledger.upgrade()
        assert ledger.version() == SCHEMA_VERSION == 8
        assert [c[1] for c in ledger._db.execute("PRAGMA table_info(stops)")] == [
            "name", "attempt", "state", "reason", "detail", "at"]
    assert autotune("report", results, "--format", "json").stdout == before


def test_a_version_6_ledger_is_read_as_it_is_and_the_runner_adds_the_measures_table(tmp_path):
    """Version 6 kept no step timings: readers read it as it is, writing nothing; the runner's migration adds the
    table (start-up and step time apart, the interval), and what was recorded reads the same."""
    results = make_sweep(tmp_path, 3, finished=1)
    before = autotune("report", results, "--format", "json").stdout
    sql(*VERSION_6, "PRAGMA user_version = 6")(results / FILENAME)
    ledger_bytes = (results / FILENAME).read_bytes()
    with Ledger.open(results) as ledger:
        assert ledger.version() == 6 and ledger.measures() == {}
    assert autotune("report", results, "--format", "json").stdout == before
    assert (results / FILENAME).read_bytes() == ledger_bytes
    with Ledger.open(results) as ledger:
        ledger.upgrade()
        assert ledger.version() == SCHEMA_VERSION == 8
        assert [c[1] for c in ledger._db.execute("PRAGMA table_info(measures)")] == [
            "name", "attempt", "startup", "step_time", "steps", "mean", "low", "high"]
    assert autotune("report", results, "--format", "json").stdout == before


def test_a_migration_a_hand_edit_is_in_the_way_of_is_one_line_and_leaves_the_ledger_as_it_was(tmp_path):
    """A version-4 ledger holding a table by the name the migration gives its index: readers read it as it is;
    the runner refuses it in one line, its transaction rolled back (no traceback, no half-migrated file)."""
    results = make_sweep(tmp_path, 3, finished=1)
    sql(*VERSION_4, "DROP INDEX experiments_position", "CREATE TABLE experiments_position (x)",
        "PRAGMA user_version = 4")(
        results / FILENAME)
    assert autotune("report", results).returncode == 0
    before = (results / FILENAME).read_bytes()
    one_line_error(autotune("resume", results, "-q"), "cannot be brought to version 8",
                   "there is already a table named experiments_position")
    assert (results / FILENAME).read_bytes() == before


def test_damaged_swept_values_are_a_corrupt_ledger_and_damaged_leaves_are_worked_out_again(pristine, tmp_path):
    """swept.params is data a report shows: damaged, it is refused as any JSON column is (the runner before it
    writes). The leaves only say whether the values kept are whole: damaged, the report works the values out
    from the specs (the next add keeps them again: test_ledger.py)."""
    bad = bad_copy(pristine, tmp_path, sql("UPDATE swept SET params = 'not json' WHERE position = 7"))
    before = (bad / FILENAME).read_bytes()
    one_line_error(autotune("report", bad), "corrupt sweep ledger: swept.params is not JSON")
    one_line_error(autotune("resume", bad, "-q"), "corrupt sweep ledger: swept.params is not JSON")
    assert (bad / FILENAME).read_bytes() == before

    want = json.loads(autotune("report", pristine, "--format", "json").stdout)["experiments"]
    for n, damage in enumerate(("UPDATE leaves SET value = 'garbage'", "DELETE FROM leaves",
                                "UPDATE leaves SET value = json_set(value, '$.count', 3)")):
        results = bad_copy(pristine, tmp_path / str(n), sql(damage))
        with Ledger.open(results) as ledger:
            assert ledger.swept_values() is None
        got = json.loads(autotune("report", results, "--format", "json").stdout)["experiments"]
        assert got == want, damage


# --- the lock a user could break ----------------------------------------------------------------------------------
def test_deleting_runner_lock_under_a_live_runner_lets_no_second_runner_in(tmp_path, runners):
    spec = write_sweep(tmp_path, range(3))
    # Each run waits for the gate: the first runner holds its lock, with two runs going, until the test is done.
    gate = tmp_path / "gate"
    launcher = write_launcher(tmp_path, PREAMBLE + f'while [ ! -e "{gate}" ]; do sleep 0.02; done\n' + WRITE_METRICS)
    results = tmp_path / "out"
    log = tmp_path / "launches.log"
    environ = env(LAUNCH_LOG=log)
    first = runners.start("run", spec, "--slots", 2, "--launcher", launcher, "-o", results, "-q", environ=environ,
                          directory=results)
    wait_until(lambda: len(launched(results)) == 2, message="two experiments running")
    (results / LOCKFILE).unlink()  # "kill -9 leaves it behind", so a user deletes it

    status = autotune("status", results)
    assert f"runner: pid {first.pid}" in status.stdout, status.stdout  # still found without the file
    before = sorted(p.name for p in results.iterdir())
    line = one_line_error(autotune("resume", results, "-q", environ=environ), str(results))
    assert f"a runner (pid {first.pid}) is working on this sweep" in line
    assert sorted(p.name for p in results.iterdir()) == before  # not even a new runner.lock

    gate.touch()
    code, out, err = finish(first)
    assert code == 0, (out, err)  # the first runner was left alone: everything succeeded, once
    assert states(results) == {"s_x0": State.SUCCEEDED, "s_x1": State.SUCCEEDED, "s_x2": State.SUCCEEDED}
    assert len(log.read_text().split()) == 3
    assert tagged_pids(sweep_id(results)) == []


def test_holder_pid_is_found_without_runner_lock_and_is_none_after_release(tmp_path):
    lock = SweepLock(tmp_path).acquire()
    try:
        assert holder_pid(tmp_path) == int((tmp_path / LOCKFILE).read_text()) > 0
        (tmp_path / LOCKFILE).unlink()
        assert holder_pid(tmp_path) is not None
        with pytest.raises(SweepBusy):
            SweepLock(tmp_path).acquire()  # the same process, another open file: flock excludes it too
    finally:
        lock.release()
    assert holder_pid(tmp_path) is None
    SweepLock(tmp_path).acquire().release()


def test_where_a_directory_cannot_be_locked_runner_lock_excludes(tmp_path, monkeypatch):
    """NFS emulates flock with POSIX locks, which a directory opened read-only cannot take (ENOLCK or
    EBADF): the lock falls back to runner.lock's, as it was before."""
    import errno
    import fcntl
    import os
    import stat

    real_flock = fcntl.flock

    def flock(fd, operation):
        if stat.S_ISDIR(os.fstat(fd).st_mode) and not operation & fcntl.LOCK_UN:
            raise OSError(errno.ENOLCK, "No locks available")
        return real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    lock = SweepLock(tmp_path).acquire()
    try:
        assert holder_pid(tmp_path) == os.getpid()
        with pytest.raises(SweepBusy):
            SweepLock(tmp_path).acquire()
    finally:
        lock.release()
    assert holder_pid(tmp_path) is None


def test_a_runner_of_the_previous_version_which_locked_only_runner_lock_still_excludes(tmp_path):
    """The previous autotuner flocked runner.lock alone: while one runs, this one does not start beside it."""
    import subprocess
    import sys

    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys\n"
        f"fd = os.open({str(tmp_path / LOCKFILE)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, f'{os.getpid()}\\n'.encode())\n"
        "print('locked', flush=True)\n"
        "sys.stdin.read()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(SweepBusy) as busy:
            SweepLock(tmp_path).acquire()
        assert busy.value.pid == holder.pid
        assert holder_pid(tmp_path) == holder.pid
    finally:
        holder.communicate("")
    SweepLock(tmp_path).acquire().release()


# Kept values that decode, but disagree with the experiments or the leaves: each once showed wrong values (None for
# an experiment, another's value, a column of nothing, no column at all) or a traceback (a varying key no string).
DISAGREEING = {
    "a name not the experiment's": "UPDATE swept SET name = 'zzz' WHERE position = 1",
    "two names swapped": "UPDATE swept SET name = CASE position WHEN 1 THEN 's_x2' ELSE 's_x1' END "
                         "WHERE position IN (1, 2)",
    "a key not swept": "UPDATE swept SET params = '{\"y\": 5}' WHERE position = 1",
    "a row moved away": "UPDATE swept SET position = 9999 WHERE position = 5",
    "no key varies": "UPDATE leaves SET value = json_set(value, '$.varying', json('[]'))",
    "a key no experiment holds varies":
        "UPDATE leaves SET value = json_set(value, '$.varying', json('[\"x\", \"num_gpus\"]'))",
    "a varying key that is no string": "UPDATE leaves SET value = json_set(value, '$.varying', json('[[1]]'))",
    "leaves nested too deep to decode":
        "UPDATE leaves SET value = '{\"first\": ' || replace(hex(zeroblob(3000)), '00', '[') || '1' || "
        "replace(hex(zeroblob(3000)), '00', ']') || ', \"varying\": [], \"count\": 600}'",
}


@pytest.mark.parametrize("damage", list(DISAGREEING))
def test_kept_values_that_disagree_are_worked_out_from_the_specs(damage, pristine, tmp_path):
    results = bad_copy(pristine, tmp_path, sql(DISAGREEING[damage]))
    with Ledger.open(results) as ledger:
        assert ledger.swept_values() is None
    want = json.loads(autotune("report", pristine, "--format", "json").stdout)
    done = autotune("report", results, "--format", "json")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    got = json.loads(done.stdout)
    assert (got["parameters"], got["experiments"]) == (want["parameters"], want["experiments"])


def test_resume_of_an_edited_sweep_rewrites_kept_values_a_row_of_which_is_in_the_way(tmp_path):
    """A row kept at the position the next experiment takes failed the add (a UNIQUE constraint traceback, the
    sweep left half-resumed): the runner works the values out again before it adds."""
    results = make_sweep(tmp_path, 3, finished=3)
    sql("INSERT INTO swept VALUES (3, 'stray', '{\"x\": 9}')")(results / FILENAME)
    write_sweep(tmp_path, range(5), name="s",
                extra="  args: [" + ", ".join(f'"--pad{i}"' for i in range(20)) + "]")
    done = autotune("resume", results, "--only-new", "-q", environ=env(LAUNCH_LOG=tmp_path / "launches.log"))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    with Ledger.open(results) as ledger:
        specs = ledger.specs()
        keys, values = swept_specs(specs)
        assert len(specs) == 5
        assert ledger.swept_values() == (keys, [(s["name"], v) for s, v in zip(specs, values, strict=True)])


def test_a_report_read_while_experiments_are_added_shows_the_columns_of_what_it_read(tmp_path):
    """The swept values are read after the snapshot: experiments added between (a tune, a resume) made a key that
    varies only among them a column of every record it shows (None in each)."""
    results = make_sweep(tmp_path, 3, finished=2)
    snap = load(results, every_experiment=False)
    with Ledger.open(results) as ledger:
        ledger.add_experiments([experiment("late", ds_config={"train_micro_batch_size_per_gpu": 1, "y": 7},
                                           script=str(tmp_path / "train.py"))], 3.0)
        assert ledger.swept_values() is not None and "y" in ledger.swept_values()[0]
    results_read = from_snapshot(snap)
    assert results_read.parameters == ("x",)
    assert {r.name: dict(r.parameters) for r in results_read} == {f"s_x{i}": {"x": i} for i in range(3)}


def test_a_spec_nested_too_deep_to_copy_is_one_line_for_the_runner(tmp_path):
    """A ds_config nested 900 deep decodes, but building the experiment from it (a copy, one call a level) ran out
    of stack: a RecursionError traceback from the runner's dispatch."""
    results = make_sweep(tmp_path, 3, finished=1)
    db = sqlite3.connect(results / FILENAME)
    try:
        deep = "1"
        for _ in range(900):
            deep = '{"k": ' + deep + "}"
        db.execute("UPDATE experiments SET spec = json_set(spec, '$.ds_config.deep', json(?)) WHERE position = 1",
                   (deep,))
        db.commit()
    finally:
        db.close()
    one_line_error(autotune("resume", results, "-q", environ=env(LAUNCH_LOG=tmp_path / "launches.log")),
                   "corrupt sweep ledger: experiments.spec")
