"""`autotune tune` from the command line, on a stand-in launcher with a fake GPU memory limit (oom_standin.sh):
the best is found, no size known not to fit is launched, fewer experiments than the grid, OOM is an answer (exit
0), a kill -9 then `resume` makes the same decisions, the best configs are run again before the winner is named,
each tuner_type searches, and bad input is one located line."""
import json
import os
from collections import Counter
from pathlib import Path

import pytest

import autotuner

from cli_rig import autotune, env, kill_9_once, sweep_id, tagged_pids

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
    """(stage, micro-batch size) of each launch, in order."""
    return [tuple(int(w[1:].removeprefix("bs")) for w in line.split()[:2]) for line in
            (tmp_path / "launches.log").read_text().splitlines()]


def knob_launches(tmp_path):
    """(stage, micro-batch size, the zero_optimization keys the config set) of each launch, in order."""
    found = []
    for line in (tmp_path / "launches.log").read_text().splitlines():
        z, mbs, *knobs = line.split()
        found.append((int(z[1:]), int(mbs[3:]), dict((k, json.loads(v)) for k, v in (w.split("=") for w in knobs))))
    return found


def test_tune_finds_the_largest_micro_batch_that_fits_per_stage_and_the_best_overall(tmp_path):
    result = tune(tmp_path, setup(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr  # 12 OOMs, and still a success
    assert "best: train_z3_mbs45 with throughput" in result.stdout
    ran = launches(tmp_path)
    twice = {point for point, n in Counter(ran).items() if n > 1}
    assert twice == {(3, 45), (2, 40)}  # the two best, run again to confirm them; nothing else twice
    assert len(set(ran)) < 3 * 64  # far fewer than the grid
    assert "the winner train_z3_mbs45 was confirmed: 2 run(s)" in result.stdout
    smallest_oom: dict[int, int] = {}
    for stage, mbs in ran:  # in launch order: never a size at or above one that ran out of memory
        assert mbs < smallest_oom.get(stage, 10**9)
        if {1: 30, 2: 20, 3: 10}[stage] + 2 * mbs > 100:
            smallest_oom[stage] = min(mbs, smallest_oom.get(stage, 10**9))
    assert {(s, m) for s, m in ran if {1: 30, 2: 20, 3: 10}[s] + 2 * m == 100 or
            ({1: 30, 2: 20, 3: 10}[s] + 2 * m < 100 and {1: 30, 2: 20, 3: 10}[s] + 2 * (m + 1) > 100)} == {
        (2, 40), (3, 45)}  # the largest size that fits of each stage that could beat the best (not z1's 35)
    summary = (tmp_path / "res" / "summary.txt").read_text().splitlines()
    rows = {line.split("|")[1].strip(): line.split("|")[4].strip() for line in summary if line.startswith("| z")
            or line.startswith("| global")}
    assert rows == {"z1": "train_z1_mbs34", "z2": "train_z2_mbs40", "z3": "train_z3_mbs45", "global": "train_z3_mbs45"}
    assert summary[-1].startswith("Tuning completed in ")  # DeepSpeed's shape: its last line is last
    assert "Ranked by the mean of each config's runs: the best 2 config(s) were run again" in result.stdout
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
    clean = Counter(launches(whole))

    proc = runners.start("tune", "--slots", "3", "-o", tmp_path / "res", "--launcher", f"sh {STANDIN}", "train.py",
                         "--deepspeed_config", "ds.json", "--steps", "3", environ=environ, cwd=tmp_path,
                         directory=tmp_path / "res")
    kill_9_once(proc, lambda: (tmp_path / "launches.log").exists() and len(launches(tmp_path)) >= 10)
    resumed = autotune("resume", tmp_path / "res", environ=environ, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    # The same decisions as a tuning never interrupted, and what ran when the runner died was adopted, not run
    # again: each config as many times as there (the two best twice: their confirming re-runs).
    assert Counter(launches(tmp_path)) == clean
    assert tagged_pids(sweep_id(tmp_path / "res")) == []


@pytest.mark.parametrize(("autotuning", "config", "fragment", "needle"), [
    ({"tuner_typ": "random"}, None, "unknown autotuning key 'tuner_typ'", '"tuner_typ"'),
    ({"fast": "no"}, None, "fast must be true or false", '"fast"'),
    ({"fast": False}, {"zero_optimization": {"stage": [1, 2], "overlap_comm": "yes"}},
     "zero_optimization.overlap_comm must be true or false", '"overlap_comm"'),
    ({"fast": False}, {"zero_optimization": {"stage": 2, "reduce_bucket_size": [5e8, -1]}},
     "reduce_bucket_size must be a positive whole number of elements", '"reduce_bucket_size"'),
    ({"fast": False}, {"zero_optimization": {"stage": 2, "reduce_bucket_size": []}}, "an empty list",
     '"reduce_bucket_size"'),
    ({"fast": False}, {"zero_optimization": {"stage": 2, "sub_group_size": [1e9, 1e12]}},
     "can be searched only for overlap_comm", '"sub_group_size"'),
    ({"min_train_micro_batch_size_per_gpu": 2}, {"train_batch_size": 97}, "train_batch_size 97 cannot be kept",
     '"train_batch_size"'),
    (None, {"zero_optimization": {"stage": 2, "overlap_comm": [True, False]}},
     "searched in full mode only: set autotuning.fast to false", '"overlap_comm"'),
    ({"tuner_type": "bayes"}, None, "tuner_type 'bayes'", '"tuner_type"'),
    ({"metric": "speed"}, None, "unknown metric 'speed'", '"metric"'),
    ({"max_train_micro_batch_size_per_gpu": 0}, None, "positive whole number", '"max_train_micro_batch_size'),
    ({"min_train_micro_batch_size_per_gpu": 8, "max_train_micro_batch_size_per_gpu": 4}, None,
     "max_train_micro_batch_size_per_gpu 4 is below min_train_micro_batch_size_per_gpu 8",
     '"max_train_micro_batch_size'),
    (None, {"zero_optimization": {"stage": [1, 5]}}, "zero_optimization.stage", '"stage"'),
    (None, {"zero_optimization": {"stage": [2, 1.0]}}, "zero_optimization.stage", '"stage"'),
    ({"fast": False}, {"zero_optimization": 3}, "zero_optimization must be an object", '"zero_optimization"'),
    ({"fast": False}, {"zero_optimization": [1, 2]}, "zero_optimization must be an object", '"zero_optimization"'),
    # a list of values for a knob no searched stage reads would be searched nowhere
    ({"fast": False}, {"zero_optimization": {"stage": 3, "allgather_bucket_size": [5e8, 1e9]}},
     "no stage searched (3) reads it", '"allgather_bucket_size"'),
    ({"fast": False}, {"zero_optimization": {"stage": 0, "overlap_comm": [True, False]}},
     "no stage searched (0) reads it", '"overlap_comm"'),
    # "auto" (a Trainer fills it from its arguments) for what the search sets, with no arg_mappings entry: every
    # run would fail on the Trainer's check that the config agrees with its arguments
    (None, {"train_micro_batch_size_per_gpu": "auto"}, '"arg_mappings": {"train_micro_batch_size_per_gpu": '
     '"--per_device_train_batch_size"}', '"train_micro_batch_size_per_gpu"'),
    ({"max_train_batch_size": 64}, {"gradient_accumulation_steps": "auto"}, 'gradient_accumulation_steps is "auto"',
     '"gradient_accumulation_steps"'),
    # a list of accumulations is searched, unless the global batch the config states derives it
    ({"max_train_batch_size": 64}, {"gradient_accumulation_steps": [1, 2]}, "derives it for each micro-batch size",
     '"gradient_accumulation_steps"'),
    (None, {"gradient_accumulation_steps": [1, 0]}, "a list of positive whole numbers",
     '"gradient_accumulation_steps"'),
    (None, {"gradient_accumulation_steps": [2, 2]}, "a value is listed twice", '"gradient_accumulation_steps"'),
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


@pytest.mark.parametrize("config_args", [("--deepspeed", "ds.json", "--deepspeed", "other.json"),
                                         ("--deepspeed_config", "ds.json", "--deepspeed=other.json"),
                                         ("--deepspeed_config=ds.json", "--deepspeed_config", "other.json")])
def test_a_command_naming_its_config_twice_is_refused(tmp_path, config_args):
    """The script's parser decides which of two configs it takes: the tune neither guesses nor runs."""
    environ = setup(tmp_path)
    result = autotune("tune", "--slots", "1", "-o", tmp_path / "res", "--launcher", f"sh {STANDIN}", "train.py",
                      *config_args, "--steps", "3", environ=environ, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "names a DeepSpeed config twice" in lines[0] and "other.json" in lines[0], lines
    assert not (tmp_path / "res").exists() and not (tmp_path / "launches.log").exists()


def test_a_lucky_first_measurement_is_seen_through_by_the_re_runs(tmp_path):
    """z2 mbs40's first run measures 2% above its true throughput, and above the true best (z3 mbs45): the
    re-runs of the two best bring its mean below z3 mbs45's, which is named the winner."""
    environ = setup(tmp_path) | {"OOM_STANDIN_LUCKY": "2 40 1.02"}
    result = tune(tmp_path, environ)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "best: train_z3_mbs45 with throughput" in result.stdout
    assert {point for point, n in Counter(launches(tmp_path)).items() if n > 1} == {(2, 40), (3, 45)}
    report = json.loads(autotune("report", tmp_path / "res", "--format", "json").stdout)
    assert report["best"] == "train_z3_mbs45" and "the winner train_z3_mbs45 was confirmed" in report["confirmation"]
    assert report["confirmed"] is True  # its runs agree (spread 0), and it leads the runner-up's mean
    ranked = [r["name"] for r in report["experiments"] if r["rank"] is not None]
    assert ranked[:4] == ["train_z3_mbs45", "train_z3_mbs45_confirm1", "train_z2_mbs40", "train_z2_mbs40_confirm1"]
    lucky = {r["name"]: r["metric"] for r in report["experiments"] if r["name"].startswith("train_z2_mbs40")}
    assert lucky["train_z2_mbs40"] > report["experiments"][0]["metric"] > lucky["train_z2_mbs40_confirm1"]
    optimal = json.loads((tmp_path / "res" / "ds_config_optimal.json").read_text())
    assert (optimal["zero_optimization"]["stage"], optimal["train_micro_batch_size_per_gpu"]) == (3, 45)


def fits(stage, mbs):
    return {1: 30, 2: 20, 3: 10}[stage] + 2 * mbs <= 100


def throughput(stage, mbs):
    return mbs * 100 / (1 + mbs / 64) * (1 - 0.05 * stage)


@pytest.mark.parametrize(("tuner", "extra"), [("random", ("--confirm", "0", "--seed", "3")), ("model_based", ())])
def test_each_tuner_finds_the_grids_best_and_launches_no_point_known_not_to_fit(tmp_path, tuner, extra):
    """The grid the sampling tuners draw from: stages 1-3 x micro-batch sizes 1, 2, 4, ... 256 (27 points, 12 of
    them too big). With a budget that lets them, each finds the grid's best; none launches a size at or above one
    whose run out of memory had ended before it started (the ledger's times)."""
    environ = setup(tmp_path, {"tuner_type": tuner, "max_train_micro_batch_size_per_gpu": 256,
                               "tuner_early_stopping": 27})
    result = tune(tmp_path, environ, *extra)
    assert result.returncode == 0, result.stdout + result.stderr
    grid = [(s, 2 ** k) for s in (1, 2, 3) for k in range(9)]
    best = max((p for p in grid if fits(*p)), key=lambda p: throughput(*p))
    assert best == (1, 32) and "best: train_z1_mbs32 with throughput" in result.stdout
    report = json.loads(autotune("report", tmp_path / "res", "--format", "json").stdout)
    runs = [r for r in report["experiments"] if "_confirm" not in r["name"]]
    points = [(r["parameters"]["zero_optimization.stage"], r["parameters"]["train_micro_batch_size_per_gpu"])
              for r in runs]
    assert len(points) == len(set(points)) and set(points) <= set(grid)
    for r, (stage, mbs) in zip(runs, points, strict=True):
        known_too_big = [q for o, q in zip(runs, points, strict=True) if o["reason"] == "oom" and q[0] == stage
                         and q[1] <= mbs and o["finished_at"] <= r["started_at"]]
        assert not known_too_big, f"{r['name']} launched after {known_too_big} ran out of memory"
    assert {r["reason"] for r in runs if r["state"] != "succeeded"} == {"oom"}
    reruns = [r["name"] for r in report["experiments"] if "_confirm" in r["name"]]
    assert reruns == ([] if extra else ["train_z1_mbs32_confirm1", "train_z2_mbs32_confirm1"])
    recorded = autotuner.snapshot(tmp_path / "res").meta.search  # what a resume rebuilds the search from
    assert (recorded["tuner"], recorded["seed"], recorded["confirm"]) == ((tuner, 3, 0) if extra else (tuner, 0, None))
    assert (recorded["trials"], recorded["patience"]) == (50, 27)  # DeepSpeed's default budget where none is set


def test_min_improvement_is_recorded_for_the_search_and_a_bad_one_is_refused(tmp_path):
    environ = setup(tmp_path, {"max_train_micro_batch_size_per_gpu": 8, "tuner_early_stopping": 2})
    result = tune(tmp_path, environ, "--min-improvement", "5", "--confirm", "0")
    assert result.returncode == 0, result.stdout + result.stderr
    assert autotuner.snapshot(tmp_path / "res").meta.search["min_gain"] == pytest.approx(0.05)
    refused = tune(tmp_path, environ, "--min-improvement", "-1", results="other")
    assert refused.returncode == 2 and "--min-improvement" in refused.stderr and not (tmp_path / "other").exists()


def test_model_based_without_optuna_is_one_line_naming_the_extra(tmp_path):
    """Where Optuna cannot be imported (here: a package of that name that fails as a missing one would), the
    config's tuner_type is refused before anything is made, with the install line."""
    shadow = tmp_path / "shadow" / "optuna"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'optuna'\")\n")
    environ = setup(tmp_path, {"tuner_type": "model_based"})
    environ["PYTHONPATH"] = os.pathsep.join([str(shadow.parent), str(ROOT), environ.get("PYTHONPATH", "")])
    result = tune(tmp_path, environ)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "pip install 'ds-autotune[tune]'" in lines[0] and "ds.json:" in lines[0] and "tuner_type" in lines[0]
    assert not (tmp_path / "res").exists()  # nothing made


TUNE_FILE = """{
  # the command and config autotune tune is otherwise given on its command line
  name: mytune
  script: train.py
  args: ["--steps", "3"]
  num_gpus: 1
  env: {OOM_STANDIN_SECONDS: "0"}
  ds_config: {
    train_micro_batch_size_per_gpu: 1
    zero_optimization: {stage: [2, 3]}
    autotuning: {
      metric: throughput
      max_train_micro_batch_size_per_gpu: 64
    }
  }
}
"""


def test_a_tune_file_states_the_command_and_the_search(tmp_path):
    environ = setup(tmp_path)
    (tmp_path / "tune.hjson").write_text(TUNE_FILE)
    result = autotune("tune", "--slots", "3", "-o", tmp_path / "res", "--launcher", f"sh {STANDIN}", "tune.hjson",
                      environ=environ, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "best: mytune_z3_mbs45 with throughput" in result.stdout
    assert {stage for stage, _ in launches(tmp_path)} == {2, 3}
    command = (tmp_path / "res" / "cmd_optimal.txt").read_text()
    assert "train.py" in command and "--steps 3" in command and "OOM_STANDIN_SECONDS=0" in command


@pytest.mark.parametrize("text, fragment, needle", [
    (TUNE_FILE.replace("num_gpus: 1", "num_gpu: 1"), "unknown key 'num_gpu' in a tune file", "num_gpu"),
    (TUNE_FILE.replace("max_train_micro_batch_size_per_gpu: 64", "max_train_micro_batch_size_per_gpu: 0"),
     "positive whole number", "max_train_micro_batch_size_per_gpu"),
    (TUNE_FILE.replace("script: train.py", "script: nope.py"), "no such file", "script"),
    (TUNE_FILE.replace("stage: [2, 3]", "stage: [2, 7]"), "zero_optimization.stage", "stage"),
    (TUNE_FILE.replace('"--steps", "3"', '"--steps", "3", "--deepspeed_config", "ds.json"'),
     "args name a DeepSpeed config", "args"),
])
def test_a_bad_tune_file_is_one_located_line(tmp_path, text, fragment, needle):
    environ = setup(tmp_path)
    (tmp_path / "tune.hjson").write_text(text)
    result = autotune("tune", "--slots", "1", "-o", tmp_path / "res", "tune.hjson", environ=environ, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    line = next(i for i, t in enumerate(text.splitlines(), 1) if needle + ":" in t)
    assert len(lines) == 1 and fragment in lines[0] and f"tune.hjson:{line}:" in lines[0], lines
    assert not (tmp_path / "res").exists()
    extra = autotune("tune", "--slots", "1", "tune.hjson", "--slots", "2", environ=environ, cwd=tmp_path)
    assert extra.returncode == 2 and "a tune file takes no script arguments" in extra.stderr


def test_full_mode_finds_the_best_zero_knobs_and_writes_them_in_the_best_config(tmp_path):
    """fast: false. After each stage's micro-batch search, its knobs one at a time at its best size (the stand-in:
    overlap_comm on 10% faster, reduce_bucket_size 1e9 4%; allgather_bucket_size 1e9 runs out of memory there):
    z2 mbs40 with both wins, confirmed by its re-run; every knob run is an experiment with a readable name."""
    result = tune(tmp_path, setup(tmp_path, {"fast": False}))
    assert result.returncode == 0, result.stdout + result.stderr  # knob OOMs too are answers
    assert "best: train_z2_mbs40_ovl1_rbs1e9 with throughput" in result.stdout
    assert "the winner train_z2_mbs40_ovl1_rbs1e9 was confirmed" in result.stdout
    optimal = json.loads((tmp_path / "res" / "ds_config_optimal.json").read_text())
    assert optimal["zero_optimization"] == {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 1_000_000_000}
    assert optimal["train_micro_batch_size_per_gpu"] == 40
    report = json.loads(autotune("report", tmp_path / "res", "--format", "json").stdout)
    names = {r["name"]: r for r in report["experiments"]}
    assert {"train_z2_mbs40_ovl1", "train_z2_mbs40_ovl1_rbs1e9", "train_z3_mbs45_ovl0", "train_z1_mbs34_rbs1e9",
            "train_z2_mbs40_ovl1_rbs1e9_abs1e9"} <= set(names)
    assert names["train_z2_mbs40_ovl1_rbs1e9_abs1e9"]["reason"] == "oom"
    summary = (tmp_path / "res" / "summary.txt").read_text().splitlines()
    rows = {line.split("|")[1].strip(): line.split("|")[4].strip() for line in summary if line.startswith("| z")
            or line.startswith("| global")}
    assert rows == {"z1": "train_z1_mbs34_rbs1e9", "z2": "train_z2_mbs40_ovl1_rbs1e9", "z3": "train_z3_mbs45_rbs1e9",
                    "global": "train_z2_mbs40_ovl1_rbs1e9"}  # a stage's knob runs are of its tuning space
    fast = tmp_path / "fast"
    fast.mkdir()
    assert tune(fast, setup(fast)).returncode == 0
    sized = Counter((z, m) for z, m, knobs in knob_launches(tmp_path) if not knobs)
    assert sized == Counter(set(launches(fast)))  # fast mode's micro-batch search, each size once (no re-runs)


def test_full_mode_never_varies_a_knob_the_config_fixes(tmp_path):
    environ = setup(tmp_path, {"fast": False}, {"zero_optimization": {"stage": [1, 2, 3], "reduce_bucket_size": 5e7}})
    result = tune(tmp_path, environ)
    assert result.returncode == 0, result.stdout + result.stderr
    ran = knob_launches(tmp_path)
    assert all(knobs.get("reduce_bucket_size") == 5e7 for _, _, knobs in ran)
    assert any(knobs.get("overlap_comm") is True for _, _, knobs in ran)
    assert "best: train_z2_mbs40_ovl1 with throughput" in result.stdout
    optimal = json.loads((tmp_path / "res" / "ds_config_optimal.json").read_text())
    assert optimal["zero_optimization"] == {"stage": 2, "reduce_bucket_size": 5e7, "overlap_comm": True}


def test_a_long_tune_name_in_full_mode_is_cut_so_every_experiment_name_is_a_safe_one(tmp_path):
    """A tune file's name may take 100 characters; full mode's knob tags and a re-run's suffix add more than the
    20 left: the names' common prefix is cut (it was a traceback mid-tune), and knob values too long for any
    name are one line before anything starts."""
    environ = setup(tmp_path)
    long = "n" * 95
    text = TUNE_FILE.replace("name: mytune", f"name: {long}").replace("stage: [2, 3]", "stage: [2]").replace(
        "metric: throughput", "metric: throughput\n      fast: false").replace("max_train_micro_batch_size_per_gpu: 64",
                                                                            "max_train_micro_batch_size_per_gpu: 4")
    (tmp_path / "tune.hjson").write_text(text)
    result = autotune("tune", "--slots", "2", "-o", tmp_path / "res", "--launcher", f"sh {STANDIN}", "tune.hjson",
                      environ=environ, cwd=tmp_path, timeout=300)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stdout + result.stderr
    names = [r["name"] for r in json.loads(autotune("report", tmp_path / "res", "--format", "json").stdout)[
        "experiments"]]
    assert any(n.endswith("_confirm1") for n in names) and any("_ovl1_rbs" in n for n in names)
    assert max(len(n) for n in names) <= 120 and all(n.startswith("n" * 60) for n in names)
    huge = ", ".join(str(10**40 + i) for i in range(3))
    (tmp_path / "tune.hjson").write_text(text.replace("zero_optimization: {stage: [2]}",
                                                      f"zero_optimization: {{stage: [2], reduce_bucket_size: [{huge}], "
                                                      f"allgather_bucket_size: [{huge}]}}"))
    refused = autotune("tune", "--slots", "2", "-o", tmp_path / "res2", "--launcher", f"sh {STANDIN}", "tune.hjson",
                       environ=environ, cwd=tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stdout + refused.stderr
    assert "experiment names would be longer than 120 characters" in refused.stderr
    assert not (tmp_path / "res2").exists()


def test_full_mode_after_a_kill_9_resumes_with_the_same_decisions(tmp_path, runners):
    environ = setup(tmp_path, {"fast": False}) | {"OOM_STANDIN_SECONDS": "0.3"}
    whole = tmp_path / "whole"
    whole.mkdir()
    assert tune(whole, setup(whole, {"fast": False})).returncode == 0
    clean = Counter(json.dumps(run, sort_keys=True) for run in knob_launches(whole))

    proc = runners.start("tune", "--slots", "3", "-o", tmp_path / "res", "--launcher", f"sh {STANDIN}", "train.py",
                         "--deepspeed_config", "ds.json", "--steps", "3", environ=environ, cwd=tmp_path,
                         directory=tmp_path / "res")
    kill_9_once(proc, lambda: (tmp_path / "launches.log").exists()  # killed in the knob search
                and sum(1 for *_, knobs in knob_launches(tmp_path) if knobs) >= 4, timeout=90)
    resumed = autotune("resume", tmp_path / "res", environ=environ, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert Counter(json.dumps(run, sort_keys=True) for run in knob_launches(tmp_path)) == clean
    assert "best: train_z2_mbs40_ovl1_rbs1e9 with throughput" in resumed.stdout
    assert tagged_pids(sweep_id(tmp_path / "res")) == []


def test_a_fixed_train_batch_size_is_kept_and_the_sizes_that_cannot_keep_it_are_skipped(tmp_path):
    """train_batch_size 90 on one GPU: every launch's micro-batch size divides 90 (accumulation 90 / size), the best
    is z3 mbs45 as without it (45 divides 90), and the end of tune and the report say which sizes were skipped."""
    result = tune(tmp_path, setup(tmp_path, config={"train_batch_size": 90}))
    assert result.returncode == 0, result.stdout + result.stderr
    assert all(90 % mbs == 0 for _, mbs in launches(tmp_path))
    assert "best: train_z3_mbs45_gas2 with throughput" in result.stdout
    note = ("train_batch_size 90 kept by every candidate (micro-batch x accumulation x 1 data-parallel GPU(s)): "
            "micro-batch sizes 1, 2, 3, 5, 6, 9, 10, 15, 18, 30, 45; 53 size(s) from 1 to 64 skipped")
    assert note in result.stdout
    report = json.loads(autotune("report", tmp_path / "res", "--format", "json").stdout)
    assert report["batch"].startswith(note)
    optimal = json.loads((tmp_path / "res" / "ds_config_optimal.json").read_text())
    assert (optimal["train_batch_size"], optimal["gradient_accumulation_steps"]) == (90, 2)


def test_a_winner_whose_re_run_disagrees_beyond_its_lead_is_named_uncertain_not_confirmed(tmp_path):
    """z3 mbs45's first run measures 1.5x its throughput, its re-run the true value: the two differ by more than
    its lead over the runner-up (a z2 size) and by more than a tenth of their mean. It is still the best by mean,
    but tune and the report call it uncertain and say why, never confirmed."""
    result = tune(tmp_path, setup(tmp_path) | {"OOM_STANDIN_LUCKY": "3 45 1.5"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "best: train_z3_mbs45 with throughput" in result.stdout
    assert "the winner train_z3_mbs45 is uncertain: its 2 runs measured 2245.87 to 3368.8" in result.stdout
    assert "more than its lead over the runner-up train_z2_mbs" in result.stdout and "was confirmed" not in \
        result.stdout
    report = json.loads(autotune("report", tmp_path / "res", "--format", "json").stdout)
    assert report["confirmed"] is False and "is uncertain" in report["confirmation"]
    assert "is uncertain" in autotune("report", tmp_path / "res").stdout
