"""Real DeepSpeed on CPU streams its steps and is ended early both ways: `autotune tune` of the example on one CPU
slot, ZeRO stage 0, one micro-batch size, and the script's `--hidden` as a script knob (2048, then 8192: sixteen
times the work, steps of tenths of a second against seconds, so that the second is far behind whatever else the
machine runs and the first's steps are long beside a busy machine's hiccups; at 32 and 1024 both steps were
milliseconds, mostly the engine's overhead, and a loaded machine once ranked them the other way and left the
first's interval unbounded), measured until sure within its profile window. The first is ended as soon as its
interval is narrow enough, recorded succeeded with its steps' mean, before DeepSpeed's engine wrote any metrics;
the second prints DeepSpeed's own per-step
throughput lines, which the runner reads while it runs, and is stopped once its optimistic bound falls below the
first one's pessimistic bound. (Most of its time is two DeepSpeed start-ups on CPU.)"""
import json
import subprocess
import sys

import pytest

from autotuner.ledger.store import Ledger
from autotuner.spec.progress import from_deepspeed_log
from autotuner.states import Reason, State

from cli_rig import ROOT, env
from helpers import decided

END = 60  # the profile window's last step: a run that reaches it writes its metrics and ends
TOLERANCE = 0.5  # wide: a loaded CPU's steps are noisy (not sure within 25% over 56 steps once, beside other
# tests); the path is tested, not the precision. The other config, 16 times the work, stays far below this one's low end

pytestmark = pytest.mark.deepspeed  # one real DeepSpeed test at a time (conftest.py)


def test_a_real_deepspeed_run_streams_its_steps_and_is_stopped_once_it_cannot_win(tmp_path):
    config = json.loads((ROOT / "experiments" / "ds_tune.json").read_text())
    config["zero_optimization"]["stage"] = [0]
    config["autotuning"] |= {"min_train_micro_batch_size_per_gpu": 16, "max_train_micro_batch_size_per_gpu": 16,
                             "start_profile_step": 3, "end_profile_step": END,
                             "tolerance": TOLERANCE, "script_knobs": {"--hidden": [2048, 8192]}}
    (tmp_path / "ds.json").write_text(json.dumps(config))
    results = tmp_path / "results"
    run = subprocess.run([sys.executable, "-m", "autotuner.cli", "tune", "--slots", "1", "-o", str(results),
                          "train.py", "--deepspeed_config", str(tmp_path / "ds.json"), "--steps", str(END + 5)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT / "experiments",
                         env=env(AUTOTUNE_PROGRESS_POLL="0.2"))
    assert run.returncode == 0, run.stdout + run.stderr
    with Ledger.open(results) as ledger:
        ended = {a.name: a for a in ledger.latest()}
        stops = [tuple(row) for row in ledger._db.execute("SELECT name, state, reason FROM stops")]
    assert len(ended) == 2, ended
    (best, first), (name, stopped) = sorted(ended.items(), key=lambda pair: pair[1].state != State.SUCCEEDED)
    assert f"best: {best} with throughput" in run.stdout and "1 stopped" in run.stdout, run.stdout
    assert "8192" in name and "8192" not in best, (best, name)
    assert stops == [(best, "succeeded", "sure"), (name, "stopped", "outclassed")], stops
    assert (stopped.state, stopped.reason) == (State.STOPPED, Reason.OUTCLASSED), stopped
    mine, better, theirs = decided(stopped.detail)
    assert better == best and mine < theirs and first.state == State.SUCCEEDED
    # Ended once sure: its metric the mean of DeepSpeed's own per-step throughput, its interval that narrow.
    assert first.detail.startswith("measured until sure") and not (results / best / "metrics.json").exists()
    low, high = first.metrics["throughput_low"], first.metrics["throughput_high"]
    assert low <= first.metric <= high and first.metrics["steps_measured"] < END
    # Stopped before the end of its profile window: DeepSpeed never wrote its metrics.
    steps = from_deepspeed_log((results / name / "stdout.log").read_text())
    assert len(steps) >= 4 and steps[-1].step < END and not (results / name / "metrics.json").exists()
