"""`autotune tune` with its memory model, from the command line, on the stand-in launcher with a fake GPU whose
memory need is DeepSpeed-like (oom_standin.sh with OOM_STANDIN_MODEL): the hostfile states the GPUs' type
(`gpu=A100-80GB`, 80e9 bytes), the model's facts come from `model_info` or a profile run. A stage that cannot fit
is never launched, fewer runs run out of memory than without the model, the report says what the model said, and
a kill -9 then `resume` replays the profile run's facts."""
import json
from pathlib import Path

import pytest

import autotuner

from cli_rig import autotune, env, kill_9_once, sweep_id, tagged_pids

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "oom_standin.sh"
MODEL = "5e9 1e9 80e9"  # 5e9 parameters, 1e9 bytes of activations a sample, the GPU's 80e9 bytes
# By hand, on 2 GPUs: stage 0 holds 80e9 of model states (cannot fit), stage 1 50e9, stage 2 45e9, stage 3 40e9;
# with 1.5e9 kept by the runtime the largest sizes that fit are 28, 33 and 38.
LARGEST = {1: 28, 2: 33, 3: 38}


def setup(tmp_path, model_info=None, gpu="gpu=A100-80GB", stages=(0, 1, 2, 3)):
    (tmp_path / "train.py").write_text("# stand-in: the launcher never runs it\n")
    autotuning = {"enabled": True, "metric": "throughput", "max_train_micro_batch_size_per_gpu": 64}
    if model_info:
        autotuning["model_info"] = model_info
    ds = {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True},
          "optimizer": {"type": "Adam", "params": {"lr": 1e-4}}, "zero_optimization": {"stage": list(stages)},
          "autotuning": autotuning}
    (tmp_path / "ds.json").write_text(json.dumps(ds, indent=1))
    (tmp_path / "hostfile").write_text(f"localhost slots=4 {gpu}\n")
    return env(OOM_STANDIN_LOG=tmp_path / "launches.log", OOM_STANDIN_MODEL=MODEL)


def command(tmp_path):
    return ["tune", "--hostfile", tmp_path / "hostfile", "--num_gpus", "2", "-o", tmp_path / "res", "--launcher",
            f"sh {STANDIN}", "train.py", "--deepspeed_config", "ds.json"]


def tune(tmp_path, environ):
    return autotune(*command(tmp_path), environ=environ, cwd=tmp_path, timeout=300)


def launches(tmp_path):
    """(profile, stage, mbs) of each launch, in order."""
    rows = []
    for line in (tmp_path / "launches.log").read_text().splitlines():
        words = line.split()
        rows.append((words[0] == "profile", int(words[-2][1:]), int(words[-1][3:])))
    return rows


def ooms(directory):
    return sum(1 for a in autotuner.snapshot(directory).attempts if a.reason == "oom")


def test_model_info_skips_the_stage_that_cannot_fit_and_spares_runs_out_of_memory(tmp_path):
    model_dir, plain_dir = tmp_path / "model", tmp_path / "plain"
    model_dir.mkdir()
    plain_dir.mkdir()
    result = tune(model_dir, setup(model_dir, {"num_params": 5_000_000_000, "activation_mem_per_gpu": 10**9}))
    assert result.returncode == 0, result.stdout + result.stderr
    ran = launches(model_dir)
    assert ran and not any(stage == 0 for _, stage, _ in ran) and not any(profile for profile, _, _ in ran)
    assert "best: train_z3_mbs38" in result.stdout
    assert "z0 skipped, cannot fit (model states 74.5 GiB)" in result.stdout  # 80e9 bytes
    assert "z1 up to micro-batch 26" in result.stdout  # (76e9 - 50e9) / 1e9
    plain = tune(plain_dir, setup(plain_dir, gpu=""))  # no GPU memory known: no model
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert any(stage == 0 for _, stage, _ in launches(plain_dir)) and "Memory model" not in plain.stdout
    assert ooms(model_dir / "res") < ooms(plain_dir / "res")
    assert (False, 3, LARGEST[3]) in ran and (False, 3, LARGEST[3] + 1) in ran  # the best stage's largest exactly
    for stage, largest in LARGEST.items():  # the others' as near as could beat it (gridsearch._worth)
        assert largest - largest // 8 <= max(m for p, z, m in ran if z == stage and not p and m <= largest) <= largest
    report = json.loads(autotune("report", model_dir / "res", "--format", "json").stdout)
    assert "z0 skipped" in report["memory"]


def test_the_profile_run_comes_first_and_a_kill_9_then_resume_replays_it(tmp_path, runners):
    whole = tmp_path / "whole"
    whole.mkdir()
    assert tune(whole, setup(whole, stages=(1, 2, 3))).returncode == 0
    clean = launches(whole)
    assert clean[0] == (True, 1, 1)  # the smallest stage tuned, the smallest size: not ZeRO-3
    assert not any(profile for profile, _, _ in clean[1:])
    report = autotune("report", whole / "res").stdout
    assert "Memory model (profile run train_profile: 5000000000 parameters, 953.7 MiB of activations" in report
    summary = (whole / "res" / "summary.txt").read_text()  # as DeepSpeed's: its profile run is no experiment
    assert summary.rstrip().endswith(f"Total number of experiments: {len(clean) - 1}.")
    assert sum(int(line.split("|")[2]) for line in summary.splitlines() if line.startswith("| z")) == len(clean) - 1

    environ = setup(tmp_path, stages=(1, 2, 3)) | {"OOM_STANDIN_SECONDS": "0.3"}
    proc = runners.start(*command(tmp_path), environ=environ, cwd=tmp_path, directory=tmp_path / "res")
    kill_9_once(proc, lambda: (tmp_path / "launches.log").exists() and len(launches(tmp_path)) >= 4)
    resumed = autotune("resume", tmp_path / "res", environ=environ, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert sorted(launches(tmp_path)) == sorted(clean)  # nothing twice, nothing lost, the profile once
    assert tagged_pids(sweep_id(tmp_path / "res")) == []


def test_a_profile_run_that_fails_is_one_line_and_the_search_goes_on(tmp_path):
    """The search goes on without a model and names a best; the failed run counts as a failure (exit 1, as
    any experiment's: `--fail-on no-result` ignores it), never a silent exit 0 with no result."""
    environ = setup(tmp_path, stages=(1, 2, 3)) | {"OOM_STANDIN_MODEL": ""}  # the stand-in cannot profile
    result = tune(tmp_path, environ)
    assert result.returncode == 1, result.stdout + result.stderr  # a failed experiment, as any other: said
    warned = [line for line in result.stderr.splitlines() if "profile run" in line]
    assert len(warned) == 1 and "train_profile failed" in warned[0] and "without a memory model" in warned[0]
    assert "No memory model: the profile run train_profile failed" in result.stdout
    assert "best: train_z3_mbs45" in result.stdout  # the stand-in's plain rule, found by running


@pytest.mark.parametrize(("autotuning", "fragment", "needle"), [
    ({"model_info": {"num_param": 10}}, "unknown model_info key 'num_param'", '"num_param"'),
    ({"model_info": {"num_params": -1}}, "model_info.num_params must be a positive whole number", '"num_params"'),
    ({"model_info": {"num_params": 10, "activation_mem_per_gpu": "1GB"}}, "activation_mem_per_gpu", '"activation'),
    ({"model_info": {"profile": "yes"}}, "model_info.profile must be true or false", '"profile"'),
    ({"model_info": 5}, "model_info must be an object", '"model_info"'),
    ({"model_info_path": "nope.json"}, "model_info_path 'nope.json': model info file: no such file",
     '"model_info_path"'),
    ({"mp_size": 0}, "mp_size must be a positive whole number", '"mp_size"'),
    ({"model_info": {"num_params": 10, "trainable_num_params": 20}},
     "trainable_num_params (20) is more than num_params (10)", '"trainable_num_params"'),
])
def test_bad_model_facts_are_one_located_line(tmp_path, autotuning, fragment, needle):
    environ = setup(tmp_path)
    ds = json.loads((tmp_path / "ds.json").read_text())
    ds["autotuning"] |= autotuning
    (tmp_path / "ds.json").write_text(json.dumps(ds, indent=1))
    result = tune(tmp_path, environ)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], result.stderr
    line = next(i for i, text in enumerate((tmp_path / "ds.json").read_text().splitlines(), 1) if needle in text)
    assert f"ds.json:{line}:" in lines[0]
    assert not (tmp_path / "res").exists() and not (tmp_path / "launches.log").exists()


def test_a_model_info_file_of_an_earlier_profile_run_gives_the_facts(tmp_path):
    """model_info_path names the file DeepSpeed's engine wrote (here, the stand-in's): no profile runs."""
    environ = setup(tmp_path, stages=(1, 2, 3))
    (tmp_path / "info.json").write_text(json.dumps({"num_params": 5_000_000_000, "trainable_num_params": 5_000_000_000,
                                                    "activation_mem_per_gpu": 10**9, "rank": 0}))
    ds = json.loads((tmp_path / "ds.json").read_text())
    ds["autotuning"]["model_info_path"] = "info.json"
    (tmp_path / "ds.json").write_text(json.dumps(ds, indent=1))
    result = tune(tmp_path, environ)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not any(profile for profile, _, _ in launches(tmp_path))
    assert f"Memory model (model_info_path {tmp_path / 'info.json'}: 5000000000 parameters" in result.stdout
