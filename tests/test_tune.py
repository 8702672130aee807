"""`autotune tune` from the command line, on a stand-in launcher with a fake GPU memory limit (oom_standin.sh):
the best is found, no size known not to fit is launched, fewer experiments than the grid, OOM is an answer (exit
0), a kill -9 then `resume` makes the same decisions, and bad input is one located line."""
import json
import os
import signal
import time
from pathlib import Path

import pytest

from cli_rig import autotune, env, sweep_id, tagged_pids

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "oom_standin.sh"


def setup(tmp_path, autotuning=None, config=None):
    (tmp_path / "train.py").write_text("# stand-in: the launcher never runs it\n")
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
          "zero_optimization": {"stage": [1, 2, 3]},
          "autotuning": {"enabled": True, "metric": "throughput", "max_train_micro_batch_size_per_gpu": 64}
          | (autotuning or {})} | (config or {})
    (tmp_path / "ds.json").write_text(json.dumps(ds, indent=1))
    return env(OOM_STANDIN_LOG=tmp_path / "launches.log")


def tune(tmp_path, environ, *extra, results="res"):
    return autotune("tune", "--slots", "3", "-o", tmp_path / results, "--launcher", f"sh {STANDIN}", *extra,
                    "train.py", "--deepspeed_config", "ds.json", "--steps", "3", environ=environ, cwd=tmp_path,
                    timeout=300)


def launches(tmp_path):
    return [tuple(int(w[1:].removeprefix("bs")) for w in line.split()) for line in
            (tmp_path / "launches.log").read_text().splitlines()]


def test_tune_finds_the_largest_micro_batch_that_fits_per_stage_and_the_best_overall(tmp_path):
    result = tune(tmp_path, setup(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr  # 12 OOMs, and still a success
    assert "best: train_z3_mbs45 with throughput" in result.stdout
    ran = launches(tmp_path)
    assert len(ran) == len(set(ran)) and len(ran) < 3 * 64  # nothing twice, far fewer than the grid
    smallest_oom: dict[int, int] = {}
    for stage, mbs in ran:  # in launch order: never a size at or above one that ran out of memory
        assert mbs < smallest_oom.get(stage, 10**9)
        if {1: 30, 2: 20, 3: 10}[stage] + 2 * mbs > 100:
            smallest_oom[stage] = min(mbs, smallest_oom.get(stage, 10**9))
    assert {(s, m) for s, m in ran if {1: 30, 2: 20, 3: 10}[s] + 2 * m == 100 or
            ({1: 30, 2: 20, 3: 10}[s] + 2 * m < 100 and {1: 30, 2: 20, 3: 10}[s] + 2 * (m + 1) > 100)} == {
        (1, 35), (2, 40), (3, 45)}  # each stage's largest size that fits was run
    summary = (tmp_path / "res" / "summary.txt").read_text().splitlines()
    rows = {line.split("|")[1].strip(): line.split("|")[4].strip() for line in summary if line.startswith("| z")
            or line.startswith("| global")}
    assert rows == {"z1": "train_z1_mbs35", "z2": "train_z2_mbs40", "z3": "train_z3_mbs45", "global": "train_z3_mbs45"}
    optimal = json.loads((tmp_path / "res" / "ds_config_optimal.json").read_text())
    assert optimal["zero_optimization"]["stage"] == 3 and optimal["train_micro_batch_size_per_gpu"] == 45
    assert "autotuning" not in optimal or set(optimal["autotuning"]) <= {"start_profile_step", "end_profile_step"}
    command = (tmp_path / "res" / "cmd_optimal.txt").read_text()
    assert "train.py" in command and "--steps 3" in command and "--deepspeed_config" in command


def test_a_kill_9_then_resume_makes_the_same_decisions_and_runs_nothing_twice(tmp_path, runners):
    environ = setup(tmp_path) | {"OOM_STANDIN_SECONDS": "0.3"}
    whole = tmp_path / "whole"
    whole.mkdir()
    assert tune(whole, setup(whole)).returncode == 0
    clean = set(launches(whole))

    proc = runners.start("tune", "--slots", "3", "-o", tmp_path / "res", "--launcher", f"sh {STANDIN}", "train.py",
                         "--deepspeed_config", "ds.json", "--steps", "3", environ=environ, cwd=tmp_path,
                         directory=tmp_path / "res")
    deadline = time.monotonic() + 60
    while len(launches(tmp_path) if (tmp_path / "launches.log").exists() else []) < 10:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    resumed = autotune("resume", tmp_path / "res", environ=environ, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    ran = launches(tmp_path)
    assert set(ran) == clean  # the same decisions as a tuning never interrupted
    assert len(ran) == len(set(ran))  # what ran when the runner died was adopted, not run again
    assert tagged_pids(sweep_id(tmp_path / "res")) == []


@pytest.mark.parametrize(("autotuning", "config", "fragment", "needle"), [
    ({"tuner_typ": "random"}, None, "unknown autotuning key 'tuner_typ'", '"tuner_typ"'),
    ({"fast": False}, None, "fast: false", '"fast"'),
    ({"tuner_type": "bayes"}, None, "tuner_type 'bayes'", '"tuner_type"'),
    ({"metric": "speed"}, None, "unknown metric 'speed'", '"metric"'),
    ({"max_train_micro_batch_size_per_gpu": 0}, None, "positive whole number", '"max_train_micro_batch_size'),
    ({"min_train_micro_batch_size_per_gpu": 8, "max_train_micro_batch_size_per_gpu": 4}, None, "below the smallest",
     '"max_train_micro_batch_size'),
    (None, {"zero_optimization": {"stage": [1, 5]}}, "zero_optimization.stage", '"stage"'),
])
def test_a_bad_autotuning_section_is_one_located_line(tmp_path, autotuning, config, fragment, needle):
    result = tune(tmp_path, setup(tmp_path, autotuning, config))
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr and fragment in lines[0], result.stderr
    line = next(i for i, text in enumerate((tmp_path / "ds.json").read_text().splitlines(), 1) if needle in text)
    assert f"ds.json:{line}:" in lines[0]
    assert not (tmp_path / "res").exists() and not (tmp_path / "launches.log").exists()


def test_a_command_without_a_config_or_script_is_refused(tmp_path):
    environ = setup(tmp_path)
    no_config = autotune("tune", "--slots", "1", "train.py", "--steps", "3", environ=environ, cwd=tmp_path)
    assert no_config.returncode == 2 and "names no DeepSpeed config" in no_config.stderr
    no_script = autotune("tune", "--slots", "1", "nope.py", "--deepspeed_config", "ds.json", environ=environ,
                         cwd=tmp_path)
    assert no_script.returncode == 2 and "no such training script" in no_script.stderr
