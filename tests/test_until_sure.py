"""Measure until sure (spec/sure.py, tune/untilsure.py): a run whose config asks a tolerance is ended as soon as
its 95% interval is that narrow, recorded succeeded with its steps' mean, through the recorded-stop path; the
keys and options that ask it are checked; a tune measures until sure unless told otherwise."""
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

import pytest

import autotuner
from autotuner.core import Finished, Launched, MemoryRecord, Progress, Queued, Scheduler, SlotPool, Stop
from autotuner.core.outcome import Outcome, StopAsked, with_measured_metric
from autotuner.ledger.store import Ledger
from autotuner.planning.durations import SureSteps
from autotuner.spec.interval import Interval, StepReading
from autotuner.spec.sure import MIN_STEPS, SURE_BATCHES, SURE_STEPS, steps_needed, sure, tolerance_of
from autotuner.states import Reason, State

from cli_rig import (
    PREAMBLE,
    ROOT,
    autotune,
    env,
    kill_9_once,
    latest,
    refused,
    sweep_id,
    tagged_pids,
    write_launcher,
)
from helpers import experiment

STANDIN = ROOT / "tests" / "oom_standin.sh"


def reading(mean, half, n=9, batches=SURE_BATCHES):
    return StepReading(100.0, n, 0.1, Interval(mean, mean * (1 - half), mean * (1 + half), n, batches))


def test_a_run_is_sure_once_its_interval_is_within_the_tolerance_after_the_minimum_steps():
    assert sure(reading(100.0, 0.02), 0.03).startswith("measured until sure: after 9 measured steps")
    assert sure(reading(100.0, 0.04), 0.03) is None  # still too wide
    assert sure(reading(100.0, 0.0, n=MIN_STEPS - 1), 0.03) is None  # too few steps to say
    assert sure(reading(100.0, 0.0, n=8, batches=2), 0.03) is None  # two batches: one degree of freedom
    assert sure(StepReading(1.0, 9, 0.1, None), 0.03) is None  # no values in its steps


@pytest.mark.parametrize(("section", "tolerance"), [
    ({"tolerance": 0.05}, 0.05), ({}, None), ({"tolerance": None}, None), ({"tolerance": True}, None)])
def test_a_config_asks_until_sure_only_with_a_tolerance_between_0_and_1(section, tolerance):
    assert tolerance_of({"autotuning": section}) == tolerance
    assert tolerance_of({}) is None


SURE = {"train_micro_batch_size_per_gpu": 1, "autotuning": {"tolerance": 0.03}}


class Kept(MemoryRecord):
    """A memory record that keeps what each attempt ended with."""

    def __init__(self):
        super().__init__()
        self.metrics = {}

    def finish(self, name, attempt, state, at, **recorded):
        super().finish(name, attempt, state, at, **recorded)
        self.metrics[(name, attempt)] = recorded.get("metrics")


def core(exps, slots=None):
    s = Scheduler(Kept(), SlotPool(slots or {"h": [0]}), "sid", Path("/results"), "throughput")
    s.record.add_experiments(exps, 0.0)
    s.submit(Queued(e, 1) for e in exps)
    return s


def test_the_scheduler_ends_a_run_once_it_is_sure_and_records_it_succeeded_with_its_steps_mean():
    s = core([experiment("sure", ds_config=SURE), experiment("fixed")], slots={"h": [0, 1]})
    runs = {r.experiment.name: r for r in s.step([], 0.0).start}
    s.step([Launched(runs["sure"], 1, None, 1.0), Launched(runs["fixed"], 2, None, 1.0)], 1.0)
    assert s.step([Progress(runs["sure"], reading(50.0, 0.05))], 2.0).stop == []  # not yet
    assert s.step([Progress(runs["fixed"], reading(50.0, 0.01))], 2.0).stop == []  # it asked for no tolerance
    done = reading(50.0, 0.02)
    [stop] = s.step([Progress(runs["sure"], done)], 3.0).stop
    assert (stop.run, stop.state, stop.reason) == (runs["sure"], State.SUCCEEDED, Reason.SURE)
    assert s.record.stops == {("sure", 1): (State.SUCCEEDED, Reason.SURE, 3.0)}  # recorded before its signal
    # Its end (the SIGTERM's exit status, no metrics file) reads as the success it was, its metric the mean as it
    # was judged sure (the steps it made while the stop reached it read at its end too: not what was judged).
    later = reading(52.0, 0.06, n=12)
    s.step([Finished(runs["sure"], Outcome(State.FAILED, Reason.EXIT, "exit status -15", -15, measured=later),
                     4.0)], 4.0)
    assert s.record.finished[("sure", 1)] == (State.SUCCEEDED, 4.0) and s.waiting() == []
    metrics = s.record.metrics[("sure", 1)]
    assert metrics["throughput"] == 50.0 and metrics["throughput_low"] == pytest.approx(49.0)
    assert metrics["throughput_high"] == pytest.approx(51.0)


def test_a_sure_stop_the_dead_runner_recorded_is_asked_again_and_its_end_reads_as_a_success():
    s = core([])
    stop = StopAsked.of(State.SUCCEEDED, "measured until sure: ...")
    run = s.adopt(experiment("sure", ds_config=SURE), 1, {"h": [0]}, since=0.0, stop=stop)
    assert s.step([], 1.0).stop == [Stop(run, State.SUCCEEDED, "measured until sure: ...", Reason.SURE)]
    s.step([Finished(run, Outcome(State.INTERRUPTED, Reason.INTERRUPTED, "killed", -9,
                                  measured=reading(7.0, 0.01)), 2.0)], 2.0)
    assert s.record.finished == {("sure", 1): (State.SUCCEEDED, 2.0)} and s.record.metrics[("sure", 1)][
        "throughput"] == 7.0


def test_a_sure_end_whose_steps_cannot_be_read_back_is_a_metrics_failure_never_a_success_without_a_value():
    settled = StopAsked.of(State.SUCCEEDED, "measured until sure").settle(Outcome(State.FAILED, Reason.EXIT))
    assert settled.state == State.SUCCEEDED and settled.metrics is None
    failed = with_measured_metric(settled, "throughput")
    assert (failed.state, failed.reason) == (State.FAILED, Reason.METRICS)
    ran = Outcome(State.SUCCEEDED, metrics={"throughput": 3.0})  # it wrote its metrics before the stop came
    assert StopAsked.of(State.SUCCEEDED, "x").settle(ran) is ran and with_measured_metric(ran, "throughput") is ran


# --- the keys and options that ask it ------------------------------------------------------------------------------

def write_config(tmp_path, section):
    (tmp_path / "train.py").write_text("# stand-in: the launcher never runs it\n")
    ds = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": [1, 2]},
          "autotuning": {"enabled": True, "max_train_micro_batch_size_per_gpu": 8} | section}
    (tmp_path / "ds.json").write_text(json.dumps(ds, indent=1))
    return tmp_path / "ds.json"


def tune(tmp_path, *options):
    return autotune("tune", *options, "--slots", "1", "-o", tmp_path / "results", "--launcher", f"sh {STANDIN}",
                    "train.py", "--deepspeed_config", "ds.json", environ=env(OOM_STANDIN_LOG=tmp_path / "launches.log"),
                    cwd=tmp_path, timeout=60)


def line_of(path, key):
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if f'"{key}"' in line)


@pytest.mark.parametrize(("section", "key", "fragment"), [
    ({"tolerance": 0}, "tolerance", "between 0 and 1"),
    ({"tolerance": 1.5}, "tolerance", "not 1.5"),
    ({"tolerance": -0.1}, "tolerance", "not -0.1"),
    ({"tolerance": "3%"}, "tolerance", "not '3%'"),
    ({"tolerance": True}, "tolerance", "not true"),
    ({"max_measured_steps": SURE_STEPS - 1}, "max_measured_steps", f"at least {SURE_STEPS}"),
    ({"max_measured_steps": -5}, "max_measured_steps", "not -5"),
    ({"max_measured_steps": 12.5}, "max_measured_steps", "not 12.5"),
    ({"max_measured_steps": "20"}, "max_measured_steps", "not '20'"),
    ({"max_measured_steps": 10 ** 9 + 1}, "max_measured_steps", "at most 1,000,000,000, not 1000000001"),
    ({"max_measured_steps": 20, "end_profile_step": 30}, "max_measured_steps", "both bound the profile window"),
    ({"tolerance": 0.05, "end_profile_step": 11}, "end_profile_step", "leaves 8 measured step(s)"),
])
def test_a_bad_key_of_measuring_until_sure_is_refused_at_its_line_and_nothing_runs(tmp_path, section, key,
                                                                                  fragment):
    path = write_config(tmp_path, section)
    refused(tune(tmp_path), f"{path}:{line_of(path, key)}:", key, fragment)
    assert not (tmp_path / "launches.log").exists() and not (tmp_path / "results").exists()


@pytest.mark.parametrize(("options", "fragment"), [
    (("--tolerance", "2"), "--tolerance must be a fraction between 0 and 1"),
    (("--tolerance", "0"), "not '0'"),
    (("--tolerance", "nan"), "not 'nan'"),
    (("--tolerance", "soon"), "not 'soon'"),
    (("--max-measured-steps", str(SURE_STEPS - 1)), f"below the {SURE_STEPS} measured steps"),
    (("--max-measured-steps", str(10 ** 9 + 1)), "--max-measured-steps 1000000001 is above 1,000,000,000"),
    (("--max-measured-steps", str(10 ** 30)), "is above 1,000,000,000"),
])
def test_a_bad_option_of_measuring_until_sure_is_refused_in_one_line(tmp_path, options, fragment):
    write_config(tmp_path, {})
    refused(tune(tmp_path, *options), fragment)
    assert not (tmp_path / "launches.log").exists() and not (tmp_path / "results").exists()


def engine_sections(directory):
    with Ledger.open(directory) as ledger:
        return {e.name: e.ds_config.get("autotuning") for e in ledger.experiments()}


@pytest.mark.parametrize(("section", "options", "expected"), [
    ({}, (), {"start_profile_step": 3, "end_profile_step": 33, "tolerance": 0.03}),  # the default: until sure
    ({"end_profile_step": 9}, (), {"end_profile_step": 9}),  # a window the config fixed is kept
    ({"end_profile_step": 19, "tolerance": 0.1}, (), {"start_profile_step": 3, "end_profile_step": 19,
                                                    "tolerance": 0.1}),
    ({"tolerance": None}, (), None),  # null: the fixed window, DeepSpeed's default
    ({"max_measured_steps": 10}, ("--tolerance", "0.2"), {"start_profile_step": 3, "end_profile_step": 13,
                                                         "tolerance": 0.2}),
    ({"max_measured_steps": 2e1}, (), {"start_profile_step": 3, "end_profile_step": 23, "tolerance": 0.03}),
    # A metric DeepSpeed's per-step lines do not measure: by default its runs keep DeepSpeed's window (nothing
    # would end them before 30 steps); measured until sure only where asked (its script writes its steps).
    ({"metric": "latency"}, (), None),
    ({"metric": "FLOPS_per_gpu"}, (), None),
    ({"tolerance": 0.1}, ("--tolerance", "off"), None),
    ({"end_profile_step": 9}, ("--max-measured-steps", "12"), {"start_profile_step": 3, "end_profile_step": 15,
                                                              "tolerance": 0.03}),
])
def test_each_experiment_carries_the_window_and_tolerance_the_config_and_options_ask(tmp_path, section, options,
                                                                                    expected):
    write_config(tmp_path, section)
    done = tune(tmp_path, "--confirm", "0", *options)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {json.dumps(s, sort_keys=True) for s in engine_sections(tmp_path / "results").values()} == {
        json.dumps(expected, sort_keys=True)}


# --- through the command line: `autotune tune` on the stand-in, its steps noisy ---------------------------------

def setup_tune(tmp_path, **extra):
    write_config(tmp_path, {"max_train_micro_batch_size_per_gpu": 64, "tolerance": 0.02})
    (tmp_path / "ds.json").write_text((tmp_path / "ds.json").read_text().replace('"stage": [\n   1,\n   2\n  ]',
                                                                                 '"stage": [1, 2, 3]'))
    return env(OOM_STANDIN_LOG=tmp_path / "launches.log", OOM_STANDIN_STEPS="16 0.05",
               OOM_STANDIN_STEP_NOISE="0.01 7", AUTOTUNE_PROGRESS_POLL="0.1", **extra)


TUNE = ("tune", "--slots", "3", "--launcher", f"sh {STANDIN}")
SCRIPT = ("train.py", "--deepspeed_config", "ds.json")


def check_sure(directory, most, slack=1.0):
    """Every run that succeeded either ended once sure, recorded with its steps' mean and interval as they were
    judged sure (within the tolerance; `slack` times it where a runner that took the run over recorded all the steps
    it made), or measured to its window's end; every first run ran once. Returns the names ended once sure."""
    ended = latest(directory)
    early = set()
    for name, a in ended.items():
        if a.state != State.SUCCEEDED:
            continue
        low, high, value = a.metrics["throughput_low"], a.metrics["throughput_high"], a.metric
        assert low <= value <= high, a
        if a.detail and a.detail.startswith("measured until sure"):
            early.add(name)
            assert a.reason is None and (high - low) / 2 / value <= 0.02 * slack + 1e-9, a
            assert SURE_STEPS <= a.metrics["steps_measured"] < most, a
        else:
            assert a.metrics["steps_measured"] == most, a  # its engine ended it: never sure before
    with Ledger.open(directory) as ledger:
        assert all(a.attempt == 1 for a in ledger.attempts() if a.name in early)
    return early


def check_saved(directory, runs):
    """What ending runs once sure (and, in a tune, stopping those that could not win) saved, as status and report
    say it, against the ledger's rows worked out by hand: each run's measured steps short of its window's (at most 30
    past start_profile_step 3: one count, spec/progress.py `Window`) at its median step time, on its one slot.
    `runs`: how many ended early (None: some)."""
    with Ledger.open(directory) as ledger:
        rows = ledger._db.execute("SELECT m.steps, m.step_time FROM attempts a JOIN measures m USING (name, attempt) "
                                  "LEFT JOIN stops s USING (name, attempt) WHERE a.state = 'stopped' OR "
                                  "(a.state = 'succeeded' AND s.reason = 'sure')").fetchall()
    expected = sum(max(30 - steps, 0) * step for steps, step in rows) / 3600
    assert (len(rows) == runs if runs is not None else rows) and expected > 0
    report = json.loads(autotune("report", directory, "--format", "json").stdout)
    assert report["gpu_hours"]["saved"] == round(expected, 6)
    assert f"about {expected:,.4g} saved by stopping (estimated)" in autotune("status", directory).stdout


def test_a_tune_ends_runs_once_sure_as_succeeded_and_names_the_same_best(tmp_path):
    environ = setup_tune(tmp_path)
    done = autotune(*TUNE, "-o", tmp_path / "res", *SCRIPT, environ=environ, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "best: train_z3_mbs45 with throughput" in done.stdout  # as the fixed-step tune names it
    assert check_sure(tmp_path / "res", 30)
    check_saved(tmp_path / "res", None)
    fixed = autotune(*TUNE, "-o", tmp_path / "fixed", "--tolerance", "off", *SCRIPT, environ=environ,
                     cwd=tmp_path, timeout=300)
    assert fixed.returncode == 0 and "best: train_z3_mbs45 with throughput" in fixed.stdout, fixed.stdout
    assert not any(a.detail and "until sure" in a.detail for a in latest(tmp_path / "fixed").values())
    assert json.loads(autotune("report", tmp_path / "fixed", "--format", "json").stdout)["gpu_hours"]["saved"] == 0


def test_a_kill_9_during_an_until_sure_end_then_resume_reads_it_as_the_success_it_was(tmp_path, runners):
    """A run ended once sure takes a second to end (its SIGTERM handled), so the runner is killed while it ends:
    the run is neither a failure nor run again."""
    environ = setup_tune(tmp_path, OOM_STANDIN_TERM_SECONDS="1")
    out = tmp_path / "res"
    proc = runners.start(*TUNE, "-o", out, "--confirm", "0", *SCRIPT, environ=environ, cwd=tmp_path, directory=out)
    seen = {}

    def ending():
        if not (out / "ledger.sqlite").exists():
            return False
        with Ledger.open(out) as ledger:
            seen.update({key: ended for key, ended in ledger.stops_asked().items() if ended[0] == State.SUCCEEDED})
        return bool(seen)

    kill_9_once(proc, ending, timeout=240)
    resumed = autotune("resume", out, environ=environ, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    ended = latest(out)
    for name, attempt in seen:
        assert (ended[name].attempt, ended[name].state) == (attempt, State.SUCCEEDED), ended[name]
        assert ended[name].metric  # as its stop recorded it, or its own end where that came first (no failure)
        assert ended[name].detail is None or ended[name].detail.startswith("measured until sure")
    assert check_sure(out, 30, slack=2.0) >= {name for name, _ in seen}
    ran = Counter((tmp_path / "launches.log").read_text().splitlines())
    assert [line for line, n in ran.items() if n > 1] == []  # nothing ran twice
    assert tagged_pids(sweep_id(out)) == []


# --- `run` sweeps: an experiment whose config asks a tolerance ---------------------------------------------------

STEPPING = PREAMBLE + """\
i=1
p="$AUTOTUNE_PROGRESS_PATH"
while [ $i -le 60 ]; do
  sleep 0.05
  printf '{"step": %d, "time": %s, "throughput": %d}\\n' $i "$(date +%s.%N)" $((100 + i % 2)) >> "$p"
  i=$((i + 1))
done
printf '{"throughput": 100.5}\\n' > "$AUTOTUNE_METRICS_PATH"
"""


def run_sweep(tmp_path, autotuning):
    (tmp_path / "train.py").touch()
    path = tmp_path / "sweep.hjson"
    path.write_text("{\n  name: p\n  script: train.py\n"
                    f"  ds_config: {{train_micro_batch_size_per_gpu: 1, autotuning: {autotuning}}}\n"
                    "  space: {x: [1, 2]}\n}\n")
    return path


def test_a_run_sweeps_experiment_whose_config_asks_a_tolerance_is_measured_until_sure(tmp_path):
    launcher = write_launcher(tmp_path, STEPPING)
    done = autotune("run", run_sweep(tmp_path, "{tolerance: 0.05}"), "--results", tmp_path / "res", "--launcher",
                    launcher, "--slots", "2", environ=env(LAUNCH_LOG=tmp_path / "launches.log",
                                                          AUTOTUNE_PROGRESS_POLL="0.1"))
    assert done.returncode == 0, done.stdout + done.stderr
    for a in latest(tmp_path / "res").values():
        assert a.state == State.SUCCEEDED and a.detail.startswith("measured until sure"), a
        assert SURE_STEPS <= a.metrics["steps_measured"] < 60 and a.metric == pytest.approx(100.5, rel=0.01)
    check_saved(tmp_path / "res", 2)


@pytest.mark.parametrize(("autotuning", "fragment"), [
    ("{tolerance: 2}", "autotuning.tolerance must be a fraction between 0 and 1 (0.03: within 3% of the mean), not 2"),
    ("{tolerance: \"tight\"}", "not 'tight'"),
    ("{tolerance: 0.05, end_profile_step: 8}", "end_profile_step 8 leaves 5 measured step(s)"),
    # Keys that were ignored: the run measured 30 steps, or its engine never reached a window's end it cannot equal.
    ("{max_measured_steps: 12}", "autotuning.max_measured_steps bounds a run measured until sure: give "
                                 "autotuning.tolerance too"),
    ("{tolerance: 0.05, max_measured_steps: \"x\"}", "autotuning.max_measured_steps must be a whole number from 9"),
    ("{tolerance: 0.05, max_measured_steps: 8}", "from 9 to 1,000,000,000, not 8"),
    ("{tolerance: 0.05, max_measured_steps: 12, end_profile_step: 30}", "both bound the profile window"),
    ("{tolerance: 0.05, end_profile_step: 1e30}", "autotuning.end_profile_step must be a whole number from 0"),
    ("{tolerance: 0.05, end_profile_step: 12.5}", "not 12.5"),
    ("{tolerance: 0.05, start_profile_step: \"a\"}", "autotuning.start_profile_step must be a whole number"),
])
def test_a_run_sweeps_bad_tolerance_is_refused_at_its_line(tmp_path, autotuning, fragment):
    path = run_sweep(tmp_path, autotuning)
    refused(autotune("run", path, "--results", tmp_path / "res", "--slots", "1"), f"{path}:4:",
            "experiment p_x1", fragment)
    assert not (tmp_path / "res").exists()


def test_a_run_sweeps_max_measured_steps_bounds_the_window_its_engine_profiles(tmp_path):
    launcher = write_launcher(tmp_path, STEPPING)
    done = autotune("run", run_sweep(tmp_path, "{tolerance: 0.05, max_measured_steps: 12}"), "--results",
                    tmp_path / "res", "--launcher", launcher, "--slots", "2",
                    environ=env(LAUNCH_LOG=tmp_path / "launches.log", AUTOTUNE_PROGRESS_POLL="0.1"))
    assert done.returncode == 0, done.stdout + done.stderr
    for name in latest(tmp_path / "res"):
        section = json.loads((tmp_path / "res" / name / "ds_config.json").read_text())["autotuning"]
        assert (section["start_profile_step"], section["end_profile_step"]) == (3, 15), section


# --- `autotune plan`: the steps a run measured until sure makes, from the measured step spread -------------------

STEPS_STANDIN = ROOT / "tests" / "steps_standin.py"


def steps_sweep(tmp_path, name, sizes, autotuning):
    exps = [experiment(f"mbs{m}", script=str(STEPS_STANDIN), env={"STEPS_PROGRESS": "1", "STEPS_NOISE": "0.04",
                                                                  "STEPS_STARTUP": "0.1", "STEPS_PER_SAMPLE": "0.005"},
                       ds_config={"train_micro_batch_size_per_gpu": m, "autotuning": autotuning}) for m in sizes]
    sweep = autotuner.Sweep(name=name, experiments=tuple(exps), metric=autotuner.metric_named("throughput"),
                            source="test")
    return autotuner.prepare(sweep, autotuner.load_cluster(slots=2), tmp_path / name,
                             launcher=[sys.executable, str(STEPS_STANDIN)]), exps


def test_plan_predicts_the_steps_of_runs_measured_until_sure_from_the_measured_step_spread(tmp_path):
    past, _ = steps_sweep(tmp_path, "fixed", [1, 2], {"end_profile_step": 29})  # 30 noisy steps each
    assert autotuner.execute(past, autotuner.Options(grace=1.0)).exit_code == 0
    with Ledger.open(past) as ledger:
        spreads = sorted(t.interval.step_spread for t in ledger.measures().values())
    sure_of = {"tolerance": 0.03, "end_profile_step": 43}  # at most 40 measured steps
    _, exps = steps_sweep(tmp_path, "sure", [1, 2, 4], sure_of)
    plan = autotuner.plan_sweep(exps, {"h": [0, 1]}, past=past)
    expected = [min(steps_needed(s, 0.03, 40) + 4, 44) for s in spreads]
    sure = plan.durations.until_sure
    assert (sure.fewest, sure.most, sure.spread) == (expected[0], expected[-1], statistics.median(spreads))
    assert sure.fewest <= sure.median <= sure.most
    assert plan.durations.parts["mbs4"].steps == min(steps_needed(statistics.median(spreads), 0.03, 40) + 4, 44)
    assert plan.durations.parts["mbs4"].steps < 44  # fewer than the window: the spread measured needs fewer
    text = autotuner.render_plan(plan)
    assert f"measured until sure: {expected[0]} to {expected[-1]} steps a run" in text
    alone = autotuner.plan_sweep(exps, {"h": [0, 1]}).durations.until_sure
    assert alone == SureSteps(44, 44, 44, None)  # nothing measured: the window's end
    assert "measured until sure: up to 44 steps a run" in autotuner.render_plan(
        autotuner.plan_sweep(exps, {"h": [0, 1]}))
