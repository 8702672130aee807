"""Per-step progress against what a script may write that nobody here wrote: any finite number as a step's value
(near a float's largest, subnormal), step numbers past any real run's, a DeepSpeed line whose step has thousands of
digits. None of it may stop the step reader or fail a run: the steps that can be read say what they say."""
import json
import math
import re
import sys

import pytest

from autotuner.ledger.store import Ledger
from autotuner.spec.interval import batch_means, interval_text, measure
from autotuner.spec.metrics import format_compact, format_value
from autotuner.spec.progress import MAX_STEP, PROGRESS_FILE, TrainStep, from_deepspeed_log, from_progress_file
from autotuner.states import State

from cli_rig import PREAMBLE, ROOT, autotune, env, latest, write_launcher, write_sweep
from dashboard_rig import chromium_driver


def steps_of(values):
    return [TrainStep(i, 1000.0 + i, v) for i, v in enumerate(values)]


@pytest.mark.parametrize(("values", "rate"), [
    ([1e308] * 20, False),  # their sum overflows: math.fsum raised
    ([1.7e308, 1.0] * 10, False),
    ([5e-324] * 20, True),  # subnormal rates: their inverses overflow
    ([1e-310, 2e-310] * 10, True),
])
def test_any_finite_values_give_an_interval_or_none_never_an_error(values, rate):
    reading = measure(steps_of(values), steps_of(values)[4:], rate=rate)
    interval = reading.interval
    assert interval is not None and math.isfinite(interval.mean), interval
    assert 0 <= interval.low <= interval.mean * (1 + 1e-12) and interval.mean <= interval.high * (1 + 1e-12)


def test_rates_too_far_apart_for_a_float_leave_no_interval_as_a_zero_rate_does():
    assert measure(steps_of([1.7e308, 1e-300] * 10), steps_of([1.7e308, 1e-300] * 10), rate=True).interval is None


def test_extreme_values_keep_the_ordinary_intervals_scale():
    ordinary = batch_means([100.0 + i % 3 for i in range(20)])
    scaled = batch_means([(100.0 + i % 3) * 1e306 for i in range(20)])  # their sum is beyond a float
    assert scaled.mean == pytest.approx(ordinary.mean * 1e306)
    assert scaled.half_width == pytest.approx(ordinary.half_width)


def test_step_numbers_past_any_runs_are_skipped(tmp_path):
    path = tmp_path / PROGRESS_FILE
    path.write_text("".join(json.dumps(line) + "\n" for line in [
        {"step": 1, "time": 10.0}, {"step": 10 ** 400, "time": 11.0}, {"step": MAX_STEP + 1, "time": 12.0},
        {"step": MAX_STEP, "time": 13.0}]))
    steps = from_progress_file(path, "throughput")
    assert [s.step for s in steps] == [1, MAX_STEP]
    assert measure(steps, steps).step_seconds == pytest.approx(3.0 / (MAX_STEP - 1))


def test_a_deepspeed_line_whose_step_has_thousands_of_digits_is_skipped():
    line = ("[2026-11-28 21:24:44,478] [INFO] [timer.py:264:stop] epoch=0/micro_step=4/global_step={}, "
            "RunningAvgSamplesPerSec=99.0, CurrSamplesPerSec=98.0, MemAllocated=0.0GB")
    steps = from_deepspeed_log("\n".join([line.format(4), line.format("9" * 5000), line.format(5)]))
    assert [s.step for s in steps] == [4, 5]


# A stand-in that writes 30 steps with the value $VALUE each (alternately 2x: a spread), then its metrics file.
EXTREME = PREAMBLE + """\
i=1
while [ $i -le 30 ]; do
  v=$VALUE; [ $((i % 2)) -eq 0 ] && v="2*$VALUE"
  printf '{"step": %d, "time": %s, "%s": %s}\\n' $i "$(date +%s.%N)" "$METRIC" \\
    "$(python3 -c "import sys; print(repr(eval(sys.argv[1])))" "$v")" >> "$AUTOTUNE_PROGRESS_PATH"
  i=$((i + 1))
done
printf '{"%s": 5.0}\\n' "$METRIC" > "$AUTOTUNE_METRICS_PATH"
"""


@pytest.mark.parametrize(("metric", "value"), [("lat", "8e307"), ("throughput", "1e-320")])
def test_a_run_whose_steps_carry_extreme_values_is_measured_not_failed(tmp_path, metric, value):
    launcher = write_launcher(tmp_path, EXTREME)
    done = autotune("run", write_sweep(tmp_path, [1, 2]), "--results", tmp_path / "res", "--launcher", launcher,
                    "--slots", "2", "--metric", f"{metric}:{'min' if metric == 'lat' else 'max'}",
                    environ=env(LAUNCH_LOG=tmp_path / "launches.log", METRIC=metric, VALUE=value,
                                AUTOTUNE_PROGRESS_POLL="0.05"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "failed" not in done.stderr, done.stderr
    for a in latest(tmp_path / "res").values():
        assert (a.state, a.attempt, a.metric) == (State.SUCCEEDED, 1, 5.0), a
        assert a.metrics["steps_measured"] == 26, a
    assert len((tmp_path / "launches.log").read_text().splitlines()) == 2


# A stand-in whose steps' time stamps are not a clock that runs as the runner's: $CLOCK far ahead of it, or steps
# 1e307 seconds apart; its run lasts a second or so, measured until sure.
CLOCKS = """\
import json, os, sys, time
clock = os.environ["CLOCK"]
with open(os.environ["AUTOTUNE_PROGRESS_PATH"], "a") as f:
    for i in range(40):
        at = time.time() + 1e9 if clock == "ahead" else 1e307 * (i + 1)
        f.write(json.dumps({"step": i, "time": at, "throughput": 100 + i % 3}) + "\\n")
        f.flush()
        time.sleep(0.02)
json.dump({"throughput": 100.0}, open(os.environ["AUTOTUNE_METRICS_PATH"], "w"))
"""


def strict_json(text):
    def refuse(constant):
        raise AssertionError(f"{constant} in JSON output")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("clock", ["ahead", "apart"])
def test_step_times_no_run_could_take_give_no_start_up_step_time_or_saving(tmp_path, clock):
    (tmp_path / "standin.py").write_text(CLOCKS)
    sweep = write_sweep(tmp_path, [1, 2]).read_text().replace("ds_config: {train_micro_batch_size_per_gpu: 1}",
                                                               "ds_config: {autotuning: {tolerance: 0.05}}")
    (tmp_path / "sweep.hjson").write_text(sweep)
    done = autotune("run", tmp_path / "sweep.hjson", "--results", tmp_path / "res", "--slots", "2",
                    "--launcher", f"{sys.executable} {tmp_path / 'standin.py'}",
                    environ=env(CLOCK=clock, AUTOTUNE_PROGRESS_POLL="0.05"))
    assert done.returncode == 0, done.stdout + done.stderr
    for a in latest(tmp_path / "res").values():
        assert a.state == State.SUCCEEDED and a.detail.startswith("measured until sure"), a
        assert "startup_s" not in a.metrics, a  # its first step "after" the run's end
        assert a.metrics.get("step_s", 0) < 60, a  # no step longer than the run
    report = strict_json(autotune("report", tmp_path / "res", "--format", "json").stdout)
    assert 0 <= report["gpu_hours"]["saved"] * 3600 <= 2 * 30 * 60, report  # two runs' 30 steps, none over 60 s
    assert "inf" not in autotune("status", tmp_path / "res").stdout
    with Ledger.open(tmp_path / "res") as ledger:  # as a runner before this one recorded such a step time
        ledger._db.execute("UPDATE measures SET step_time = 1e307")
        ledger._db.commit()
    report = strict_json(autotune("report", tmp_path / "res", "--format", "json").stdout)
    assert report["gpu_hours"]["saved"] == 0, report["gpu_hours"]


def test_values_past_a_floats_digits_are_written_with_an_exponent_in_every_view():
    """A step may carry 1e308: its interval in the best's line was 309 digits, most of them float noise."""
    assert format_value(1.7e308) == "1.7e+308" and format_compact(1.7e308) == "1.7e+308"
    assert format_value(1e23) == "1e+23"  # grouped, it read 99,999,999,999,999,991,611,392
    assert format_value(3.12e14) == "312,000,000,000,000" and format_compact(3.12e14) == "312T"  # as before
    assert interval_text({"x_low": 1e308, "x_high": 1.5e308, "steps_measured": 26}, "x") == \
        " (95% interval 1e+308 to 1.5e+308 over 26 steps)"


def test_the_dashboards_page_writes_values_past_a_floats_digits_with_an_exponent_too(tmp_path):
    """The page's own `number` (app.js), run by headless Chromium: 1e308 was 309 grouped digits."""
    app = (ROOT / "autotuner" / "dashboard" / "assets" / "app.js").read_text()
    formats = next(line for line in app.splitlines() if line.startswith("const WHOLE = "))
    number = re.search(r"^function number\(v\) \{.*?^\}", app, re.M | re.S).group(0)
    browser = chromium_driver(tmp_path / "profile")
    try:
        shown = browser.execute_script(f"{formats}\n{number}\n"
                                       "return [1.7e308, 1e23, 3.12e14, 1234.5, 2].map(number);")
    finally:
        browser.quit()
    assert shown == ["1.7e+308", "1e+23", "312,000,000,000,000", "1,234.5", "2"]
