"""The real thing on CPU: DeepSpeed's launcher, its engine writing metrics.json, the best read back from disk."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotuner.ledger.store import Ledger

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.deepspeed  # one real DeepSpeed test at a time (conftest.py)

BASE = """{{
  name: {name}
  script: {script}
  args: ["--steps", "7", "--hidden", "64"]
  metric: throughput
  num_gpus: {gpus}
  timeout: 300
  ds_config: {{
    gradient_accumulation_steps: 1
    steps_per_print: 1000
    optimizer: {{type: "Adam", params: {{lr: 0.001, torch_adam: true}}}}
  }}
  space: {space}
}}
"""


def test_a_small_real_sweep_picks_the_best_on_disk(tmp_path):
    script = ROOT / "experiments" / "train.py"
    single = tmp_path / "single.hjson"
    single.write_text(BASE.format(name="one", script=script, gpus=1,
                                  space='{"zero_optimization.stage": [1], '
                                        '"train_micro_batch_size_per_gpu": [2, 8]}'))  # 3 runs: CI's minutes
    double = tmp_path / "double.hjson"
    double.write_text(BASE.format(name="two", script=script, gpus=2,
                                  space='{"zero_optimization.stage": [2], "train_micro_batch_size_per_gpu": [8]}'))
    results = tmp_path / "results"
    run = subprocess.run([sys.executable, "-m", "autotuner.cli", "run", str(single), str(double), "--slots", "2",
                          "-o", str(results)], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr

    names = ["one_z1_mbs2", "one_z1_mbs8", "two_z2_mbs8"]
    on_disk = {}
    for name in names:
        directory = results / name
        for file in ("exp.json", "ds_config.json", "cmd.txt", "stdout.log", "stderr.log", "metrics.json"):
            assert (directory / file).is_file(), f"{name}/{file} missing"
        metrics = json.loads((directory / "metrics.json").read_text())
        assert metrics["throughput"] > 0 and metrics["latency"] > 0, (name, metrics)
        on_disk[name] = metrics["throughput"]
        config = json.loads((directory / "ds_config.json").read_text())
        assert config["autotuning"]["metric_path"] == str(directory / "metrics.json")
        assert "--include" in (directory / "cmd.txt").read_text()
    assert json.loads((results / "two_z2_mbs8" / "exp.json").read_text())["slots"] == {"localhost": [0, 1]}

    best = max(on_disk, key=on_disk.get)
    assert f"best: {best} with throughput" in run.stdout, (on_disk, run.stdout)
    optimal = json.loads((results / "ds_config_optimal.json").read_text())
    expected = json.loads((results / best / "ds_config.json").read_text())
    del expected["autotuning"]
    assert expected.pop("steps_per_print") == 1 and expected.pop("log_level") == "info"  # measured runs' only
    assert optimal == {**expected, "steps_per_print": 1000}

    # DeepSpeed's own per-step throughput lines were read: start-up apart from the step time, and an interval
    with Ledger.open(results) as ledger:
        timings = ledger.measures()
    for name in names:
        timing = timings[(name, 1)]
        assert timing.steps >= 2 and 0 < timing.step_seconds < timing.startup, (name, timing)
        assert 0 <= timing.interval.low <= timing.interval.mean <= timing.interval.high, (name, timing)
    summary = (results / "summary.txt").read_text().splitlines()
    assert [c.strip() for c in summary[0].split("|")[1:-1]] == ["tuning_space", "num_experiments",
                                                                  "best_metric_val", "best_exp_name"]
    glob = next(line for line in summary if line.startswith("| global"))
    assert [c.strip() for c in glob.split("|")[1:-1]] == ["global", "3", format(on_disk[best], "g"), best]
    assert summary[-1].startswith("Tuning completed in ") and summary[-1].endswith("Total number of experiments: 3.")

    # cmd_optimal.txt trains with the winner as a normal run: no autotuning section, no pinned slots
    command = (results / "cmd_optimal.txt").read_text().strip()
    assert "--include" not in command and "ds_config_optimal.json" in command
    train = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert train.returncode == 0, (command, train.stdout[-2000:], train.stderr[-3000:])
    assert "trained 7 steps" in train.stdout


TRAINER_SWEEP = """{{
  name: hf
  script: {script}
  args: ["--output_dir", "out"]
  {flag}
  arg_mappings: {{
    "train_micro_batch_size_per_gpu": "--per_device_train_batch_size"
    "gradient_accumulation_steps": "--gradient_accumulation_steps"
  }}
  ds_config: {{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 2}}
  space: {{
    "train_micro_batch_size_per_gpu": [2, 4]
    "--learning_rate": [0.01]
  }}
}}
"""


def test_a_trainer_style_script_gets_its_config_by_its_own_flag_and_its_batch_size_as_an_argument(tmp_path):
    """Through DeepSpeed's real launcher: with `config_flag: --deepspeed` every run of a script whose parser is
    as strict as HfArgumentParser succeeds, its batch size handed as an argument that agrees with the config;
    with the default flag every one fails, as every experiment of a Trainer script did before."""
    script = ROOT / "tests" / "trainer_standin.py"
    spec = tmp_path / "hf.hjson"
    spec.write_text(TRAINER_SWEEP.format(script=script, flag="config_flag: --deepspeed"))
    results = tmp_path / "results"
    run = subprocess.run([sys.executable, "-m", "autotuner.cli", "run", str(spec), "--slots", "2", "-o",
                          str(results)], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "best: hf_mbs4_lr0.01 with throughput" in run.stdout, run.stdout
    command = (results / "hf_mbs2_lr0.01" / "cmd.txt").read_text()
    assert "--deepspeed " in command and "--deepspeed_config" not in command
    assert "--per_device_train_batch_size 2" in command and "--learning_rate 0.01" in command
    assert "--deepspeed" in (results / "cmd_optimal.txt").read_text()

    spec.write_text(TRAINER_SWEEP.format(script=script, flag=""))
    before = subprocess.run([sys.executable, "-m", "autotuner.cli", "run", str(spec), "--slots", "2", "-o",
                             str(tmp_path / "before"), "--retries", "0"], capture_output=True, text=True,
                            timeout=900)
    assert before.returncode == 1
    states = json.loads(subprocess.run([sys.executable, "-m", "autotuner.cli", "status", str(tmp_path / "before"),
                                        "--json"], capture_output=True, text=True, timeout=120).stdout)
    assert states["counts"] == {"failed": 2}, states


def test_tune_on_the_real_example_with_deepspeeds_autotuning_section_profiles_it_first(tmp_path):
    """`autotune tune` with the example's DeepSpeed command, as DeepSpeed's own autotuner takes it, on slots whose
    memory is stated (a hostfile's `gpu=`, as for GPUs; CPU slots state none otherwise, and then no profile runs).
    What real DeepSpeed on CPU proves here: its engine counts the example's parameters and measures its
    activations in the profile run (at the smallest stage and size), writes its model info and ends; each config
    the search writes is one the engine accepts and measures, and so is each run again. Two stages on two slots,
    one size allowed: each stage's one run at once, then both run again (`--confirm 2`), five DeepSpeed starts in
    three rounds; which sizes a stage measures below the largest that fits is the search's, proven on the
    stand-in (test_tune.py), and each DeepSpeed start on CPU costs 15-25 s of CI's minutes."""
    results = tmp_path / "results"
    config = json.loads((ROOT / "experiments" / "ds_tune.json").read_text())  # narrowed: CI's minutes are few
    config["zero_optimization"]["stage"] = [0, 2]
    config["autotuning"] |= {"min_train_micro_batch_size_per_gpu": 16, "max_train_micro_batch_size_per_gpu": 16}
    (tmp_path / "ds_tune.json").write_text(json.dumps(config))
    (tmp_path / "hostfile").write_text("localhost slots=2 accelerator=cpu gpu=cpu-16GB\n")
    run = subprocess.run([sys.executable, "-m", "autotuner.cli", "tune", "--hostfile", str(tmp_path / "hostfile"),
                          "--confirm", "2", "-o", str(results), "train.py", "--deepspeed_config",
                          str(tmp_path / "ds_tune.json"), "--steps", "7", "--hidden", "64"],
                         capture_output=True, text=True, timeout=900, cwd=ROOT / "experiments")
    assert run.returncode == 0, run.stdout + run.stderr
    info = json.loads((results / "train_profile" / "model_info.json").read_text())  # the engine's own file
    assert info["num_params"] == (64 * 64 + 64) * 2 + 65  # the example's MLP with --hidden 64
    profiled = json.loads((results / "train_profile" / "ds_config.json").read_text())
    assert profiled["zero_optimization"]["stage"] == 0 and profiled["train_micro_batch_size_per_gpu"] == 16
    assert "Memory model (profile run train_profile: 8385 parameters" in run.stdout

    names = {d.name for d in results.iterdir() if (d / "metrics.json").exists()}
    assert names == {"train_z0_mbs16", "train_z2_mbs16", "train_z0_mbs16_confirm1", "train_z2_mbs16_confirm1"}, names
    summary = (results / "summary.txt").read_text()
    assert summary.rstrip().splitlines()[-1].startswith("Tuning completed in ")  # DeepSpeed's last line, last
    assert "was confirmed" in run.stdout or "is uncertain: its 2 runs measured" in run.stdout  # a loaded machine
    assert all(f"| z{z} " in summary for z in (0, 2)) and "| global " in summary
    optimal = json.loads((results / "ds_config_optimal.json").read_text())
    assert optimal["zero_optimization"]["stage"] in (0, 2) and "autotuning" not in optimal


OFFLOAD_SCRIPT = """
import argparse, deepspeed, torch
parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
parser.add_argument("--local_rank", type=int, default=-1)
args = parser.parse_args()
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
engine, optimizer, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
offload = engine.zero_offload_optimizer()  # as the engine read the config
print("engine: optimizer offloaded to", offload.device if offload else None, "stage", engine.zero_optimization_stage(),
      "inner", type(optimizer.optimizer).__name__, flush=True)
for _ in range(7):
    x = torch.randn(engine.train_micro_batch_size_per_gpu(), 64)
    engine.backward(torch.nn.functional.mse_loss(engine(x), x.sum(dim=1, keepdim=True)))
    engine.step()  # the engine writes its metrics and ends the process after its profile steps
"""


def test_tune_goes_on_with_the_optimizer_offloaded_and_deepspeed_runs_it_on_cpu(tmp_path):
    """Real DeepSpeed on its CPU accelerator, tuned where nothing fits without offload: the slots' memory stated
    small (`gpu=cpu-2GB`, as for a GPU) and `model_info` stating 1e8 parameters (1.5 GiB of model states at every
    stage tuned, more than the 883 MiB the model lends), so the search offloads the optimizer (`_oo`) and the
    engine runs it: it says its optimizer is offloaded to the CPU (ZeRO-Offload's path, the torch Adam inside:
    `zero_force_ds_cpu_optimizer: false`, DeepSpeed's CPU Adam is not compiled) and takes its steps. Kept short:
    one stage and size (test_offload.py's engine takes each stage's offloaded config, in one process)."""
    results = tmp_path / "results"
    (tmp_path / "train.py").write_text(OFFLOAD_SCRIPT)
    config = json.loads((ROOT / "experiments" / "ds_tune.json").read_text())
    config["zero_optimization"]["stage"] = [1]  # one stage: test_offload.py's engine takes stages 1-3 offloaded
    config["zero_force_ds_cpu_optimizer"] = False
    config["autotuning"] |= {"min_train_micro_batch_size_per_gpu": 2, "max_train_micro_batch_size_per_gpu": 2,
                             "model_info": {"num_params": 100_000_000, "activation_mem_per_gpu": 10**6}}
    (tmp_path / "ds_tune.json").write_text(json.dumps(config))
    (tmp_path / "hostfile").write_text("localhost slots=1 accelerator=cpu gpu=cpu-2GB\n")
    run = subprocess.run([sys.executable, "-m", "autotuner.cli", "tune", "--hostfile", str(tmp_path / "hostfile"),
                          "--confirm", "0", "-o", str(results), "train.py", "--deepspeed_config",
                          str(tmp_path / "ds_tune.json")], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    ran = sorted(d.name for d in results.iterdir() if (d / "metrics.json").exists())
    assert ran == ["train_z1_mbs2_oo"], ran  # nothing without offload, nothing more
    assert "z1 skipped, cannot fit" in run.stdout and "z1_oo up to micro-batch" in run.stdout
    assert "best: train_z1_mbs2_oo with throughput" in run.stdout
    for name in ran:
        logged = (results / name / "stdout.log").read_text()
        stage = name.split("_")[1][1:]
        assert f"engine: optimizer offloaded to cpu stage {stage} inner Adam" in logged, logged[-3000:]
    optimal = json.loads((results / "ds_config_optimal.json").read_text())
    assert optimal["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}
