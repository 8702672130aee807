"""Progress read while a run runs, and what it decides: the runner's step reader (sweep/steps.py) posts each
running attempt's steps so far; the scheduler keeps them in the ledger and asks the search which runs cannot win
(tune/outclass.py), stopping those through the recorded-stop path (state `stopped`, reason `outclassed`); a run
seen to run out of memory is ended at once (failed, oom)."""
import json
import os
import re
import time
from collections import Counter

import pytest

import autotuner
from autotuner.core import Finished, Launched, Progress, Reservation, Run, Stop
from autotuner.core.outcome import Outcome, StopAsked
from autotuner.dashboard.feed import SweepFeed
from autotuner.ledger.store import Ledger
from autotuner.spec.interval import Interval, StepReading
from autotuner.spec.metrics import metric_named
from autotuner.spec.progress import PROGRESS_FILE
from autotuner.states import Reason, State
from autotuner.sweep.steps import StepReader
from autotuner.tune.gridsearch import MicroBatchSearch
from autotuner.tune.outclass import MIN_STEPS, outclassed
from autotuner.tune.space import SearchSpec

from cli_rig import (
    PREAMBLE,
    ROOT,
    autotune,
    env,
    kill_9_once,
    latest,
    sweep_id,
    tagged_pids,
    wait_until,
    write_launcher,
    write_sweep,
)
from helpers import core, decided, experiment

THROUGHPUT, LATENCY = metric_named("throughput"), metric_named("latency")


def reading(low, high, n=MIN_STEPS, mean=None):
    return StepReading(100.0, n, 0.1, Interval(mean or (low + high) / 2, low, high, n, 2))


@pytest.mark.parametrize(("metric", "mine", "stopped"), [
    (THROUGHPUT, (80, 94), True),  # at most 94, the best at least 95
    (THROUGHPUT, (80, 96), False),  # could still be 96
    (LATENCY, (106, 120), True),  # at least 106, the best at most 105
    (LATENCY, (104, 120), False),
])
def test_a_run_is_outclassed_only_when_its_optimistic_bound_is_worse_than_a_finished_configs_pessimistic_one(
        metric, mine, stopped):
    finished = {"best": (95.0, 105.0), "other": (50.0, 60.0) if not metric.minimize else (140.0, 150.0)}
    why = outclassed(reading(*mine), finished, ["best", "other"], metric)
    assert (why is not None) == stopped
    if stopped:
        assert why.startswith(f"outclassed after {MIN_STEPS} measured steps") and "best's" in why


def test_a_stops_detail_shows_the_two_bounds_it_compared_with_the_digits_that_tell_them_apart():
    """Bounds a hair apart read apart in the detail (four digits made both "2,214"); far apart, four digits."""
    close = outclassed(reading(2000.0, 2213.9), {"best": (2214.3, 2300.0)}, ["best"], THROUGHPUT)
    mine, better, theirs = decided(close)
    assert (mine, better, theirs) == (2213.9, "best", 2214.3), close
    far = outclassed(reading(10.0, 20.0), {"best": (95.0, 105.0)}, ["best"], THROUGHPUT)
    assert decided(far) == (20.0, "best", 95.0) and "at most 20 " in far, far


def test_too_few_steps_no_interval_or_no_finished_config_stop_nothing():
    finished = {"best": (95.0, 105.0)}
    assert outclassed(reading(10, 20, n=MIN_STEPS - 1), finished, ["best"], THROUGHPUT) is None
    assert outclassed(StepReading(1.0, 9, 0.1, None), finished, ["best"], THROUGHPUT) is None
    assert outclassed(reading(10, 20), finished, [], THROUGHPUT) is None  # a config that has not finished
    assert outclassed(reading(10, 20), {}, ["best"], THROUGHPUT) is None  # finished without an interval


def tune_search(tmp_path):
    """A tune's search of stages 1-3 (tune/gridsearch.py) and the runs of its first round, started."""
    search = MicroBatchSearch(SearchSpec(
        prefix="t", template={"script": "/x/train.py", "num_gpus": 1, "num_nodes": 1, "args": []},
        base={"gradient_accumulation_steps": 1}, stages=(1, 2, 3), metric="throughput", max_mbs=64, confirm=0))
    return search, [Run(e, 1, Reservation.of({"h": [i]}), f"sid.{e.name}.1", tmp_path / e.name)
                    for i, e in enumerate(search.propose(3, 0.0))]


def test_a_tune_stops_a_run_far_behind_another_still_running_before_any_run_has_finished(tmp_path):
    """Runs started together tell each other apart while they run: the first round of a tune (nothing finished
    yet) no longer measures a clearly worse run to its end. A run counts once it has made MIN_STEPS measured
    steps, and no longer once it ended (a run out of memory, or failed, outclasses nothing)."""
    search, (ahead, behind, other) = tune_search(tmp_path)
    assert search.outclassed(ahead, reading(300, 320, n=MIN_STEPS - 1)) is None
    assert search.outclassed(behind, reading(90, 100)) is None  # the one ahead made too few steps to count yet
    assert search.outclassed(ahead, reading(300, 320)) is None  # nothing ahead of it
    why = search.outclassed(behind, reading(90, 100))
    assert why is not None and why.endswith(f"{ahead.experiment.name}'s at least 300 (still running)")
    assert decided(why) == (100.0, ahead.experiment.name, 300.0)
    assert search.outclassed(other, reading(80, 400)) is None  # could still be ahead of it, or behind the other
    search.observe(ahead, Outcome(State.FAILED, Reason.EXIT, "it crashed after its steps", 1))
    assert search.outclassed(behind, reading(90, 100)) is None  # what ended without succeeding counts no more
    search.observe(other, Outcome(State.SUCCEEDED, metrics={"throughput": 310.0, "throughput_low": 290.0,
                                                             "throughput_high": 330.0}))
    assert search.outclassed(behind, reading(90, 100)).endswith("'s at least 290")  # a finished config's


class Judge:
    """A stand-in search: says `why` for the runs named in `outclass`, and records what it is told."""

    def __init__(self, outclass=()):
        self.outclass, self.seen, self.asked = set(outclass), [], []

    def propose(self, free_slots, now):
        return []

    def observe(self, run, outcome):
        self.seen.append((run.experiment.name, outcome.state, outcome.reason))

    def outclassed(self, run, got):
        self.asked.append(run.experiment.name)
        return "outclassed: slow" if run.experiment.name in self.outclass else None


def test_the_scheduler_keeps_each_reading_and_stops_what_the_search_says_cannot_win_as_a_recorded_stop():
    judge = Judge(outclass={"slow"})
    s = core([experiment("fast"), experiment("slow")], slots={"h": [0, 1]}, searcher=judge)
    runs = {r.experiment.name: r for r in s.step([], 0.0).start}
    s.step([Launched(runs["fast"], 1, None, 1.0), Launched(runs["slow"], 2, None, 1.0)], 1.0)
    got = reading(10, 20)
    actions = s.step([Progress(runs["fast"], got)], 105.0)  # read after its first step ended (at 100)
    assert actions.stop == [] and [n.what for n in actions.notes] == ["progress"]
    assert actions.notes[0].outcome == Outcome(State.RUNNING, measured=got)
    assert s.record.timings[("fast", 1)].steps == got.steps and s.record.timings[("fast", 1)].startup == 99.0
    actions = s.step([Progress(runs["slow"], got)], 106.0)
    assert actions.stop == [Stop(runs["slow"], State.STOPPED, "outclassed: slow", Reason.OUTCLASSED)]
    assert s.record.stops == {("slow", 1): (State.STOPPED, Reason.OUTCLASSED, 106.0)}
    assert s.step([Progress(runs["slow"], got)], 107.0).stop == []  # asked once: the first stop is the one
    # The executor's end of it (a SIGTERM's exit status) reads as the stop: not a failure, not queued again.
    s.step([Finished(runs["slow"], Outcome(State.FAILED, Reason.EXIT, "exit status -15", -15, measured=got), 108.0)],
           108.0)
    assert s.record.finished[("slow", 1)] == (State.STOPPED, 108.0) and s.waiting() == []
    assert judge.seen == [("slow", State.STOPPED, Reason.OUTCLASSED)]


def test_a_run_seen_to_run_out_of_memory_is_ended_at_once_and_recorded_failed_oom():
    s = core([experiment("big")], searcher=Judge())
    run = s.step([], 0.0).start[0]
    actions = s.step([Progress(run, None, "ran out of memory while it ran: CUDA out of memory")], 2.0)
    assert actions.stop == [Stop(run, State.FAILED, "ran out of memory while it ran: CUDA out of memory",
                                 Reason.OOM)]
    s.step([Finished(run, Outcome(State.INTERRUPTED, Reason.INTERRUPTED, "killed", -9), 3.0)], 3.0)
    assert s.record.finished[("big", 1)] == (State.FAILED, 3.0) and s.done


def test_a_reading_of_an_attempt_that_ended_is_dropped():
    s = core([experiment("a")], searcher=Judge(outclass={"a"}))
    run = s.step([], 0.0).start[0]
    s.step([Finished(run, Outcome(State.SUCCEEDED, metrics={"throughput": 1.0}), 1.0)], 1.0)
    assert s.step([Progress(run, reading(1, 2))], 2.0).stop == [] and ("a", 1) not in s.record.timings


class Posted(list):
    def __call__(self, event):
        self.append(event)


def write_steps(directory, count, value=100.0):
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / PROGRESS_FILE, "a") as f:
        for n in range(1, count + 1):
            f.write(json.dumps({"step": n, "time": time.time() + n * 0.1, "throughput": value}) + "\n")


def started(reader, name, tmp_path):
    run = Run(experiment(name), 1, Reservation.of({"h": [0]}), f"sid.{name}.1", tmp_path / name)
    reader("started", run, None)
    return run


def test_the_step_reader_posts_new_steps_of_the_attempts_it_follows_and_only_this_attempts(tmp_path):
    posted = Posted()
    reader = StepReader(posted, "throughput", 60.0)
    old = tmp_path / "old"
    write_steps(old, 8)  # an earlier attempt's file, older than this attempt's placing
    os.utime(old / PROGRESS_FILE, (time.time() - 60, time.time() - 60))
    stale = started(reader, "old", tmp_path)
    run = started(reader, "new", tmp_path)
    reader.check()
    assert posted == []  # nothing written yet by "new"; "old"'s file is not its attempt's
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "stderr.log").touch()  # empty since its launch: its time stamp may be a tick before it
    os.utime(tmp_path / "new" / "stderr.log", (time.time() - 60, time.time() - 60))
    write_steps(tmp_path / "new", 8)
    reader.check()
    # Its measured steps: those after DeepSpeed's default start_profile_step 3 + 1 (no config to say another)
    assert [(e.run, e.reading.steps, e.oom) for e in posted] == [(run, 4, None)]
    assert posted[0].reading.interval.mean == pytest.approx(100.0)
    reader.check()
    assert len(posted) == 1  # no new step: nothing posted
    reader("finished", run, None)
    reader("finished", stale, None)
    write_steps(tmp_path / "new", 9)
    reader.check()
    assert len(posted) == 1  # let go once it finished


def test_the_step_reader_reads_an_attempts_window_and_tp_size_from_its_config(tmp_path):
    """The attempt's config says its measured window (the steps after start_profile_step + 1) and its TP size: a
    running autotp run's reading is over it, as its recorded throughput will be (backends/exitstatus.py)."""
    posted = Posted()
    reader = StepReader(posted, "throughput", 60.0)
    run = started(reader, "tp", tmp_path)
    write_steps(tmp_path / "tp", 8)
    (tmp_path / "tp" / "ds_config.json").write_text(json.dumps({
        "tensor_parallel": {"autotp_size": 2}, "autotuning": {"start_profile_step": 1, "end_profile_step": 20}}))
    reader.check()
    [event] = posted
    assert event.run == run and event.reading.steps == 6 and event.reading.interval.mean == pytest.approx(50.0)


def test_the_step_reader_ends_a_run_whose_new_log_lines_say_it_ran_out_of_memory(tmp_path):
    posted = Posted()
    reader = StepReader(posted, "throughput", 60.0)
    run = started(reader, "big", tmp_path)
    (tmp_path / "big").mkdir()
    log = tmp_path / "big" / "stderr.log"
    log.write_text("loading\nhalf a line: CUDA out of")
    reader.check()
    assert posted == []  # a line not finished is not read yet
    with open(log, "a") as f:
        f.write(" memory. Tried to allocate 2.00 GiB\nrank 1 waits\n")
    reader.check()
    assert [(e.run, e.reading, e.oom) for e in posted] == [
        (run, None, "ran out of memory while it ran: half a line: CUDA out of memory. Tried to allocate 2.00 GiB")]
    reader.check()
    assert len(posted) == 1  # posted once


def test_the_step_reader_ends_a_run_whose_further_node_ran_out_of_memory(tmp_path):
    """Ray starts a launcher per node and writes the further nodes' logs apart (nodes/RANK.stderr.log): a rank
    out of memory there, its peers waiting on it, ends the run as one on the first node does."""
    posted = Posted()
    reader = StepReader(posted, "throughput", 60.0)
    run = started(reader, "two", tmp_path)
    (tmp_path / "two" / "nodes").mkdir(parents=True)
    (tmp_path / "two" / "stderr.log").write_text("rank 0 waits for its peers\n")
    (tmp_path / "two" / "nodes" / "1.exit_status").write_text("")
    reader.check()
    assert posted == []
    (tmp_path / "two" / "nodes" / "1.stderr.log").write_text("torch.OutOfMemoryError: CUDA out of memory.\n")
    reader.check()
    assert [(e.run, e.oom) for e in posted] == [(run, "ran out of memory while it ran: torch.OutOfMemoryError: "
                                                      "CUDA out of memory.")]


def test_the_step_reader_thread_is_joined_when_its_block_ends(tmp_path):
    posted = Posted()
    reader = StepReader(posted, "throughput", 0.1)
    with reader.reading():
        run = started(reader, "a", tmp_path)
        write_steps(tmp_path / "a", 6)
        wait_until(lambda: posted, message="the reader's thread posts the steps")
    assert [e.run for e in posted] == [run]
    assert reader._workers.running() == []


def test_a_stop_the_dead_runner_recorded_is_asked_again_of_the_run_it_left():
    """A runner killed between recording a stop and sending its signal: the one that adopts the run sends it."""
    s = core([], searcher=Judge())
    run = s.adopt(experiment("slow"), 1, {"h": [0]}, since=0.0, stop=StopAsked.of(State.STOPPED, "outclassed: slow"))
    assert s.step([], 1.0).stop == [Stop(run, State.STOPPED, "outclassed: slow", Reason.OUTCLASSED)]
    s.step([Finished(run, Outcome(State.FAILED, Reason.EXIT, "exit status -15", -15), 2.0)], 2.0)
    assert s.record.finished == {("slow", 1): (State.STOPPED, 2.0)} and s.waiting() == []
    assert s.record.stops == {}  # the dead runner's record holds it already


# --- through the command line: `autotune tune` on the stand-in launcher, its runs stepping ------------------------
STANDIN = ROOT / "tests" / "oom_standin.sh"


def setup_tune(tmp_path, **extra):
    (tmp_path / "train.py").write_text("# stand-in: the launcher never runs it\n")
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
          "zero_optimization": {"stage": [1, 2, 3]},
          "autotuning": {"enabled": True, "metric": "throughput", "max_train_micro_batch_size_per_gpu": 64}}
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    return env(OOM_STANDIN_LOG=tmp_path / "launches.log", OOM_STANDIN_STEPS="16 0.08", AUTOTUNE_PROGRESS_POLL="0.1",
               **extra)


TUNE = ("tune", "--slots", "3", "--launcher", f"sh {STANDIN}")
SCRIPT = ("train.py", "--deepspeed_config", "ds.json", "--steps", "3")


def check_stopped(directory):
    """Every stopped run: outclassed, said why, its optimistic bound below a config's pessimistic one, which
    succeeded; never run again; the best is no stopped run. Returns the stopped names."""
    ended = latest(directory)
    stopped = {n: a for n, a in ended.items() if a.state == State.STOPPED}
    for name, a in stopped.items():
        assert a.reason == Reason.OUTCLASSED, a
        mine, better, theirs = decided(a.detail)
        # behind a config that finished, or a first run still running then (which may itself be stopped later)
        assert mine < theirs and ended[better].state in (
            (State.SUCCEEDED, State.STOPPED) if a.detail.endswith("(still running)") else (State.SUCCEEDED,))
        assert a.attempt == 1 and a.metric is None and f"{name}_confirm1" not in ended
        assert a.metrics["steps_measured"] >= MIN_STEPS and "throughput_low" in a.metrics
    with Ledger.open(directory) as ledger:
        rows = ledger.attempts()
    assert [(a.name, a.attempt) for a in rows if a.name in stopped] == [(n, 1) for n in stopped]  # never re-run
    return set(stopped)


def test_a_tune_stops_the_runs_that_cannot_win_and_names_the_same_best(tmp_path):
    done = autotune(*TUNE, "-o", tmp_path / "res", *SCRIPT, environ=setup_tune(tmp_path), cwd=tmp_path,
                    timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr  # a stopped run is no failure
    assert "best: train_z3_mbs45 with throughput" in done.stdout  # as the tune that runs every step names it
    stopped = check_stopped(tmp_path / "res")
    assert stopped and re.search(r"\d+ stopped", done.stdout)
    report = json.loads(autotune("report", tmp_path / "res", "--format", "json").stdout)
    rows = {r["name"]: r for r in report["experiments"]}
    assert {n for n, r in rows.items() if r["state"] == "stopped"} == stopped
    assert all(rows[n]["reason"] == "outclassed" and rows[n]["rank"] is None for n in stopped)
    csv = autotune("report", tmp_path / "res", "--format", "csv").stdout
    assert {line.split(",")[2] for line in csv.splitlines() if ",stopped," in line} == stopped


def test_a_run_that_prints_that_it_ran_out_of_memory_is_ended_at_once(tmp_path):
    """The stand-in's run out of memory prints the runtime's line and then hangs, as a rank whose peers wait
    for it: the reader sees the line and ends it, recorded failed (oom); with nothing reading the logs it
    would hang to its timeout."""
    environ = setup_tune(tmp_path, OOM_STANDIN_HANG="1")
    done = autotune(*TUNE, "-o", tmp_path / "res", "--timeout", "120", *SCRIPT, environ=environ,
                    cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    ooms = [a for a in latest(tmp_path / "res").values() if a.reason == Reason.OOM]
    assert ooms and all(a.state == State.FAILED and a.detail.startswith("ran out of memory while it ran: ")
                        and "CUDA out of memory" in a.detail for a in ooms)
    assert "best: train_z3_mbs45 with throughput" in done.stdout


def test_a_kill_9_during_a_stop_then_resume_records_it_as_the_stop_and_runs_nothing_twice(tmp_path, runners):
    """A stopped run takes a second to end (its SIGTERM handled), so the runner is killed while it ends."""
    environ = setup_tune(tmp_path, OOM_STANDIN_TERM_SECONDS="1")
    out = tmp_path / "res"
    proc = runners.start(*TUNE, "-o", out, *SCRIPT, environ=environ, cwd=tmp_path, directory=out)

    def stopping():
        if not (out / "ledger.sqlite").exists():
            return False
        with Ledger.open(out) as ledger:
            return any(state == State.STOPPED for state, _, _ in ledger.stops_asked().values())

    kill_9_once(proc, stopping, timeout=240)
    resumed = autotune("resume", out, environ=environ, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert check_stopped(out)
    ran = Counter(tuple(line.split()[:2]) for line in (tmp_path / "launches.log").read_text().splitlines())
    confirmed = {tuple(f"z{n.split('_z')[1].split('_')[0]} mbs{n.split('mbs')[1].split('_')[0]}".split())
                 for n in latest(out) if n.endswith("_confirm1")}
    assert {point for point, n in ran.items() if n > 1} == confirmed  # only the confirming re-runs twice
    assert tagged_pids(sweep_id(out)) == []


# A stand-in whose experiment p_x1 makes 100 samples/s and every other 10, one progress line a step.
STEPPING = PREAMBLE + """\
speed=10
[ "$name" = p_x1 ] && speed=100
i=1
while [ $i -le 16 ]; do
  sleep 0.08
  printf '{"step": %d, "time": %s, "throughput": %d}\\n' $i "$(date +%s.%N)" $speed >> "$AUTOTUNE_PROGRESS_PATH"
  i=$((i + 1))
done
printf '{"throughput": %d}\\n' $speed > "$AUTOTUNE_METRICS_PATH"
"""


def test_a_run_sweep_stops_what_cannot_win_only_when_asked_and_resume_keeps_what_succeeded(tmp_path):
    """One slot, the sweep's order: p_x1 succeeds first; with --stop-outclassed the others are stopped once their
    steps bound them below it (exit 0: no failure); `resume --stop-outclassed` of a sweep whose fast one had
    succeeded (recorded) stops the one it runs. Without the option every experiment runs to its end."""
    sweep = write_sweep(tmp_path, [1, 2, 3], name="p")
    launcher = write_launcher(tmp_path, STEPPING)
    environ = env(LAUNCH_LOG=tmp_path / "launches.log", AUTOTUNE_PROGRESS_POLL="0.1")
    done = autotune("run", sweep, "--results", tmp_path / "asked", "--launcher", launcher, "--slots", "1",
                    "--stop-outclassed", environ=environ)
    assert done.returncode == 0, done.stdout + done.stderr
    ended = latest(tmp_path / "asked")
    assert {n: (a.state, a.reason) for n, a in ended.items()} == {
        "p_x1": (State.SUCCEEDED, None), "p_x2": (State.STOPPED, Reason.OUTCLASSED),
        "p_x3": (State.STOPPED, Reason.OUTCLASSED)}
    assert "p_x1's at least 100" in ended["p_x2"].detail
    plain = autotune("run", sweep, "--results", tmp_path / "plain", "--launcher", launcher, "--slots", "1",
                     environ=environ)
    assert plain.returncode == 0 and {a.state for a in latest(tmp_path / "plain").values()} == {State.SUCCEEDED}
    with Ledger.open(tmp_path / "plain") as ledger:  # p_x3 made queued again: as if it had not run yet
        ledger._db.execute("UPDATE attempts SET state = 'interrupted' WHERE name = 'p_x3'")
        ledger._db.commit()
    resumed = autotune("resume", tmp_path / "plain", "--stop-outclassed", environ=environ)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    again = latest(tmp_path / "plain")["p_x3"]
    assert (again.attempt, again.state, again.reason) == (2, State.STOPPED, Reason.OUTCLASSED)


def saved_by_hand(directory, window):
    """The GPU-hours stopping saved, worked out from the ledger's rows: each stopped attempt's measured steps short
    of `window` (the steps its config's profile window measures) times its median step time, on its one slot."""
    with Ledger.open(directory) as ledger:
        rows = ledger._db.execute("SELECT m.steps, m.step_time FROM attempts a JOIN measures m ON m.name = a.name "
                                  "AND m.attempt = a.attempt WHERE a.state = 'stopped'").fetchall()
    return sum(max(window - steps, 0) * step for steps, step in rows) / 3600


def test_the_gpu_hours_stopping_saved_are_estimated_from_the_steps_the_stopped_runs_did_not_make(tmp_path):
    """The stand-in makes 16 steps, as the window (end_profile_step 15) asks, 12 of them measured (those after
    start_profile_step 3 + 1: one count); the two slow ones are stopped before its end. Without --stop-outclassed
    nothing is saved, and no line says so."""
    (tmp_path / "train.py").touch()
    sweep = tmp_path / "sweep.hjson"
    sweep.write_text("{\n  name: p\n  script: train.py\n  space: {x: [1, 2, 3]}\n"
                     "  ds_config: {train_micro_batch_size_per_gpu: 1, autotuning: {end_profile_step: 15}}\n}\n")
    launcher = write_launcher(tmp_path, STEPPING)
    environ = env(LAUNCH_LOG=tmp_path / "launches.log", AUTOTUNE_PROGRESS_POLL="0.1")
    for out, asked in (("asked", ("--stop-outclassed",)), ("plain", ())):
        done = autotune("run", sweep, "--results", tmp_path / out, "--launcher", launcher, "--slots", "1", *asked,
                        environ=environ)
        assert done.returncode == 0, done.stdout + done.stderr
    expected = saved_by_hand(tmp_path / "asked", 12)
    assert expected > 0
    for command in ("status", "report"):
        shown = json.loads(autotune(command, tmp_path / "asked", "--format", "json").stdout)["gpu_hours"]
        assert shown["saved"] == round(expected, 6)
        assert json.loads(autotune(command, tmp_path / "plain", "--format", "json").stdout)["gpu_hours"]["saved"] == 0
    assert f"about {expected:,.4g} saved by stopping (estimated)" in autotune("status", tmp_path / "asked").stdout
    assert "saved" not in autotune("status", tmp_path / "plain").stdout
    compared = json.loads(autotuner.render_compare(tmp_path / "asked", tmp_path / "plain", "json"))
    assert (compared["a"]["gpu_hours"]["saved"], compared["b"]["gpu_hours"]["saved"]) == (round(expected, 6), 0)
    feed = SweepFeed(tmp_path / "asked")  # the dashboard's summary
    feed.refresh()
    assert feed.gpu_hours()["saved"] == round(expected, 6) and "saved by stopping" in feed.gpu_hours()["line"]
