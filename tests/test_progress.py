"""Per-step progress (spec/progress.py) and what it says (spec/interval.py): the progress file's protocol,
DeepSpeed's own throughput lines, the measured window, the trimmed mean with its winsorized batch-means interval,
and start-up and step time recorded apart in the ledger and shown in every report format."""
import json
import math
import random
import re
import statistics
import time

import pytest

from autotuner.backends.exitstatus import judge_files
from autotuner.ledger.store import Ledger
from autotuner.spec import progress
from autotuner.spec.followed import FollowedSteps
from autotuner.spec.interval import Interval, RunTimes, batch_means, measure, measured_run
from autotuner.spec.metrics import metric_named
from autotuner.spec.progress import PROGRESS_FILE, TrainStep, Window, from_deepspeed_log, from_progress_file, read_steps
from autotuner.spec.sure import sure

from cli_rig import PREAMBLE, autotune, env, write_launcher, write_sweep

THROUGHPUT = metric_named("throughput")


def write_lines(path, lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))


def test_the_progress_file_keeps_whole_step_lines_in_step_order(tmp_path):
    """Bad lines of every kind are skipped, not fatal: not JSON, a half-written last line, no object, a step that
    is no whole number >= 0 (a bool, a float, negative), a time that is no finite positive number, a value that is
    no finite number >= 0 (kept as a step without a value); a repeated step keeps its last line."""
    path = tmp_path / PROGRESS_FILE
    write_lines(path, [
        {"step": 2, "time": 102.0, "throughput": 20},
        "not json", "[1, 2]", '{"step": 9, "time": 1',
        {"step": True, "time": 1.0}, {"step": 1.5, "time": 1.0}, {"step": -1, "time": 1.0},
        {"step": 5, "time": "soon"}, {"step": 6, "time": 0}, {"step": 7},
        {"step": 3, "time": 103.0, "throughput": -1}, {"step": 4, "time": 104.0, "throughput": "fast"},
        '{"step": 1, "time": 101.0, "throughput": NaN}',
        {"step": 2, "time": 102.5, "throughput": 25},
    ])
    assert from_progress_file(path, "throughput") == [
        TrainStep(1, 101.0, None), TrainStep(2, 102.5, 25.0), TrainStep(3, 103.0, None), TrainStep(4, 104.0, None)]


def test_odd_progress_files_are_no_steps_and_never_block(tmp_path):
    """Missing, a directory, a FIFO with no writer (would block a plain open), binary garbage."""
    import os
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    (tmp_path / "garbage").write_bytes(bytes(range(256)) * 10)
    for name in ("missing", "fifo", "dir", "garbage"):
        assert from_progress_file(tmp_path / name, "throughput") == []


DS_LINE = ("[{stamp},{ms:03d}] [INFO] [timer.py:264:stop] epoch=0/micro_step={n}/global_step={n}, "
           "RunningAvgSamplesPerSec=99.0, CurrSamplesPerSec={v}, MemAllocated=0.0GB, MaxMemAllocated=0.0GB")


def ds_line(step, at, value):
    return DS_LINE.format(stamp=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)), ms=int(at * 1000) % 1000,
                          n=step, v=value)


def test_a_deepspeed_line_read_half_written_is_no_step_until_its_value_is_whole(tmp_path):
    """The step reader reads logs as they grow: a line cut inside its value ("=18" of 1834.2) would read as a run
    at a hundredth of its rate, and stop it as outclassed. Its value counts once the comma after it is written."""
    t0 = int(time.time())
    whole = ds_line(4, t0 + 1.5, 1834.2)
    torn = whole[:whole.index("CurrSamplesPerSec=18") + len("CurrSamplesPerSec=18")]
    assert [(s.step, s.value) for s in from_deepspeed_log(ds_line(3, t0 + 0.25, 1830.0) + "\n" + torn)] == \
        [(3, 1830.0)]
    (tmp_path / "stdout.log").write_text(ds_line(3, t0 + 0.25, 1830.0) + "\n" + torn)
    followed = FollowedSteps(tmp_path, "throughput")  # as the runner reads a running attempt's files
    assert [(s.step, s.value) for s in followed.read(Window(2))[0]] == [(3, 1830.0)]
    with open(tmp_path / "stdout.log", "a") as log:
        log.write(whole[len(torn):] + "\n")
    assert [(s.step, s.value) for s in followed.read(Window(2))[0]] == [(3, 1830.0), (4, 1834.2)]


def test_deepspeed_throughput_lines_are_steps_read_when_there_is_no_progress_file(tmp_path):
    t0 = int(time.time())
    log = "\n".join(["[2026-11-28 21:24:44,478] [INFO] [engine.py:1:init] something else",
                     ds_line(3, t0 + 0.25, 100.5), "noise", ds_line(4, t0 + 1.5, 98.0),
                     ds_line(5, t0 + 2.75, "nan")])
    steps = from_deepspeed_log(log)
    assert [(s.step, s.value) for s in steps] == [(3, 100.5), (4, 98.0)]  # step 5's "nan" is no measure
    assert steps[0].at == pytest.approx(t0 + 0.25) and steps[1].at == pytest.approx(t0 + 1.5)
    (tmp_path / "stdout.log").write_text(log)
    assert read_steps(tmp_path, "throughput", Window(2)) == (steps, steps)  # numbered by the steps made
    assert read_steps(tmp_path, "throughput", Window(3)) == (steps, steps[1:])
    assert read_steps(tmp_path, "tokens_per_s", Window(2)) == ([], [])  # its lines are throughput only
    write_lines(tmp_path / PROGRESS_FILE, [{"step": 1, "time": 5.0}])
    assert read_steps(tmp_path, "throughput", Window(0)) == ([TrainStep(1, 5.0)],) * 2  # the script's own file wins


def test_a_line_cut_by_the_bytes_a_read_keeps_is_no_line(tmp_path, monkeypatch):
    """A file longer than a read keeps (MAX_BYTES from its end): the line those bytes start inside is not read,
    though its end alone reads as a step (spec/followed.py reads as much as the whole read)."""
    line = 'junk {"step": 7, "time": 5.0}'
    write_lines(tmp_path / PROGRESS_FILE, [line, {"step": 8, "time": 6.0}])
    size = (tmp_path / PROGRESS_FILE).stat().st_size
    monkeypatch.setattr(progress, "MAX_BYTES", size - len("junk "))  # they start at its `{`
    assert read_steps(tmp_path, "throughput", Window(0))[0] == [TrainStep(8, 6.0)]
    monkeypatch.setattr(progress, "MAX_BYTES", size - len(line) - 1)  # they start at the next line: it is read
    assert read_steps(tmp_path, "throughput", Window(0))[0] == [TrainStep(8, 6.0)]
    monkeypatch.setattr(progress, "MAX_BYTES", size)
    assert read_steps(tmp_path, "throughput", Window(0))[0] == [TrainStep(8, 6.0)]


def test_a_throughput_line_is_one_line():
    """A line feed inside what would be DeepSpeed's throughput line: no step (its end was read with it before)."""
    t0 = int(time.time())
    broken = ds_line(5, t0 + 1.0, 99.0).replace("RunningAvgSamplesPerSec=", "RunningAvgSamplesPerSec=1\nx")
    log = "\n".join([ds_line(4, t0 + 0.5, 98.0), broken, ds_line(6, t0 + 1.5, 97.0)])
    assert [s.step for s in from_deepspeed_log(log)] == [4, 6]


def test_the_interval_is_the_trimmed_mean_with_batch_means_of_the_winsorized_steps():
    """16 values: 2 cut at each end for the mean; winsorized (1, 2 -> 3 and 15, 16 -> 14) into 4 batches of 4, whose
    spread over 1 - 2 x 2/16 makes the half-width (Tukey and McLaughlin's, with batch means)."""
    values = [100.0 + v for v in range(1, 17)]
    interval = batch_means(values)
    means = [103.25, 106.5, 110.5, 113.75]
    spread = 3.182 * statistics.stdev(means) / 2 / (1 - 4 / 16)
    assert interval == pytest.approx(Interval(108.5, 108.5 - spread, 108.5 + spread, 16, 4))
    assert batch_means([1.0]) is None and batch_means([]) is None
    assert batch_means([5.0, 5.0, 5.0]).half_width == 0


def test_a_few_huge_stalls_leave_the_value_at_the_typical_step_and_the_interval_bounded():
    """A loaded machine: 3 of 40 steps stall for 50 typical steps each (the README's example under a test suite:
    5 of 30 steps held half a run's time). The plain mean of the step times read the run at a fifth of its rate,
    its interval as wide as a stall; the trimmed mean reads it at its typical rate (within the 2% noise), and the
    interval is narrow enough to be sure at 3%."""
    rng = random.Random(7)
    rates = [1000.0 * (1 + rng.gauss(0, 0.02)) for _ in range(40)]
    for stalled in (9, 22, 31):
        rates[stalled] = 20.0
    steps = [TrainStep(n, 100.0 + n, rate) for n, rate in enumerate(rates)]
    reading = measure(steps, steps, rate=True)
    assert reading.interval.mean == pytest.approx(1000, rel=0.02)
    assert reading.interval.low < 1000 < reading.interval.high and reading.interval.half_width < 0.03
    assert sure(reading, 0.03) is not None


def test_batch_means_widens_for_steps_that_drift_where_an_iid_interval_would_not_cover():
    """Steps in slow and fast stretches (an AR(1) around 100): over many seeds, the batch-means interval covers
    the true mean far more often than the i.i.d. t-interval over the steps, which is too narrow."""
    covered_bm = covered_iid = 0
    trials = 200
    for seed in range(trials):
        rng = random.Random(seed)
        x, values = 0.0, []
        for _ in range(400):
            x = 0.9 * x + rng.gauss(0, 1)
            values.append(100 + x)
        interval = batch_means(values)
        covered_bm += interval.low <= 100 <= interval.high
        half = 1.966 * statistics.stdev(values) / math.sqrt(len(values))
        covered_iid += abs(statistics.fmean(values) - 100) <= half
    assert covered_bm / trials > 0.85 > 0.5 > covered_iid / trials


def test_measure_leaves_warm_up_out_and_says_start_up_and_step_time():
    steps = [TrainStep(1, 110.0, 5.0), TrainStep(2, 111.0, 50.0)] + [TrainStep(n, 111.0 + (n - 2) * 0.5, 100.0 + n % 2)
                                                           for n in range(3, 13)]
    m = measure(steps, Window(2).placed(steps))
    assert m.first_at == 110.0 and m.steps == 10 and m.step_seconds == 0.5  # the measured steps: one count
    assert m.interval.n == 10 and 99 < m.interval.low < m.interval.mean < m.interval.high < 102
    assert m.startup(100.0) == 10.0 and m.startup(None) is None and m.startup(120.0) is None
    assert measure([], []) is None
    few = measure(steps[:2], [])  # none measured yet: its start-up and step time, no interval
    assert (few.steps, few.step_seconds, few.interval) == (0, 1.0, None)


def test_a_judged_run_carries_what_its_steps_said(tmp_path):
    (tmp_path / "metrics.json").write_text('{"throughput": 100}')
    write_lines(tmp_path / PROGRESS_FILE, [{"step": n, "time": 1000.0 + n, "throughput": 100 + n % 3}
                                           for n in range(1, 11)])
    outcome = judge_files(0, tmp_path, THROUGHPUT)
    assert outcome.state == "succeeded" and outcome.measured.steps == 6 and outcome.measured.step_seconds == 1.0
    assert judge_files(0, tmp_path / "none", THROUGHPUT).measured is None


# One stand-in that writes a progress line per step: the start-up sleep, then STEPS steps of STEP seconds.
STEPPING = PREAMBLE + """\
progress="$AUTOTUNE_PROGRESS_PATH"
sleep 0.3
i=1
while [ $i -le 6 ]; do
  sleep 0.05
  printf '{"step": %d, "time": %s, "throughput": %d}\\n' $i "$(date +%s.%N)" $((100 + i % 2)) >> "$progress"
  i=$((i + 1))
done
printf '{"throughput": 100.5}\\n' > "$AUTOTUNE_METRICS_PATH"
"""


def test_a_sweep_records_start_up_and_step_time_apart_and_every_report_shows_the_interval(tmp_path):
    """Through the runner: the stand-in's steps are read when it ends, the ledger's `measures` row holds start-up
    (at least the stand-in's 0.3 s before its first step) apart from the step time, and the report shows the
    interval (throughput_low, throughput_high) in its JSON and CSV."""
    sweep = write_sweep(tmp_path, [1, 2], name="p")
    out = tmp_path / "out"
    launcher = write_launcher(tmp_path, STEPPING)
    done = autotune("run", sweep, "--results", out, "--launcher", launcher, "--slots", "2",
                    environ=env(LAUNCH_LOG=tmp_path / "launches.log"))
    assert done.returncode == 0, done.stderr
    assert re.search(r"best: p_x\d with throughput 100.5 \(95% interval [\d.]+ to [\d.]+ over 2 steps\)",
                     done.stdout), done.stdout
    status = json.loads(autotune("status", out, "--format", "json").stdout)["gpu_hours"]
    assert status["spent"] > 2 * 0.6 / 3600 and 0 < status["to_best"] <= status["spent"]  # two runs of > 0.6 s
    shown = autotune("status", out).stdout
    assert "GPU-hours: " in done.stdout and "GPU-hours: " in shown and "(95% interval " in shown
    with Ledger.open(out) as ledger:
        timings = ledger.measures()
        ledger.measured("p_x1", 2, RunTimes(None, None, 3, Interval(50.0, 40.0, math.inf, 3, 2)))
        assert ledger.measures()[("p_x1", 2)] == RunTimes(None, None, 3, Interval(50.0, 40.0, math.inf, 3, 2))
        # Read back with its batches (5 of 30 steps), so the step spread `plan` predicts from is the one measured
        ledger.measured("p_x2", 2, RunTimes(1.0, 0.1, 30, batch_means([100.0 + (i % 7) for i in range(30)])))
        again = ledger.measures()[("p_x2", 2)].interval
        assert again == batch_means([100.0 + (i % 7) for i in range(30)]) and again.batches == 5
    assert set(timings) == {("p_x1", 1), ("p_x2", 1)}
    for timing in timings.values():
        # Its window: DeepSpeed's default, start_profile_step 3, end_profile_step 5: the steps after the fourth
        assert timing.steps == 2 and timing.startup >= 0.3 and 0 < timing.step_seconds < timing.startup
        assert timing.interval.low <= timing.interval.mean <= timing.interval.high
        assert timing.interval.mean == pytest.approx(100.5, rel=1e-3)  # steps 5-6: 101, 100 samples/s
    report = json.loads(autotune("report", out, "--format", "json").stdout)
    row = report["experiments"][0]["metrics"]
    assert row["throughput_low"] <= row["throughput_high"] and row["steps_measured"] == 2
    assert row["startup_s"] >= 0.3
    csv = autotune("report", out, "--format", "csv").stdout.splitlines()[0].split(",")
    assert {"throughput_low", "throughput_high", "startup_s", "step_s"} <= set(csv)
    assert autotune("report", out, "--html", tmp_path / "r.html").returncode == 0
    page = (tmp_path / "r.html").read_text()
    assert "95% interval" in page and "throughput_low" in page


def test_one_count_the_steps_measured_are_the_windows_the_interval_uses(tmp_path):
    """DeepSpeed prints steps 3 to end_profile_step + 1 (its timer none of the first two; the engine ends the run
    after the last): 3 is warm-up and 4 the step its flops profiler runs in, before the window; the steps measured
    are the end_profile_step - start_profile_step after them (30 for start 3, end 33), the interval's count too.
    A progress file's first start_profile_step + 1 steps likewise, by their places (all after them: a script that
    is no DeepSpeed engine runs as long as it runs)."""
    t0 = int(time.time())
    (tmp_path / "stdout.log").write_text("\n".join(ds_line(n, t0 + n * 0.2, 100 + n % 3) for n in range(3, 35)))
    (tmp_path / "ds_config.json").write_text(json.dumps({"autotuning": {"enabled": True, "start_profile_step": 3,
                                                                        "end_profile_step": 33}}))
    (tmp_path / "metrics.json").write_text('{"throughput": 45}')
    measured = judge_files(0, tmp_path, THROUGHPUT).measured
    assert measured.steps == measured.interval.n == 30
    window = Window.of({"autotuning": {"start_profile_step": 3, "end_profile_step": 33}})
    assert window == Window(4, 30) and Window.of({}) == Window(4, None)
    assert Window.of({"autotuning": {"start_profile_step": True, "end_profile_step": 2}}) == Window(4, None)
    write_lines(tmp_path / PROGRESS_FILE, [{"step": n, "time": 1000.0 + n, "throughput": 100} for n in range(40)])
    assert measured_run(tmp_path, "throughput", window).steps == 36  # steps 4 to 39 of 0 to 39


def test_a_rate_is_averaged_as_work_over_time():
    """Samples/s over steps: the run's throughput is its samples over its time, the harmonic mean of the steps'
    rates (DeepSpeed's metric is its batch over the mean step time), not their plain mean."""
    steps = [TrainStep(n, float(n), 100.0 if n % 2 else 50.0) for n in range(1, 41)]
    interval = measure(steps, steps, rate=True).interval
    assert interval.mean == pytest.approx(200 / 3) and interval.low < 200 / 3 < interval.high
    assert measure(steps, steps).interval.mean == pytest.approx(75)
    zero = [TrainStep(1, 1.0, 0.0), TrainStep(2, 2.0, 5.0)]
    assert measure(zero, zero, rate=True).interval is None


@pytest.mark.parametrize("tolerance", [0.03, None])
def test_a_run_measured_until_sure_is_ranked_by_its_steps_mean_even_when_it_reached_its_windows_end(tmp_path,
                                                                                                   tolerance):
    """DeepSpeed's engine writes the trimmed mean of its forward, backward and step timers, another span of each
    step than its per-step lines: a run measured until sure that reached its window's end (metrics file written)
    is ranked by its steps' mean as one ended once sure is, DeepSpeed's figure kept as throughput_engine; a run of a
    fixed window keeps DeepSpeed's figure, its interval beside it."""
    section = {"enabled": True, "end_profile_step": 40, **({"tolerance": tolerance} if tolerance else {})}
    (tmp_path / "ds_config.json").write_text(json.dumps({"autotuning": section}))
    (tmp_path / "metrics.json").write_text('{"throughput": 188}')
    write_lines(tmp_path / PROGRESS_FILE, [{"step": n, "time": 1000.0 + n, "throughput": 750 + 10 * (n % 2)}
                                           for n in range(1, 31)])
    metrics = judge_files(0, tmp_path, THROUGHPUT).metrics
    if tolerance:
        assert 750 < metrics["throughput"] < 760 and metrics["throughput_engine"] == 188
        assert metrics["throughput_low"] < metrics["throughput"] < metrics["throughput_high"] < 760
    else:
        assert metrics == {"throughput": 188}


@pytest.mark.parametrize("tolerance", [0.03, None])
def test_an_autotp_runs_interval_is_over_its_tp_size_as_its_throughput_is(tmp_path, tolerance):
    """DeepSpeed counts each sample once per TP rank, in its per-step lines as in its metrics file: at autotp_size
    2 the throughput recorded is its figure over 2, and so are its steps' mean, their interval (the report's
    columns and the ledger's `measures`) and the engine's figure beside them: one scale."""
    section = {"enabled": True, "end_profile_step": 40, **({"tolerance": tolerance} if tolerance else {})}
    (tmp_path / "ds_config.json").write_text(json.dumps({"autotuning": section, "tensor_parallel": {"autotp_size": 2}}))
    (tmp_path / "exp.json").write_text(json.dumps({"num_gpus": 4}))
    (tmp_path / "metrics.json").write_text('{"throughput": 1600}')
    write_lines(tmp_path / PROGRESS_FILE, [{"step": n, "time": 1000.0 + n, "throughput": 1500 + 20 * (n % 2)}
                                           for n in range(30)])
    outcome = judge_files(0, tmp_path, THROUGHPUT)
    interval, metrics = outcome.measured.interval, outcome.metrics
    assert 750 < interval.low < interval.mean < interval.high < 760  # the steps' 1,500-1,520 over 2
    if tolerance:
        assert metrics["throughput"] == interval.mean and metrics["throughput_engine"] == 800
        assert (metrics["throughput_low"], metrics["throughput_high"]) == (interval.low, interval.high)
    else:
        assert metrics["throughput"] == 800 and "throughput_low" not in metrics
    assert metrics["throughput_deepspeed"] == 1600 and metrics["throughput_per_gpu"] == metrics["throughput"] / 4
